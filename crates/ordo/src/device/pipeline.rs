//! The data plane: dispatch, crypto and in-order delivery of every peer's packets, run in
//! the execution model of the interface (see model.rs).
//!
//! ```text
//!  UDP ─recvmmsg─▶ dispatch ─ticket, batch per peer─▶ open ──▶ lane ─▶ deliver inbound ─▶ TUN
//!  TUN ──read────▶ dispatch ─ticket, batch per peer─▶ seal ──▶ lane ─▶ deliver outbound ─▶ UDP
//!                           │                        ▲
//!                           └── spread peers: a job ─┘ on a pool worker of the peer's node;
//!                               other peers: here, on the dispatching thread (inline)
//! ```
//!
//! Whoever finishes a lane's head delivers it (pool, inline, auto); in the threaded model a
//! delivery thread per peer is rung instead. The protocol core's lock is taken once per
//! batch, for lookups before the crypto and for the in-order bookkeeping after it (replay
//! window, timers, roaming), never during the crypto.

use super::affinity;
use super::batch::Datagram;
use super::cpuload;
use super::lane::{Finish, Lane};
use super::model::{Model, Plan};
use super::peers::{self, PeerPlane, QueueSeen, Seen};
use super::stats::{Stage, Stats, ThreadStats};
use super::topology;
use ordo_proto::messages::{self, Kind, DATA_HEADER_LEN};
use ordo_proto::session::Session;
use ordo_proto::{Accepted, DropReason, Interface, OpenedMessage, PeerId, Transmit};
use rand_core::RngCore;
use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, RwLock, Weak};
use std::time::{Instant, SystemTime};

/// Where the data plane's packets go: the kernel (TUN queues and UDP sockets, see
/// `kernel.rs`) or memory (`ordo bench`). Reading is the caller's: it hands batches to
/// [`DataPlane::dispatch_inbound`] and [`DataPlane::dispatch_outbound`]. `queue` picks the
/// TUN queue and sockets: a peer's own queue for its packets, whichever thread writes them.
pub trait Io: Send + Sync + Sized + 'static {
    /// Writes the accepted inner packets of a delivery run, in order: `accepted` lists
    /// (batch, packet, length), the packet being at `DATA_HEADER_LEN..` of its buffer.
    fn write_inner(
        &self,
        plane: &DataPlane<Self>,
        queue: usize,
        run: &mut [InboundBatch],
        accepted: &[(usize, usize, usize)],
    );
    /// Sends messages to `to`; returns how many went out.
    fn send_outer(&self, queue: usize, to: SocketAddr, payloads: &[&[u8]]) -> usize;
    /// Steers these receiver indices to these queues, as exceptions to the rule of
    /// `ordo_proto::steering` (the indices of moved peers; see steer.rs). Called each
    /// placement interval with the full list; I/O without steering ignores it.
    fn steer_exceptions(&self, _exceptions: &[(u32, u32)]) {}
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

/// A data-plane thread: its counters, and for a dispatching thread its queue (where the
/// control messages it produces are sent from; packets go by their peer's queue).
pub struct Ctx {
    pub stats: Arc<ThreadStats>,
    pub queue: usize,
}

/// The data plane's shared state: the protocol core, the peers, the pools, the counters.
pub struct DataPlane<I: Io> {
    core: Mutex<Interface>,
    peers: Mutex<HashMap<PeerId, Arc<PeerPlane>>>,
    pub plan: Plan,
    /// The job queue of each crypto pool (one per NUMA node), in the plan's order. Emptied
    /// by [`DataPlane::stop`], which ends the workers.
    pools: RwLock<Vec<crossbeam_channel::Sender<Job>>>,
    /// Pool for the next new peer (round robin; the rebalancer corrects by load).
    next_pool: AtomicUsize,
    last_rebalance: Mutex<Instant>,
    /// The last reading of the CPUs' load and when it was taken, and how each queue's CPU
    /// fared up to the last placement, for the placement and for `ordo show`.
    cpu_load: Mutex<(cpuload::Sample, Instant, Vec<QueueSeen>)>,
    /// Each queue thread's affinity: pinned, or released under contention (affinity.rs).
    affinity: Mutex<Vec<affinity::QueueAffinity>>,
    pub stats: Stats,
    pub counters: IoCounters,
    pub io: I,
}

