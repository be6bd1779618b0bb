//! The pool execution model: a fixed pool of workers, one per allowed core, all in the same
//! scheduling class, does the crypto of every peer; each peer's batches are delivered in
//! order through its [`Lane`]s by whichever worker finishes a lane's head.
//!
//! ```text
//!  UDP ─recvmmsg─▶ [receive] ─ticket, batch per peer─▶ ┐                ┌─▶ deliver inbound ─▶ TUN
//!                                                      ├─▶ [workers] ───┤   (in order, by the
//!  TUN ──read────▶ [read] ───ticket, batch per peer──▶ ┘   open / seal  └─▶ deliver outbound ─▶ UDP
//!                                                                           head's finisher)
//! ```
//!
//! The protocol core's lock is taken once per batch, for lookups before the crypto and for the
//! in-order bookkeeping after it (replay window, timers, roaming), never during the crypto.

use super::batch::Datagram;
use super::lane::{Finish, Lane};
use super::stats::{Stage, Stats, ThreadStats};
use ordo_proto::messages::{self, Kind, DATA_HEADER_LEN};
use ordo_proto::session::Session;
use ordo_proto::{Accepted, DropReason, Interface, Opened, PeerId, Transmit};
use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Instant, SystemTime};

/// Where the data plane's packets go: the kernel (TUN device and UDP sockets, see
/// `kernel.rs`) or memory (`ordo bench`). Reading is the caller's: it hands batches to
/// [`DataPlane::dispatch_inbound`] and [`DataPlane::dispatch_outbound`].
pub trait Io: Send + Sync + Sized + 'static {
    /// Writes the accepted inner packets of a delivery run, in order: `accepted` lists
    /// (batch, packet, length), the packet being at `DATA_HEADER_LEN..` of its buffer.
    fn write_inner(&self, plane: &DataPlane<Self>, run: &mut [InboundBatch], accepted: &[(usize, usize, usize)]);
    /// Sends messages to `to`; returns how many went out.
    fn send_outer(&self, to: SocketAddr, payloads: &[&[u8]]) -> usize;
}

/// Errors and figures of the I/O side, counted beside the core's drop reasons.
#[derive(Default)]
pub struct IoCounters {
    pub tun_write_errors: AtomicU64,
    pub udp_send_errors: AtomicU64,
    /// Writes to the TUN device, and packets that went in coalesced ones.
    pub tun_writes: AtomicU64,
    pub tun_coalesced_packets: AtomicU64,
}

/// The pool model's shared state: the protocol core, the peers' lanes, the counters.
pub struct DataPlane<I: Io> {
    core: Mutex<Interface>,
    lanes: Mutex<HashMap<PeerId, Arc<PeerLanes>>>,
    pub stats: Stats,
    pub counters: IoCounters,
    pub io: I,
    workers: usize,
}

/// Work items waiting for a worker; a full queue makes the dispatchers wait, so the kernel's
/// socket and TUN queues absorb (and count) the excess instead of our memory. A work item is
/// at most one receive batch (32 receives of up to 64 KB with GRO: 2 MB), so this bounds the
/// queue at about 128 MB in the worst case, and is still 32 batches per worker on 2 cores.
const JOB_QUEUE: usize = 64;

impl<I: Io> DataPlane<I> {
    /// `workers`: crypto threads; 0 means one per available core.
    pub fn new(core: Interface, io: I, workers: usize) -> Arc<Self> {
        let workers = if workers == 0 {
            std::thread::available_parallelism().map(|n| n.get()).unwrap_or(1)
        } else {
            workers
        };
        Arc::new(DataPlane {
            core: Mutex::new(core),
            lanes: Mutex::new(HashMap::new()),
            stats: Stats::default(),
            counters: IoCounters::default(),
            io,
            workers,
        })
    }

    /// Starts the worker pool; returns the queue that feeds it. The workers end when every
    /// sender is dropped.
    pub fn start_workers(self: &Arc<Self>) -> crossbeam_channel::Sender<Job> {
        let (tx, rx) = crossbeam_channel::bounded(JOB_QUEUE);
        for i in 0..self.workers {
            let (plane, rx) = (self.clone(), rx.clone());
            std::thread::Builder::new()
                .name(format!("ordo-worker{i}"))
                .spawn(move || worker(plane, rx, format!("worker{i}")))
                .expect("spawn");
        }
        tx
    }

    pub fn workers(&self) -> usize {
        self.workers
    }

