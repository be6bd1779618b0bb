//! The four WireGuard messages on the wire (whitepaper section 5.4), parsed without copying
//! the payload and built into caller-provided buffers. All integers are little-endian.

/// Message type numbers; the three bytes after the type are reserved and must be zero.
pub const TYPE_INITIATION: u8 = 1;
pub const TYPE_RESPONSE: u8 = 2;
pub const TYPE_COOKIE_REPLY: u8 = 3;
pub const TYPE_DATA: u8 = 4;

pub const INITIATION_LEN: usize = 148;
pub const RESPONSE_LEN: usize = 92;
pub const COOKIE_REPLY_LEN: usize = 64;
/// Header of a data message: type, receiver index, counter.
pub const DATA_HEADER_LEN: usize = 16;
/// A data message carries at least the Poly1305 tag.
pub const DATA_MIN_LEN: usize = DATA_HEADER_LEN + crate::crypto::TAG_LEN;
/// Bytes a data message adds to the inner packet (before padding).
pub const DATA_OVERHEAD: usize = DATA_MIN_LEN;

/// Offsets of the MACs at the end of the two handshake messages.
pub const fn mac1_offset(len: usize) -> usize {
    len - 32
}
pub const fn mac2_offset(len: usize) -> usize {
    len - 16
}

/// Handshake initiation: type 1.
#[derive(Clone)]
pub struct Initiation {
    pub sender: u32,
    pub ephemeral: [u8; 32],
    pub encrypted_static: [u8; 48],
    pub encrypted_timestamp: [u8; 28],
}

impl Initiation {
    pub fn parse(b: &[u8; INITIATION_LEN]) -> Self {
        Initiation {
            sender: u32::from_le_bytes(b[4..8].try_into().unwrap()),
            ephemeral: b[8..40].try_into().unwrap(),
            encrypted_static: b[40..88].try_into().unwrap(),
            encrypted_timestamp: b[88..116].try_into().unwrap(),
        }
    }
    /// Writes the message with zeroed MACs; the cookie module fills them in.
    pub fn write(&self) -> [u8; INITIATION_LEN] {
        let mut b = [0u8; INITIATION_LEN];
        b[0] = TYPE_INITIATION;
        b[4..8].copy_from_slice(&self.sender.to_le_bytes());
        b[8..40].copy_from_slice(&self.ephemeral);
        b[40..88].copy_from_slice(&self.encrypted_static);
        b[88..116].copy_from_slice(&self.encrypted_timestamp);
        b
    }
}

/// Handshake response: type 2.
#[derive(Clone)]
pub struct Response {
    pub sender: u32,
    pub receiver: u32,
    pub ephemeral: [u8; 32],
    pub encrypted_nothing: [u8; 16],
}

impl Response {
    pub fn parse(b: &[u8; RESPONSE_LEN]) -> Self {
        Response {
            sender: u32::from_le_bytes(b[4..8].try_into().unwrap()),
            receiver: u32::from_le_bytes(b[8..12].try_into().unwrap()),
            ephemeral: b[12..44].try_into().unwrap(),
            encrypted_nothing: b[44..60].try_into().unwrap(),
        }
    }
    pub fn write(&self) -> [u8; RESPONSE_LEN] {
        let mut b = [0u8; RESPONSE_LEN];
        b[0] = TYPE_RESPONSE;
        b[4..8].copy_from_slice(&self.sender.to_le_bytes());
        b[8..12].copy_from_slice(&self.receiver.to_le_bytes());
        b[12..44].copy_from_slice(&self.ephemeral);
        b[44..60].copy_from_slice(&self.encrypted_nothing);
        b
    }
}

/// Cookie reply: type 3.
#[derive(Clone)]
pub struct CookieReply {
    pub receiver: u32,
    pub nonce: [u8; 24],
    pub encrypted_cookie: [u8; 32],
}