/// Work items waiting for a pool; a full queue makes the dispatchers wait, so the kernel's
/// socket and TUN queues absorb (and count) the excess instead of our memory. A work item is
/// at most one receive batch (32 receives of up to 64 KB with GRO: 2 MB), so this bounds a
/// queue at about 128 MB in the worst case, and is still 32 batches per worker on 2 cores.
const JOB_QUEUE: usize = 64;

impl<I: Io> DataPlane<I> {
    pub fn new(mut core: Interface, io: I, plan: Plan) -> Arc<Self> {
        if plan.model.has_queues() {
            core.set_queues(plan.queues.len() as u32);
        }
        let queues = plan.queues.len();
        Arc::new(DataPlane {
            core: Mutex::new(core),
            peers: Mutex::new(HashMap::new()),
            plan,
            pools: RwLock::new(Vec::new()),
            next_pool: AtomicUsize::new(0),
            last_rebalance: Mutex::new(Instant::now()),
            cpu_load: Mutex::new((cpuload::Sample::default(), Instant::now(), Vec::new())),
            affinity: Mutex::new(vec![affinity::QueueAffinity::default(); queues]),
            stats: Stats::default(),
            counters: IoCounters::default(),
            io,
        })
    }

    /// Starts the crypto pools, each worker on the CPUs of its place in the plan.
    pub fn start(self: &Arc<Self>) {
        let mut senders = Vec::new();
        let mut n = 0;
        for (node, places) in &self.plan.pools {
            let (tx, rx) = crossbeam_channel::bounded(JOB_QUEUE);
            for place in places {
                let (plane, rx, cpus) = (self.clone(), rx.clone(), place.cpus.clone());
                let name = format!("worker{n}");
                std::thread::Builder::new()
                    .name(format!("ordo-{name}-n{node}"))
                    .spawn(move || {
                        pin(&cpus);
                        // Workers dispatch nothing: their queue is never used.
                        let ctx = plane.register(&name, 0);
                        worker(plane, rx, ctx)
                    })
                    .expect("spawn");
                n += 1;
            }
            senders.push(tx);
        }
        *self.pools.write().unwrap_or_else(|p| p.into_inner()) = senders;
    }

    /// Ends the workers (once their queues are drained).
    pub fn stop(&self) {
        self.pools.write().unwrap_or_else(|p| p.into_inner()).clear();
    }

    /// Registers the calling thread's counters.
    pub fn register(&self, name: &str, queue: usize) -> Ctx {
        Ctx {
            stats: self.stats.register_thread(name),
            queue,
        }
    }

    pub fn workers(&self) -> usize {
        self.plan.workers()
    }

    pub fn core(&self) -> MutexGuard<'_, Interface> {
        self.core.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// A peer's part of the data plane, created on first use.
    pub fn peer(&self, id: PeerId) -> Arc<PeerPlane> {
        self.peers
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .entry(id)
            .or_insert_with(|| {
                let pools = self.plan.pools.len().max(1);
                let pool = self.next_pool.fetch_add(1, Ordering::Relaxed) % pools;
                // Auto starts every peer on its queue; the pool models spread everything.
                let spread = matches!(self.plan.model, Model::Pool | Model::Threaded);
                Arc::new(PeerPlane::new(id, pool, spread))
            })
            .clone()
    }

    /// Every peer's plane, by id (for `ordo show`).
    pub fn peer_planes(&self) -> Vec<Arc<PeerPlane>> {
        let mut v: Vec<_> = self
            .peers
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .values()
            .cloned()
            .collect();
        v.sort_by_key(|p| p.id);
        v
    }

    /// Forgets the planes of peers the core no longer has.
    pub fn forget_removed_peers(&self, core: &Interface) {
        self.peers
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .retain(|id, _| core.peer(*id).is_some());
    }

    /// Sends control messages (handshakes, cookies, keepalives).
    pub fn send_transmits(&self, queue: usize, transmits: Vec<Transmit>) {
        for t in transmits {
            if self.io.send_outer(queue, t.to, &[&t.payload]) == 0 {
                self.counters.udp_send_errors.fetch_add(1, Ordering::Relaxed);
            }
        }
    }

    /// The measured cost of a packet's whole path, (inbound, outbound) in ns: what one core
    /// spends on it when it runs to completion.
    fn packet_cost(&self) -> (f64, f64) {
        let per = |stages: [Stage; 3]| {
            let (mut ns, mut packets) = (0u64, 0u64);
            for s in stages {
                let st = self.stats.stage(s);
                ns += st.busy_ns;
                packets = packets.max(st.packets);
            }
            if packets == 0 {
                1000.0
            } else {
                ns as f64 / packets as f64
            }
        };
        (
            per([Stage::Receive, Stage::Decrypt, Stage::DeliverInbound]),
            per([Stage::Read, Stage::Encrypt, Stage::DeliverOutbound]),
        )
    }

