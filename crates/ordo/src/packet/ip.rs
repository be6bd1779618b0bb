//! The IP, TCP and UDP fields that segmentation and coalescing read and rewrite, read and
//! written through smoltcp's typed header views (`smoltcp::wire`), the one header vocabulary
//! of the workspace: the protocol core's routing, the AF_XDP frames and the load generator
//! use the same views. Checksums stay this crate's own ([`super::checksum`]: vectorised).

use super::checksum::{fold, sum16};
use smoltcp::wire::{IpProtocol, Ipv4Packet, Ipv6Packet, TcpPacket, TcpSeqNumber, UdpPacket};

/// IPv4 header without options; IPv6's fixed header.
pub const IPV4_HEADER_LEN: usize = 20;
pub const IPV6_HEADER_LEN: usize = 40;
/// UDP's header; TCP's without options.
pub const UDP_HEADER_LEN: usize = 8;
pub const TCP_HEADER_LEN: usize = 20;
/// Where the checksum field sits in the TCP and UDP headers (the kernel's csum_offset).
pub const TCP_CHECKSUM_AT: usize = 16;
pub const UDP_CHECKSUM_AT: usize = 6;

/// A TCP segment's control bits.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct TcpFlags {
    pub fin: bool,
    pub syn: bool,
    pub rst: bool,
    pub psh: bool,
    pub ack: bool,
    pub urg: bool,
    pub ece: bool,
    pub cwr: bool,
}

impl TcpFlags {
    /// The flags of the TCP header `t`.
    pub fn of<T: AsRef<[u8]>>(t: &TcpPacket<T>) -> TcpFlags {
        TcpFlags {
            fin: t.fin(),
            syn: t.syn(),
            rst: t.rst(),
            psh: t.psh(),
            ack: t.ack(),
            urg: t.urg(),
            ece: t.ece(),
            cwr: t.cwr(),
        }
    }

    /// ACK alone or with PSH: data of an established flow, what GRO merges (PSH ends a
    /// merged packet).
    pub fn plain_ack(&self) -> bool {
        self.ack && !(self.fin || self.syn || self.rst || self.urg || self.ece || self.cwr)
    }
}

/// The TCP facts of an IP packet that decide whether it can join a coalesced packet.
#[derive(Debug, Clone, Copy)]
pub struct Tcp {
    pub v6: bool,
    /// IP header length.
    pub ip_len: usize,
    /// IP + TCP header length.
    pub hdr_len: usize,
    pub seq: u32,
    pub flags: TcpFlags,
    pub payload: usize,
}

/// The IP layer of a packet as coalescing sees it.
#[derive(Debug, Clone, Copy)]
pub struct Ip {
    pub v6: bool,
    /// IP header length.
    pub header_len: usize,
    /// The transport protocol.
    pub protocol: IpProtocol,
}

/// The IP layer of a packet coalescing may merge: IPv4 without options and IPv6 without
/// extension headers (so headers compare simply), not a fragment, its length field true to
/// its size.
pub fn ip_of(p: &[u8]) -> Option<Ip> {
    match p.first()? >> 4 {
        4 => {
            let h = Ipv4Packet::new_checked(p).ok()?;
            let whole = !h.more_frags() && h.frag_offset() == 0;
            (usize::from(h.header_len()) == IPV4_HEADER_LEN && whole && usize::from(h.total_len()) == p.len()).then(
                || Ip {
                    v6: false,
                    header_len: IPV4_HEADER_LEN,
                    protocol: h.next_header(),
                },
            )
        }
        6 => {
            let h = Ipv6Packet::new_checked(p).ok()?;
            (h.total_len() == p.len()).then(|| Ip {
                v6: true,
                header_len: IPV6_HEADER_LEN,
                protocol: h.next_header(),
            })
        }
        _ => None,
    }
}

