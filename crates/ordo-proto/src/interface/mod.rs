//! The protocol state of one WireGuard interface: our identity, the peers, the table of
//! receiver indices, cryptokey routing, and the queue of control messages to send.
//!
//! It is sans-IO in the manner of quinn-proto: the caller feeds it datagrams from the network
//! ([`Interface::receive`]), packets from the TUN device ([`Interface::send`]) and the passing
//! of time ([`Interface::tick`]), always with the current time, and takes out what must go
//! on the wire ([`Interface::poll_transmit`]). It owns no socket, thread or clock.
//!
//! Here: the types that cross it, the state, and its configuration. By concern: `data.rs`
//! (datagrams in, packets out), `handshakes.rs`, `timers.rs`.

use crate::allowed_ips::AllowedIps;
use crate::cookie::CookieChecker;
use crate::handshake::Identity;
use crate::keys::{PresharedKey, PrivateKey, PublicKey};
use crate::messages;
use crate::peer::{Peer, PeerId};
use crate::ratelimiter::{self, RateLimiter};
use crate::steering;
use crate::timers::REKEY_TIMEOUT;
use rand_chacha::ChaCha20Rng;
use rand_core::{RngCore, SeedableRng};
use std::collections::{BTreeMap, HashMap, VecDeque};
use std::net::SocketAddr;
use std::ops::Range;
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime};

mod data;
mod fleet;
mod handshakes;
mod timers;

pub use data::{padded_len, seal_packet};
pub use fleet::{FleetView, Foreign, ForeignData, ForeignSession};
pub use handshakes::{HandshakeStep, PendingInitiation};

/// Control messages waiting to be sent, at most this many; more are dropped and counted.
const MAX_TRANSMITS: usize = 4096;
/// Handshake messages within one second above which the interface considers itself under
/// load and answers initiations without a valid mac2 with a cookie.
pub const UNDER_LOAD_HANDSHAKES_PER_SECOND: u32 = 256;
/// How long the under-load state lasts after the rate last exceeded the threshold.
const UNDER_LOAD_HOLD: Duration = Duration::from_secs(1);

/// Why a datagram or packet was dropped. Every drop is counted under exactly one reason.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum DropReason {
    /// Not a WireGuard message: unknown type, wrong length or non-zero reserved bytes.
    Malformed,
    /// A data message for a receiver index we do not know (or no longer know).
    UnknownReceiver,
    /// A data message on a session older than REJECT_AFTER_TIME.
    ExpiredSession,
    /// A data message whose authentication tag did not verify.
    DecryptFailed,
    /// A data message whose counter was already seen or is left of the window.
    Replay,
    /// A decrypted packet that is not a valid IPv4 or IPv6 packet.
    InnerMalformed,
    /// A decrypted packet whose source address is not in the sending peer's allowed IPs.
    AllowedIpsMismatch,
    /// A handshake message while we have no private key.
    NoPrivateKey,
    /// A handshake message with an invalid mac1.
    BadMac1,
    /// A handshake message whose encrypted fields did not open.
    HandshakeDecrypt,
    /// A handshake from a static key that is not one of our peers.
    UnknownPeer,
    /// A handshake that involved a low-order Curve25519 point.
    WeakKey,
    /// An initiation whose timestamp is not newer than the last one from that peer.
    HandshakeReplay,
    /// An initiation less than 20 ms after the previous one from that peer.
    HandshakeFlood,
    /// A handshake message from a source over its rate while we are under load: answered
    /// neither with a handshake nor with a cookie reply.
    RateLimited,
    /// A response or cookie reply that matches no handshake of ours, or does not open.
    UnexpectedHandshake,
    /// An outgoing packet whose destination is in no peer's allowed IPs.
    NoRoute,
    /// An outgoing packet for a peer with no known endpoint.
    NoEndpoint,
    /// An outgoing packet that is not a valid IPv4 or IPv6 packet.
    OutgoingMalformed,
    /// A packet waiting for a handshake pushed out by newer ones, or abandoned with it.
    StagedOverflow,
    /// A control message that found the transmit queue full.
    TransmitQueueFull,
    /// The caller's output buffer cannot hold the message.
    BufferTooSmall,
    /// A fleet envelope whose tag does not verify: not from a gateway of the fleet, or altered.
    BadEnvelope,
}