    /// Measures every peer's load and moves peers as [`peers::decide`] says: between queues
    /// (at once, by steering exceptions for its old indices, and for good by the core, which
    /// re-keys the peer onto the new queue), between pools, and in
    /// the auto model between its queue and the pool. Called about every [`peers::INTERVAL`].
    pub fn rebalance(&self, now: Instant, wall: SystemTime) -> Vec<Transmit> {
        let elapsed = {
            let mut last = self.last_rebalance.lock().unwrap_or_else(|p| p.into_inner());
            let e = now.saturating_duration_since(*last);
            *last = now;
            e
        };
        let cost = self.packet_cost();
        let planes = self.peer_planes();
        // Read /proc before taking the core's lock: deliveries wait on it.
        let queues = if self.plan.model.has_queues() {
            self.queues_seen()
        } else {
            vec![QueueSeen::default()]
        };
        let mut core = self.core();
        let seen: Vec<Seen> = planes
            .iter()
            .map(|p| {
                let load = p.measure(elapsed, cost);
                Seen {
                    id: p.id,
                    queue: core.peer(p.id).map_or(0, |x| x.queue),
                    pool: p.pool.load(Ordering::Relaxed),
                    spread: p.spread.load(Ordering::Relaxed),
                    cores: load.cores,
                    dwell: load.changed.map(|t| now.saturating_duration_since(t)),
                    queue_dwell: load.moved.map(|t| now.saturating_duration_since(t)),
                }
            })
            .collect();
        let moves = peers::decide(self.plan.model, &seen, &queues, self.plan.pools.len());
        let place_threads = self.plan.model.has_queues() && !self.plan.fixed_placement;
        if place_threads {
            let mut affinity = self.affinity.lock().unwrap_or_else(|p| p.into_inner());
            for m in &moves {
                if let peers::Move::Queue(id, _) = m {
                    let from = seen.iter().find(|p| p.id == *id).map_or(0, |p| p.queue as usize);
                    let n = affinity.len().max(1);
                    if let Some(a) = affinity.get_mut(from % n) {
                        a.gave_peer(now);
                    }
                }
            }
        }
        for m in moves {
            let id = match &m {
                peers::Move::Spread(id, _) => *id,
                peers::Move::Queue(..) | peers::Move::Pool(..) if self.plan.fixed_placement => continue,
                peers::Move::Queue(id, _) | peers::Move::Pool(id, _) => *id,
            };
            if let peers::Move::Queue(_, q) = m {
                // Other daemons on this machine may see the same imbalance at the same moment
                // (where the lighter-party rule of `peers::decide` does not tell them apart:
                // several light peers on one crowded core); if all moved, they would crowd
                // the other core. A coin makes some go first; the rest then see the effect.
                if rand_core::OsRng.next_u32() & 1 == 0 {
                    continue;
                }
                core.set_peer_queue(id, q, now, wall);
            }
            if let Some(p) = planes.iter().find(|p| p.id == id) {
                peers::apply(p, &m, now);
            }
        }
        // A moved peer's datagrams go to its new queue now, not with the move's handshake.
        let exceptions = core.steering_overrides();
        let transmits = drain(&mut core);
        drop(core);
        self.io.steer_exceptions(&exceptions);
        // After the core's lock: this reads the thread list, makes system calls and may log.
        if place_threads {
            self.place_queue_threads(&queues, now);
        }
        transmits
    }
}

impl<I: Io> DataPlane<I> {
    /// Reads the CPUs' load and returns how each queue's CPU and thread fared over the last
    /// two readings: the lesser of each figure, so that only what lasted two intervals counts
    /// (all zero at first). Another daemon's move shows within an interval, so it stops a
    /// second one from following it (see the coin in `rebalance`).
    fn queues_seen(&self) -> Vec<QueueSeen> {
        let (now, at) = (cpuload::Sample::read(), Instant::now());
        let threads = self.stats.threads();
        let mut last = self.cpu_load.lock().unwrap_or_else(|p| p.into_inner());
        let f = cpuload::figures(&last.0, &now, at.saturating_duration_since(last.1));
        let seen: Vec<QueueSeen> = (self.plan.queues.iter().enumerate())
            .map(|(q, cpu)| {
                let tid = queue_thread(&threads, q);
                QueueSeen {
                    other: f.other.get(cpu).copied().unwrap_or(0.0),
                    idle: f.idle.get(cpu).copied().unwrap_or(0.0),
                    wait: tid.and_then(|t| f.wait.get(&t)).copied().unwrap_or(0.0),
                }
            })
            .collect();
        let lasting = if last.2.len() == seen.len() {
            (seen.iter().zip(&last.2))
                .map(|(a, b)| QueueSeen {
                    other: a.other.min(b.other),
                    idle: a.idle.min(b.idle),
                    wait: a.wait.min(b.wait),
                })
                .collect()
        } else {
            vec![QueueSeen::default(); seen.len()]
        };
        *last = (now, at, seen);
        lasting
    }

