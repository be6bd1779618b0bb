//! The protocol state of one WireGuard interface: our identity, the peers, the table of
//! receiver indices, cryptokey routing, and the queue of control messages to send.
//!
//! It is sans-IO in the manner of quinn-proto: the caller feeds it datagrams from the network
//! ([`Interface::receive`]), packets from the TUN device ([`Interface::send`]) and the passing
//! of time ([`Interface::tick`]), always with the current time, and takes out what must go
//! on the wire ([`Interface::poll_transmit`]). It owns no socket, thread or clock.

use crate::allowed_ips::AllowedIps;
use crate::cookie::CookieChecker;
use crate::handshake::{self, HandshakeError, Identity};
use crate::keys::{PresharedKey, PrivateKey, PublicKey};
use crate::messages::{self, CookieReply, Initiation, Kind, Response, DATA_HEADER_LEN};
use crate::packet;
use crate::peer::{Peer, PeerId, Slot, MAX_STAGED_PACKETS};
use crate::ratelimiter::RateLimiter;
use crate::session::Session;
use crate::steering;
use crate::timers::{
    INITIATION_MIN_INTERVAL, MAX_HANDSHAKE_ATTEMPTS, MAX_JITTER_MS, REKEY_AFTER_MESSAGES, REKEY_AFTER_TIME,
    REKEY_ON_RECEIVE_AGE, REKEY_TIMEOUT,
};
use rand_chacha::ChaCha20Rng;
use rand_core::{RngCore, SeedableRng};
use std::collections::{BTreeMap, HashMap, VecDeque};
use std::net::SocketAddr;
use std::ops::Range;
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime};

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
    /// A handshake from a source over its rate while we are under load.
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
}

impl DropReason {
    pub const ALL: [DropReason; 22] = [
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
    identity: Option<Identity>,
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
    limiter: RateLimiter,
    load_window: (Instant, u32),
    under_load_until: Option<Instant>,
    /// Receive queues that our receiver indices steer between (see steering.rs); 1: none.
    queues: u32,
    /// New peers are placed on the queues round robin (from a random start); the device
    /// moves them by load.
    next_queue: u32,
    /// Test hook: behave as under load whatever the rate.
    pub force_under_load: bool,
    pub stats: Stats,
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
            checker: None,
            peers: BTreeMap::new(),
            by_key: HashMap::new(),
            indices: HashMap::default(),
            allowed_ips: AllowedIps::default(),
            transmits: VecDeque::new(),
            next_peer_id: 1,
            rng,
            mtu: 1420,
            limiter: RateLimiter::default(),
            load_window: (now, 0),
            under_load_until: None,
            force_under_load: false,
            queues: 1,
            next_queue,
            stats: Stats::default(),
        }
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
                    peer.timers.requeue_at(t + REKEY_TIMEOUT);
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

    // ---- the data path -------------------------------------------------------------------

    /// Processes one datagram from `src`, decrypting in place.
    pub fn receive(&mut self, now: Instant, wall: SystemTime, src: SocketAddr, buf: &mut [u8]) -> Received {
        let r = match messages::classify(buf) {
            None => Err(DropReason::Malformed),
            Some(Kind::Data) => self.receive_data(now, wall, src, buf),
            Some(Kind::Initiation) => self.receive_initiation(now, src, buf),
            Some(Kind::Response) => self.receive_response(now, wall, src, buf),
            Some(Kind::CookieReply) => self.receive_cookie_reply(now, buf),
        };
        r.unwrap_or_else(|reason| {
            self.stats.drop(reason);
            Received::Dropped(reason)
        })
    }

