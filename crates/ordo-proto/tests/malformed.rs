//! Bad input never panics and every dropped datagram is counted once: random bytes, and
//! real messages of every type with bytes flipped.

use ordo_proto::{Interface, PeerId, PrivateKey, Received, Sent, SEND_HEADROOM};
use proptest::prelude::*;
use rand_chacha::ChaCha20Rng;
use rand_core::SeedableRng;
use std::net::SocketAddr;
use std::time::{Instant, UNIX_EPOCH};

fn pair() -> (Interface, Interface, PeerId, Instant) {
    // Seeded generators: the same handshake, byte for byte, every time.
    let now = Instant::now();
    let mut a = Interface::with_rng(now, ChaCha20Rng::seed_from_u64(1));
    let mut b = Interface::with_rng(now, ChaCha20Rng::seed_from_u64(2));
    let (ka, kb) = (PrivateKey::from_bytes([1; 32]), PrivateKey::from_bytes([2; 32]));
    let (pa, pb) = (ka.public_key(), kb.public_key());
    a.set_private_key(Some(ka));
    b.set_private_key(Some(kb));
    let peer_b = a.add_peer(pb).unwrap();
    let peer_a = b.add_peer(pa).unwrap();
    a.set_endpoint(peer_b, "192.0.2.2:1".parse().unwrap());
    a.add_allowed_ip(peer_b, "0.0.0.0/0".parse().unwrap());
    b.add_allowed_ip(peer_a, "0.0.0.0/0".parse().unwrap());
    (a, b, peer_b, now)
}

/// Replays a deterministic handshake (the generators are seeded) up to message `which`
/// (0: initiation to B, 1: response to A, 2: first data message to B), flips one bit of it
/// with `flip`, and delivers it to the side that expects it. Returns what that side did.
fn deliver_flipped(which: usize, flip: impl FnOnce(&mut Vec<u8>)) -> Received {
    let (mut a, mut b, _, now) = pair();
    let (from_a, from_b): (SocketAddr, SocketAddr) = ("192.0.2.1:1".parse().unwrap(), "192.0.2.2:1".parse().unwrap());
    let mut p = vec![0x45u8, 0, 0, 28, 0, 0, 0, 0, 64, 17, 0, 0, 10, 0, 0, 1, 10, 0, 0, 2];
    p.extend_from_slice(&[0; 8]);
    let mut out = vec![0u8; p.len() + SEND_HEADROOM];
    assert!(matches!(a.send(now, UNIX_EPOCH, &p, &mut out), Sent::Staged(_)));
    let mut init = a.poll_transmit().unwrap().payload;
    if which == 0 {
        flip(&mut init);
        return b.receive(now, UNIX_EPOCH, from_a, &mut init);
    }
    b.receive(now, UNIX_EPOCH, from_a, &mut init);
    let mut resp = b.poll_transmit().unwrap().payload;
    if which == 1 {
        flip(&mut resp);
        return a.receive(now, UNIX_EPOCH, from_b, &mut resp);
    }
    a.receive(now, UNIX_EPOCH, from_b, &mut resp);
    let mut data = a.poll_transmit().unwrap().payload;
    flip(&mut data);
    b.receive(now, UNIX_EPOCH, from_a, &mut data)
}

fn check(msg: &mut [u8]) {
    let (_, mut b, _, now) = pair();
    let before: u64 = b.stats.drops.values().sum();
    let r = b.receive(now, UNIX_EPOCH, "192.0.2.9:9".parse().unwrap(), msg);
    let after: u64 = b.stats.drops.values().sum();
    match r {
        Received::Dropped(_) => assert_eq!(after, before + 1),
        _ => assert_eq!(after, before),
    }
}

#[test]
fn unflipped_messages_are_accepted() {
    // The control for the property below: the same scenario without a flip goes through.
    assert!(matches!(deliver_flipped(0, |_| {}), Received::Handshake(_)));
    assert!(matches!(deliver_flipped(1, |_| {}), Received::Handshake(_)));
    assert!(matches!(deliver_flipped(2, |_| {}), Received::Packet { .. }));
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(512))]

    #[test]
    fn random_datagrams(mut d in proptest::collection::vec(any::<u8>(), 0..200), kind in 0u8..6) {
        if !d.is_empty() { d[0] = kind; }
        if d.len() >= 4 { d[1..4].fill(0); }
        check(&mut d);
    }

    #[test]
    fn flipped_real_messages(which in 0usize..3, at in any::<prop::sample::Index>(), bit in 0u8..8) {
        let mut where_ = 0;
        let r = deliver_flipped(which, |m| {
            // mac2 (the last 16 bytes of a handshake message) is only checked under load.
            let len = if which < 2 { m.len() - 16 } else { m.len() };
            where_ = at.index(len);
            m[where_] ^= 1 << bit;
        });
        prop_assert!(matches!(r, Received::Dropped(_)), "a flipped bit at {} of message {} was accepted: {:?}", where_, which, r);
    }
}