    pub fn core(&self) -> MutexGuard<'_, Interface> {
        self.core.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The lanes of a peer, created on first use.
    pub fn lanes(&self, peer: PeerId) -> Arc<PeerLanes> {
        self.lanes
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .entry(peer)
            .or_default()
            .clone()
    }

    /// Forgets the lanes of peers the core no longer has.
    pub fn forget_removed_peers(&self, core: &Interface) {
        self.lanes
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .retain(|id, _| core.peer(*id).is_some());
    }

    /// Sends control messages (handshakes, cookies, keepalives).
    pub fn send_transmits(&self, transmits: Vec<Transmit>) {
        for t in transmits {
            if self.io.send_outer(t.to, &[&t.payload]) == 0 {
                self.counters.udp_send_errors.fetch_add(1, Ordering::Relaxed);
            }
        }
    }
}

/// Everything the core wants sent.
pub fn drain(core: &mut Interface) -> Vec<Transmit> {
    std::iter::from_fn(|| core.poll_transmit()).collect()
}

/// One peer's two lanes.
#[derive(Default)]
pub struct PeerLanes {
    pub inbound: Lane<InboundBatch>,
    pub outbound: Lane<OutboundBatch>,
}

pub struct InboundPacket {
    pub data: Vec<u8>,
    pub src: SocketAddr,
    /// Set by the worker: the counter and plaintext length, or None if it did not open.
    pub opened: Option<(u64, usize)>,
}

/// Data messages of one peer, on one session, in arrival order.
pub struct InboundBatch {
    pub peer: PeerId,
    pub session: Arc<Session>,
    pub lanes: Arc<PeerLanes>,
    pub ticket: u64,
    pub packets: Vec<InboundPacket>,
}

/// Packets for one peer, sealed with consecutive counters from `first_counter`. Each buffer
/// holds the packet at `DATA_HEADER_LEN..` and, once sealed, the whole message.
pub struct OutboundBatch {
    pub peer: PeerId,
    pub session: Arc<Session>,
    pub lanes: Arc<PeerLanes>,
    pub ticket: u64,
    pub to: SocketAddr,
    pub mtu: usize,
    pub first_counter: u64,
    pub packets: Vec<Vec<u8>>,
}

/// A work item: the per-peer batches of one dispatched batch. With many peers, one
/// item per peer would cost a queue hand-off per packet; one per dispatch keeps it per batch.
pub enum Job {
    Inbound(Vec<InboundBatch>),
    Outbound(Vec<OutboundBatch>),
}

/// A worker: crypto for any peer, then delivery for the lanes whose head it finished.
fn worker<I: Io>(plane: Arc<DataPlane<I>>, jobs: crossbeam_channel::Receiver<Job>, name: String) {
    let me = plane.stats.register_thread(&name);
    for job in jobs {
        match job {
            Job::Inbound(batches) => {
                for mut b in batches {
                    let start = Instant::now();
                    for p in &mut b.packets {
                        p.opened = b.session.open_in_place(&mut p.data).ok();
                    }
                    plane.stats.record(Stage::Decrypt, &me, b.packets.len(), start);
                    let (lanes, ticket) = (b.lanes.clone(), b.ticket);
                    if let Finish::Deliver(run) = lanes.inbound.finish(ticket, b) {
                        deliver_inbound(&plane, &lanes, run, &me);
                    }
                }
            }
            Job::Outbound(batches) => {
                for mut b in batches {
                    let start = Instant::now();
                    for (i, buf) in b.packets.iter_mut().enumerate() {
                        let len = buf.len() - DATA_HEADER_LEN;
                        let padded = ordo_proto::interface::padded_len(len, b.mtu);
                        buf.resize(DATA_HEADER_LEN + padded + ordo_proto::crypto::TAG_LEN, 0);
                        b.session.seal_at(b.first_counter + i as u64, padded, buf);
                    }
                    plane.stats.record(Stage::Encrypt, &me, b.packets.len(), start);
                    let (lanes, ticket) = (b.lanes.clone(), b.ticket);
                    if let Finish::Deliver(run) = lanes.outbound.finish(ticket, b) {
                        deliver_outbound(&plane, &lanes, run, &me);
                    }
                }
            }
        }
    }
}

