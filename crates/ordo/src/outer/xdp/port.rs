//! The outer port over AF_XDP (`Outer = xdp`): Ordo's program on each outer interface hands
//! its datagrams to AF_XDP sockets, one per NIC queue, and everything else to the kernel;
//! datagrams leave as frames Ordo writes on the path the kernel would take ([`Paths`]).
//!
//! A kernel UDP port ([`UdpPort`]) stays bound on the same port beside the sockets: it
//! reserves the port, receives what the program passes (fragments, IP options, a datagram
//! longer than a frame or on a NIC queue without a socket), and sends what AF_XDP cannot (to
//! a destination whose next hop the kernel has not resolved, which the kernel then resolves;
//! by an interface without Ordo's program; longer than the link's MTU, which the kernel
//! fragments).
//!
//! Queues: an AF_XDP socket receives only from the NIC queue it is bound to, which the
//! sender's hash chooses, not Ordo. So NIC queue `n` belongs to Ordo queue `n mod queues`,
//! and a datagram reaching a queue other than its peer's is handed over by the plane's
//! dispatch as any misplaced datagram is. Steering by receiver index in the program would
//! need sockets sharing one UMEM on one NIC queue (XDP_SHARED_UMEM), which the `xdp` crate
//! does not offer; on a real NIC, ethtool's flow rules can choose the queue instead.

use super::attach::{self, Attachment, Mode, Unavailable};
use super::filter::Filter;
use super::frame::Path;
use super::paths::Paths;
use super::queue::XskQueue;
use super::route::{Hop, Interface, Routes};
use crate::outer::udp::{UdpPort, UdpReceive};
use crate::port::{Counter, Datagram, OuterPort, OuterReceive, SteeringException, RECEIVE_WAIT};
use std::io;
use std::net::SocketAddr;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};

/// AF_XDP sockets per interface at most (one per NIC queue, from queue 0): each has a UMEM
/// of its own ([`super::queue::FRAMES`] frames). Datagrams on higher NIC queues reach the
/// kernel UDP socket instead.
pub const MAX_SOCKETS: u32 = 16;

/// Ordo's program and sockets on one interface.
struct Attached {
    interface: Interface,
    /// Its calls need no lock: each is one system call on the map's descriptor.
    attachment: Attachment,
    /// By NIC queue.
    sockets: Vec<Arc<Mutex<XskQueue>>>,
    zero_copy: bool,
}

/// What the port counts itself (the program counts its own verdicts).
#[derive(Default)]
struct Counts {
    /// Datagrams sent as frames Ordo wrote.
    sent_xdp: AtomicU64,
    /// Datagrams sent through the kernel socket: no resolved path yet, or not by an
    /// interface of Ordo's.
    sent_kernel: AtomicU64,
    /// Datagrams not sent: the socket's ring or memory full.
    send_full: AtomicU64,
    /// Frames redirected to a socket that were not a datagram Ordo could read.
    malformed: Arc<AtomicU64>,
}

pub struct XdpPort {
    udp: UdpPort,
    attached: Vec<Attached>,
    paths: Paths,
    queues: usize,
    /// Readable once the port shuts down, to end the receive halves' waits.
    shutdown: Arc<OwnedFd>,
    counts: Counts,
}

/// Why `Outer = xdp` could not start, with the kernel UDP port to carry on with.
pub struct Fallback {
    pub udp: UdpPort,
    pub reason: String,
}

fn locked<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