impl DropReason {
    pub const ALL: [DropReason; 23] = [
        DropReason::Malformed,
        DropReason::UnknownReceiver,
        DropReason::ExpiredSession,
        DropReason::DecryptFailed,
        DropReason::Replay,
        DropReason::InnerMalformed,
        DropReason::AllowedIpsMismatch,
        DropReason::NoPrivateKey,
        DropReason::BadMac1,
        DropReason::HandshakeDecrypt,
        DropReason::UnknownPeer,
        DropReason::WeakKey,
        DropReason::HandshakeReplay,
        DropReason::HandshakeFlood,
        DropReason::RateLimited,
        DropReason::UnexpectedHandshake,
        DropReason::NoRoute,
        DropReason::NoEndpoint,
        DropReason::OutgoingMalformed,
        DropReason::StagedOverflow,
        DropReason::TransmitQueueFull,
        DropReason::BufferTooSmall,
        DropReason::BadEnvelope,
    ];

    /// The snake_case name used in `ordo show` and in JSON.
    pub fn name(self) -> &'static str {
        match self {
            DropReason::Malformed => "malformed",
            DropReason::UnknownReceiver => "unknown_receiver",
            DropReason::ExpiredSession => "expired_session",
            DropReason::DecryptFailed => "decrypt_failed",
            DropReason::Replay => "replay",
            DropReason::InnerMalformed => "inner_malformed",
            DropReason::AllowedIpsMismatch => "allowed_ips_mismatch",
            DropReason::NoPrivateKey => "no_private_key",
            DropReason::BadMac1 => "bad_mac1",
            DropReason::HandshakeDecrypt => "handshake_decrypt",
            DropReason::UnknownPeer => "unknown_peer",
            DropReason::WeakKey => "weak_key",
            DropReason::HandshakeReplay => "handshake_replay",
            DropReason::HandshakeFlood => "handshake_flood",
            DropReason::RateLimited => "rate_limited",
            DropReason::UnexpectedHandshake => "unexpected_handshake",
            DropReason::NoRoute => "no_route",
            DropReason::NoEndpoint => "no_endpoint",
            DropReason::OutgoingMalformed => "outgoing_malformed",
            DropReason::StagedOverflow => "staged_overflow",
            DropReason::TransmitQueueFull => "transmit_queue_full",
            DropReason::BufferTooSmall => "buffer_too_small",
            DropReason::BadEnvelope => "bad_envelope",
        }
    }
}

/// Interface-wide counters.
#[derive(Debug, Default, Clone)]
pub struct Stats {
    pub drops: BTreeMap<DropReason, u64>,
    pub handshakes_initiated: u64,
    pub handshakes_completed: u64,
    pub cookie_replies_sent: u64,
    pub cookie_replies_accepted: u64,
    /// Fleet: data messages passed to the gateway that holds their session.
    pub fleet_forwarded: u64,
    /// Fleet: clients of a gateway that is down taken over with a handshake from here.
    pub fleet_takeovers: u64,
    /// Fleet: envelopes from other gateways opened here.
    pub fleet_envelopes_opened: u64,
}

impl Stats {
    fn drop(&mut self, r: DropReason) {
        *self.drops.entry(r).or_default() += 1;
    }
    pub fn dropped(&self, r: DropReason) -> u64 {
        self.drops.get(&r).copied().unwrap_or(0)
    }
}

/// A message for the network.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Transmit {
    pub to: SocketAddr,
    pub payload: Vec<u8>,
}

/// What became of a datagram given to [`Interface::receive`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Received {
    /// An inner packet for the TUN device, at this range of the caller's buffer.
    Packet {
        peer: PeerId,
        range: Range<usize>,
    },
    /// An authentic keepalive: nothing to deliver.
    Keepalive(PeerId),
    /// A handshake message was processed; replies, if any, wait in the transmit queue.
    Handshake(PeerId),
    /// A cookie reply was sent instead of processing a handshake (we are under load).
    CookieSent,
    /// A data message for another gateway's session, passed on or taken over (a fleet).
    Foreign(Foreign),
    Dropped(DropReason),
}

/// One of a run of data messages of one session, opened outside the core, for
/// [`Interface::accept_data_run`].
pub struct OpenedMessage<'a> {
    /// The message's counter (its nonce), for the replay window.
    pub counter: u64,
    /// Where it came from: the peer's endpoint if it is accepted (the run's last one wins).
    pub src: SocketAddr,
    /// The whole datagram's length, for the transfer counters.
    pub datagram_len: usize,
    /// The decrypted payload, possibly padded.
    pub plain: &'a [u8],
}

/// An authentic data message, accepted by [`Interface::accept_data_run`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Accepted {
    Keepalive,
    /// An inner packet of `len` bytes, at the start of the decrypted payload.
    Packet {
        len: usize,
    },
}

