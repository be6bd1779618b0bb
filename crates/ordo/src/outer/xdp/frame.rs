//! Frames as AF_XDP carries them: Ethernet, IPv4 or IPv6, and UDP headers in front of a
//! WireGuard message, written by Ordo on the way out (the kernel adds nothing on this path)
//! and read by Ordo on the way in. The UDP checksum is computed for both families: IPv6
//! requires it (RFC 8200 §8.1), and on IPv4 a receiver may verify what it is given.

use crate::packet::ip::{fix_udp, pseudo_sum};
use smoltcp::wire::{IpProtocol, Ipv4Packet, Ipv6Packet, UdpPacket};
use std::net::{IpAddr, SocketAddr};
use std::ops::Range;

/// Where a datagram goes on the link and in the network: the kernel's route and neighbour
/// for `to` decide the hardware addresses and `from`'s address.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Path {
    /// Our interface's hardware address.
    pub from_mac: [u8; 6],
    /// The next hop's (the peer itself on its link, or the gateway).
    pub to_mac: [u8; 6],
    pub from: SocketAddr,
    pub to: SocketAddr,
}

const ETH_LEN: usize = 14;
/// Where the Ethernet header names what follows, and the two it may name here.
const ETHERTYPE_AT: usize = 12;
const ETHERTYPE_IPV4: u16 = 0x0800;
const ETHERTYPE_IPV6: u16 = 0x86dd;
const UDP_LEN: usize = 8;
/// Hop limit and TTL, as the kernel's default.
const HOPS: u8 = 64;

/// Bytes of headers in front of the payload on `path`.
pub fn header_len(path: &Path) -> usize {
    ETH_LEN + if path.to.is_ipv6() { 40 } else { 20 } + UDP_LEN
}

/// Writes the headers at the front of `frame`, whose payload follows them
/// ([`header_len`] bytes in). False, with nothing written, when `from` and `to` are of
/// different families or the frame is too short or too long for one datagram.
pub fn write_headers(path: &Path, frame: &mut [u8]) -> bool {
    let hdr = header_len(path);
    let udp_len = frame.len().saturating_sub(hdr) + UDP_LEN;
    if frame.len() < hdr || udp_len > usize::from(u16::MAX) - 40 || path.from.is_ipv6() != path.to.is_ipv6() {
        return false;
    }
    let (eth, ip) = frame.split_at_mut(ETH_LEN);
    // Ethernet by hand: smoltcp's Ethernet views come with its Ethernet medium, which the
    // stack (IP medium) does not build.
    eth[0..6].copy_from_slice(&path.to_mac);
    eth[6..12].copy_from_slice(&path.from_mac);
    let (ethertype, ip_len) = match (path.from.ip(), path.to.ip()) {
        (IpAddr::V4(from), IpAddr::V4(to)) => {
            let mut p = Ipv4Packet::new_unchecked(&mut *ip);
            p.set_version(4);
            p.set_header_len(20);
            p.set_dscp(0);
            p.set_ecn(0);
            p.set_total_len((20 + udp_len) as u16);
            // ID 0 with don't-fragment, as RFC 6864 allows for atomic datagrams.
            p.set_ident(0);
            p.set_dont_frag(true);
            p.set_more_frags(false);
            p.set_frag_offset(0);
            p.set_hop_limit(HOPS);
            p.set_next_header(IpProtocol::Udp);
            p.set_src_addr(from);
            p.set_dst_addr(to);
            p.fill_checksum();
            (ETHERTYPE_IPV4, 20)
        }
        (IpAddr::V6(from), IpAddr::V6(to)) => {
            let mut p = Ipv6Packet::new_unchecked(&mut *ip);
            p.set_version(6);
            p.set_traffic_class(0);
            p.set_flow_label(0);
            p.set_payload_len(udp_len as u16);
            p.set_next_header(IpProtocol::Udp);
            p.set_hop_limit(HOPS);
            p.set_src_addr(from);
            p.set_dst_addr(to);
            (ETHERTYPE_IPV6, 40)
        }
        _ => unreachable!("families checked above"),
    };
    eth[ETHERTYPE_AT..ETH_LEN].copy_from_slice(&ethertype.to_be_bytes());
    let pseudo = pseudo_sum(ip, ip_len == 40, udp_len, IpProtocol::Udp);
    let mut udp = UdpPacket::new_unchecked(&mut ip[ip_len..]);
    udp.set_src_port(path.from.port());
    udp.set_dst_port(path.to.port());
    // The length and the checksum (over the whole datagram: the crate's own AVX2 sum).
    fix_udp(udp.into_inner(), pseudo);
    true
}

/// Where a received datagram came from and where its payload lies in its frame.
#[derive(Debug, PartialEq, Eq)]
pub struct Received {
    pub src: SocketAddr,
    pub payload: Range<usize>,
}

