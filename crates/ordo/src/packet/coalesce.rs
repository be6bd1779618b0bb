//! Coalescing on the way to the host (generic receive offload done in user space):
//! consecutive segments of one TCP flow, or consecutive datagrams of one UDP flow, become one
//! large packet that the kernel takes in a single write, as it would from a NIC doing GRO.

use super::checksum::fold;
use super::ip::{fix_ip, ip_of, ip_same, tcp_of, udp_of, Ip, Tcp, TCP_CHECKSUM_AT, UDP_CHECKSUM_AT, UDP_HEADER_LEN};
use super::{Offload, PartialChecksum, Segmentation};
use smoltcp::wire::{IpProtocol, TcpPacket, UdpPacket};

/// Largest packet the kernel takes in one write.
const MAX_COALESCED: usize = 65535;
/// Most datagrams merged into one UDP packet: UDP_MAX_SEGMENTS of the kernels that brought USO
/// to TUN (later ones allow more), so every kernel that takes the packet can split it.
const UDP_MAX_SEGMENTS: usize = 64;

/// Whether `next` continues `first`'s flow right after `prev`: same addresses, ports, ack,
/// window, options and IP fields that GRO requires equal; the next sequence number; plain
/// ACK (PSH allowed, it ends the packet).
fn continues(first: &[u8], ft: &Tcp, prev: &Tcp, next: &[u8], nt: &Tcp) -> bool {
    if nt.v6 != ft.v6 || nt.hdr_len != ft.hdr_len || nt.payload == 0 || !nt.flags.plain_ack() {
        return false;
    }
    if nt.seq != prev.seq.wrapping_add(prev.payload as u32) {
        return false;
    }
    // Ports, ack number, window and options. Not sequence number, flags or checksum.
    let a = TcpPacket::new_unchecked(&first[ft.ip_len..ft.hdr_len]);
    let b = TcpPacket::new_unchecked(&next[nt.ip_len..nt.hdr_len]);
    ip_same(first, next, ft.v6)
        && a.src_port() == b.src_port()
        && a.dst_port() == b.dst_port()
        && a.ack_number() == b.ack_number()
        && a.window_len() == b.window_len()
        && a.options() == b.options()
}

/// How the packets of a delivery run are written: as they are, or several merged into one.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Write {
    Single(usize),
    /// Packets `start..end`, all of one flow, merged.
    Coalesced(usize, usize),
}

/// Plans the writes for `packets`, in order. Runs of TCP segments are merged always, runs of
/// UDP datagrams only if `udp` (the device takes USO: Linux 6.2).
pub fn plan(packets: &[&[u8]], udp: bool) -> Vec<Write> {
    let mut out = Vec::new();
    let mut i = 0;
    while i < packets.len() {
        let j = tcp_run(packets, i)
            .or_else(|| if udp { udp_run(packets, i) } else { None })
            .unwrap_or(i + 1);
        out.push(if j - i > 1 {
            Write::Coalesced(i, j)
        } else {
            Write::Single(i)
        });
        i = j;
    }
    out
}

/// The end of the run of TCP segments that starts at `i` (`i + 1` for a segment that merges
/// with nothing after it), or None if `packets[i]` is no segment to merge.
fn tcp_run(packets: &[&[u8]], i: usize) -> Option<usize> {
    let ft = tcp_of(packets[i]).filter(|t| t.payload > 0 && t.flags.plain_ack())?;
    let (mut j, mut prev, mut total) = (i + 1, ft, packets[i].len());
    while j < packets.len() && !prev.flags.psh && prev.payload == ft.payload {
        let Some(nt) = tcp_of(packets[j]) else { break };
        if nt.payload > ft.payload
            || total + nt.payload > MAX_COALESCED
            || !continues(packets[i], &ft, &prev, packets[j], &nt)
        {
            break;
        }
        total += nt.payload;
        prev = nt;
        j += 1;
    }
    Some(j)
}

