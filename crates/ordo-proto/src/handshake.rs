//! The Noise_IKpsk2_25519_ChaChaPoly_BLAKE2s handshake of the whitepaper (section 5.4.2 and
//! 5.4.3), as pure functions over keys and messages. Who the peer is, whether its timestamp
//! is fresh and where state lives are decided by the caller ([`crate::interface`]).

use crate::crypto::{aead_open, aead_seal, hash, kdf};
use crate::curve::{ephemeral, public_of, shared};
use crate::keys::{PresharedKey, PrivateKey, PublicKey};
use crate::messages::{Initiation, Response};
use rand_core::{CryptoRng, RngCore};
use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};
use x25519_dalek::StaticSecret;
use zeroize::Zeroizing;

pub const CONSTRUCTION: &[u8] = b"Noise_IKpsk2_25519_ChaChaPoly_BLAKE2s";
pub const IDENTIFIER: &[u8] = b"WireGuard v1 zx2c4 Jason@zx2c4.com";

/// Why a handshake message was refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum HandshakeError {
    /// An AEAD field did not authenticate: wrong keys, or a forged message.
    Decrypt,
    /// A Diffie-Hellman result was all zeros (a low-order point).
    WeakKey,
    /// The initiator's static key is not one of our peers.
    UnknownPeer,
}

/// A TAI64N timestamp: big-endian seconds since 1970 offset by 2^62 + 10, then nanoseconds.
/// Byte order makes newer timestamps compare greater.
pub type Tai64n = [u8; 12];

/// TAI64N for `wall`. The nanoseconds are rounded down to 2^24 ns (~16.7 ms), as the Linux
/// implementation does, so the timestamp does not leak fine-grained timing.
pub fn tai64n(wall: SystemTime) -> Tai64n {
    let d = wall.duration_since(UNIX_EPOCH).unwrap_or(Duration::ZERO);
    let mut t = [0u8; 12];
    t[..8].copy_from_slice(&(0x4000_0000_0000_000a_u64 + d.as_secs()).to_be_bytes());
    t[8..].copy_from_slice(&(d.subsec_nanos() & !0x00ff_ffff).to_be_bytes());
    t
}

/// The earliest timestamp after `t` at [`tai64n`]'s granularity.
pub fn tai64n_after(t: &Tai64n) -> Tai64n {
    let secs = u64::from_be_bytes(t[..8].try_into().expect("8 bytes"));
    let nanos = u32::from_be_bytes(t[8..].try_into().expect("4 bytes")) + 0x0100_0000;
    let (secs, nanos) = if nanos >= 1_000_000_000 {
        (secs + 1, 0)
    } else {
        (secs, nanos)
    };
    let mut out = [0u8; 12];
    out[..8].copy_from_slice(&secs.to_be_bytes());
    out[8..].copy_from_slice(&nanos.to_be_bytes());
    out
}

/// Our static identity, with what can be computed once from it.
pub struct Identity {
    pub private: PrivateKey,
    pub public: PublicKey,
    secret: StaticSecret,
}

impl Identity {
    /// Made in its shared allocation, in frames that are wiped afterwards ([`crate::scrub`]):
    /// the identity holds the private key twice (as bytes and as the curve's scalar).
    pub fn new(private: PrivateKey) -> Arc<Self> {
        crate::scrub::scrubbed(|| {
            let secret = private.secret();
            let public = private.public_key();
            Arc::new(Identity {
                private,
                public,
                secret,
            })
        })
    }

    /// DH(our static, their static): fixed per peer, so computed when the peer is added.
    /// None for a low-order public key, with which no handshake can succeed.
    pub fn static_static(&self, remote: &PublicKey) -> Option<Zeroizing<[u8; 32]>> {
        shared(&self.secret, &remote.0)
    }
}

fn initial_chain() -> ([u8; 32], [u8; 32]) {
    let ck = hash(&[CONSTRUCTION]);
    let h = hash(&[&ck, IDENTIFIER]);
    (ck, h)
}

/// The initiator's state between sending an initiation and receiving the response.
pub struct InitiatorState {
    pub local_index: u32,
    ephemeral: StaticSecret,
    ck: Zeroizing<[u8; 32]>,
    h: [u8; 32],
}

/// Keys of a new session, named from our side.
pub struct SessionKeys {
    pub send: Zeroizing<[u8; 32]>,
    pub recv: Zeroizing<[u8; 32]>,
    pub local_index: u32,
    pub remote_index: u32,
    pub we_initiated: bool,
}