/// What became of a packet given to [`Interface::send`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Sent {
    /// A data message of `len` bytes is in the caller's buffer, for `to`.
    Data {
        peer: PeerId,
        to: SocketAddr,
        len: usize,
    },
    /// The packet waits for a handshake, which has been started if none was under way.
    Staged(PeerId),
    Dropped(DropReason),
}

/// Bytes the output buffer of [`Interface::send`] needs beyond the packet length.
pub const SEND_HEADROOM: usize = messages::DATA_OVERHEAD + 15;

/// Where an interface's round robin of queues starts when the first peer it ever has is
/// added and it knows its own key: from the pair of keys, the same at both ends of the tunnel, and one
/// apart between them. Over many tunnels it is as even as a random start; and the two ends
/// of one tunnel, when they share a machine (namespaces, containers, the benchmarks), take
/// different queues — on the same number of queues, different cores — instead of
/// colliding half the time and waiting for the placement to part them.
fn first_queue(me: &PublicKey, peer: &PublicKey) -> u32 {
    let (a, b) = (me.as_bytes(), peer.as_bytes());
    let shared = u32::from_le_bytes([a[0] ^ b[0], a[1] ^ b[1], a[2] ^ b[2], a[3] ^ b[3]]);
    shared.wrapping_add((me > peer) as u32)
}

pub struct Interface {
    /// Shared with initiations being opened outside the interface ([`PendingInitiation`]).
    identity: Option<Arc<Identity>>,
    /// The timestamp of our last initiation: the next is newer, whatever the wall clock does.
    last_timestamp_sent: crate::handshake::Tai64n,
    checker: Option<CookieChecker>,
    peers: BTreeMap<PeerId, Peer>,
    by_key: HashMap<PublicKey, PeerId>,
    /// Receiver index -> peer, for pending handshakes and live sessions alike.
    /// Looked up on every received message; we draw the indices, so a fast hasher is safe.
    indices: HashMap<u32, PeerId, foldhash::fast::RandomState>,
    allowed_ips: AllowedIps<PeerId>,
    transmits: VecDeque<Transmit>,
    next_peer_id: u64,
    rng: ChaCha20Rng,
    mtu: usize,
    /// Handshakes a source may make us compute, under load (mac2 proved its address).
    limiter: RateLimiter,
    /// Cookie replies a source may get, under load: without it every datagram with a valid
    /// mac1 would cost a seal and a send.
    cookie_limiter: RateLimiter,
    load_window: (Instant, u32),
    under_load_until: Option<Instant>,
    /// Receive queues that our receiver indices steer between (see steering.rs); 1: none.
    queues: u32,
    /// New peers are placed on the queues round robin (from a random start); the device
    /// moves them by load.
    next_queue: u32,
    /// The fleet this interface is a gateway of, if any.
    fleet: Option<fleet::FleetState>,
    /// Test hook: behave as under load whatever the rate.
    pub force_under_load: bool,
    /// When a session we initiated is renewed: REKEY_AFTER_TIME, but for a test that cannot
    /// wait two minutes for it.
    pub rekey_after_time: Duration,
    pub stats: Stats,
    /// What the log hears of drops and handshakes, rate-limited per kind.
    events: crate::events::Events,
}

impl Interface {
    /// A new interface with no key and no peers, drawing randomness from the OS.
    pub fn new(now: Instant) -> Self {
        Self::with_rng(now, ChaCha20Rng::from_entropy())
    }

    /// A new interface with a given random generator (deterministic tests).
    pub fn with_rng(now: Instant, mut rng: ChaCha20Rng) -> Self {
        // New peers take the queues round robin from a random one: many interfaces of one
        // peer each (a gateway per tunnel) would otherwise all put theirs on queue 0, and so
        // on the same core. The first peer's may instead come from the pair of keys (add_peer).
        let next_queue = rng.next_u32();
        Interface {
            identity: None,
            last_timestamp_sent: [0; 12],
            checker: None,
            peers: BTreeMap::new(),
            by_key: HashMap::new(),
            indices: HashMap::default(),
            allowed_ips: AllowedIps::default(),
            transmits: VecDeque::new(),
            next_peer_id: 1,
            rng,
            mtu: 1420,
            limiter: RateLimiter::new(ratelimiter::HANDSHAKES),
            cookie_limiter: RateLimiter::new(ratelimiter::COOKIE_REPLIES),
            load_window: (now, 0),
            under_load_until: None,
            fleet: None,
            force_under_load: false,
            rekey_after_time: crate::timers::REKEY_AFTER_TIME,
            queues: 1,
            next_queue,
            stats: Stats::default(),
            events: crate::events::Events::default(),
        }
    }

