//! The inner port's backends: where the tunnel's IP packets meet this host.
//! - [`tun`]: a TUN device, with its offloads;
//! - [`stack`]: Ordo's own TCP/IP stack, which applications attach to (no TUN, no root);
//! - [`memory`]: packets in memory, for tests and `ordo bench`.

pub mod memory;
pub mod stack;
pub mod tun;