    /// Releases the queue threads that wait for their CPU with no room elsewhere, and pins
    /// them again on trial (affinity.rs).
    fn place_queue_threads(&self, queues: &[QueueSeen], now: Instant) {
        let changes = affinity::update(
            &mut self.affinity.lock().unwrap_or_else(|p| p.into_inner()),
            queues,
            now,
        );
        if changes.is_empty() {
            return;
        }
        let threads = self.stats.threads();
        for (q, release) in changes {
            let Some(tid) = queue_thread(&threads, q) else {
                continue;
            };
            let cpus = self.plan.queue_thread_cpus(q, release);
            if release {
                let w = queues[q].wait;
                eprintln!(
                    "ordo: queue {q} waited {:.0}% of the time for CPU {} and no queue has room: released to CPUs {}",
                    w * 100.0,
                    self.plan.queues[q],
                    topology::format_cpu_list(&cpus)
                );
            }
            if let Err(e) = topology::pin_thread(tid, &cpus) {
                eprintln!(
                    "ordo: cannot set queue {q}'s CPUs to {}: {e}",
                    topology::format_cpu_list(&cpus)
                );
            }
        }
    }

    /// Each queue's affinity state (one entry per queue).
    pub fn queue_affinity(&self) -> Vec<affinity::QueueAffinity> {
        self.affinity.lock().unwrap_or_else(|p| p.into_inner()).clone()
    }

    /// How each queue's CPU and thread fared in the last interval (empty before it).
    pub fn queues_last_seen(&self) -> Vec<QueueSeen> {
        self.cpu_load.lock().unwrap_or_else(|p| p.into_inner()).2.clone()
    }
}

fn pin(cpus: &[usize]) {
    if !cpus.is_empty() {
        if let Err(e) = topology::pin_current_thread(cpus) {
            eprintln!(
                "ordo: cannot pin a thread to CPUs {}: {e}",
                topology::format_cpu_list(cpus)
            );
        }
    }
}

/// Everything the core wants sent.
pub fn drain(core: &mut Interface) -> Vec<Transmit> {
    std::iter::from_fn(|| core.poll_transmit()).collect()
}

pub struct InboundPacket {
    /// The data message, decrypted in place (its buffer is shared with the datagrams that
    /// arrived in the same receive; see batch::Receiver).
    pub data: bytes::BytesMut,
    pub src: SocketAddr,
    /// Set by the crypto: the counter and plaintext length, or None if it did not open.
    pub opened: Option<(u64, usize)>,
}

/// Data messages of one peer, on one session, in arrival order.
pub struct InboundBatch {
    pub peer: Arc<PeerPlane>,
    pub session: Arc<Session>,
    pub ticket: u64,
    pub packets: Vec<InboundPacket>,
}

/// Packets for one peer, sealed with consecutive counters from `first_counter`. Each buffer
/// holds the packet at `DATA_HEADER_LEN..` and, once sealed, the whole message.
pub struct OutboundBatch {
    pub peer: Arc<PeerPlane>,
    pub session: Arc<Session>,
    pub ticket: u64,
    pub to: SocketAddr,
    pub mtu: usize,
    pub first_counter: u64,
    pub packets: Vec<Vec<u8>>,
}

/// A work item for a pool: the per-peer batches of one dispatched batch. With many peers,
/// one item per peer would cost a queue hand-off per packet; one per dispatch keeps it per
/// batch.
pub enum Job {
    Inbound(Vec<InboundBatch>),
    Outbound(Vec<OutboundBatch>),
}

/// A pool worker: crypto for any peer of its node, then delivery of the lanes whose head
/// it finished.
fn worker<I: Io>(plane: Arc<DataPlane<I>>, jobs: crossbeam_channel::Receiver<Job>, ctx: Ctx) {
    for job in jobs {
        match job {
            Job::Inbound(batches) => plane.open(batches, &ctx),
            Job::Outbound(batches) => plane.seal(batches, &ctx),
        }
    }
}

