//! TUN offloads: the virtio-net header that precedes every packet on a TUN device opened with
//! IFF_VNET_HDR; splitting the large TCP (TSO) and UDP (USO) packets the kernel hands us into
//! wire-sized ones; and coalescing on the way to the kernel (generic receive offload done in
//! user space): consecutive segments of one TCP flow, or consecutive datagrams of one UDP
//! flow, become one large packet that the kernel takes in a single write, as it would from a
//! NIC doing GRO.

/// struct virtio_net_hdr: flags, gso_type, hdr_len, gso_size, csum_start, csum_offset.
pub const VNET_HDR_LEN: usize = 10;
const F_NEEDS_CSUM: u8 = 1;
const GSO_NONE: u8 = 0;
const GSO_TCPV4: u8 = 1;
const GSO_TCPV6: u8 = 4;
/// UDP segmentation (USO): one large datagram to cut into `gso_size` payloads.
const GSO_UDP_L4: u8 = 5;
/// Largest packet the kernel takes in one write.
const MAX_COALESCED: usize = 65535;
/// Most datagrams merged into one UDP packet: UDP_MAX_SEGMENTS of the kernels that brought USO
/// to TUN (later ones allow more), so every kernel that takes the packet can split it.
const UDP_MAX_SEGMENTS: usize = 64;

#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct VnetHdr {
    pub flags: u8,
    pub gso_type: u8,
    pub hdr_len: u16,
    pub gso_size: u16,
    pub csum_start: u16,
    pub csum_offset: u16,
}

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
}

/// One's-complement sum of `data` added to `sum` (RFC 1071), folded to 16 bits (as a u32,
/// so callers can keep adding). On CPUs with AVX2 the same loop runs four lanes to an
/// instruction (half the time of the baseline build: 27 against 53 ns for 1420 bytes);
/// headers take a plain loop.
fn sum16(sum: u32, data: &[u8]) -> u32 {
    if data.len() < SMALL {
        return sum16_small(sum, data);
    }
    #[cfg(target_arch = "x86_64")]
    if std::is_x86_feature_detected!("avx2") {
        // SAFETY: the CPU has AVX2 (checked just above), all that `sum16_avx2` requires.
        return unsafe { sum16_avx2(sum, data) };
    }
    sum16_lanes(sum, data)
}

/// Below this many bytes (headers: IP, TCP, pseudo-header) a plain loop beats the lanes,
/// whose setup and fold cost more than the words themselves. Splitting a 64 KB TSO packet
/// took 99.5 ns per segment with every sum in lanes, 81.6 ns with this (four small sums and
/// one large per segment).
const SMALL: usize = 64;

