//! The X25519 operations of the handshake, each in stack frames that are wiped afterwards
//! ([`crate::scrub`]): the arithmetic copies the scalar into its own frames.
//!
//! Under the fuzzer (`cfg(fuzzing)`, which cargo-fuzz sets) each result is also remembered:
//! the fuzz targets build the same interfaces and handshakes from fixed keys and seeded
//! generators for every input, and recomputing those few curve operations took most of every
//! execution. The arithmetic is x25519-dalek's, not the code under test; the memo changes
//! nothing a target can observe but its speed. There, too, a handshake's ephemeral key is
//! one of a small fixed pool, picked by the generator: drawn whole from the generator, it
//! differed from input to input (the generator also gives indices and jitter), so no memo
//! could hold it, and the curve was still two thirds of the `session` target's time. The
//! protocol takes nothing from an ephemeral's being new but secrecy, which a fuzzer's
//! handshakes need not have.

use x25519_dalek::StaticSecret;
use zeroize::Zeroizing;

/// A new ephemeral secret from `rng` (under the fuzzer: one of [`memo::EPHEMERALS`]).
pub(crate) fn ephemeral(rng: &mut (impl rand_core::RngCore + rand_core::CryptoRng)) -> StaticSecret {
    #[cfg(fuzzing)]
    return StaticSecret::from(memo::ephemeral(rng.next_u32()));
    #[cfg(not(fuzzing))]
    StaticSecret::random_from_rng(rng)
}

/// The public key of `secret` (scalar times the base point).
pub(crate) fn public_of(secret: &StaticSecret) -> [u8; 32] {
    #[cfg(fuzzing)]
    if let Some(out) = memo::get(secret, &memo::BASE_POINT) {
        return out;
    }
    let out = crate::scrub::scrubbed(|| x25519_dalek::PublicKey::from(secret).to_bytes());
    #[cfg(fuzzing)]
    memo::put(secret, &memo::BASE_POINT, out);
    out
}

/// DH(secret, public), or None when the result is all zeros (a low-order public key, with
/// which no handshake may proceed).
pub(crate) fn shared(secret: &StaticSecret, public: &[u8; 32]) -> Option<Zeroizing<[u8; 32]>> {
    let out = Zeroizing::new(diffie_hellman(secret, public));
    out.iter().any(|b| *b != 0).then_some(out)
}

fn diffie_hellman(secret: &StaticSecret, public: &[u8; 32]) -> [u8; 32] {
    #[cfg(fuzzing)]
    if let Some(out) = memo::get(secret, public) {
        return out;
    }
    let out = crate::scrub::scrubbed(|| (secret.diffie_hellman(&x25519_dalek::PublicKey::from(*public))).to_bytes());
    #[cfg(fuzzing)]
    memo::put(secret, public, out);
    out
}

#[cfg(fuzzing)]
mod memo {
    use std::cell::RefCell;
    use std::collections::HashMap;
    use x25519_dalek::StaticSecret;

    /// The base point's u-coordinate, as the key of public-key computations.
    pub const BASE_POINT: [u8; 32] = x25519_dalek::X25519_BASEPOINT_BYTES;
    /// Bounded: mutated inputs bring points never seen again. Past this, it starts over.
    const MAX_ENTRIES: usize = 1 << 14;
    /// The pool of ephemeral secrets: enough that a handshake and the next differ, few
    /// enough that every curve operation between them is remembered.
    pub const EPHEMERALS: u32 = 8;

    /// Ephemeral secret `pick` (modulo the pool).
    pub fn ephemeral(pick: u32) -> [u8; 32] {
        [(pick % EPHEMERALS) as u8 + 0x40; 32]
    }

    thread_local! {
        static RESULTS: RefCell<HashMap<([u8; 32], [u8; 32]), [u8; 32]>> = RefCell::new(HashMap::new());
    }

    pub fn get(secret: &StaticSecret, point: &[u8; 32]) -> Option<[u8; 32]> {
        RESULTS.with(|r| r.borrow().get(&(secret.to_bytes(), *point)).copied())
    }

    pub fn put(secret: &StaticSecret, point: &[u8; 32], result: [u8; 32]) {
        RESULTS.with(|r| {
            let mut r = r.borrow_mut();
            if r.len() >= MAX_ENTRIES {
                r.clear();
            }
            r.insert((secret.to_bytes(), *point), result);
        });
    }
}
