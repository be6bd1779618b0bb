//! Handshakes: initiating (at most once per REKEY_TIMEOUT), the macs and cookies checked
//! before any expensive work, and the three handshake messages received.

use super::{DropReason, Interface, Received, UNDER_LOAD_HANDSHAKES_PER_SECOND, UNDER_LOAD_HOLD};
use crate::cookie;
use crate::handshake::{self, ConsumedInitiation, HandshakeError, Identity};
use crate::keys::PublicKey;
use crate::messages::{self, CookieReply, Initiation, Kind, Response};
use crate::peer::PeerId;
use crate::session::Session;
use crate::steering;
use crate::timers::{INITIATION_MIN_INTERVAL, MAX_JITTER_MS, REKEY_TIMEOUT};
use rand_core::RngCore;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime};
use zeroize::Zeroizing;

/// What [`Interface::begin_handshake`] left to do.
pub enum HandshakeStep {
    /// Handled: answered, dropped (and counted), or consumed.
    Done(Received),
    /// An initiation that passed every check: open it without the interface, then
    /// [`Interface::complete_initiation`].
    Initiation(PendingInitiation),
}

/// An initiation that passed the checks: what opening it needs, none of it the interface.
pub struct PendingInitiation {
    identity: Arc<Identity>,
    msg: Initiation,
    src: SocketAddr,
    len: usize,
}

impl PendingInitiation {
    /// The expensive part (a Diffie-Hellman and two AEAD opens), without the interface:
    /// `static_static_of` looks the initiator's key up ([`Interface::static_static_of`]),
    /// the only moment the caller needs the interface again.
    pub fn open(
        &self,
        static_static_of: impl FnOnce(&PublicKey) -> Option<Zeroizing<[u8; 32]>>,
    ) -> Result<ConsumedInitiation, HandshakeError> {
        handshake::consume_initiation(&self.identity, &self.msg, static_static_of)
    }
}

impl Interface {
    pub(super) fn jitter(&mut self) -> Duration {
        Duration::from_millis(self.rng.next_u64() % (MAX_JITTER_MS + 1))
    }

    pub(super) fn fresh_index(&mut self, id: PeerId) -> u32 {
        let queue = self.peers.get(&id).map_or(0, |p| p.queue);
        loop {
            let random = self.rng.next_u32();
            let i = self.owned_index(steering::index_for_queue(random, queue, self.queues));
            if let std::collections::hash_map::Entry::Vacant(e) = self.indices.entry(i) {
                e.insert(id);
                return i;
            }
        }
    }

