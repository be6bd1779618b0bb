//! The outer port's backends: where WireGuard messages meet the network.
//! - [`udp`]: kernel UDP sockets, batched, with steering by receiver index;
//! - [`memory`]: a pair of ports joined in memory, for tests and `ordo bench`;
//! - [`faults`]: a wrapper that drops, duplicates, reorders, delays and truncates what any
//!   outer port receives;
//! - [`xdp`]: AF_XDP beside the kernel: an XDP program hands Ordo's datagrams to AF_XDP
//!   sockets and everything else to the kernel (`Outer = xdp`).

pub mod faults;
pub mod memory;
pub mod udp;
pub mod xdp;

/// Which outer port an interface runs (`Outer =` in an `ordo up` file, `--outer`,
/// `ORDO_OUTER`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum OuterKind {
    /// Kernel UDP sockets.
    #[default]
    Udp,
    /// AF_XDP beside the kernel, or kernel UDP with a message saying why not.
    Xdp,
}

impl OuterKind {
    pub fn name(self) -> &'static str {
        match self {
            OuterKind::Udp => "udp",
            OuterKind::Xdp => "xdp",
        }
    }
}

impl std::str::FromStr for OuterKind {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s.trim().to_ascii_lowercase().as_str() {
            "udp" => Ok(OuterKind::Udp),
            "xdp" => Ok(OuterKind::Xdp),
            _ => Err(format!("unknown outer side {s:?} (udp or xdp)")),
        }
    }
}
