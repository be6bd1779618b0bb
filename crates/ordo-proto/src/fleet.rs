//! A fleet of gateways behind one anycast address, sharing one static key: what the protocol
//! core needs so that any gateway can tell whose session a datagram belongs to, and either
//! pass it one hop to the gateway that holds it or, when that gateway is gone, take the
//! client over with a handshake of its own.
//!
//! **Owners in receiver indices.** A gateway's receiver indices carry its id in their top
//! byte (the idea of QUIC-LB, draft-ietf-quic-load-balancers): a data message names the
//! gateway that made its session. The low byte stays the receive queue's (`steering`), and
//! the 16 bits between are random.
//!
//! **Envelopes.** A datagram passed to its owner goes whole, after a header that says where
//! the client sent it from, so that the owner answers the client directly:
//!
//! ```text
//! 0        1        2           4                4+A        4+A+16
//! | 0x4f   | 4 or 6 | port (BE) | address (A=4|16) | tag (16) | datagram ...
//! ```
//!
//! The tag is a keyed BLAKE2s over the header and the datagram's first 16 bytes (type,
//! indices, counter), keyed from the fleet's shared private key: only a gateway of the fleet
//! can make an envelope, and one cannot be re-addressed. The datagram itself stays
//! authenticated by WireGuard, and its counter by the replay window.

use crate::crypto;
use crate::keys::PrivateKey;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};
use zeroize::Zeroizing;

/// A gateway's id within its fleet: the top byte of its receiver indices. 0 means none.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct GatewayId(pub u8);

/// Where the owner's id sits in a receiver index.
const OWNER_SHIFT: u32 = 24;

/// The gateway that made receiver index `index`.
pub fn owner_of(index: u32) -> GatewayId {
    GatewayId((index >> OWNER_SHIFT) as u8)
}

/// `index` with its top byte naming `owner`.
pub fn with_owner(index: u32, owner: GatewayId) -> u32 {
    (index & !(0xff << OWNER_SHIFT)) | (u32::from(owner.0) << OWNER_SHIFT)
}

/// The first byte of an envelope: no WireGuard message type (1 to 4).
pub const ENVELOPE_TYPE: u8 = 0x4f;
const TAG_LEN: usize = 16;
/// The datagram bytes the tag covers: its type, indices and counter.
const TAGGED_PREFIX: usize = 16;
/// Bytes an envelope adds to a datagram, at most (an IPv6 client).
pub const MAX_ENVELOPE_OVERHEAD: usize = 4 + 16 + TAG_LEN;

/// The key of the fleet's envelope tags, derived from the private key all its gateways share.
#[derive(Clone)]
pub struct EnvelopeKey(Zeroizing<[u8; 32]>);

impl EnvelopeKey {
    pub fn of(private: &PrivateKey) -> EnvelopeKey {
        EnvelopeKey(Zeroizing::new(crypto::hash(&[
            b"ordo fleet envelope v1",
            private.bytes(),
        ])))
    }

    fn tag(&self, header: &[u8], datagram: &[u8]) -> [u8; TAG_LEN] {
        let prefix = &datagram[..datagram.len().min(TAGGED_PREFIX)];
        crypto::mac(&self.0[..], &[header, prefix])
    }
}

impl std::fmt::Debug for EnvelopeKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("EnvelopeKey(<redacted>)")
    }
}

/// Whether a datagram is an envelope (by its first byte alone).
pub fn is_envelope(datagram: &[u8]) -> bool {
    datagram.first() == Some(&ENVELOPE_TYPE)
}

/// `datagram`, received from `client`, in an envelope for its owner.
pub fn seal_envelope(key: &EnvelopeKey, client: SocketAddr, datagram: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(MAX_ENVELOPE_OVERHEAD + datagram.len());
    out.push(ENVELOPE_TYPE);
    match client.ip() {
        IpAddr::V4(a) => {
            out.push(4);
            out.extend_from_slice(&client.port().to_be_bytes());
            out.extend_from_slice(&a.octets());
        }
        IpAddr::V6(a) => {
            out.push(6);
            out.extend_from_slice(&client.port().to_be_bytes());
            out.extend_from_slice(&a.octets());
        }
    }
    let tag = key.tag(&out, datagram);
    out.extend_from_slice(&tag);
    out.extend_from_slice(datagram);
    out
}

