//! A transport session: the pair of keys one handshake derives, with its send counter and
//! replay window (whitepaper section 5.4.6).

use crate::crypto::{AeadKey, TAG_LEN};
use crate::handshake::SessionKeys;
use crate::messages::{DataHeader, DATA_HEADER_LEN};
use crate::replay::ReplayWindow;
use crate::timers::{REJECT_AFTER_MESSAGES, REJECT_AFTER_TIME};
use std::time::Instant;

pub struct Session {
    pub local_index: u32,
    pub remote_index: u32,
    pub we_initiated: bool,
    pub born: Instant,
    send: AeadKey,
    recv: AeadKey,
    send_counter: u64,
    replay: ReplayWindow,
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
            send_counter: 0,
            replay: ReplayWindow::default(),
        }
    }

    pub fn expired(&self, now: Instant) -> bool {
        now.saturating_duration_since(self.born) >= REJECT_AFTER_TIME
    }

    pub fn can_send(&self, now: Instant) -> bool {
        !self.expired(now) && self.send_counter < REJECT_AFTER_MESSAGES
    }

    #[doc(hidden)]
    pub fn set_send_counter_for_test(&mut self, counter: u64) {
        self.send_counter = counter;
    }

    pub fn send_counter(&self) -> u64 {
        self.send_counter
    }

    /// Seals a data message in `out`: the caller has put the (padded) plaintext at
    /// `out[DATA_HEADER_LEN..DATA_HEADER_LEN + padded_len]`. Returns the message length.
    pub fn seal(&mut self, padded_len: usize, out: &mut [u8]) -> usize {
        let counter = self.send_counter;
        self.send_counter += 1;
        let total = DATA_HEADER_LEN + padded_len + TAG_LEN;
        DataHeader {
            receiver: self.remote_index,
            counter,
        }
        .write(out);
        self.send
            .seal_in_place(counter, &[], &mut out[DATA_HEADER_LEN..total]);
        total
    }

    /// Authenticates and decrypts a whole data message in place; the plaintext is left at
    /// `msg[DATA_HEADER_LEN..DATA_HEADER_LEN + len]`. Fails on a bad tag or a replayed counter;
    /// the replay window moves only for authentic packets.
    pub fn open(&mut self, msg: &mut [u8]) -> Result<usize, OpenError> {
        let h = DataHeader::parse(msg);
        let len = self
            .recv
            .open_in_place(h.counter, &[], &mut msg[DATA_HEADER_LEN..])
            .ok_or(OpenError::Decrypt)?;
        if !self.replay.accept(h.counter) {
            return Err(OpenError::Replay);
        }
        Ok(len)
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum OpenError {
    Decrypt,
    Replay,
}