impl CookieReply {
    pub fn parse(b: &[u8; COOKIE_REPLY_LEN]) -> Self {
        CookieReply {
            receiver: u32::from_le_bytes(b[4..8].try_into().unwrap()),
            nonce: b[8..32].try_into().unwrap(),
            encrypted_cookie: b[32..64].try_into().unwrap(),
        }
    }
    pub fn write(&self) -> [u8; COOKIE_REPLY_LEN] {
        let mut b = [0u8; COOKIE_REPLY_LEN];
        b[0] = TYPE_COOKIE_REPLY;
        b[4..8].copy_from_slice(&self.receiver.to_le_bytes());
        b[8..32].copy_from_slice(&self.nonce);
        b[32..64].copy_from_slice(&self.encrypted_cookie);
        b
    }
}

/// The header of a transport data message: type 4.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct DataHeader {
    pub receiver: u32,
    pub counter: u64,
}

impl DataHeader {
    pub fn parse(b: &[u8]) -> Self {
        DataHeader {
            receiver: u32::from_le_bytes(b[4..8].try_into().unwrap()),
            counter: u64::from_le_bytes(b[8..16].try_into().unwrap()),
        }
    }
    pub fn write(&self, b: &mut [u8]) {
        b[0] = TYPE_DATA;
        b[1..4].fill(0);
        b[4..8].copy_from_slice(&self.receiver.to_le_bytes());
        b[8..16].copy_from_slice(&self.counter.to_le_bytes());
    }
}

/// What a datagram claims to be, judged only by its type and length.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    Initiation,
    Response,
    CookieReply,
    Data,
}

/// Classifies a datagram; None for anything that is not a well-formed WireGuard message.
pub fn classify(b: &[u8]) -> Option<Kind> {
    if b.len() < 4 || b[1..4] != [0, 0, 0] {
        return None;
    }
    match (b[0], b.len()) {
        (TYPE_INITIATION, INITIATION_LEN) => Some(Kind::Initiation),
        (TYPE_RESPONSE, RESPONSE_LEN) => Some(Kind::Response),
        (TYPE_COOKIE_REPLY, COOKIE_REPLY_LEN) => Some(Kind::CookieReply),
        (TYPE_DATA, n) if n >= DATA_MIN_LEN => Some(Kind::Data),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn classify_checks_type_length_and_reserved_bytes() {
        let mut init = [0u8; INITIATION_LEN];
        init[0] = 1;
        assert_eq!(classify(&init), Some(Kind::Initiation));
        assert_eq!(classify(&init[..147]), None);
        init[2] = 1;
        assert_eq!(classify(&init), None);
        let mut data = [0u8; DATA_MIN_LEN];
        data[0] = 4;
        assert_eq!(classify(&data), Some(Kind::Data));
        assert_eq!(classify(&data[..DATA_MIN_LEN - 1]), None);
        assert_eq!(classify(&[9, 0, 0, 0]), None);
        assert_eq!(classify(&[]), None);
    }

    #[test]
    fn messages_round_trip() {
        let i = Initiation {
            sender: 0x01020304,
            ephemeral: [1; 32],
            encrypted_static: [2; 48],
            encrypted_timestamp: [3; 28],
        };
        let b = i.write();
        assert_eq!(&b[4..8], &[4, 3, 2, 1]);
        let p = Initiation::parse(&b);
        assert_eq!(p.sender, i.sender);
        assert_eq!(p.encrypted_timestamp, i.encrypted_timestamp);
        let r = Response {
            sender: 5,
            receiver: 6,
            ephemeral: [7; 32],
            encrypted_nothing: [8; 16],
        };
        let p = Response::parse(&r.write());
        assert_eq!((p.sender, p.receiver, p.encrypted_nothing), (5, 6, [8; 16]));
        let c = CookieReply {
            receiver: 9,
            nonce: [1; 24],
            encrypted_cookie: [2; 32],
        };
        let p = CookieReply::parse(&c.write());
        assert_eq!((p.receiver, p.nonce, p.encrypted_cookie), (9, [1; 24], [2; 32]));
        let mut d = [0u8; 16];
        DataHeader {
            receiver: 7,
            counter: u64::MAX - 1,
        }
        .write(&mut d);
        assert_eq!(
            DataHeader::parse(&d),
            DataHeader {
                receiver: 7,
                counter: u64::MAX - 1
            }
        );
    }
}
