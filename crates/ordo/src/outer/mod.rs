//! The outer port's backends: where WireGuard messages meet the network.
//! - [`udp`]: kernel UDP sockets, batched, with steering by receiver index;
//! - [`memory`]: a pair of ports joined in memory, for tests and `ordo bench`;
//! - [`faults`]: a wrapper that drops, duplicates, reorders, delays and truncates what any
//!   outer port receives;
//! - [`xdp`]: AF_XDP beside the kernel (being built: its XDP program so far).

pub mod faults;
pub mod memory;
pub mod udp;
pub mod xdp;
