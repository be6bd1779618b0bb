//! What the core needs to know of an inner IP packet: its version, true length (to strip
//! padding) and addresses (for cryptokey routing).

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

/// The fields of an inner IPv4 or IPv6 header that routing needs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct IpHeader {
    pub src: IpAddr,
    pub dst: IpAddr,
    /// Length the header declares for the whole packet.
    pub total_len: usize,
}

/// Parses the start of an IP packet; None if it is not a plausible IPv4 or IPv6 packet that
/// fits in `p`.
pub fn parse(p: &[u8]) -> Option<IpHeader> {
    match p.first()? >> 4 {
        4 if p.len() >= 20 => {
            let total_len = u16::from_be_bytes([p[2], p[3]]) as usize;
            let ihl = (p[0] & 0x0f) as usize * 4;
            if total_len < ihl.max(20) || total_len > p.len() {
                return None;
            }
            Some(IpHeader {
                src: IpAddr::V4(Ipv4Addr::from(<[u8; 4]>::try_from(&p[12..16]).ok()?)),
                dst: IpAddr::V4(Ipv4Addr::from(<[u8; 4]>::try_from(&p[16..20]).ok()?)),
                total_len,
            })
        }
        6 if p.len() >= 40 => {
            let total_len = 40 + u16::from_be_bytes([p[4], p[5]]) as usize;
            if total_len > p.len() {
                return None;
            }
            Some(IpHeader {
                src: IpAddr::V6(Ipv6Addr::from(<[u8; 16]>::try_from(&p[8..24]).ok()?)),
                dst: IpAddr::V6(Ipv6Addr::from(<[u8; 16]>::try_from(&p[24..40]).ok()?)),
                total_len,
            })
        }
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_v4_and_v6_and_rejects_short_or_lying_headers() {
        let mut v4 = [0u8; 28];
        v4[0] = 0x45;
        v4[2..4].copy_from_slice(&28u16.to_be_bytes());
        v4[12..16].copy_from_slice(&[10, 0, 0, 1]);
        v4[16..20].copy_from_slice(&[10, 0, 0, 2]);
        let h = parse(&v4).unwrap();
        assert_eq!(
            (h.src.to_string(), h.dst.to_string(), h.total_len),
            ("10.0.0.1".into(), "10.0.0.2".into(), 28)
        );
        v4[2..4].copy_from_slice(&29u16.to_be_bytes());
        assert!(parse(&v4).is_none(), "declares more than it carries");
        let mut v6 = [0u8; 48];
        v6[0] = 0x60;
        v6[4..6].copy_from_slice(&8u16.to_be_bytes());
        v6[23] = 1;
        v6[39] = 2;
        let h = parse(&v6).unwrap();
        assert_eq!(
            (h.src.to_string(), h.dst.to_string(), h.total_len),
            ("::1".into(), "::2".into(), 48)
        );
        assert!(parse(&v6[..30]).is_none());
        assert!(parse(&[0x50; 40]).is_none());
        assert!(parse(&[]).is_none());
    }
}