impl XdpPort {
    /// Puts Ordo's program and sockets on `interfaces` (none named: the default routes'
    /// interfaces, see [`Routes::outer_interfaces`]), in `mode` (None: the best each
    /// allows), beside `udp`, which keeps the port and
    /// has `queues` queues. All or nothing: if one interface cannot, none runs AF_XDP and
    /// the reason comes back with `udp`.
    pub fn open(udp: UdpPort, interfaces: &[String], mode: Option<Mode>, queues: usize) -> Result<XdpPort, Fallback> {
        match Self::attach_all(&udp, interfaces, mode) {
            Ok((attached, paths)) => {
                // SAFETY: eventfd takes no pointers; the descriptor is checked before it is owned.
                let fd = unsafe { libc::eventfd(0, libc::EFD_CLOEXEC | libc::EFD_NONBLOCK) };
                if fd < 0 {
                    let reason = format!("no eventfd: {}", io::Error::last_os_error());
                    return Err(Fallback { udp, reason });
                }
                // SAFETY: fd is a new descriptor that nothing else owns.
                let shutdown = Arc::new(unsafe { OwnedFd::from_raw_fd(fd) });
                // The kernel must not merge the port's datagrams before the program sees
                // them (see `UdpPort::disable_gro`); a peer's GSO batch the program passes
                // whole, and the kernel socket then receives it split. Before any peer is
                // configured, so that nothing merged meets the program.
                if let Err(e) = udp.disable_gro() {
                    drop((attached, paths));
                    let reason = format!("cannot turn UDP GRO off: {e}");
                    return Err(Fallback { udp, reason });
                }
                Ok(XdpPort {
                    udp,
                    attached,
                    paths,
                    queues: queues.max(1),
                    shutdown,
                    counts: Counts::default(),
                })
            }
            Err(reason) => Err(Fallback { udp, reason }),
        }
    }

    fn attach_all(udp: &UdpPort, names: &[String], mode: Option<Mode>) -> Result<(Vec<Attached>, Paths), String> {
        let routes = Routes::open().map_err(|e| format!("cannot read the kernel's interfaces: {e}"))?;
        let interfaces = if names.is_empty() {
            let found = routes
                .outer_interfaces()
                .map_err(|e| format!("cannot read the kernel's interfaces: {e}"))?;
            if found.is_empty() {
                return Err("no Ethernet interface with an address to attach to".into());
            }
            found
        } else {
            let mut found = Vec::new();
            for name in names {
                match routes.index_of(name) {
                    Ok(Some(index)) => found.push(Interface {
                        index,
                        name: name.clone(),
                    }),
                    Ok(None) => return Err(format!("no interface {name}")),
                    Err(e) => return Err(format!("{name}: {e}")),
                }
            }
            found
        };
        let port = udp.listen_port();
        let mut attached = Vec::new();
        for interface in interfaces {
            let name = interface.name.clone();
            let addresses = routes.addresses(interface.index).map_err(|e| format!("{name}: {e}"))?;
            let filter = Filter { port, addresses };
            let attachment = attach::attach(interface.index, &filter, MAX_SOCKETS, mode)
                .map_err(|e: Unavailable| format!("{name}: {e}"))?;
            let sockets = bind_sockets(&interface, &attachment).map_err(|e| format!("{name}: {e}"))?;
            let zero_copy = sockets.iter().all(|s| locked(s).zero_copy());
            attached.push(Attached {
                interface,
                attachment,
                sockets,
                zero_copy,
            });
        }
        let paths = Paths::start().map_err(|e| format!("cannot follow the kernel's routes: {e}"))?;
        Ok((attached, paths))
    }

    /// The mode of the program on the first interface (all share the kernel's rules).
    pub fn mode(&self) -> Mode {
        self.attached
            .first()
            .map(|a| a.attachment.mode)
            .unwrap_or(Mode::Generic)
    }
}

/// One socket per NIC queue of the interface, from queue 0, until the kernel says there is
/// no such queue or [`MAX_SOCKETS`]; each put in the program's map at its queue's index.
fn bind_sockets(interface: &Interface, attachment: &Attachment) -> io::Result<Vec<Arc<Mutex<XskQueue>>>> {
    let mut sockets = Vec::new();
    for queue in 0..MAX_SOCKETS {
        match XskQueue::bind(interface.index, queue) {
            Ok(mut s) => {
                s.split_batches(attachment.mode == Mode::Generic);
                attachment.sockets.set_socket(queue, s.as_raw_fd())?;
                sockets.push(Arc::new(Mutex::new(s)));
            }
            // Past the interface's last queue the kernel answers EINVAL.
            Err(_) if queue > 0 => break,
            Err(e) => return Err(io::Error::new(e.kind(), format!("no AF_XDP socket: {e}"))),
        }
    }
    Ok(sockets)
}

impl OuterPort for XdpPort {
    type Receive = XdpReceive;

    fn listen_port(&self) -> u16 {
        self.udp.listen_port()
    }