    fn receive_data(
        &mut self,
        now: Instant,
        wall: SystemTime,
        src: SocketAddr,
        buf: &mut [u8],
    ) -> Result<Received, DropReason> {
        let receiver = messages::DataHeader::parse(buf).receiver;
        let (id, session) = self.receiving_session(receiver).ok_or(DropReason::UnknownReceiver)?;
        if session.expired(now) {
            return Err(DropReason::ExpiredSession);
        }
        let (counter, len) = session.open_in_place(buf).map_err(|_| DropReason::DecryptFailed)?;
        let plain = &buf[DATA_HEADER_LEN..DATA_HEADER_LEN + len];
        // accept_data_run counts its own drops; the caller counts ours: do not count them twice.
        let message = OpenedMessage {
            counter,
            src,
            datagram_len: buf.len(),
            plain,
        };
        let mut verdict = Err(DropReason::UnknownReceiver);
        self.accept_run_uncounted(now, wall, id, &session, [message], |v| verdict = v);
        match verdict? {
            Accepted::Keepalive => Ok(Received::Keepalive(id)),
            Accepted::Packet { len } => Ok(Received::Packet {
                peer: id,
                range: DATA_HEADER_LEN..DATA_HEADER_LEN + len,
            }),
        }
    }

    /// The session a data message for `receiver` would be opened with. The data plane opens
    /// it outside the interface's lock ([`Session::open_in_place`]) and then hands the result
    /// to [`Self::accept_data_run`], in the order the peer's messages arrived.
    pub fn receiving_session(&self, receiver: u32) -> Option<(PeerId, Arc<Session>)> {
        let id = *self.indices.get(&receiver)?;
        let (_, s) = self.peers.get(&id)?.sessions.by_index(receiver)?;
        Some((id, s.clone()))
    }

