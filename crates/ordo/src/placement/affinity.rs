//! Where a queue's thread may run (inline, auto): pinned to its CPU, or released to the I/O
//! CPUs of its node while the machine is contended.
//!
//! Pinned is what a queue is for: its peers' packets stay on one core. But a pinned thread
//! cannot take a CPU that another one left idle. With a load generator of 1,000 clients on
//! the same cores, every queue thread waited much of the time for its own CPU, the placement
//! had nowhere to move a peer (every queue's CPU was as busy), and the sockets overflowed;
//! released, the same run carried more with almost no loss (BENCHMARKS.md, "Queue threads
//! under contention").
//!
//! So a pinned queue whose thread is starved (waits more than [`STARVED`] of the time for its
//! CPU) while no other queue's CPU has room for its peers, and the placement is not moving a
//! peer off it (two tunnel ends crowding one core: the move is the cure), is released. After
//! [`HOLD`] it is pinned again, on trial: contention that lasts starves it again within a few
//! intervals, and then the next release holds twice as long (up to [`HOLD_MAX`]), so that a
//! machine that stays contended pays for a trial rarely. A queue that stays pinned past
//! [`TRIAL`] starts over from [`HOLD`]. Sans-IO: the caller reads the figures and sets the
//! affinity.

use super::{QueueSeen, IMBALANCE, QUEUE_DWELL, STARVED};
use std::time::{Duration, Instant};

/// How long a first release lasts before the queue is pinned again on trial.
pub const HOLD: Duration = Duration::from_secs(10);
/// The longest a release lasts (contention that outlasts every trial).
pub const HOLD_MAX: Duration = Duration::from_secs(320);
/// A trial fails if the queue is starved again within this time of being pinned: the
/// figures need two placement intervals to show it (they count what lasted two readings).
pub const TRIAL: Duration = Duration::from_secs(5);

/// One queue's affinity state.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct QueueAffinity {
    /// Since when the thread is released (None: pinned).
    released: Option<Instant>,
    /// When the thread was last pinned again after a release.
    repinned: Option<Instant>,
    /// How long the next release lasts.
    hold: Duration,
    /// When the placement last moved a peer off this queue.
    gave_peer: Option<Instant>,
    /// Releases so far, for `ordo show`.
    pub releases: u64,
}

impl Default for QueueAffinity {
    fn default() -> Self {
        QueueAffinity {
            released: None,
            repinned: None,
            hold: HOLD,
            gave_peer: None,
            releases: 0,
        }
    }
}

impl QueueAffinity {
    pub fn is_released(&self) -> bool {
        self.released.is_some()
    }

    /// The placement moves a peer off this queue: that is its answer to the wait, so no
    /// release until the move had time to show (the figures lag it by two readings).
    pub fn gave_peer(&mut self, now: Instant) {
        self.gave_peer = Some(now);
    }
}

/// A change to make: release queue `.0` (true) or pin it again (false).
pub type Change = (usize, bool);

/// Updates every queue's state from how the queues fared (one entry per queue, as
/// [`super::decide`] sees them) and returns the changes to apply.
pub fn update(state: &mut [QueueAffinity], seen: &[QueueSeen], now: Instant) -> Vec<Change> {
    // As in the placement's relief: a queue whose CPU has room takes a starved queue's peer.
    let room = |q: usize| {
        seen.iter()
            .enumerate()
            .any(|(i, s)| i != q && s.wait < STARVED / 2.0 && s.idle >= IMBALANCE)
    };
    let mut changes = Vec::new();
    for (q, a) in state.iter_mut().enumerate() {
        let Some(s) = seen.get(q) else { continue };
        match a.released {
            Some(since) => {
                if now.saturating_duration_since(since) >= a.hold {
                    a.released = None;
                    a.repinned = Some(now);
                    changes.push((q, false));
                }
            }
            None => {
                let since_trial = a.repinned.map(|t| now.saturating_duration_since(t));
                let moving = a
                    .gave_peer
                    .is_some_and(|t| now.saturating_duration_since(t) < QUEUE_DWELL);
                if s.wait > STARVED && !room(q) && !moving {
                    if since_trial.is_some_and(|d| d <= TRIAL) {
                        a.hold = (a.hold * 2).min(HOLD_MAX);
                    }
                    a.released = Some(now);
                    a.releases += 1;
                    changes.push((q, true));
                } else if since_trial.is_some_and(|d| d > TRIAL) {
                    a.hold = HOLD;
                    a.repinned = None;
                }
            }
        }
    }
    changes
}

