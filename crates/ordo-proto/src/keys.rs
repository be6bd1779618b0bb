//! Key types. Secrets zeroize when dropped and never print: their Debug shows a placeholder,
//! so a stray `{:?}` in a log line cannot leak them.

use base64::engine::general_purpose::STANDARD as B64;
use base64::Engine;
use rand_core::{CryptoRng, RngCore};
use std::fmt;
use zeroize::{Zeroize, ZeroizeOnDrop, Zeroizing};

/// Why a key could not be read from text.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum KeyError {
    /// Not 44 characters of base64 (or 64 hex digits) that decode to 32 bytes.
    BadEncoding,
}

impl fmt::Display for KeyError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("a key must be 32 bytes in base64 (44 characters)")
    }
}
impl std::error::Error for KeyError {}

/// 32 bytes in a wiped heap slot of their own: a secret is decoded into it in place and then
/// only the pointer moves, so no copy of the key is left where it passed (a move is a byte copy
/// that no destructor sees, in a stack frame or in a table's node that is rearranged).
type SecretBytes = Box<Zeroizing<[u8; 32]>>;

fn decode32_b64(s: &str) -> Result<SecretBytes, KeyError> {
    let s = s.trim();
    if s.len() != 44 {
        return Err(KeyError::BadEncoding);
    }
    let mut out = SecretBytes::default();
    // 44 characters decode to 32 bytes and a padding '='; anything else is refused.
    match B64.decode_slice(s, &mut out[..]) {
        Ok(32) => Ok(out),
        _ => Err(KeyError::BadEncoding),
    }
}

fn decode32_hex(s: &str) -> Result<SecretBytes, KeyError> {
    let b = s.as_bytes();
    if b.len() != 64 {
        return Err(KeyError::BadEncoding);
    }
    let nib = |c: u8| -> Result<u8, KeyError> {
        match c {
            b'0'..=b'9' => Ok(c - b'0'),
            b'a'..=b'f' => Ok(c - b'a' + 10),
            _ => Err(KeyError::BadEncoding), // the UAPI wants lower-case hex
        }
    };
    let mut out = SecretBytes::default();
    for i in 0..32 {
        out[i] = nib(b[2 * i])? << 4 | nib(b[2 * i + 1])?;
    }
    Ok(out)
}

fn hex32(k: &[u8; 32]) -> String {
    const H: &[u8; 16] = b"0123456789abcdef";
    let mut s = String::with_capacity(64);
    for b in k {
        s.push(H[(b >> 4) as usize] as char);
        s.push(H[(b & 15) as usize] as char);
    }
    s
}

/// A Curve25519 public key: a peer's identity.
#[derive(Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct PublicKey(pub [u8; 32]);

impl PublicKey {
    pub fn from_base64(s: &str) -> Result<Self, KeyError> {
        Ok(PublicKey(**decode32_b64(s)?))
    }
    pub fn from_hex(s: &str) -> Result<Self, KeyError> {
        Ok(PublicKey(**decode32_hex(s)?))
    }
    pub fn to_base64(&self) -> String {
        B64.encode(self.0)
    }
    pub fn to_hex(&self) -> String {
        hex32(&self.0)
    }
    pub fn as_bytes(&self) -> &[u8; 32] {
        &self.0
    }
}

impl fmt::Debug for PublicKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "PublicKey({})", self.to_base64())
    }
}
impl fmt::Display for PublicKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.to_base64())
    }
}

/// The interface's static private key.
#[derive(Clone)]
pub struct PrivateKey(SecretBytes);

