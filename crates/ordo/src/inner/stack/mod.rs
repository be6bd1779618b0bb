//! The inner port over Ordo's own TCP/IP stack (smoltcp): no TUN device, no root. The
//! tunnel's packets end in a stack inside this process, and applications reach it through
//! the attach service ([`service`]): the preload library (`crates/ordo-preload`) hands it
//! their connections to tunnel destinations.
//!
//! Threads: the stack has none of its own. The plane's thread that reads the port's queue 0
//! (a queue thread in the inline and auto models, the read stage in the pool models) runs
//! it: each read is a turn of the stack ([`service::Stack::turn`]) that moves what
//! applications wrote into the stack and what the stack made out to the plane, and the
//! queue's descriptor to wait on is the stack's readiness ([`readiness`]): the plane's
//! deliveries, the applications' sockets, the stack's timers. So the stack runs where
//! Ordo's placement puts that thread, and nothing is handed between threads on the way
//! out. The plane's deliveries (from whichever thread decrypted them) go through an inbox
//! ([`link::Wires`]), each run of one flow's TCP segments merged into one packet.

pub mod admission;
pub mod datagram;
pub mod link;
pub mod readiness;
pub mod service;
pub mod settings;
pub mod unix;

pub use settings::{Attachers, Guests, StackSettings};

use crate::host::wakeup::Inbox;
use crate::packet::coalesce::{self, coalesced_header, Coalesced};
use crate::packet::ip::{tcp_checksum_ok, tcp_of};
use crate::port::{Counter, DeliveryRun, InnerPort, InnerRead, PacketBuf};
use link::Wires;
use service::Stack;
use std::io;
use std::os::fd::RawFd;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

/// Packets each direction holds between the plane and the stack.
const INBOX: usize = 4096;

pub struct StackPort {
    stack: Arc<Stack>,
    /// Read halves of queues other than 0: the stack writes everything to queue 0, so these
    /// never have anything (one inbox each, so each reader has a descriptor to wait on).
    idle: Vec<Arc<Inbox<PacketBuf>>>,
    mtu: usize,
}

impl StackPort {
    /// The port, and the stack its service runs (see [`service::Service::start`]).
    pub fn new(queues: usize, mtu: usize) -> io::Result<(StackPort, Arc<Stack>)> {
        let wires = Arc::new(Wires {
            to_stack: Inbox::new(INBOX)?,
            to_plane: Inbox::new(INBOX)?,
            packets_in: AtomicU64::new(0),
            packets_out: AtomicU64::new(0),
            datagram_drops: Default::default(),
            bad_checksums: AtomicU64::new(0),
            segments_merged: AtomicU64::new(0),
        });
        let stack = Arc::new(Stack::new(wires)?);
        let idle = (1..queues.max(1))
            .map(|_| Inbox::new(1).map(Arc::new))
            .collect::<io::Result<_>>()?;
        let port = StackPort {
            stack: stack.clone(),
            idle,
            mtu,
        };
        Ok((port, stack))
    }
}

impl InnerPort for StackPort {
    type Read = StackRead;

    /// The plane's side goes away: its readers fail.
    fn shutdown(&self) {
        self.stack.wires.to_plane.close();
        self.idle.iter().for_each(|i| i.close());
    }

    fn reader(&self, queue: usize) -> StackRead {
        StackRead {
            stack: self.stack.clone(),
            idle: queue.checked_sub(1).and_then(|i| self.idle.get(i)).cloned(),
        }
    }

    /// Runs of one TCP flow's segments are merged into one packet (receive offload, as
    /// the TUN port hands the kernel): smoltcp's work per packet is then done once per run,
    /// and the copy into the inbox, which each packet needed anyway, builds the merged one.
    /// TCP checksums are verified here, with the wide sum, rather than by smoltcp; a segment
    /// whose header the merge cannot read (IPv4 options, IPv6 extension headers) goes to
    /// smoltcp unverified, as kernel WireGuard leaves every decrypted packet.
    fn write(&self, _queue: usize, run: &mut DeliveryRun<'_>) {
        let wires = &self.stack.wires;
        let packets: Vec<&[u8]> = run
            .packets()
            .filter(|p| {
                let ok = tcp_of(p).is_none_or(|t| tcp_checksum_ok(p, &t));
                if !ok {
                    wires.bad_checksums.fetch_add(1, Ordering::Relaxed);
                }
                ok
            })
            .collect();
        for w in coalesce::plan(&packets, false) {
            let packet = match w {
                coalesce::Write::Single(i) => PacketBuf::copy_of(packets[i]),
                coalesce::Write::Coalesced(a, b) => {
                    wires.segments_merged.fetch_add((b - a) as u64, Ordering::Relaxed);
                    merge(&packets[a..b])
                }
            };
            // A full inbox drops the packet, counted there (drop_stack_inbox_full).
            wires.to_stack.push(packet);
        }
    }

    fn mtu(&self) -> Option<usize> {
        Some(self.mtu)
    }

