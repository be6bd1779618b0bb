//! The data plane's two sides, as traits. The **outer port** carries WireGuard messages to and
//! from peers (kernel UDP sockets, AF_XDP); the **inner port** carries the tunnel's IP packets
//! to and from this host (a TUN device, a user-space TCP/IP stack). The plane is generic over
//! both, so a new kind of I/O is one folder under `outer/` or `inner/` and one line where the
//! device is composed.
//!
//! This module makes no system call and knows no backend: it holds the contracts and the
//! types that cross them. Both sides have **queues**: a peer's packets go through its queue's
//! half of each port, whichever thread handles them (see `placement`), so that a flow stays on
//! one queue end to end. Each receive half names the descriptor its thread waits on, a real
//! one or an eventfd for a backend without one, so that one thread can wait on an outer and
//! an inner half together.

pub mod buffers;
pub mod chosen;

pub use buffers::PacketBuf;

use std::io;
use std::net::SocketAddr;
use std::os::fd::RawFd;
use std::time::Duration;

pub use ordo_proto::steering::SteeringException;

/// Packets per receive or read system call, and per work item: kernel UDP's recvmmsg batch.
pub const BATCH: usize = ordo_udp::BATCH;
/// Largest datagram or inner packet handled.
pub const MAX_PACKET: usize = 65535;
/// Bytes in front of every inner packet's buffer: room for the data message's header, written
/// in place when the packet is sealed. Before a delivered packet they are spent, and the inner
/// port may write its own header there (TUN: the virtio-net header).
pub const HEADROOM: usize = ordo_proto::messages::DATA_HEADER_LEN;
/// Bytes a buffer keeps free behind an inner packet for the padding and tag sealing adds, so
/// that sealing never reallocates.
pub const TAILROOM: usize = 32;

/// Longest a receive half waits in [`OuterReceive::recv_waiting`], and a thread for its
/// descriptors, before it looks at its stop token again.
pub const RECEIVE_WAIT: Duration = Duration::from_secs(1);

/// A received outer datagram, whichever backend received it: with kernel UDP a slice of the
/// receive buffer it arrived in, not copied. Its source has one spelling per endpoint
/// (IPv4-mapped IPv6 is plain IPv4): the outer ports see to that.
pub use ordo_udp::Datagram;

/// One figure a port reports about itself, by the name `ordo show` and its JSON use.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Counter {
    pub name: &'static str,
    pub value: u64,
    pub kind: CounterKind,
}

/// Whether a figure counts events (it only grows) or says how things stand (an offload on
/// or off, how many sockets): metrics expose the one as a counter, the other as a gauge.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CounterKind {
    Count,
    Level,
}

impl Counter {
    /// A count of events since the port opened.
    pub fn new(name: &'static str, value: u64) -> Counter {
        Counter {
            name,
            value,
            kind: CounterKind::Count,
        }
    }

    /// How things stand now.
    pub fn level(name: &'static str, value: u64) -> Counter {
        Counter {
            name,
            value,
            kind: CounterKind::Level,
        }
    }
}

/// A peer's in-order run of accepted inner packets, as the inner port writes it, each in the
/// datagram it arrived in; the room before each is the port's to overwrite.
pub struct DeliveryRun<'a> {
    buffers: Vec<PacketBuf<&'a mut [u8]>>,
}

impl<'a> DeliveryRun<'a> {
    pub fn new(buffers: Vec<PacketBuf<&'a mut [u8]>>) -> Self {
        DeliveryRun { buffers }
    }

    pub fn len(&self) -> usize {
        self.buffers.len()
    }

    pub fn is_empty(&self) -> bool {
        self.buffers.is_empty()
    }

    /// Packet `i`.
    pub fn packet(&self, i: usize) -> &[u8] {
        self.buffers[i].packet()
    }

    /// Every packet, in order.
    pub fn packets(&self) -> impl Iterator<Item = &[u8]> {
        self.buffers.iter().map(|b| b.packet())
    }

    /// Packet `i` with the `room` bytes before it (at most [`HEADROOM`]), for a port that
    /// writes a header of its own in front.
    pub fn with_room(&mut self, i: usize, room: usize) -> &mut [u8] {
        self.buffers[i].with_room(room)
    }
}