    /// Moves the kernel socket and the program to `port` (0: any free port); on failure the
    /// old port stays for both. Until the program hears of the new port, its datagrams pass
    /// to the kernel socket, already bound to it: none is lost in the change.
    fn rebind(&self, port: u16, fwmark: u32) -> io::Result<()> {
        self.udp.rebind(port, fwmark)?;
        let now = self.udp.listen_port();
        for a in &self.attached {
            // Not fatal: the kernel socket has the port, and the program passes it what it
            // does not take.
            if let Err(e) = a.attachment.set_port(now) {
                log::error!("{}: the XDP program keeps the old port: {e}", a.interface.name);
            }
        }
        Ok(())
    }

    /// Marks what goes through the kernel socket. Frames Ordo writes carry no mark: they
    /// meet no routing rule.
    fn set_fwmark(&self, mark: u32, old: u32) -> io::Result<()> {
        self.udp.set_fwmark(mark, old)
    }

    /// Wakes every thread waiting on the port (at shutdown).
    fn shutdown(&self) {
        self.udp.shutdown();
        let one = 1u64;
        // SAFETY: writes 8 bytes from a u64 to an eventfd this port owns.
        unsafe { libc::write(self.shutdown.as_raw_fd(), (&one as *const u64).cast(), 8) };
    }

    /// What `ordo show` says of the path: each interface, its mode, copy or zero-copy.
    fn describe(&self) -> String {
        let interfaces = self
            .attached
            .iter()
            .map(|a| {
                let mode = a.attachment.mode;
                let copy = if a.zero_copy { "zero-copy" } else { "copy" };
                let n = a.sockets.len();
                let sockets = if n == 1 { "socket" } else { "sockets" };
                format!("{} ({mode}, {copy}, {n} {sockets})", a.interface.name)
            })
            .collect::<Vec<_>>()
            .join(", ");
        format!("xdp on {interfaces}")
    }

    /// The kernel socket's halves, and a half per AF_XDP socket whose NIC queue belongs to
    /// `queue`.
    fn receivers(&self, queue: usize) -> Vec<XdpReceive> {
        let mut halves: Vec<XdpReceive> = self.udp.receivers(queue).into_iter().map(XdpReceive::Kernel).collect();
        for a in &self.attached {
            for (n, socket) in a.sockets.iter().enumerate() {
                if n % self.queues == queue % self.queues {
                    let fd = locked(socket).as_raw_fd();
                    halves.push(XdpReceive::Socket(SocketReceive {
                        socket: socket.clone(),
                        fd,
                        shutdown: self.shutdown.clone(),
                        malformed: self.counts.malformed.clone(),
                    }));
                }
            }
        }
        halves
    }

    fn send(&self, queue: usize, to: SocketAddr, payloads: &[&[u8]]) -> usize {
        let hop = self.paths.get(to.ip());
        let on = hop.and_then(|h| Some((h, self.attached.iter().find(|a| a.interface.index == h.ifindex)?)));
        // A datagram longer than the link's MTU goes through the kernel, which fragments it
        // (a frame Ordo wrote would be dropped on the link): an inner MTU set too high.
        let ip_udp = if to.is_ipv6() { 48 } else { 28 };
        let fits = |h: &Hop| payloads.iter().all(|p| p.len() + ip_udp <= h.mtu as usize);
        let on = on.filter(|(h, _)| fits(h));
        let Some((hop, attached)) = on else {
            let sent = self.udp.send(queue, to, payloads);
            self.counts.sent_kernel.fetch_add(sent as u64, Ordering::Relaxed);
            return sent;
        };
        let path = Path {
            from_mac: hop.from_mac,
            to_mac: hop.to_mac.expect("paths keeps resolved hops only"),
            from: SocketAddr::new(hop.source, self.udp.listen_port()),
            to,
        };
        let socket = &attached.sockets[queue % attached.sockets.len()];
        let sent = locked(socket).send(&path, payloads);
        self.counts.sent_xdp.fetch_add(sent as u64, Ordering::Relaxed);
        if sent < payloads.len() {
            self.counts
                .send_full
                .fetch_add((payloads.len() - sent) as u64, Ordering::Relaxed);
        }
        sent
    }

    fn steer(&self, exceptions: &[SteeringException]) {
        // The kernel socket's datagrams are few (what the program passes), but steering
        // them costs nothing more than it does without AF_XDP.
        self.udp.steer(exceptions)
    }

