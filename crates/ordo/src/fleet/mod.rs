//! A fleet of gateways: interfaces on several machines that serve the same clients, with
//! their shared configuration in etcd (the v3 API; Debian's `etcd-server`). This part takes
//! the fleet's peers from etcd ([`record`] says where and how they are written; the `ordo
//! fleet` command and any etcd client write them) and keeps the interface's peers in step
//! with them ([`agent`], [`reconcile`]). Nothing secret goes into etcd: each gateway keeps
//! its private key in its own file.

pub mod admin;
pub mod agent;
pub mod figures;
pub mod gateways;
pub mod reconcile;
pub mod record;
pub mod records;
pub mod routes;
pub mod sessions;
mod store;
pub mod watch;

pub use crate::settings::fleet::FleetSettings;
