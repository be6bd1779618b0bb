//! # ordo-proto: the WireGuard protocol, sans I/O
//!
//! Everything WireGuard decides, and nothing it does: messages, the Noise handshake,
//! cookies, timers, the replay window and cryptokey routing. No sockets, no threads, no
//! clock: the caller passes in datagrams, packets and the time, and takes out what to send.
//! The `ordo` crate wraps it with TUN devices, UDP sockets and threads.
//!
//! Module map, from the bottom up:
//! - [`crypto`]: the primitives of the whitepaper (HASH, MAC, HMAC, KDF, AEAD, XAEAD).
//! - [`keys`]: key types that zeroize and never print.
//! - [`curve`]: the X25519 operations.
//! - [`scrub`]: wiping the stack after work on a long-term key.
//! - [`messages`]: the four wire formats.
//! - [`handshake`]: Noise_IKpsk2 as pure functions.
//! - [`cookie`]: mac1, mac2 and cookie replies.
//! - [`replay`]: the RFC 6479 sliding window.
//! - [`session`]: a transport key pair with its counter and window.
//! - [`timers`]: the whitepaper's timers as deadlines.
//! - [`allowed_ips`]: longest-prefix match from inner addresses to peers.
//! - [`ratelimiter`]: per-source handshake buckets used under load.
//! - [`packet`]: the few inner IP header fields routing needs.
//! - [`peer`]: one peer's state.
//! - [`fleet`]: owners in receiver indices and envelopes, for gateways sharing one key.
//! - [`interface`]: one interface's state, the entry point.

pub mod allowed_ips;
pub mod cookie;
pub mod crypto;
mod curve;
pub mod events;
pub mod fleet;
pub mod handshake;
pub mod interface;
pub mod keys;
#[cfg(any(fuzzing, test))]
mod memo;
pub mod messages;
pub mod packet;
pub mod peer;
pub mod ratelimiter;
pub mod replay;
pub mod scrub;
pub mod session;
pub mod steering;
pub mod timers;

pub use interface::{
    seal_packet, Accepted, DropReason, Interface, OpenedMessage, Received, Sent, Stats, Transmit, SEND_HEADROOM,
};
pub use keys::{KeyError, PresharedKey, PrivateKey, PublicKey};
pub use peer::{Peer, PeerId};