/// In order: the core accepts each opened message (replay window, timers, roaming, allowed
/// IPs), then the inner packets are written.
fn deliver_inbound<I: Io>(plane: &DataPlane<I>, lanes: &PeerLanes, mut run: Vec<InboundBatch>, me: &ThreadStats) {
    let st = plane.stats.stage(Stage::DeliverInbound);
    loop {
        let start = Instant::now();
        st.wakeups.fetch_add(1, Ordering::Relaxed);
        if run.is_empty() {
            st.wasted_wakeups.fetch_add(1, Ordering::Relaxed);
        }
        let mut accepted: Vec<(usize, usize, usize)> = Vec::new();
        let transmits = {
            let (now, wall) = (Instant::now(), SystemTime::now());
            let mut core = plane.core();
            for (bi, b) in run.iter().enumerate() {
                for (pi, p) in b.packets.iter().enumerate() {
                    let Some((counter, len)) = p.opened else {
                        core.count_drop(DropReason::DecryptFailed);
                        continue;
                    };
                    let plain = &p.data[DATA_HEADER_LEN..DATA_HEADER_LEN + len];
                    if let Ok(Accepted::Packet { len }) = core.accept_data(
                        now,
                        wall,
                        &Opened {
                            peer: b.peer,
                            session: &b.session,
                            counter,
                            src: p.src,
                            datagram_len: p.data.len(),
                        },
                        plain,
                    ) {
                        accepted.push((bi, pi, len));
                    }
                }
            }
            drain(&mut core)
        };
        plane.io.write_inner(plane, &mut run, &accepted);
        plane.send_transmits(transmits);
        plane.stats.record(Stage::DeliverInbound, me, accepted.len(), start);
        match lanes.inbound.continue_delivery() {
            Some(r) => run = r,
            None => return,
        }
    }
}

/// In order: the sealed messages go out, then the core learns what was sent (timers, rekey).
fn deliver_outbound<I: Io>(plane: &DataPlane<I>, lanes: &PeerLanes, mut run: Vec<OutboundBatch>, me: &ThreadStats) {
    let st = plane.stats.stage(Stage::DeliverOutbound);
    loop {
        let start = Instant::now();
        st.wakeups.fetch_add(1, Ordering::Relaxed);
        if run.is_empty() {
            st.wasted_wakeups.fetch_add(1, Ordering::Relaxed);
        }
        let mut sent_packets = 0;
        for b in &run {
            let payloads: Vec<&[u8]> = b.packets.iter().map(Vec::as_slice).collect();
            let sent = plane.io.send_outer(b.to, &payloads);
            if sent < payloads.len() {
                plane
                    .counters
                    .udp_send_errors
                    .fetch_add((payloads.len() - sent) as u64, Ordering::Relaxed);
            }
            sent_packets += sent;
        }
        let transmits = {
            let (now, wall) = (Instant::now(), SystemTime::now());
            let mut core = plane.core();
            for b in &run {
                let bytes: usize = b.packets.iter().map(Vec::len).sum();
                core.after_send(now, wall, b.peer, &b.session, bytes as u64, b.packets.len() as u64);
            }
            drain(&mut core)
        };
        plane.send_transmits(transmits);
        plane.stats.record(Stage::DeliverOutbound, me, sent_packets, start);
        match lanes.outbound.continue_delivery() {
            Some(r) => run = r,
            None => return,
        }
    }
}

/// Items of one batch grouped by (peer, session index), in order of first appearance.
type Groups<V> = Vec<((PeerId, u32), Vec<V>)>;

/// Groups items by a key in order of first appearance (batches are small: a linear scan).
fn group_push<K: PartialEq, V>(groups: &mut Vec<(K, Vec<V>)>, key: K, v: V) {
    match groups.iter_mut().find(|(k, _)| *k == key) {
        Some((_, vs)) => vs.push(v),
        None => groups.push((key, vec![v])),
    }
}

