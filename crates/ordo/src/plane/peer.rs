//! Each peer's part of the data plane: its two lanes and the batches that go through them,
//! where its work runs (queue, pool, spread), and the packet counts its load is measured from.
//! The placement policy (`crate::placement`) decides from these figures; the plane applies
//! what it decides here.

use super::lane::Lane;
use ordo_proto::session::Session;
use ordo_proto::PeerId;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::{Duration, Instant};

pub struct PeerPlane {
    pub id: PeerId,
    pub inbound: Lane<InboundBatch>,
    pub outbound: Lane<OutboundBatch>,
    /// Index of the pool (in the plan's order) that does this peer's crypto.
    pub pool: AtomicUsize,
    /// The peer's queue (the core's `Peer::queue`, copied at each dispatch): deliveries
    /// write to its TUN queue and send from its sockets, whichever thread runs them.
    pub queue: AtomicUsize,
    /// The crypto goes to the pool rather than staying on the receiving queue.
    pub spread: AtomicBool,
    /// Data packets dispatched for the peer, each way.
    pub rx_packets: AtomicU64,
    pub tx_packets: AtomicU64,
    pub(crate) load: Mutex<Load>,
    /// Threaded model: rings the peer's delivery thread.
    pub(crate) doorbell: OnceLock<crossbeam_channel::Sender<()>>,
}

/// What one core spends on a packet's whole path when it runs to completion, each way (the
/// stages' busy time over their packets).
#[derive(Debug, Default, Clone, Copy)]
pub struct PacketCost {
    pub inbound_ns: f64,
    pub outbound_ns: f64,
}

#[derive(Default, Clone, Copy)]
pub struct Load {
    last_rx: u64,
    last_tx: u64,
    /// Packets per second, both ways, over the last interval.
    pub pps: f64,
    /// Cores of crypto the peer needed over the last interval.
    pub cores: f64,
    /// When `spread` last changed.
    pub changed: Option<Instant>,
    /// When the peer last moved to another queue.
    pub moved: Option<Instant>,
}

impl PeerPlane {
    pub fn new(id: PeerId, pool: usize, spread: bool) -> PeerPlane {
        PeerPlane {
            id,
            inbound: Lane::default(),
            outbound: Lane::default(),
            pool: AtomicUsize::new(pool),
            queue: AtomicUsize::new(0),
            spread: AtomicBool::new(spread),
            rx_packets: AtomicU64::new(0),
            tx_packets: AtomicU64::new(0),
            load: Mutex::new(Load::default()),
            doorbell: OnceLock::new(),
        }
    }

    pub fn load(&self) -> Load {
        *self.load.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Measures the last interval, at `cost` per packet.
    pub fn measure(&self, elapsed: Duration, cost: PacketCost) -> Load {
        let (rx, tx) = (
            self.rx_packets.load(Ordering::Relaxed),
            self.tx_packets.load(Ordering::Relaxed),
        );
        let mut l = self.load.lock().unwrap_or_else(|p| p.into_inner());
        let secs = elapsed.as_secs_f64().max(1e-3);
        let (drx, dtx) = ((rx - l.last_rx) as f64, (tx - l.last_tx) as f64);
        l.pps = (drx + dtx) / secs;
        l.cores = (drx * cost.inbound_ns + dtx * cost.outbound_ns) / 1e9 / secs;
        (l.last_rx, l.last_tx) = (rx, tx);
        *l
    }

    pub(crate) fn set_spread(&self, spread: bool, now: Instant) {
        self.spread.store(spread, Ordering::Relaxed);
        self.load.lock().unwrap_or_else(|p| p.into_inner()).changed = Some(now);
    }
}

pub struct InboundPacket {
    /// The data message, decrypted in place (its buffer is shared with the datagrams that
    /// arrived in the same receive; see the outer port's receive half).
    pub data: bytes::BytesMut,
    pub src: SocketAddr,
    /// Set by the crypto: what opened, or None if it did not.
    pub opened: Option<Opened>,
}

/// A data message that opened: its counter and the length of its (padded) plaintext.
#[derive(Clone, Copy, Debug)]
pub struct Opened {
    pub counter: u64,
    pub len: usize,
}

/// Data messages of one peer, on one session, in arrival order.
pub struct InboundBatch {
    pub peer: Arc<PeerPlane>,
    pub session: Arc<Session>,
    pub ticket: u64,
    pub packets: Vec<InboundPacket>,
}

/// Packets for one peer, sealed with consecutive counters from `first_counter`: each
/// buffer's room takes the data message's header, and once sealed it holds the message.
pub struct OutboundBatch {
    pub peer: Arc<PeerPlane>,
    pub session: Arc<Session>,
    pub ticket: u64,
    pub to: SocketAddr,
    pub mtu: usize,
    pub first_counter: u64,
    pub packets: Vec<crate::port::PacketBuf>,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn load_is_measured_in_cores() {
        let p = PeerPlane::new(PeerId(1), 0, false);
        p.rx_packets.store(100_000, Ordering::Relaxed);
        p.tx_packets.store(50_000, Ordering::Relaxed);
        // 100k packets at 2 us and 50k at 4 us in one second: 0.4 cores.
        let cost = PacketCost {
            inbound_ns: 2000.0,
            outbound_ns: 4000.0,
        };
        let l = p.measure(Duration::from_secs(1), cost);
        assert!((l.cores - 0.4).abs() < 1e-9, "{}", l.cores);
        assert!((l.pps - 150_000.0).abs() < 1e-6);
        let l = p.measure(Duration::from_secs(1), cost);
        assert_eq!(l.cores, 0.0, "nothing new in the second interval");
    }
}
