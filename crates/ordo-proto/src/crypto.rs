//! The primitives of the WireGuard whitepaper (section 5.4), named as the paper names them:
//! HASH, MAC, HMAC, KDF_n, AEAD and XAEAD. Every other module builds on these and on nothing
//! lower, so a reader can check the handshake against the paper line by line.

use blake2::digest::{FixedOutput, Update};
use blake2::{Blake2s256, Blake2sMac, Digest};
use chacha20poly1305::aead::{AeadInPlace, KeyInit};
use chacha20poly1305::XChaCha20Poly1305;
use hmac::SimpleHmac;
use ring::aead::{Aad, LessSafeKey, Nonce, UnboundKey, CHACHA20_POLY1305};
use zeroize::Zeroizing;

/// Length of a Poly1305 tag: every AEAD ciphertext is this much longer than its plaintext.
pub const TAG_LEN: usize = 16;

/// HASH(input): BLAKE2s-256 over the concatenation of `parts`.
pub fn hash(parts: &[&[u8]]) -> [u8; 32] {
    let mut h = Blake2s256::new();
    for p in parts {
        Digest::update(&mut h, p);
    }
    h.finalize().into()
}

/// MAC(key, input): keyed BLAKE2s with a 16-byte output. Keys are 32 bytes (mac1, cookie keys)
/// or 16 bytes (a cookie used as the key of mac2).
pub fn mac(key: &[u8], parts: &[&[u8]]) -> [u8; 16] {
    let mut m = <Blake2sMac<blake2::digest::consts::U16> as blake2::digest::KeyInit>::new_from_slice(key)
        .expect("BLAKE2s accepts keys of 1..=32 bytes");
    for p in parts {
        Update::update(&mut m, p);
    }
    m.finalize_fixed().into()
}

/// HMAC(key, input) over any hash; WireGuard uses it with BLAKE2s inside the KDF.
fn hmac_with<M, const N: usize>(key: &[u8], parts: &[&[u8]]) -> Zeroizing<[u8; N]>
where
    M: hmac::Mac + hmac::digest::KeyInit,
{
    let mut m = <M as hmac::digest::KeyInit>::new_from_slice(key).expect("HMAC takes any key");
    for p in parts {
        hmac::Mac::update(&mut m, p);
    }
    let out = m.finalize().into_bytes();
    let mut r = Zeroizing::new([0u8; N]);
    r.copy_from_slice(&out[..N]);
    r
}

/// KDF_n(key, input): HKDF (RFC 5869) with an empty info string, returning `N` 32-byte keys.
pub fn kdf<const N: usize>(key: &[u8; 32], input: &[u8]) -> [Zeroizing<[u8; 32]>; N] {
    #[cfg(fuzzing)]
    return remembered_kdf(key, input);
    #[cfg(not(fuzzing))]
    kdf_with::<SimpleHmac<Blake2s256>, 32, N>(key, input)
}

/// Under the fuzzer, KDF_n computed once ([`crate::memo`]): twelve BLAKE2s compressions for
/// KDF_2. HASH and MAC, one to three, cost about what a look-up costs, and are not remembered.
#[cfg(fuzzing)]
fn remembered_kdf<const N: usize>(key: &[u8; 32], input: &[u8]) -> [Zeroizing<[u8; 32]>; N] {
    let mut all = Zeroizing::new([0u8; 96]);
    crate::memo::remembered(crate::memo::Function::Kdf, &[key, input], &mut all[..32 * N], |o| {
        let keys = kdf_with::<SimpleHmac<Blake2s256>, 32, N>(key, input);
        for (chunk, k) in o.chunks_exact_mut(32).zip(&keys) {
            chunk.copy_from_slice(&k[..]);
        }
    });
    std::array::from_fn(|i| Zeroizing::new(all[32 * i..32 * (i + 1)].try_into().expect("32 bytes")))
}

