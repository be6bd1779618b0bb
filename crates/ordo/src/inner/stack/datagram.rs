//! An application's UDP socket through the stack: a smoltcp UDP socket bound to the stack's
//! addresses and a port of its own, and the service's end of a Unix seqpacket pair whose
//! other end the application holds. Each record on the pair is one datagram, each way.
//!
//! A socket connected at once (`ordo_attach::Op::ConnectUdp`) has one remote, and its records
//! are payloads alone; datagrams from anywhere else are not delivered (the kernel does the
//! same). An unconnected one (`ordo_attach::Op::BindUdp`) sends to and receives from anyone:
//! each record from the service starts with the datagram's source (`ordo_attach::Source`),
//! and an application's record that starts with the socket's marker carries a header
//! (`ordo_attach::SendHeader`): the datagram's destination, or a connect. A record without
//! it goes to the socket's remote once it has one, and is dropped and counted before.
//!
//! A server's socket bound to the unspecified address brings its kernel socket, bound to the
//! same port, which the flow relays too: what arrives there comes to the application with
//! its source, and `SendHeader::ToHost` leaves by it (the service sends as the application
//! would, through the application's own socket).
//!
//! UDP's promises are kept, no more: a datagram the stack cannot queue is dropped and
//! counted, never waited for; one larger than the tunnel can carry (the stack does not
//! fragment) is dropped and counted.

use super::readiness::{Ready, Watched, READABLE, WRITABLE};
use ordo_attach::{SendHeader, Source, MARKER_LEN};
use smoltcp::iface::SocketHandle;
use smoltcp::socket::udp;
use smoltcp::wire::{IpAddress, IpEndpoint, IpListenEndpoint};
use std::io;
use std::net::{SocketAddr, UdpSocket};
use std::os::fd::{AsRawFd, OwnedFd};
use std::sync::atomic::{AtomicU64, Ordering};

/// Datagrams each direction queues in the stack, and their bytes.
const QUEUE_DATAGRAMS: usize = 256;
const QUEUE_BYTES: usize = 256 * 1024;
/// The largest UDP payload (65,535 bytes of IPv4 less its headers); a record the application
/// sends is read whole, so that a longer one is seen as such and dropped.
const MAX_PAYLOAD: usize = 65_507;

/// Why datagrams were not carried, for the port's counters.
#[derive(Default)]
pub struct DatagramDrops {
    /// The application sent faster than the stack could queue.
    pub queue_full: AtomicU64,
    /// Larger than the tunnel's MTU allows.
    pub too_big: AtomicU64,
    /// Sent without a destination on a socket that has no remote, or to a family the stack
    /// has no address in.
    pub no_destination: AtomicU64,
    /// A record that starts with the socket's marker and is not a header.
    pub malformed: AtomicU64,
}

/// A UDP socket of an application.
pub struct Flow {
    pub handle: SocketHandle,
    /// The user whose program it is.
    pub uid: u32,
    /// The service's end of the application's seqpacket pair (non-blocking).
    pub app: Watched<OwnedFd>,
    pub local_port: u16,
    /// The only source delivered, and where a record without a header goes.
    pub remote: Option<Remote>,
    /// The families of the stack's datagrams delivered (an IPv4 socket takes no IPv6).
    pub takes: Families,
    /// A server's kernel socket bound to the same port (non-blocking).
    pub host: Option<Watched<UdpSocket>>,
    /// An unconnected socket's marker: its records carry addresses.
    pub marker: Option<[u8; MARKER_LEN]>,
    /// The tunnel's MTU: a datagram that does not fit in one packet is dropped.
    pub mtu: usize,
}

/// A connected UDP socket's remote: in the tunnel, or (a server's socket that has its kernel
/// one) on the host's networks.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Remote {
    Tunnel(IpEndpoint),
    Host(SocketAddr),
}

/// Which families' datagrams a socket takes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Families {
    V4,
    V6,
    Both,
}

impl Families {
    fn take(self, a: &IpAddress) -> bool {
        matches!(
            (self, a),
            (Families::Both, _) | (Families::V4, IpAddress::Ipv4(_)) | (Families::V6, IpAddress::Ipv6(_))
        )
    }
}

