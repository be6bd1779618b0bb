//! The data plane: dispatch, crypto and in-order delivery of every peer's packets between an
//! inner and an outer port, run in the execution model of the interface
//! (`placement::model`).
//!
//! ```text
//!  outer ─receive─▶ dispatch ─ticket, batch per peer─▶ open ─▶ lane ─▶ deliver inbound ─▶ inner
//!  inner ──read───▶ dispatch ─ticket, batch per peer─▶ seal ─▶ lane ─▶ deliver outbound ─▶ outer
//!                            │                        ▲
//!                            └── spread peers: a job ─┘ on a pool worker of the peer's node;
//!                                other peers: here, on the dispatching thread (inline)
//! ```
//!
//! By stage: [`dispatch`] (the receive and read stages' work), [`crypto`] (open and seal, the
//! pools' workers), [`delivery`] (lanes in order to the ports), [`rebalance`] (measuring load
//! and applying the placement's moves). Whoever finishes a lane's head delivers it (pool,
//! inline, auto); in the threaded model a delivery thread per peer is rung instead. The
//! protocol core's lock is taken once per batch, for lookups before the crypto and for the
//! in-order bookkeeping after it (replay window, timers, roaming), never during the crypto.
//!
//! The plane does no reading of its own: the threads of `crate::threads` read the ports and
//! hand it batches.

pub mod crypto;
pub mod delivery;
pub mod dispatch;
pub mod lane;
pub mod peer;
pub mod rebalance;
pub mod stats;

use crate::host::topology;
use crate::placement::model::{Model, Plan};
use crate::port::{InnerPort, OuterPort};
use crypto::Job;
use ordo_proto::{Interface, PeerId, Transmit};
use peer::PeerPlane;
use rebalance::PlacementState;
use stats::{Stats, ThreadStats};
use std::collections::HashMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, RwLock};
use std::time::{Duration, Instant, SystemTime};

/// A data-plane thread: its counters, and for a dispatching thread its queue (where the
/// control messages it produces are sent from; packets go by their peer's queue).
pub struct Ctx {
    pub stats: Arc<ThreadStats>,
    pub queue: usize,
}

/// The data plane's shared state: the protocol core, the peers, the pools, the counters, and
/// the two ports it moves packets between.
pub struct DataPlane<I: InnerPort, O: OuterPort> {
    core: Mutex<Interface>,
    peers: Mutex<HashMap<PeerId, Arc<PeerPlane>>>,
    pub plan: Plan,
    /// The job queue of each crypto pool (one per NUMA node), in the plan's order. Emptied
    /// by [`DataPlane::stop`], which ends the workers.
    pools: RwLock<Vec<crossbeam_channel::Sender<Job>>>,
    /// Pool for the next new peer (round robin; the rebalancer corrects by load).
    next_pool: AtomicUsize,
    placement: PlacementState,
    pub stats: Stats,
    pub inner: I,
    pub outer: O,
}

/// Work items waiting for a pool; a full queue makes the dispatchers wait, so the ports'
/// queues absorb (and count) the excess instead of our memory. A work item is at most one
/// receive batch (32 receives of up to 64 KB with GRO: 2 MB), so this bounds a queue at about
/// 128 MB in the worst case, and is still 32 batches per worker on 2 cores.
const JOB_QUEUE: usize = 64;

impl<I: InnerPort, O: OuterPort> DataPlane<I, O> {
    pub fn new(mut core: Interface, inner: I, outer: O, plan: Plan) -> Arc<Self> {
        if plan.model.has_queues() {
            core.set_queues(plan.queues.len() as u32);
        }
        let placement = PlacementState::new(plan.queues.len());
        Arc::new(DataPlane {
            core: Mutex::new(core),
            peers: Mutex::new(HashMap::new()),
            plan,
            pools: RwLock::new(Vec::new()),
            next_pool: AtomicUsize::new(0),
            placement,
            stats: Stats::default(),
            inner,
            outer,
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
                        crypto::worker(plane, rx, ctx)
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

    /// Sends control messages (handshakes, cookies, keepalives); the outer port counts what
    /// it could not send.
    pub fn send_transmits(&self, queue: usize, transmits: Vec<Transmit>) {
        for t in transmits {
            self.outer.send(queue, t.to, &[&t.payload]);
        }
    }

    /// One turn of the timers: the core's, following the inner port's MTU, forgetting
    /// removed peers; what they want sent goes out.
    pub fn tick(&self, now: Instant, wall: SystemTime) {
        let transmits = {
            let mut core = self.core();
            core.tick(now, wall);
            if let Some(mtu) = self.inner.mtu() {
                core.set_mtu(mtu);
            }
            self.forget_removed_peers(&core);
            drain(&mut core)
        };
        self.send_transmits(0, transmits);
    }

    /// How long until the core's next timer is due (None: none is set).
    pub fn until_next_deadline(&self) -> Option<Duration> {
        let deadline = self.core().next_deadline()?;
        Some(deadline.saturating_duration_since(Instant::now()))
    }
}

/// Pins the calling thread to `cpus` (none: leaves it where the scheduler puts it); a
/// failure is reported and the thread runs unpinned.
pub(crate) fn pin(cpus: &[usize]) {
    if !cpus.is_empty() {
        if let Err(e) = topology::pin_current_thread(cpus) {
            log::warn!("cannot pin a thread to CPUs {}: {e}", topology::format_cpu_list(cpus));
        }
    }
}

/// Everything the core wants sent.
pub fn drain(core: &mut Interface) -> Vec<Transmit> {
    std::iter::from_fn(|| core.poll_transmit()).collect()
}