#[cfg(test)]
mod tests {
    use super::*;

    fn seen(wait: f64, idle: f64) -> QueueSeen {
        QueueSeen { other: 0.5, idle, wait }
    }

    #[test]
    fn a_starved_queue_is_released_only_when_no_queue_has_room() {
        let t0 = Instant::now();
        let mut st = [QueueAffinity::default(); 2];
        // Queue 0 starved, queue 1's CPU 40% idle and its thread not waiting: the placement
        // moves a peer instead.
        assert!(update(&mut st, &[seen(0.5, 0.0), seen(0.0, 0.4)], t0).is_empty());
        // Waiting under the threshold: nothing.
        assert!(update(&mut st, &[seen(0.2, 0.0), seen(0.2, 0.0)], t0).is_empty());
        // Both starved (1,000 clients beside a load generator): both released.
        assert_eq!(
            update(&mut st, &[seen(0.5, 0.1), seen(0.4, 0.1)], t0),
            vec![(0, true), (1, true)]
        );
        assert!(st.iter().all(|a| a.is_released() && a.releases == 1));
        // Released, whatever the figures, until the hold is over.
        let later = t0 + HOLD - Duration::from_millis(1);
        assert!(update(&mut st, &[seen(0.0, 0.9), seen(0.0, 0.9)], later).is_empty());
    }

    #[test]
    fn a_queue_giving_a_peer_away_is_not_released_while_the_move_shows() {
        let t0 = Instant::now();
        let mut st = [QueueAffinity::default(); 2];
        let crowded = [seen(0.5, 0.1), seen(0.0, 0.1)];
        st[0].gave_peer(t0);
        assert!(update(&mut st, &crowded, t0).is_empty());
        assert!(update(&mut st, &crowded, t0 + QUEUE_DWELL - Duration::from_millis(1)).is_empty());
        // Still starved once the move had time to show: released.
        assert_eq!(update(&mut st, &crowded, t0 + QUEUE_DWELL), vec![(0, true)]);
    }

    #[test]
    fn failed_trials_hold_longer_and_a_quiet_spell_starts_over() {
        let mut t = Instant::now();
        let mut st = [QueueAffinity::default(); 1];
        let starved = [seen(0.6, 0.05)];
        assert_eq!(update(&mut st, &starved, t), vec![(0, true)]);
        let mut holds = Vec::new();
        for _ in 0..8 {
            t += st[0].hold;
            holds.push(st[0].hold.as_secs());
            assert_eq!(update(&mut st, &starved, t), vec![(0, false)], "pinned on trial");
            // Starved again two intervals into the trial: released for twice as long.
            t += Duration::from_secs(2);
            assert_eq!(update(&mut st, &starved, t), vec![(0, true)]);
        }
        assert_eq!(holds, [10, 20, 40, 80, 160, 320, 320, 320]);
        assert_eq!(st[0].releases, 9);
        // A trial that holds past TRIAL: the next release starts from HOLD again.
        t += st[0].hold;
        assert_eq!(update(&mut st, &starved, t), vec![(0, false)]);
        t += TRIAL + Duration::from_secs(1);
        assert!(update(&mut st, &[seen(0.1, 0.3)], t).is_empty());
        t += Duration::from_secs(30);
        assert_eq!(update(&mut st, &starved, t), vec![(0, true)]);
        assert_eq!(st[0].hold, HOLD);
    }
}
