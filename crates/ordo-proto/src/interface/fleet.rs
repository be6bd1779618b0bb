//! The interface as a gateway of a fleet (`crate::fleet`): its receiver indices name it, and a
//! data message for a session it does not hold is passed to the gateway that does, or, when
//! that gateway is down, answered with a handshake that takes the client over.
//!
//! What the fleet looks like (which gateways are up, where their envelopes go, the other
//! gateways' sessions) is given by the caller, from the fleet's shared records; the core
//! decides per datagram.

use super::{DropReason, Interface};
use crate::fleet::{self, EnvelopeKey, GatewayId};
use crate::keys::PublicKey;
use crate::messages;
use crate::peer::PeerId;
use std::collections::HashMap;
use std::net::SocketAddr;
use std::time::{Instant, SystemTime};

/// Another gateway's session, as its record says.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ForeignSession {
    pub client: PublicKey,
    /// Where the client was last heard from by its owner.
    pub endpoint: SocketAddr,
}

/// The fleet as this gateway sees it.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct FleetView {
    /// The other gateways that are up, and where envelopes for them go.
    pub gateways: HashMap<GatewayId, SocketAddr>,
    /// The other gateways' sessions, by their receiver index.
    pub sessions: HashMap<u32, ForeignSession>,
}

pub(super) struct FleetState {
    pub(super) me: GatewayId,
    view: FleetView,
    /// The envelopes' key, from the private key (None while there is none).
    key: Option<EnvelopeKey>,
}

/// A data message for a receiver index this interface does not know, as it arrived.
#[derive(Debug, Clone, Copy)]
pub struct ForeignData<'a> {
    /// Where the client sent it from (for one in an envelope, what the envelope says).
    pub src: SocketAddr,
    pub datagram: &'a [u8],
    /// It was passed here by another gateway already, and is not passed on again.
    pub came_in_envelope: bool,
}

/// What became of a data message for a receiver index this interface does not know.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Foreign {
    /// Passed in an envelope to the gateway that holds its session.
    Forwarded(GatewayId),
    /// Its session's owner is down: a handshake to the client is under way from here.
    TakenOver(PeerId),
    Dropped(DropReason),
}

impl Interface {
    /// Makes this interface gateway `me` of a fleet (None: of none). Indices drawn from now on
    /// name it; those of sessions already made keep what they had.
    pub fn set_fleet_gateway(&mut self, me: Option<GatewayId>) {
        let me = me.filter(|g| g.0 != 0);
        if self.fleet.as_ref().map(|f| f.me) != me {
            self.fleet = me.map(|me| FleetState {
                me,
                view: FleetView::default(),
                key: None,
            });
            self.rekey_fleet();
        }
    }

    /// Derives the envelopes' key again: the private key changed, or the fleet did.
    pub(super) fn rekey_fleet(&mut self) {
        let key = self.private_key().map(EnvelopeKey::of);
        if let Some(f) = self.fleet.as_mut() {
            f.key = key;
        }
    }

    pub fn fleet_gateway(&self) -> Option<GatewayId> {
        self.fleet.as_ref().map(|f| f.me)
    }

    /// The fleet as the shared records have it now.
    pub fn set_fleet_view(&mut self, view: FleetView) {
        if let Some(f) = self.fleet.as_mut() {
            f.view = view;
        }
    }

    /// The key of envelopes: from our private key, which every gateway of the fleet shares.
    fn envelope_key(&self) -> Option<&EnvelopeKey> {
        self.fleet.as_ref()?.key.as_ref()
    }

    /// A fresh receiver index drawn at random is made to name us.
    pub(super) fn owned_index(&self, index: u32) -> u32 {
        match &self.fleet {
            Some(f) => fleet::with_owner(index, f.me),
            None => index,
        }
    }

    /// Opens an envelope from another gateway of the fleet: the client it came from and
    /// where its datagram starts. Counted when refused.
    pub fn open_envelope(&mut self, src: SocketAddr, envelope: &[u8]) -> Result<fleet::Opened, DropReason> {
        let opened = match self.envelope_key() {
            Some(key) => fleet::open_envelope(key, envelope).map_err(|_| DropReason::BadEnvelope),
            None => Err(DropReason::Malformed),
        };
        match opened {
            Ok(o) => {
                self.stats.fleet_envelopes_opened += 1;
                Ok(o)
            }
            Err(r) => {
                self.dropped(r, Some(src));
                Err(r)
            }
        }
    }

    /// A data message from `src` whose receiver index we do not know. Another gateway's that
    /// is up gets it in an envelope (in the transmit queue), unless it came in one already.
    /// Otherwise, if a session record names the client (its gateway is down, or it is ours
    /// from before a restart), we initiate a handshake to the client at once (gateways share
    /// the static key, so the client takes it) instead of leaving it to WireGuard's timers,
    /// which wait 15 s. Else, or without a fleet, it is dropped. Counted either way.
    pub fn foreign_data(&mut self, now: Instant, wall: SystemTime, data: ForeignData) -> Foreign {
        match self.foreign_verdict(now, wall, data) {
            Ok(f) => f,
            Err(r) => {
                self.dropped(r, Some(data.src));
                Foreign::Dropped(r)
            }
        }
    }

    fn foreign_verdict(&mut self, now: Instant, wall: SystemTime, data: ForeignData) -> Result<Foreign, DropReason> {
        let ForeignData {
            src,
            datagram,
            came_in_envelope,
        } = data;
        let Some(f) = &self.fleet else {
            return Err(DropReason::UnknownReceiver);
        };
        let receiver = messages::DataHeader::parse(datagram).receiver;
        let owner = fleet::owner_of(receiver);
        let passable = !came_in_envelope && owner != f.me && owner.0 != 0;
        if let Some(to) = f.view.gateways.get(&owner).copied().filter(|_| passable) {
            let key = self.envelope_key().ok_or(DropReason::NoPrivateKey)?;
            let envelope = fleet::seal_envelope(key, src, datagram);
            self.push_transmit(to, envelope);
            self.stats.fleet_forwarded += 1;
            return Ok(Foreign::Forwarded(owner));
        }
        // Nobody up holds the session: its gateway is down, or it is this one from before a
        // restart. The client is taken over if its record says who it is. Only a client heard
        // from where its record says: a data message cannot be authenticated here, and one
        // with a forged source must not point the client's endpoint elsewhere.
        let session = f.view.sessions.get(&receiver).ok_or(DropReason::UnknownReceiver)?;
        if session.endpoint != src {
            return Err(DropReason::UnknownReceiver);
        }
        let id = *self.by_key.get(&session.client).ok_or(DropReason::UnknownPeer)?;
        let peer = self.peers.get_mut(&id).expect("peer exists");
        peer.endpoint = Some(src);
        let before = self.stats.handshakes_initiated;
        self.initiate(id, now, wall, false);
        if self.stats.handshakes_initiated != before {
            self.stats.fleet_takeovers += 1;
            self.handshake_event(id, "its gateway is down: taking the client over");
        }
        Ok(Foreign::TakenOver(id))
    }
}
