//! Which gateway holds each client's session, as etcd holds it: `PREFIX/sessions/PUBLIC_KEY`
//! (the client's key in base64), whose value names the gateway, our receiver indices of the
//! client's sessions there, and where the client was last heard from:
//!
//! ```json
//! {"gateway": 1, "indices": [16909060, 16909317], "endpoint": "10.9.0.2:40000", "handshake_ms": 1795000000000}
//! ```
//!
//! Nothing secret: the indices and the endpoint are on the wire in clear anyway. The holder
//! writes the record on its lease, rewrites it at each new session and deletes it when its
//! session ends (unless another gateway has taken the client since). When two gateways hold
//! sessions with one client (one was frozen while the other took the client over), the
//! newer handshake is the client's: the record is the gateway's whose handshake is newest
//! (`handshake_ms`, wall-clock milliseconds: the fleet's clocks agree, as the handshakes'
//! timestamps need anyway). With them, and the
//! gateways' records ([`super::gateways`]), each gateway knows what to do with a datagram
//! for a session it does not hold ([`view`]).

use super::gateways::GatewayRecord;
use crate::device::peers::PeerCopy;
use ordo_proto::fleet::GatewayId;
use ordo_proto::interface::{FleetView, ForeignSession};
use ordo_proto::timers::REJECT_AFTER_TIME;
use ordo_proto::PublicKey;
use serde::{Deserialize, Serialize};
use std::collections::{BTreeMap, BTreeSet};
use std::net::SocketAddr;
use std::time::SystemTime;

pub const SESSIONS: &str = "sessions/";

/// One client's session record.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SessionRecord {
    pub gateway: u8,
    pub indices: Vec<u32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub endpoint: Option<SocketAddr>,
    /// When the session's handshake completed, in milliseconds since the Unix epoch.
    pub handshake_ms: u64,
}

pub fn session_key(prefix: &str, client: &PublicKey) -> String {
    format!("{prefix}{SESSIONS}{}", client.to_base64())
}

/// The sessions this gateway holds now, as their records should say: every peer with a
/// session younger than REJECT_AFTER_TIME.
pub fn held<'a>(
    me: GatewayId,
    peers: impl IntoIterator<Item = &'a PeerCopy>,
    now: SystemTime,
) -> BTreeMap<PublicKey, SessionRecord> {
    let mut held = BTreeMap::new();
    for p in peers.into_iter().filter(|p| !p.session_indices.is_empty()) {
        let Some(handshake) = p.last_handshake else { continue };
        if now
            .duration_since(handshake)
            .map_or(true, |age| age >= REJECT_AFTER_TIME)
        {
            continue;
        }
        let mut indices = p.session_indices.clone();
        indices.sort_unstable();
        let record = SessionRecord {
            gateway: me.0,
            indices,
            endpoint: p.endpoint,
            handshake_ms: unix_ms(handshake),
        };
        held.insert(p.public_key, record);
    }
    held
}

fn unix_ms(t: SystemTime) -> u64 {
    t.duration_since(SystemTime::UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64)
}

/// What this gateway must write so that etcd says what it holds.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct SessionPlan {
    pub puts: Vec<(PublicKey, SessionRecord)>,
    /// Records that still name this gateway for sessions it no longer holds.
    pub deletes: Vec<PublicKey>,
}

impl SessionPlan {
    pub fn is_empty(&self) -> bool {
        self.puts.is_empty() && self.deletes.is_empty()
    }
}

/// The writes that make etcd say what this gateway holds. `stored` is the records as last
/// read, `written` those this gateway has written on its current lease. A session held here
/// whose record names another gateway is written only if its handshake is the newer one.
/// Only records written on the current lease are deleted when their session ends: those of
/// an earlier life of the gateway (before a restart) are left to their lease, and meanwhile
/// say which client an index of before the restart was (`Interface::foreign_data` takes
/// such a client back).
pub fn plan(
    me: GatewayId,
    held: &BTreeMap<PublicKey, SessionRecord>,
    stored: &BTreeMap<PublicKey, SessionRecord>,
    written: &BTreeMap<PublicKey, SessionRecord>,
) -> SessionPlan {
    let ours = |k: &PublicKey, r: &SessionRecord| {
        written.get(k) != Some(r)
            && stored
                .get(k)
                .is_none_or(|s| s.gateway == me.0 || s.handshake_ms < r.handshake_ms)
    };
    let puts = (held.iter())
        .filter(|(k, r)| ours(k, r))
        .map(|(k, r)| (*k, r.clone()))
        .collect();
    let deletes = (written.keys())
        .filter(|k| !held.contains_key(*k) && stored.get(*k).is_some_and(|s| s.gateway == me.0))
        .copied()
        .collect();
    SessionPlan { puts, deletes }
}

/// The clients whose sessions another gateway holds by the records (its handshake with
/// them is the newest): their return routes are that gateway's to announce.
pub fn elsewhere(me: GatewayId, stored: &BTreeMap<PublicKey, SessionRecord>) -> BTreeSet<PublicKey> {
    (stored.iter())
        .filter(|(_, r)| r.gateway != me.0)
        .map(|(k, _)| *k)
        .collect()
}

/// The fleet as the core needs it: the other gateways that are up (a record and a health
/// record) and the recorded sessions by receiver index, this gateway's own included (an
/// index it no longer knows is one of before a restart).
pub fn view(
    me: GatewayId,
    gateways: &BTreeMap<GatewayId, GatewayRecord>,
    healthy: &BTreeSet<GatewayId>,
    stored: &BTreeMap<PublicKey, SessionRecord>,
) -> FleetView {
    let gateways = (gateways.iter())
        .filter(|(id, _)| **id != me && healthy.contains(id))
        .map(|(id, r)| (*id, r.forward))
        .collect();
    let mut sessions = std::collections::HashMap::new();
    for (client, r) in stored {
        let Some(endpoint) = r.endpoint else { continue };
        for index in &r.indices {
            let session = ForeignSession {
                client: *client,
                endpoint,
            };
            sessions.insert(*index, session);
        }
    }
    FleetView { gateways, sessions }
}

