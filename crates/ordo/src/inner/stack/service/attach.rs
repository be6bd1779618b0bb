//! The attach server: applications' requests on the attach socket (`ordo_attach`), each read
//! whole within [`REQUEST_DEADLINE`] from a user the admission lets attach, checked (the
//! descriptors that come with it must be what the request needs), held to its user's share,
//! and served by the part of the service it asks for.

use super::fd::{is_unix, is_unix_stream, recv_with_fds, socket_int};
use super::{State, MAX_CONNECTIONS};
use crate::inner::stack::admission::Decision;
use crate::inner::stack::readiness::{Watched, READABLE};
use ordo_attach::{Op, Reply, Request, REQUEST_LEN};
use std::io;
use std::net::{SocketAddr, TcpListener, UdpSocket};
use std::os::fd::{AsRawFd, OwnedFd};
use std::os::unix::net::UnixStream;
use std::time::{Duration, Instant};

/// How long an application may take to send its whole request.
pub(super) const REQUEST_DEADLINE: Duration = Duration::from_secs(5);

/// Requests being read at once; more wait in the listen backlog.
pub(super) const MAX_PENDING_REQUESTS: usize = 64;

/// Connections to the attach socket taken at one turn, refused ones included: a flood of
/// refused users cannot keep the turn (and the plane's thread) accepting.
const MAX_ACCEPTS_PER_TURN: usize = 64;

/// How often a request waiting for its user's admission looks again.
pub(super) const ADMISSION_POLL: Duration = Duration::from_millis(10);

/// A guest user's connections, listeners and UDP sockets at most.
pub(super) const GUEST_SHARE: usize = MAX_CONNECTIONS / 4;

/// What the guests together leave to the owner (and root).
pub(super) const OWNER_RESERVE: usize = MAX_CONNECTIONS / 4;

/// Ports below this are the owner's and root's (the kernel's ip_unprivileged_port_start).
const PRIVILEGED_PORTS: u16 = 1024;

/// A request being read: the bytes so far and the descriptors that came with them (at most
/// two are kept).
pub(super) struct PendingRequest {
    pub(super) control: Watched<UnixStream>,
    pub(super) bytes: Vec<u8>,
    pub(super) passed: Vec<OwnedFd>,
    pub(super) deadline: Instant,
    /// The user at the other end (SO_PEERCRED).
    pub(super) uid: u32,
    /// Whether it may attach; false while its user is being looked up.
    pub(super) admitted: bool,
}

/// The user at the other end of `control` (SO_PEERCRED).
fn peer_uid(control: &UnixStream) -> Option<u32> {
    let mut cred = libc::ucred {
        pid: 0,
        uid: u32::MAX,
        gid: 0,
    };
    let mut len = std::mem::size_of::<libc::ucred>() as libc::socklen_t;
    // SAFETY: `cred` and `len` are a valid buffer for SO_PEERCRED.
    let r = unsafe {
        libc::getsockopt(
            control.as_raw_fd(),
            libc::SOL_SOCKET,
            libc::SO_PEERCRED,
            (&mut cred as *mut libc::ucred).cast(),
            &mut len,
        )
    };
    (r == 0).then_some(cred.uid)
}

/// The descriptors of a listen or a UDP bind: the service's end of a seqpacket pair, and
/// maybe the program's kernel socket on the same port.
struct Passed<K> {
    pub(super) app: OwnedFd,
    pub(super) kernel: Option<K>,
}

/// [`Passed`] from what came with a request, the kernel socket checked by `kernel` (None:
/// not what it must be); None if they are not that: the request is refused.
fn seqpacket_and_kernel<K>(passed: Vec<OwnedFd>, kernel: impl FnOnce(OwnedFd) -> Option<K>) -> Option<Passed<K>> {
    let mut passed = passed.into_iter();
    let app = passed
        .next()
        .filter(|fd| is_unix(fd.as_raw_fd(), libc::SOCK_SEQPACKET))?;
    let kernel = match passed.next() {
        None => None,
        Some(fd) => Some(kernel(fd)?),
    };
    Some(Passed { app, kernel })
}