    /// Counts a drop and tells the log (rate-limited), with the source where it is known.
    pub(crate) fn dropped(&mut self, reason: DropReason, src: Option<SocketAddr>) {
        self.stats.drop(reason);
        self.events.debug(reason.name(), || match src {
            Some(src) => format!("dropped a datagram from {src}: {}", reason.name()),
            None => format!("dropped a packet: {}", reason.name()),
        });
    }

    /// Tells the log of a handshake event for peer `id` (rate-limited).
    pub(crate) fn handshake_event(&mut self, id: PeerId, what: &'static str) {
        let key = self.peers.get(&id).map(|p| p.public_key);
        self.events.debug("handshake", || match key {
            Some(k) => format!("peer {}: {what}", k.to_base64()),
            None => what.to_string(),
        });
    }

    // ---- configuration -------------------------------------------------------------------

    pub fn private_key(&self) -> Option<&PrivateKey> {
        self.identity.as_ref().map(|i| &i.private)
    }

    pub fn public_key(&self) -> Option<PublicKey> {
        self.identity.as_ref().map(|i| i.public)
    }

    /// Sets (or with None, removes) our static key. Every session and handshake in flight
    /// was made with the old key and is dropped; a peer with our own public key is removed.
    pub fn set_private_key(&mut self, key: Option<PrivateKey>) {
        let key = key.filter(|k| !k.is_zero());
        if key.as_ref().map(|k| k.public_key()) == self.public_key() {
            return;
        }
        self.identity = key.map(Identity::new);
        self.checker = self.identity.as_ref().map(|i| CookieChecker::new(&i.public));
        self.rekey_fleet();
        if let Some(me) = self.public_key() {
            if let Some(id) = self.by_key.get(&me).copied() {
                self.remove_peer(id);
            }
        }
        let ids: Vec<PeerId> = self.peers.keys().copied().collect();
        for id in ids {
            self.clear_keys(id);
            let ss = match (&self.identity, self.peers.get(&id)) {
                (Some(me), Some(p)) => me.static_static(&p.public_key),
                _ => None,
            };
            if let Some(p) = self.peers.get_mut(&id) {
                p.static_static = ss;
            }
        }
    }

    pub fn mtu(&self) -> usize {
        self.mtu
    }

    /// The TUN MTU, which bounds padding.
    pub fn set_mtu(&mut self, mtu: usize) {
        self.mtu = mtu.max(576);
    }

    /// How many receive queues the device steers between by receiver index.
    pub fn set_queues(&mut self, queues: u32) {
        self.queues = queues.clamp(1, steering::MAX_QUEUES);
    }

    pub fn queues(&self) -> u32 {
        self.queues
    }

    /// Moves a peer to another receive queue. Its current session keeps the old index (the
    /// device steers it by exception meanwhile, see `steering_overrides`), so a handshake
    /// starts now, or as soon as the rate limit of one initiation per REKEY_TIMEOUT allows:
    /// the new session's index steers to the new queue. Returns false for an unknown peer.
    pub fn set_peer_queue(&mut self, id: PeerId, queue: u32, now: Instant, wall: SystemTime) -> bool {
        let queues = self.queues;
        let Some(peer) = self.peers.get_mut(&id) else {
            return false;
        };
        let queue = queue % queues;
        if peer.queue == queue {
            return true;
        }
        peer.queue = queue;
        if self.session_off_queue(id) {
            match self.peers[&id].last_handshake_sent {
                // An initiation just went out (its index is on the old queue): the next one
                // may go when the rate limit allows.
                Some(t) if now.saturating_duration_since(t) < REKEY_TIMEOUT => {
                    let peer = self.peers.get_mut(&id).expect("peer exists");
                    peer.timers.hold_handshake_until(t + REKEY_TIMEOUT);
                }
                _ => self.initiate(id, now, wall, false),
            }
        }
        true
    }

    /// Our receiver indices (of sessions and handshakes) that steer to another queue than
    /// their peer's, with the peer's queue: a moved peer's until its sessions of before the
    /// move are gone. The device adds them to its steering program as exceptions, so that a
    /// move takes effect at once instead of with the move's handshake. Sorted by index.
    pub fn steering_overrides(&self) -> Vec<steering::SteeringException> {
        if self.queues <= 1 {
            return Vec::new();
        }
        let mut v: Vec<steering::SteeringException> = (self.indices.iter())
            .filter_map(|(&receiver, id)| {
                let queue = self.peers.get(id)?.queue;
                (steering::queue_of_index(receiver, self.queues) != queue)
                    .then_some(steering::SteeringException { receiver, queue })
            })
            .collect();
        v.sort_unstable();
        v
    }