/// Builds a handshake initiation to `remote` (MACs not yet added).
pub fn create_initiation(
    me: &Identity,
    remote: &PublicKey,
    static_static: &[u8; 32],
    local_index: u32,
    timestamp: Tai64n,
    rng: &mut (impl RngCore + CryptoRng),
) -> Result<(Initiation, InitiatorState), HandshakeError> {
    let (ck, h) = initial_chain();
    let h = hash(&[&h, &remote.0]);
    let ephemeral = ephemeral(rng);
    let e_pub = public_of(&ephemeral);
    let [ck] = kdf::<1>(&ck, &e_pub);
    let h = hash(&[&h, &e_pub]);
    let es = shared(&ephemeral, &remote.0).ok_or(HandshakeError::WeakKey)?;
    let [ck, k] = kdf::<2>(&ck, &es[..]);
    let encrypted_static: [u8; 48] = aead_seal(&k, 0, &me.public.0, &h);
    let h = hash(&[&h, &encrypted_static]);
    let [ck, k] = kdf::<2>(&ck, static_static);
    let encrypted_timestamp: [u8; 28] = aead_seal(&k, 0, &timestamp, &h);
    let h = hash(&[&h, &encrypted_timestamp]);
    let msg = Initiation {
        sender: local_index,
        ephemeral: e_pub,
        encrypted_static,
        encrypted_timestamp,
    };
    Ok((
        msg,
        InitiatorState {
            local_index,
            ephemeral,
            ck,
            h,
        },
    ))
}

/// What the responder learns from a valid initiation, before it decides to answer.
pub struct ConsumedInitiation {
    pub initiator: PublicKey,
    pub timestamp: Tai64n,
    pub sender: u32,
    remote_ephemeral: [u8; 32],
    ck: Zeroizing<[u8; 32]>,
    h: [u8; 32],
}

/// Opens an initiation. `static_static_of` maps the initiator's static key to the
/// precomputed DH(our static, their static), or None if it is not a peer of ours.
pub fn consume_initiation(
    me: &Identity,
    msg: &Initiation,
    static_static_of: impl FnOnce(&PublicKey) -> Option<Zeroizing<[u8; 32]>>,
) -> Result<ConsumedInitiation, HandshakeError> {
    let (ck, h) = initial_chain();
    let h = hash(&[&h, &me.public.0]);
    let [ck] = kdf::<1>(&ck, &msg.ephemeral);
    let h = hash(&[&h, &msg.ephemeral]);
    let es = shared(&me.secret, &msg.ephemeral).ok_or(HandshakeError::WeakKey)?;
    let [ck, k] = kdf::<2>(&ck, &es[..]);
    let initiator = aead_open::<32, 48>(&k, 0, &msg.encrypted_static, &h).ok_or(HandshakeError::Decrypt)?;
    let initiator = PublicKey(*initiator);
    let h = hash(&[&h, &msg.encrypted_static]);
    let ss = static_static_of(&initiator).ok_or(HandshakeError::UnknownPeer)?;
    let [ck, k] = kdf::<2>(&ck, &ss[..]);
    let timestamp = aead_open::<12, 28>(&k, 0, &msg.encrypted_timestamp, &h).ok_or(HandshakeError::Decrypt)?;
    let h = hash(&[&h, &msg.encrypted_timestamp]);
    Ok(ConsumedInitiation {
        initiator,
        timestamp: *timestamp,
        sender: msg.sender,
        remote_ephemeral: msg.ephemeral,
        ck,
        h,
    })
}

/// Answers a consumed initiation; returns the response (MACs not yet added) and the keys.
pub fn create_response(
    init: &ConsumedInitiation,
    psk: &PresharedKey,
    local_index: u32,
    rng: &mut (impl RngCore + CryptoRng),
) -> Result<(Response, SessionKeys), HandshakeError> {
    let ephemeral = ephemeral(rng);
    let e_pub = public_of(&ephemeral);
    let [ck] = kdf::<1>(&init.ck, &e_pub);
    let h = hash(&[&init.h, &e_pub]);
    let ee = shared(&ephemeral, &init.remote_ephemeral).ok_or(HandshakeError::WeakKey)?;
    let [ck] = kdf::<1>(&ck, &ee[..]);
    let se = shared(&ephemeral, &init.initiator.0).ok_or(HandshakeError::WeakKey)?;
    let [ck] = kdf::<1>(&ck, &se[..]);
    let [ck, t, k] = kdf::<3>(&ck, psk.as_bytes());
    let h = hash(&[&h, &t[..]]);
    let encrypted_nothing: [u8; 16] = aead_seal::<0, 16>(&k, 0, &[], &h);
    let [initiator_send, responder_send] = kdf::<2>(&ck, &[]);
    let msg = Response {
        sender: local_index,
        receiver: init.sender,
        ephemeral: e_pub,
        encrypted_nothing,
    };
    let keys = SessionKeys {
        send: responder_send,
        recv: initiator_send,
        local_index,
        remote_index: init.sender,
        we_initiated: false,
    };
    Ok((msg, keys))
}

