//! Everything a gateway reads under its fleet's prefix, as last read: the peers
//! ([`super::record`]), the gateways and their health ([`super::gateways`]) and who holds
//! which session ([`super::sessions`]). The agent feeds it etcd's puts and deletes; a record
//! that is refused counts as absent (what cannot be read for certain is not let by on what
//! it said before).

use super::gateways::{self, GatewayRecord, HealthRecord};
use super::record::{self, FleetPeer, Refused};
use super::sessions::{self, SessionRecord};
use ordo_proto::fleet::GatewayId;
use ordo_proto::PublicKey;
use std::collections::{BTreeMap, BTreeSet};

#[derive(Default)]
pub struct FleetRecords {
    pub peers: BTreeMap<PublicKey, FleetPeer>,
    pub gateways: BTreeMap<GatewayId, GatewayRecord>,
    pub healthy: BTreeSet<GatewayId>,
    pub sessions: BTreeMap<PublicKey, SessionRecord>,
}

/// A key under the fleet's prefix, by kind.
enum Kind<'a> {
    Peer,
    Gateway(&'a str),
    Health(&'a str),
    Session(&'a str),
    Other,
}

fn kind<'a>(prefix: &str, key: &'a str) -> Kind<'a> {
    let Some(rest) = key.strip_prefix(prefix) else {
        return Kind::Other;
    };
    if rest.starts_with(record::PEERS) {
        Kind::Peer
    } else if let Some(id) = rest.strip_prefix(gateways::GATEWAYS) {
        Kind::Gateway(id)
    } else if let Some(id) = rest.strip_prefix(gateways::HEALTH) {
        Kind::Health(id)
    } else if let Some(client) = rest.strip_prefix(sessions::SESSIONS) {
        Kind::Session(client)
    } else {
        Kind::Other
    }
}

impl FleetRecords {
    pub fn clear(&mut self) {
        *self = FleetRecords::default();
    }

    /// Takes a record in; a refused one is forgotten, and said why.
    pub fn take(&mut self, prefix: &str, key: &[u8], value: &[u8]) -> Result<(), Refused> {
        let text = String::from_utf8_lossy(key);
        let refuse = |reason: String| Refused {
            key: text.to_string(),
            reason,
        };
        let result = match kind(prefix, &text) {
            Kind::Peer => record::parse_record(prefix, key, value).map(|(k, peer)| {
                self.peers.insert(k, peer);
            }),
            Kind::Gateway(id) => gateways::parse_id(id)
                .and_then(|id| {
                    serde_json::from_slice(value)
                        .map(|r| (id, r))
                        .map_err(|e| e.to_string())
                })
                .map(|(id, r)| {
                    self.gateways.insert(id, r);
                })
                .map_err(refuse),
            Kind::Health(id) => gateways::parse_id(id)
                .and_then(|id| {
                    serde_json::from_slice::<HealthRecord>(value)
                        .map(|_| id)
                        .map_err(|e| e.to_string())
                })
                .map(|id| {
                    self.healthy.insert(id);
                })
                .map_err(refuse),
            Kind::Session(client) => PublicKey::from_base64(client)
                .map_err(|_| format!("{client:?} is not a peer's public key in base64"))
                .and_then(|k| serde_json::from_slice(value).map(|r| (k, r)).map_err(|e| e.to_string()))
                .map(|(k, r)| {
                    self.sessions.insert(k, r);
                })
                .map_err(refuse),
            Kind::Other => Ok(()),
        };
        if result.is_err() {
            self.forget(prefix, key);
        }
        result
    }

    /// A record deleted (or refused).
    pub fn forget(&mut self, prefix: &str, key: &[u8]) {
        let text = String::from_utf8_lossy(key);
        match kind(prefix, &text) {
            Kind::Peer => {
                if let Ok(k) = record::parse_key(prefix, key) {
                    self.peers.remove(&k);
                }
            }
            Kind::Gateway(id) => {
                if let Ok(id) = gateways::parse_id(id) {
                    self.gateways.remove(&id);
                }
            }
            Kind::Health(id) => {
                if let Ok(id) = gateways::parse_id(id) {
                    self.healthy.remove(&id);
                }
            }
            Kind::Session(client) => {
                if let Ok(k) = PublicKey::from_base64(client) {
                    self.sessions.remove(&k);
                }
            }
            Kind::Other => {}
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use ordo_proto::PrivateKey;

    const PREFIX: &str = "/ordo/fleet/gw/";

    #[test]
    fn each_kind_of_record_lands_in_its_place_and_a_refused_one_counts_as_gone() {
        let mut r = FleetRecords::default();
        let client = PrivateKey::from_bytes([3; 32]).public_key();
        let peer = record::peer_key(PREFIX, &client);
        r.take(PREFIX, peer.as_bytes(), br#"{"allowed_ips": ["10.7.0.2/32"]}"#)
            .unwrap();
        r.take(
            PREFIX,
            b"/ordo/fleet/gw/gateways/2",
            br#"{"forward": "10.0.2.2:51820"}"#,
        )
        .unwrap();
        r.take(PREFIX, b"/ordo/fleet/gw/health/2", b"{}").unwrap();
        let session = sessions::session_key(PREFIX, &client);
        let value = br#"{"gateway": 2, "indices": [33554433], "endpoint": "10.9.0.2:40000", "handshake_ms": 5}"#;
        r.take(PREFIX, session.as_bytes(), value).unwrap();
        r.take(PREFIX, b"/ordo/fleet/gw/something-newer/1", b"?").unwrap();
        assert_eq!((r.peers.len(), r.gateways.len(), r.healthy.len()), (1, 1, 1));
        assert_eq!(r.sessions[&client].indices, [0x0200_0001]);

        // Refused: forgotten, with the reason.
        let e = r
            .take(PREFIX, b"/ordo/fleet/gw/health/2", br#"{"up": true}"#)
            .unwrap_err();
        assert!(e.reason.contains("up"), "{e:?}");
        assert!(r.healthy.is_empty());
        assert!(r.take(PREFIX, session.as_bytes(), br#"{"gateway": 2}"#).is_err());
        assert!(r.sessions.is_empty());
        assert!(r
            .take(
                PREFIX,
                b"/ordo/fleet/gw/gateways/0",
                br#"{"forward": "10.0.2.2:51820"}"#
            )
            .is_err());
        r.forget(PREFIX, b"/ordo/fleet/gw/gateways/2");
        r.forget(PREFIX, peer.as_bytes());
        assert!(r.gateways.is_empty() && r.peers.is_empty());
    }
}
