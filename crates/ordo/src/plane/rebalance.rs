//! Rebalancing: every placement interval the timer thread measures each peer's load and how
//! each queue's CPU fared, asks the placement policy (`crate::placement`) what to move, and
//! applies its answer: the core re-keys a peer moved to another queue, the outer port steers
//! its old indices there meanwhile, and queue threads are released from or pinned to their
//! CPUs.

use super::peer::{PacketCost, PeerPlane};
use super::stats::{Stage, ThreadStats};
use super::{drain, DataPlane};
use crate::host::{cpuload, topology};
use crate::placement::affinity::{self, QueueAffinity};
use crate::placement::{self, Move, QueueSeen, Seen};
use crate::port::{InnerPort, OuterPort};
use ordo_proto::{PeerId, Transmit};
use rand_core::RngCore;
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex};
use std::time::{Instant, SystemTime};

/// What the rebalancer keeps between intervals.
pub struct PlacementState {
    last_rebalance: Mutex<Instant>,
    /// The last reading of the CPUs' load, for the next interval's figures and `ordo show`.
    last_reading: Mutex<LastReading>,
    /// Each queue thread's affinity: pinned, or released under contention.
    affinity: Mutex<Vec<QueueAffinity>>,
    /// The moves applied so far.
    moves: Mutex<Moves>,
}

/// Moves applied since the start, by kind (see [`Move`]).
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct Moves {
    /// A peer to another queue.
    pub queue: u64,
    /// A peer's crypto to another NUMA node's pool.
    pub pool: u64,
    /// Auto: a peer's crypto from its queue to the pool or back.
    pub spread: u64,
}

/// A reading of the CPUs' load, when it was taken, and how each queue's CPU fared up to it.
struct LastReading {
    sample: cpuload::Sample,
    at: Instant,
    queues: Vec<QueueSeen>,
}

impl PlacementState {
    pub fn new(queues: usize) -> Self {
        PlacementState {
            last_rebalance: Mutex::new(Instant::now()),
            last_reading: Mutex::new(LastReading {
                sample: cpuload::Sample::default(),
                at: Instant::now(),
                queues: Vec::new(),
            }),
            affinity: Mutex::new(vec![QueueAffinity::default(); queues]),
            moves: Mutex::new(Moves::default()),
        }
    }
}

impl<I: InnerPort, O: OuterPort> DataPlane<I, O> {
    /// The measured cost of a packet's whole path each way: what one core spends on it when it
    /// runs to completion.
    fn packet_cost(&self) -> PacketCost {
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
        PacketCost {
            inbound_ns: per([Stage::Receive, Stage::Decrypt, Stage::DeliverInbound]),
            outbound_ns: per([Stage::Read, Stage::Encrypt, Stage::DeliverOutbound]),
        }
    }

