//! The outer port over kernel UDP sockets: one IPv4 and one IPv6 socket per queue on one port
//! ([`sockets`]), batched with recvmmsg and sendmmsg and UDP GSO/GRO (the `ordo-udp` crate,
//! which also reads the kernel's own drops from /proc); with more than one queue the sockets
//! form SO_REUSEPORT groups whose datagrams a classic BPF program steers by receiver index
//! ([`steer`]).

pub mod sockets;
pub mod steer;

use crate::port::{Counter, Datagram, OuterPort, OuterReceive, SteeringException, MAX_PACKET};
use sockets::Sockets;
use std::io;
use std::net::{SocketAddr, UdpSocket};
use std::os::fd::{AsRawFd, RawFd};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, RwLock, Weak};

/// Every queue's sockets; replaced whole when the listen port changes.
type Group = Arc<Vec<Sockets>>;

pub struct UdpPort {
    group: Arc<RwLock<Group>>,
    /// The steering exceptions attached last, and to which group (see [`OuterPort::steer`]).
    steered: Mutex<Steered>,
    /// Datagrams that could not be sent.
    send_errors: AtomicU64,
    /// UDP GRO turned off on every socket, present and future ([`UdpPort::disable_gro`]).
    no_gro: AtomicBool,
}

/// The exceptions a steering program was attached with, and the group it was attached to.
struct Steered {
    group: Weak<Vec<Sockets>>,
    exceptions: Vec<SteeringException>,
}

impl UdpPort {
    /// Binds `queues` socket pairs on `port` (0: any free port).
    pub fn bind(port: u16, fwmark: u32, queues: usize) -> io::Result<UdpPort> {
        let group = Arc::new(Sockets::bind_queues(port, fwmark, queues)?);
        Ok(UdpPort {
            group: Arc::new(RwLock::new(group)),
            steered: Mutex::new(Steered {
                group: Weak::new(),
                exceptions: Vec::new(),
            }),
            send_errors: AtomicU64::new(0),
            no_gro: AtomicBool::new(false),
        })
    }

    /// Has the kernel merge none of this port's datagrams (UDP GRO off), now and after a
    /// rebind. For the AF_XDP port: a merged datagram reaches an XDP program in generic mode
    /// as one frame that no header says is several.
    pub fn disable_gro(&self) -> io::Result<()> {
        self.no_gro.store(true, Ordering::Relaxed);
        Self::without_gro(&self.group())
    }

    fn without_gro(group: &[Sockets]) -> io::Result<()> {
        for s in group {
            let all = std::iter::once(&s.v4).chain(s.v6.as_ref());
            for socket in all {
                if !ordo_udp::disable_gro(socket) {
                    return Err(io::Error::last_os_error());
                }
            }
        }
        Ok(())
    }

    fn group(&self) -> Group {
        self.group.read().unwrap_or_else(|p| p.into_inner()).clone()
    }
}

impl OuterPort for UdpPort {
    type Receive = UdpReceive;

    fn listen_port(&self) -> u16 {
        self.group()[0].port
    }

    /// Binds the same queues on `port` (0: any free port) and puts them in place of the old
    /// ones, whose waiting threads wake and move to the new. On failure the old sockets stay.
    fn rebind(&self, port: u16, fwmark: u32) -> io::Result<()> {
        let current = self.group();
        if port == current[0].port && port != 0 {
            return Ok(());
        }
        let fresh = Arc::new(Sockets::bind_queues(port, fwmark, current.len())?);
        if self.no_gro.load(Ordering::Relaxed) {
            Self::without_gro(&fresh)?;
        }
        *self.group.write().unwrap_or_else(|p| p.into_inner()) = fresh;
        current.iter().for_each(Sockets::shutdown);
        Ok(())
    }

    /// Marks every socket with `mark`, or, if one cannot be, none: those marked already go
    /// back to `old`.
    fn set_fwmark(&self, mark: u32, old: u32) -> io::Result<()> {
        let group = self.group();
        for (i, s) in group.iter().enumerate() {
            if let Err(e) = s.set_fwmark(mark) {
                for done in &group[..=i] {
                    let _ = done.set_fwmark(old);
                }
                return Err(e);
            }
        }
        Ok(())
    }

    /// Wakes every thread waiting on the sockets (at shutdown).
    fn shutdown(&self) {
        self.group().iter().for_each(Sockets::shutdown);
    }

    fn describe(&self) -> String {
        "udp".into()
    }

