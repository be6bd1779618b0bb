//! The stack's network device, as smoltcp sees it (`phy::Device`, IP medium: no link layer):
//! received packets are those the plane delivered, and transmitted ones go to the plane's
//! reader, each in a buffer with the room sealing needs around it.
//!
//! The device offers TCP segmentation offload: smoltcp hands over up to 64 KB of a stream
//! in one packet, which [`crate::packet::segment`] splits into wire-sized segments (as it does
//! TUN's TSO packets), so that the stack's per-segment work is done once per 64 KB.

use crate::host::wakeup::Inbox;
use crate::packet::ip::{fix_ip, fix_tcp, ip_header, tcp_header_len, TCP_CHECKSUM_AT, TCP_HEADER_LEN};
use crate::packet::segment::segment_tso;
use crate::packet::{Offload, PartialChecksum, Segmentation};
use crate::port::{buffers, PacketBuf};
use smoltcp::phy::{self, Checksum, DeviceCapabilities, Medium, PacketMeta};
use smoltcp::time::Instant;
use smoltcp::wire::IpProtocol;
use std::collections::VecDeque;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

/// The packets between the plane and the stack, and what their passing counts.
pub struct Wires {
    /// Packets the plane delivered, for the stack's next turn.
    pub to_stack: Inbox<PacketBuf>,
    /// Packets the stack made, for the plane's reader (the port's queue 0).
    pub to_plane: Inbox<PacketBuf>,
    pub packets_in: AtomicU64,
    pub packets_out: AtomicU64,
    /// Applications' datagrams the stack did not carry, by reason.
    pub datagram_drops: super::datagram::DatagramDrops,
    /// Delivered TCP segments dropped for a wrong checksum.
    pub bad_checksums: AtomicU64,
    /// Delivered TCP segments that went into a merged packet.
    pub segments_merged: AtomicU64,
}

/// smoltcp's view of [`Wires`]: a batch of delivered packets taken from the inbox at a time.
pub struct Link {
    pub wires: Arc<Wires>,
    pub mtu: usize,
    pending: VecDeque<PacketBuf>,
    taken: Vec<PacketBuf>,
}

/// Delivered packets taken from the inbox per turn of the stack.
const RX_BATCH: usize = 256;

impl Link {
    pub fn new(wires: Arc<Wires>, mtu: usize) -> Link {
        Link {
            wires,
            mtu,
            pending: VecDeque::new(),
            taken: Vec::new(),
        }
    }

    /// Moves what the plane delivered into the link's receive queue.
    pub fn take_delivered(&mut self) {
        self.wires.to_stack.take(&mut self.taken, RX_BATCH);
        self.pending.extend(self.taken.drain(..));
    }
}

/// The largest packet smoltcp may hand over for segmentation.
const TSO_MAX: usize = 65535;

pub struct Rx(PacketBuf);
pub struct Tx<'a> {
    wires: &'a Wires,
    /// The segment size smoltcp asks for, when the packet is to be segmented.
    segment_size: Option<u16>,
}

