//! The data path: datagrams in ([`Interface::receive`] dispatches every message type), the
//! in-order acceptance of decrypted runs, and packets out ([`Interface::send`] or, for a
//! data plane that seals outside the lock, routing, sessions and staging).

use super::{Accepted, DropReason, Interface, OpenedMessage, Received, Sent, Transmit, MAX_TRANSMITS, SEND_HEADROOM};
use crate::messages::{self, Kind, DATA_HEADER_LEN};
use crate::packet;
use crate::peer::{PeerId, Slot, MAX_STAGED_PACKETS};
use crate::session::Session;
use crate::timers::{REKEY_AFTER_MESSAGES, REKEY_ON_RECEIVE_AGE};
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Instant, SystemTime};

impl Interface {
    /// Processes one datagram from `src`, decrypting in place.
    /// An envelope from another gateway of the fleet is opened and its datagram processed as
    /// if it came from the client (ranges stay within `buf`).
    pub fn receive(&mut self, now: Instant, wall: SystemTime, src: SocketAddr, buf: &mut [u8]) -> Received {
        if crate::fleet::is_envelope(buf) {
            let opened = match self.open_envelope(src, buf) {
                Ok(opened) => opened,
                Err(reason) => return Received::Dropped(reason),
            };
            let at = opened.datagram_at;
            return match self.receive_datagram(now, wall, opened.client, &mut buf[at..], true) {
                Received::Packet { peer, range } => Received::Packet {
                    peer,
                    range: range.start + at..range.end + at,
                },
                other => other,
            };
        }
        self.receive_datagram(now, wall, src, buf, false)
    }

    fn receive_datagram(
        &mut self,
        now: Instant,
        wall: SystemTime,
        src: SocketAddr,
        buf: &mut [u8],
        came_in_envelope: bool,
    ) -> Received {
        let r = match messages::classify(buf) {
            None => Err(DropReason::Malformed),
            Some(Kind::Data) => self.receive_data(now, wall, src, buf, came_in_envelope),
            Some(Kind::Initiation) => self.receive_initiation(now, wall, src, buf),
            Some(Kind::Response) => self.receive_response(now, wall, src, buf),
            Some(Kind::CookieReply) => self.receive_cookie_reply(now, buf),
        };
        r.unwrap_or_else(|reason| {
            self.dropped(reason, Some(src));
            Received::Dropped(reason)
        })
    }

    pub(super) fn receive_data(
        &mut self,
        now: Instant,
        wall: SystemTime,
        src: SocketAddr,
        buf: &mut [u8],
        came_in_envelope: bool,
    ) -> Result<Received, DropReason> {
        let receiver = messages::DataHeader::parse(buf).receiver;
        let Some((id, session)) = self.receiving_session(receiver) else {
            // Another gateway's session, or none: `foreign_data` counts its own drops.
            let data = super::ForeignData {
                src,
                datagram: buf,
                came_in_envelope,
            };
            return Ok(match self.foreign_data(now, wall, data) {
                super::Foreign::Dropped(r) => Received::Dropped(r),
                f => Received::Foreign(f),
            });
        };
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
            self.dropped(reason, None);
        }
    }

    /// Counts a drop that happened outside the core (a data-plane worker failed to open a
    /// message), so every reason is counted in one place.
    pub fn count_drop(&mut self, reason: DropReason) {
        self.dropped(reason, None);
    }

    /// [`Interface::count_drop`] of a datagram whose source is known, which the log names.
    pub fn count_drop_from(&mut self, reason: DropReason, src: SocketAddr) {
        self.dropped(reason, Some(src));
    }

    pub(super) fn accept_run_uncounted<'a>(
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
    pub(super) fn confirm_next_session(&mut self, id: PeerId, now: Instant, wall: SystemTime) {
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

    pub(super) fn handshake_complete(&mut self, id: PeerId, wall: SystemTime) {
        let peer = self.peers.get_mut(&id).expect("peer exists");
        peer.timers.handshake_complete();
        peer.handshake_attempts = 0;
        peer.sent_lastminute_handshake = false;
        peer.last_handshake = Some(wall);
        self.stats.handshakes_completed += 1;
        self.handshake_event(id, "handshake completed, new session");
    }

    pub(super) fn keep_key_fresh_on_receive(&mut self, id: PeerId, now: Instant, wall: SystemTime) {
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
            self.dropped(reason, None);
            Sent::Dropped(reason)
        })
    }

    pub(super) fn send_inner(
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
            || (session.we_initiated && now.saturating_duration_since(session.born) >= self.rekey_after_time);
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

    pub(super) fn stage(&mut self, id: PeerId, packet: Vec<u8>) {
        let peer = self.peers.get_mut(&id).expect("peer exists");
        let full = peer.staged.len() >= MAX_STAGED_PACKETS;
        if full {
            peer.staged.pop_front();
        }
        peer.staged.push_back(packet);
        if full {
            self.dropped(DropReason::StagedOverflow, None);
        }
    }

    /// Seals `packet` (empty for a keepalive) into `out` on `session` at once, and reports it.
    pub(super) fn seal_now(
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
    pub(super) fn flush_staged(&mut self, id: PeerId, now: Instant, wall: SystemTime) {
        let staged: Vec<Vec<u8>> = self.peers.get_mut(&id).expect("peer exists").staged.drain(..).collect();
        let packets = if staged.is_empty() { vec![Vec::new()] } else { staged };
        for p in packets {
            self.send_control_data(id, now, wall, &p);
        }
    }

    /// Seals a packet (or a keepalive, when empty) into the transmit queue.
    pub(super) fn send_control_data(&mut self, id: PeerId, now: Instant, wall: SystemTime, packet: &[u8]) {
        let Ok(Some((session, to))) = self.sending_session(now, id) else {
            return;
        };
        let mut out = vec![0u8; packet.len() + SEND_HEADROOM];
        if let Ok(len) = self.seal_now(now, wall, id, &session, packet, &mut out) {
            out.truncate(len);
            self.push_transmit(to, out);
        }
    }

    pub(super) fn push_transmit(&mut self, to: SocketAddr, payload: Vec<u8>) {
        if self.transmits.len() >= MAX_TRANSMITS {
            self.dropped(DropReason::TransmitQueueFull, None);
            return;
        }
        self.transmits.push_back(Transmit { to, payload });
    }

    /// The next control message to send, if any.
    pub fn poll_transmit(&mut self) -> Option<Transmit> {
        self.transmits.pop_front()
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
