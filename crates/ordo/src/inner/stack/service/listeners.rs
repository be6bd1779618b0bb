//! Applications' listening sockets in the stack: the stack's sockets that listen for each,
//! and the connections they accept (and a wildcard listener's kernel socket's), handed to the
//! application over its listener's seqpacket pair.

use super::fd::{errno_of, set_nonblocking, stream_pair, writable};
use super::relay::Connection;
use super::{to_std, State, MAX_CONNECTIONS};
use crate::inner::stack::readiness::{Watched, HANG_UP, READABLE};
use crate::inner::stack::unix::peer_closed;
use ordo_attach::rights::Rights;
use smoltcp::iface::SocketHandle;
use smoltcp::socket::tcp;
use smoltcp::wire::{IpAddress, IpEndpoint};
use std::io;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr, TcpListener};
use std::os::fd::{AsRawFd, OwnedFd, RawFd};

/// Listening sockets the stack keeps ready per listener (a smoltcp socket listens until a
/// connection arrives and then is that connection): the backlog of SYNs answered at once.
const LISTEN_BACKLOG: usize = 8;

/// An application's listening socket in the stack.
pub(super) struct Listener {
    /// One of the stack's addresses, or the unspecified address of a family: all of the
    /// stack's addresses the listener [`takes`].
    pub(super) local: SocketAddr,
    /// On `::`: IPv6 connections only.
    v6_only: bool,
    /// The service's end of the application's listening socket (a Unix seqpacket pair):
    /// each accepted connection is sent over it with its descriptor.
    pub(super) app: Watched<OwnedFd>,
    /// The stack's sockets listening for it, [`LISTEN_BACKLOG`] on each address it takes.
    pub(super) ready: Vec<ListeningSocket>,
    /// On the unspecified address: the application's kernel socket listening on the same
    /// port, whose connections are handed over as they are.
    pub(super) kernel: Option<Watched<TcpListener>>,
    /// The application's end had no room for the last kernel connection: wait until it has,
    /// leaving the kernel's connections in the kernel's backlog meanwhile.
    pub(super) app_full: bool,
    /// ... nor for one of the stack's, which waits established meanwhile.
    pub(super) stack_waiting: bool,
    /// A kernel connection accepted when the application's end had no room, for it next.
    pub(super) held: Option<std::net::TcpStream>,
    /// The user whose program listens.
    pub(super) uid: u32,
}

/// A socket of the stack listening on one address for a [`Listener`].
pub(super) struct ListeningSocket {
    pub(super) addr: IpAddr,
    pub(super) handle: SocketHandle,
}

/// Whether a listener on `local` (`v6_only` on `::`) takes connections to `ip`.
pub(super) fn takes(local: SocketAddr, v6_only: bool, ip: IpAddr) -> bool {
    match local.ip() {
        IpAddr::V4(a) if a.is_unspecified() => ip.is_ipv4(),
        IpAddr::V6(a) if a.is_unspecified() => ip.is_ipv6() || !v6_only,
        a => a == ip,
    }
}

/// Whether a listener on `a` (`a_v6_only` on `::`) and a new one on `b` would take
/// connections to the same address and port (the second bind fails with EADDRINUSE, as the
/// kernel's does).
fn overlaps(a: SocketAddr, a_v6_only: bool, b: SocketAddr, b_v6_only: bool) -> bool {
    if a.port() != b.port() {
        return false;
    }
    let probes: [IpAddr; 2] = [Ipv4Addr::UNSPECIFIED.into(), Ipv6Addr::UNSPECIFIED.into()];
    match (a.ip().is_unspecified(), b.ip().is_unspecified()) {
        (false, false) => a.ip() == b.ip(),
        (false, true) => takes(b, b_v6_only, a.ip()),
        (true, false) => takes(a, a_v6_only, b.ip()),
        // Two wildcards: a family both take (the unspecified addresses stand for theirs).
        (true, true) => probes
            .iter()
            .any(|p| takes(a, a_v6_only, *p) && takes(b, b_v6_only, *p)),
    }
}

