//! Splitting the large packets a host hands over whole (TSO, USO) into wire-sized ones, as a
//! NIC would: headers copied, lengths, IDs, sequence numbers and every checksum computed.

use super::ip::{fix_ip, fix_tcp, fix_udp, ipv4_ident, set_segment_header, TcpFlags};
use super::ip::{IPV4_HEADER_LEN, IPV6_HEADER_LEN, TCP_HEADER_LEN, UDP_HEADER_LEN};
use super::{Offload, PartialChecksum, Segmentation};
use crate::port::PacketBuf;
use smoltcp::wire::{IpProtocol, Ipv4Packet, Ipv6Packet, TcpPacket};

/// One segment's buffer: the big packet's headers and the payload chunk.
fn segment_copy(headers: &[u8], chunk: &[u8]) -> PacketBuf {
    let mut s = PacketBuf::with_capacity(headers.len() + chunk.len());
    s.push(headers);
    s.push(chunk);
    s
}

/// Splits a packet the kernel handed over whole (TSO or USO) into wire-sized packets, each
/// in a buffer of its own; false (and nothing appended) for one that does not match its
/// header.
pub fn segment(o: Offload, p: &[u8], out: &mut Vec<PacketBuf>) -> bool {
    match o.segmentation {
        Segmentation::Udp => segment_uso(o, p, out),
        Segmentation::Tcp4 | Segmentation::Tcp6 => segment_tso(o, p, out),
        Segmentation::None => false,
    }
}

/// The transport protocol of a packet handed over whole whose transport header starts at
/// `ip_len` (where its partial checksum starts), if its IP header agrees: IPv4's header
/// length is `ip_len`; IPv6's fixed header fits before it (extension headers may follow).
/// `p` holds at least `ip_len` bytes.
fn transport_at(p: &[u8], v6: bool, ip_len: usize) -> Option<IpProtocol> {
    if v6 {
        (ip_len >= IPV6_HEADER_LEN).then(|| Ipv6Packet::new_unchecked(p).next_header())
    } else {
        let h = Ipv4Packet::new_unchecked(p);
        (ip_len >= IPV4_HEADER_LEN && usize::from(h.header_len()) == ip_len).then(|| h.next_header())
    }
}

/// Splits a UDP datagram the kernel handed over whole (USO) into
/// datagrams of `gso_size` payload bytes, as `UDP_SEGMENT` would on the wire: headers copied,
/// IP and UDP lengths, IPv4 IDs and every checksum computed in full.
pub fn segment_uso(o: Offload, p: &[u8], out: &mut Vec<PacketBuf>) -> bool {
    let v6 = match p.first().map(|b| b >> 4) {
        Some(4) => false,
        Some(6) => true,
        _ => return false,
    };
    // The transport header starts where the partial checksum does.
    let Some(PartialChecksum { start, .. }) = o.checksum else {
        return false;
    };
    let ip_len = usize::from(start);
    if p.len() < ip_len + UDP_HEADER_LEN || o.segment_size == 0 || transport_at(p, v6, ip_len) != Some(IpProtocol::Udp)
    {
        return false;
    }
    let hdr = ip_len + UDP_HEADER_LEN;
    // No payload: nothing to cut into segments (chunks of nothing would make no packet).
    if p.len() == hdr {
        return false;
    }
    let id = ipv4_ident(p, v6).unwrap_or(0);
    for (i, chunk) in p[hdr..].chunks(usize::from(o.segment_size)).enumerate() {
        let mut s = segment_copy(&p[..hdr], chunk);
        let q = s.packet_mut();
        let pseudo = fix_ip(q, v6, ip_len, q.len(), Some(id.wrapping_add(i as u16)), IpProtocol::Udp);
        fix_udp(&mut q[ip_len..], pseudo);
        out.push(s);
    }
    true
}

