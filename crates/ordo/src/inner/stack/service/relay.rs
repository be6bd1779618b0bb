//! Applications' TCP connections through the stack: connects, answered once established or
//! failed, and each connection's bytes relayed between the application's Unix socket and the
//! stack's TCP socket, one copy each way.

use super::attach::reply;
use super::fd::{errno_of, set_nonblocking};
use super::{to_std, State, MAX_CONNECTIONS};
use crate::inner::stack::readiness::{Ready, Watched, HANG_UP, READABLE};
use crate::inner::stack::unix::hung_up;
use ordo_attach::Filler;
use smoltcp::iface::SocketHandle;
use smoltcp::socket::tcp;
use smoltcp::wire::{IpAddress, IpEndpoint};
use std::io;
use std::net::SocketAddr;
use std::os::fd::{AsRawFd, OwnedFd, RawFd};
use std::os::unix::net::UnixStream;
use std::time::{Duration, Instant};

/// How long a new connection may take to be established (Linux gives up after about 127 s
/// of SYN retransmissions by default; applications usually time out sooner themselves).
const CONNECT_TIMEOUT: Duration = Duration::from_secs(60);

/// A non-blocking connect's stand-in, to be made writable once established.
pub(super) struct Unfill {
    /// Filler bytes still to discard from the application's end.
    pub(super) left: u32,
    /// A copy of the application's end, to give it back its send buffer.
    pub(super) app_end: OwnedFd,
    pub(super) sndbuf: u32,
}

/// A connection of an application through the stack.
pub(super) struct Connection {
    pub(super) handle: SocketHandle,
    /// The user whose program it is (a listener's, for a connection it accepted).
    pub(super) uid: u32,
    /// The service's end of the application's socket pair (non-blocking).
    pub(super) app: Watched<OwnedFd>,
    pub(super) local_port: u16,
    /// Until the connection is established or fails: where to send the answer, and until
    /// when at most.
    pub(super) waiting: Option<(Watched<UnixStream>, Instant)>,
    /// The application will send no more (it shut down writing or closed).
    pub(super) app_done_writing: bool,
    /// The application was told the peer will send no more.
    pub(super) told_app_eof: bool,
    /// For a non-blocking connect: what to undo once established.
    pub(super) unfill: Option<Unfill>,
}

/// One established connection's turn; false once it is over. The application's end is read
/// only if `ready` may find it readable.
fn relay_one(c: &mut Connection, s: &mut tcp::Socket, ready: &Ready) -> bool {
    let fd = c.app.as_raw_fd();
    if let Some(u) = &mut c.unfill {
        // A non-blocking connect, now established: drop the filler that kept the stand-in
        // unwritable, and give it its send buffer back; the application sees it writable.
        let mut scratch = [0u8; 4096];
        while u.left > 0 {
            let want = scratch.len().min(u.left as usize);
            // SAFETY: reading into `scratch`, at most its length.
            let n = unsafe { libc::read(fd, scratch.as_mut_ptr().cast(), want) };
            if n <= 0 {
                break;
            }
            u.left -= n as u32;
        }
        if u.left > 0 {
            return true;
        }
        let half = libc::c_int::try_from(u.sndbuf / 2).unwrap_or(libc::c_int::MAX);
        // SAFETY: an int option on our copy of the application's end. The kernel doubles
        // what is set, as it did for the value the library read.
        unsafe {
            libc::setsockopt(
                u.app_end.as_raw_fd(),
                libc::SOL_SOCKET,
                libc::SO_SNDBUF,
                (&half as *const libc::c_int).cast(),
                std::mem::size_of::<libc::c_int>() as libc::socklen_t,
            )
        };
        c.unfill = None;
    }
    // Application to peer: read straight into the send buffer, until a read comes short (the
    // end had no more then; more later makes it ready again).
    let readable = c.app.may_be(ready, READABLE);
    while readable && !c.app_done_writing && s.can_send() {
        let r = s.send(|buf| {
            // SAFETY: reading into smoltcp's free send space, `buf.len()` writable bytes.
            let n = unsafe { libc::read(fd, buf.as_mut_ptr().cast(), buf.len()) };
            (n.max(0) as usize, (n, n > 0 && (n as usize) < buf.len()))
        });
        match r {
            Ok((n, short)) if n > 0 => {
                if short {
                    break;
                }
                continue;
            }
            Ok((0, _)) => {
                c.app_done_writing = true;
                s.close();
            }
            Ok(_) => {
                let e = io::Error::last_os_error();
                if e.kind() != io::ErrorKind::WouldBlock && e.kind() != io::ErrorKind::Interrupted {
                    s.abort();
                    return false;
                }
            }
            Err(_) => {}
        }
        break;
    }
    // Peer to application: write straight from the receive buffer.
    while s.can_recv() {
        let r = s.recv(|buf| {
            // SAFETY: writing the received bytes smoltcp hands us.
            let n = unsafe { libc::send(fd, buf.as_ptr().cast(), buf.len(), libc::MSG_NOSIGNAL) };
            (n.max(0) as usize, n)
        });
        match r {
            Ok(n) if n > 0 => continue,
            Ok(_) => {
                let e = io::Error::last_os_error();
                if e.kind() != io::ErrorKind::WouldBlock && e.kind() != io::ErrorKind::Interrupted {
                    // The application closed its end: nobody will read what the peer sends.
                    s.abort();
                    return false;
                }
            }
            Err(_) => {}
        }
        break;
    }
    if !s.may_recv() && !s.can_recv() && !c.told_app_eof && s.state() != tcp::State::SynSent {
        // SAFETY: shutdown on our own descriptor.
        unsafe { libc::shutdown(fd, libc::SHUT_WR) };
        c.told_app_eof = true;
    }
    let over = matches!(s.state(), tcp::State::Closed | tcp::State::TimeWait) && !s.can_recv();
    !over
}