/// Datagrams read from a host socket in one turn, so that a flood on it does not hold up
/// the stack's other work.
const HOST_TURN: usize = 64;
/// Records read from an application in one turn, for the same reason.
const RECORDS_PER_TURN: usize = 256;

impl Flow {
    /// The largest payload the tunnel carries to `to` in one packet.
    fn max_payload(&self, to: &IpEndpoint) -> usize {
        let headers = match to.addr {
            IpAddress::Ipv4(_) => 20 + 8,
            IpAddress::Ipv6(_) => 40 + 8,
        };
        self.mtu.saturating_sub(headers)
    }
}

/// A UDP socket of the stack bound to `local` (an address of the stack's, or all of them).
pub fn new_socket(local: IpListenEndpoint) -> udp::Socket<'static> {
    let buffer = || {
        udp::PacketBuffer::new(
            vec![udp::PacketMetadata::EMPTY; QUEUE_DATAGRAMS],
            vec![0u8; QUEUE_BYTES],
        )
    };
    let mut socket = udp::Socket::new(buffer(), buffer());
    // Binding a port of ours on an address of ours cannot fail.
    let _ = socket.bind(local);
    socket
}

/// What the stack wants of a flow's application end now, as epoll events: to be
/// read when the stack can queue a datagram, written when the stack holds one for it.
pub fn wanted(s: &udp::Socket) -> u32 {
    let mut events = 0;
    if s.can_send() {
        events |= READABLE;
    }
    if s.can_recv() {
        events |= WRITABLE;
    }
    events
}

/// One flow's turn: the application's datagrams into the stack, the stack's to the
/// application. False once the application has closed its end (seen when the service reads
/// from it: a closed end is always readable, so the service's poll wakes for it). Only the
/// descriptors `ready` may find ready are read.
pub fn relay(f: &mut Flow, s: &mut udp::Socket, scratch: &mut [u8], drops: &DatagramDrops, ready: &Ready) -> bool {
    let fd = f.app.as_raw_fd();
    // Records that leave by the host's socket take no room in the stack: without a bound,
    // one application sending them without pause would hold the stack's turn, and the
    // plane's thread that runs it.
    let mut turn = 0;
    let readable = f.app.may_be(ready, READABLE);
    while readable && s.can_send() && turn < RECORDS_PER_TURN {
        turn += 1;
        // SAFETY: reading one record into `scratch`, at most its length; MSG_TRUNC makes the
        // call return the record's whole length, so that a longer one is seen.
        let n = unsafe {
            libc::recv(
                fd,
                scratch.as_mut_ptr().cast(),
                scratch.len().min(MAX_PAYLOAD + ordo_attach::SEND_HEADER_LEN + 1),
                libc::MSG_DONTWAIT | libc::MSG_TRUNC,
            )
        };
        if n < 0 {
            let e = io::Error::last_os_error();
            if e.kind() == io::ErrorKind::WouldBlock || e.kind() == io::ErrorKind::Interrupted {
                break;
            }
            return false;
        }
        let n = n as usize;
        // A zero-length record is an empty datagram, or the application's end closed.
        if n == 0 && super::unix::hung_up(fd) {
            return false;
        }
        if n > scratch.len() {
            drops.too_big.fetch_add(1, Ordering::Relaxed);
            continue;
        }
        let record = &scratch[..n];
        let header = f.marker.and_then(|m| SendHeader::decode(m, record));
        let body = &record[ordo_attach::SEND_HEADER_LEN.min(n)..];
        let (to, payload) = match header {
            None => match f.remote {
                Some(Remote::Tunnel(r)) => (r, record),
                Some(Remote::Host(a)) => {
                    to_host(f, a, record, drops);
                    continue;
                }
                None => {
                    drops.no_destination.fetch_add(1, Ordering::Relaxed);
                    continue;
                }
            },
            Some(Ok(SendHeader::To(a))) => (endpoint(a), body),
            Some(Ok(SendHeader::ToHost(a))) => {
                to_host(f, a, body, drops);
                continue;
            }
            Some(Ok(SendHeader::Connect(a))) => {
                f.remote = Some(Remote::Tunnel(endpoint(a)));
                continue;
            }
            Some(Ok(SendHeader::ConnectHost(a))) => {
                f.remote = f.host.is_some().then_some(Remote::Host(a));
                continue;
            }
            Some(Ok(SendHeader::Disconnect)) => {
                f.remote = None;
                continue;
            }
            Some(Err(_)) => {
                drops.malformed.fetch_add(1, Ordering::Relaxed);
                continue;
            }
        };
        if payload.len() > f.max_payload(&to) {
            drops.too_big.fetch_add(1, Ordering::Relaxed);
            continue;
        }
        match s.send_slice(payload, to) {
            Ok(()) => {}
            Err(udp::SendError::BufferFull) => {
                drops.queue_full.fetch_add(1, Ordering::Relaxed);
            }
            Err(udp::SendError::Unaddressable) => {
                drops.no_destination.fetch_add(1, Ordering::Relaxed);
            }
        }
    }
    while let Ok((payload, meta)) = s.peek() {
        let wanted = match f.remote {
            Some(r) => r == Remote::Tunnel(meta.endpoint),
            None => f.takes.take(&meta.endpoint.addr),
        };
        if !wanted {
            // Not from the socket's remote (a connected socket does not see it), or of a
            // family it does not take.
            let _ = s.recv();
            continue;
        }
        let source = Source(SocketAddr::new(meta.endpoint.addr.into(), meta.endpoint.port)).encode();
        let parts: &[&[u8]] = if f.marker.is_some() {
            &[&source, payload]
        } else {
            &[payload]
        };
        let n = send_record(fd, parts);
        if n < 0 {
            let e = io::Error::last_os_error();
            if e.kind() == io::ErrorKind::WouldBlock {
                // Kept in the stack's queue until the application reads; beyond that queue,
                // the stack drops what arrives, as a socket's full receive buffer does.
                break;
            }
            if e.kind() == io::ErrorKind::Interrupted {
                continue;
            }
            return false;
        }
        let _ = s.recv();
    }
    if let Some(host) = f.host.as_ref().filter(|h| h.may_be(ready, READABLE)) {
        for _ in 0..HOST_TURN {
            let Ok((n, from)) = host.recv_from(scratch) else { break };
            if f.remote.is_some_and(|r| r != Remote::Host(from)) {
                continue;
            }
            let source = Source(from).encode();
            // Read already, so not kept for later: an application that does not keep up
            // loses what it has no room for, as with a full receive buffer.
            if send_record(fd, &[&source, &scratch[..n]]) < 0 {
                drops.queue_full.fetch_add(1, Ordering::Relaxed);
            }
        }
    }
    true
}

