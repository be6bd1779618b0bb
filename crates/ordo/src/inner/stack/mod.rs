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
//! ([`link::Wires`]).

pub mod datagram;
pub mod link;
pub mod readiness;
pub mod service;
pub mod settings;
pub mod unix;

pub use settings::{Attachers, Guests, StackSettings};

use crate::host::wakeup::Inbox;
use crate::port::{buffers, Counter, DeliveryRun, InnerPort, InnerRead};
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
    idle: Vec<Arc<Inbox<Vec<u8>>>>,
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

    /// The plane's side goes away: its readers fail.
    pub fn close(&self) {
        self.stack.wires.to_plane.close();
        self.idle.iter().for_each(|i| i.close());
    }
}

impl InnerPort for StackPort {
    type Read = StackRead;

    fn reader(&self, queue: usize) -> StackRead {
        StackRead {
            stack: self.stack.clone(),
            idle: queue.checked_sub(1).and_then(|i| self.idle.get(i)).cloned(),
        }
    }

    fn write(&self, _queue: usize, run: &mut DeliveryRun<'_>) {
        for p in run.packets() {
            let mut copy = buffers::take(p.len());
            copy.extend_from_slice(p);
            // A full inbox drops the packet, counted there (drop_stack_inbox_full).
            self.stack.wires.to_stack.push(copy);
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

/// A queue's read half: queue 0 runs the stack and reads what it sent; the others wait on an
/// inbox that stays empty until the port closes.
pub struct StackRead {
    stack: Arc<Stack>,
    idle: Option<Arc<Inbox<Vec<u8>>>>,
}

impl InnerRead for StackRead {
    fn wait_fd(&mut self) -> Option<RawFd> {
        Some(match &self.idle {
            Some(idle) => idle.fd(),
            None => self.stack.wait_fd(),
        })
    }

    fn read(&mut self, out: &mut Vec<Vec<u8>>, max: usize) -> io::Result<()> {
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