    /// One half per address family the sockets have.
    fn receivers(&self, queue: usize) -> Vec<UdpReceive> {
        let group = self.group();
        let families = if group[0].v6.is_some() { 2 } else { 1 };
        (0..families)
            .map(|family| UdpReceive {
                shared: self.group.clone(),
                group: group.clone(),
                queue,
                v6: family == 1,
                receiver: ordo_udp::Receiver::new(MAX_PACKET),
            })
            .collect()
    }

    fn send(&self, queue: usize, to: SocketAddr, payloads: &[&[u8]]) -> usize {
        let group = self.group();
        let sockets = &group[queue % group.len()];
        let sent = sockets
            .socket_for(to)
            .and_then(|(s, to)| ordo_udp::send_batch(s, to, payloads, &sockets.gso))
            .unwrap_or(0);
        if sent < payloads.len() {
            self.send_errors
                .fetch_add((payloads.len() - sent) as u64, Ordering::Relaxed);
        }
        sent
    }

    /// Attaches a new steering program when the exceptions or the sockets changed since the
    /// last (new sockets start with none).
    fn steer(&self, exceptions: &[SteeringException]) {
        let group = self.group();
        if group.len() < 2 {
            return;
        }
        let mut steered = self.steered.lock().unwrap_or_else(|p| p.into_inner());
        if steered.group.upgrade().is_some_and(|g| Arc::ptr_eq(&g, &group)) && steered.exceptions == exceptions {
            return;
        }
        let queues = group.len() as u32;
        let attached = steer::attach(&group[0].v4, queues, exceptions).and_then(|()| match &group[0].v6 {
            Some(s) => steer::attach(s, queues, exceptions),
            None => Ok(()),
        });
        // On failure the rule still holds: moved peers' datagrams reach their new queue with
        // the move's handshake, as without exceptions. Not retried until the list changes.
        if let Err(e) = attached {
            log::warn!("steering exceptions not attached: {e}");
        }
        *steered = Steered {
            group: Arc::downgrade(&group),
            exceptions: exceptions.to_vec(),
        };
    }

    fn counters(&self) -> Vec<Counter> {
        let group = self.group();
        vec![
            Counter::new("drop_udp_send_error", self.send_errors.load(Ordering::Relaxed)),
            // Counted by the kernel before Ordo saw the datagram.
            Counter::new("drop_os_udp_receive_buffer", ordo_udp::udp_receive_drops(group[0].port)),
            Counter::level("queues", group.len() as u64),
            Counter::level("udp_gso", group[0].gso.enabled() as u64),
            Counter::level(
                "udp_gso_refused_destinations",
                group[0].gso.refused_destinations() as u64,
            ),
            Counter::level("udp_gro", (group[0].gro && !self.no_gro.load(Ordering::Relaxed)) as u64),
        ]
    }
}

/// One socket of one queue: its address family's. Follows the port to new sockets when the
/// listen port changes.
pub struct UdpReceive {
    shared: Arc<RwLock<Group>>,
    /// The sockets this half reads now.
    group: Group,
    queue: usize,
    v6: bool,
    receiver: ordo_udp::Receiver,
}

/// The socket of one family of `queue`'s sockets, if there is one.
fn socket_of(group: &[Sockets], queue: usize, v6: bool) -> Option<&UdpSocket> {
    let sockets = group.get(queue)?;
    if v6 {
        sockets.v6.as_ref()
    } else {
        Some(&sockets.v4)
    }
}

impl OuterReceive for UdpReceive {
    fn wait_fd(&mut self) -> Option<RawFd> {
        self.group = self.shared.read().unwrap_or_else(|p| p.into_inner()).clone();
        socket_of(&self.group, self.queue, self.v6).map(|s| s.as_raw_fd())
    }

    fn recv(&mut self, out: &mut Vec<Datagram>) -> io::Result<usize> {
        self.receive(out, false)
    }

    fn recv_waiting(&mut self, out: &mut Vec<Datagram>) -> io::Result<usize> {
        // Follows a rebind before it waits: the old sockets' shutdown ended the last wait.
        self.wait_fd();
        self.receive(out, true)
    }
}

impl UdpReceive {
    fn receive(&mut self, out: &mut Vec<Datagram>, wait: bool) -> io::Result<usize> {
        let from = out.len();
        let Some(socket) = socket_of(&self.group, self.queue, self.v6) else {
            return Ok(0);
        };
        let truncated = if wait {
            self.receiver.recv(socket, out)?
        } else {
            self.receiver.recv_ready(socket, out)?
        };
        for d in &mut out[from..] {
            d.src = canonical(d.src);
        }
        Ok(truncated)
    }
}