impl<I: Io> DataPlane<I> {
    /// Decrypts a set of batches (one dispatch's or one job's, of any peers), hands each to
    /// its lane, then delivers the lanes this thread became the deliverer of, all of them
    /// under one lock of the core: with many peers a batch holds one packet of each, and a
    /// lock (and a clock reading) per peer would cost more than the crypto.
    fn open(self: &Arc<Self>, mut batches: Vec<InboundBatch>, ctx: &Ctx) {
        let start = Instant::now();
        let mut count = 0;
        for b in &mut batches {
            for p in &mut b.packets {
                p.opened = b.session.open_in_place(&mut p.data).ok();
            }
            count += b.packets.len();
        }
        self.stats.record(Stage::Decrypt, &ctx.stats, count, start);
        let keys = batches.iter().map(|b| (b.peer.clone(), b.ticket)).collect();
        self.finish(batches, keys, |p| &p.inbound, |runs| self.deliver_inbound(runs, ctx));
    }

    /// Encrypts a set of batches with their reserved counters, hands each to its lane, then
    /// delivers the lanes this thread became the deliverer of (see `open`).
    fn seal(self: &Arc<Self>, mut batches: Vec<OutboundBatch>, ctx: &Ctx) {
        let start = Instant::now();
        let mut count = 0;
        for b in &mut batches {
            for (i, buf) in b.packets.iter_mut().enumerate() {
                let len = buf.len() - DATA_HEADER_LEN;
                let padded = ordo_proto::interface::padded_len(len, b.mtu);
                buf.resize(DATA_HEADER_LEN + padded + ordo_proto::crypto::TAG_LEN, 0);
                b.session.seal_at(b.first_counter + i as u64, padded, buf);
            }
            count += b.packets.len();
        }
        self.stats.record(Stage::Encrypt, &ctx.stats, count, start);
        let keys = batches.iter().map(|b| (b.peer.clone(), b.ticket)).collect();
        self.finish(batches, keys, |p| &p.outbound, |runs| self.deliver_outbound(runs, ctx));
    }

    /// Files each done batch in its peer's lane (`keys`: each batch's peer and ticket), then
    /// delivers every lane this thread became the deliverer of, together, until none has
    /// more. Threaded: rings each peer's delivery thread instead.
    fn finish<B>(
        self: &Arc<Self>,
        batches: Vec<B>,
        keys: Vec<(Arc<PeerPlane>, u64)>,
        lane: impl Fn(&PeerPlane) -> &Lane<B>,
        deliver: impl Fn(&mut [(Arc<PeerPlane>, Vec<B>)]),
    ) {
        let mut runs = Vec::new();
        for (b, (peer, ticket)) in batches.into_iter().zip(keys) {
            if self.plan.model == Model::Threaded {
                lane(&peer).file(ticket, b);
                self.ring(&peer);
            } else if let Finish::Deliver(run) = lane(&peer).finish(ticket, b) {
                runs.push((peer, run));
            }
        }
        while !runs.is_empty() {
            deliver(&mut runs);
            runs = runs
                .into_iter()
                .filter_map(|(peer, _)| Some((peer.clone(), lane(&peer).continue_delivery()?)))
                .collect();
        }
    }

    /// Threaded model: wakes the peer's delivery thread, starting it on first use. Like
    /// `napi_schedule`, ringing an already rung bell does nothing more.
    fn ring(self: &Arc<Self>, peer: &Arc<PeerPlane>) {
        let bell = peer.doorbell.get_or_init(|| {
            let (tx, rx) = crossbeam_channel::bounded(1);
            let (plane, weak) = (self.clone(), Arc::downgrade(peer));
            let name = format!("deliver{}", peer.id.0);
            std::thread::Builder::new()
                .name(format!("ordo-{name}"))
                .stack_size(256 << 10)
                .spawn(move || {
                    let ctx = plane.register(&name, 0);
                    if plane.plan.delivery_fifo {
                        set_fifo_priority();
                    }
                    delivery_thread(plane, weak, rx, ctx)
                })
                .expect("spawn");
            tx
        });
        let _ = bell.try_send(());
    }

