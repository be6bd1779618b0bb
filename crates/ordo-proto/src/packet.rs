//! What the core needs to know of an inner IP packet: its version, true length (to strip
//! padding) and addresses (for cryptokey routing).

use smoltcp::wire::{Ipv4Packet, Ipv6Packet};
use std::net::IpAddr;

/// The fields of an inner IPv4 or IPv6 header that routing needs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct IpHeader {
    pub src: IpAddr,
    pub dst: IpAddr,
    /// Length the header declares for the whole packet.
    pub total_len: usize,
}

/// Parses the start of an IP packet; None if it is not a plausible IPv4 or IPv6 packet that
/// fits in `p`: IPv4's header length at least 20 bytes and within its total length, the
/// total length within `p`; IPv6's fixed header and payload length within `p`. What follows
/// the declared length is padding, which the caller strips.
pub fn parse(p: &[u8]) -> Option<IpHeader> {
    match p.first()? >> 4 {
        4 => {
            let h = Ipv4Packet::new_checked(p).ok()?;
            Some(IpHeader {
                src: h.src_addr().into(),
                dst: h.dst_addr().into(),
                total_len: usize::from(h.total_len()),
            })
        }
        6 => {
            let h = Ipv6Packet::new_checked(p).ok()?;
            Some(IpHeader {
                src: h.src_addr().into(),
                dst: h.dst_addr().into(),
                total_len: h.total_len(),
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
        v4[2..4].copy_from_slice(&28u16.to_be_bytes());
        for ihl in [0u8, 4] {
            v4[0] = 0x40 | ihl;
            assert!(
                parse(&v4).is_none(),
                "an IPv4 header length of {ihl} words is below the minimum"
            );
        }
        v4[0] = 0x46;
        v4[2..4].copy_from_slice(&20u16.to_be_bytes());
        assert!(parse(&v4).is_none(), "a header longer than the packet it declares");
        assert!(parse(&[0x50; 40]).is_none());
        assert!(parse(&[]).is_none());
    }
}
