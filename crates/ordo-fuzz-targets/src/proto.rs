//! Targets over datagrams from the network into the protocol core: a data message reaching a
//! live session, and an initiation reaching the responder's Noise processing. Random bytes
//! alone stop at the first check (an unknown receiver, a bad mac1), so each target builds
//! the genuine message and lets the input choose what to keep, change or replace.

use ordo_proto::cookie::CookieJar;
use ordo_proto::messages::{TYPE_INITIATION, TYPE_RESPONSE};
use ordo_proto::{Interface, PeerId, PrivateKey, Received, Sent, SEND_HEADROOM};
use rand_chacha::ChaCha20Rng;
use rand_core::SeedableRng;
use std::net::SocketAddr;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

pub const ADDR_A: &str = "192.0.2.1:51820";
pub const ADDR_B: &str = "192.0.2.2:51820";
/// Where an adversary sends from: no peer is there.
pub const ADDR_ELSEWHERE: &str = "198.51.100.7:4444";

/// Two interfaces, A (10.0.0.1) and B (10.0.0.2), each the other's only peer, on a clock of
/// their own.
pub struct Pair {
    pub a: Interface,
    pub b: Interface,
    /// B as A's peer.
    pub pa: PeerId,
    /// A as B's peer.
    pub pb: PeerId,
    pub t0: Instant,
    pub now: Instant,
}

impl Pair {
    pub fn new() -> Pair {
        let t0 = Instant::now();
        let mut a = Interface::with_rng(t0, ChaCha20Rng::seed_from_u64(1));
        let mut b = Interface::with_rng(t0, ChaCha20Rng::seed_from_u64(2));
        let (ka, kb) = (PrivateKey::from_bytes([0x11; 32]), PrivateKey::from_bytes([0x22; 32]));
        let (pub_a, pub_b) = (ka.public_key(), kb.public_key());
        a.set_private_key(Some(ka));
        b.set_private_key(Some(kb));
        let pa = a.add_peer(pub_b).expect("a new peer");
        let pb = b.add_peer(pub_a).expect("a new peer");
        a.set_endpoint(pa, addr(ADDR_B));
        b.set_endpoint(pb, addr(ADDR_A));
        a.add_allowed_ip(pa, "10.0.0.2/32".parse().expect("a net"));
        b.add_allowed_ip(pb, "10.0.0.1/32".parse().expect("a net"));
        Pair {
            a,
            b,
            pa,
            pb,
            t0,
            now: t0,
        }
    }

    /// The wall clock: a fixed date plus the time elapsed on this pair's clock.
    pub fn wall(&self) -> SystemTime {
        UNIX_EPOCH + Duration::from_secs(1_700_000_000) + (self.now - self.t0)
    }

    /// Both sides with a confirmed session: A's first packet started the handshake and went
    /// out once it completed; B received it.
    pub fn established() -> Pair {
        let mut p = Pair::new();
        let first = ipv4([10, 0, 0, 1], [10, 0, 0, 2], b"hello");
        let (now, wall) = (p.now, p.wall());
        let mut out = vec![0u8; first.len() + SEND_HEADROOM];
        assert!(matches!(p.a.send(now, wall, &first, &mut out), Sent::Staged(_)));
        let init = p.a.poll_transmit().expect("an initiation");
        assert_eq!(init.payload[0], TYPE_INITIATION);
        let mut m = init.payload;
        assert!(matches!(
            p.b.receive(now, wall, addr(ADDR_A), &mut m),
            Received::Handshake(_)
        ));
        let mut resp = p.b.poll_transmit().expect("a response").payload;
        assert_eq!(resp[0], TYPE_RESPONSE);
        assert!(matches!(
            p.a.receive(now, wall, addr(ADDR_B), &mut resp),
            Received::Handshake(_)
        ));
        let mut data = p.a.poll_transmit().expect("the staged packet").payload;
        assert!(matches!(
            p.b.receive(now, wall, addr(ADDR_A), &mut data),
            Received::Packet { .. }
        ));
        p
    }

    /// A data message from A to B carrying `inner`, as A would send it.
    pub fn seal_from_a(&mut self, inner: &[u8]) -> Option<Vec<u8>> {
        let (now, wall) = (self.now, self.wall());
        let mut out = vec![0u8; inner.len() + SEND_HEADROOM];
        match self.a.send(now, wall, inner, &mut out) {
            Sent::Data { len, .. } => {
                out.truncate(len);
                Some(out)
            }
            _ => None,
        }
    }
}

impl Default for Pair {
    fn default() -> Self {
        Pair::new()
    }
}

pub fn addr(s: &str) -> SocketAddr {
    s.parse().expect("a socket address")
}

/// An IPv4 packet with `payload` behind a 20-byte header (protocol 17; no checksum).
pub fn ipv4(src: [u8; 4], dst: [u8; 4], payload: &[u8]) -> Vec<u8> {
    let mut p = vec![0u8; 20];
    p[0] = 0x45;
    p[2..4].copy_from_slice(&((20 + payload.len()) as u16).to_be_bytes());
    p[8] = 64;
    p[9] = 17;
    p[12..16].copy_from_slice(&src);
    p[16..20].copy_from_slice(&dst);
    p.extend_from_slice(payload);
    p
}

