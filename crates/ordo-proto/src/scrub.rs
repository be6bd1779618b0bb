//! Wiping the stack after work on a long-term key.
//!
//! `Zeroize` wipes a key where it finally lives, but not the copies a computation leaves
//! behind in stack frames that have returned: the curve arithmetic copies the scalar into
//! its own frames, and in Rust a move is a byte copy that no destructor sees. Those bytes stay
//! in the thread's stack until something overwrites them, and in an optimised build a later
//! frame's uninitialised bytes (the padding of a struct, the payload of a `None`) carry them
//! into the heap when that struct is stored, where they outlive everything. So the functions
//! that touch the interface's private key or a preshared key run through [`scrubbed`], which
//! overwrites the stack they used once they return.

use std::hint::black_box;
use zeroize::Zeroize;

/// How much of the stack below the caller [`scrub_stack`] overwrites, in 8-byte words: well
/// above the deepest the X25519 ladder and the handshake's hashing go (a few KiB), and cheap
/// next to one Diffie-Hellman (a 16 KiB write is about a microsecond, the DH tens).
const SCRUB_WORDS: usize = 2048;

/// Overwrites `SCRUB_WORDS` words of this thread's stack below the caller's frame: the frames
/// of the functions the caller has just returned from.
#[inline(never)]
pub fn scrub_stack() {
    let mut area = [0u64; SCRUB_WORDS];
    // Volatile writes and an opaque use, so that neither the writes nor the area itself are
    // optimised away.
    area.zeroize();
    black_box(&mut area);
}

/// Runs `f` in frames of its own, then overwrites them. `f` should return nothing secret by
/// value (a key boxed, a result, a public key), since what it returns is copied into the
/// caller's frame, above the part that is wiped.
#[inline(always)]
pub fn scrubbed<R>(f: impl FnOnce() -> R) -> R {
    let out = outlined(f);
    scrub_stack();
    out
}

/// Calls `f` in a frame below the caller's, never inlined into it: what `f` leaves on the
/// stack is then below the caller, where [`scrub_stack`] reaches.
#[inline(never)]
fn outlined<R>(f: impl FnOnce() -> R) -> R {
    f()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_scrubbed_call_returns_what_it_computed() {
        assert_eq!(scrubbed(|| [7u8; 32].iter().map(|b| u32::from(*b)).sum::<u32>()), 224);
    }
}
