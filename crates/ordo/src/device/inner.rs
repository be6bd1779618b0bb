//! The device's inner side: a TUN device, or Ordo's own TCP/IP stack (`Inner = stack`).
//! One enum rather than a generic device, so that the controls above (UAPI, daemon, show)
//! stay one type; the match per batch costs nothing next to the system call behind it.

use crate::inner::stack::{StackPort, StackRead};
use crate::inner::tun::{TunPort, TunRead};
use crate::port::{Counter, DeliveryRun, InnerPort, InnerRead};
use std::io;
use std::os::fd::RawFd;

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

pub enum InnerSide {
    Tun(TunPort),
    Stack(StackPort),
}

pub enum InnerSideRead {
    Tun(TunRead),
    Stack(StackRead),
}

impl InnerPort for InnerSide {
    type Read = InnerSideRead;

    fn reader(&self, queue: usize) -> InnerSideRead {
        match self {
            InnerSide::Tun(t) => InnerSideRead::Tun(t.reader(queue)),
            InnerSide::Stack(s) => InnerSideRead::Stack(s.reader(queue)),
        }
    }

    fn write(&self, queue: usize, run: &mut DeliveryRun<'_>) {
        match self {
            InnerSide::Tun(t) => t.write(queue, run),
            InnerSide::Stack(s) => s.write(queue, run),
        }
    }

    fn mtu(&self) -> Option<usize> {
        match self {
            InnerSide::Tun(t) => t.mtu(),
            InnerSide::Stack(s) => s.mtu(),
        }
    }

    fn counters(&self) -> Vec<Counter> {
        match self {
            InnerSide::Tun(t) => t.counters(),
            InnerSide::Stack(s) => s.counters(),
        }
    }
}

impl InnerRead for InnerSideRead {
    fn wait_fd(&mut self) -> Option<RawFd> {
        match self {
            InnerSideRead::Tun(t) => t.wait_fd(),
            InnerSideRead::Stack(s) => s.wait_fd(),
        }
    }

    fn read(&mut self, out: &mut Vec<Vec<u8>>, max: usize) -> io::Result<()> {
        match self {
            InnerSideRead::Tun(t) => t.read(out, max),
            InnerSideRead::Stack(s) => s.read(out, max),
        }
    }
}