/// An envelope opened: the client it came from and where its datagram starts.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Opened {
    pub client: SocketAddr,
    pub datagram_at: usize,
}

/// Why an envelope was refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum EnvelopeError {
    Malformed,
    BadTag,
}

/// Checks an envelope's header and tag.
pub fn open_envelope(key: &EnvelopeKey, envelope: &[u8]) -> Result<Opened, EnvelopeError> {
    if !is_envelope(envelope) || envelope.len() < 4 {
        return Err(EnvelopeError::Malformed);
    }
    let port = u16::from_be_bytes([envelope[2], envelope[3]]);
    let (ip, header_len) = match envelope[1] {
        4 if envelope.len() >= 8 => {
            let a: [u8; 4] = envelope[4..8].try_into().expect("4 bytes");
            (IpAddr::V4(Ipv4Addr::from(a)), 8)
        }
        6 if envelope.len() >= 20 => {
            let a: [u8; 16] = envelope[4..20].try_into().expect("16 bytes");
            (IpAddr::V6(Ipv6Addr::from(a)), 20)
        }
        _ => return Err(EnvelopeError::Malformed),
    };
    let datagram_at = header_len + TAG_LEN;
    if envelope.len() <= datagram_at {
        return Err(EnvelopeError::Malformed);
    }
    let (header, rest) = envelope.split_at(header_len);
    let (tag, datagram) = rest.split_at(TAG_LEN);
    let expected = key.tag(header, datagram);
    // Constant time: a tag is a secret's output, and an attacker may time the comparison.
    if !constant_time_eq(tag, &expected) {
        return Err(EnvelopeError::BadTag);
    }
    Ok(Opened {
        client: SocketAddr::new(ip, port),
        datagram_at,
    })
}

fn constant_time_eq(a: &[u8], b: &[u8]) -> bool {
    a.len() == b.len() && a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::steering::{index_for_queue, queue_of_index};

    fn key(byte: u8) -> EnvelopeKey {
        EnvelopeKey::of(&PrivateKey::from_bytes([byte; 32]))
    }

    #[test]
    fn the_owner_rides_in_the_top_byte_and_leaves_the_queue_alone() {
        let index = index_for_queue(0xdead_beef, 3, 4);
        let owned = with_owner(index, GatewayId(7));
        assert_eq!(owner_of(owned), GatewayId(7));
        assert_eq!(queue_of_index(owned, 4), 3);
        assert_eq!(owned & 0x00ff_ffff, index & 0x00ff_ffff);
        assert_eq!(owner_of(with_owner(owned, GatewayId(255))), GatewayId(255));
    }

    #[test]
    fn an_envelope_opens_with_the_fleet_key_only() {
        let datagram: Vec<u8> = (0..60u8).collect();
        for client in ["10.9.0.2:40000", "[2001:db8::5]:51820"] {
            let client: SocketAddr = client.parse().unwrap();
            let sealed = seal_envelope(&key(1), client, &datagram);
            assert!(is_envelope(&sealed));
            let opened = open_envelope(&key(1), &sealed).unwrap();
            assert_eq!(opened.client, client);
            assert_eq!(&sealed[opened.datagram_at..], &datagram[..]);
            assert_eq!(
                open_envelope(&key(2), &sealed),
                Err(EnvelopeError::BadTag),
                "another key"
            );
        }
    }

    #[test]
    fn a_re_addressed_or_altered_envelope_is_refused() {
        let datagram: Vec<u8> = (0..60u8).collect();
        let sealed = seal_envelope(&key(1), "10.9.0.2:40000".parse().unwrap(), &datagram);
        for at in 1..sealed.len().min(8 + 16 + 16) {
            let mut bad = sealed.clone();
            bad[at] ^= 1;
            assert!(open_envelope(&key(1), &bad).is_err(), "byte {at} altered");
        }
        assert_eq!(
            open_envelope(&key(1), &sealed[..8 + 16]),
            Err(EnvelopeError::Malformed),
            "no datagram"
        );
        for short in 0..8 {
            assert_eq!(open_envelope(&key(1), &sealed[..short]), Err(EnvelopeError::Malformed));
        }
        let mut family = sealed.clone();
        family[1] = 5;
        assert_eq!(open_envelope(&key(1), &family), Err(EnvelopeError::Malformed));
    }
}