/// The end of the run of UDP datagrams that starts at `i`, as the kernel's UDP GRO builds
/// them: one flow (addresses, ports, the IP fields of [`ip_same`]), every payload the size of
/// the first but the last, which may be shorter and ends the run. None if `packets[i]` is no
/// datagram to merge.
fn udp_run(packets: &[&[u8]], i: usize) -> Option<usize> {
    let fu = udp_of(packets[i]).filter(|u| u.payload > 0)?;
    let (mut j, mut last, mut total) = (i + 1, fu.payload, packets[i].len());
    while j < packets.len() && last == fu.payload && j - i < UDP_MAX_SEGMENTS {
        let Some(nu) = udp_of(packets[j]) else { break };
        let (first, next) = (packets[i], packets[j]);
        if nu.v6 != fu.v6
            || nu.payload == 0
            || nu.payload > fu.payload
            || total + nu.payload > MAX_COALESCED
            || !ip_same(first, next, fu.v6)
            || !same_ports(&first[fu.ip_len..], &next[nu.ip_len..])
        {
            break;
        }
        total += nu.payload;
        last = nu.payload;
        j += 1;
    }
    Some(j)
}

/// Whether two UDP datagrams (from their UDP header on) are of one pair of ports.
fn same_ports(a: &[u8], b: &[u8]) -> bool {
    let (a, b) = (UdpPacket::new_unchecked(a), UdpPacket::new_unchecked(b));
    a.src_port() == b.src_port() && a.dst_port() == b.dst_port()
}

/// Builds one packet from a run [`plan`] made, as the kernel's GRO would: the first segment's
/// headers, every payload, the lengths fixed (TCP: PSH from the last), and a partial checksum
/// the kernel finishes or trusts. The tests' whole-packet view of [`coalesced_header`].
#[cfg(test)]
pub fn coalesce(segments: &[&[u8]]) -> (Offload, Vec<u8>) {
    let Coalesced { offload, mut head } = coalesced_header(segments);
    for s in segments {
        head.extend_from_slice(&s[offload.header_len as usize..]);
    }
    (offload, head)
}

/// The head of a coalesced packet: the first segment's IP and transport headers fixed for the
/// whole, and what the host must know to split it again.
pub struct Coalesced {
    pub offload: Offload,
    /// IP and TCP or UDP headers (`offload.header_len` bytes).
    pub head: Vec<u8>,
}