/// The application's kernel socket passed with a UDP bind to `addr` (the unspecified address
/// and a port): a UDP socket bound to that port, or None (the request is refused).
fn host_datagram_socket(fd: OwnedFd, addr: SocketAddr) -> Option<UdpSocket> {
    let udp = socket_int(fd.as_raw_fd(), libc::SO_PROTOCOL) == Some(libc::IPPROTO_UDP)
        && matches!(
            socket_int(fd.as_raw_fd(), libc::SO_DOMAIN),
            Some(libc::AF_INET | libc::AF_INET6)
        );
    if !udp || !addr.ip().is_unspecified() || addr.port() == 0 {
        return None;
    }
    let socket = UdpSocket::from(fd);
    (socket.local_addr().ok()?.port() == addr.port()).then_some(socket)
}

/// The application's kernel socket passed with a listen on `addr` (the unspecified address
/// and a port): a TCP socket listening on that port, or None (the request is refused).
fn kernel_listener(fd: OwnedFd, addr: SocketAddr) -> Option<TcpListener> {
    let int = |opt| socket_int(fd.as_raw_fd(), opt);
    let tcp = int(libc::SO_PROTOCOL) == Some(libc::IPPROTO_TCP)
        && matches!(int(libc::SO_DOMAIN), Some(libc::AF_INET | libc::AF_INET6))
        && int(libc::SO_ACCEPTCONN) == Some(1);
    if !tcp || !addr.ip().is_unspecified() {
        return None;
    }
    let listener = TcpListener::from(fd);
    (listener.local_addr().ok()?.port() == addr.port()).then_some(listener)
}

pub(super) fn reply(control: &UnixStream, errno: i32, local: Option<SocketAddr>, remote: Option<SocketAddr>) {
    let r = Reply {
        errno,
        local,
        remote,
        marker: None,
    };
    send_reply(control, r);
}

fn send_reply(control: &UnixStream, r: Reply) {
    use std::io::Write;
    let bytes = r.encode();
    // The control socket is non-blocking and the reply is far smaller than its buffer; an
    // application that went away simply misses it.
    let _ = (&*control).write_all(&bytes);
}

impl State {
    /// Takes new applications' connections to the attach socket.
    pub(super) fn accept(&mut self) {
        if !self.listener.may_be(&self.ready, READABLE) {
            return;
        }
        let mut taken = 0;
        while self.pending.len() < MAX_PENDING_REQUESTS && taken < MAX_ACCEPTS_PER_TURN {
            let control = match self.listener.accept() {
                Ok((c, _)) => c,
                Err(_) => return,
            };
            taken += 1;
            let uid = peer_uid(&control);
            let decision = uid.map_or(Decision::Refused, |u| self.admission.decide(u));
            if decision == Decision::Refused {
                // Told why, so that the program's call fails with "permission denied"
                // rather than an unexplained end of the conversation.
                let _ = control.set_nonblocking(true);
                reply(&control, libc::EACCES, None, None);
                continue;
            }
            if control.set_nonblocking(true).is_err() {
                continue;
            }
            self.pending.push(PendingRequest {
                control: self.watcher.watch(control),
                bytes: Vec::with_capacity(REQUEST_LEN),
                passed: Vec::new(),
                deadline: Instant::now() + REQUEST_DEADLINE,
                uid: uid.unwrap_or(u32::MAX),
                admitted: decision == Decision::Admitted,
            });
        }
    }