/// The IP layer of a packet this host made (the user-space stack's), read leniently: its
/// length field is not compared with its size, as a packet to be segmented declares the
/// whole. IPv4 with options; IPv6's next header is the fixed header's.
pub fn ip_header(p: &[u8]) -> Option<Ip> {
    match p.first()? >> 4 {
        4 if p.len() >= IPV4_HEADER_LEN => {
            let h = Ipv4Packet::new_unchecked(p);
            let header_len = usize::from(h.header_len());
            (IPV4_HEADER_LEN..=p.len()).contains(&header_len).then(|| Ip {
                v6: false,
                header_len,
                protocol: h.next_header(),
            })
        }
        6 if p.len() >= IPV6_HEADER_LEN => Some(Ip {
            v6: true,
            header_len: IPV6_HEADER_LEN,
            protocol: Ipv6Packet::new_unchecked(p).next_header(),
        }),
        _ => None,
    }
}

/// The length of the TCP header at the start of `t` (its data offset), if `t` holds it.
pub fn tcp_header_len(t: &[u8]) -> Option<usize> {
    TcpPacket::new_checked(t).ok().map(|h| usize::from(h.header_len()))
}

/// A TCP segment behind an IP header [`ip_of`] accepts, its data offset inside it.
pub fn tcp_of(p: &[u8]) -> Option<Tcp> {
    let ip = ip_of(p)?;
    if ip.protocol != IpProtocol::Tcp {
        return None;
    }
    let t = TcpPacket::new_checked(&p[ip.header_len..]).ok()?;
    let hdr_len = ip.header_len + usize::from(t.header_len());
    Some(Tcp {
        v6: ip.v6,
        ip_len: ip.header_len,
        hdr_len,
        seq: t.seq_number().0 as u32,
        flags: TcpFlags::of(&t),
        payload: p.len() - hdr_len,
    })
}

/// The fields of a UDP datagram that coalescing looks at.
#[derive(Clone, Copy)]
pub struct Udp {
    pub v6: bool,
    pub ip_len: usize,
    pub payload: usize,
}

/// A UDP datagram whose length field is true to its size.
pub fn udp_of(p: &[u8]) -> Option<Udp> {
    let ip = ip_of(p)?;
    if ip.protocol != IpProtocol::Udp {
        return None;
    }
    let u = UdpPacket::new_checked(&p[ip.header_len..]).ok()?;
    (usize::from(u.len()) == p.len() - ip.header_len).then(|| Udp {
        v6: ip.v6,
        ip_len: ip.header_len,
        payload: p.len() - ip.header_len - UDP_HEADER_LEN,
    })
}

/// Whether two packets of one IP version carry the IP fields GRO requires equal: IPv6
/// version, traffic class, flow label, next header, hop limit, addresses; IPv4 version,
/// header length, DSCP and ECN, don't-fragment, TTL, protocol, addresses (not total length,
/// ID or checksum). Both are packets [`ip_of`] accepted.
pub fn ip_same(first: &[u8], next: &[u8], v6: bool) -> bool {
    if v6 {
        let (a, b) = (Ipv6Packet::new_unchecked(first), Ipv6Packet::new_unchecked(next));
        a.traffic_class() == b.traffic_class()
            && a.flow_label() == b.flow_label()
            && a.next_header() == b.next_header()
            && a.hop_limit() == b.hop_limit()
            && a.src_addr() == b.src_addr()
            && a.dst_addr() == b.dst_addr()
    } else {
        let (a, b) = (Ipv4Packet::new_unchecked(first), Ipv4Packet::new_unchecked(next));
        a.header_len() == b.header_len()
            && a.dscp() == b.dscp()
            && a.ecn() == b.ecn()
            && a.dont_frag() == b.dont_frag()
            && a.hop_limit() == b.hop_limit()
            && a.next_header() == b.next_header()
            && a.src_addr() == b.src_addr()
            && a.dst_addr() == b.dst_addr()
    }
}

