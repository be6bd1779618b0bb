//! The fleet's gateways as etcd holds them, each by its id (`FleetGateway =`, 1 to 255):
//!
//! - `PREFIX/gateways/ID`: `{"forward": "10.0.1.2:51820"}`, where the others pass it the
//!   datagrams of its sessions. Written by the gateway's daemon, on its lease.
//! - `PREFIX/health/ID`: `{}`, present while the gateway's data path answers the probes of
//!   its watch (`ordo fleet NAME watch`), on the watch's lease: deleted the moment the watch
//!   withdraws the gateway, gone a few seconds after the watch itself dies.
//!
//! A gateway is up for the others while both are there: a daemon that is alive but not
//! forwarding is down, which is what the watch is for.

use ordo_proto::fleet::GatewayId;
use serde::{Deserialize, Serialize};
use std::net::SocketAddr;

pub const GATEWAYS: &str = "gateways/";
pub const HEALTH: &str = "health/";

/// A gateway's own record.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct GatewayRecord {
    pub forward: SocketAddr,
}

/// A health record: nothing but its presence.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct HealthRecord {}

pub fn gateway_key(prefix: &str, id: GatewayId) -> String {
    format!("{prefix}{GATEWAYS}{}", id.0)
}

pub fn health_key(prefix: &str, id: GatewayId) -> String {
    format!("{prefix}{HEALTH}{}", id.0)
}

/// The id at the end of a gateway's or health record's key (`rest` is what follows its
/// kind's prefix).
pub fn parse_id(rest: &str) -> Result<GatewayId, String> {
    match rest.parse::<u8>() {
        Ok(g) if g != 0 && rest == g.to_string() => Ok(GatewayId(g)),
        _ => Err(format!("{rest:?} is not a gateway's id (1 to 255)")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_and_ids_round_trip_and_odd_ids_are_refused() {
        let k = gateway_key("/ordo/fleet/gw/", GatewayId(7));
        assert_eq!(k, "/ordo/fleet/gw/gateways/7");
        assert_eq!(parse_id(k.rsplit('/').next().unwrap()), Ok(GatewayId(7)));
        for bad in ["0", "256", "07", "+7", "", "x"] {
            assert!(parse_id(bad).is_err(), "{bad:?}");
        }
        let r: GatewayRecord = serde_json::from_str(r#"{"forward": "10.0.1.2:51820"}"#).unwrap();
        assert_eq!(r.forward, "10.0.1.2:51820".parse().unwrap());
        assert!(serde_json::from_str::<GatewayRecord>(r#"{"forward": "10.0.1.2:51820", "key": 1}"#).is_err());
        assert!(serde_json::from_str::<HealthRecord>("{}").is_ok());
    }
}