    /// Reads what pending requests sent; a complete one is served, a bad or late one dropped
    /// (the application sees its request closed and fails its call).
    pub(super) fn read_requests(&mut self) {
        let now = Instant::now();
        let mut i = 0;
        while i < self.pending.len() {
            let p = &mut self.pending[i];
            let done = if !p.control.may_be(&self.ready, READABLE) {
                now >= p.deadline
            } else {
                match recv_with_fds(p.control.as_raw_fd(), REQUEST_LEN - p.bytes.len()) {
                    Ok((bytes, fds)) => {
                        let closed = bytes.is_empty() && fds.is_empty();
                        p.bytes.extend_from_slice(&bytes);
                        // Descriptors beyond two are closed: the request is refused below if
                        // those kept are not what it needs.
                        let room = 2usize.saturating_sub(p.passed.len());
                        p.passed.extend(fds.into_iter().take(room));
                        closed || p.bytes.len() == REQUEST_LEN
                    }
                    Err(e) if e.kind() == io::ErrorKind::WouldBlock => now >= p.deadline,
                    Err(_) => true,
                }
            };
            if !p.admitted {
                match self.admission.decide(p.uid) {
                    Decision::Admitted => p.admitted = true,
                    // Its user is still being looked up: it waits, until its deadline.
                    Decision::Pending if now < p.deadline => {
                        i += 1;
                        continue;
                    }
                    Decision::Pending | Decision::Refused => {
                        let p = self.pending.swap_remove(i);
                        reply(&p.control, libc::EACCES, None, None);
                        continue;
                    }
                }
            }
            if !done {
                i += 1;
                continue;
            }
            let p = self.pending.swap_remove(i);
            if p.bytes.len() == REQUEST_LEN {
                self.serve(p);
            }
        }
    }

    fn serve(&mut self, p: PendingRequest) {
        let request = match Request::decode(&p.bytes) {
            Ok(r) => r,
            Err(_) => return reply(&p.control, libc::EPROTO, None, None),
        };
        if let Err(errno) = self.within_share(p.uid, &request) {
            return reply(&p.control, errno, None, None);
        }
        match request.op {
            Op::ConnectTcp => {
                let needed = if request.nonblocking.is_some() { 2 } else { 1 };
                if p.passed.len() != needed || !p.passed.iter().all(|fd| is_unix_stream(fd.as_raw_fd())) {
                    return reply(&p.control, libc::EPROTO, None, None);
                }
                let mut passed = p.passed.into_iter();
                let app = passed.next().expect("checked above");
                let stand_in = request
                    .nonblocking
                    .map(|filler| (filler, passed.next().expect("checked above")));
                if let Err(errno) = self.connect(request.addr, app, stand_in, p.control.try_clone(), p.uid) {
                    reply(&p.control, errno, None, None);
                }
            }
            Op::ConnectUdp => {
                let app = match <[OwnedFd; 1]>::try_from(p.passed) {
                    Ok([fd]) if is_unix(fd.as_raw_fd(), libc::SOCK_SEQPACKET) => fd,
                    _ => return reply(&p.control, libc::EPROTO, None, None),
                };
                match self.connect_datagram(request.addr, app, p.uid) {
                    Ok(local) => reply(&p.control, 0, Some(local), Some(request.addr)),
                    Err(errno) => reply(&p.control, errno, None, None),
                }
            }
            Op::BindUdp => {
                let Some(Passed { app, kernel: host }) =
                    seqpacket_and_kernel(p.passed, |fd| host_datagram_socket(fd, request.addr))
                else {
                    return reply(&p.control, libc::EPROTO, None, None);
                };
                match self.bind_datagram(request.addr, request.v6_only, app, host, p.uid) {
                    Ok((local, marker)) => send_reply(
                        &p.control,
                        Reply {
                            errno: 0,
                            local: Some(local),
                            remote: None,
                            marker: Some(marker),
                        },
                    ),
                    Err(errno) => reply(&p.control, errno, None, None),
                }
            }
            Op::ListenTcp => {
                let Some(Passed { app, kernel }) =
                    seqpacket_and_kernel(p.passed, |fd| kernel_listener(fd, request.addr))
                else {
                    return reply(&p.control, libc::EPROTO, None, None);
                };
                match self.listen(request.addr, request.v6_only, app, kernel, p.uid) {
                    Ok(local) => reply(&p.control, 0, Some(local), None),
                    Err(errno) => reply(&p.control, errno, None, None),
                }
            }
        }
    }