/// The KDF over any HMAC, so the construction can be checked against RFC 5869's SHA-256 vectors.
pub(crate) fn kdf_with<M, const L: usize, const N: usize>(key: &[u8], input: &[u8]) -> [Zeroizing<[u8; L]>; N]
where
    M: hmac::Mac + hmac::digest::KeyInit,
{
    let prk = hmac_with::<M, L>(key, &[input]);
    let mut prev: Option<Zeroizing<[u8; L]>> = None;
    std::array::from_fn(|i| {
        let counter = [(i + 1) as u8];
        let next = match &prev {
            None => hmac_with::<M, L>(&prk[..], &[&counter]),
            Some(p) => hmac_with::<M, L>(&prk[..], &[&p[..], &counter]),
        };
        prev = Some(next.clone());
        next
    })
}

/// An AEAD key (ChaCha20-Poly1305, RFC 8439) with WireGuard's nonce layout: 32 zero bits
/// followed by the 64-bit little-endian counter. ring is used for speed (about 3x RustCrypto's
/// chacha20poly1305 0.10 on 1420-byte packets, measured once with a throwaway program when
/// this was chosen; `ordo bench` reports ring's own figure); ring does not erase keys, so
/// this type does.
pub struct AeadKey(LessSafeKey);

impl Drop for AeadKey {
    fn drop(&mut self) {
        self.erase();
    }
}

impl AeadKey {
    /// Overwrites the key material with the all-zero key.
    fn erase(&mut self) {
        let blank = LessSafeKey::new(UnboundKey::new(&CHACHA20_POLY1305, &[0u8; 32]).expect("key length is 32"));
        // SAFETY: `self.0` is a valid, aligned LessSafeKey that we own; writing another valid
        // LessSafeKey over it is sound (the old value has no drop glue to skip), and a volatile
        // write cannot be removed as a dead store the way a plain assignment before a drop can.
        unsafe { std::ptr::write_volatile(&mut self.0, blank) };
    }

    pub fn new(key: &[u8; 32]) -> Self {
        AeadKey(LessSafeKey::new(
            UnboundKey::new(&CHACHA20_POLY1305, key).expect("key length is 32"),
        ))
    }

    fn nonce(counter: u64) -> Nonce {
        let mut n = [0u8; 12];
        n[4..].copy_from_slice(&counter.to_le_bytes());
        Nonce::assume_unique_for_key(n)
    }

    /// Encrypts `buf[..len - TAG_LEN]` in place and writes the tag into the last TAG_LEN bytes.
    pub fn seal_in_place(&self, counter: u64, aad: &[u8], buf: &mut [u8]) {
        let split = buf.len() - TAG_LEN;
        let (data, tag_out) = buf.split_at_mut(split);
        let tag = self
            .0
            .seal_in_place_separate_tag(Self::nonce(counter), Aad::from(aad), data)
            .expect("ChaCha20-Poly1305 seals any length below 2^38 bytes");
        tag_out.copy_from_slice(tag.as_ref());
    }

    /// Authenticates and decrypts `buf` (ciphertext followed by tag) in place; returns the
    /// plaintext length, or None if the tag does not verify.
    pub fn open_in_place(&self, counter: u64, aad: &[u8], buf: &mut [u8]) -> Option<usize> {
        self.0
            .open_in_place(Self::nonce(counter), Aad::from(aad), buf)
            .ok()
            .map(|p| p.len())
    }
}

/// AEAD(key, counter, plain, aad) returning a fresh ciphertext, for the small handshake fields.
pub fn aead_seal<const P: usize, const C: usize>(key: &[u8; 32], counter: u64, plain: &[u8; P], aad: &[u8]) -> [u8; C] {
    debug_assert_eq!(C, P + TAG_LEN);
    let mut out = [0u8; C];
    out[..P].copy_from_slice(plain);
    AeadKey::new(key).seal_in_place(counter, aad, &mut out);
    out
}

