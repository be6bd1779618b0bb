//! The IP, TCP and UDP fields that segmentation and coalescing read and rewrite.

use super::checksum::{fold, sum16};

/// The TCP facts of an IP packet that decide whether it can join a coalesced packet.
#[derive(Debug, Clone, Copy)]
pub struct Tcp {
    pub v6: bool,
    /// IP header length.
    pub ip_len: usize,
    /// IP + TCP header length.
    pub hdr_len: usize,
    pub seq: u32,
    pub flags: u8,
    pub payload: usize,
}

pub const TCP_PSH: u8 = 0x08;
pub const TCP_ACK: u8 = 0x10;

/// The IP layer of a packet as coalescing sees it.
#[derive(Debug, Clone, Copy)]
pub struct Ip {
    pub v6: bool,
    /// IP header length.
    pub header_len: usize,
    /// The transport protocol (6 TCP, 17 UDP).
    pub protocol: u8,
}

/// The IP layer of a packet coalescing may merge: IPv4 without options and IPv6 without
/// extension headers (so headers compare simply), not a fragment, its length field true to
/// its size.
pub fn ip_of(p: &[u8]) -> Option<Ip> {
    let ip = |v6, header_len, protocol| Ip {
        v6,
        header_len,
        protocol,
    };
    match p.first()? >> 4 {
        4 if p.len() >= 20 => {
            let ihl = (p[0] & 0x0f) as usize * 4;
            let frag = u16::from_be_bytes([p[6], p[7]]);
            if ihl != 20 || frag & 0x3fff != 0 || u16::from_be_bytes([p[2], p[3]]) as usize != p.len() {
                return None;
            }
            Some(ip(false, 20, p[9]))
        }
        6 if p.len() >= 40 => {
            if 40 + u16::from_be_bytes([p[4], p[5]]) as usize != p.len() {
                return None;
            }
            Some(ip(true, 40, p[6]))
        }
        _ => None,
    }
}

pub fn tcp_of(p: &[u8]) -> Option<Tcp> {
    let Ip {
        v6,
        header_len: ip_len,
        protocol: proto,
    } = ip_of(p)?;
    if proto != 6 || p.len() < ip_len + 20 {
        return None;
    }
    let t = &p[ip_len..];
    let doff = (t[12] >> 4) as usize * 4;
    if doff < 20 || ip_len + doff > p.len() {
        return None;
    }
    Some(Tcp {
        v6,
        ip_len,
        hdr_len: ip_len + doff,
        seq: u32::from_be_bytes([t[4], t[5], t[6], t[7]]),
        flags: t[13],
        payload: p.len() - ip_len - doff,
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
    let Ip {
        v6,
        header_len: ip_len,
        protocol: proto,
    } = ip_of(p)?;
    if proto != 17
        || p.len() < ip_len + 8
        || u16::from_be_bytes([p[ip_len + 4], p[ip_len + 5]]) as usize != p.len() - ip_len
    {
        return None;
    }
    Some(Udp {
        v6,
        ip_len,
        payload: p.len() - ip_len - 8,
    })
}

/// Whether two packets of one IP version carry the IP fields GRO requires equal: IPv6
/// version/class/flow label, next header, hop limit, addresses; IPv4 version/IHL/TOS, flags
/// (DF), TTL, protocol, addresses (not total length, ID or checksum).
pub fn ip_same(first: &[u8], next: &[u8], v6: bool) -> bool {
    if v6 {
        first[0..4] == next[0..4] && first[6..40] == next[6..40]
    } else {
        first[0..2] == next[0..2] && first[6] == next[6] && first[8..10] == next[8..10] && first[12..20] == next[12..20]
    }
}
/// Makes the IP header at the start of `q` that of a packet of `total` bytes: the length
/// (IPv6: of everything after the fixed 40-byte header), for IPv4 the ID if one is given and
/// the header checksum. Returns the pseudo-header sum for the transport checksum of protocol
/// `proto`.
pub fn fix_ip(q: &mut [u8], v6: bool, ip_len: usize, total: usize, id: Option<u16>, proto: u8) -> u32 {
    if v6 {
        q[4..6].copy_from_slice(&((total - 40) as u16).to_be_bytes());
    } else {
        q[2..4].copy_from_slice(&(total as u16).to_be_bytes());
        if let Some(id) = id {
            q[4..6].copy_from_slice(&id.to_be_bytes());
        }
        q[10..12].fill(0);
        let c = !fold(sum16(0, &q[..ip_len]));
        q[10..12].copy_from_slice(&c.to_be_bytes());
    }
    pseudo_sum(q, v6, total - ip_len, proto)
}

/// The pseudo-header sum (RFC 9293 §3.1, RFC 8200 §8.1) of `l4` bytes of protocol `proto`
/// behind the IP header at the start of `q`: its addresses, the protocol and the length.
pub fn pseudo_sum(q: &[u8], v6: bool, l4: usize, proto: u8) -> u32 {
    if v6 {
        sum16(sum16(0, &q[8..40]), &[0, 0, (l4 >> 8) as u8, l4 as u8, 0, 0, 0, proto])
    } else {
        sum16(sum16(0, &q[12..20]), &[0, proto, (l4 >> 8) as u8, l4 as u8])
    }
}

/// Finishes the UDP datagram `u` (header and payload) behind an IP header whose
/// pseudo-header sum is `pseudo`: its length and checksum, a computed zero sent as all ones
/// (zero means "none", RFC 768).
pub fn fix_udp(u: &mut [u8], pseudo: u32) {
    let len = u.len() as u16;
    u[4..6].copy_from_slice(&len.to_be_bytes());
    u[6..8].fill(0);
    let c = match !fold(sum16(pseudo, u)) {
        0 => 0xffff,
        c => c,
    };
    u[6..8].copy_from_slice(&c.to_be_bytes());
}

/// Whether the TCP segment `p` (as [`tcp_of`] read it) has the right checksum over its
/// pseudo-header, header and payload.
pub fn tcp_checksum_ok(p: &[u8], t: &Tcp) -> bool {
    let pseudo = pseudo_sum(p, t.v6, p.len() - t.ip_len, 6);
    fold(sum16(pseudo, &p[t.ip_len..])) == 0xffff
}