    /// In order, for each peer's run: the core accepts its packets (replay window, timers,
    /// roaming, allowed IPs; one lock for all the runs), then they are written to the TUN
    /// device. One wake-up per run: a lane this thread became the deliverer of.
    fn deliver_inbound(&self, runs: &mut [(Arc<PeerPlane>, Vec<InboundBatch>)], ctx: &Ctx) {
        let start = Instant::now();
        let st = ctx.stats.stage(Stage::DeliverInbound);
        st.wakeups.fetch_add(runs.len() as u64, Ordering::Relaxed);
        // Cannot happen by construction (see lane.rs); counted if it ever does.
        let empty = runs.iter().filter(|(_, run)| run.is_empty()).count();
        st.wasted_wakeups.fetch_add(empty as u64, Ordering::Relaxed);
        // The accepted packets of every run, one list; run r's are accepted[ends[r-1]..ends[r]]
        // (one allocation per delivery, not one per peer).
        let mut accepted: Vec<(usize, usize, usize)> = Vec::new();
        let mut ends = Vec::with_capacity(runs.len());
        let transmits = {
            let (now, wall) = (Instant::now(), SystemTime::now());
            let mut core = self.core();
            for (_, run) in runs.iter() {
                for (bi, b) in run.iter().enumerate() {
                    let failed = b.packets.iter().filter(|p| p.opened.is_none()).count();
                    for _ in 0..failed {
                        core.count_drop(DropReason::DecryptFailed);
                    }
                    // The opened packets go to the core as one run; its verdicts come back in
                    // the same order, so `positions` walks the same packets beside them.
                    let opened = || b.packets.iter().enumerate().filter(|(_, p)| p.opened.is_some());
                    let messages = opened().filter_map(|(_, p)| {
                        let (counter, len) = p.opened?;
                        Some(OpenedMessage {
                            counter,
                            src: p.src,
                            datagram_len: p.data.len(),
                            plain: &p.data[DATA_HEADER_LEN..DATA_HEADER_LEN + len],
                        })
                    });
                    let mut positions = opened().map(|(pi, _)| pi);
                    core.accept_data_run(now, wall, b.peer.id, &b.session, messages, |verdict| {
                        let pi = positions.next().expect("one verdict per message");
                        if let Ok(Accepted::Packet { len }) = verdict {
                            accepted.push((bi, pi, len));
                        }
                    });
                }
                ends.push(accepted.len());
            }
            drain(&mut core)
        };
        // Each peer's own queue, whoever delivers: the TUN device sends a flow's packets back
        // through the queue that last wrote it, so writing a peer's flows from one queue keeps
        // them on one reader (two readers would reorder them).
        let mut from = 0;
        for ((peer, run), &end) in runs.iter_mut().zip(&ends) {
            if !run.is_empty() {
                let queue = peer.queue.load(Ordering::Relaxed);
                self.io.write_inner(self, queue, run, &accepted[from..end]);
            }
            from = end;
        }
        let delivered = accepted.len();
        self.send_transmits(runs[0].0.queue.load(Ordering::Relaxed), transmits);
        self.stats.record(Stage::DeliverInbound, &ctx.stats, delivered, start);
    }

    /// In order, for each peer's run: the sealed messages go out, then the core learns what
    /// was sent (timers, rekey; one lock for all the runs).
    /// The sent buffers go back to this thread's spares (see buffers.rs).
    fn deliver_outbound(&self, runs: &mut [(Arc<PeerPlane>, Vec<OutboundBatch>)], ctx: &Ctx) {
        let start = Instant::now();
        let st = ctx.stats.stage(Stage::DeliverOutbound);
        st.wakeups.fetch_add(runs.len() as u64, Ordering::Relaxed);
        // Cannot happen by construction (see lane.rs); counted if it ever does.
        let empty = runs.iter().filter(|(_, run)| run.is_empty()).count();
        st.wasted_wakeups.fetch_add(empty as u64, Ordering::Relaxed);
        let mut sent_packets = 0;
        for b in runs.iter().flat_map(|(_, run)| run) {
            let payloads: Vec<&[u8]> = b.packets.iter().map(Vec::as_slice).collect();
            let sent = self
                .io
                .send_outer(b.peer.queue.load(Ordering::Relaxed), b.to, &payloads);
            if sent < payloads.len() {
                self.counters
                    .udp_send_errors
                    .fetch_add((payloads.len() - sent) as u64, Ordering::Relaxed);
            }
            sent_packets += sent;
        }
        let transmits = {
            let (now, wall) = (Instant::now(), SystemTime::now());
            let mut core = self.core();
            for b in runs.iter().flat_map(|(_, run)| run) {
                let bytes: usize = b.packets.iter().map(Vec::len).sum();
                core.after_send(now, wall, b.peer.id, &b.session, bytes as u64, b.packets.len() as u64);
            }
            drain(&mut core)
        };
        self.send_transmits(runs[0].0.queue.load(Ordering::Relaxed), transmits);
        for b in runs.iter_mut().flat_map(|(_, run)| run) {
            super::buffers::give(std::mem::take(&mut b.packets));
        }
        self.stats
            .record(Stage::DeliverOutbound, &ctx.stats, sent_packets, start);
    }