#[cfg(test)]
mod tests {
    use super::*;
    use ordo_proto::PrivateKey;
    use std::time::Duration;

    fn key(seed: u8) -> PublicKey {
        PrivateKey::from_bytes([seed; 32]).public_key()
    }

    fn peer(seed: u8, indices: &[u32], handshake_ago: Option<u64>) -> PeerCopy {
        PeerCopy {
            endpoint: Some(format!("10.9.0.{seed}:40000").parse().unwrap()),
            last_handshake: handshake_ago.map(|s| SystemTime::now() - Duration::from_secs(s)),
            session_indices: indices.to_vec(),
            ..PeerCopy::bare(key(seed))
        }
    }

    #[test]
    fn held_sessions_are_written_and_ended_ones_deleted_unless_taken_elsewhere() {
        let me = GatewayId(1);
        let peers = [
            peer(1, &[0x0100_0002, 0x0100_0001], Some(5)),
            peer(2, &[0x0100_0003], Some(200)),
            peer(3, &[], None),
        ];
        let held = held(me, &peers, SystemTime::now());
        assert_eq!(held.len(), 1, "only the live session");
        assert_eq!(held[&key(1)].indices, [0x0100_0001, 0x0100_0002], "sorted");

        let (mut stored, mut written) = (BTreeMap::new(), BTreeMap::new());
        let p = plan(me, &held, &stored, &written);
        assert_eq!((p.puts.len(), p.deletes.len()), (1, 0));
        stored.insert(key(1), held[&key(1)].clone());
        assert_eq!(
            plan(me, &held, &stored, &written).puts.len(),
            1,
            "in etcd, but on an earlier lease"
        );
        written.insert(key(1), held[&key(1)].clone());
        assert!(
            plan(me, &held, &stored, &written).is_empty(),
            "nothing to write when etcd agrees"
        );
        // Ours for a session that ended: deleted. Another gateway's: left alone.
        let theirs = SessionRecord {
            gateway: 2,
            indices: vec![0x0200_0001],
            endpoint: Some("10.9.0.4:40000".parse().unwrap()),
            handshake_ms: held[&key(1)].handshake_ms - 1,
        };
        stored.insert(
            key(2),
            SessionRecord {
                gateway: 1,
                ..theirs.clone()
            },
        );
        stored.insert(key(4), theirs.clone());
        let earlier_life = SessionRecord {
            gateway: 1,
            ..theirs.clone()
        };
        stored.insert(key(5), earlier_life);
        written.insert(key(2), stored[&key(2)].clone());
        assert_eq!(
            plan(me, &held, &stored, &written).deletes,
            [key(2)],
            "this life's ended session, not one of an earlier life (key 5), not another gateway's"
        );
        assert_eq!(elsewhere(me, &stored), BTreeSet::from([key(4)]));
        // The client handshook here after another gateway had it: the record is rewritten;
        // before: it is left to the other gateway (the client went there since).
        stored.insert(
            key(1),
            SessionRecord {
                gateway: 2,
                ..theirs.clone()
            },
        );
        written.clear();
        assert_eq!(plan(me, &held, &stored, &written).puts.len(), 1);
        let newer = held[&key(1)].handshake_ms + 1;
        stored.insert(
            key(1),
            SessionRecord {
                gateway: 2,
                handshake_ms: newer,
                ..theirs
            },
        );
        assert!(plan(me, &held, &stored, &written).puts.is_empty());
    }

    #[test]
    fn the_view_has_the_other_gateways_that_are_up_and_the_recorded_sessions() {
        let me = GatewayId(1);
        let record = |port| GatewayRecord {
            forward: format!("10.0.0.1:{port}").parse().unwrap(),
        };
        let gateways = BTreeMap::from([
            (GatewayId(1), record(1)),
            (GatewayId(2), record(2)),
            (GatewayId(3), record(3)),
        ]);
        let healthy = BTreeSet::from([GatewayId(1), GatewayId(2)]);
        let stored = BTreeMap::from([
            (
                key(1),
                SessionRecord {
                    gateway: 3,
                    indices: vec![0x0300_0001, 0x0300_0102],
                    endpoint: Some("10.9.0.1:1".parse().unwrap()),
                    handshake_ms: 1,
                },
            ),
            (
                key(2),
                SessionRecord {
                    gateway: 1,
                    indices: vec![0x0100_0001],
                    endpoint: Some("10.9.0.2:1".parse().unwrap()),
                    handshake_ms: 1,
                },
            ),
            (
                key(3),
                SessionRecord {
                    gateway: 2,
                    indices: vec![0x0200_0001],
                    endpoint: None,
                    handshake_ms: 1,
                },
            ),
        ]);
        let v = view(me, &gateways, &healthy, &stored);
        assert_eq!(
            v.gateways.keys().collect::<Vec<_>>(),
            [&GatewayId(2)],
            "not me, not the unhealthy"
        );
        let mut indices: Vec<u32> = v.sessions.keys().copied().collect();
        indices.sort_unstable();
        assert_eq!(
            indices,
            [0x0100_0001, 0x0300_0001, 0x0300_0102],
            "every recorded session but one without an endpoint, this gateway's too"
        );
        assert_eq!(v.sessions[&0x0300_0001].client, key(1));
    }
}
