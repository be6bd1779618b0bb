//! Placement: which queue, pool and regime each peer runs in, decided from measured load.
//! Pure policy: figures in ([`Seen`] per peer, [`QueueSeen`] per queue), moves out
//! ([`Move`]); the plane measures and applies (`plane::rebalance`). Its parts:
//! - [`model`]: the execution models and the plan of threads and CPUs resolved from the
//!   user's settings;
//! - this module: the per-peer moves between queues, pools and regimes;
//! - [`affinity`]: when a queue's thread is released from its CPU under contention.
//!
//! Where a peer runs:
//! - its **queue** (inline, auto): the protocol core's `Peer::queue`, which our receiver
//!   indices encode so that the outer port steers the peer's datagrams to that queue;
//! - its **pool** (pool, threaded, auto): the NUMA node whose workers do its crypto;
//! - **spread** or not (auto): whether its crypto goes to the pool or stays on its queue.
//!
//! The decisions are made from each peer's load, in cores: its packets in the last interval
//! times the measured cost of a packet's whole path (receive or read, crypto, delivery).
//! A queue's load also counts what else keeps its core busy (`host::cpuload`): a queue pinned
//! to a core that another process saturates gives its peers to a freer one; and a queue whose
//! thread keeps waiting for its core (something else pinned there: the kernel cannot move
//! either) gives a peer to a queue whose core has room. Decisions move at most one peer per
//! interval and need a clear imbalance, and a moved peer stays put for a while, so that noise
//! does not make peers flap.

pub mod affinity;
pub mod model;

use model::Model;
use ordo_proto::PeerId;
use std::time::Duration;

/// Auto model: a peer above this load (in cores: its packets times the measured cost of a
/// packet's whole path) has its crypto spread over the pool, if its queue's CPU is full (less
/// than [`IMBALANCE`] idle) and another core has room for a good share of it (at least
/// [`SPREAD_ROOM`] idle; see [`decide`]). Below a whole core on purpose: the measure leaves
/// out the kernel's share of the queue's core (softirq, copies).
pub const SPREAD_ABOVE: f64 = 0.4;
/// ... the idle share another core needs for the spread to pay: the hand-offs make each
/// packet cost more, which a core only a little idle does not make up for (BENCHMARKS.md,
/// "Auto's spread rule").
pub const SPREAD_ROOM: f64 = 0.5;
/// ... and comes back to its queue below this one, after [`MIN_DWELL`] in the pool.
pub const INLINE_BELOW: f64 = 0.15;
pub const MIN_DWELL: Duration = Duration::from_secs(5);
/// A queue (or pool) this much busier than the least busy one, in cores, gives up a peer.
pub const IMBALANCE: f64 = 0.2;
/// How often loads are measured and decisions made.
pub const INTERVAL: Duration = Duration::from_secs(1);
/// A queue whose thread waited, runnable, for its CPU more than this share of the interval is
/// starved: something pinned shares its core.
pub const STARVED: f64 = 0.25;
/// A peer moved to another queue stays there at least this long: each move costs a
/// handshake, and the loads need a few intervals to show the move's effect.
pub const QUEUE_DWELL: Duration = Duration::from_secs(3);

/// A peer as the decisions see it.
#[derive(Clone, Debug)]
pub struct Seen {
    pub id: PeerId,
    pub queue: u32,
    pub pool: usize,
    pub spread: bool,
    pub cores: f64,
    /// Time since `spread` last changed (None: never).
    pub dwell: Option<Duration>,
    /// Time since the peer last moved to another queue (None: never).
    pub queue_dwell: Option<Duration>,
}

/// A queue as the decisions see it: what its CPU did besides our work, in cores, its CPU's
/// idle share, and the share of the time its thread waited for the CPU.
#[derive(Clone, Copy, Debug, Default)]
pub struct QueueSeen {
    pub other: f64,
    pub idle: f64,
    pub wait: f64,
}

#[derive(Clone, Debug, PartialEq)]
pub enum Move {
    /// Auto: the peer's crypto goes to the pool (true) or back to its queue (false).
    Spread(PeerId, bool),
    Queue(PeerId, u32),
    Pool(PeerId, usize),
}