/// `receive` of one datagram, checked: a drop is counted once under one reason and nothing
/// else is; a delivered packet lies in the buffer and comes from the peer's allowed IPs; the
/// peer's endpoint moves only for an authentic message.
pub fn receive_checked(i: &mut Interface, now: Instant, wall: SystemTime, src: SocketAddr, buf: &mut [u8]) -> Received {
    let drops = |i: &Interface| i.stats.drops.values().sum::<u64>();
    let endpoints = |i: &Interface| i.peers().map(|(id, p)| (id, p.endpoint)).collect::<Vec<_>>();
    let (before, where_before) = (drops(i), endpoints(i));
    let r = i.receive(now, wall, src, buf);
    match &r {
        Received::Dropped(reason) => assert_eq!(drops(i), before + 1, "{reason:?} counted other than once"),
        _ => assert_eq!(drops(i), before, "{r:?} counted a drop"),
    }
    if let Received::Packet { peer, range } = &r {
        assert!(range.end <= buf.len() && range.start <= range.end);
        let h = ordo_proto::packet::parse(&buf[range.clone()]).expect("a delivered packet parses");
        assert_eq!(
            i.allowed_ips().lookup(h.src),
            Some(*peer),
            "delivered from outside the allowed IPs"
        );
    }
    if !matches!(
        r,
        Received::Packet { .. } | Received::Keepalive(_) | Received::Handshake(_)
    ) {
        assert_eq!(endpoints(i), where_before, "{r:?} moved an endpoint");
    }
    r
}

/// Any datagram at B, which has a live session with A. The first byte chooses: the input as
/// it is; the input as the counter and ciphertext of a message to B's live receiver index; or
/// a genuine message from A carrying the input as its inner packet, delivered twice (the
/// second time a replay).
pub fn receive(data: &[u8]) {
    let Some((&mode, rest)) = data.split_first() else {
        return;
    };
    let mut p = Pair::established();
    let (now, wall, from_a) = (p.now, p.wall(), addr(ADDR_A));
    match mode % 3 {
        0 => {
            let mut buf = rest.to_vec();
            receive_checked(&mut p.b, now, wall, from_a, &mut buf);
        }
        1 => {
            let mut buf = p
                .seal_from_a(&ipv4([10, 0, 0, 1], [10, 0, 0, 2], b"x"))
                .expect("a session");
            buf.truncate(8);
            buf.extend_from_slice(rest);
            receive_checked(&mut p.b, now, wall, from_a, &mut buf);
        }
        _ => {
            let Some(sealed) = p.seal_from_a(rest) else { return };
            let mut once = sealed.clone();
            let first = receive_checked(&mut p.b, now, wall, from_a, &mut once);
            if let Received::Packet { range, .. } = &first {
                assert_eq!(&once[range.clone()], &rest[..range.len()], "not what A sent");
            }
            let mut twice = sealed;
            let again = receive_checked(&mut p.b, now, wall, addr(ADDR_ELSEWHERE), &mut twice);
            assert!(matches!(again, Received::Dropped(_)), "a replay was taken: {again:?}");
        }
    }
    while p.b.poll_transmit().is_some() {}
}

pub fn receive_seeds() -> Vec<Vec<u8>> {
    let inner = ipv4([10, 0, 0, 1], [10, 0, 0, 2], b"payload");
    vec![
        [&[0u8][..], &[4, 0, 0, 0], &[0; 28]].concat(),
        [&[1u8][..], &[0; 8], &[0xaa; 40]].concat(),
        [&[2u8][..], &inner].concat(),
        [&[2u8][..], &ipv4([10, 0, 0, 9], [10, 0, 0, 2], b"spoofed")].concat(),
    ]
}

/// A genuine initiation from A, changed as the input says, at B. The first byte chooses
/// whether B is under load and whether mac1 is computed again after the changes (so that a
/// changed message reaches the Noise processing); the rest are (position, xor) pairs. An
/// unchanged message completes the handshake: B's response opens at A.
pub fn handshake_responder(data: &[u8]) {
    let Some((&mode, edits)) = data.split_first() else {
        return;
    };
    let mut p = Pair::new();
    let (now, wall) = (p.now, p.wall());
    let inner = ipv4([10, 0, 0, 1], [10, 0, 0, 2], b"hello");
    let mut out = vec![0u8; inner.len() + SEND_HEADROOM];
    p.a.send(now, wall, &inner, &mut out);
    let mut msg = p.a.poll_transmit().expect("an initiation").payload;
    let mut changed = false;
    for e in edits.chunks_exact(2) {
        let at = e[0] as usize % msg.len();
        changed |= e[1] != 0;
        msg[at] ^= e[1];
    }
    if mode & 2 != 0 {
        let b_public = p.b.public_key().expect("a key");
        CookieJar::new(&b_public).stamp(&mut msg, now);
    }
    p.b.force_under_load = mode & 1 != 0;
    let r = receive_checked(&mut p.b, now, wall, addr(ADDR_A), &mut msg);
    if !changed && mode & 1 == 0 {
        assert_eq!(r, Received::Handshake(p.pb), "a genuine initiation refused");
        let mut resp = p.b.poll_transmit().expect("a response").payload;
        let r = receive_checked(&mut p.a, now, wall, addr(ADDR_B), &mut resp);
        assert_eq!(r, Received::Handshake(p.pa), "B's response did not open at A");
    }
    while p.b.poll_transmit().is_some() {}
}

pub fn handshake_responder_seeds() -> Vec<Vec<u8>> {
    vec![vec![0], vec![1], vec![2, 20, 1], vec![2, 100, 0x80], vec![3, 8, 1]]
}
