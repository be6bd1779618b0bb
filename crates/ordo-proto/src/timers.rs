//! The timers of the whitepaper (section 6) as deadlines, not threads: events move deadlines,
//! and [`Timers::expired`] tells the caller which ones have passed at the time it passes in.
//! Their interplay follows the Linux implementation, which the whitepaper summarises.

use std::time::{Duration, Instant};

pub const REKEY_AFTER_MESSAGES: u64 = 1 << 60;
pub const REJECT_AFTER_MESSAGES: u64 = u64::MAX - (1 << 13);
pub const REKEY_AFTER_TIME: Duration = Duration::from_secs(120);
pub const REJECT_AFTER_TIME: Duration = Duration::from_secs(180);
pub const REKEY_ATTEMPT_TIME: Duration = Duration::from_secs(90);
pub const REKEY_TIMEOUT: Duration = Duration::from_secs(5);
pub const KEEPALIVE_TIMEOUT: Duration = Duration::from_secs(10);
pub const COOKIE_SECRET_MAX_AGE: Duration = Duration::from_secs(120);
/// Retries before a handshake is abandoned: REKEY_ATTEMPT_TIME / REKEY_TIMEOUT.
pub const MAX_HANDSHAKE_ATTEMPTS: u32 = 18;
/// Initiations accepted from one peer at most this often (50 per second).
pub const INITIATION_MIN_INTERVAL: Duration = Duration::from_millis(20);
/// The receiving side of a session initiates a rekey when its key is this old and still used,
/// so that the key is fresh before REJECT_AFTER_TIME.
pub const REKEY_ON_RECEIVE_AGE: Duration = Duration::from_secs(180 - 10 - 5); // REJECT_AFTER_TIME - KEEPALIVE_TIMEOUT - REKEY_TIMEOUT
/// Up to a third of a second of jitter on handshake timers, so peers do not synchronise.
pub const MAX_JITTER_MS: u64 = 333;

/// Which timers fired, as returned by [`Timers::expired`].
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct Expired {
    /// No response to our initiation: send it again, or give up.
    pub retransmit_handshake: bool,
    /// We received data and sent nothing back: send a keepalive.
    pub send_keepalive: bool,
    /// We sent data and heard nothing back: start a new handshake.
    pub new_handshake: bool,
    /// No new session for 3 x REJECT_AFTER_TIME: erase all keys.
    pub zero_key_material: bool,
    /// The persistent keepalive interval elapsed with nothing sent.
    pub persistent_keepalive: bool,
    /// A handshake that the one-initiation-per-REKEY_TIMEOUT limit held back may now go
    /// (packets wait for it, or the peer moved to another receive queue).
    pub held_handshake: bool,
}

impl Expired {
    pub fn any(&self) -> bool {
        self.retransmit_handshake
            || self.send_keepalive
            || self.new_handshake
            || self.zero_key_material
            || self.persistent_keepalive
            || self.held_handshake
    }
}

/// A peer's timer deadlines. The methods are the events of the Linux implementation.
#[derive(Debug, Default, Clone)]
pub struct Timers {
    retransmit_handshake: Option<Instant>,
    send_keepalive: Option<Instant>,
    new_handshake: Option<Instant>,
    zero_key_material: Option<Instant>,
    persistent_keepalive: Option<Instant>,
    held_handshake: Option<Instant>,
    need_another_keepalive: bool,
    /// Persistent keepalive interval; zero disables it.
    pub persistent_interval: Duration,
}

impl Timers {
    /// We sent a transport data packet (not a keepalive).
    pub fn data_sent(&mut self, now: Instant, jitter: Duration) {
        if self.new_handshake.is_none() {
            self.new_handshake = Some(now + KEEPALIVE_TIMEOUT + REKEY_TIMEOUT + jitter);
        }
    }

    /// We received a transport data packet (not a keepalive).
    pub fn data_received(&mut self, now: Instant) {
        if self.send_keepalive.is_none() {
            self.send_keepalive = Some(now + KEEPALIVE_TIMEOUT);
        } else {
            self.need_another_keepalive = true;
        }
    }

    /// We sent any authenticated packet: a keepalive is no longer owed.
    pub fn any_authenticated_packet_sent(&mut self) {
        self.send_keepalive = None;
    }

    /// We received any authenticated packet: the peer is alive.
    pub fn any_authenticated_packet_received(&mut self) {
        self.new_handshake = None;
    }

    /// Any authenticated packet crossed in either direction.
    pub fn any_authenticated_packet_traversal(&mut self, now: Instant) {
        if !self.persistent_interval.is_zero() {
            self.persistent_keepalive = Some(now + self.persistent_interval);
        }
    }

    pub fn handshake_initiated(&mut self, now: Instant, jitter: Duration) {
        self.retransmit_handshake = Some(now + REKEY_TIMEOUT + jitter);
        // This initiation is the one that was held back, if any.
        self.held_handshake = None;
    }

    /// A handshake is wanted but may not start before `at` (one initiation per
    /// REKEY_TIMEOUT): packets wait for it, or the peer moved to another receive queue.
    pub fn hold_handshake_until(&mut self, at: Instant) {
        self.held_handshake = Some(at);
    }

