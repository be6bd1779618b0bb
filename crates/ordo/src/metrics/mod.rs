//! The metrics endpoint (`MetricsAddress`, `--metrics`, `ORDO_METRICS`): the interface's
//! figures in the Prometheus text format, read from the device at each scrape. Peers are
//! named as the common WireGuard exporter names them (`wireguard_peer_receive_bytes_total`
//! and its kin, labelled by public key), so its dashboards and alerts work unchanged; the
//! rest is Ordo's own, under `ordo_` ([`exposition`]). [`server`] answers HTTP.

pub mod exposition;
pub mod server;