/// Sends an accepted connection and its descriptor over a listener's pair, without waiting.
fn send_accepted(fd: RawFd, a: &ordo_attach::Accepted, pass: RawFd) -> io::Result<()> {
    let bytes = a.encode();
    let mut iov = libc::iovec {
        iov_base: bytes.as_ptr() as *mut libc::c_void,
        iov_len: bytes.len(),
    };
    let mut rights = Rights::default();
    let msg = rights.send_header(&mut iov, &[pass]);
    // SAFETY: `msg` points into `rights` and `iov`, alive for the call.
    let n = unsafe { libc::sendmsg(fd, &msg, libc::MSG_DONTWAIT | libc::MSG_NOSIGNAL) };
    if n != bytes.len() as isize {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

/// A listener's connections to its kernel socket, to its application as they are (kernel
/// sockets: the service relays nothing for them), while its end has room for them. One
/// accepted when it had none is held until it has (and the rest wait in the kernel's
/// backlog); room is looked at only once there is a connection to hand over, so an idle
/// listener costs the service's turn one accept.
fn hand_over_kernel_connections(l: &mut Listener) {
    let Some(kernel) = &l.kernel else { return };
    loop {
        let Some(conn) = l.held.take().or_else(|| kernel.accept().ok().map(|(c, _)| c)) else {
            l.app_full = false;
            return;
        };
        if !writable(l.app.as_raw_fd()) {
            l.held = Some(conn);
            l.app_full = true;
            return;
        }
        let (Ok(local), Ok(remote)) = (conn.local_addr(), conn.peer_addr()) else {
            continue;
        };
        let accepted = ordo_attach::Accepted {
            local,
            remote,
            kernel: true,
        };
        // Room was checked just above; should the send fail anyway, the connection is
        // closed (its client sees it reset) rather than kept without bound.
        let _ = send_accepted(l.app.as_raw_fd(), &accepted, conn.as_raw_fd());
    }
}

impl State {
    /// Starts listening on `local` (port 0: one of the stack's free ports) for `app`, and,
    /// with `kernel`, handing over that socket's connections too.
    pub(super) fn listen(
        &mut self,
        mut local: SocketAddr,
        v6_only: bool,
        app: OwnedFd,
        kernel: Option<TcpListener>,
        uid: u32,
    ) -> Result<SocketAddr, i32> {
        let wildcard = local.ip().is_unspecified();
        if !wildcard && !self.addresses.contains(&local.ip()) {
            return Err(libc::EADDRNOTAVAIL);
        }
        if self.listeners.len() >= MAX_CONNECTIONS {
            return Err(libc::EMFILE);
        }
        set_nonblocking(app.as_raw_fd()).map_err(|e| errno_of(&e))?;
        if local.port() == 0 {
            local.set_port(self.take_port().ok_or(libc::EADDRNOTAVAIL)?);
        } else {
            if self
                .listeners
                .iter()
                .any(|l| overlaps(l.local, l.v6_only, local, v6_only))
            {
                return Err(libc::EADDRINUSE);
            }
            // A port already listened on (on other addresses) is the listeners' already; any
            // other in use is a connection's.
            let shared = self.listeners.iter().any(|l| l.local.port() == local.port());
            if !shared && !self.ports_in_use.insert(local.port()) {
                return Err(libc::EADDRINUSE);
            }
        }
        // The kernel's socket is the program's open file until the program's descriptor is
        // swapped (after this answer): made non-blocking only once the answer is yes, so
        // that a refusal leaves the program's socket as it was.
        if let Some(Err(e)) = kernel.as_ref().map(|k| k.set_nonblocking(true)) {
            if !self.listeners.iter().any(|l| l.local.port() == local.port()) {
                self.ports_in_use.remove(&local.port());
            }
            return Err(errno_of(&e));
        }
        let mut l = Listener {
            local,
            v6_only,
            app: self.watcher.watch(app),
            ready: Vec::new(),
            kernel: kernel.map(|k| self.watcher.watch(k)),
            app_full: false,
            stack_waiting: false,
            held: None,
            uid,
        };
        let addresses: Vec<IpAddr> = (self.addresses.iter().copied())
            .filter(|a| takes(local, v6_only, *a))
            .collect();
        for addr in addresses {
            for _ in 0..LISTEN_BACKLOG {
                let handle = self.listening_socket(addr, local.port());
                l.ready.push(ListeningSocket { addr, handle });
            }
        }
        self.listeners.push(l);
        Ok(local)
    }

    fn listening_socket(&mut self, addr: IpAddr, port: u16) -> SocketHandle {
        let mut socket = self.new_tcp_socket();
        // Listening on an address of ours and a port of ours cannot fail.
        let _ = socket.listen(IpEndpoint::new(IpAddress::from(addr), port));
        self.sockets.add(socket)
    }

    /// Hands each listener's newly established connections to its application, the
    /// kernel's too; ends the listeners whose application closed them.
    pub(super) fn accept_connections(&mut self) {
        let mut i = 0;
        while i < self.listeners.len() {
            let l = &self.listeners[i];
            if l.app.may_be(&self.ready, HANG_UP) && peer_closed(l.app.as_raw_fd()) {
                let l = self.listeners.swap_remove(i);
                for r in l.ready {
                    // Connections established but never accepted: reset, as the kernel does
                    // when a listening socket with a backlog is closed. The RST leaves with
                    // the stack's next poll, before which nothing reuses the handle.
                    let s = self.sockets.get_mut::<tcp::Socket>(r.handle);
                    if s.state() == tcp::State::Listen {
                        self.remove_tcp(r.handle);
                    } else {
                        s.abort();
                        self.closing.push(r.handle);
                    }
                }
                if !self.listeners.iter().any(|o| o.local.port() == l.local.port()) {
                    self.ports_in_use.remove(&l.local.port());
                }
                continue;
            }
            self.accept_from_stack(i);
            let l = &mut self.listeners[i];
            if l.held.is_some() || l.kernel.as_ref().is_some_and(|k| k.may_be(&self.ready, READABLE)) {
                hand_over_kernel_connections(l);
            }
            i += 1;
        }
    }

    /// The stack's established connections of listener `i`, to its application.
    fn accept_from_stack(&mut self, i: usize) {
        let mut k = 0;
        self.listeners[i].stack_waiting = false;
        // At the bound, established connections wait in the backlog (and further SYNs find
        // no listening socket) until others end.
        while k < self.listeners[i].ready.len() && self.connections.len() < MAX_CONNECTIONS {
            let ListeningSocket { addr, handle: h } = self.listeners[i].ready[k];
            let port = self.listeners[i].local.port();
            let s = self.sockets.get_mut::<tcp::Socket>(h);
            match s.state() {
                tcp::State::Listen | tcp::State::SynReceived => {
                    k += 1;
                    continue;
                }
                tcp::State::Closed => {
                    // Reset before it was established: listen again.
                    let _ = s.listen(IpEndpoint::new(IpAddress::from(addr), port));
                    k += 1;
                    continue;
                }
                _ => {}
            }
            let (Some(local), Some(remote)) = (s.local_endpoint(), s.remote_endpoint()) else {
                k += 1;
                continue;
            };
            let accepted = ordo_attach::Accepted {
                local: to_std(local),
                remote: to_std(remote),
                kernel: false,
            };
            let Ok((ours, theirs)) = stream_pair() else {
                k += 1;
                continue;
            };
            if send_accepted(self.listeners[i].app.as_raw_fd(), &accepted, theirs.as_raw_fd()).is_err() {
                // The application's queue is full: it gets the connection when it has
                // accepted others (its end writable again wakes the stack).
                self.listeners[i].stack_waiting = true;
                k += 1;
                continue;
            }
            drop(theirs);
            let fresh = self.listening_socket(addr, port);
            self.listeners[i].ready[k].handle = fresh;
            let uid = self.listeners[i].uid;
            self.connections.push(Connection {
                handle: h,
                uid,
                app: self.watcher.watch(ours),
                // The listener's port stays taken while it listens.
                local_port: 0,
                waiting: None,
                app_done_writing: false,
                told_app_eof: false,
                unfill: None,
            });
            k += 1;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at(s: &str) -> SocketAddr {
        s.parse().unwrap()
    }

    #[test]
    fn a_listener_takes_its_address_or_its_wildcards_family() {
        let (v4, v6): (IpAddr, IpAddr) = ("10.0.0.2".parse().unwrap(), "fd00::2".parse().unwrap());
        assert!(takes(at("10.0.0.2:80"), false, v4));
        assert!(!takes(at("10.0.0.3:80"), false, v4));
        assert!(takes(at("0.0.0.0:80"), false, v4) && !takes(at("0.0.0.0:80"), false, v6));
        assert!(takes(at("[::]:80"), false, v4) && takes(at("[::]:80"), false, v6));
        assert!(!takes(at("[::]:80"), true, v4) && takes(at("[::]:80"), true, v6));
    }

    #[test]
    fn listeners_overlap_as_the_kernels_binds_do() {
        assert!(!overlaps(at("10.0.0.2:80"), false, at("10.0.0.2:81"), false));
        assert!(overlaps(at("10.0.0.2:80"), false, at("10.0.0.2:80"), false));
        assert!(!overlaps(at("10.0.0.2:80"), false, at("10.0.0.3:80"), false));
        assert!(overlaps(at("10.0.0.2:80"), false, at("0.0.0.0:80"), false));
        assert!(overlaps(at("0.0.0.0:80"), false, at("10.0.0.2:80"), false));
        assert!(overlaps(at("0.0.0.0:80"), false, at("[::]:80"), false));
        // IPv6 only on `::` leaves IPv4's wildcard free.
        assert!(!overlaps(at("0.0.0.0:80"), false, at("[::]:80"), true));
        assert!(!overlaps(at("[::]:80"), true, at("10.0.0.2:80"), false));
        assert!(overlaps(at("[::]:80"), true, at("[::]:80"), false));
    }
}