impl State {
    /// Starts a connection to `to` for `app`, answered on `control` once established or
    /// failed; with `stand_in`, a non-blocking connect's: what its stand-in was filled with,
    /// and a copy of the application's end ([`Unfill`]).
    pub(super) fn connect(
        &mut self,
        to: SocketAddr,
        app: OwnedFd,
        stand_in: Option<(Filler, OwnedFd)>,
        control: io::Result<UnixStream>,
        uid: u32,
    ) -> Result<(), i32> {
        if self.connections.len() >= MAX_CONNECTIONS {
            return Err(libc::EMFILE);
        }
        let control = control.map_err(|e| errno_of(&e))?;
        if !self.addresses.iter().any(|a| a.is_ipv4() == to.is_ipv4()) {
            return Err(libc::EADDRNOTAVAIL);
        }
        set_nonblocking(app.as_raw_fd()).map_err(|e| errno_of(&e))?;
        let local_port = self.take_port().ok_or(libc::EADDRNOTAVAIL)?;
        let mut socket = self.new_tcp_socket();
        let remote = IpEndpoint::new(IpAddress::from(to.ip()), to.port());
        if socket.connect(self.iface.context(), remote, local_port).is_err() {
            self.ports_in_use.remove(&local_port);
            return Err(libc::EINVAL);
        }
        let handle = self.sockets.add(socket);
        self.connections.push(Connection {
            handle,
            uid,
            app: self.watcher.watch(app),
            local_port,
            waiting: Some((self.watcher.watch(control), Instant::now() + CONNECT_TIMEOUT)),
            app_done_writing: false,
            told_app_eof: false,
            unfill: stand_in.map(|(filler, app_end)| Unfill {
                left: filler.filler,
                app_end,
                sndbuf: filler.sndbuf,
            }),
        });
        Ok(())
    }

    /// Moves bytes between each application and its TCP socket, answers connects that
    /// finished, and ends connections that are over.
    pub(super) fn relay(&mut self) {
        let now = Instant::now();
        let mut i = 0;
        while i < self.connections.len() {
            let c = &mut self.connections[i];
            let s = self.sockets.get_mut::<tcp::Socket>(c.handle);
            // Each asked only if the set may have found it hung up.
            let ready = &self.ready;
            let gone = |may_be: bool, fd: RawFd| may_be && hung_up(fd);
            let abandoned = (c.waiting.as_ref()).is_some_and(|(control, _)| {
                gone(c.app.may_be(ready, HANG_UP), c.app.as_raw_fd())
                    || gone(control.may_be(ready, HANG_UP), control.as_raw_fd())
            });
            if abandoned {
                // The program closed a socket still connecting, or ended (which closes the
                // request its answer would go to; the service keeps a copy of a
                // non-blocking connect's stand-in, so that end alone does not tell): the
                // attempt is abandoned, as the kernel abandons a closed socket's SYN_SENT.
                s.abort();
                self.end(i);
                continue;
            }
            let mut failed = false;
            if let Some((control, deadline)) = &c.waiting {
                let answer = match s.state() {
                    tcp::State::SynSent | tcp::State::SynReceived if now < *deadline => None,
                    tcp::State::SynSent | tcp::State::SynReceived => {
                        s.abort();
                        Some(libc::ETIMEDOUT)
                    }
                    tcp::State::Closed => Some(libc::ECONNREFUSED),
                    _ => Some(0),
                };
                if let Some(errno) = answer {
                    let local = s.local_endpoint().map(to_std);
                    let remote = s.remote_endpoint().map(to_std);
                    reply(control, errno, local, remote);
                    c.waiting = None;
                    failed = errno != 0;
                }
            }
            if failed {
                self.end(i);
                continue;
            }
            if c.waiting.is_none() && !relay_one(c, s, &self.ready) {
                self.end(i);
                continue;
            }
            i += 1;
        }
    }

    pub(super) fn end(&mut self, i: usize) {
        let c = self.connections.swap_remove(i);
        self.remove_tcp(c.handle);
        self.ports_in_use.remove(&c.local_port);
    }
}