/// What to change, given every peer's load and how each queue's CPU fared (one entry per
/// queue). At most one queue move and one pool move per call, each only when it narrows a
/// clear imbalance or relieves a crowded queue.
pub fn decide(model: Model, peers: &[Seen], queues: &[QueueSeen], pools: usize) -> Vec<Move> {
    let mut moves = Vec::new();
    let mut spread: Vec<bool> = peers.iter().map(|p| p.spread).collect();
    if model == Model::Auto {
        // Spreading a peer's crypto only helps if its own core is full and another core has
        // room for a good share of it: otherwise the hand-offs cost and nothing is gained
        // (BENCHMARKS.md, "Auto's spread rule").
        let own = |q: u32| q as usize % queues.len().max(1);
        let full = |q: u32| queues.get(own(q)).is_none_or(|s| s.idle < IMBALANCE);
        let room_beside = |q: u32| (queues.iter().enumerate()).any(|(i, s)| i != own(q) && s.idle >= SPREAD_ROOM);
        for (i, p) in peers.iter().enumerate() {
            let settled = p.dwell.is_none_or(|d| d >= MIN_DWELL);
            if !p.spread && p.cores > SPREAD_ABOVE && full(p.queue) && room_beside(p.queue) {
                moves.push(Move::Spread(p.id, true));
                spread[i] = true;
            } else if p.spread && p.cores < INLINE_BELOW && settled {
                moves.push(Move::Spread(p.id, false));
                spread[i] = false;
            }
        }
    }
    if model.has_queues() {
        let on_queue = |i: usize| !spread[i];
        let settled = |p: &Seen| p.queue_dwell.is_none_or(|d| d >= QUEUE_DWELL);
        let other: Vec<f64> = queues.iter().map(|q| q.other).collect();
        let moved = rebalance(peers, &other, |p| p.queue as usize, on_queue, settled)
            .or_else(|| relieve(peers, queues, on_queue, settled));
        if let Some((id, to)) = moved {
            moves.push(Move::Queue(id, to as u32));
        }
    }
    if model.has_pool() {
        let in_pool = |i: usize| spread[i];
        if let Some((id, to)) = rebalance(peers, &vec![0.0; pools], |p| p.pool, in_pool, |_| true) {
            moves.push(Move::Pool(id, to));
        }
    }
    moves
}

/// One move from the busiest to the least busy bin, of a peer that `may_move`, the one that
/// leaves the two closest (the heavier one on a tie); None if the bins are within
/// [`IMBALANCE`] or no move narrows their gap by at least that much (a move that barely helps
/// costs a handshake and can be undone by the next reading). A bin's load starts at its
/// `base` (one entry per bin).
fn rebalance(
    peers: &[Seen],
    base: &[f64],
    bin_of: impl Fn(&Seen) -> usize,
    counts: impl Fn(usize) -> bool,
    may_move: impl Fn(&Seen) -> bool,
) -> Option<(PeerId, usize)> {
    let bins = base.len();
    if bins < 2 {
        return None;
    }
    let mut load = base.to_vec();
    for (i, p) in peers.iter().enumerate() {
        if counts(i) {
            load[bin_of(p) % bins] += p.cores;
        }
    }
    let by = |a: &(usize, &f64), b: &(usize, &f64)| a.1.total_cmp(b.1);
    let (hi, &hi_load) = load.iter().enumerate().max_by(by)?;
    let (lo, &lo_load) = load.iter().enumerate().min_by(by)?;
    let gap = hi_load - lo_load;
    if gap <= IMBALANCE {
        return None;
    }
    peers
        .iter()
        .enumerate()
        .filter(|(i, p)| {
            counts(*i)
                && bin_of(p) % bins == hi
                && p.cores > 0.0
                && (gap - 2.0 * p.cores).abs() <= gap - IMBALANCE
                && may_move(p)
        })
        .min_by(|a, b| {
            let after = |p: &Seen| (gap - 2.0 * p.cores).abs();
            after(a.1).total_cmp(&after(b.1)).then(b.1.cores.total_cmp(&a.1.cores))
        })
        .map(|(_, p)| (p.id, lo))
}