    /// Sends spread batches to their pools and runs the others here, in that order so the
    /// pools start first. A full pool makes the dispatcher wait (rather than do the crypto
    /// itself, which would take the peer off its NUMA node). Returns false once the pools
    /// are gone.
    fn execute<B>(
        self: &Arc<Self>,
        batches: Vec<B>,
        ctx: &Ctx,
        peer_of: impl Fn(&B) -> &Arc<PeerPlane>,
        job: impl Fn(Vec<B>) -> Job,
        here: impl Fn(&Arc<Self>, Vec<B>, &Ctx),
    ) -> bool {
        let mut local = Vec::new();
        let mut jobs: Vec<Vec<B>> = Vec::new();
        for b in batches {
            let p = peer_of(&b);
            if p.spread.load(Ordering::Relaxed) {
                let pool = p.pool.load(Ordering::Relaxed);
                if jobs.len() <= pool {
                    jobs.resize_with(pool + 1, Vec::new);
                }
                jobs[pool].push(b);
            } else {
                local.push(b);
            }
        }
        if jobs.iter().any(|j| !j.is_empty()) {
            let pools = self.pools.read().unwrap_or_else(|p| p.into_inner()).clone();
            for (i, batches) in jobs.into_iter().enumerate().filter(|(_, j)| !j.is_empty()) {
                match pools.get(i).or(pools.first()) {
                    Some(tx) if tx.send(job(batches)).is_ok() => {}
                    _ => return false,
                }
            }
        }
        if !local.is_empty() {
            here(self, local, ctx);
        }
        true
    }
}

/// Threaded model: one peer's delivery, woken on every finished batch whether or not it is
/// the head. A wake-up that finds the head still in crypto is wasted: counted, as the
/// measure of execution order inversion this model can suffer.
fn delivery_thread<I: Io>(
    plane: Arc<DataPlane<I>>,
    peer: Weak<PeerPlane>,
    bell: crossbeam_channel::Receiver<()>,
    ctx: Ctx,
) {
    for () in bell {
        let Some(peer) = peer.upgrade() else { return };
        let inbound = peer.inbound.take_ready();
        let outbound = peer.outbound.take_ready();
        if inbound.is_empty() && outbound.is_empty() {
            let st = ctx.stats.stage(Stage::DeliverInbound);
            st.wakeups.fetch_add(1, Ordering::Relaxed);
            st.wasted_wakeups.fetch_add(1, Ordering::Relaxed);
            continue;
        }
        if !inbound.is_empty() {
            plane.deliver_inbound(&mut [(peer.clone(), inbound)], &ctx);
        }
        if !outbound.is_empty() {
            plane.deliver_outbound(&mut [(peer.clone(), outbound)], &ctx);
        }
    }
}