    /// Whether `uid` may have what `request` asks for: a guest, a port below 1024 only as
    /// its own end of a connection (never bound, nor listened on), and its share of the
    /// connections, within what the guests together may have.
    fn within_share(&self, uid: u32, request: &Request) -> Result<(), i32> {
        if !self.admission.is_guest(uid) {
            return Ok(());
        }
        let binds = matches!(request.op, Op::ListenTcp | Op::BindUdp);
        if binds && request.addr.port() != 0 && request.addr.port() < PRIVILEGED_PORTS {
            return Err(libc::EACCES);
        }
        let owners = (self.connections.iter().map(|c| c.uid))
            .chain(self.listeners.iter().map(|l| l.uid))
            .chain(self.flows.iter().map(|f| f.uid));
        let (mut mine, mut guests) = (0, 0);
        for owner in owners {
            mine += usize::from(owner == uid);
            guests += usize::from(self.admission.is_guest(owner));
        }
        if mine >= GUEST_SHARE || guests >= MAX_CONNECTIONS - OWNER_RESERVE {
            return Err(libc::EMFILE);
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::fd::FromRawFd;
    use std::os::unix::net::UnixStream;

    fn fd<T: Into<OwnedFd>>(t: T) -> OwnedFd {
        t.into()
    }

    #[test]
    fn a_kernel_socket_passed_with_a_bind_or_a_listen_must_be_what_it_says() {
        let udp = UdpSocket::bind("0.0.0.0:0").unwrap();
        let port = udp.local_addr().unwrap().port();
        let wildcard: SocketAddr = format!("0.0.0.0:{port}").parse().unwrap();
        let other_port: SocketAddr = format!("0.0.0.0:{}", port.wrapping_add(1).max(1)).parse().unwrap();
        let specific: SocketAddr = format!("10.0.0.2:{port}").parse().unwrap();
        assert!(host_datagram_socket(fd(udp.try_clone().unwrap()), wildcard).is_some());
        assert!(host_datagram_socket(fd(udp.try_clone().unwrap()), other_port).is_none());
        assert!(host_datagram_socket(fd(udp.try_clone().unwrap()), specific).is_none());
        let tcp = TcpListener::bind("0.0.0.0:0").unwrap();
        let tcp_port = tcp.local_addr().unwrap().port();
        let tcp_wildcard: SocketAddr = format!("0.0.0.0:{tcp_port}").parse().unwrap();
        assert!(
            host_datagram_socket(fd(tcp.try_clone().unwrap()), tcp_wildcard).is_none(),
            "TCP for UDP"
        );
        assert!(kernel_listener(fd(tcp.try_clone().unwrap()), tcp_wildcard).is_some());
        assert!(kernel_listener(fd(udp), wildcard).is_none(), "UDP for TCP");
        // A TCP socket bound but not listening is not a listener.
        let bound = std::net::TcpStream::connect(tcp.local_addr().unwrap()).unwrap();
        let bound_port: SocketAddr = format!("0.0.0.0:{}", bound.local_addr().unwrap().port())
            .parse()
            .unwrap();
        assert!(kernel_listener(fd(bound), bound_port).is_none());
    }

    #[test]
    fn a_listen_or_a_bind_needs_a_seqpacket_end_first() {
        let (stream, _) = UnixStream::pair().unwrap();
        assert!(seqpacket_and_kernel(vec![fd(stream)], |_| Some(())).is_none());
        assert!(seqpacket_and_kernel::<()>(Vec::new(), |_| Some(())).is_none());
        let mut fds = [0 as libc::c_int; 2];
        // SAFETY: `fds` has room for the two descriptors socketpair writes.
        assert_eq!(
            unsafe { libc::socketpair(libc::AF_UNIX, libc::SOCK_SEQPACKET, 0, fds.as_mut_ptr()) },
            0
        );
        // SAFETY: both are open descriptors that nothing else owns.
        let (a, b) = unsafe { (OwnedFd::from_raw_fd(fds[0]), OwnedFd::from_raw_fd(fds[1])) };
        let (extra, _) = UnixStream::pair().unwrap();
        let refused = seqpacket_and_kernel(vec![a, fd(extra)], |_| None::<()>);
        assert!(refused.is_none(), "a kernel socket its check refuses");
        let alone = seqpacket_and_kernel(vec![b], |_| Some(())).expect("a seqpacket end alone");
        assert!(alone.kernel.is_none());
    }
}
