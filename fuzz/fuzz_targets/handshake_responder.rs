//! Initiations with a valid mac1 and arbitrary contents, so the fuzzer gets past the MAC check
//! into the responder's Noise processing.
#![no_main]
use libfuzzer_sys::fuzz_target;
use ordo_proto::cookie::CookieJar;
use ordo_proto::messages::INITIATION_LEN;
use ordo_proto::{Interface, PrivateKey};
use rand_core::SeedableRng;
use std::time::{Instant, UNIX_EPOCH};

fuzz_target!(|data: &[u8]| {
    let now = Instant::now();
    let responder = PrivateKey::from_bytes([1; 32]);
    let mut jar = CookieJar::new(&responder.public_key());
    let mut i = Interface::with_rng(now, rand_chacha::ChaCha20Rng::seed_from_u64(0));
    i.set_private_key(Some(responder));
    i.add_peer(PrivateKey::from_bytes([2; 32]).public_key());
    let mut msg = [0u8; INITIATION_LEN];
    msg[0] = 1;
    let n = data.len().min(INITIATION_LEN - 4 - 32);
    msg[4..4 + n].copy_from_slice(&data[..n]);
    jar.stamp(&mut msg, now);
    i.force_under_load = data.first().is_some_and(|b| b & 1 == 1);
    let _ = i.receive(now, UNIX_EPOCH, "192.0.2.1:1".parse().unwrap(), &mut msg);
    while i.poll_transmit().is_some() {}
});
