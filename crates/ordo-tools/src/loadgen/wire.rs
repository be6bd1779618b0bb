//! What the load generator's clients and its target say to each other inside the tunnel:
//! IPv4/UDP packets whose payload starts with a small header (who sent it, its sequence
//! number, when it was sent), padded to the packet size asked for.

use smoltcp::wire::{IpProtocol, Ipv4Packet, UdpPacket};
use std::net::Ipv4Addr;

/// "ORDL": marks a payload as ours, so stray datagrams are ignored rather than misread.
pub const MAGIC: u32 = 0x4f52_444c;
pub const IP_HEADER: usize = 20;
pub const UDP_HEADER: usize = 8;
pub const PAYLOAD_HEADER: usize = 32;
/// The smallest packet the generator makes: headers plus our payload header.
pub const MIN_PACKET: usize = IP_HEADER + UDP_HEADER + PAYLOAD_HEADER;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    /// Traffic to be counted (upload to the target, or download to a client).
    Data = 1,
    /// A client announces itself and what download it wants (`rate` packets/s of `size`).
    Hello = 2,
    /// A round trip: the target echoes a request back as a response.
    Request = 3,
    Response = 4,
}

impl Kind {
    fn from_u8(b: u8) -> Option<Kind> {
        Some(match b {
            1 => Kind::Data,
            2 => Kind::Hello,
            3 => Kind::Request,
            4 => Kind::Response,
            _ => return None,
        })
    }
}

/// Our payload header: magic, kind, client, seq, sent time, and for a hello the download
/// rate and packet size.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Header {
    pub kind: Kind,
    pub client: u32,
    pub seq: u64,
    /// CLOCK_MONOTONIC at sending, in ns (both ends run on one machine: comparable).
    pub sent_ns: u64,
    /// Hello only: packets per second wanted back, and their size (0: no download).
    pub rate: u32,
    pub size: u16,
}

impl Header {
    pub fn write(&self, b: &mut [u8]) {
        b[0..4].copy_from_slice(&MAGIC.to_be_bytes());
        b[4] = self.kind as u8;
        b[5] = 0;
        b[6..8].copy_from_slice(&self.size.to_be_bytes());
        b[8..12].copy_from_slice(&self.client.to_be_bytes());
        b[12..20].copy_from_slice(&self.seq.to_be_bytes());
        b[20..28].copy_from_slice(&self.sent_ns.to_be_bytes());
        b[28..32].copy_from_slice(&self.rate.to_be_bytes());
    }

    pub fn parse(b: &[u8]) -> Option<Header> {
        if b.len() < PAYLOAD_HEADER || u32::from_be_bytes(b[0..4].try_into().ok()?) != MAGIC {
            return None;
        }
        let u64_at = |i: usize| u64::from_be_bytes(b[i..i + 8].try_into().expect("8 bytes"));
        Some(Header {
            kind: Kind::from_u8(b[4])?,
            size: u16::from_be_bytes([b[6], b[7]]),
            client: u32::from_be_bytes(b[8..12].try_into().ok()?),
            seq: u64_at(12),
            sent_ns: u64_at(20),
            rate: u32::from_be_bytes(b[28..32].try_into().ok()?),
        })
    }
}

/// CLOCK_MONOTONIC in ns.
pub fn now_ns() -> u64 {
    let mut ts = libc::timespec { tv_sec: 0, tv_nsec: 0 };
    // SAFETY: a valid timespec to fill.
    unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut ts) };
    ts.tv_sec as u64 * 1_000_000_000 + ts.tv_nsec as u64
}

/// A UDP endpoint inside the tunnel.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Flow {
    pub src: Ipv4Addr,
    pub sport: u16,
    pub dst: Ipv4Addr,
    pub dport: u16,
}

/// Writes an IPv4/UDP packet of `len` bytes (`len` at least [`MIN_PACKET`], at most 65,535)
/// carrying `header` into `b`; the rest of the payload is zero. The UDP checksum is left
/// zero, which IPv4 allows ("no checksum"): the tunnel's AEAD protects the packet already.
pub fn build(b: &mut [u8], len: usize, flow: Flow, header: &Header) {
    let b = &mut b[..len];
    b.fill(0);
    let mut ip = Ipv4Packet::new_unchecked(&mut *b);
    ip.set_version(4);
    ip.set_header_len(IP_HEADER as u8);
    ip.set_total_len(len as u16);
    ip.set_dont_frag(true);
    ip.set_hop_limit(64);
    ip.set_next_header(IpProtocol::Udp);
    ip.set_src_addr(flow.src);
    ip.set_dst_addr(flow.dst);
    ip.fill_checksum();
    let mut udp = UdpPacket::new_unchecked(ip.payload_mut());
    udp.set_src_port(flow.sport);
    udp.set_dst_port(flow.dport);
    udp.set_len((len - IP_HEADER) as u16);
    header.write(udp.payload_mut());
}

/// The length a packet [`build`] wrote says it has.
pub fn built_len(p: &[u8]) -> usize {
    usize::from(Ipv4Packet::new_unchecked(p).total_len())
}

/// The flow and our header of an IPv4/UDP packet of ours (no IP options).
pub fn parse(p: &[u8]) -> Option<(Flow, Header)> {
    let ip = Ipv4Packet::new_checked(p).ok()?;
    if usize::from(ip.header_len()) != IP_HEADER || ip.next_header() != IpProtocol::Udp {
        return None;
    }
    let udp = UdpPacket::new_checked(ip.payload()).ok()?;
    let flow = Flow {
        src: ip.src_addr(),
        sport: udp.src_port(),
        dst: ip.dst_addr(),
        dport: udp.dst_port(),
    };
    Some((flow, Header::parse(udp.payload())?))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn packets_round_trip() {
        let flow = Flow {
            src: Ipv4Addr::new(10, 200, 1, 2),
            sport: 40000,
            dst: Ipv4Addr::new(10, 200, 0, 1),
            dport: 9000,
        };
        let h = Header {
            kind: Kind::Hello,
            client: 77,
            seq: 1 << 40,
            sent_ns: 123_456_789,
            rate: 1000,
            size: 1400,
        };
        let mut b = vec![0xaa; 200];
        build(&mut b, 100, flow, &h);
        assert_eq!(parse(&b[..100]), Some((flow, h)));
        assert!(
            Ipv4Packet::new_checked(&b[..100]).unwrap().verify_checksum(),
            "a valid header checksum"
        );
        assert!(parse(&b[..MIN_PACKET - 1]).is_none());
        b[IP_HEADER + UDP_HEADER] ^= 1;
        assert!(parse(&b[..100]).is_none(), "not our magic");
    }
}
