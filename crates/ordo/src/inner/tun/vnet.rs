//! The virtio-net header that precedes every packet on a TUN device opened with IFF_VNET_HDR
//! (struct virtio_net_hdr in linux/virtio_net.h), and its translation to and from the
//! backend-neutral [`Offload`] that the packet helpers speak.

use crate::packet::{checksum, segment, Offload, PartialChecksum, Segmentation};
use crate::port::PacketBuf;

/// struct virtio_net_hdr: flags, gso_type, hdr_len, gso_size, csum_start, csum_offset.
pub const VNET_HDR_LEN: usize = 10;
const F_NEEDS_CSUM: u8 = 1;
const GSO_NONE: u8 = 0;
const GSO_TCPV4: u8 = 1;
const GSO_TCPV6: u8 = 4;
/// UDP segmentation (USO): one large datagram to cut into `gso_size` payloads.
const GSO_UDP_L4: u8 = 5;
/// Set beside a TCP type when the packet carries ECN's CWR: not a type of its own.
const GSO_ECN: u8 = 0x80;

#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct VnetHdr {
    pub flags: u8,
    pub gso_type: u8,
    pub hdr_len: u16,
    pub gso_size: u16,
    pub csum_start: u16,
    pub csum_offset: u16,
}

/// The header for a packet written as it is.
pub const PLAIN: VnetHdr = VnetHdr {
    flags: 0,
    gso_type: GSO_NONE,
    hdr_len: 0,
    gso_size: 0,
    csum_start: 0,
    csum_offset: 0,
};

impl VnetHdr {
    pub fn parse(b: &[u8]) -> VnetHdr {
        let u = |i: usize| u16::from_le_bytes([b[i], b[i + 1]]);
        VnetHdr {
            flags: b[0],
            gso_type: b[1],
            hdr_len: u(2),
            gso_size: u(4),
            csum_start: u(6),
            csum_offset: u(8),
        }
    }

    pub fn write(&self, b: &mut [u8]) {
        b[0] = self.flags;
        b[1] = self.gso_type;
        b[2..4].copy_from_slice(&self.hdr_len.to_le_bytes());
        b[4..6].copy_from_slice(&self.gso_size.to_le_bytes());
        b[6..8].copy_from_slice(&self.csum_start.to_le_bytes());
        b[8..10].copy_from_slice(&self.csum_offset.to_le_bytes());
    }

    /// What the header asks of the packet behind it; None for a segmentation type this
    /// device was never offered (the packet is dropped).
    pub fn offload(&self) -> Option<Offload> {
        let segmentation = match self.gso_type & !GSO_ECN {
            GSO_NONE => Segmentation::None,
            GSO_TCPV4 => Segmentation::Tcp4,
            GSO_TCPV6 => Segmentation::Tcp6,
            GSO_UDP_L4 => Segmentation::Udp,
            _ => return None,
        };
        Some(Offload {
            segmentation,
            header_len: self.hdr_len,
            segment_size: self.gso_size,
            checksum: (self.flags & F_NEEDS_CSUM != 0).then_some(PartialChecksum {
                start: self.csum_start,
                offset: self.csum_offset,
            }),
        })
    }

    /// The header that hands a packet with this offload to the kernel.
    pub fn of(o: &Offload) -> VnetHdr {
        let gso_type = match o.segmentation {
            Segmentation::None => GSO_NONE,
            Segmentation::Tcp4 => GSO_TCPV4,
            Segmentation::Tcp6 => GSO_TCPV6,
            Segmentation::Udp => GSO_UDP_L4,
        };
        let csum = o.checksum.unwrap_or(PartialChecksum { start: 0, offset: 0 });
        VnetHdr {
            flags: if o.checksum.is_some() { F_NEEDS_CSUM } else { 0 },
            gso_type,
            hdr_len: o.header_len,
            gso_size: o.segment_size,
            csum_start: csum.start,
            csum_offset: csum.offset,
        }
    }
}

/// What one read from a device with virtio-net headers held.
#[derive(Debug, PartialEq, Eq)]
pub enum Unpacked<'a> {
    /// One wire-sized packet, its checksum completed if the kernel left it partial.
    Packet(&'a [u8]),
    /// A TSO or USO packet, split into this many packets appended to the output.
    Segmented(usize),
    /// A header or packet that does not hold together, or an offload never offered: dropped.
    Malformed,
}