/// The inverse of [`aead_seal`]; the plaintext is zeroized when dropped.
pub fn aead_open<const P: usize, const C: usize>(
    key: &[u8; 32],
    counter: u64,
    cipher: &[u8; C],
    aad: &[u8],
) -> Option<Zeroizing<[u8; P]>> {
    debug_assert_eq!(C, P + TAG_LEN);
    let mut buf = Zeroizing::new(*cipher);
    AeadKey::new(key).open_in_place(counter, aad, &mut buf[..])?;
    let mut out = Zeroizing::new([0u8; P]);
    out.copy_from_slice(&buf[..P]);
    Some(out)
}

/// XAEAD(key, nonce, plain, aad): XChaCha20-Poly1305, used only to seal cookies.
pub fn xaead_seal(key: &[u8; 32], nonce: &[u8; 24], plain: &[u8; 16], aad: &[u8]) -> [u8; 32] {
    let cipher = XChaCha20Poly1305::new(key.into());
    let mut buf = *plain;
    let tag = cipher
        .encrypt_in_place_detached(nonce.into(), aad, &mut buf)
        .expect("16 bytes always seal");
    let mut out = [0u8; 32];
    out[..16].copy_from_slice(&buf);
    out[16..].copy_from_slice(&tag);
    out
}

/// The inverse of [`xaead_seal`].
pub fn xaead_open(key: &[u8; 32], nonce: &[u8; 24], sealed: &[u8; 32], aad: &[u8]) -> Option<[u8; 16]> {
    let cipher = XChaCha20Poly1305::new(key.into());
    let mut buf: [u8; 16] = sealed[..16].try_into().unwrap();
    cipher
        .decrypt_in_place_detached(nonce.into(), aad, &mut buf, sealed[16..].into())
        .ok()?;
    Some(buf)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn unhex<const N: usize>(s: &str) -> [u8; N] {
        hex::decode(s.replace([' ', '\n'], "")).unwrap().try_into().unwrap()
    }

    #[test]
    fn blake2s_rfc7693_abc() {
        // RFC 7693 appendix B: BLAKE2s-256("abc").
        assert_eq!(
            hex::encode(hash(&[b"a", b"bc"])),
            "508c5e8c327c14e2e1a72ba34eeb452f37458b209ed63a294d999b4c86675982"
        );
    }

    #[test]
    fn keyed_blake2s_matches_blake2_reference() {
        // The BLAKE2 reference KAT (blake2s-kat.txt): key 00..1f, empty input, 32-byte
        // output. MAC truncates the output length parameter to 16, so check the digest
        // crate's 32-byte keyed variant against the KAT and our MAC for determinism.
        let key: Vec<u8> = (0u8..32).collect();
        let mut m = <Blake2sMac<blake2::digest::consts::U32> as blake2::digest::KeyInit>::new_from_slice(&key).unwrap();
        Update::update(&mut m, b"");
        let out: [u8; 32] = m.finalize_fixed().into();
        assert_eq!(
            hex::encode(out),
            "48a8997da407876b3d79c0d92325ad3b89cbb754d86ab71aee047ad345fd2c49"
        );
        assert_eq!(mac(&key, &[b"x"]), mac(&key, &[b"", b"x"]));
        assert_ne!(mac(&key, &[b"x"]), mac(&key[..16], &[b"x"]));
    }

    #[test]
    fn kdf_construction_is_hkdf_rfc5869_case3() {
        // RFC 5869 test case 3 (SHA-256, empty salt and info): WireGuard's KDF_n is HKDF
        // with the chaining key as salt and an empty info, so the same code over
        // HMAC-SHA-256 must reproduce the RFC's output.
        let ikm = [0x0bu8; 22];
        let [t1, t2] = kdf_with::<hmac::Hmac<sha2::Sha256>, 32, 2>(&[], &ikm);
        let okm = [&t1[..], &t2[..10]].concat();
        assert_eq!(
            hex::encode(okm),
            "8da4e775a563c18f715f802a063c5a31b8a11f5c5ee1879ec3454e5f3c738d2d9d201395faa4b61a96c8"
        );
    }

    #[test]
    fn chacha20poly1305_rfc8439_2_8_2() {
        let key: [u8; 32] = unhex("808182838485868788898a8b8c8d8e8f909192939495969798999a9b9c9d9e9f");
        let nonce: [u8; 12] = unhex("070000004041424344454647");
        let aad = hex::decode("50515253c0c1c2c3c4c5c6c7").unwrap();
        let plain = b"Ladies and Gentlemen of the class of '99: If I could offer you only one tip for the future, sunscreen would be it.";
        let k = LessSafeKey::new(UnboundKey::new(&CHACHA20_POLY1305, &key).unwrap());
        let mut buf = plain.to_vec();
        let tag = k
            .seal_in_place_separate_tag(Nonce::assume_unique_for_key(nonce), Aad::from(&aad), &mut buf)
            .unwrap();
        assert_eq!(hex::encode(tag.as_ref()), "1ae10b594f09e26a7e902ecbd0600691");
        assert_eq!(hex::encode(&buf[..16]), "d31a8d34648e60db7b86afbc53ef7ec2");
        // Our wrapper's nonce layout: 4 zero bytes then the little-endian counter.
        let counter = u64::from_le_bytes(nonce[4..].try_into().unwrap());
        assert_eq!(
            &nonce[..4],
            &[7, 0, 0, 0],
            "RFC nonce has a non-zero prefix; rebuild it"
        );
        let mut mine = plain.to_vec();
        mine.extend_from_slice(&[0; 16]);
        AeadKey::new(&key).seal_in_place(counter, &aad, &mut mine);
        let n = AeadKey::new(&key).open_in_place(counter, &aad, &mut mine).unwrap();
        assert_eq!(&mine[..n], &plain[..]);
    }

    #[test]
    fn xchacha20poly1305_draft_vector() {
        // draft-irtf-cfrg-xchacha-03 appendix A.3.1, first 16 bytes of plaintext.
        let key: [u8; 32] = unhex("808182838485868788898a8b8c8d8e8f909192939495969798999a9b9c9d9e9f");
        let nonce: [u8; 24] = unhex("404142434445464748494a4b4c4d4e4f5051525354555657");
        let aad = hex::decode("50515253c0c1c2c3c4c5c6c7").unwrap();
        let plain: [u8; 16] = *b"Ladies and Gentl";
        let sealed = xaead_seal(&key, &nonce, &plain, &aad);
        assert_eq!(hex::encode(&sealed[..16]), "bd6d179d3e83d43b9576579493c0e939");
        assert_eq!(xaead_open(&key, &nonce, &sealed, &aad), Some(plain));
        let mut bad = sealed;
        bad[31] ^= 1;
        assert_eq!(xaead_open(&key, &nonce, &bad, &aad), None);
    }

    #[test]
    fn erased_key_is_the_zero_key() {
        let seal = |k: &AeadKey| {
            let mut b = [1u8; 48];
            k.seal_in_place(9, b"", &mut b);
            b
        };
        let mut k = AeadKey::new(&[0x5a; 32]);
        let before = seal(&k);
        k.erase();
        assert_ne!(seal(&k), before);
        assert_eq!(
            seal(&k),
            seal(&AeadKey::new(&[0; 32])),
            "no trace of the old key is used"
        );
    }

    #[test]
    fn aead_rejects_tampering() {
        let key = [5u8; 32];
        let c: [u8; 28] = aead_seal(&key, 3, &[1u8; 12], b"h");
        assert!(aead_open::<12, 28>(&key, 3, &c, b"h").is_some());
        assert!(aead_open::<12, 28>(&key, 4, &c, b"h").is_none());
        assert!(aead_open::<12, 28>(&key, 3, &c, b"x").is_none());
    }
}