    /// Everything that follows a successful open of a run of one session's data messages,
    /// given in the order they arrived: for each message the replay window and the inner
    /// packet's checks (header, allowed IPs); once for the run the peer's part (roaming, byte
    /// counts, timers, key confirmation, rekey), as the data plane delivers a batch.
    /// `verdict` gets each message's fate, in order; an accepted inner packet is the first
    /// `len` bytes of its `plain`. Drops are counted.
    pub fn accept_data_run<'a>(
        &mut self,
        now: Instant,
        wall: SystemTime,
        peer: PeerId,
        session: &Arc<Session>,
        messages: impl IntoIterator<Item = OpenedMessage<'a>>,
        mut verdict: impl FnMut(Result<Accepted, DropReason>),
    ) {
        let mut drops = Vec::new();
        self.accept_run_uncounted(now, wall, peer, session, messages, |v| {
            if let Err(reason) = v {
                drops.push(reason);
            }
            verdict(v)
        });
        for reason in drops {
            self.stats.drop(reason);
        }
    }

    /// Counts a drop that happened outside the core (a data-plane worker failed to open a
    /// message), so every reason is counted in one place.
    pub fn count_drop(&mut self, reason: DropReason) {
        self.stats.drop(reason);
    }

    fn accept_run_uncounted<'a>(
        &mut self,
        now: Instant,
        wall: SystemTime,
        id: PeerId,
        session: &Arc<Session>,
        messages: impl IntoIterator<Item = OpenedMessage<'a>>,
        mut verdict: impl FnMut(Result<Accepted, DropReason>),
    ) {
        let Some(peer) = self.peers.get_mut(&id) else {
            messages
                .into_iter()
                .for_each(|_| verdict(Err(DropReason::UnknownReceiver)));
            return;
        };
        // The session may have been rotated out or erased since it was looked up.
        let slot = match peer.sessions.by_index(session.local_index) {
            Some((slot, s)) if Arc::ptr_eq(s, session) => slot,
            _ => {
                messages
                    .into_iter()
                    .for_each(|_| verdict(Err(DropReason::UnknownReceiver)));
                return;
            }
        };
        if session.expired(now) {
            messages
                .into_iter()
                .for_each(|_| verdict(Err(DropReason::ExpiredSession)));
            return;
        }
        let (mut authentic, mut data, mut last_src) = (false, false, None);
        {
            let mut window = session.replay_window();
            for m in messages {
                if !window.accept(m.counter) {
                    verdict(Err(DropReason::Replay));
                    continue;
                }
                // Authentic and fresh from here on.
                authentic = true;
                last_src = Some(m.src);
                peer.rx_bytes += m.datagram_len as u64;
                if m.plain.is_empty() {
                    verdict(Ok(Accepted::Keepalive));
                    continue;
                }
                data = true;
                verdict(match packet::parse(m.plain) {
                    None => Err(DropReason::InnerMalformed),
                    Some(h) if self.allowed_ips.lookup(h.src) != Some(id) => Err(DropReason::AllowedIpsMismatch),
                    Some(h) => Ok(Accepted::Packet { len: h.total_len }),
                });
            }
        }
        if !authentic {
            return;
        }
        peer.endpoint = last_src;
        peer.timers.any_authenticated_packet_received();
        peer.timers.any_authenticated_packet_traversal(now);
        if slot == Slot::Next {
            self.confirm_next_session(id, now, wall);
        }
        self.keep_key_fresh_on_receive(id, now, wall);
        if data {
            let peer = self.peers.get_mut(&id).expect("peer exists");
            peer.timers.data_received(now);
        }
    }

    /// The initiator sent on the session we answered: it becomes current (key confirmation).
    fn confirm_next_session(&mut self, id: PeerId, now: Instant, wall: SystemTime) {
        let peer = self.peers.get_mut(&id).expect("peer exists");
        let old_previous = peer.sessions.previous.take();
        peer.sessions.previous = peer.sessions.current.take();
        peer.sessions.current = peer.sessions.next.take();
        if let Some(s) = old_previous {
            self.indices.remove(&s.local_index);
        }
        self.handshake_complete(id, wall);
        self.flush_staged(id, now, wall);
    }

    fn handshake_complete(&mut self, id: PeerId, wall: SystemTime) {
        let peer = self.peers.get_mut(&id).expect("peer exists");
        peer.timers.handshake_complete();
        peer.handshake_attempts = 0;
        peer.sent_lastminute_handshake = false;
        peer.last_handshake = Some(wall);
        self.stats.handshakes_completed += 1;
    }

    fn keep_key_fresh_on_receive(&mut self, id: PeerId, now: Instant, wall: SystemTime) {
        let peer = self.peers.get_mut(&id).expect("peer exists");
        let stale = peer
            .sessions
            .current
            .as_ref()
            .is_some_and(|s| s.we_initiated && now.saturating_duration_since(s.born) >= REKEY_ON_RECEIVE_AGE);
        if stale && !peer.sent_lastminute_handshake {
            peer.sent_lastminute_handshake = true;
            self.initiate(id, now, wall, false);
        }
    }

    /// Encrypts one packet from the TUN device into `out`, which must have room for the
    /// packet plus [`SEND_HEADROOM`] bytes.
    pub fn send(&mut self, now: Instant, wall: SystemTime, packet: &[u8], out: &mut [u8]) -> Sent {
        let r = self.send_inner(now, wall, packet, out);
        r.unwrap_or_else(|reason| {
            self.stats.drop(reason);
            Sent::Dropped(reason)
        })
    }

    fn send_inner(
        &mut self,
        now: Instant,
        wall: SystemTime,
        packet: &[u8],
        out: &mut [u8],
    ) -> Result<Sent, DropReason> {
        let id = self.route(packet)?;
        let Some((session, to)) = self.sending_session(now, id)? else {
            self.stage_and_initiate(now, wall, id, packet.to_vec());
            return Ok(Sent::Staged(id));
        };
        let len = self.seal_now(now, wall, id, &session, packet, out)?;
        Ok(Sent::Data { peer: id, to, len })
    }

    /// The peer an outgoing packet goes to: cryptokey routing on its destination.
    pub fn route(&self, packet: &[u8]) -> Result<PeerId, DropReason> {
        let header = packet::parse(packet).ok_or(DropReason::OutgoingMalformed)?;
        self.allowed_ips.lookup(header.dst).ok_or(DropReason::NoRoute)
    }

    /// The session and endpoint to send to the peer with now; Ok(None) if a handshake is
    /// needed first (then use [`Self::stage_and_initiate`]). The data plane seals with it
    /// outside the lock ([`Session::reserve`], [`seal_packet`]) and then reports what it sent
    /// ([`Self::after_send`]).
    pub fn sending_session(&self, now: Instant, id: PeerId) -> Result<Option<(Arc<Session>, SocketAddr)>, DropReason> {
        let peer = self.peers.get(&id).ok_or(DropReason::NoRoute)?;
        let to = peer.endpoint.ok_or(DropReason::NoEndpoint)?;
        Ok(peer
            .sessions
            .current
            .as_ref()
            .filter(|s| s.can_send(now))
            .map(|s| (s.clone(), to)))
    }

    /// Queues a packet until the peer has a session, and starts a handshake if none is under
    /// way (at most one per REKEY_TIMEOUT).
    pub fn stage_and_initiate(&mut self, now: Instant, wall: SystemTime, id: PeerId, packet: Vec<u8>) {
        if self.peers.contains_key(&id) {
            self.stage(id, packet);
            self.initiate(id, now, wall, false);
        }
    }

    /// Reports messages the data plane sealed on `session` and sent: `bytes` on the wire, of
    /// which `data_packets` carried data (the rest were keepalives). Runs the send-side
    /// timer events and starts a rekey when the session is old or much used.
    pub fn after_send(
        &mut self,
        now: Instant,
        wall: SystemTime,
        id: PeerId,
        session: &Session,
        bytes: u64,
        data_packets: u64,
    ) {
        let jitter = self.jitter();
        let Some(peer) = self.peers.get_mut(&id) else {
            return;
        };
        let rekey = session.send_counter() > REKEY_AFTER_MESSAGES
            || (session.we_initiated && now.saturating_duration_since(session.born) >= REKEY_AFTER_TIME);
        peer.tx_bytes += bytes;
        peer.timers.any_authenticated_packet_traversal(now);
        peer.timers.any_authenticated_packet_sent();
        if data_packets > 0 {
            peer.timers.data_sent(now, jitter);
        }
        if rekey {
            self.initiate(id, now, wall, false);
        }
    }

    fn stage(&mut self, id: PeerId, packet: Vec<u8>) {
        let peer = self.peers.get_mut(&id).expect("peer exists");
        if peer.staged.len() >= MAX_STAGED_PACKETS {
            peer.staged.pop_front();
            self.stats.drop(DropReason::StagedOverflow);
        }
        peer.staged.push_back(packet);
    }

    /// Seals `packet` (empty for a keepalive) into `out` on `session` at once, and reports it.
    fn seal_now(
        &mut self,
        now: Instant,
        wall: SystemTime,
        id: PeerId,
        session: &Session,
        packet: &[u8],
        out: &mut [u8],
    ) -> Result<usize, DropReason> {
        let counter = session.reserve(1).ok_or(DropReason::ExpiredSession)?;
        let len = seal_packet(session, counter, packet, self.mtu, out)?;
        self.after_send(now, wall, id, session, len as u64, !packet.is_empty() as u64);
        Ok(len)
    }

    /// Sends what waited for the handshake, or a keepalive to confirm the session.
    fn flush_staged(&mut self, id: PeerId, now: Instant, wall: SystemTime) {
        let staged: Vec<Vec<u8>> = self.peers.get_mut(&id).expect("peer exists").staged.drain(..).collect();
        let packets = if staged.is_empty() { vec![Vec::new()] } else { staged };
        for p in packets {
            self.send_control_data(id, now, wall, &p);
        }
    }

    /// Seals a packet (or a keepalive, when empty) into the transmit queue.
    fn send_control_data(&mut self, id: PeerId, now: Instant, wall: SystemTime, packet: &[u8]) {
        let Ok(Some((session, to))) = self.sending_session(now, id) else {
            return;
        };
        let mut out = vec![0u8; packet.len() + SEND_HEADROOM];
        if let Ok(len) = self.seal_now(now, wall, id, &session, packet, &mut out) {
            out.truncate(len);
            self.push_transmit(to, out);
        }
    }

    fn push_transmit(&mut self, to: SocketAddr, payload: Vec<u8>) {
        if self.transmits.len() >= MAX_TRANSMITS {
            self.stats.drop(DropReason::TransmitQueueFull);
            return;
        }
        self.transmits.push_back(Transmit { to, payload });
    }

    /// The next control message to send, if any.
    pub fn poll_transmit(&mut self) -> Option<Transmit> {
        self.transmits.pop_front()
    }

    // ---- handshakes ----------------------------------------------------------------------

    fn jitter(&mut self) -> Duration {
        Duration::from_millis(self.rng.next_u64() % (MAX_JITTER_MS + 1))
    }

    fn fresh_index(&mut self, id: PeerId) -> u32 {
        let queue = self.peers.get(&id).map_or(0, |p| p.queue);
        loop {
            let i = steering::index_for_queue(self.rng.next_u32(), queue, self.queues);
            if let std::collections::hash_map::Entry::Vacant(e) = self.indices.entry(i) {
                e.insert(id);
                return i;
            }
        }
    }

    /// Starts (or with `retry`, repeats) a handshake with the peer, at most once per
    /// REKEY_TIMEOUT: the per-peer handshake rate limit of the whitepaper.
    fn initiate(&mut self, id: PeerId, now: Instant, wall: SystemTime, retry: bool) {
        let Some(peer) = self.peers.get_mut(&id) else {
            return;
        };
        if !retry {
            peer.handshake_attempts = 0;
        }
        if peer
            .last_handshake_sent
            .is_some_and(|t| now.saturating_duration_since(t) < REKEY_TIMEOUT)
        {
            return;
        }
        let (Some(ss), Some(to), true) = (peer.static_static.clone(), peer.endpoint, self.identity.is_some()) else {
            return;
        };
        let remote = peer.public_key;
        if let Some(old) = peer.handshake.take() {
            self.indices.remove(&old.local_index);
        }
        let index = self.fresh_index(id);
        let me = self.identity.as_ref().expect("checked above");
        let Ok((msg, state)) =
            handshake::create_initiation(me, &remote, &ss, index, handshake::tai64n(wall), &mut self.rng)
        else {
            self.indices.remove(&index);
            return;
        };
        let jitter = self.jitter();
        let peer = self.peers.get_mut(&id).expect("peer exists");
        let mut bytes = msg.write();
        peer.cookie.stamp(&mut bytes, now);
        peer.handshake = Some(state);
        peer.last_handshake_sent = Some(now);
        peer.tx_bytes += bytes.len() as u64;
        peer.timers.handshake_initiated(now, jitter);
        peer.timers.any_authenticated_packet_traversal(now);
        peer.timers.any_authenticated_packet_sent();
        self.stats.handshakes_initiated += 1;
        self.push_transmit(to, bytes.to_vec());
    }

    /// Counts a handshake message toward the load estimate.
    fn note_handshake_load(&mut self, now: Instant) {
        let (start, count) = &mut self.load_window;
        if now.saturating_duration_since(*start) >= Duration::from_secs(1) {
            *start = now;
            *count = 0;
        }
        *count += 1;
        if *count > UNDER_LOAD_HANDSHAKES_PER_SECOND {
            self.under_load_until = Some(now + UNDER_LOAD_HOLD);
        }
    }

    /// MAC checks common to initiations and responses. Ok(None): go on; Ok(Some(r)): the
    /// message was answered with a cookie.
    fn check_handshake_macs(
        &mut self,
        now: Instant,
        src: SocketAddr,
        buf: &[u8],
    ) -> Result<Option<Received>, DropReason> {
        self.note_handshake_load(now);
        let under_load = self.under_load(now);
        let checker = self.checker.as_mut().ok_or(DropReason::NoPrivateKey)?;
        if !checker.mac1_valid(buf) {
            return Err(DropReason::BadMac1);
        }
        if !under_load {
            return Ok(None);
        }
        if !checker.mac2_valid(buf, &src, now, &mut self.rng) {
            let reply = checker.reply(buf, &src, now, &mut self.rng).write();
            self.stats.cookie_replies_sent += 1;
            self.push_transmit(src, reply.to_vec());
            return Ok(Some(Received::CookieSent));
        }
        if !self.limiter.allow(src.ip(), now) {
            return Err(DropReason::RateLimited);
        }
        Ok(None)
    }

    fn receive_initiation(&mut self, now: Instant, src: SocketAddr, buf: &[u8]) -> Result<Received, DropReason> {
        if let Some(r) = self.check_handshake_macs(now, src, buf)? {
            return Ok(r);
        }
        let me = self.identity.as_ref().ok_or(DropReason::NoPrivateKey)?;
        let msg = Initiation::parse(buf.try_into().expect("classified by length"));
        let (peers, by_key) = (&self.peers, &self.by_key);
        let consumed = handshake::consume_initiation(me, &msg, |k| {
            by_key.get(k).and_then(|id| peers[id].static_static.clone())
        })
        .map_err(handshake_drop)?;
        let id = self.by_key[&consumed.initiator];
        let peer = self.peers.get_mut(&id).expect("peer exists");
        if peer.latest_timestamp.is_some_and(|t| consumed.timestamp <= t) {
            return Err(DropReason::HandshakeReplay);
        }
        if peer
            .last_initiation_consumed
            .is_some_and(|t| now.saturating_duration_since(t) < INITIATION_MIN_INTERVAL)
        {
            return Err(DropReason::HandshakeFlood);
        }
        peer.latest_timestamp = Some(consumed.timestamp);
        peer.last_initiation_consumed = Some(now);
        peer.endpoint = Some(src);
        peer.rx_bytes += buf.len() as u64;
        peer.timers.any_authenticated_packet_received();
        peer.timers.any_authenticated_packet_traversal(now);
        let psk = peer.preshared_key.clone();

        let index = self.fresh_index(id);
        let (resp, keys) = match handshake::create_response(&consumed, &psk, index, &mut self.rng) {
            Ok(r) => r,
            Err(e) => {
                self.indices.remove(&index);
                return Err(handshake_drop(e));
            }
        };
        let peer = self.peers.get_mut(&id).expect("peer exists");
        let mut bytes = resp.write();
        peer.cookie.stamp(&mut bytes, now);
        peer.tx_bytes += bytes.len() as u64;
        peer.timers.any_authenticated_packet_traversal(now);
        peer.timers.any_authenticated_packet_sent();
        peer.timers.session_derived(now);
        let old_next = peer.sessions.next.replace(Arc::new(Session::new(&keys, now)));
        let old_previous = peer.sessions.previous.take();
        for s in [old_next, old_previous].into_iter().flatten() {
            self.indices.remove(&s.local_index);
        }
        self.push_transmit(src, bytes.to_vec());
        Ok(Received::Handshake(id))
    }

    fn receive_response(
        &mut self,
        now: Instant,
        wall: SystemTime,
        src: SocketAddr,
        buf: &[u8],
    ) -> Result<Received, DropReason> {
        if let Some(r) = self.check_handshake_macs(now, src, buf)? {
            return Ok(r);
        }
        let msg = Response::parse(buf.try_into().expect("classified by length"));
        let id = *self.indices.get(&msg.receiver).ok_or(DropReason::UnexpectedHandshake)?;
        let me = self.identity.as_ref().ok_or(DropReason::NoPrivateKey)?;
        let peer = self.peers.get_mut(&id).ok_or(DropReason::UnexpectedHandshake)?;
        let state = peer
            .handshake
            .as_ref()
            .filter(|h| h.local_index == msg.receiver)
            .ok_or(DropReason::UnexpectedHandshake)?;
        let keys = handshake::consume_response(me, state, &peer.preshared_key, &msg).map_err(handshake_drop)?;
        peer.handshake = None;
        peer.endpoint = Some(src);
        peer.rx_bytes += buf.len() as u64;
        peer.timers.any_authenticated_packet_received();
        peer.timers.any_authenticated_packet_traversal(now);
        peer.timers.session_derived(now);
        // We initiated: the new session is current at once. If an unconfirmed "next" exists,
        // it becomes previous so that packets the peer already sent on it still decrypt.
        let displaced = match peer.sessions.next.take() {
            Some(next) => {
                let old_current = peer.sessions.current.take();
                let old_previous = peer.sessions.previous.replace(next);
                [old_current, old_previous]
            }
            None => {
                let old_previous = peer.sessions.previous.take();
                peer.sessions.previous = peer.sessions.current.take();
                [old_previous, None]
            }
        };
        peer.sessions.current = Some(Arc::new(Session::new(&keys, now)));
        for s in displaced.into_iter().flatten() {
            self.indices.remove(&s.local_index);
        }
        self.handshake_complete(id, wall);
        self.flush_staged(id, now, wall);
        Ok(Received::Handshake(id))
    }

    fn receive_cookie_reply(&mut self, now: Instant, buf: &[u8]) -> Result<Received, DropReason> {
        let msg = CookieReply::parse(buf.try_into().expect("classified by length"));
        let id = *self.indices.get(&msg.receiver).ok_or(DropReason::UnexpectedHandshake)?;
        let peer = self.peers.get_mut(&id).ok_or(DropReason::UnexpectedHandshake)?;
        if !peer.cookie.consume_reply(&msg, now) {
            return Err(DropReason::UnexpectedHandshake);
        }
        self.stats.cookie_replies_accepted += 1;
        Ok(Received::Handshake(id))
    }

    // ---- timers --------------------------------------------------------------------------

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
            if e.new_handshake || (e.requeue && self.session_off_queue(id)) {
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
    fn clear_keys(&mut self, id: PeerId) {
        let Some(peer) = self.peers.get_mut(&id) else {
            return;
        };
        let mut gone: Vec<u32> = peer.sessions.indices().collect();
        gone.extend(peer.handshake.take().map(|h| h.local_index));
        peer.sessions = Default::default();
        peer.timers.stop_all();
        for i in gone {
            self.indices.remove(&i);
        }
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

/// Builds a data message in `out` from `packet` with a reserved `counter`: copies, pads and
/// seals. `out` needs the packet length plus [`SEND_HEADROOM`] bytes.
pub fn seal_packet(
    session: &Session,
    counter: u64,
    packet: &[u8],
    mtu: usize,
    out: &mut [u8],
) -> Result<usize, DropReason> {
    let padded = padded_len(packet.len(), mtu);
    if out.len() < DATA_HEADER_LEN + padded + crate::crypto::TAG_LEN {
        return Err(DropReason::BufferTooSmall);
    }
    out[DATA_HEADER_LEN..DATA_HEADER_LEN + packet.len()].copy_from_slice(packet);
    out[DATA_HEADER_LEN + packet.len()..DATA_HEADER_LEN + padded].fill(0);
    Ok(session.seal_at(counter, padded, out))
}

/// The padded plaintext length (whitepaper section 5.4.6): a multiple of 16, never beyond
/// the MTU unless the packet itself is larger.
pub fn padded_len(len: usize, mtu: usize) -> usize {
    let padded = len.div_ceil(16) * 16;
    padded.min(mtu.max(len))
}

fn handshake_drop(e: HandshakeError) -> DropReason {
    match e {
        HandshakeError::Decrypt => DropReason::HandshakeDecrypt,
        HandshakeError::WeakKey => DropReason::WeakKey,
        HandshakeError::UnknownPeer => DropReason::UnknownPeer,
    }
}