/// The head of a coalesced packet (a run [`plan`] made). Written with the segments' payloads
/// behind it (each from `header_len` on) in one vectored write, the payloads are never copied
/// in user space. The transport checksum is left partial (CHECKSUM_PARTIAL: the field holds
/// the pseudo-header sum, not inverted), which the kernel completes per segment where it
/// splits the packet and otherwise trusts, as it trusts kernel WireGuard's decrypted packets.
pub fn coalesced_header(segments: &[&[u8]]) -> Coalesced {
    let first = segments[0];
    let Ip {
        v6,
        header_len: ip_len,
        protocol: proto,
    } = ip_of(first).expect("planned");
    let (hdr_len, gso_size, csum_offset) = match tcp_of(first) {
        Some(t) => (t.hdr_len, t.payload, TCP_CHECKSUM_AT),
        None => {
            let u = udp_of(first).expect("planned as TCP or UDP");
            (u.ip_len + UDP_HEADER_LEN, u.payload, UDP_CHECKSUM_AT)
        }
    };
    let total = hdr_len + segments.iter().map(|s| s.len() - hdr_len).sum::<usize>();
    // Room for the headers only: the payloads go out from where they lie.
    let mut head = first[..hdr_len].to_vec();
    let pseudo = fix_ip(&mut head, v6, ip_len, total, None, proto);
    // The checksum field holds the pseudo-header sum, not inverted: CHECKSUM_PARTIAL.
    let l4 = &mut head[ip_len..];
    if proto == IpProtocol::Tcp {
        let last = tcp_of(segments[segments.len() - 1]).expect("planned as TCP");
        let mut t = TcpPacket::new_unchecked(l4);
        t.set_psh(t.psh() || last.flags.psh);
        t.set_checksum(fold(pseudo));
    } else {
        let mut u = UdpPacket::new_unchecked(l4);
        u.set_len((total - ip_len) as u16);
        u.set_checksum(fold(pseudo));
    }
    let segmentation = match (proto, v6) {
        (IpProtocol::Tcp, false) => Segmentation::Tcp4,
        (IpProtocol::Tcp, true) => Segmentation::Tcp6,
        _ => Segmentation::Udp,
    };
    Coalesced {
        offload: Offload {
            segmentation,
            header_len: hdr_len as u16,
            segment_size: gso_size as u16,
            checksum: Some(PartialChecksum {
                start: ip_len as u16,
                offset: csum_offset as u16,
            }),
        },
        head,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::packet::checksum::{complete, sum16};
    use crate::packet::fixtures::{dgram, refs, seg, udp_checksum_ok, TCP_ACK, TCP_PSH};
    use crate::packet::segment::segment;

    #[test]
    fn consecutive_segments_merge_and_others_do_not() {
        let a = seg(1000, &[1; 100], TCP_ACK);
        let b = seg(1100, &[2; 100], TCP_ACK);
        let c = seg(1200, &[3; 60], TCP_ACK | TCP_PSH);
        let d = seg(1260, &[4; 100], TCP_ACK); // after the PSH: a new packet
        let gap = seg(5000, &[5; 100], TCP_ACK);
        let syn = seg(1, &[], 0x02);
        let pkts = vec![a, b, c, d, gap, syn];
        assert_eq!(
            plan(&refs(&pkts), true),
            vec![
                Write::Coalesced(0, 3),
                Write::Single(3),
                Write::Single(4),
                Write::Single(5)
            ]
        );
    }

    #[test]
    fn coalesced_packet_is_what_gro_would_build() {
        let pkts = vec![
            seg(1000, &[1; 100], TCP_ACK),
            seg(1100, &[2; 100], TCP_ACK),
            seg(1200, &[3; 60], TCP_ACK | TCP_PSH),
        ];
        let (h, out) = coalesce(&refs(&pkts));
        assert_eq!(
            h,
            Offload {
                segmentation: Segmentation::Tcp4,
                header_len: 40,
                segment_size: 100,
                checksum: Some(PartialChecksum { start: 20, offset: 16 }),
            }
        );
        let p = &out[..];
        assert_eq!(p.len(), 40 + 260);
        assert_eq!(u16::from_be_bytes([p[2], p[3]]), 300);
        assert_eq!(fold(sum16(0, &p[..20])), 0xffff, "IP header checksum is valid");
        assert_eq!(&p[40..140], &[1; 100][..]);
        assert_eq!(&p[240..300], &[3; 60][..], "payloads in order");
        assert_eq!(p[33] & TCP_PSH, TCP_PSH);
        // Finishing the partial checksum gives the TCP checksum of the whole segment.
        let mut full = p.to_vec();
        assert!(complete(h.checksum.unwrap(), &mut full));
        let tcp_len = 280u16;
        let mut pseudo = sum16(0, &full[12..20]);
        pseudo = sum16(pseudo, &[0, 6]);
        pseudo = sum16(pseudo, &tcp_len.to_be_bytes());
        assert_eq!(fold(sum16(pseudo, &full[20..])), 0xffff, "TCP checksum verifies");
    }

    #[test]
    fn different_flows_and_ack_numbers_stay_apart() {
        let a = seg(1000, &[1; 100], TCP_ACK);
        let mut b = seg(1100, &[2; 100], TCP_ACK);
        b[22..24].copy_from_slice(&40001u16.to_be_bytes()); // another port
        let mut c = seg(1100, &[2; 100], TCP_ACK);
        c[28..32].copy_from_slice(&8u32.to_be_bytes()); // another ack
        assert_eq!(
            plan(&refs(&[a.clone(), b]), true),
            vec![Write::Single(0), Write::Single(1)]
        );
        assert_eq!(plan(&refs(&[a, c]), true), vec![Write::Single(0), Write::Single(1)]);
    }

    #[test]
    fn size_limit_splits_long_runs() {
        let pkts: Vec<Vec<u8>> = (0..100u32).map(|i| seg(i * 1000, &[0; 1000], TCP_ACK)).collect();
        let p = plan(&refs(&pkts), true);
        assert_eq!(p[0], Write::Coalesced(0, 65), "40 + 65 x 1000 bytes fits in 65535");
        assert_eq!(p[1], Write::Coalesced(65, 100));
    }

    #[test]
    fn udp_runs_follow_the_kernels_gro_rules() {
        let d = |id: u16, port: u16, len: usize| dgram(false, id, port, &vec![id as u8; len]);
        // Equal sizes merge; a shorter one ends the run; a larger one after it starts anew.
        let pkts = vec![
            d(1, 6000, 100),
            d(2, 6000, 100),
            d(3, 6000, 40),
            d(4, 6000, 100),
            d(5, 6000, 100),
        ];
        assert_eq!(
            plan(&refs(&pkts), true),
            vec![Write::Coalesced(0, 3), Write::Coalesced(3, 5)]
        );
        assert_eq!(
            plan(&refs(&pkts), false),
            (0..5).map(Write::Single).collect::<Vec<_>>(),
            "without USO on the device, UDP is written as it came"
        );
        // Another port, a larger datagram, an empty one: each apart.
        let pkts = vec![
            d(1, 6000, 100),
            d(2, 6001, 100),
            d(3, 6001, 200),
            d(4, 6001, 0),
            d(5, 6001, 0),
        ];
        assert_eq!(plan(&refs(&pkts), true), (0..5).map(Write::Single).collect::<Vec<_>>());
        // Another TTL, and a fragment (MF set): apart.
        let mut ttl = d(2, 6000, 100);
        ttl[8] = 63;
        let mut frag = d(2, 6000, 100);
        frag[6] |= 0x20;
        assert_eq!(
            plan(&refs(&[d(1, 6000, 100), ttl]), true),
            vec![Write::Single(0), Write::Single(1)]
        );
        assert_eq!(
            plan(&refs(&[d(1, 6000, 100), frag]), true),
            vec![Write::Single(0), Write::Single(1)]
        );
        // A length field that lies: apart.
        let mut lie = d(2, 6000, 100);
        lie[25] ^= 1;
        assert_eq!(
            plan(&refs(&[d(1, 6000, 100), lie]), true),
            vec![Write::Single(0), Write::Single(1)]
        );
        // At most UDP_MAX_SEGMENTS datagrams, and at most 65,535 bytes, per write.
        let many: Vec<Vec<u8>> = (0..100).map(|i| d(i, 6000, 10)).collect();
        assert_eq!(
            plan(&refs(&many), true),
            vec![Write::Coalesced(0, 64), Write::Coalesced(64, 100)]
        );
        let big: Vec<Vec<u8>> = (0..50).map(|i| d(i, 6000, 1400)).collect();
        assert_eq!(
            plan(&refs(&big), true),
            vec![Write::Coalesced(0, 46), Write::Coalesced(46, 50)]
        );
        // TCP and UDP side by side each keep to their own runs.
        let tcp = seg(1000, &[1; 100], TCP_ACK);
        let mixed = vec![d(1, 6000, 100), d(2, 6000, 100), tcp, d(3, 6000, 100)];
        assert_eq!(
            plan(&refs(&mixed), true),
            vec![Write::Coalesced(0, 2), Write::Single(2), Write::Single(3)]
        );
    }

    #[test]
    fn coalesced_udp_splits_back_into_the_datagrams_it_was_made_of() {
        for v6 in [false, true] {
            let ip_len = if v6 { 40 } else { 20 };
            let pkts: Vec<Vec<u8>> = (0..5u16)
                .map(|i| {
                    let len = if i == 4 { 333 } else { 1000 };
                    let payload: Vec<u8> = (0..len).map(|k| (k as u16 * 3 + i) as u8).collect();
                    dgram(v6, 7 + i, 6000, &payload)
                })
                .collect();
            assert_eq!(plan(&refs(&pkts), true), vec![Write::Coalesced(0, 5)]);
            let (h, out) = coalesce(&refs(&pkts));
            assert_eq!(
                h,
                Offload {
                    segmentation: Segmentation::Udp,
                    header_len: (ip_len + 8) as u16,
                    segment_size: 1000,
                    checksum: Some(PartialChecksum {
                        start: ip_len as u16,
                        offset: 6
                    }),
                }
            );
            let p = &out[..];
            assert_eq!(p.len(), ip_len + 8 + 4333);
            assert_eq!(
                u16::from_be_bytes([p[ip_len + 4], p[ip_len + 5]]) as usize,
                8 + 4333,
                "UDP length of the whole"
            );
            if !v6 {
                assert_eq!(fold(sum16(0, &p[..20])), 0xffff, "IPv4 header checksum");
            }
            // The partial checksum completes to the checksum of the whole datagram...
            let mut whole = p.to_vec();
            assert!(complete(h.checksum.unwrap(), &mut whole));
            assert!(udp_checksum_ok(&whole, ip_len, v6), "checksum of the whole");
            // ...and the kernel's split (segment_uso does what it does) gives back every
            // datagram byte for byte: headers, IDs, lengths, checksums, payloads.
            let mut back = Vec::new();
            assert!(segment(h, p, &mut back));
            assert_eq!(back.iter().map(|b| b.packet()).collect::<Vec<_>>(), pkts);
        }
    }
}