impl PrivateKey {
    pub fn from_bytes(b: [u8; 32]) -> Self {
        PrivateKey(Box::new(Zeroizing::new(b)))
    }
    pub fn generate(rng: &mut (impl RngCore + CryptoRng)) -> Self {
        let mut b = SecretBytes::default();
        rng.fill_bytes(&mut b[..]);
        PrivateKey(b)
    }
    pub fn from_base64(s: &str) -> Result<Self, KeyError> {
        decode32_b64(s).map(PrivateKey)
    }
    pub fn from_hex(s: &str) -> Result<Self, KeyError> {
        decode32_hex(s).map(PrivateKey)
    }
    /// Hex, for the UAPI `get` reply only (the protocol returns the private key).
    pub fn to_hex(&self) -> Zeroizing<String> {
        Zeroizing::new(hex32(&self.0))
    }
    pub fn to_base64(&self) -> Zeroizing<String> {
        Zeroizing::new(B64.encode(&self.0[..]))
    }
    pub fn is_zero(&self) -> bool {
        self.0.iter().all(|b| *b == 0)
    }
    pub fn public_key(&self) -> PublicKey {
        crate::scrub::scrubbed(|| PublicKey(crate::curve::public_of(&self.secret())))
    }
    /// The key's bytes, for deriving keys of Ordo's own from it (`fleet::EnvelopeKey`).
    pub(crate) fn bytes(&self) -> &[u8; 32] {
        &self.0
    }
    /// The curve's scalar: a copy of the key by value. Make it where the stack is wiped
    /// afterwards ([`crate::scrub`]).
    pub(crate) fn secret(&self) -> x25519_dalek::StaticSecret {
        x25519_dalek::StaticSecret::from(**self.0)
    }
}

impl Zeroize for PrivateKey {
    fn zeroize(&mut self) {
        self.0.zeroize();
    }
}
/// The bytes are in a `Zeroizing`, wiped when the key is dropped.
impl ZeroizeOnDrop for PrivateKey {}

impl fmt::Debug for PrivateKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("PrivateKey(<redacted>)")
    }
}

/// An optional symmetric key mixed into the handshake; all zeros means "none". Boxed like the
/// private key: a peer holds it, and peers move within their table.
#[derive(Clone, Default, PartialEq, Eq)]
pub struct PresharedKey(SecretBytes);

impl PresharedKey {
    pub fn from_bytes(b: [u8; 32]) -> Self {
        PresharedKey(Box::new(Zeroizing::new(b)))
    }
    pub fn from_base64(s: &str) -> Result<Self, KeyError> {
        decode32_b64(s).map(PresharedKey)
    }
    pub fn from_hex(s: &str) -> Result<Self, KeyError> {
        decode32_hex(s).map(PresharedKey)
    }
    pub fn to_hex(&self) -> Zeroizing<String> {
        Zeroizing::new(hex32(&self.0))
    }
    pub fn is_zero(&self) -> bool {
        self.0.iter().all(|b| *b == 0)
    }
    pub fn as_bytes(&self) -> &[u8; 32] {
        &self.0
    }
}

impl Zeroize for PresharedKey {
    fn zeroize(&mut self) {
        self.0.zeroize();
    }
}
/// The bytes are in a `Zeroizing`, wiped when the key is dropped.
impl ZeroizeOnDrop for PresharedKey {}

impl fmt::Debug for PresharedKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("PresharedKey(<redacted>)")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn base64_and_hex_round_trip() {
        let k = PrivateKey::from_bytes([7u8; 32]);
        let b = k.to_base64();
        assert_eq!(**PrivateKey::from_base64(&b).unwrap().0, [7u8; 32]);
        let h = k.to_hex();
        assert_eq!(**PrivateKey::from_hex(&h).unwrap().0, [7u8; 32]);
        assert!(PublicKey::from_base64("short").is_err());
        // 44 characters without padding would be 33 bytes: refused, not cut to 32.
        assert!(PrivateKey::from_base64(&"A".repeat(44)).is_err());
        assert!(PresharedKey::from_base64(&format!("{}=", "A".repeat(43))).is_ok());
        assert!(
            PublicKey::from_hex(&"AB".repeat(32)).is_err(),
            "upper-case hex is refused"
        );
    }

    #[test]
    fn debug_never_shows_secrets() {
        let k = PrivateKey::from_bytes([0x41; 32]);
        let shown = format!("{k:?} {:?}", PresharedKey::from_bytes([0x41; 32]));
        assert!(!shown.contains("QUFB"), "{shown}");
        assert!(shown.contains("redacted"));
    }

    #[test]
    fn public_key_matches_rfc7748_alice() {
        // RFC 7748 section 6.1: Alice's private and public keys.
        let sk: [u8; 32] = hex::decode("77076d0a7318a57d3c16c17251b26645df4c2f87ebc0992ab177fba51db92c2a")
            .unwrap()
            .try_into()
            .unwrap();
        let pk = PrivateKey::from_bytes(sk).public_key();
        assert_eq!(
            hex::encode(pk.0),
            "8520f0098930a754748b7ddcb43ef75a0dbf3a0d26381af4eba4a98eaa9b4e6a"
        );
    }
}
