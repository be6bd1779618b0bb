//! The fleet's peers as etcd holds them: one key per peer under the fleet's prefix,
//! `PREFIX/peers/PUBLIC_KEY` (the key in base64, as `wg` prints it), whose value is a JSON
//! object:
//!
//! ```json
//! {"allowed_ips": ["10.7.0.2/32", "fd07::2/128"], "endpoint": "192.0.2.7:51820", "persistent_keepalive": 25}
//! ```
//!
//! Every field may be left out (no allowed IPs; no endpoint: the peer is reached where it
//! last sent from; no keepalive). Nothing secret goes into etcd: a record that carries a
//! preshared key, or any field not listed here, is refused whole, as is a key that is not a
//! peer's public key.

use ipnet::IpNet;
use ordo_proto::PublicKey;
use serde::{Deserialize, Serialize};
use std::net::SocketAddr;

/// Where the peers live under a fleet's prefix.
pub const PEERS: &str = "peers/";

/// One peer as its record describes it.
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct FleetPeer {
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub allowed_ips: Vec<IpNet>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub endpoint: Option<SocketAddr>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub persistent_keepalive: Option<u16>,
}

/// The key of `peer`'s record under `prefix` (which ends in `/`).
pub fn peer_key(prefix: &str, peer: &PublicKey) -> String {
    format!("{prefix}{PEERS}{}", peer.to_base64())
}

/// The prefix every peer record of the fleet at `prefix` starts with.
pub fn peers_prefix(prefix: &str) -> String {
    format!("{prefix}{PEERS}")
}

/// A record that was refused, and why, for the log.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Refused {
    pub key: String,
    pub reason: String,
}

/// The peer a key under `prefix` names, or why it names none.
pub fn parse_key(prefix: &str, key: &[u8]) -> Result<PublicKey, Refused> {
    let text = String::from_utf8_lossy(key);
    let refuse = |reason: String| Refused {
        key: text.to_string(),
        reason,
    };
    let name = text
        .strip_prefix(&peers_prefix(prefix))
        .ok_or_else(|| refuse(format!("not under {}", peers_prefix(prefix))))?;
    PublicKey::from_base64(name).map_err(|_| refuse(format!("{name:?} is not a peer's public key in base64")))
}

/// The peer a record describes, or why it was refused.
pub fn parse_record(prefix: &str, key: &[u8], value: &[u8]) -> Result<(PublicKey, FleetPeer), Refused> {
    let public_key = parse_key(prefix, key)?;
    let refuse = |reason: String| Refused {
        key: String::from_utf8_lossy(key).to_string(),
        reason,
    };
    let peer: FleetPeer = serde_json::from_slice(value).map_err(|e| {
        let text = e.to_string();
        if text.contains("preshared_key") {
            refuse("a preshared key does not go into etcd (it is a secret; keep it in the gateways' files)".into())
        } else {
            refuse(format!("not a peer record: {text}"))
        }
    })?;
    Ok((public_key, peer))
}

#[cfg(test)]
mod tests {
    use super::*;
    use ordo_proto::PrivateKey;

    const PREFIX: &str = "/ordo/fleet/gw/";

    fn key() -> PublicKey {
        PrivateKey::from_bytes([7; 32]).public_key()
    }

    #[test]
    fn a_record_round_trips_through_its_key_and_json() {
        let peer = FleetPeer {
            allowed_ips: vec!["10.7.0.2/32".parse().unwrap(), "fd07::2/128".parse().unwrap()],
            endpoint: Some("192.0.2.7:51820".parse().unwrap()),
            persistent_keepalive: Some(25),
        };
        let k = peer_key(PREFIX, &key());
        assert!(k.starts_with("/ordo/fleet/gw/peers/"));
        let v = serde_json::to_vec(&peer).unwrap();
        assert_eq!(parse_record(PREFIX, k.as_bytes(), &v), Ok((key(), peer)));
        let bare = parse_record(PREFIX, k.as_bytes(), b"{}").unwrap().1;
        assert_eq!(bare, FleetPeer::default(), "every field may be left out");
    }

    #[test]
    fn secrets_unknown_fields_and_bad_keys_are_refused_with_a_reason() {
        let k = peer_key(PREFIX, &key());
        let psk = br#"{"allowed_ips": [], "preshared_key": "AAAA"}"#;
        let e = parse_record(PREFIX, k.as_bytes(), psk).unwrap_err();
        assert!(e.reason.contains("secret"), "{e:?}");
        let e = parse_record(PREFIX, k.as_bytes(), br#"{"allowed_ip": ["10.0.0.1/32"]}"#).unwrap_err();
        assert!(e.reason.contains("allowed_ip"), "the unknown field is named: {e:?}");
        let e = parse_record(PREFIX, k.as_bytes(), br#"{"allowed_ips": ["10.0.0.300/32"]}"#).unwrap_err();
        assert!(e.reason.contains("not a peer record"), "{e:?}");
        let e = parse_record(PREFIX, b"/ordo/fleet/gw/peers/not-a-key", b"{}").unwrap_err();
        assert!(e.reason.contains("not-a-key"), "{e:?}");
        assert!(parse_record(PREFIX, b"/ordo/fleet/other/peers/x", b"{}").is_err());
        assert!(parse_record(PREFIX, k.as_bytes(), b"\xff").is_err());
    }
}
