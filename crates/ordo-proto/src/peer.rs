//! A peer's protocol state: its keys, its three session slots, its pending handshake, its
//! timers, and the packets waiting for a session.

use crate::cookie::CookieJar;
use crate::handshake::{InitiatorState, Tai64n};
use crate::keys::{PresharedKey, PublicKey};
use crate::session::Session;
use crate::timers::Timers;
use std::collections::VecDeque;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Instant, SystemTime};
use zeroize::Zeroizing;

/// How many outgoing packets wait for a handshake per peer; older ones are dropped first.
pub const MAX_STAGED_PACKETS: usize = 128;

/// A peer's handle inside one [`crate::Interface`]. Never reused, so a stale handle simply
/// finds nothing.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct PeerId(pub u64);

/// The previous, current and next sessions (whitepaper section 5.4.6 and 6.1): "next" is a
/// session we answered but that the initiator has not yet confirmed by sending on it.
#[derive(Default)]
pub struct Sessions {
    pub previous: Option<Arc<Session>>,
    pub current: Option<Arc<Session>>,
    pub next: Option<Arc<Session>>,
}

impl Sessions {
    pub fn by_index(&self, local_index: u32) -> Option<(Slot, &Arc<Session>)> {
        [
            (Slot::Current, &self.current),
            (Slot::Previous, &self.previous),
            (Slot::Next, &self.next),
        ]
        .into_iter()
        .find_map(|(slot, s)| s.as_ref().filter(|s| s.local_index == local_index).map(|s| (slot, s)))
    }

    pub fn indices(&self) -> impl Iterator<Item = u32> + '_ {
        [&self.previous, &self.current, &self.next]
            .into_iter()
            .flatten()
            .map(|s| s.local_index)
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Slot {
    Previous,
    Current,
    Next,
}

pub struct Peer {
    pub public_key: PublicKey,
    pub(crate) preshared_key: PresharedKey,
    /// DH(our static, their static); None while we have no private key or theirs is weak.
    pub(crate) static_static: Option<Zeroizing<[u8; 32]>>,
    pub endpoint: Option<SocketAddr>,
    pub(crate) cookie: CookieJar,
    pub(crate) handshake: Option<InitiatorState>,
    pub(crate) last_handshake_sent: Option<Instant>,
    pub(crate) handshake_attempts: u32,
    pub(crate) latest_timestamp: Option<Tai64n>,
    pub(crate) last_initiation_consumed: Option<Instant>,
    pub(crate) sessions: Sessions,
    pub(crate) timers: Timers,
    pub(crate) sent_lastminute_handshake: bool,
    pub(crate) staged: VecDeque<Vec<u8>>,
    /// Wall-clock time of the latest completed handshake, as `wg show` reports it.
    pub last_handshake: Option<SystemTime>,
    /// Bytes of WireGuard messages (UDP payloads) received from and sent to this peer.
    pub rx_bytes: u64,
    pub tx_bytes: u64,
    /// Persistent keepalive interval in seconds; 0 is off.
    pub persistent_keepalive: u16,
    /// The receive queue our indices for this peer steer to (see steering.rs).
    pub queue: u32,
}

impl Peer {
    pub(crate) fn new(public_key: PublicKey, static_static: Option<Zeroizing<[u8; 32]>>) -> Self {
        Peer {
            public_key,
            preshared_key: PresharedKey::default(),
            static_static,
            endpoint: None,
            cookie: CookieJar::new(&public_key),
            handshake: None,
            last_handshake_sent: None,
            handshake_attempts: 0,
            latest_timestamp: None,
            last_initiation_consumed: None,
            sessions: Sessions::default(),
            timers: Timers::default(),
            sent_lastminute_handshake: false,
            staged: VecDeque::new(),
            last_handshake: None,
            rx_bytes: 0,
            tx_bytes: 0,
            persistent_keepalive: 0,
            queue: 0,
        }
    }

    pub fn preshared_key(&self) -> &PresharedKey {
        &self.preshared_key
    }

    /// True when a session can carry data now.
    pub fn has_session(&self, now: Instant) -> bool {
        self.sessions.current.as_ref().is_some_and(|s| s.can_send(now))
    }

    /// Our receiver indices of the peer's sessions (previous, current, next): what its data
    /// messages may name.
    pub fn session_indices(&self) -> Vec<u32> {
        self.sessions.indices().collect()
    }

    /// Packets waiting for a handshake.
    pub fn staged_len(&self) -> usize {
        self.staged.len()
    }
}