impl<I: Io> DataPlane<I> {
    /// The receive stage's work for one batch of datagrams (sources already canonical):
    /// data messages become per-peer work items; the rare handshake messages, and anything
    /// malformed, are handled here under the core's lock. Returns false once the pool is gone.
    pub fn dispatch_inbound(
        &self,
        datagrams: &mut Vec<Datagram>,
        truncated: usize,
        jobs: &crossbeam_channel::Sender<Job>,
        me: &ThreadStats,
    ) -> bool {
        let start = Instant::now();
        let count = datagrams.len();
        let mut groups: Groups<InboundPacket> = Vec::new();
        // Each session is looked up (and its Arc cloned) once per batch, not once per packet.
        let mut sessions: Vec<(PeerId, Arc<Session>)> = Vec::new();
        let transmits = {
            let (now, wall) = (Instant::now(), SystemTime::now());
            let mut core = self.core();
            for _ in 0..truncated {
                core.count_drop(DropReason::Malformed);
            }
            for mut d in datagrams.drain(..) {
                if messages::classify(&d.data) == Some(Kind::Data) {
                    let receiver = messages::DataHeader::parse(&d.data).receiver;
                    let peer = match sessions.iter().find(|(_, s)| s.local_index == receiver) {
                        Some((peer, _)) => *peer,
                        None => match core.receiving_session(receiver) {
                            Some((peer, session)) => {
                                sessions.push((peer, session));
                                peer
                            }
                            None => {
                                core.count_drop(DropReason::UnknownReceiver);
                                continue;
                            }
                        },
                    };
                    let packet = InboundPacket {
                        data: d.data,
                        src: d.src,
                        opened: None,
                    };
                    group_push(&mut groups, (peer, receiver), packet);
                } else {
                    // Handshake messages and anything malformed: the core handles and counts them.
                    core.receive(now, wall, d.src, &mut d.data);
                }
            }
            drain(&mut core)
        };
        self.send_transmits(transmits);
        let mut batches = Vec::with_capacity(groups.len());
        for ((peer, receiver), packets) in groups {
            let session = sessions
                .iter()
                .find(|(_, s)| s.local_index == receiver)
                .expect("looked up")
                .1
                .clone();
            let lanes = self.lanes(peer);
            let ticket = lanes.inbound.ticket();
            batches.push(InboundBatch {
                peer,
                session,
                lanes,
                ticket,
                packets,
            });
        }
        if !batches.is_empty() && jobs.send(Job::Inbound(batches)).is_err() {
            return false;
        }
        self.stats.record(Stage::Receive, me, count, start);
        true
    }

    /// The read stage's work for one batch of inner packets (each at `DATA_HEADER_LEN..` of
    /// its buffer): routed, nonces reserved, per-peer work items; packets for peers without a
    /// session wait in the core for a handshake. Returns false once the pool is gone.
    pub fn dispatch_outbound(
        &self,
        packets: &mut Vec<Vec<u8>>,
        jobs: &crossbeam_channel::Sender<Job>,
        me: &ThreadStats,
    ) -> bool {
        let start = Instant::now();
        let count = packets.len();
        let mut groups: Groups<Vec<u8>> = Vec::new();
        // Each peer's session is looked up (and its Arc cloned) once per batch.
        let mut targets: Vec<(PeerId, Arc<Session>, SocketAddr)> = Vec::new();
        let (mtu, transmits) = {
            let (now, wall) = (Instant::now(), SystemTime::now());
            let mut core = self.core();
            for p in packets.drain(..) {
                let inner = &p[DATA_HEADER_LEN..];
                let peer = match core.route(inner) {
                    Ok(peer) => peer,
                    Err(r) => {
                        core.count_drop(r);
                        continue;
                    }
                };
                if let Some((_, session, _)) = targets.iter().find(|t| t.0 == peer) {
                    let idx = session.local_index;
                    group_push(&mut groups, (peer, idx), p);
                    continue;
                }
                match core.sending_session(now, peer) {
                    Ok(Some((session, to))) => {
                        let idx = session.local_index;
                        targets.push((peer, session, to));
                        group_push(&mut groups, (peer, idx), p);
                    }
                    Ok(None) => core.stage_and_initiate(now, wall, peer, inner.to_vec()),
                    Err(r) => core.count_drop(r),
                }
            }
            (core.mtu(), drain(&mut core))
        };
        self.send_transmits(transmits);
        let mut batches = Vec::with_capacity(groups.len());
        for ((peer, _), packets) in groups {
            let (_, session, to) = targets.iter().find(|t| t.0 == peer).expect("looked up").clone();
            let Some(first_counter) = session.reserve(packets.len() as u64) else {
                // The session ran out of nonces: wait for the next one like any unsent packet.
                let (now, wall) = (Instant::now(), SystemTime::now());
                let mut core = self.core();
                for p in packets {
                    core.stage_and_initiate(now, wall, peer, p[DATA_HEADER_LEN..].to_vec());
                }
                continue;
            };
            let lanes = self.lanes(peer);
            let ticket = lanes.outbound.ticket();
            batches.push(OutboundBatch {
                peer,
                session,
                lanes,
                ticket,
                to,
                mtu,
                first_counter,
                packets,
            });
        }
        if !batches.is_empty() && jobs.send(Job::Outbound(batches)).is_err() {
            return false;
        }
        self.stats.record(Stage::Read, me, count, start);
        true
    }
}
