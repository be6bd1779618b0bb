//! Timers: every peer's deadlines (`crate::timers`) run by [`Interface::tick`], keepalives,
//! and erasing keys.

use super::{DropReason, Interface};
use crate::peer::PeerId;
use crate::timers::MAX_HANDSHAKE_ATTEMPTS;
use std::time::{Instant, SystemTime};

impl Interface {
    /// Runs every peer's expired timers. Call it at or soon after [`Self::next_deadline`].
    pub fn tick(&mut self, now: Instant, wall: SystemTime) {
        let ids: Vec<PeerId> = self.peers.keys().copied().collect();
        for id in ids {
            let e = self.peers.get_mut(&id).expect("peer exists").timers.expired(now);
            if !e.any() {
                continue;
            }
            if e.retransmit_handshake {
                let peer = self.peers.get_mut(&id).expect("peer exists");
                if peer.handshake_attempts >= MAX_HANDSHAKE_ATTEMPTS {
                    // Give up: what waited for this handshake is lost.
                    let lost = peer.staged.len() as u64;
                    peer.staged.clear();
                    peer.timers.handshake_abandoned(now);
                    if let Some(h) = peer.handshake.take() {
                        self.indices.remove(&h.local_index);
                    }
                    *self.stats.drops.entry(DropReason::StagedOverflow).or_default() += lost;
                } else {
                    peer.handshake_attempts += 1;
                    self.initiate(id, now, wall, true);
                }
            }
            if e.send_keepalive || e.persistent_keepalive {
                self.send_keepalive(id, now, wall);
            }
            let waiting = self.peers.get(&id).is_some_and(|p| !p.staged.is_empty());
            if e.new_handshake || (e.held_handshake && (waiting || self.session_off_queue(id))) {
                self.initiate(id, now, wall, false);
            }
            if e.zero_key_material {
                self.clear_keys(id);
            }
        }
    }

    /// Sends a keepalive on the current session, or starts a handshake if there is none.
    pub fn send_keepalive(&mut self, id: PeerId, now: Instant, wall: SystemTime) {
        let Some(peer) = self.peers.get(&id) else {
            return;
        };
        if peer.has_session(now) {
            self.send_control_data(id, now, wall, &[]);
        } else {
            self.initiate(id, now, wall, false);
        }
    }

    /// The earliest timer deadline of any peer.
    pub fn next_deadline(&self) -> Option<Instant> {
        self.peers.values().filter_map(|p| p.timers.next_deadline()).min()
    }

    /// Erases the peer's sessions and pending handshake.
    pub(super) fn clear_keys(&mut self, id: PeerId) {
        let Some(peer) = self.peers.get_mut(&id) else {
            return;
        };
        let mut gone: Vec<u32> = peer.sessions.indices().collect();
        gone.extend(peer.handshake.take().map(|h| h.local_index));
        peer.sessions = Default::default();
        peer.timers.keys_erased();
        for i in gone {
            self.indices.remove(&i);
        }
    }
}