/// Completes our handshake with the peer's response.
pub fn consume_response(
    me: &Identity,
    state: &InitiatorState,
    psk: &PresharedKey,
    msg: &Response,
) -> Result<SessionKeys, HandshakeError> {
    let [ck] = kdf::<1>(&state.ck, &msg.ephemeral);
    let h = hash(&[&state.h, &msg.ephemeral]);
    let ee = shared(&state.ephemeral, &msg.ephemeral).ok_or(HandshakeError::WeakKey)?;
    let [ck] = kdf::<1>(&ck, &ee[..]);
    let se = shared(&me.secret, &msg.ephemeral).ok_or(HandshakeError::WeakKey)?;
    let [ck] = kdf::<1>(&ck, &se[..]);
    let [ck, t, k] = kdf::<3>(&ck, psk.as_bytes());
    let h = hash(&[&h, &t[..]]);
    aead_open::<0, 16>(&k, 0, &msg.encrypted_nothing, &h).ok_or(HandshakeError::Decrypt)?;
    let [initiator_send, responder_send] = kdf::<2>(&ck, &[]);
    Ok(SessionKeys {
        send: initiator_send,
        recv: responder_send,
        local_index: state.local_index,
        remote_index: msg.sender,
        we_initiated: true,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::rngs::StdRng;
    use rand::SeedableRng;

    fn pair(seed: u8) -> Arc<Identity> {
        Identity::new(PrivateKey::from_bytes([seed; 32]))
    }

    fn run(psk_i: &PresharedKey, psk_r: &PresharedKey) -> Result<(SessionKeys, SessionKeys), HandshakeError> {
        let mut rng = StdRng::seed_from_u64(1);
        let (i, r) = (pair(1), pair(2));
        let ss = i.static_static(&r.public).unwrap();
        let ts = tai64n(SystemTime::now());
        let (init, state) = create_initiation(&i, &r.public, &ss, 11, ts, &mut rng)?;
        let consumed = consume_initiation(&r, &init, |k| (*k == i.public).then(|| r.static_static(k).unwrap()))?;
        assert_eq!(consumed.initiator, i.public);
        assert_eq!(consumed.timestamp, ts);
        let (resp, rkeys) = create_response(&consumed, psk_r, 22, &mut rng)?;
        let ikeys = consume_response(&i, &state, psk_i, &resp)?;
        Ok((ikeys, rkeys))
    }

    #[test]
    fn both_sides_derive_mirrored_keys() {
        let psk = PresharedKey::from_bytes([9; 32]);
        let (i, r) = run(&psk, &psk).unwrap();
        assert_eq!(*i.send, *r.recv);
        assert_eq!(*i.recv, *r.send);
        assert_ne!(*i.send, *i.recv);
        assert_eq!(
            (i.local_index, i.remote_index, r.local_index, r.remote_index),
            (11, 22, 22, 11)
        );
    }

    #[test]
    fn mismatched_psk_fails_at_the_initiator() {
        let r = run(&PresharedKey::from_bytes([1; 32]), &PresharedKey::default());
        assert_eq!(r.err(), Some(HandshakeError::Decrypt));
    }

    #[test]
    fn unknown_initiator_is_refused() {
        let mut rng = StdRng::seed_from_u64(2);
        let (i, r) = (pair(1), pair(2));
        let ss = i.static_static(&r.public).unwrap();
        let (init, _) = create_initiation(&i, &r.public, &ss, 1, [0; 12], &mut rng).unwrap();
        assert_eq!(
            consume_initiation(&r, &init, |_| None).err(),
            Some(HandshakeError::UnknownPeer)
        );
    }

    #[test]
    fn tampered_initiation_does_not_decrypt() {
        let mut rng = StdRng::seed_from_u64(3);
        let (i, r) = (pair(1), pair(2));
        let ss = i.static_static(&r.public).unwrap();
        let (mut init, _) = create_initiation(&i, &r.public, &ss, 1, [0; 12], &mut rng).unwrap();
        init.encrypted_timestamp[0] ^= 1;
        let got = consume_initiation(&r, &init, |k| r.static_static(k));
        assert_eq!(got.err(), Some(HandshakeError::Decrypt));
    }

    #[test]
    fn tai64n_orders_and_rounds() {
        let t0 = UNIX_EPOCH + Duration::new(1_700_000_000, 123_456_789);
        let a = tai64n(t0);
        assert_eq!(&a[..8], &(0x4000_0000_0000_000a_u64 + 1_700_000_000).to_be_bytes());
        assert_eq!(u32::from_be_bytes(a[8..].try_into().unwrap()) & 0x00ff_ffff, 0);
        assert!(tai64n(t0 + Duration::from_secs(1)) > a);
        assert!(tai64n_after(&a) > a);
        let end_of_second = tai64n(UNIX_EPOCH + Duration::new(5, 999_999_999));
        assert_eq!(
            tai64n_after(&end_of_second),
            tai64n(UNIX_EPOCH + Duration::from_secs(6))
        );
    }

    #[test]
    fn low_order_peer_key_is_refused() {
        let me = pair(1);
        assert!(me.static_static(&PublicKey([0; 32])).is_none());
    }
}