/// Makes the IP header at the start of `q` that of a packet of `total` bytes: the length
/// (IPv6: of everything after the fixed 40-byte header), for IPv4 the ID if one is given and
/// the header checksum. Returns the pseudo-header sum for the transport checksum of protocol
/// `proto`. `q` holds at least the IP header.
pub fn fix_ip(q: &mut [u8], v6: bool, ip_len: usize, total: usize, id: Option<u16>, proto: IpProtocol) -> u32 {
    if v6 {
        Ipv6Packet::new_unchecked(&mut *q).set_payload_len((total - IPV6_HEADER_LEN) as u16);
    } else {
        let mut h = Ipv4Packet::new_unchecked(&mut q[..ip_len]);
        h.set_total_len(total as u16);
        if let Some(id) = id {
            h.set_ident(id);
        }
        h.set_checksum(0);
        let c = !fold(sum16(0, &q[..ip_len]));
        Ipv4Packet::new_unchecked(&mut *q).set_checksum(c);
    }
    pseudo_sum(q, v6, total - ip_len, proto)
}

/// The IPv4 identification of a packet [`ip_of`] accepted (None for IPv6, which has none
/// outside a fragment header).
pub fn ipv4_ident(p: &[u8], v6: bool) -> Option<u16> {
    (!v6).then(|| Ipv4Packet::new_unchecked(p).ident())
}

/// The pseudo-header sum (RFC 9293 §3.1, RFC 8200 §8.1) of `l4` bytes of protocol `proto`
/// behind the IP header at the start of `q`: its addresses, the protocol and the length.
pub fn pseudo_sum(q: &[u8], v6: bool, l4: usize, proto: IpProtocol) -> u32 {
    let proto = u8::from(proto);
    if v6 {
        let h = Ipv6Packet::new_unchecked(q);
        let addrs = sum16(sum16(0, &h.src_addr().octets()), &h.dst_addr().octets());
        sum16(addrs, &[0, 0, (l4 >> 8) as u8, l4 as u8, 0, 0, 0, proto])
    } else {
        let h = Ipv4Packet::new_unchecked(q);
        let addrs = sum16(sum16(0, &h.src_addr().octets()), &h.dst_addr().octets());
        sum16(addrs, &[0, proto, (l4 >> 8) as u8, l4 as u8])
    }
}

/// Finishes the UDP datagram `u` (header and payload) behind an IP header whose
/// pseudo-header sum is `pseudo`: its length and checksum, a computed zero sent as all ones
/// (zero means "none", RFC 768).
pub fn fix_udp(u: &mut [u8], pseudo: u32) {
    let len = u.len() as u16;
    let mut h = UdpPacket::new_unchecked(&mut *u);
    h.set_len(len);
    h.set_checksum(0);
    let c = match !fold(sum16(pseudo, u)) {
        0 => 0xffff,
        c => c,
    };
    UdpPacket::new_unchecked(u).set_checksum(c);
}

/// Finishes the TCP segment `t` (header and payload) behind an IP header whose pseudo-header
/// sum is `pseudo`: its checksum, in full.
pub fn fix_tcp(t: &mut [u8], pseudo: u32) {
    TcpPacket::new_unchecked(&mut *t).set_checksum(0);
    let c = !fold(sum16(pseudo, t));
    TcpPacket::new_unchecked(t).set_checksum(c);
}

/// Whether the TCP segment `p` (as [`tcp_of`] read it) has the right checksum over its
/// pseudo-header, header and payload.
pub fn tcp_checksum_ok(p: &[u8], t: &Tcp) -> bool {
    let pseudo = pseudo_sum(p, t.v6, p.len() - t.ip_len, IpProtocol::Tcp);
    fold(sum16(pseudo, &p[t.ip_len..])) == 0xffff
}

/// Rewrites the TCP header at the start of `t` for one segment cut from a larger packet:
/// its sequence number, and its flags from the whole's (FIN and PSH belong to the last
/// segment, CWR to the first).
pub fn set_segment_header(t: &mut [u8], seq: u32, flags: TcpFlags, first: bool, last: bool) {
    let mut h = TcpPacket::new_unchecked(t);
    h.set_seq_number(TcpSeqNumber(seq as i32));
    h.set_fin(flags.fin && last);
    h.set_psh(flags.psh && last);
    h.set_cwr(flags.cwr && first);
}