    /// Measures every peer's load and moves peers as [`placement::decide`] says: between queues
    /// (at once, by steering exceptions for its old indices, and for good by the core, which
    /// re-keys the peer onto the new queue), between pools, and in
    /// the auto model between its queue and the pool. Called about every [`placement::INTERVAL`].
    pub fn rebalance(&self, now: Instant, wall: SystemTime) -> Vec<Transmit> {
        let elapsed = {
            let mut last = self.placement.last_rebalance.lock().unwrap_or_else(|p| p.into_inner());
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
        let moves = placement::decide(self.plan.model, &seen, &queues, self.plan.pools.len());
        let place_threads = self.plan.model.has_queues() && !self.plan.fixed_placement;
        if place_threads {
            let mut affinity = self.placement.affinity.lock().unwrap_or_else(|p| p.into_inner());
            for m in &moves {
                if let Move::Queue(id, _) = m {
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
                Move::Spread(id, _) => *id,
                Move::Queue(..) | Move::Pool(..) if self.plan.fixed_placement => continue,
                Move::Queue(id, _) | Move::Pool(id, _) => *id,
            };
            if let Move::Queue(_, q) = m {
                // Other daemons on this machine may see the same imbalance at the same moment
                // (where the lighter-party rule of `placement::decide` does not tell them apart:
                // several light peers on one crowded core); if all moved, they would crowd
                // the other core. A coin makes some go first; the rest then see the effect.
                if rand_core::OsRng.next_u32() & 1 == 0 {
                    continue;
                }
                core.set_peer_queue(id, q, now, wall);
            }
            if let Some(p) = planes.iter().find(|p| p.id == id) {
                apply(p, &m, now);
            }
            let mut moves = self.placement.moves.lock().unwrap_or_else(|p| p.into_inner());
            match m {
                Move::Queue(..) => moves.queue += 1,
                Move::Pool(..) => moves.pool += 1,
                Move::Spread(..) => moves.spread += 1,
            }
        }
        // A moved peer's datagrams go to its new queue now, not with the move's handshake.
        let exceptions = core.steering_overrides();
        let transmits = drain(&mut core);
        drop(core);
        self.outer.steer(&exceptions);
        // After the core's lock: this reads the thread list, makes system calls and may log.
        if place_threads {
            self.place_queue_threads(&queues, now);
        }
        transmits
    }
    /// Moves a peer to `queue` as a placement move does, whatever the load: its datagrams are
    /// steered there at once, and the core re-keys it onto the queue. For an operator's or a
    /// test's decision; false if there is no such peer or the model has no queues.
    pub fn move_peer(&self, id: PeerId, queue: u32, now: Instant, wall: SystemTime) -> bool {
        if !self.plan.model.has_queues() {
            return false;
        }
        let (exceptions, transmits) = {
            let mut core = self.core();
            if !core.set_peer_queue(id, queue, now, wall) {
                return false;
            }
            (core.steering_overrides(), drain(&mut core))
        };
        apply(&self.peer(id), &Move::Queue(id, queue), now);
        self.outer.steer(&exceptions);
        self.send_transmits(0, transmits);
        true
    }

    /// Reads the CPUs' load and returns how each queue's CPU and thread fared over the last
    /// two readings: the lesser of each figure, so that only what lasted two intervals counts
    /// (all zero at first). Another daemon's move shows within an interval, so it stops a
    /// second one from following it (see the coin in `rebalance`).
    fn queues_seen(&self) -> Vec<QueueSeen> {
        let (now, at) = (cpuload::Sample::read(), Instant::now());
        let threads = self.stats.threads();
        let mut last = self.placement.last_reading.lock().unwrap_or_else(|p| p.into_inner());
        let f = cpuload::figures(&last.sample, &now, at.saturating_duration_since(last.at));
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
        let lasting = if last.queues.len() == seen.len() {
            (seen.iter().zip(&last.queues))
                .map(|(a, b)| QueueSeen {
                    other: a.other.min(b.other),
                    idle: a.idle.min(b.idle),
                    wait: a.wait.min(b.wait),
                })
                .collect()
        } else {
            vec![QueueSeen::default(); seen.len()]
        };
        *last = LastReading {
            sample: now,
            at,
            queues: seen,
        };
        lasting
    }

    /// Releases the queue threads that wait for their CPU with no room elsewhere, and pins
    /// them again on trial (`placement::affinity`).
    fn place_queue_threads(&self, queues: &[QueueSeen], now: Instant) {
        let changes = affinity::update(
            &mut self.placement.affinity.lock().unwrap_or_else(|p| p.into_inner()),
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
                log::info!(
                    "queue {q} waited {:.0}% of the time for CPU {} and no queue has room: released to CPUs {}",
                    w * 100.0,
                    self.plan.queues[q],
                    topology::format_cpu_list(&cpus)
                );
            }
            if let Err(e) = topology::pin_thread(tid, &cpus) {
                log::warn!(
                    "cannot set queue {q}'s CPUs to {}: {e}",
                    topology::format_cpu_list(&cpus)
                );
            }
        }
    }

    /// Each queue's affinity state (one entry per queue).
    pub fn queue_affinity(&self) -> Vec<QueueAffinity> {
        self.placement
            .affinity
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
    }

    /// The moves applied so far.
    pub fn moves(&self) -> Moves {
        *self.placement.moves.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// How each queue's CPU and thread fared in the last interval (empty before it).
    pub fn queues_last_seen(&self) -> Vec<QueueSeen> {
        self.placement
            .last_reading
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .queues
            .clone()
    }
}

/// Applies a decision to the peer's plane (the queue moves go through the core, which owns
/// the receiver indices; see the caller).
fn apply(peer: &PeerPlane, m: &Move, now: Instant) {
    match m {
        Move::Spread(_, s) => peer.set_spread(*s, now),
        Move::Pool(_, p) => peer.pool.store(*p, Ordering::Relaxed),
        Move::Queue(..) => peer.load.lock().unwrap_or_else(|p| p.into_inner()).moved = Some(now),
    }
}

/// The OS thread id of queue `q`'s thread (registered as `queue{q}` by `crate::threads`).
fn queue_thread(threads: &[Arc<ThreadStats>], q: usize) -> Option<i32> {
    let name = format!("queue{q}");
    threads.iter().find(|t| t.name == name).map(|t| t.tid)
}