/// Unpacks one read (`frame`: the virtio-net header, then the packet): a TSO or USO packet is
/// split into `out`; a partial checksum is completed in place. The kernel is the only
/// writer, but what it hands over is checked all the same.
pub fn unpack<'a>(frame: &'a mut [u8], out: &mut Vec<PacketBuf>) -> Unpacked<'a> {
    if frame.len() < VNET_HDR_LEN {
        return Unpacked::Malformed;
    }
    let Some(offload) = VnetHdr::parse(&frame[..VNET_HDR_LEN]).offload() else {
        return Unpacked::Malformed;
    };
    let packet = &mut frame[VNET_HDR_LEN..];
    if offload.segmentation != Segmentation::None {
        let before = out.len();
        return match segment::segment(offload, packet, out) {
            true => Unpacked::Segmented(out.len() - before),
            false => Unpacked::Malformed,
        };
    }
    if offload.checksum.is_some_and(|c| !checksum::complete(c, packet)) {
        return Unpacked::Malformed;
    }
    Unpacked::Packet(packet)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::packet::coalesce::coalesced_header;
    use crate::packet::fixtures::{seg, TCP_ACK};

    /// What the kernel's tun driver writes for a TSO packet, byte for byte (little-endian
    /// fields), becomes the offload the segmentation expects, and back.
    #[test]
    fn headers_translate_both_ways() {
        let wire = [1u8, GSO_TCPV4 | GSO_ECN, 40, 0, 0xa8, 0x05, 20, 0, 16, 0];
        let h = VnetHdr::parse(&wire);
        let o = h.offload().unwrap();
        assert_eq!(
            o,
            Offload {
                segmentation: Segmentation::Tcp4,
                header_len: 40,
                segment_size: 1448,
                checksum: Some(PartialChecksum { start: 20, offset: 16 }),
            }
        );
        let mut back = [0u8; VNET_HDR_LEN];
        VnetHdr::of(&o).write(&mut back);
        assert_eq!(back[1], GSO_TCPV4, "ECN's bit is the kernel's to set");
        assert_eq!((back[0], &back[2..]), (wire[0], &wire[2..]));
        assert_eq!(PLAIN.offload(), Some(Offload::default()));
        let unknown = VnetHdr { gso_type: 3, ..PLAIN }; // UFO, never offered
        assert_eq!(unknown.offload(), None);
    }

    #[test]
    fn a_coalesced_tcp_run_gets_the_header_gro_would_give() {
        let pkts = [seg(1000, &[1; 100], TCP_ACK), seg(1100, &[2; 100], TCP_ACK)];
        let refs: Vec<&[u8]> = pkts.iter().map(Vec::as_slice).collect();
        let h = VnetHdr::of(&coalesced_header(&refs).offload);
        assert_eq!(
            h,
            VnetHdr {
                flags: F_NEEDS_CSUM,
                gso_type: GSO_TCPV4,
                hdr_len: 40,
                gso_size: 100,
                csum_start: 20,
                csum_offset: 16
            }
        );
    }

    /// Each kind of read unpacks to what it is; whatever does not hold together is Malformed,
    /// never a panic or a packet.
    #[test]
    fn reads_unpack_to_a_packet_segments_or_malformed() {
        let frame = |h: VnetHdr, p: &[u8]| {
            let mut f = vec![0u8; VNET_HDR_LEN];
            h.write(&mut f);
            f.extend_from_slice(p);
            f
        };
        let mut out = Vec::new();
        let one = seg(1000, &[7; 100], TCP_ACK);
        assert_eq!(unpack(&mut frame(PLAIN, &one), &mut out), Unpacked::Packet(&one[..]));
        assert_eq!(unpack(&mut [0u8; VNET_HDR_LEN - 1], &mut out), Unpacked::Malformed);
        let ufo = VnetHdr { gso_type: 3, ..PLAIN };
        assert_eq!(unpack(&mut frame(ufo, &one), &mut out), Unpacked::Malformed);
        // A partial checksum whose field lies past the packet's end.
        let past = VnetHdr {
            flags: F_NEEDS_CSUM,
            csum_start: 130,
            csum_offset: 16,
            ..PLAIN
        };
        assert_eq!(unpack(&mut frame(past, &one), &mut out), Unpacked::Malformed);
        assert!(out.is_empty());
        // A TSO packet of three segments' payload.
        let big = seg(1000, &[9; 300], TCP_ACK);
        let tso = VnetHdr {
            flags: F_NEEDS_CSUM,
            gso_type: GSO_TCPV4,
            hdr_len: 40,
            gso_size: 100,
            csum_start: 20,
            csum_offset: 16,
        };
        assert_eq!(unpack(&mut frame(tso, &big), &mut out), Unpacked::Segmented(3));
        assert_eq!(out.len(), 3);
        assert!(out
            .iter()
            .all(|p| p.packet().len() == 40 + 100 && p.packet()[40..] == [9; 100]));
        // Its header naming the other IP version.
        let lying = VnetHdr {
            gso_type: GSO_TCPV6,
            ..tso
        };
        assert_eq!(unpack(&mut frame(lying, &big), &mut out), Unpacked::Malformed);
        assert_eq!(out.len(), 3);
    }
}
