//! The inner port over Ordo's own TCP/IP stack (smoltcp): no TUN device, no root. The
//! tunnel's packets end in a stack inside this process, and applications reach it through
//! the attach service ([`service`]): the preload library (`crates/ordo-preload`) hands it
//! their connections to tunnel destinations.
//!
//! Threads: the plane writes delivered packets into an inbox and reads the stack's packets
//! from another ([`link::Wires`]); the stack, its sockets and the applications' descriptors
//! belong to one thread of their own ([`service::Service`]), woken by the inbox, the
//! applications and the stack's timers.

pub mod datagram;
pub mod link;
pub mod service;
pub mod unix;

use crate::host::wakeup::Inbox;
use crate::port::{buffers, Counter, DeliveryRun, InnerPort, InnerRead};
use ipnet::IpNet;
use link::Wires;
use std::io;
use std::os::fd::RawFd;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

/// Packets each direction holds between the plane and the stack.
const INBOX: usize = 4096;

/// What a stack interface is: its addresses in the tunnel and its MTU.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StackSettings {
    pub addresses: Vec<IpNet>,
    pub mtu: usize,
    /// Who may attach programs to it.
    pub attachers: Attachers,
}

/// Who may attach programs to a stack interface: its user (who started it: the daemon may
/// since have become another), root, and its guests.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Attachers {
    pub owner: u32,
    pub guests: Guests,
}

impl Attachers {
    /// The interface's process's own user as the owner, no guests.
    pub fn own() -> Attachers {
        Attachers {
            // SAFETY: getuid cannot fail.
            owner: unsafe { libc::getuid() },
            guests: Guests::default(),
        }
    }

    pub fn admit(&self, uid: u32) -> bool {
        uid == self.owner || uid == 0 || self.guests.admit(uid)
    }
}

/// Users other than the interface's own whose programs may attach to it (`AttachUsers =`):
/// these users, and the members of these groups.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Guests {
    pub uids: Vec<u32>,
    pub gids: Vec<u32>,
}

impl Guests {
    pub fn is_empty(&self) -> bool {
        self.uids.is_empty() && self.gids.is_empty()
    }

    /// Whether the user `uid` is one of them: named, or a member of a named group (its
    /// primary group or a supplementary one, as the group database says now).
    pub fn admit(&self, uid: u32) -> bool {
        if self.uids.contains(&uid) {
            return true;
        }
        if self.gids.is_empty() {
            return false;
        }
        let Ok(Some(user)) = nix::unistd::User::from_uid(nix::unistd::Uid::from_raw(uid)) else {
            return false;
        };
        let Ok(name) = std::ffi::CString::new(user.name) else {
            return false;
        };
        let groups = nix::unistd::getgrouplist(&name, user.gid).unwrap_or_default();
        groups.iter().any(|g| self.gids.contains(&g.as_raw()))
    }
}

pub struct StackPort {
    wires: Arc<Wires>,
    /// Read halves of queues other than 0: the stack writes everything to queue 0, so these
    /// never have anything (one inbox each, so each reader has a descriptor to wait on).
    idle: Vec<Arc<Inbox<Vec<u8>>>>,
    mtu: usize,
    delivered_dropped: Arc<AtomicU64>,
}

impl StackPort {
    /// The port, and the wires the stack's service runs on (see [`service::Service::start`]).
    pub fn new(queues: usize, mtu: usize) -> io::Result<(StackPort, Arc<Wires>)> {
        let wires = Arc::new(Wires {
            to_stack: Inbox::new(INBOX)?,
            to_plane: Inbox::new(INBOX)?,
            packets_in: AtomicU64::new(0),
            packets_out: AtomicU64::new(0),
            datagram_drops: Default::default(),
        });
        let idle = (1..queues.max(1))
            .map(|_| Inbox::new(1).map(Arc::new))
            .collect::<io::Result<_>>()?;
        let port = StackPort {
            wires: wires.clone(),
            idle,
            mtu,
            delivered_dropped: Arc::new(AtomicU64::new(0)),
        };
        Ok((port, wires))
    }

    /// The plane's side goes away: its readers fail.
    pub fn close(&self) {
        self.wires.to_plane.close();
        self.idle.iter().for_each(|i| i.close());
    }
}

impl InnerPort for StackPort {
    type Read = StackRead;

    fn reader(&self, queue: usize) -> StackRead {
        StackRead {
            wires: self.wires.clone(),
            idle: queue.checked_sub(1).and_then(|i| self.idle.get(i)).cloned(),
        }
    }

    fn write(&self, _queue: usize, run: &mut DeliveryRun<'_>) {
        for p in run.packets() {
            let mut copy = buffers::take(p.len());
            copy.extend_from_slice(p);
            if !self.wires.to_stack.push(copy) {
                self.delivered_dropped.fetch_add(1, Ordering::Relaxed);
            }
        }
    }

    fn mtu(&self) -> Option<usize> {
        Some(self.mtu)
    }

    fn counters(&self) -> Vec<Counter> {
        vec![
            Counter::new("stack_packets_in", self.wires.packets_in.load(Ordering::Relaxed)),
            Counter::new("stack_packets_out", self.wires.packets_out.load(Ordering::Relaxed)),
            Counter::new(
                "drop_stack_inbox_full",
                self.wires.to_stack.overflows.load(Ordering::Relaxed),
            ),
            Counter::new(
                "drop_stack_outbox_full",
                self.wires.to_plane.overflows.load(Ordering::Relaxed),
            ),
            Counter::new(
                "drop_stack_datagram_queue_full",
                self.wires.datagram_drops.queue_full.load(Ordering::Relaxed),
            ),
            Counter::new(
                "drop_stack_datagram_too_big",
                self.wires.datagram_drops.too_big.load(Ordering::Relaxed),
            ),
            Counter::new(
                "drop_stack_datagram_no_destination",
                self.wires.datagram_drops.no_destination.load(Ordering::Relaxed),
            ),
            Counter::new(
                "drop_stack_datagram_malformed",
                self.wires.datagram_drops.malformed.load(Ordering::Relaxed),
            ),
        ]
    }
}

/// A queue's read half: queue 0 reads what the stack sent; the others wait on an inbox that
/// stays empty until the port closes.
pub struct StackRead {
    wires: Arc<Wires>,
    idle: Option<Arc<Inbox<Vec<u8>>>>,
}

impl InnerRead for StackRead {
    fn wait_fd(&mut self) -> Option<RawFd> {
        Some(self.idle.as_deref().unwrap_or(&self.wires.to_plane).fd())
    }

    fn read(&mut self, out: &mut Vec<Vec<u8>>, max: usize) -> io::Result<()> {
        if self.wires.to_plane.is_closed() {
            return Err(io::Error::new(io::ErrorKind::BrokenPipe, "the stack was closed"));
        }
        if self.idle.is_none() {
            self.wires.to_plane.take(out, max);
        }
        Ok(())
    }
}