    /// Starts (or with `retry`, repeats) a handshake with the peer, at most once per
    /// REKEY_TIMEOUT: the per-peer handshake rate limit of the whitepaper.
    pub(super) fn initiate(&mut self, id: PeerId, now: Instant, wall: SystemTime, retry: bool) {
        let Some(peer) = self.peers.get_mut(&id) else {
            return;
        };
        if !retry {
            peer.handshake_attempts = 0;
        }
        if let Some(t) = (peer.last_handshake_sent).filter(|t| now.saturating_duration_since(*t) < REKEY_TIMEOUT) {
            // Held back by the limit. Packets that wait for a session must not wait for
            // whatever asks for the next handshake: it goes when the limit ends. (A handshake
            // in flight has its own retransmission.)
            if !peer.staged.is_empty() && peer.handshake.is_none() {
                peer.timers.hold_handshake_until(t + REKEY_TIMEOUT);
            }
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
        // Never older than the last we sent: a responder refuses an initiation whose timestamp
        // is not newer than the last it accepted from us, so a wall clock stepped back (NTP, a
        // restored VM) would lock us out until it caught up.
        let now_stamp = handshake::tai64n(wall);
        let timestamp = if now_stamp > self.last_timestamp_sent {
            now_stamp
        } else {
            handshake::tai64n_after(&self.last_timestamp_sent)
        };
        self.last_timestamp_sent = timestamp;
        let me = self.identity.as_ref().expect("checked above");
        let Ok((msg, state)) = handshake::create_initiation(me, &remote, &ss, index, timestamp, &mut self.rng) else {
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
        self.handshake_event(id, "handshake initiation sent");
        self.push_transmit(to, bytes.to_vec());
    }

    /// Counts a handshake message that passed mac1 toward the load estimate.
    pub(super) fn note_handshake_load(&mut self, now: Instant) {
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
    pub(super) fn check_handshake_macs(
        &mut self,
        now: Instant,
        src: SocketAddr,
        buf: &[u8],
    ) -> Result<Option<Received>, DropReason> {
        let checker = self.checker.as_ref().ok_or(DropReason::NoPrivateKey)?;
        if !checker.mac1_valid(buf) {
            return Err(DropReason::BadMac1);
        }
        // Only what passed mac1 counts toward the load: junk, which anyone can send without
        // a key, costs us one MAC and must not make our peers' handshakes wait for cookies.
        self.note_handshake_load(now);
        if !self.under_load(now) {
            return Ok(None);
        }
        // A message with a mac2 from a source over its handshake rate is refused before the
        // mac2 is computed: a flood that answers cookies then costs what junk costs. (Asking
        // takes no token: only a valid mac2 does, so a forger of a victim's address cannot
        // spend the victim's.) Without a mac2 it may still get its cookie for later.
        if cookie::carries_mac2(buf) && !self.limiter.would_allow(src.ip(), now) {
            return Err(DropReason::RateLimited);
        }
        let checker = self.checker.as_mut().expect("checked above");
        if !checker.mac2_valid(buf, &src, now, &mut self.rng) {
            // A cookie reply costs a seal and a send: a flood with a valid mac1 (anyone who
            // knows our public key can make one) gets a source's rate of them and no more.
            if !self.cookie_limiter.allow(src.ip(), now) {
                return Err(DropReason::RateLimited);
            }
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

    /// An initiation, whole: the checks, the Diffie-Hellman, the answer (see
    /// [`Interface::begin_handshake`] for the same in steps).
    pub(super) fn receive_initiation(
        &mut self,
        now: Instant,
        wall: SystemTime,
        src: SocketAddr,
        buf: &[u8],
    ) -> Result<Received, DropReason> {
        let pending = match self.check_initiation(now, src, buf)? {
            Ok(pending) => pending,
            Err(done) => return Ok(done),
        };
        let opened = pending.open(|k| self.static_static_of(k));
        self.complete_initiation_uncounted(now, wall, pending, opened)
    }

    /// The cheap checks of an initiation (the MACs, the load, the rate limits): Ok(Err(r))
    /// if it was answered with a cookie, Ok(Ok(pending)) if its Diffie-Hellman is next.
    fn check_initiation(
        &mut self,
        now: Instant,
        src: SocketAddr,
        buf: &[u8],
    ) -> Result<Result<PendingInitiation, Received>, DropReason> {
        if let Some(r) = self.check_handshake_macs(now, src, buf)? {
            return Ok(Err(r));
        }
        let identity = self.identity.clone().ok_or(DropReason::NoPrivateKey)?;
        Ok(Ok(PendingInitiation {
            identity,
            msg: Initiation::parse(buf.try_into().expect("classified by length")),
            src,
            len: buf.len(),
        }))
    }

    /// A handshake message (not a data message) in steps, for a caller that must not hold
    /// the interface while an initiation's Diffie-Hellman runs: everything is done here
    /// ([`HandshakeStep::Done`], drops counted) except for an initiation that passed every
    /// check, whose [`PendingInitiation::open`] the caller runs without the interface, then
    /// hands to [`Interface::complete_initiation`].
    pub fn begin_handshake(
        &mut self,
        now: Instant,
        wall: SystemTime,
        src: SocketAddr,
        buf: &mut [u8],
    ) -> HandshakeStep {
        if messages::classify(buf) != Some(Kind::Initiation) {
            return HandshakeStep::Done(self.receive(now, wall, src, buf));
        }
        match self.check_initiation(now, src, buf) {
            Ok(Ok(pending)) => HandshakeStep::Initiation(pending),
            Ok(Err(done)) => HandshakeStep::Done(done),
            Err(reason) => {
                self.dropped(reason, Some(src));
                HandshakeStep::Done(Received::Dropped(reason))
            }
        }
    }

    /// DH(our static, the peer's static) for a peer's key, precomputed when it was added:
    /// what [`PendingInitiation::open`] looks up.
    pub fn static_static_of(&self, key: &PublicKey) -> Option<Zeroizing<[u8; 32]>> {
        self.by_key.get(key).and_then(|id| self.peers[id].static_static.clone())
    }

    /// The rest of an initiation once opened: the peer's replay and flood checks, the
    /// response and the new session. Drops are counted.
    pub fn complete_initiation(
        &mut self,
        now: Instant,
        wall: SystemTime,
        pending: PendingInitiation,
        opened: Result<ConsumedInitiation, HandshakeError>,
    ) -> Received {
        let src = pending.src;
        self.complete_initiation_uncounted(now, wall, pending, opened)
            .unwrap_or_else(|reason| {
                self.dropped(reason, Some(src));
                Received::Dropped(reason)
            })
    }

    fn complete_initiation_uncounted(
        &mut self,
        now: Instant,
        _wall: SystemTime,
        pending: PendingInitiation,
        opened: Result<ConsumedInitiation, HandshakeError>,
    ) -> Result<Received, DropReason> {
        // Opened with a key we no longer have: its mac1 was for that key too.
        if !self
            .identity
            .as_ref()
            .is_some_and(|me| Arc::ptr_eq(me, &pending.identity))
        {
            return Err(DropReason::BadMac1);
        }
        let consumed = opened.map_err(handshake_drop)?;
        // The peer may have gone while the initiation was opened.
        let id = *self.by_key.get(&consumed.initiator).ok_or(DropReason::UnknownPeer)?;
        let src = pending.src;
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
        peer.rx_bytes += pending.len as u64;
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

    pub(super) fn receive_response(
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

    pub(super) fn receive_cookie_reply(&mut self, now: Instant, buf: &[u8]) -> Result<Received, DropReason> {
        let msg = CookieReply::parse(buf.try_into().expect("classified by length"));
        let id = *self.indices.get(&msg.receiver).ok_or(DropReason::UnexpectedHandshake)?;
        let peer = self.peers.get_mut(&id).ok_or(DropReason::UnexpectedHandshake)?;
        if !peer.cookie.consume_reply(&msg, now) {
            return Err(DropReason::UnexpectedHandshake);
        }
        self.stats.cookie_replies_accepted += 1;
        Ok(Received::Handshake(id))
    }
}

pub(super) fn handshake_drop(e: HandshakeError) -> DropReason {
    match e {
        HandshakeError::Decrypt => DropReason::HandshakeDecrypt,
        HandshakeError::WeakKey => DropReason::WeakKey,
        HandshakeError::UnknownPeer => DropReason::UnknownPeer,
    }
}