/// The outer side: WireGuard messages to and from peers.
pub trait OuterPort: Send + Sync + 'static {
    type Receive: OuterReceive;

    /// The receive halves of `queue`, one per descriptor (the kernel UDP port has one per
    /// address family). Each is used by one thread.
    fn receivers(&self, queue: usize) -> Vec<Self::Receive>;

    /// Sends `payloads` to `to` from `queue`, in order; returns how many went out. A port
    /// counts its own failures.
    fn send(&self, queue: usize, to: SocketAddr, payloads: &[&[u8]]) -> usize;

    /// Steers these receiver indices to these queues, as exceptions to the rule of
    /// `ordo_proto::steering` (the indices of moved peers). Called each placement interval
    /// with the full list; a port without steering ignores it.
    fn steer(&self, _exceptions: &[SteeringException]) {}

    /// What the port counts about itself (errors, drops, offloads in use).
    fn counters(&self) -> Vec<Counter> {
        Vec::new()
    }

    /// The UDP port it listens on (0: none).
    fn listen_port(&self) -> u16 {
        0
    }

    /// Listens on `port` instead (0: any free port), its sockets marked `fwmark`; the waiting
    /// halves move to the new sockets. On failure the old ones stay.
    fn rebind(&self, _port: u16, _fwmark: u32) -> io::Result<()> {
        Err(io::Error::new(
            io::ErrorKind::Unsupported,
            "this outer port has no listen port",
        ))
    }

    /// Marks every socket `mark`, or, if one cannot be, none: those marked already go back to
    /// `old`. A port without sockets has nothing to mark.
    fn set_fwmark(&self, _mark: u32, _old: u32) -> io::Result<()> {
        Ok(())
    }

    /// Wakes every half waiting on the port, for good: the plane is stopping.
    fn shutdown(&self) {}

    /// Which path it is, as `ordo show` says it: `udp`, or `xdp on` each interface and mode.
    fn describe(&self) -> String;
}

/// One receive half of an outer port.
pub trait OuterReceive: Send + 'static {
    /// The descriptor to wait on, readable when datagrams wait (None: nothing to wait on
    /// now). Asked each turn: a port may replace its descriptors, as the kernel UDP port does
    /// when the listen port changes.
    fn wait_fd(&mut self) -> Option<RawFd>;

    /// Appends what is waiting, up to a batch, without blocking; returns how many datagrams
    /// were dropped as too long. Nothing waiting is no error.
    fn recv(&mut self, out: &mut Vec<Datagram>) -> io::Result<usize>;

    /// As [`OuterReceive::recv`], but when nothing waits, waits for the first datagram, at
    /// most [`RECEIVE_WAIT`] (then returns with nothing) or until the port shuts down. For a
    /// thread that reads this half alone: a backend that can wait inside its receive call
    /// (kernel UDP: recvmmsg with MSG_WAITFORONE) spares it a wait call per turn.
    fn recv_waiting(&mut self, out: &mut Vec<Datagram>) -> io::Result<usize>;
}

/// The inner side: the tunnel's IP packets to and from this host.
pub trait InnerPort: Send + Sync + 'static {
    type Read: InnerRead;

    /// The read half of `queue`, used by one thread.
    fn reader(&self, queue: usize) -> Self::Read;

    /// Writes a peer's run of accepted packets to `queue`, in order. A port counts its own
    /// failures.
    fn write(&self, queue: usize, run: &mut DeliveryRun<'_>);

    /// The MTU the host set on the inner side, which the plane follows (None: it has none).
    fn mtu(&self) -> Option<usize> {
        None
    }

    /// What the port counts about itself.
    fn counters(&self) -> Vec<Counter> {
        Vec::new()
    }

    /// Ends its read halves' waits, for good: the plane is stopping (their reads then fail).
    fn shutdown(&self) {}
}

/// The read half of an inner port's queue.
pub trait InnerRead: Send + 'static {
    /// The descriptor to wait on, readable when packets wait.
    fn wait_fd(&mut self) -> Option<RawFd>;

    /// Appends up to `max` packets without blocking, each in a buffer of its own. An error
    /// means the inner side is gone for good.
    fn read(&mut self, out: &mut Vec<PacketBuf>, max: usize) -> io::Result<()>;
}