    pub fn handshake_complete(&mut self) {
        self.retransmit_handshake = None;
    }

    pub fn session_derived(&mut self, now: Instant) {
        self.zero_key_material = Some(now + REJECT_AFTER_TIME * 3);
    }

    /// Handshake abandoned: keys go in 3 x REJECT_AFTER_TIME unless a handshake succeeds.
    pub fn handshake_abandoned(&mut self, now: Instant) {
        self.retransmit_handshake = None;
        if self.zero_key_material.is_none() {
            self.zero_key_material = Some(now + REJECT_AFTER_TIME * 3);
        }
    }

    /// Arms the persistent keepalive for its first send (the interval was just configured).
    pub fn set_persistent_interval(&mut self, now: Instant, interval: Duration) {
        self.persistent_interval = interval;
        self.persistent_keepalive = (!interval.is_zero()).then_some(now);
    }

    /// The keys were erased (3 x REJECT_AFTER_TIME without a new session): the timers that a
    /// session or a handshake armed go with them. The persistent keepalive stays, as in Linux,
    /// whose key erasure touches no timer: a peer behind NAT that relies on it keeps trying
    /// to reach its remote, and the first try after the remote returns brings the tunnel back.
    pub fn keys_erased(&mut self) {
        *self = Timers {
            persistent_keepalive: self.persistent_keepalive,
            persistent_interval: self.persistent_interval,
            ..Default::default()
        };
    }

    /// The earliest armed deadline, so a driver knows when to call [`Self::expired`] next.
    pub fn next_deadline(&self) -> Option<Instant> {
        [
            self.retransmit_handshake,
            self.send_keepalive,
            self.new_handshake,
            self.zero_key_material,
            self.persistent_keepalive,
            self.held_handshake,
        ]
        .into_iter()
        .flatten()
        .min()
    }

    /// Disarms and reports every timer whose deadline is at or before `now`. The send-keepalive
    /// timer re-arms itself if more data arrived while it was pending; the persistent
    /// keepalive re-arms itself for the next interval, so that it keeps firing when what it
    /// asks for could not be sent (a handshake held back by the one-per-REKEY_TIMEOUT limit
    /// sends nothing, and only what is sent re-arms it otherwise).
    pub fn expired(&mut self, now: Instant) -> Expired {
        fn take(t: &mut Option<Instant>, now: Instant) -> bool {
            if matches!(t, Some(d) if *d <= now) {
                *t = None;
                true
            } else {
                false
            }
        }
        let e = Expired {
            retransmit_handshake: take(&mut self.retransmit_handshake, now),
            send_keepalive: take(&mut self.send_keepalive, now),
            new_handshake: take(&mut self.new_handshake, now),
            zero_key_material: take(&mut self.zero_key_material, now),
            persistent_keepalive: take(&mut self.persistent_keepalive, now),
            held_handshake: take(&mut self.held_handshake, now),
        };
        if e.send_keepalive && self.need_another_keepalive {
            self.need_another_keepalive = false;
            self.send_keepalive = Some(now + KEEPALIVE_TIMEOUT);
        }
        if e.persistent_keepalive && !self.persistent_interval.is_zero() {
            self.persistent_keepalive = Some(now + self.persistent_interval);
        }
        e
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keepalive_owed_after_data_received_unless_we_send() {
        let t0 = Instant::now();
        let mut t = Timers::default();
        t.data_received(t0);
        assert!(!t.expired(t0 + KEEPALIVE_TIMEOUT - Duration::from_millis(1)).any());
        assert!(t.expired(t0 + KEEPALIVE_TIMEOUT).send_keepalive);
        t.data_received(t0);
        t.any_authenticated_packet_sent();
        assert!(!t.expired(t0 + KEEPALIVE_TIMEOUT * 2).any());
    }

    #[test]
    fn new_handshake_when_sent_data_goes_unanswered() {
        let t0 = Instant::now();
        let mut t = Timers::default();
        t.data_sent(t0, Duration::ZERO);
        let at = t0 + KEEPALIVE_TIMEOUT + REKEY_TIMEOUT;
        assert_eq!(t.next_deadline(), Some(at));
        assert!(t.expired(at).new_handshake);
        t.data_sent(t0, Duration::ZERO);
        t.any_authenticated_packet_received();
        assert!(!t.expired(at).any());
    }

    #[test]
    fn persistent_keepalive_rearms_on_traffic() {
        let t0 = Instant::now();
        let mut t = Timers::default();
        t.set_persistent_interval(t0, Duration::from_secs(25));
        assert!(t.expired(t0).persistent_keepalive, "fires at once when configured");
        t.any_authenticated_packet_traversal(t0);
        assert!(!t.expired(t0 + Duration::from_secs(24)).any());
        assert!(t.expired(t0 + Duration::from_secs(25)).persistent_keepalive);
    }

    #[test]
    fn another_keepalive_when_data_kept_coming() {
        let t0 = Instant::now();
        let mut t = Timers::default();
        t.data_received(t0);
        t.data_received(t0 + Duration::from_secs(1));
        assert!(t.expired(t0 + KEEPALIVE_TIMEOUT).send_keepalive);
        assert_eq!(t.next_deadline(), Some(t0 + KEEPALIVE_TIMEOUT * 2));
    }
}
