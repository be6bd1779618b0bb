//! Ordo's daemon: the protocol core of `ordo-proto` wrapped with I/O and configuration. The
//! tools around it are in `ordo-tools`, the `ordo` command in `ordo-cli`.
//!
//! The data plane, from the bottom up:
//! - [`port`]: the inner and outer port traits, the types that cross them, and ports chosen
//!   at run time;
//! - [`inner`] and [`outer`]: their backends (TUN, Ordo's TCP/IP stack; kernel UDP, AF_XDP;
//!   in memory), a folder each;
//! - [`packet`]: checksums, segmentation and coalescing any backend can use;
//! - [`host`]: the machine's topology and load, read from sysfs and /proc;
//! - [`placement`]: execution models, and where each peer runs (pure policy);
//! - [`plane`]: dispatch, crypto, in-order delivery and rebalancing, generic over the ports;
//! - [`threads`]: the threads that read the ports into the plane;
//! - [`health`]: the plane watching itself, and its detectors;
//! - [`device`]: the plane composed over the chosen ports, with its threads and timers, and
//!   its report.
//!
//! Around it:
//! - [`settings`]: an interface's settings beyond WireGuard's, by name.
//! - [`uapi`]: the cross-platform configuration socket that `wg` speaks.
//! - [`metrics`]: the Prometheus endpoint.
//! - [`fleet`]: a fleet of gateways: the peers they share, from etcd.
//! - [`config`]: wg-quick files.
//! - [`daemon`]: running as a daemon: detaching, readiness, the panic hook, privileges.
//! - [`interface`]: an interface as a whole: the one order it comes up and goes down in, and
//!   the interfaces whose inner side is the stack.
//! - [`quick`]: `ordo up` / `ordo down`, wg-quick's behaviour.
//! - [`run`]: `ordo run`: a program through a private stack interface, and its supervisor.
//! - [`netconf`]: addresses, routes and rules over rtnetlink.
//! - [`firewall`]: wg-quick's nftables rules for a default route.
//! - [`secret_text`]: text with keys in it, never left behind in freed memory.
//! - [`logging`]: the daemon's log.
//! - [`show`]: `ordo show`.

pub mod config;
pub mod daemon;
pub mod device;
pub mod firewall;
pub mod fleet;
pub mod health;
pub mod host;
pub mod inner;
pub mod interface;
pub mod logging;
pub mod metrics;
pub mod netconf;
pub mod outer;
pub mod packet;
pub mod placement;
pub mod plane;
pub mod port;
pub mod quick;
pub mod run;
pub mod secret_text;
pub mod settings;
pub mod show;
pub mod threads;
pub mod uapi;