impl<'a> Tx<'a> {
    fn new(wires: &'a Wires) -> Tx<'a> {
        Tx {
            wires,
            segment_size: None,
        }
    }

    fn push(&self, p: PacketBuf) {
        // A full inbox drops the packet, counted there; TCP sends it again.
        if self.wires.to_plane.push(p) {
            self.wires.packets_out.fetch_add(1, Ordering::Relaxed);
        }
    }
}

/// The offload of a TCP packet smoltcp asked to have cut into `mss`-byte segments (the
/// transport header starts after the IP header; its checksum is recomputed per segment).
fn tcp_offload(p: &[u8], mss: u16) -> Option<Offload> {
    let ip = ip_header(p).filter(|ip| ip.protocol == IpProtocol::Tcp)?;
    let tcp_len = tcp_header_len(&p[ip.header_len..])?;
    Some(Offload {
        segmentation: if ip.v6 { Segmentation::Tcp6 } else { Segmentation::Tcp4 },
        header_len: u16::try_from(ip.header_len + tcp_len).ok()?,
        segment_size: mss,
        checksum: Some(PartialChecksum {
            start: u16::try_from(ip.header_len).ok()?,
            offset: TCP_CHECKSUM_AT as u16,
        }),
    })
}

impl phy::RxToken for Rx {
    fn consume<R, F: FnOnce(&[u8]) -> R>(self, f: F) -> R {
        let r = f(self.0.packet());
        buffers::give([self.0]);
        r
    }
}

/// Computes the TCP checksum of a packet smoltcp made without it (the device offers
/// checksum offload, which segmentation offload requires); other packets are left alone.
pub(super) fn tcp_checksum(p: &mut [u8]) {
    let Some(ip) = ip_header(p).filter(|ip| ip.protocol == IpProtocol::Tcp) else {
        return;
    };
    if p.len() < ip.header_len + TCP_HEADER_LEN {
        return;
    }
    let total = p.len();
    let pseudo = fix_ip(p, ip.v6, ip.header_len, total, None, IpProtocol::Tcp);
    fix_tcp(&mut p[ip.header_len..], pseudo);
}

impl phy::TxToken for Tx<'_> {
    fn consume<R, F: FnOnce(&mut [u8]) -> R>(self, len: usize, f: F) -> R {
        let mut p = PacketBuf::zeroed(len);
        let r = f(p.packet_mut());
        let offload = self.segment_size.and_then(|mss| tcp_offload(p.packet(), mss));
        match offload {
            Some(o) => {
                let mut segments = Vec::new();
                // A packet that does not match its offload (which smoltcp does not make) is
                // dropped whole: TCP sends it again.
                segment_tso(o, p.packet(), &mut segments);
                buffers::give([p]);
                for s in segments {
                    self.push(s);
                }
            }
            None => {
                tcp_checksum(p.packet_mut());
                self.push(p);
            }
        }
        r
    }

    fn set_meta(&mut self, meta: PacketMeta) {
        self.segment_size = meta.segmentation_offload_size.map(|s| s.get());
    }
}

impl phy::Device for Link {
    type RxToken<'a> = Rx;
    type TxToken<'a> = Tx<'a>;

    fn receive(&mut self, _now: Instant) -> Option<(Rx, Tx<'_>)> {
        let p = self.pending.pop_front()?;
        self.wires.packets_in.fetch_add(1, Ordering::Relaxed);
        Some((Rx(p), Tx::new(&self.wires)))
    }

    fn transmit(&mut self, _now: Instant) -> Option<Tx<'_>> {
        Some(Tx::new(&self.wires))
    }

    fn capabilities(&self) -> DeviceCapabilities {
        let mut caps = DeviceCapabilities::default();
        caps.medium = Medium::Ip;
        caps.max_transmission_unit = self.mtu;
        // Packets from the plane were authenticated by the tunnel, but a peer may still
        // forward a corrupt one: checksums are verified on receive, computed on send.
        caps.checksum.ipv4 = Checksum::Both;
        // TCP's are verified by the port before it merges segments (`StackPort::write`), and
        // computed here on send, which segmentation offload requires.
        caps.checksum.tcp = Checksum::None;
        caps.segmentation.tcpv4 = std::num::NonZeroUsize::new(TSO_MAX);
        caps.segmentation.tcpv6 = std::num::NonZeroUsize::new(TSO_MAX);
        caps
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::packet::fixtures::{seg, tcp_checksum_ok, TCP_ACK};

    #[test]
    fn tcp_packets_leave_with_their_checksum_and_others_untouched() {
        let mut p = seg(1000, b"some payload", TCP_ACK);
        p[36..38].fill(0);
        assert!(!tcp_checksum_ok(&p, 20));
        tcp_checksum(&mut p);
        assert!(tcp_checksum_ok(&p, 20));
        let mut udp = p.clone();
        udp[9] = 17;
        let before = udp.clone();
        tcp_checksum(&mut udp);
        assert_eq!(udp, before, "not TCP: left alone");
        tcp_checksum(&mut [0x45, 0, 0]);
    }

    #[test]
    fn a_large_segment_is_cut_at_the_mss_smoltcp_asked_for() {
        let payload: Vec<u8> = (0..5000u32).map(|i| i as u8).collect();
        let big = seg(7, &payload, TCP_ACK);
        let o = tcp_offload(&big, 1380).expect("an IPv4 TCP packet");
        let mut out = Vec::new();
        assert!(segment_tso(o, &big, &mut out));
        assert_eq!(out.len(), 4);
        let mut joined = Vec::new();
        for s in &out {
            let p = s.packet();
            assert!(tcp_checksum_ok(p, 20));
            joined.extend_from_slice(&p[40..]);
        }
        assert_eq!(joined, payload);
        assert_eq!(tcp_offload(&[0x60, 0, 0], 1380), None);
    }
}