/// Reads a frame the program redirected: Ethernet, IPv4 without options or IPv6 without
/// extension headers, UDP. None for anything else, or lengths that do not add up. The IP
/// length may be less than the frame's (Ethernet pads short frames), never more; UDP's must
/// end where IP's does.
pub fn parse(frame: &[u8]) -> Option<Received> {
    let ethertype = u16::from_be_bytes(frame.get(ETHERTYPE_AT..ETH_LEN)?.try_into().ok()?);
    let ip = &frame[ETH_LEN..];
    let (src, ip_len, ip_end): (IpAddr, usize, usize) = match ethertype {
        ETHERTYPE_IPV4 => {
            let h = Ipv4Packet::new_checked(ip).ok()?;
            if h.version() != 4 || h.header_len() != 20 || h.next_header() != IpProtocol::Udp {
                return None;
            }
            (h.src_addr().into(), 20, usize::from(h.total_len()))
        }
        ETHERTYPE_IPV6 => {
            let h = Ipv6Packet::new_checked(ip).ok()?;
            if h.version() != 6 || h.next_header() != IpProtocol::Udp {
                return None;
            }
            (h.src_addr().into(), 40, h.total_len())
        }
        _ => return None,
    };
    let udp = UdpPacket::new_checked(ip.get(ip_len..ip_end)?).ok()?;
    if usize::from(udp.len()) != ip_end - ip_len {
        return None;
    }
    Some(Received {
        src: SocketAddr::new(src, udp.src_port()),
        payload: ETH_LEN + ip_len + UDP_LEN..ETH_LEN + ip_end,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::packet::checksum::{fold, sum16};
    use crate::packet::fixtures::udp_checksum_ok;

    fn path(from: &str, to: &str) -> Path {
        Path {
            from_mac: [0x02, 0, 0, 0, 0, 1],
            to_mac: [0x02, 0, 0, 0, 0, 2],
            from: from.parse().unwrap(),
            to: to.parse().unwrap(),
        }
    }

    #[test]
    fn headers_are_what_the_kernel_would_have_written() {
        for (p, ip_len) in [
            (path("192.0.2.1:51820", "192.0.2.2:40000"), 20),
            (path("[fd00::1]:51820", "[fd00::2]:40000"), 40),
        ] {
            let payload = b"\x04\0\0\0 a WireGuard message, odd length";
            let hdr = header_len(&p);
            let mut frame = vec![0xaa; hdr + payload.len()];
            frame[hdr..].copy_from_slice(payload);
            assert!(write_headers(&p, &mut frame));
            assert_eq!(&frame[0..6], &p.to_mac);
            assert_eq!(&frame[6..12], &p.from_mac);
            let ip = &frame[14..];
            let got = crate::packet::ip::udp_of(ip).expect("a UDP datagram whose lengths add up");
            assert_eq!(got.payload, payload.len());
            assert!(udp_checksum_ok(ip, ip_len, ip_len == 40), "UDP checksum");
            if ip_len == 20 {
                assert_eq!(fold(sum16(0, &ip[..20])), 0xffff, "IPv4 header checksum");
            }
            let udp = &ip[ip_len..];
            assert_eq!(u16::from_be_bytes([udp[0], udp[1]]), 51820);
            assert_eq!(u16::from_be_bytes([udp[2], udp[3]]), 40000);
            assert_eq!(&ip[ip_len + 8..], payload);
        }
    }

    #[test]
    fn mixed_families_and_short_frames_write_nothing() {
        let mixed = path("192.0.2.1:1", "[fd00::2]:2");
        let mut frame = vec![0u8; 100];
        assert!(!write_headers(&mixed, &mut frame));
        assert!(frame.iter().all(|&b| b == 0));
        let p = path("192.0.2.1:1", "192.0.2.2:2");
        assert!(!write_headers(&p, &mut [0u8; 41]));
        assert!(write_headers(&p, &mut [0u8; 42]), "an empty payload is a datagram");
    }

    fn frame_to(path: &Path, payload: &[u8]) -> Vec<u8> {
        let mut f = vec![0u8; header_len(path) + payload.len()];
        f[header_len(path)..].copy_from_slice(payload);
        assert!(write_headers(path, &mut f));
        f
    }

    #[test]
    fn a_frame_ordo_writes_parses_back_to_its_source_and_payload() {
        for (from, to) in [
            ("192.0.2.2:40000", "192.0.2.1:51820"),
            ("[fd00::2]:40000", "[fd00::1]:51820"),
        ] {
            let path = path(from, to);
            let f = frame_to(&path, b"a message");
            let r = parse(&f).expect("ours");
            assert_eq!(r.src, path.from);
            assert_eq!(&f[r.payload], b"a message");
            // Ethernet padding after the datagram is not payload.
            let mut padded = f.clone();
            padded.extend_from_slice(&[0; 9]);
            assert_eq!(&padded[parse(&padded).unwrap().payload], b"a message");
            // Cut short: not a datagram.
            assert_eq!(parse(&f[..f.len() - 1]), None);
            // A UDP length that does not end where IP's does.
            let mut short_udp = f.clone();
            let udp_len_at = header_len(&path) - 4;
            short_udp[udp_len_at + 1] -= 1;
            assert_eq!(parse(&short_udp), None);
            // Not UDP.
            let mut tcp = f.clone();
            tcp[ETH_LEN + if path.to.is_ipv6() { 6 } else { 9 }] = 6;
            assert_eq!(parse(&tcp), None);
        }
        assert_eq!(parse(&[0u8; 10]), None);
        assert_eq!(parse(&[0u8; 14]), None, "an Ethernet header and nothing behind");
    }
}