/// A datagram of the application's to the host's networks, through its kernel socket.
fn to_host(f: &Flow, to: SocketAddr, payload: &[u8], drops: &DatagramDrops) {
    let sent = f.host.as_ref().map(|h| h.send_to(payload, to));
    match sent {
        Some(Ok(_)) => {}
        Some(Err(e)) if e.kind() == io::ErrorKind::WouldBlock => {
            drops.queue_full.fetch_add(1, Ordering::Relaxed);
        }
        // No kernel socket, or the kernel refused the destination (unreachable, wrong family).
        _ => {
            drops.no_destination.fetch_add(1, Ordering::Relaxed);
        }
    }
}

fn endpoint(a: SocketAddr) -> IpEndpoint {
    IpEndpoint::new(IpAddress::from(a.ip()), a.port())
}

/// Sends `parts` as one record without waiting; what sendmsg(2) returns.
fn send_record(fd: i32, parts: &[&[u8]]) -> isize {
    let mut iov: Vec<libc::iovec> = (parts.iter())
        .map(|p| libc::iovec {
            iov_base: p.as_ptr() as *mut libc::c_void,
            iov_len: p.len(),
        })
        .collect();
    // SAFETY: msghdr is plain data; all zeros is an empty message.
    let mut msg: libc::msghdr = unsafe { std::mem::zeroed() };
    msg.msg_iov = iov.as_mut_ptr();
    msg.msg_iovlen = iov.len();
    // SAFETY: `msg` points at `iov`, whose entries point at live slices, for the call.
    unsafe { libc::sendmsg(fd, &msg, libc::MSG_DONTWAIT | libc::MSG_NOSIGNAL) }
}