    fn counters(&self) -> Vec<Counter> {
        let wires = &self.stack.wires;
        vec![
            Counter::new("stack_packets_in", wires.packets_in.load(Ordering::Relaxed)),
            Counter::new("stack_packets_out", wires.packets_out.load(Ordering::Relaxed)),
            Counter::new("stack_segments_merged", wires.segments_merged.load(Ordering::Relaxed)),
            Counter::new("drop_stack_bad_checksum", wires.bad_checksums.load(Ordering::Relaxed)),
            Counter::new(
                "drop_stack_inbox_full",
                wires.to_stack.overflows.load(Ordering::Relaxed),
            ),
            Counter::new(
                "drop_stack_outbox_full",
                wires.to_plane.overflows.load(Ordering::Relaxed),
            ),
            Counter::new(
                "drop_stack_datagram_queue_full",
                wires.datagram_drops.queue_full.load(Ordering::Relaxed),
            ),
            Counter::new(
                "drop_stack_datagram_too_big",
                wires.datagram_drops.too_big.load(Ordering::Relaxed),
            ),
            Counter::new(
                "drop_stack_datagram_no_destination",
                wires.datagram_drops.no_destination.load(Ordering::Relaxed),
            ),
            Counter::new(
                "drop_stack_datagram_malformed",
                wires.datagram_drops.malformed.load(Ordering::Relaxed),
            ),
        ]
    }
}

/// One packet of a run of segments [`coalesce::plan`] found: the first's headers, fixed for
/// the whole, and every payload. Its TCP checksum is left as the pseudo-header's partial
/// sum: the segments' were verified, and smoltcp does not look.
fn merge(segments: &[&[u8]]) -> PacketBuf {
    let Coalesced { offload, head } = coalesced_header(segments);
    let from = usize::from(offload.header_len);
    let total = head.len() + segments.iter().map(|s| s.len() - from).sum::<usize>();
    let mut packet = PacketBuf::with_capacity(total);
    packet.push(&head);
    for s in segments {
        packet.push(&s[from..]);
    }
    packet
}

/// A queue's read half: queue 0 runs the stack and reads what it sent; the others wait on an
/// inbox that stays empty until the port closes.
pub struct StackRead {
    stack: Arc<Stack>,
    idle: Option<Arc<Inbox<PacketBuf>>>,
}

impl InnerRead for StackRead {
    fn wait_fd(&mut self) -> Option<RawFd> {
        Some(match &self.idle {
            Some(idle) => idle.fd(),
            None => self.stack.wait_fd(),
        })
    }

    fn read(&mut self, out: &mut Vec<PacketBuf>, max: usize) -> io::Result<()> {
        let to_plane = &self.stack.wires.to_plane;
        if to_plane.is_closed() {
            return Err(io::Error::new(io::ErrorKind::BrokenPipe, "the stack was closed"));
        }
        if self.idle.is_some() {
            return Ok(());
        }
        // What an earlier turn made beyond the last read's room goes first; a turn only once
        // that is out, so that the stack takes no more from applications than the plane
        // takes from it.
        let from = out.len();
        to_plane.take(out, max);
        if out.len() - from < max {
            self.stack.turn();
            to_plane.take(out, max - (out.len() - from));
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::packet::fixtures::{seg, TCP_ACK, TCP_PSH};
    use crate::port::HEADROOM;

    fn checksummed(mut p: Vec<u8>) -> Vec<u8> {
        link::tcp_checksum(&mut p);
        p
    }

    /// Delivers `packets` to the port as one run and returns what reached the stack.
    fn deliver(port: &StackPort, packets: &[Vec<u8>]) -> Vec<Vec<u8>> {
        let mut buffers: Vec<Vec<u8>> = packets
            .iter()
            .map(|p| [vec![0; HEADROOM], p.clone()].concat())
            .collect();
        let mut run = DeliveryRun::new(buffers.iter_mut().map(|b| PacketBuf::borrowed(b)).collect());
        port.write(0, &mut run);
        let mut out = Vec::new();
        port.stack.wires.to_stack.take(&mut out, 64);
        out.iter().map(|p| p.packet().to_vec()).collect()
    }

    fn counter(port: &StackPort, name: &str) -> u64 {
        port.counters()
            .iter()
            .find(|c| c.name == name)
            .map(|c| c.value)
            .unwrap()
    }

    #[test]
    fn a_run_of_segments_reaches_the_stack_as_one_packet_and_a_corrupt_one_not_at_all() {
        let (port, _stack) = StackPort::new(1, 1420).unwrap();
        let a = checksummed(seg(1000, &[1; 100], TCP_ACK));
        let b = checksummed(seg(1100, &[2; 100], TCP_ACK));
        let c = checksummed(seg(1200, &[3; 60], TCP_ACK | TCP_PSH));
        let mut corrupt = checksummed(seg(1260, &[4; 100], TCP_ACK));
        corrupt[70] ^= 1;
        let gap = checksummed(seg(9000, &[5; 100], TCP_ACK));
        let got = deliver(&port, &[a, b, corrupt, c, gap.clone()]);

        assert_eq!(got.len(), 2, "the three in order merged, the one after a gap alone");
        let merged = tcp_of(&got[0]).expect("a TCP packet whose lengths add up");
        assert_eq!(merged.seq, 1000);
        assert!(merged.flags.ack && merged.flags.psh, "the last segment's PSH");
        let payload = &got[0][merged.hdr_len..];
        assert_eq!(payload, [[1u8; 100].as_slice(), &[2; 100], &[3; 60]].concat());
        assert_eq!(got[1], gap);
        assert_eq!(counter(&port, "stack_segments_merged"), 3);
        assert_eq!(counter(&port, "drop_stack_bad_checksum"), 1);
    }

    #[test]
    fn packets_that_are_not_tcp_segments_pass_as_they_are() {
        let (port, _stack) = StackPort::new(1, 1420).unwrap();
        let udp = crate::packet::fixtures::dgram(false, 7, 53, b"a question");
        let not_ip = vec![0x00, 0x01, 0x02];
        let got = deliver(&port, &[udp.clone(), not_ip.clone()]);
        assert_eq!(got, [udp, not_ip]);
        assert_eq!(counter(&port, "drop_stack_bad_checksum"), 0);
    }
}
