//! The inner port's backends: where the tunnel's IP packets meet this host.
//! - [`tun`]: a TUN device, with its offloads;
//! - [`memory`]: packets in memory, for tests and `ordo bench`.

pub mod memory;
pub mod tun;