/// Splits a TCP packet the kernel handed over whole (TSO) into
/// `gso_size` segments as a NIC would: headers copied, IP lengths and IDs, sequence numbers
/// and flags adjusted, every checksum computed in full. Each segment is appended to `out`.
/// Returns false (and appends nothing) for a packet whose
/// header does not match what its offload says.
pub fn segment_tso(o: Offload, p: &[u8], out: &mut Vec<PacketBuf>) -> bool {
    let v6 = match (o.segmentation, p.first().map(|b| b >> 4)) {
        (Segmentation::Tcp4, Some(4)) => false,
        (Segmentation::Tcp6, Some(6)) => true,
        _ => return false,
    };
    // The transport header starts where the partial checksum does.
    let Some(PartialChecksum { start, .. }) = o.checksum else {
        return false;
    };
    let ip_len = usize::from(start);
    // The protocol is not asked: IPv6 extension headers may stand between.
    if p.len() < ip_len + TCP_HEADER_LEN || o.segment_size == 0 || transport_at(p, v6, ip_len).is_none() {
        return false;
    }
    let whole = TcpPacket::new_unchecked(&p[ip_len..]);
    let doff = usize::from(whole.header_len());
    let hdr = ip_len + doff;
    // No payload: as for USO, not a packet to segment.
    if doff < TCP_HEADER_LEN || hdr >= p.len() {
        return false;
    }
    let seq = whole.seq_number().0 as u32;
    let flags = TcpFlags::of(&whole);
    let id = ipv4_ident(p, v6).unwrap_or(0);
    let payload = &p[hdr..];
    let n = payload.len().div_ceil(usize::from(o.segment_size)).max(1);
    for (i, chunk) in payload.chunks(usize::from(o.segment_size)).enumerate() {
        let mut s = segment_copy(&p[..hdr], chunk);
        let q = s.packet_mut();
        let pseudo = fix_ip(q, v6, ip_len, q.len(), Some(id.wrapping_add(i as u16)), IpProtocol::Tcp);
        let t = &mut q[ip_len..];
        let offset = (i * usize::from(o.segment_size)) as u32;
        set_segment_header(t, seq.wrapping_add(offset), flags, i == 0, i + 1 == n);
        fix_tcp(t, pseudo);
        out.push(s);
    }
    true
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::packet::checksum::{fold, sum16};
    use crate::packet::fixtures::{seg, tcp_checksum_ok, udp_checksum_ok, TCP_ACK, TCP_CWR, TCP_FIN, TCP_PSH};

    /// Found by the tun_read fuzz target: a TSO or USO packet with headers and no payload was
    /// taken (true) and made no segment, a packet lost without a count.
    #[test]
    fn a_large_packet_without_payload_is_malformed() {
        let mut out = Vec::new();
        let tso = Offload {
            segmentation: Segmentation::Tcp4,
            header_len: 40,
            segment_size: 500,
            checksum: Some(PartialChecksum { start: 20, offset: 16 }),
        };
        assert!(!segment(tso, &seg(1, &[], TCP_ACK), &mut out));
        let mut udp = crate::packet::fixtures::dgram(false, 1, 6000, &[]);
        let uso = Offload {
            segmentation: Segmentation::Udp,
            header_len: 28,
            segment_size: 500,
            checksum: Some(PartialChecksum { start: 20, offset: 6 }),
        };
        assert!(!segment(uso, &udp, &mut out));
        assert!(out.is_empty());
        udp = crate::packet::fixtures::dgram(false, 1, 6000, &[1]);
        assert!(segment(uso, &udp, &mut out));
        assert_eq!(out.len(), 1);
    }

    #[test]
    fn tso_packets_split_into_valid_segments() {
        let payload: Vec<u8> = (0..3500u32).map(|i| (i * 7) as u8).collect();
        let big = seg(5000, &payload, TCP_ACK | TCP_PSH | TCP_FIN | TCP_CWR);
        let h = Offload {
            segmentation: Segmentation::Tcp4,
            header_len: 40,
            segment_size: 1448,
            checksum: Some(PartialChecksum { start: 20, offset: 16 }),
        };
        let mut out = Vec::new();
        assert!(segment_tso(h, &big, &mut out));
        assert_eq!(out.len(), 3);
        let mut joined = Vec::new();
        for (i, s) in out.iter().enumerate() {
            let p = s.packet();
            assert_eq!(u16::from_be_bytes([p[2], p[3]]) as usize, p.len());
            assert_eq!(fold(sum16(0, &p[..20])), 0xffff, "IP checksum of segment {i}");
            assert!(tcp_checksum_ok(p, 20), "TCP checksum of segment {i}");
            assert_eq!(
                u32::from_be_bytes(p[24..28].try_into().unwrap()),
                5000 + 1448 * i as u32
            );
            let last = i == 2;
            assert_eq!(
                p[33] & (TCP_PSH | TCP_FIN),
                if last { TCP_PSH | TCP_FIN } else { 0 },
                "PSH and FIN on the last segment only"
            );
            assert_eq!(p[33] & TCP_CWR != 0, i == 0, "CWR on the first segment only");
            assert_ne!(p[33] & TCP_ACK, 0, "ACK on every segment");
            joined.extend_from_slice(&p[40..]);
        }
        assert_eq!(joined, payload);
    }

    #[test]
    fn tso_over_ipv6() {
        // Turn an IPv4 segment into IPv6 by hand: 40-byte header, next header TCP.
        let v4 = seg(1, &[5u8; 3000], TCP_ACK);
        let mut p = vec![0u8; 40];
        p[0] = 0x60;
        p[6] = 6;
        p[7] = 64;
        p[23] = 1;
        p[39] = 2;
        p.extend_from_slice(&v4[20..]);
        let len = (p.len() - 40) as u16;
        p[4..6].copy_from_slice(&len.to_be_bytes());
        let h = Offload {
            segmentation: Segmentation::Tcp6,
            header_len: 60,
            segment_size: 1400,
            checksum: Some(PartialChecksum { start: 40, offset: 16 }),
        };
        let mut out = Vec::new();
        assert!(segment_tso(h, &p, &mut out));
        assert_eq!(
            out.iter().map(|s| s.packet().len() - 60).collect::<Vec<_>>(),
            vec![1400, 1400, 200]
        );
        for s in out.iter().map(PacketBuf::packet) {
            assert_eq!(u16::from_be_bytes([s[4], s[5]]) as usize, s.len() - 40);
            assert!(tcp_checksum_ok(s, 40));
        }
        let wrong = Offload {
            segmentation: Segmentation::Tcp4,
            ..h
        };
        assert!(
            !segment_tso(wrong, &p, &mut out),
            "a header that lies about the family is refused"
        );
    }

    #[test]
    fn uso_datagrams_split_into_valid_ones() {
        for v6 in [false, true] {
            let ip_len = if v6 { 40 } else { 20 };
            let payload: Vec<u8> = (0..3000u32).map(|i| (i * 7) as u8).collect();
            let mut p = vec![0u8; ip_len + 8];
            if v6 {
                p[0] = 0x60;
                p[6] = 17;
                p[8..24].copy_from_slice(&[0xfd, 0x99, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 1]);
                p[24..40].copy_from_slice(&[0xfd, 0x99, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 2]);
            } else {
                p[0] = 0x45;
                p[9] = 17;
                p[12..20].copy_from_slice(&[10, 0, 0, 1, 10, 0, 0, 2]);
            }
            p[ip_len..ip_len + 4].copy_from_slice(&[0x13, 0x88, 0x13, 0x89]);
            p.extend_from_slice(&payload);
            let h = Offload {
                segmentation: Segmentation::Udp,
                header_len: (ip_len + 8) as u16,
                segment_size: 1200,
                checksum: Some(PartialChecksum {
                    start: ip_len as u16,
                    offset: 6,
                }),
            };
            let mut out = Vec::new();
            assert!(segment(h, &p, &mut out));
            assert_eq!(out.len(), 3, "1200 + 1200 + 600");
            let mut joined = Vec::new();
            for (i, s) in out.iter().enumerate() {
                let q = s.packet();
                let want = if i < 2 { 1200 } else { 600 };
                assert_eq!(q.len(), ip_len + 8 + want);
                assert_eq!(u16::from_be_bytes([q[ip_len + 4], q[ip_len + 5]]) as usize, 8 + want);
                if !v6 {
                    assert_eq!(fold(sum16(0, &q[..20])), 0xffff, "IPv4 header checksum");
                    assert_eq!(u16::from_be_bytes([q[2], q[3]]) as usize, q.len());
                }
                assert!(udp_checksum_ok(q, ip_len, v6), "UDP checksum of datagram {i}");
                joined.extend_from_slice(&q[ip_len + 8..]);
            }
            assert_eq!(joined, payload);
            // A TCP packet labelled as UDP is refused.
            let mut bad = p.clone();
            bad[if v6 { 6 } else { 9 }] = 6;
            assert!(!segment(h, &bad, &mut Vec::new()));
        }
    }
}
