//! Ordo's daemon: the protocol core of `ordo-proto` wrapped with I/O and configuration. The
//! tools around it are in `ordo-tools`, the `ordo` command in `ordo-cli`.
//!
//! The data plane, from the bottom up:
//! - [`port`]: the inner and outer port traits and the types that cross them;
//! - [`inner`] and [`outer`]: their backends (TUN; kernel UDP; in memory), a folder each;
//! - [`packet`]: checksums, segmentation and coalescing any backend can use;
//! - [`host`]: the machine's topology and load, read from sysfs and /proc;
//! - [`placement`]: execution models, and where each peer runs (pure policy);
//! - [`plane`]: dispatch, crypto, in-order delivery and rebalancing, generic over the ports;
//! - [`threads`]: the threads that read the ports into the plane;
//! - [`device`]: the plane composed over TUN and UDP, with its threads and timers.
//!
//! Around it:
//! - [`uapi`]: the cross-platform configuration socket that `wg` speaks.
//! - [`config`]: wg-quick files.
//! - [`quick`]: `ordo up` / `ordo down`, wg-quick's behaviour.
//! - [`netconf`]: addresses, routes and rules over rtnetlink.
//! - [`firewall`]: wg-quick's nftables rules for a default route.
//! - [`daemon`]: running as `ordo IFNAME`: detaching, readiness, dropping privileges.
//! - [`secret_text`]: text with keys in it, never left behind in freed memory.
//! - [`show`]: `ordo show`.

pub mod config;
pub mod daemon;
pub mod device;
pub mod firewall;
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