/// IPv4-mapped IPv6 sources become plain IPv4, so an endpoint has one spelling.
fn canonical(a: SocketAddr) -> SocketAddr {
    match a {
        SocketAddr::V6(v6) => match v6.ip().to_ipv4_mapped() {
            Some(v4) => SocketAddr::new(v4.into(), v6.port()),
            None => a,
        },
        v4 => v4,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    /// Through the port's own halves: sources arrive canonical, sends are counted, and a
    /// rebind moves a receive half to the new sockets at its next turn.
    #[test]
    fn the_port_receives_sends_and_follows_a_rebind() {
        let port = UdpPort::bind(0, 0, 1).unwrap();
        let mut halves = port.receivers(0);
        let first = port.listen_port();
        let peer = UdpSocket::bind("127.0.0.1:0").unwrap();
        peer.send_to(b"hello", ("127.0.0.1", first)).unwrap();
        let mut got = Vec::new();
        for _ in 0..200 {
            halves[0].wait_fd().expect("an IPv4 socket");
            halves[0].recv(&mut got).unwrap();
            if !got.is_empty() {
                break;
            }
            std::thread::sleep(Duration::from_millis(5));
        }
        assert_eq!(&got[0].data[..], b"hello");
        assert_eq!(got[0].src, peer.local_addr().unwrap());
        // IPv4 through the IPv6 socket's mapped form comes back as plain IPv4.
        let mapped: SocketAddr = format!("[::ffff:127.0.0.1]:{}", peer.local_addr().unwrap().port())
            .parse()
            .unwrap();
        assert_eq!(canonical(mapped), peer.local_addr().unwrap());
        assert_eq!(port.send(0, peer.local_addr().unwrap(), &[b"a", b"bc"]), 2);
        let mut buf = [0u8; 8];
        peer.set_read_timeout(Some(Duration::from_secs(2))).unwrap();
        assert_eq!(peer.recv(&mut buf).unwrap(), 1);
        // An IPv6 destination without an IPv6 socket... or a send that fails: counted.
        let unreachable: SocketAddr = "[2001:db8::1]:9".parse().unwrap();
        let before = port.send_errors.load(Ordering::Relaxed);
        if port.send(0, unreachable, &[b"x"]) == 0 {
            assert_eq!(port.send_errors.load(Ordering::Relaxed), before + 1);
        }
        port.rebind(0, 0).unwrap();
        let second = port.listen_port();
        assert_ne!(first, second);
        let fd = halves[0].wait_fd().unwrap();
        assert_eq!(fd, port.group()[0].v4.as_raw_fd(), "the half follows the new sockets");
        let counters = port.counters();
        assert!(counters.iter().any(|c| c.name == "queues" && c.value == 1));
    }

    /// A waiting receive returns with what arrives while it waits, empty after
    /// [`crate::port::RECEIVE_WAIT`] when nothing does, and at once when the port shuts down.
    #[test]
    fn a_waiting_receive_returns_on_arrival_on_timeout_and_on_shutdown() {
        use std::time::Instant;
        let port = Arc::new(UdpPort::bind(0, 0, 1).unwrap());
        let mut half = port.receivers(0).remove(0);
        let to = ("127.0.0.1", port.listen_port());
        let peer = UdpSocket::bind("127.0.0.1:0").unwrap();
        let mut got = Vec::new();
        let sender = std::thread::spawn(move || {
            std::thread::sleep(Duration::from_millis(200));
            peer.send_to(b"late", to).unwrap();
        });
        let t = Instant::now();
        half.recv_waiting(&mut got).unwrap();
        assert_eq!(got.len(), 1, "the datagram sent while it waited");
        assert!(
            t.elapsed() >= Duration::from_millis(150),
            "it waited: {:?}",
            t.elapsed()
        );
        sender.join().unwrap();

        let t = Instant::now();
        half.recv_waiting(&mut got).unwrap();
        let waited = t.elapsed();
        assert_eq!(got.len(), 1, "nothing more");
        assert!(
            waited >= crate::port::RECEIVE_WAIT / 2 && waited < 5 * crate::port::RECEIVE_WAIT,
            "{waited:?}"
        );

        let shut = port.clone();
        let closer = std::thread::spawn(move || {
            std::thread::sleep(Duration::from_millis(100));
            shut.shutdown();
        });
        let t = Instant::now();
        let _ = half.recv_waiting(&mut got);
        assert!(
            t.elapsed() < crate::port::RECEIVE_WAIT / 2,
            "woken by the shutdown: {:?}",
            t.elapsed()
        );
        closer.join().unwrap();
    }
}
