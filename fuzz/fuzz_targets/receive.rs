//! Any datagram, into an interface with a key, a peer and a live session: never a panic,
//! and every datagram that is not delivered is counted under a drop reason.
#![no_main]
use libfuzzer_sys::fuzz_target;
use ordo_proto::{Interface, PrivateKey, Received};
use rand_core::SeedableRng;
use std::time::{Instant, UNIX_EPOCH};

fuzz_target!(|data: &[u8]| {
    let now = Instant::now();
    let mut i = Interface::with_rng(now, rand_chacha::ChaCha20Rng::seed_from_u64(0));
    i.set_private_key(Some(PrivateKey::from_bytes([1; 32])));
    let peer = i.add_peer(PrivateKey::from_bytes([2; 32]).public_key()).unwrap();
    i.add_allowed_ip(peer, "0.0.0.0/0".parse().unwrap());
    let mut buf = data.to_vec();
    let src = "192.0.2.1:1".parse().unwrap();
    let before: u64 = i.stats.drops.values().sum();
    let r = i.receive(now, UNIX_EPOCH, src, &mut buf);
    if let Received::Dropped(_) = r {
        assert_eq!(i.stats.drops.values().sum::<u64>(), before + 1);
    }
    while i.poll_transmit().is_some() {}
});
