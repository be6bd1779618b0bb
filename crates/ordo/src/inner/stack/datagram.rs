//! An application's connected UDP socket through the stack: a smoltcp UDP socket bound to
//! one of the stack's addresses and a port of its own, and the service's end of a Unix
//! seqpacket pair whose other end the application holds. Each record on the pair is one
//! datagram's payload, each way; the socket has one remote, as a connected UDP socket has,
//! and datagrams from anywhere else are not delivered (the kernel does the same).
//!
//! UDP's promises are kept, no more: a datagram the stack cannot queue is dropped and
//! counted, never waited for; one larger than the tunnel can carry (the stack does not
//! fragment) is dropped and counted.

use smoltcp::iface::SocketHandle;
use smoltcp::socket::udp;
use smoltcp::wire::{IpEndpoint, IpListenEndpoint};
use std::io;
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
}

/// A connected UDP socket of an application.
pub struct Flow {
    pub handle: SocketHandle,
    /// The service's end of the application's seqpacket pair (non-blocking).
    pub app: OwnedFd,
    pub local_port: u16,
    pub remote: IpEndpoint,
    /// The largest payload the tunnel carries to `remote` in one packet.
    pub max_payload: usize,
}

/// A UDP socket of the stack bound to `local`.
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

/// What the application wants from its flow's socket, as poll(2) events on its end: to be
/// read when the stack can queue a datagram, written when the stack holds one for it.
pub fn wanted(s: &udp::Socket) -> i16 {
    let mut events = 0;
    if s.can_send() {
        events |= libc::POLLIN;
    }
    if s.can_recv() {
        events |= libc::POLLOUT;
    }
    events
}

/// One flow's turn: the application's datagrams into the stack, the stack's to the
/// application. False once the application has closed its end (seen when the service reads
/// from it: a closed end is always readable, so the service's poll wakes for it).
pub fn relay(f: &Flow, s: &mut udp::Socket, scratch: &mut [u8], drops: &DatagramDrops) -> bool {
    let fd = f.app.as_raw_fd();
    while s.can_send() {
        // SAFETY: reading one record into `scratch`, at most its length; MSG_TRUNC makes the
        // call return the record's whole length, so that a longer one is seen.
        let n = unsafe {
            libc::recv(
                fd,
                scratch.as_mut_ptr().cast(),
                scratch.len().min(MAX_PAYLOAD + 1),
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
        if n > f.max_payload {
            drops.too_big.fetch_add(1, Ordering::Relaxed);
            continue;
        }
        if s.send_slice(&scratch[..n], f.remote).is_err() {
            drops.queue_full.fetch_add(1, Ordering::Relaxed);
        }
    }
    while let Ok((payload, meta)) = s.peek() {
        if meta.endpoint != f.remote {
            // Not from the socket's remote: a connected socket does not see it.
            let _ = s.recv();
            continue;
        }
        // SAFETY: sending the bytes smoltcp holds, as one record.
        let n = unsafe {
            libc::send(
                fd,
                payload.as_ptr().cast(),
                payload.len(),
                libc::MSG_DONTWAIT | libc::MSG_NOSIGNAL,
            )
        };
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
    true
}