/// Lab scenario 3 (issue 4): the delivery thread above the workers, as kernel WireGuard's
/// softirq is. Needs CAP_SYS_NICE; without it the thread stays at normal priority.
fn set_fifo_priority() {
    let param = libc::sched_param { sched_priority: 1 };
    // SAFETY: a valid sched_param for the calling thread (pid 0).
    if unsafe { libc::sched_setscheduler(0, libc::SCHED_FIFO, &param) } != 0 {
        eprintln!(
            "ordo: cannot run delivery at SCHED_FIFO: {}",
            std::io::Error::last_os_error()
        );
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
    pub fn dispatch_inbound(self: &Arc<Self>, datagrams: &mut Vec<Datagram>, truncated: usize, ctx: &Ctx) -> bool {
        let start = Instant::now();
        let count = datagrams.len();
        let mut groups: Groups<InboundPacket> = Vec::new();
        // Each session is looked up (and its Arc cloned) once per batch, not once per packet;
        // with it the peer's queue.
        let mut sessions: Vec<(PeerId, Arc<Session>, u32)> = Vec::new();
        let transmits = {
            let (now, wall) = (Instant::now(), SystemTime::now());
            let mut core = self.core();
            for _ in 0..truncated {
                core.count_drop(DropReason::Malformed);
            }
            for mut d in datagrams.drain(..) {
                if messages::classify(&d.data) == Some(Kind::Data) {
                    let receiver = messages::DataHeader::parse(&d.data).receiver;
                    let peer = match sessions.iter().find(|(_, s, _)| s.local_index == receiver) {
                        Some((peer, _, _)) => *peer,
                        None => match core.receiving_session(receiver) {
                            Some((peer, session)) => {
                                let queue = core.peer(peer).map_or(0, |p| p.queue);
                                sessions.push((peer, session, queue));
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
        self.send_transmits(ctx.queue, transmits);
        let mut batches = Vec::with_capacity(groups.len());
        for ((peer, receiver), packets) in groups {
            let (_, session, queue) = sessions
                .iter()
                .find(|(_, s, _)| s.local_index == receiver)
                .expect("looked up")
                .clone();
            let peer = self.peer(peer);
            peer.queue.store(queue as usize, Ordering::Relaxed);
            peer.rx_packets.fetch_add(packets.len() as u64, Ordering::Relaxed);
            let ticket = peer.inbound.ticket();
            batches.push(InboundBatch {
                peer,
                session,
                ticket,
                packets,
            });
        }
        self.stats.record(Stage::Receive, &ctx.stats, count, start);
        self.execute(
            batches,
            ctx,
            |b| &b.peer,
            Job::Inbound,
            |plane, batches, ctx| plane.open(batches, ctx),
        )
    }

    /// The read stage's work for one batch of inner packets (each at `DATA_HEADER_LEN..` of
    /// its buffer): routed, nonces reserved, per-peer work items; packets for peers without a
    /// session wait in the core for a handshake. Returns false once the pool is gone.
    pub fn dispatch_outbound(self: &Arc<Self>, packets: &mut Vec<Vec<u8>>, ctx: &Ctx) -> bool {
        let start = Instant::now();
        let count = packets.len();
        let mut groups: Groups<Vec<u8>> = Vec::new();
        // Each peer's session is looked up (and its Arc cloned) once per batch.
        let mut targets: Vec<(PeerId, Arc<Session>, SocketAddr, u32)> = Vec::new();
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
                if let Some((_, session, _, _)) = targets.iter().find(|t| t.0 == peer) {
                    let idx = session.local_index;
                    group_push(&mut groups, (peer, idx), p);
                    continue;
                }
                match core.sending_session(now, peer) {
                    Ok(Some((session, to))) => {
                        let idx = session.local_index;
                        let queue = core.peer(peer).map_or(0, |p| p.queue);
                        targets.push((peer, session, to, queue));
                        group_push(&mut groups, (peer, idx), p);
                    }
                    Ok(None) => core.stage_and_initiate(now, wall, peer, inner.to_vec()),
                    Err(r) => core.count_drop(r),
                }
            }
            (core.mtu(), drain(&mut core))
        };
        self.send_transmits(ctx.queue, transmits);
        let mut batches = Vec::with_capacity(groups.len());
        for ((peer, _), packets) in groups {
            let (_, session, to, queue) = targets.iter().find(|t| t.0 == peer).expect("looked up").clone();
            let Some(first_counter) = session.reserve(packets.len() as u64) else {
                // The session ran out of nonces: wait for the next one like any unsent packet.
                let (now, wall) = (Instant::now(), SystemTime::now());
                let mut core = self.core();
                for p in packets {
                    core.stage_and_initiate(now, wall, peer, p[DATA_HEADER_LEN..].to_vec());
                }
                continue;
            };
            let peer = self.peer(peer);
            peer.queue.store(queue as usize, Ordering::Relaxed);
            peer.tx_packets.fetch_add(packets.len() as u64, Ordering::Relaxed);
            let ticket = peer.outbound.ticket();
            batches.push(OutboundBatch {
                peer,
                session,
                ticket,
                to,
                mtu,
                first_counter,
                packets,
            });
        }
        self.stats.record(Stage::Read, &ctx.stats, count, start);
        self.execute(
            batches,
            ctx,
            |b| &b.peer,
            Job::Outbound,
            |plane, batches, ctx| plane.seal(batches, ctx),
        )
    }
}

/// The OS thread id of queue `q`'s thread (registered as `queue{q}`, kernel.rs).
fn queue_thread(threads: &[Arc<ThreadStats>], q: usize) -> Option<i32> {
    let name = format!("queue{q}");
    threads.iter().find(|t| t.name == name).map(|t| t.tid)
}
