//! The inner port's backends: where the tunnel's IP packets meet this host.
//! - [`tun`]: a TUN device, with its offloads;
//! - [`stack`]: Ordo's own TCP/IP stack, which applications attach to (no TUN, no root);
//! - [`memory`]: packets in memory, for tests and `ordo bench`.

pub mod memory;
pub mod stack;
pub mod tun;

/// Which inner side an interface has (`Inner =` in an `ordo up` file, `--inner`, `ORDO_INNER`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum InnerKind {
    /// A TUN device: the host's own stack and applications use the tunnel (needs CAP_NET_ADMIN).
    #[default]
    Tun,
    /// Ordo's TCP/IP stack: applications attach to it (`ordo run`); no device, no privilege.
    Stack,
}

impl std::str::FromStr for InnerKind {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s.to_ascii_lowercase().as_str() {
            "tun" => Ok(InnerKind::Tun),
            "stack" => Ok(InnerKind::Stack),
            _ => Err(format!("unknown inner side {s:?} (tun or stack)")),
        }
    }
}