/// A crowded queue gives a peer to the queue whose CPU has the most room. Crowded: its thread
/// waited more than [`STARVED`] of the time for its CPU (starved), or its CPU had almost no
/// idle time while other work than ours took more than [`IMBALANCE`] of it. The room: the
/// other queue's thread hardly waited and its CPU had at least [`IMBALANCE`] idle, and, unless
/// the peer is starved, at least its load more. Of the crowded queue's peers lighter than the
/// other work on its CPU, the one whose load is closest to the room moves: the lighter party
/// gives way, so that of two daemons crowding one core exactly one moves (each sees the
/// other as the other work), and neither moves back once they are apart. The load balance
/// cannot see these cases: a starved peer's measured load is what it got, not what it needs;
/// and other work's load cannot move, so moving a light peer does not narrow the gap, yet
/// spares the peer the wait.
fn relieve(
    peers: &[Seen],
    queues: &[QueueSeen],
    counts: impl Fn(usize) -> bool,
    may_move: impl Fn(&Seen) -> bool,
) -> Option<(PeerId, usize)> {
    let crowded = |q: &QueueSeen| q.wait > STARVED || (q.idle < IMBALANCE / 2.0 && q.other > IMBALANCE);
    let (hi, from) = (queues.iter().enumerate())
        .filter(|(_, q)| crowded(q))
        .max_by(|a, b| a.1.wait.total_cmp(&b.1.wait).then(b.1.idle.total_cmp(&a.1.idle)))?;
    let (lo, room) = (queues.iter().enumerate())
        .filter(|(q, s)| *q != hi && s.wait < STARVED / 2.0 && s.idle >= IMBALANCE)
        .max_by(|a, b| a.1.idle.total_cmp(&b.1.idle))?;
    let fits = |p: &Seen| from.wait > STARVED || p.cores + IMBALANCE <= room.idle;
    (peers.iter().enumerate())
        .filter(|(i, p)| counts(*i) && p.queue as usize % queues.len() == hi && p.cores > 0.0)
        .filter(|(_, p)| may_move(p) && fits(p) && p.cores <= from.other)
        .min_by(|a, b| (a.1.cores - room.idle).abs().total_cmp(&(b.1.cores - room.idle).abs()))
        .map(|(_, p)| (p.id, lo))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn seen(id: u64, queue: u32, cores: f64, spread: bool) -> Seen {
        Seen {
            id: PeerId(id),
            queue,
            pool: 0,
            spread,
            cores,
            dwell: None,
            queue_dwell: None,
        }
    }

    #[test]
    fn auto_spreads_a_heavy_peer_and_brings_it_back_with_hysteresis() {
        let heavy = seen(1, 0, 0.9, false);
        let room = queues(&[(0.0, 0.0, 0.0), (0.0, 0.9, 0.0)]);
        assert_eq!(
            decide(Model::Auto, std::slice::from_ref(&heavy), &room, 1),
            vec![Move::Spread(PeerId(1), true)]
        );
        // Not when no other core has room for a good share of it: the spread would only add
        // hand-offs (a point-to-point flow, the other tunnel end and iperf3 on the other core).
        for idle in [0.1, SPREAD_ROOM - 0.05] {
            let busy = queues(&[(0.0, 0.0, 0.0), (1.0 - idle, idle, 0.0)]);
            assert!(
                decide(Model::Auto, std::slice::from_ref(&heavy), &busy, 1).is_empty(),
                "{idle}"
            );
        }
        // Nor while its own core has room: one core carries it.
        let roomy = queues(&[(0.0, IMBALANCE, 0.0), (0.0, 0.9, 0.0)]);
        assert!(decide(Model::Auto, &[heavy], &roomy, 1).is_empty());
        // Between the thresholds nothing changes, either way.
        assert!(decide(Model::Auto, &[seen(1, 0, 0.3, true)], &[QueueSeen::default()], 1).is_empty());
        assert!(decide(Model::Auto, &[seen(1, 0, 0.3, false)], &[QueueSeen::default()], 1).is_empty());
        // Light again, but only just spread: it stays until MIN_DWELL has passed.
        let mut light = seen(1, 0, 0.05, true);
        light.dwell = Some(Duration::from_secs(1));
        assert!(decide(Model::Auto, std::slice::from_ref(&light), &[QueueSeen::default()], 1).is_empty());
        light.dwell = Some(MIN_DWELL);
        assert_eq!(
            decide(Model::Auto, &[light], &[QueueSeen::default()], 1),
            vec![Move::Spread(PeerId(1), false)]
        );
        // The other models never change the regime.
        assert!(decide(Model::Inline, &[seen(1, 0, 0.9, false)], &[QueueSeen::default()], 1).is_empty());
    }

    #[test]
    fn queues_are_balanced_by_load_not_count() {
        // Queue 0 carries 0.7 cores in three peers, queue 1 carries 0.1: moving 0.4 or 0.2
        // leaves the queues 0.2 apart; the heavier moves.
        let peers = [
            seen(1, 0, 0.4, false),
            seen(2, 0, 0.2, false),
            seen(3, 0, 0.1, false),
            seen(4, 1, 0.1, false),
        ];
        assert_eq!(
            decide(Model::Inline, &peers, &[QueueSeen::default(); 2], 0),
            vec![Move::Queue(PeerId(1), 1)]
        );
        // Within the tolerance: no move.
        let peers = [seen(1, 0, 0.25, false), seen(2, 1, 0.1, false)];
        assert!(decide(Model::Inline, &peers, &[QueueSeen::default(); 2], 0).is_empty());
        // One peer heavier than the gap cannot help by moving: it stays.
        let peers = [seen(1, 0, 0.9, false)];
        assert!(decide(Model::Inline, &peers, &[QueueSeen::default(); 2], 0).is_empty());
    }

    fn queues(q: &[(f64, f64, f64)]) -> Vec<QueueSeen> {
        q.iter()
            .map(|&(other, idle, wait)| QueueSeen { other, idle, wait })
            .collect()
    }

    #[test]
    fn a_queue_whose_core_is_busy_with_other_work_gives_its_peer_away() {
        // One peer, 0.45 cores, on queue 0, whose core something else keeps 0.55 busy (another
        // daemon's queue, say); queue 1's core is 0.2 busy: the peer moves.
        let peer = seen(1, 0, 0.45, false);
        let busy = queues(&[(0.55, 0.0, 0.0), (0.2, 0.8, 0.0)]);
        let moves = decide(Model::Inline, std::slice::from_ref(&peer), &busy, 0);
        assert_eq!(moves, vec![Move::Queue(PeerId(1), 1)]);
        // Not if the other core is nearly as busy: the move would only turn the imbalance.
        let both = queues(&[(0.55, 0.0, 0.0), (0.7, 0.3, 0.0)]);
        assert!(decide(Model::Inline, std::slice::from_ref(&peer), &both, 0).is_empty());
        // Not again soon after a move: the loads have not shown its effect yet.
        let mut moved = peer.clone();
        moved.queue_dwell = Some(Duration::from_secs(1));
        assert!(decide(Model::Inline, std::slice::from_ref(&moved), &busy, 0).is_empty());
        moved.queue_dwell = Some(QUEUE_DWELL);
        assert_eq!(
            decide(Model::Inline, &[moved], &busy, 0),
            vec![Move::Queue(PeerId(1), 1)]
        );
        // A light peer on a core that other work saturates moves to one with room for it,
        // though that does not narrow the load gap (the other work stays).
        let spinner = queues(&[(1.0, 0.0, 0.01), (0.05, 0.95, 0.0)]);
        let light = seen(2, 0, 0.01, false);
        assert_eq!(
            decide(Model::Inline, std::slice::from_ref(&light), &spinner, 0),
            vec![Move::Queue(PeerId(2), 1)]
        );
        // Other load alone, with no peer of ours to move, changes nothing.
        assert!(decide(Model::Inline, &[], &queues(&[(1.0, 0.0, 0.5), (0.0, 1.0, 0.0)]), 0).is_empty());
    }

    #[test]
    fn a_starved_queue_gives_a_peer_to_a_queue_with_room() {
        // Two tunnel ends on one machine, both pinned to CPU 0: our peer gets 0.4 cores and
        // our queue thread waits half the time. CPU 1 runs unpinned work (0.57) and is 43%
        // idle. By load alone the move would not narrow the gap (0.4 + 0.5 against 0.57);
        // the starvation says the peer needs more than it gets.
        let peer = seen(1, 0, 0.4, false);
        let collided = queues(&[(0.5, 0.09, 0.5), (0.57, 0.43, 0.0)]);
        assert_eq!(
            decide(Model::Inline, std::slice::from_ref(&peer), &collided, 0),
            vec![Move::Queue(PeerId(1), 1)]
        );
        // Ends apart, each core nearly full (unpinned work beside ours): A's peer stays even
        // when B's core shows some idle time, unless there is room for the whole peer.
        let apart = queues(&[(0.7, 0.25, 0.0), (0.3, 0.03, 0.1)]);
        let a = seen(1, 1, 0.65, false);
        assert!(decide(Model::Inline, std::slice::from_ref(&a), &apart, 0).is_empty());
        // The other daemon's view of the same collision: its peer (0.5 cores) is the heavier
        // party on that CPU (0.4 of other work): it stays, and only ours moves.
        let theirs = queues(&[(0.4, 0.09, 0.5), (0.57, 0.43, 0.0)]);
        assert!(decide(Model::Inline, &[seen(1, 0, 0.5, false)], &theirs, 0).is_empty());
        // A heavy peer alone on its core (no wait) stays, however idle the other core is.
        let alone = queues(&[(0.05, 0.0, 0.02), (0.0, 1.0, 0.0)]);
        assert!(decide(Model::Inline, &[seen(1, 0, 0.95, false)], &alone, 0).is_empty());
        // Starved, but the other core has no room (or its thread waits too): no move.
        let full = queues(&[(0.5, 0.05, 0.5), (0.6, 0.1, 0.0)]);
        assert!(decide(Model::Inline, std::slice::from_ref(&peer), &full, 0).is_empty());
        let waiting = queues(&[(0.5, 0.05, 0.5), (0.57, 0.43, 0.2)]);
        assert!(decide(Model::Inline, std::slice::from_ref(&peer), &waiting, 0).is_empty());
    }

    #[test]
    fn pools_are_balanced_among_spread_peers_only() {
        let mut a = seen(1, 0, 0.8, true);
        let mut b = seen(2, 0, 0.5, true);
        let c = seen(3, 1, 3.0, false); // on a queue: not the pools' load
        a.pool = 0;
        b.pool = 0;
        assert_eq!(
            decide(Model::Pool, &[a, b, c], &[QueueSeen::default()], 2),
            vec![Move::Pool(PeerId(1), 1)]
        );
    }
}
