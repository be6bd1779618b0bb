//! Ordo: the protocol core of `ordo-proto` wrapped with I/O, configuration and tools.
//!
//! - [`device`]: the data plane: TUN device, UDP sockets, threads around the core.
//! - [`uapi`]: the cross-platform configuration socket that `wg` speaks.
//! - [`config`]: wg-quick files.
//! - [`quick`]: `ordo up` / `ordo down`, wg-quick's behaviour.
//! - [`netconf`]: addresses, routes and rules over rtnetlink.
//! - [`daemon`]: running as `ordo IFNAME`: detaching, readiness, dropping privileges.
//! - [`show`]: `ordo show`.
//! - [`bench`]: `ordo bench`, the data plane on in-memory I/O.

pub mod bench;
pub mod config;
pub mod daemon;
pub mod device;
pub mod lab;
pub mod loadgen;
pub mod netconf;
pub mod quick;
pub mod show;
pub mod uapi;
