//! Ordo's tools: what measures, examines and shows the data plane, kept apart from the daemon
//! crate (`ordo`) so that the daemon holds the data plane and its control only. The `ordo`
//! command (crates/ordo-cli) offers each as a subcommand.
//!
//! - [`loadgen`]: `ordo loadgen`, many WireGuard clients (or a flood) against a server;
//! - [`lab`]: `ordo lab report`, the figures and report of a lab scenario's results;
//! - [`bench`]: `ordo bench`, the data plane on in-memory I/O;
//! - [`top`]: `ordo top`, a live view of an interface;
//! - [`doctor`]: `ordo doctor`, what on this host slows or breaks the tunnel.

pub mod bench;
pub mod doctor;
pub mod lab;
pub mod loadgen;
pub mod top;