    fn counters(&self) -> Vec<Counter> {
        let mut c = self.udp.counters();
        c.push(Counter::level("xdp_native", u64::from(self.mode() == Mode::Native)));
        c.push(Counter::level(
            "xdp_zero_copy",
            u64::from(self.attached.iter().all(|a| a.zero_copy)),
        ));
        c.push(Counter::level(
            "xdp_sockets",
            self.attached.iter().map(|a| a.sockets.len() as u64).sum(),
        ));
        c.push(Counter::new("xdp_sent", self.counts.sent_xdp.load(Ordering::Relaxed)));
        c.push(Counter::new(
            "xdp_sent_by_kernel",
            self.counts.sent_kernel.load(Ordering::Relaxed),
        ));
        c.push(Counter::new(
            "drop_xdp_send_full",
            self.counts.send_full.load(Ordering::Relaxed),
        ));
        c.push(Counter::new(
            "drop_xdp_malformed",
            self.counts.malformed.load(Ordering::Relaxed),
        ));
        // Counted by the kernel before Ordo saw the frame, summed over the sockets.
        let mut kernel = super::queue::Statistics::default();
        for socket in self.attached.iter().flat_map(|a| &a.sockets) {
            if let Ok(s) = locked(socket).statistics() {
                kernel.rx_dropped += s.rx_dropped;
                kernel.rx_ring_full += s.rx_ring_full;
                kernel.rx_fill_ring_empty_descs += s.rx_fill_ring_empty_descs;
            }
        }
        c.push(Counter::new("drop_os_xsk_receive_ring_full", kernel.rx_ring_full));
        c.push(Counter::new(
            "drop_os_xsk_fill_ring_empty",
            kernel.rx_fill_ring_empty_descs,
        ));
        c.push(Counter::new("drop_os_xsk_other", kernel.rx_dropped));
        let mut verdicts = Vec::new();
        for a in &self.attached {
            for (i, (v, n)) in a.attachment.verdicts().into_iter().enumerate() {
                match verdicts.get_mut(i) {
                    Some((_, total)) => *total += n,
                    None => verdicts.push((v, n)),
                }
            }
        }
        c.extend(verdicts.into_iter().map(|(v, n)| Counter::new(v.name(), n)));
        c
    }
}

/// A receive half of the AF_XDP port: one of the kernel socket's, or one AF_XDP socket.
pub enum XdpReceive {
    Kernel(UdpReceive),
    Socket(SocketReceive),
}

pub struct SocketReceive {
    socket: Arc<Mutex<XskQueue>>,
    fd: RawFd,
    shutdown: Arc<OwnedFd>,
    malformed: Arc<AtomicU64>,
}

impl SocketReceive {
    fn receive(&mut self, out: &mut Vec<Datagram>) {
        let malformed = locked(&self.socket).recv(out);
        if malformed > 0 {
            self.malformed.fetch_add(malformed as u64, Ordering::Relaxed);
        }
    }
}

impl OuterReceive for XdpReceive {
    fn wait_fd(&mut self) -> Option<RawFd> {
        match self {
            XdpReceive::Kernel(k) => k.wait_fd(),
            XdpReceive::Socket(s) => Some(s.fd),
        }
    }

    fn recv(&mut self, out: &mut Vec<Datagram>) -> io::Result<usize> {
        match self {
            XdpReceive::Kernel(k) => k.recv(out),
            XdpReceive::Socket(s) => {
                s.receive(out);
                Ok(0)
            }
        }
    }

    fn recv_waiting(&mut self, out: &mut Vec<Datagram>) -> io::Result<usize> {
        match self {
            XdpReceive::Kernel(k) => k.recv_waiting(out),
            XdpReceive::Socket(s) => {
                let before = out.len();
                s.receive(out);
                if out.len() == before {
                    let mut fds = [
                        libc::pollfd {
                            fd: s.fd,
                            events: libc::POLLIN,
                            revents: 0,
                        },
                        libc::pollfd {
                            fd: s.shutdown.as_raw_fd(),
                            events: libc::POLLIN,
                            revents: 0,
                        },
                    ];
                    // SAFETY: two pollfds, as counted.
                    unsafe { libc::poll(fds.as_mut_ptr(), 2, RECEIVE_WAIT.as_millis() as i32) };
                    s.receive(out);
                }
                Ok(0)
            }
        }
    }
}
