//! IP packet helpers that any inner backend can use: checksums ([`checksum`]), the IP, TCP and
//! UDP fields they read ([`ip`]), splitting the large packets a host hands over whole
//! ([`segment`]: TSO, USO) and merging a run of small ones into one for the host
//! ([`coalesce`]: generic receive offload done in user space, TCP and UDP).
//!
//! They speak of a packet's offload in [`Offload`], which says what a virtio-net header says
//! (the TUN device's, see `inner::tun::vnet`) without its wire layout, so that a user-space
//! stack or an AF_XDP backend can use the same code with descriptors of their own.

pub mod checksum;
pub mod coalesce;
pub mod ip;
pub mod segment;

/// How a packet handed over (or to be written) whole is cut into wire-sized packets.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Segmentation {
    /// A wire-sized packet already.
    #[default]
    None,
    /// TCP over IPv4 (TSO).
    Tcp4,
    /// TCP over IPv6 (TSO).
    Tcp6,
    /// UDP over either family (USO): payloads of `segment_size`, the last possibly shorter.
    Udp,
}

/// A transport checksum left partial: the field at `start + offset` holds the pseudo-header
/// sum, and the sum over the bytes from `start` on finishes it (the kernel's
/// CHECKSUM_PARTIAL).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PartialChecksum {
    pub start: u16,
    pub offset: u16,
}

/// What a packet needs done besides its bytes: segmentation and a partial checksum.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Offload {
    pub segmentation: Segmentation,
    /// IP plus transport header length (with segmentation).
    pub header_len: u16,
    /// Transport payload bytes per segment (with segmentation).
    pub segment_size: u16,
    pub checksum: Option<PartialChecksum>,
}

/// Packets built by hand for the tests of this module and of the backends that use it.
#[cfg(test)]
pub(crate) mod fixtures {
    use super::checksum::{fold, sum16};
    use super::ip::fix_ip;

    /// TCP's flag bits as its header carries them (byte 13), for building segments by hand.
    pub const TCP_ACK: u8 = 0x10;
    pub const TCP_PSH: u8 = 0x08;
    pub const TCP_FIN: u8 = 0x01;
    pub const TCP_CWR: u8 = 0x80;

    /// An IPv4 TCP segment from 10.0.0.1:5201 to 10.0.0.2:40000 with a valid IP header
    /// checksum.
    pub fn seg(seq: u32, payload: &[u8], flags: u8) -> Vec<u8> {
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

    pub fn refs(v: &[Vec<u8>]) -> Vec<&[u8]> {
        v.iter().map(|p| p.as_slice()).collect()
    }

    pub fn tcp_checksum_ok(p: &[u8], ip_len: usize) -> bool {
        let t = super::ip::tcp_of(p).expect("a TCP segment");
        assert_eq!(t.ip_len, ip_len);
        super::ip::tcp_checksum_ok(p, &t)
    }

    pub fn udp_checksum_ok(p: &[u8], ip_len: usize, v6: bool) -> bool {
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

    /// A UDP datagram from 10.0.0.1:5000 to 10.0.0.2:`dport` (or fd99::1 to fd99::2) with
    /// valid checksums; IPv4 ID `id`, DF set.
    pub fn dgram(v6: bool, id: u16, dport: u16, payload: &[u8]) -> Vec<u8> {
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
        let pseudo = fix_ip(&mut p, v6, ip_len, total, None, smoltcp::wire::IpProtocol::Udp);
        p[ip_len + 4..ip_len + 6].copy_from_slice(&((total - ip_len) as u16).to_be_bytes());
        let c = !fold(sum16(pseudo, &p[ip_len..]));
        p[ip_len + 6..ip_len + 8].copy_from_slice(&c.to_be_bytes());
        p
    }
}
