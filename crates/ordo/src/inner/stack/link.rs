//! The stack's network device, as smoltcp sees it (`phy::Device`, IP medium: no link layer):
//! received packets are those the plane delivered, and transmitted ones go to the plane's
//! reader, each in a buffer with the room sealing needs around it.

use crate::host::wakeup::Inbox;
use crate::port::{buffers, HEADROOM, TAILROOM};
use smoltcp::phy::{self, Checksum, DeviceCapabilities, Medium};
use smoltcp::time::Instant;
use std::collections::VecDeque;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

/// The packets between the plane and the stack, and what their passing counts.
pub struct Wires {
    /// Packets the plane delivered, for the stack's thread.
    pub to_stack: Inbox<Vec<u8>>,
    /// Packets the stack made, for the plane's reader (the port's queue 0).
    pub to_plane: Inbox<Vec<u8>>,
    pub packets_in: AtomicU64,
    pub packets_out: AtomicU64,
}

/// smoltcp's view of [`Wires`]: a batch of delivered packets taken from the inbox at a time.
pub struct Link {
    pub wires: Arc<Wires>,
    pub mtu: usize,
    pending: VecDeque<Vec<u8>>,
    taken: Vec<Vec<u8>>,
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

pub struct Rx(Vec<u8>);
pub struct Tx<'a>(&'a Wires);

impl phy::RxToken for Rx {
    fn consume<R, F: FnOnce(&[u8]) -> R>(self, f: F) -> R {
        let r = f(&self.0);
        buffers::give([self.0]);
        r
    }
}

impl phy::TxToken for Tx<'_> {
    fn consume<R, F: FnOnce(&mut [u8]) -> R>(self, len: usize, f: F) -> R {
        let mut p = buffers::take(HEADROOM + len + TAILROOM);
        p.resize(HEADROOM + len, 0);
        let r = f(&mut p[HEADROOM..]);
        // A full inbox drops the packet, counted there; TCP sends it again.
        if self.0.to_plane.push(p) {
            self.0.packets_out.fetch_add(1, Ordering::Relaxed);
        }
        r
    }
}

impl phy::Device for Link {
    type RxToken<'a> = Rx;
    type TxToken<'a> = Tx<'a>;

    fn receive(&mut self, _now: Instant) -> Option<(Rx, Tx<'_>)> {
        let p = self.pending.pop_front()?;
        self.wires.packets_in.fetch_add(1, Ordering::Relaxed);
        Some((Rx(p), Tx(&self.wires)))
    }

    fn transmit(&mut self, _now: Instant) -> Option<Tx<'_>> {
        Some(Tx(&self.wires))
    }

    fn capabilities(&self) -> DeviceCapabilities {
        let mut caps = DeviceCapabilities::default();
        caps.medium = Medium::Ip;
        caps.max_transmission_unit = self.mtu;
        // Packets from the plane were authenticated by the tunnel, but a peer may still
        // forward a corrupt one: verify checksums on receive, compute them on send.
        caps.checksum.ipv4 = Checksum::Both;
        caps
    }
}