    /// Whether the peer's current session has an index that steers to another queue than
    /// the peer's.
    fn session_off_queue(&self, id: PeerId) -> bool {
        let Some(peer) = self.peers.get(&id) else {
            return false;
        };
        peer.sessions
            .current
            .as_ref()
            .is_some_and(|s| steering::queue_of_index(s.local_index, self.queues) != peer.queue)
    }

    /// The peer with this key, created if new. Returns None for our own key.
    pub fn add_peer(&mut self, key: PublicKey) -> Option<PeerId> {
        if Some(key) == self.public_key() {
            return None;
        }
        if let Some(id) = self.by_key.get(&key) {
            return Some(*id);
        }
        let id = PeerId(self.next_peer_id);
        self.next_peer_id += 1;
        let ss = self.identity.as_ref().and_then(|me| me.static_static(&key));
        let mut peer = Peer::new(key, ss);
        if let (1, Some(me)) = (id.0, self.public_key()) {
            self.next_queue = first_queue(&me, &key);
        }
        peer.queue = self.next_queue % self.queues;
        self.next_queue = self.next_queue.wrapping_add(1);
        self.peers.insert(id, peer);
        self.by_key.insert(key, id);
        Some(id)
    }

    pub fn remove_peer(&mut self, id: PeerId) {
        self.clear_keys(id);
        if let Some(p) = self.peers.remove(&id) {
            self.by_key.remove(&p.public_key);
        }
        self.allowed_ips.remove_value(id);
    }

    pub fn remove_all_peers(&mut self) {
        let ids: Vec<PeerId> = self.peers.keys().copied().collect();
        for id in ids {
            self.remove_peer(id);
        }
    }

    pub fn peer_id(&self, key: &PublicKey) -> Option<PeerId> {
        self.by_key.get(key).copied()
    }

    pub fn peer(&self, id: PeerId) -> Option<&Peer> {
        self.peers.get(&id)
    }

    pub fn peers(&self) -> impl Iterator<Item = (PeerId, &Peer)> {
        self.peers.iter().map(|(k, v)| (*k, v))
    }

    pub fn set_preshared_key(&mut self, id: PeerId, psk: PresharedKey) {
        if let Some(p) = self.peers.get_mut(&id) {
            p.preshared_key = psk;
        }
    }

    pub fn set_endpoint(&mut self, id: PeerId, endpoint: SocketAddr) {
        if let Some(p) = self.peers.get_mut(&id) {
            p.endpoint = Some(endpoint);
        }
    }

    /// Sets the persistent keepalive interval; a non-zero value sends a keepalive at once
    /// (at the next tick), which starts a handshake if there is no session.
    pub fn set_persistent_keepalive(&mut self, id: PeerId, seconds: u16, now: Instant) {
        if let Some(p) = self.peers.get_mut(&id) {
            p.persistent_keepalive = seconds;
            p.timers
                .set_persistent_interval(now, Duration::from_secs(seconds as u64));
        }
    }

    pub fn allowed_ips(&self) -> &AllowedIps<PeerId> {
        &self.allowed_ips
    }

    pub fn add_allowed_ip(&mut self, id: PeerId, net: ipnet::IpNet) {
        if self.peers.contains_key(&id) {
            self.allowed_ips.insert(net, id);
        }
    }

    pub fn remove_allowed_ip(&mut self, id: PeerId, net: ipnet::IpNet) -> bool {
        self.allowed_ips.remove(net, id)
    }

    pub fn clear_allowed_ips(&mut self, id: PeerId) {
        self.allowed_ips.remove_value(id);
    }

    /// True while handshakes without a valid mac2 get a cookie reply.
    pub fn under_load(&self, now: Instant) -> bool {
        self.force_under_load || self.under_load_until.is_some_and(|t| now < t)
    }

    /// Test hook: moves the current session's send counter, so the message-count limits
    /// (2^60 and 2^64 - 2^13) can be reached without sending that many packets.
    #[doc(hidden)]
    pub fn set_send_counter_for_test(&mut self, id: PeerId, counter: u64) {
        if let Some(s) = self.peers.get_mut(&id).and_then(|p| p.sessions.current.as_mut()) {
            s.set_send_counter_for_test(counter);
        }
    }

    /// Live receiver indices, for tests and diagnostics.
    pub fn index_count(&self) -> usize {
        self.indices.len()
    }
}
