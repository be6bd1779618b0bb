//! A transport session: the pair of keys one handshake derives, with its send counter and
//! replay window (whitepaper section 5.4.6).
//!
//! A session is shared (`Arc`) between the protocol core and the data plane's workers, so
//! crypto runs outside the interface's lock: nonces are reserved a batch at a time from an
//! atomic counter, sealing and opening take `&self`, and the replay window, which must be
//! consulted in order after authentication, has a small lock of its own.

use crate::crypto::{AeadKey, TAG_LEN};
use crate::handshake::SessionKeys;
use crate::messages::{DataHeader, DATA_HEADER_LEN};
use crate::replay::ReplayWindow;
use crate::timers::{REJECT_AFTER_MESSAGES, REJECT_AFTER_TIME};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;
use std::time::Instant;

pub struct Session {
    pub local_index: u32,
    pub remote_index: u32,
    pub we_initiated: bool,
    pub born: Instant,
    send: AeadKey,
    recv: AeadKey,
    send_counter: AtomicU64,
    replay: Mutex<ReplayWindow>,
}

impl Session {
    pub fn new(keys: &SessionKeys, now: Instant) -> Self {
        Session {
            local_index: keys.local_index,
            remote_index: keys.remote_index,
            we_initiated: keys.we_initiated,
            born: now,
            send: AeadKey::new(&keys.send),
            recv: AeadKey::new(&keys.recv),
            send_counter: AtomicU64::new(0),
            replay: Mutex::new(ReplayWindow::default()),
        }
    }

    pub fn expired(&self, now: Instant) -> bool {
        now.saturating_duration_since(self.born) >= REJECT_AFTER_TIME
    }

    pub fn can_send(&self, now: Instant) -> bool {
        !self.expired(now) && self.send_counter() < REJECT_AFTER_MESSAGES
    }

    #[doc(hidden)]
    pub fn set_send_counter_for_test(&self, counter: u64) {
        self.send_counter.store(counter, Ordering::Relaxed);
    }

    /// The next counter that will be reserved.
    pub fn send_counter(&self) -> u64 {
        self.send_counter.load(Ordering::Relaxed)
    }

    /// Reserves `n` consecutive counters (nonces) for a batch; None if that would pass
    /// REJECT_AFTER_MESSAGES, in which case the session must not send any more.
    pub fn reserve(&self, n: u64) -> Option<u64> {
        let start = self.send_counter.fetch_add(n, Ordering::Relaxed);
        (start.checked_add(n)? <= REJECT_AFTER_MESSAGES).then_some(start)
    }

    /// Seals a data message with a reserved `counter`: the caller has put the (padded)
    /// plaintext at `out[DATA_HEADER_LEN..DATA_HEADER_LEN + padded_len]`. Returns the message
    /// length.
    pub fn seal_at(&self, counter: u64, padded_len: usize, out: &mut [u8]) -> usize {
        let total = DATA_HEADER_LEN + padded_len + TAG_LEN;
        DataHeader {
            receiver: self.remote_index,
            counter,
        }
        .write(out);
        self.send.seal_in_place(counter, &[], &mut out[DATA_HEADER_LEN..total]);
        total
    }

    /// Authenticates and decrypts a whole data message in place, leaving the plaintext at
    /// `msg[DATA_HEADER_LEN..DATA_HEADER_LEN + len]`; returns the counter and `len`. The
    /// replay window is not consulted: [`Self::replay_window`] does that, in order.
    pub fn open_in_place(&self, msg: &mut [u8]) -> Result<(u64, usize), OpenError> {
        let h = DataHeader::parse(msg);
        let len = self
            .recv
            .open_in_place(h.counter, &[], &mut msg[DATA_HEADER_LEN..])
            .ok_or(OpenError::Decrypt)?;
        Ok((h.counter, len))
    }

    /// The replay window, which accepts an authenticated counter exactly once; held for a
    /// run of counters (one lock for the run).
    pub fn replay_window(&self) -> std::sync::MutexGuard<'_, ReplayWindow> {
        self.replay.lock().unwrap_or_else(|p| p.into_inner())
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum OpenError {
    Decrypt,
    Replay,
}

#[cfg(test)]
mod tests {
    use super::*;
    use zeroize::Zeroizing;

    fn pair() -> (Session, Session) {
        let now = Instant::now();
        let k = |s: u8, r: u8, we| SessionKeys {
            send: Zeroizing::new([s; 32]),
            recv: Zeroizing::new([r; 32]),
            local_index: 1,
            remote_index: 2,
            we_initiated: we,
        };
        (Session::new(&k(1, 2, true), now), Session::new(&k(2, 1, false), now))
    }

    #[test]
    fn batches_reserve_disjoint_counters() {
        let (a, _) = pair();
        assert_eq!(a.reserve(64), Some(0));
        assert_eq!(a.reserve(1), Some(64));
        assert_eq!(a.send_counter(), 65);
        a.set_send_counter_for_test(REJECT_AFTER_MESSAGES - 2);
        assert_eq!(a.reserve(2), Some(REJECT_AFTER_MESSAGES - 2));
        assert_eq!(a.reserve(1), None, "never past REJECT_AFTER_MESSAGES");
        assert!(!a.can_send(Instant::now()));
    }

    #[test]
    fn open_then_accept_once() {
        let (a, b) = pair();
        let mut m = vec![0u8; 16 + 16 + 16];
        m[16..32].copy_from_slice(b"sixteen bytes!!!");
        let c = a.reserve(1).unwrap();
        let n = a.seal_at(c, 16, &mut m);
        let mut copy = m[..n].to_vec();
        assert_eq!(b.open_in_place(&mut m[..n]), Ok((0, 16)));
        assert_eq!(&m[16..32], b"sixteen bytes!!!");
        assert!(b.replay_window().accept(0));
        assert_eq!(
            b.open_in_place(&mut copy),
            Ok((0, 16)),
            "opening alone does not consume"
        );
        assert!(!b.replay_window().accept(0));
    }
}
