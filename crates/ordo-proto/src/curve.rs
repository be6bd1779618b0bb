//! The X25519 operations of the handshake, each in stack frames that are wiped afterwards
//! ([`crate::scrub`]): the arithmetic copies the scalar into its own frames.
//!
//! Under the fuzzer (`cfg(fuzzing)`) each result is remembered ([`crate::memo`]), and a
//! handshake's ephemeral key is one of a small fixed pool, picked by the generator: drawn
//! whole from the generator, it differed from input to input (the generator also gives
//! indices and jitter), so no memo could hold it. The protocol takes nothing from an
//! ephemeral's being new but secrecy, which a fuzzer's handshakes need not have.

use x25519_dalek::StaticSecret;
use zeroize::Zeroizing;

/// A new ephemeral secret from `rng` (under the fuzzer: one of [`pool::EPHEMERALS`]).
pub(crate) fn ephemeral(rng: &mut (impl rand_core::RngCore + rand_core::CryptoRng)) -> StaticSecret {
    #[cfg(fuzzing)]
    return StaticSecret::from(pool::ephemeral(rng.next_u32()));
    #[cfg(not(fuzzing))]
    StaticSecret::random_from_rng(rng)
}

/// The public key of `secret` (scalar times the base point).
pub(crate) fn public_of(secret: &StaticSecret) -> [u8; 32] {
    let compute = || crate::scrub::scrubbed(|| x25519_dalek::PublicKey::from(secret).to_bytes());
    #[cfg(fuzzing)]
    return remembered(secret, &x25519_dalek::X25519_BASEPOINT_BYTES, compute);
    #[cfg(not(fuzzing))]
    compute()
}

/// DH(secret, public), or None when the result is all zeros (a low-order public key, with
/// which no handshake may proceed).
pub(crate) fn shared(secret: &StaticSecret, public: &[u8; 32]) -> Option<Zeroizing<[u8; 32]>> {
    let out = Zeroizing::new(diffie_hellman(secret, public));
    out.iter().any(|b| *b != 0).then_some(out)
}

fn diffie_hellman(secret: &StaticSecret, public: &[u8; 32]) -> [u8; 32] {
    let compute =
        || crate::scrub::scrubbed(|| (secret.diffie_hellman(&x25519_dalek::PublicKey::from(*public))).to_bytes());
    #[cfg(fuzzing)]
    return remembered(secret, public, compute);
    #[cfg(not(fuzzing))]
    compute()
}

#[cfg(fuzzing)]
fn remembered(secret: &StaticSecret, point: &[u8; 32], compute: impl FnOnce() -> [u8; 32]) -> [u8; 32] {
    let mut out = [0u8; 32];
    crate::memo::remembered(
        crate::memo::Function::Curve,
        &[secret.as_bytes(), point],
        &mut out,
        |o| o.copy_from_slice(&compute()),
    );
    out
}

#[cfg(fuzzing)]
mod pool {
    /// The pool of ephemeral secrets: enough that a handshake and the next differ, few
    /// enough that every curve operation between them is remembered.
    pub const EPHEMERALS: u32 = 8;

    /// Ephemeral secret `pick` (modulo the pool).
    pub fn ephemeral(pick: u32) -> [u8; 32] {
        [(pick % EPHEMERALS) as u8 + 0x40; 32]
    }
}