/// [`sum16`] of a few bytes, a big-endian 32-bit word at a time.
#[inline]
fn sum16_small(sum: u32, data: &[u8]) -> u32 {
    let mut acc = sum as u64;
    let mut words = data.chunks_exact(4);
    for w in &mut words {
        acc += u32::from_be_bytes(w.try_into().expect("4 bytes")) as u64;
    }
    let mut pairs = words.remainder().chunks_exact(2);
    for w in &mut pairs {
        acc += u16::from_be_bytes([w[0], w[1]]) as u64;
    }
    if let [last] = pairs.remainder() {
        acc += (*last as u64) << 8;
    }
    acc = (acc & 0xffff_ffff) + (acc >> 32);
    let mut x = (acc & 0xffff_ffff) as u32 + (acc >> 32) as u32;
    x = (x & 0xffff) + (x >> 16);
    (x & 0xffff) + (x >> 16)
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
fn sum16_avx2(sum: u32, data: &[u8]) -> u32 {
    sum16_lanes(sum, data)
}

/// [`sum16`] in portable code. The sum does not depend on byte order up to a final swap
/// (RFC 1071 section 2): little-endian 32-bit words go into eight 64-bit lanes that cannot
/// overflow (that would take 2^32 words), so the loop has no carry chain and vectorizes; it
/// runs once per byte of every TSO segment a sender splits.
#[inline(always)]
fn sum16_lanes(sum: u32, data: &[u8]) -> u32 {
    let mut lanes = [0u64; 8];
    let mut blocks = data.chunks_exact(32);
    for block in &mut blocks {
        for (lane, w) in lanes.iter_mut().zip(block.chunks_exact(4)) {
            *lane += u32::from_le_bytes(w.try_into().expect("4 bytes")) as u64;
        }
    }
    let mut acc = lanes.iter().fold(0u64, |a, &l| {
        let (s, carry) = a.overflowing_add(l);
        s + carry as u64
    });
    let mut pairs = blocks.remainder().chunks_exact(2);
    for w in &mut pairs {
        acc += u16::from_le_bytes([w[0], w[1]]) as u64;
    }
    if let [last] = pairs.remainder() {
        acc += *last as u64;
    }
    // Fold 64 -> 16 bits, then back to big-endian order.
    acc = (acc & 0xffff_ffff) + (acc >> 32);
    acc = (acc & 0xffff_ffff) + (acc >> 32);
    let mut x = acc as u32;
    x = (x & 0xffff) + (x >> 16);
    x = (x & 0xffff) + (x >> 16);
    let mut total = sum + (x as u16).swap_bytes() as u32;
    total = (total & 0xffff) + (total >> 16);
    (total & 0xffff) + (total >> 16)
}

fn fold(mut sum: u32) -> u16 {
    while sum > 0xffff {
        sum = (sum & 0xffff) + (sum >> 16);
    }
    sum as u16
}

/// Completes a checksum the kernel left partial (flag NEEDS_CSUM): the field at
/// `csum_start + csum_offset` holds the pseudo-header sum; the sum over the rest finishes it.
pub fn complete_checksum(h: &VnetHdr, packet: &mut [u8]) -> bool {
    let (start, at) = (h.csum_start as usize, h.csum_start as usize + h.csum_offset as usize);
    if h.flags & F_NEEDS_CSUM == 0 {
        return true;
    }
    if at + 2 > packet.len() || start > packet.len() {
        return false;
    }
    let c = !fold(sum16(0, &packet[start..]));
    packet[at..at + 2].copy_from_slice(&c.to_be_bytes());
    true
}

/// The TCP facts of an IP packet that decide whether it can join a coalesced packet.
#[derive(Debug, Clone, Copy)]
struct Tcp {
    v6: bool,
    /// IP header length.
    ip_len: usize,
    /// IP + TCP header length.
    hdr_len: usize,
    seq: u32,
    flags: u8,
    payload: usize,
}

const TCP_PSH: u8 = 0x08;
const TCP_ACK: u8 = 0x10;

/// The IP layer of a packet coalescing may merge: (IPv6?, header length, protocol). IPv4
/// without options and IPv6 without extension headers (so headers compare simply), not a
/// fragment, its length field true to its size.
fn ip_of(p: &[u8]) -> Option<(bool, usize, u8)> {
    match p.first()? >> 4 {
        4 if p.len() >= 20 => {
            let ihl = (p[0] & 0x0f) as usize * 4;
            let frag = u16::from_be_bytes([p[6], p[7]]);
            if ihl != 20 || frag & 0x3fff != 0 || u16::from_be_bytes([p[2], p[3]]) as usize != p.len() {
                return None;
            }
            Some((false, 20, p[9]))
        }
        6 if p.len() >= 40 => {
            if 40 + u16::from_be_bytes([p[4], p[5]]) as usize != p.len() {
                return None;
            }
            Some((true, 40, p[6]))
        }
        _ => None,
    }
}

fn tcp_of(p: &[u8]) -> Option<Tcp> {
    let (v6, ip_len, proto) = ip_of(p)?;
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
struct Udp {
    v6: bool,
    ip_len: usize,
    payload: usize,
}

/// A UDP datagram whose length field is true to its size.
fn udp_of(p: &[u8]) -> Option<Udp> {
    let (v6, ip_len, proto) = ip_of(p)?;
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
fn ip_same(first: &[u8], next: &[u8], v6: bool) -> bool {
    if v6 {
        first[0..4] == next[0..4] && first[6..40] == next[6..40]
    } else {
        first[0..2] == next[0..2] && first[6] == next[6] && first[8..10] == next[8..10] && first[12..20] == next[12..20]
    }
}

/// Whether `next` continues `first`'s flow right after `prev`: same addresses, ports, ack,
/// window, options and IP fields that GRO requires equal; the next sequence number; plain
/// ACK (PSH allowed, it ends the packet).
fn continues(first: &[u8], ft: &Tcp, prev: &Tcp, next: &[u8], nt: &Tcp) -> bool {
    if nt.v6 != ft.v6 || nt.hdr_len != ft.hdr_len || nt.payload == 0 || nt.flags & !TCP_PSH != TCP_ACK {
        return false;
    }
    if nt.seq != prev.seq.wrapping_add(prev.payload as u32) {
        return false;
    }
    // ports and ack number; window; options. Not sequence number, flags or checksum.
    let (a, b) = (&first[ft.ip_len..ft.hdr_len], &next[nt.ip_len..nt.hdr_len]);
    ip_same(first, next, ft.v6)
        && a[0..4] == b[0..4]
        && a[8..12] == b[8..12]
        && a[14..16] == b[14..16]
        && a[20..] == b[20..]
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
    let ft = tcp_of(packets[i]).filter(|t| t.payload > 0 && t.flags & !TCP_PSH == TCP_ACK)?;
    let (mut j, mut prev, mut total) = (i + 1, ft, packets[i].len());
    while j < packets.len() && prev.flags & TCP_PSH == 0 && prev.payload == ft.payload {
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
            || first[fu.ip_len..fu.ip_len + 4] != next[nu.ip_len..nu.ip_len + 4]
        {
            break;
        }
        total += nu.payload;
        last = nu.payload;
        j += 1;
    }
    Some(j)
}

/// Builds one packet (behind its virtio-net header) from a run [`plan`] made, as the kernel's
/// GRO would: the first segment's headers, every payload, the lengths fixed (TCP: PSH from the
/// last), and a partial checksum the kernel finishes or trusts. The tests' whole-packet view of
/// [`coalesced_header`].
#[cfg(test)]
pub fn coalesce(segments: &[&[u8]]) -> Vec<u8> {
    let (mut out, hdr_len) = coalesced_header(segments);
    for s in segments {
        out.extend_from_slice(&s[hdr_len..]);
    }
    out
}

/// The head of a coalesced packet (a run [`plan`] made): its virtio-net header and the first
/// segment's IP and TCP or UDP headers, fixed for the whole. Written with the segments'
/// payloads behind it (each from the returned header length on) in one vectored write, the
/// payloads are never copied in user space. The transport checksum is left partial
/// (CHECKSUM_PARTIAL: the field holds the pseudo-header sum, not inverted), which the kernel
/// completes per segment where it splits the packet and otherwise trusts, as it trusts
/// kernel WireGuard's decrypted packets.
pub fn coalesced_header(segments: &[&[u8]]) -> (Vec<u8>, usize) {
    let first = segments[0];
    let (v6, ip_len, proto) = ip_of(first).expect("planned");
    let (hdr_len, gso_size, csum_offset) = match tcp_of(first) {
        Some(t) => (t.hdr_len, t.payload, 16),
        None => {
            let u = udp_of(first).expect("planned as TCP or UDP");
            (u.ip_len + 8, u.payload, 6)
        }
    };
    let total = hdr_len + segments.iter().map(|s| s.len() - hdr_len).sum::<usize>();
    // Room for the headers only: the payloads go out from where they lie.
    let mut out = Vec::with_capacity(VNET_HDR_LEN + hdr_len);
    out.resize(VNET_HDR_LEN, 0);
    out.extend_from_slice(&first[..hdr_len]);
    let p = &mut out[VNET_HDR_LEN..];
    let pseudo = fix_ip(p, v6, ip_len, total, None, proto);
    let l4 = &mut p[ip_len..];
    if proto == 6 {
        let last = tcp_of(segments[segments.len() - 1]).expect("planned as TCP");
        l4[13] |= last.flags & TCP_PSH;
    } else {
        l4[4..6].copy_from_slice(&((total - ip_len) as u16).to_be_bytes());
    }
    l4[csum_offset..csum_offset + 2].copy_from_slice(&fold(pseudo).to_be_bytes());
    let gso_type = match (proto, v6) {
        (6, false) => GSO_TCPV4,
        (6, true) => GSO_TCPV6,
        _ => GSO_UDP_L4,
    };
    VnetHdr {
        flags: F_NEEDS_CSUM,
        gso_type,
        hdr_len: hdr_len as u16,
        gso_size: gso_size as u16,
        csum_start: ip_len as u16,
        csum_offset: csum_offset as u16,
    }
    .write(&mut out[..VNET_HDR_LEN]);
    (out, hdr_len)
}

/// One segment's buffer: `headroom` zero bytes, the big packet's headers, the payload chunk,
/// and room for the padding and tag that sealing adds.
fn segment_copy(headers: &[u8], chunk: &[u8], headroom: usize) -> Vec<u8> {
    let mut s = super::buffers::take(headroom + headers.len() + chunk.len() + 32);
    s.resize(headroom, 0);
    s.extend_from_slice(headers);
    s.extend_from_slice(chunk);
    s
}

/// Makes the IP header at the start of `q` that of a packet of `total` bytes: the length
/// (IPv6: of everything after the fixed 40-byte header), for IPv4 the ID if one is given and
/// the header checksum. Returns the pseudo-header sum for the transport checksum of protocol
/// `proto`.
fn fix_ip(q: &mut [u8], v6: bool, ip_len: usize, total: usize, id: Option<u16>, proto: u8) -> u32 {
    let l4 = total - ip_len;
    if v6 {
        q[4..6].copy_from_slice(&((total - 40) as u16).to_be_bytes());
        sum16(sum16(0, &q[8..40]), &[0, 0, (l4 >> 8) as u8, l4 as u8, 0, 0, 0, proto])
    } else {
        q[2..4].copy_from_slice(&(total as u16).to_be_bytes());
        if let Some(id) = id {
            q[4..6].copy_from_slice(&id.to_be_bytes());
        }
        q[10..12].fill(0);
        let c = !fold(sum16(0, &q[..ip_len]));
        q[10..12].copy_from_slice(&c.to_be_bytes());
        sum16(sum16(0, &q[12..20]), &[0, proto, (l4 >> 8) as u8, l4 as u8])
    }
}

/// Splits a packet the kernel handed over whole (TSO or USO) into wire-sized packets behind
/// `headroom` zero bytes; false (and nothing appended) for one that does not match its header.
pub fn segment(h: &VnetHdr, p: &[u8], headroom: usize, out: &mut Vec<Vec<u8>>) -> bool {
    if h.gso_type & 0x7f == GSO_UDP_L4 {
        segment_uso(h, p, headroom, out)
    } else {
        segment_tso(h, p, headroom, out)
    }
}

/// Splits a UDP datagram the kernel handed over whole (USO: `gso_type` UDP_L4) into
/// datagrams of `gso_size` payload bytes, as `UDP_SEGMENT` would on the wire: headers copied,
/// IP and UDP lengths, IPv4 IDs and every checksum computed in full.
pub fn segment_uso(h: &VnetHdr, p: &[u8], headroom: usize, out: &mut Vec<Vec<u8>>) -> bool {
    let v6 = match p.first().map(|b| b >> 4) {
        Some(4) => false,
        Some(6) => true,
        _ => return false,
    };
    let ip_len = h.csum_start as usize;
    let min_ip = if v6 { 40 } else { 20 };
    let proto = if v6 { p.get(6) } else { p.get(9) };
    if ip_len < min_ip
        || p.len() < ip_len + 8
        || h.gso_size == 0
        || proto != Some(&17)
        || (!v6 && ip_len != (p[0] & 0x0f) as usize * 4)
    {
        return false;
    }
    let hdr = ip_len + 8;
    let id = u16::from_be_bytes([p[4], p[5]]);
    for (i, chunk) in p[hdr..].chunks(h.gso_size as usize).enumerate() {
        let mut s = segment_copy(&p[..hdr], chunk, headroom);
        let q = &mut s[headroom..];
        let udp_len = q.len() - ip_len;
        let pseudo = fix_ip(q, v6, ip_len, q.len(), Some(id.wrapping_add(i as u16)), 17);
        let u = &mut q[ip_len..];
        u[4..6].copy_from_slice(&(udp_len as u16).to_be_bytes());
        u[6..8].fill(0);
        // A computed UDP checksum of zero is sent as all ones (zero means "none").
        let c = match !fold(sum16(pseudo, u)) {
            0 => 0xffff,
            c => c,
        };
        u[6..8].copy_from_slice(&c.to_be_bytes());
        out.push(s);
    }
    true
}

/// Splits a TCP packet the kernel handed over whole (TSO: `gso_type` TCPV4/TCPV6) into
/// `gso_size` segments as a NIC would: headers copied, IP lengths and IDs, sequence numbers
/// and flags adjusted, every checksum computed in full. Each segment is appended to `out`
/// behind `headroom` zero bytes. Returns false (and appends nothing) for a packet whose
/// header does not match what the virtio-net header says.
pub fn segment_tso(h: &VnetHdr, p: &[u8], headroom: usize, out: &mut Vec<Vec<u8>>) -> bool {
    let v6 = match (h.gso_type & 0x7f, p.first().map(|b| b >> 4)) {
        (GSO_TCPV4, Some(4)) => false,
        (GSO_TCPV6, Some(6)) => true,
        _ => return false,
    };
    let ip_len = h.csum_start as usize;
    let min_ip = if v6 { 40 } else { 20 };
    if ip_len < min_ip || p.len() < ip_len + 20 || h.gso_size == 0 || (!v6 && ip_len != (p[0] & 0x0f) as usize * 4) {
        return false;
    }
    let doff = (p[ip_len + 12] >> 4) as usize * 4;
    let hdr = ip_len + doff;
    if doff < 20 || hdr > p.len() {
        return false;
    }
    let payload = &p[hdr..];
    let seq = u32::from_be_bytes(p[ip_len + 4..ip_len + 8].try_into().unwrap());
    let id = u16::from_be_bytes([p[4], p[5]]);
    let flags = p[ip_len + 13];
    let n = payload.len().div_ceil(h.gso_size as usize).max(1);
    for (i, chunk) in payload.chunks(h.gso_size as usize).enumerate() {
        let mut s = segment_copy(&p[..hdr], chunk, headroom);
        let q = &mut s[headroom..];
        let pseudo = fix_ip(q, v6, ip_len, q.len(), Some(id.wrapping_add(i as u16)), 6);
        let t = &mut q[ip_len..];
        t[4..8].copy_from_slice(&seq.wrapping_add((i * h.gso_size as usize) as u32).to_be_bytes());
        // FIN and PSH belong to the last segment, CWR to the first.
        let mut f = flags;
        if i + 1 < n {
            f &= !(TCP_PSH | 0x01);
        }
        if i > 0 {
            f &= !0x80;
        }
        t[13] = f;
        t[16..18].fill(0);
        let c = !fold(sum16(pseudo, t));
        t[16..18].copy_from_slice(&c.to_be_bytes());
        out.push(s);
    }
    true
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

#[cfg(test)]
mod tests {
    use super::*;

    /// An IPv4 TCP segment with a valid IP header checksum.
    fn seg(seq: u32, payload: &[u8], flags: u8) -> Vec<u8> {
        let total = 20 + 20 + payload.len();
        let mut p = vec![0u8; total];
        p[0] = 0x45;
        p[2..4].copy_from_slice(&(total as u16).to_be_bytes());
        p[6] = 0x40; // DF
        p[8] = 64;
        p[9] = 6;
        p[12..16].copy_from_slice(&[10, 0, 0, 1]);
        p[16..20].copy_from_slice(&[10, 0, 0, 2]);
        let c = !fold(sum16(0, &p[..20]));
        p[10..12].copy_from_slice(&c.to_be_bytes());
        let t = &mut p[20..];
        t[0..2].copy_from_slice(&5201u16.to_be_bytes());
        t[2..4].copy_from_slice(&40000u16.to_be_bytes());
        t[4..8].copy_from_slice(&seq.to_be_bytes());
        t[8..12].copy_from_slice(&7u32.to_be_bytes());
        t[12] = 5 << 4;
        t[13] = flags;
        t[14..16].copy_from_slice(&512u16.to_be_bytes());
        p[40..].copy_from_slice(payload);
        p
    }

    fn refs(v: &[Vec<u8>]) -> Vec<&[u8]> {
        v.iter().map(|p| p.as_slice()).collect()
    }

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
        let out = coalesce(&refs(&pkts));
        let h = VnetHdr::parse(&out);
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
        let p = &out[VNET_HDR_LEN..];
        assert_eq!(p.len(), 40 + 260);
        assert_eq!(u16::from_be_bytes([p[2], p[3]]), 300);
        assert_eq!(fold(sum16(0, &p[..20])), 0xffff, "IP header checksum is valid");
        assert_eq!(&p[40..140], &[1; 100][..]);
        assert_eq!(&p[240..300], &[3; 60][..], "payloads in order");
        assert_eq!(p[33] & TCP_PSH, TCP_PSH);
        // Finishing the partial checksum gives the TCP checksum of the whole segment.
        let mut full = p.to_vec();
        assert!(complete_checksum(&h, &mut full));
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

    fn tcp_checksum_ok(p: &[u8], ip_len: usize) -> bool {
        let tcp_len = (p.len() - ip_len) as u16;
        let pseudo = if ip_len == 40 {
            sum16(
                sum16(0, &p[8..40]),
                &[0, 0, (tcp_len >> 8) as u8, tcp_len as u8, 0, 0, 0, 6],
            )
        } else {
            sum16(sum16(0, &p[12..20]), &[0, 6, (tcp_len >> 8) as u8, tcp_len as u8])
        };
        fold(sum16(pseudo, &p[ip_len..])) == 0xffff
    }

    #[test]
    fn tso_packets_split_into_valid_segments() {
        let payload: Vec<u8> = (0..3500u32).map(|i| (i * 7) as u8).collect();
        let big = seg(5000, &payload, TCP_ACK | TCP_PSH | 0x01); // PSH and FIN
        let h = VnetHdr {
            flags: F_NEEDS_CSUM,
            gso_type: GSO_TCPV4,
            hdr_len: 40,
            gso_size: 1448,
            csum_start: 20,
            csum_offset: 16,
        };
        let mut out = Vec::new();
        assert!(segment_tso(&h, &big, 16, &mut out));
        assert_eq!(out.len(), 3);
        let mut joined = Vec::new();
        for (i, s) in out.iter().enumerate() {
            let p = &s[16..];
            assert_eq!(u16::from_be_bytes([p[2], p[3]]) as usize, p.len());
            assert_eq!(fold(sum16(0, &p[..20])), 0xffff, "IP checksum of segment {i}");
            assert!(tcp_checksum_ok(p, 20), "TCP checksum of segment {i}");
            assert_eq!(
                u32::from_be_bytes(p[24..28].try_into().unwrap()),
                5000 + 1448 * i as u32
            );
            let last = i == 2;
            assert_eq!(p[33] & (TCP_PSH | 0x01) != 0, last, "PSH/FIN only on the last segment");
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
        let h = VnetHdr {
            flags: F_NEEDS_CSUM,
            gso_type: GSO_TCPV6,
            hdr_len: 60,
            gso_size: 1400,
            csum_start: 40,
            csum_offset: 16,
        };
        let mut out = Vec::new();
        assert!(segment_tso(&h, &p, 0, &mut out));
        assert_eq!(
            out.iter().map(|s| s.len() - 60).collect::<Vec<_>>(),
            vec![1400, 1400, 200]
        );
        for s in &out {
            assert_eq!(u16::from_be_bytes([s[4], s[5]]) as usize, s.len() - 40);
            assert!(tcp_checksum_ok(s, 40));
        }
        let wrong = VnetHdr {
            gso_type: GSO_TCPV4,
            ..h
        };
        assert!(
            !segment_tso(&wrong, &p, 0, &mut out),
            "a header that lies about the family is refused"
        );
    }

    fn udp_checksum_ok(p: &[u8], ip_len: usize, v6: bool) -> bool {
        let u = &p[ip_len..];
        let pseudo = if v6 {
            sum16(
                sum16(0, &p[8..40]),
                &[0, 0, (u.len() >> 8) as u8, u.len() as u8, 0, 0, 0, 17],
            )
        } else {
            sum16(sum16(0, &p[12..20]), &[0, 17, (u.len() >> 8) as u8, u.len() as u8])
        };
        fold(sum16(pseudo, u)) == 0xffff
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
            let h = VnetHdr {
                flags: F_NEEDS_CSUM,
                gso_type: GSO_UDP_L4,
                hdr_len: (ip_len + 8) as u16,
                gso_size: 1200,
                csum_start: ip_len as u16,
                csum_offset: 6,
            };
            let mut out = Vec::new();
            assert!(segment(&h, &p, 16, &mut out));
            assert_eq!(out.len(), 3, "1200 + 1200 + 600");
            let mut joined = Vec::new();
            for (i, s) in out.iter().enumerate() {
                let q = &s[16..];
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
            assert!(!segment(&h, &bad, 0, &mut Vec::new()));
        }
    }

    /// The wide sum equals the textbook one (pairs of bytes), for every length and offset.
    #[test]
    fn wide_checksum_matches_the_simple_one() {
        fn simple(mut sum: u32, data: &[u8]) -> u32 {
            for c in data.chunks(2) {
                sum += (c[0] as u32) << 8 | c.get(1).copied().unwrap_or(0) as u32;
            }
            sum
        }
        let data: Vec<u8> = (0..3100u32).map(|i| (i.wrapping_mul(2654435761) >> 13) as u8).collect();
        for len in (0..100).chain([1499, 1500, 2999]) {
            for start in 0..3 {
                let d = &data[start..start + len];
                for seed in [0u32, 0xffff, 0x1_2345] {
                    assert_eq!(fold(sum16(seed, d)), fold(simple(seed, d)), "len {len} start {start}");
                    assert_eq!(
                        fold(sum16_lanes(seed, d)),
                        fold(simple(seed, d)),
                        "len {len} start {start}"
                    );
                }
            }
        }
        assert_eq!(fold(sum16(0, &[0xff; 4096])), 0xffff);
        // The largest seed callers pass (two folded sums added) with the largest small input.
        assert_eq!(
            fold(sum16(0x1_fffe, &[0xff; SMALL - 1])),
            fold(simple(0x1_fffe, &[0xff; SMALL - 1]))
        );
        assert_eq!(
            fold(sum16(0xffff, &[0xff; 65_535])),
            fold(simple(0xffff, &[0xff; 65_535]))
        );
    }

    #[test]
    fn partial_checksums_are_completed() {
        let mut p = seg(1, &[9; 33], TCP_ACK);
        let tcp_len = (p.len() - 20) as u16;
        let pseudo = fold(sum16(sum16(sum16(0, &p[12..20]), &[0, 6]), &tcp_len.to_be_bytes()));
        p[36..38].copy_from_slice(&pseudo.to_be_bytes());
        let h = VnetHdr {
            flags: F_NEEDS_CSUM,
            csum_start: 20,
            csum_offset: 16,
            ..Default::default()
        };
        assert!(complete_checksum(&h, &mut p));
        let check = fold(sum16(sum16(sum16(0, &p[12..20]), &[0, 6]), &tcp_len.to_be_bytes()) + sum16(0, &p[20..]));
        assert_eq!(check, 0xffff);
        let bad = VnetHdr {
            flags: F_NEEDS_CSUM,
            csum_start: 200,
            csum_offset: 16,
            ..Default::default()
        };
        assert!(
            !complete_checksum(&bad, &mut p),
            "out-of-range offsets are refused, not trusted"
        );
    }

    /// A UDP datagram from 10.0.0.1:5000 to 10.0.0.2:`dport` (or fd99::1 to fd99::2) with
    /// valid checksums; IPv4 ID `id`, DF set.
    fn dgram(v6: bool, id: u16, dport: u16, payload: &[u8]) -> Vec<u8> {
        let ip_len = if v6 { 40 } else { 20 };
        let total = ip_len + 8 + payload.len();
        let mut p = vec![0u8; total];
        if v6 {
            p[0] = 0x60;
            p[6] = 17;
            p[7] = 64;
            p[8..10].copy_from_slice(&[0xfd, 0x99]);
            p[23] = 1;
            p[24..26].copy_from_slice(&[0xfd, 0x99]);
            p[39] = 2;
        } else {
            p[0] = 0x45;
            p[4..6].copy_from_slice(&id.to_be_bytes());
            p[6] = 0x40;
            p[8] = 64;
            p[9] = 17;
            p[12..20].copy_from_slice(&[10, 0, 0, 1, 10, 0, 0, 2]);
        }
        let q = &mut p[ip_len..];
        q[0..2].copy_from_slice(&5000u16.to_be_bytes());
        q[2..4].copy_from_slice(&dport.to_be_bytes());
        q[8..].copy_from_slice(payload);
        let pseudo = fix_ip(&mut p, v6, ip_len, total, None, 17);
        p[ip_len + 4..ip_len + 6].copy_from_slice(&((total - ip_len) as u16).to_be_bytes());
        let c = !fold(sum16(pseudo, &p[ip_len..]));
        p[ip_len + 6..ip_len + 8].copy_from_slice(&c.to_be_bytes());
        p
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
            let out = coalesce(&refs(&pkts));
            let h = VnetHdr::parse(&out);
            assert_eq!(
                h,
                VnetHdr {
                    flags: F_NEEDS_CSUM,
                    gso_type: GSO_UDP_L4,
                    hdr_len: (ip_len + 8) as u16,
                    gso_size: 1000,
                    csum_start: ip_len as u16,
                    csum_offset: 6
                }
            );
            let p = &out[VNET_HDR_LEN..];
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
            assert!(complete_checksum(&h, &mut whole));
            assert!(udp_checksum_ok(&whole, ip_len, v6), "checksum of the whole");
            // ...and the kernel's split (segment_uso does what it does) gives back every
            // datagram byte for byte: headers, IDs, lengths, checksums, payloads.
            let mut back = Vec::new();
            assert!(segment(&h, p, 0, &mut back));
            assert_eq!(back, pkts);
        }
    }
}
