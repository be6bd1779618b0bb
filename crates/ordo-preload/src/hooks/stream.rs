//! connect(2): a TCP connection to a tunnel destination goes to the service, which connects
//! through its stack; the program's descriptor becomes one end of a Unix socket pair (the
//! stand-in). A UDP connect to a tunnel destination is [`super::datagram`]'s.

use super::datagram::connect_datagram;
use crate::resolve::dns_redirect;
use crate::sockets::TunnelSocket;
use crate::stand_in::swap_in;
use crate::{
    addr, attach, carried_type, datagram, epoll, fail, fail_closed, guarded, real, set_errno, settings, socket_family,
    socket_option, sockets, Settings,
};
use libc::{c_int, sockaddr, socklen_t};
use ordo_attach::{Op, Request};
use std::os::fd::{AsRawFd, FromRawFd, IntoRawFd};

/// connect(2): a TCP connection to a tunnel destination goes to the service.
///
/// # Safety
/// As connect(2).
#[no_mangle]
pub unsafe extern "C" fn connect(fd: c_int, address: *const sockaddr, len: socklen_t) -> c_int {
    // SAFETY: the caller's contract is connect(2)'s: `address` has `len` readable bytes.
    let dest = unsafe { addr::read(address, len) };
    if let (Some(s), Some(t)) = (settings(), datagram::addressed(fd)) {
        if let Some(d) = dest {
            return guarded(|| datagram::connect(s, fd, &t, addr::unmapped(d)));
        }
        // SAFETY: the caller's address of `len` bytes, its family read if it has one.
        if unsafe { addr::is_unspec(address, len) } {
            return guarded(|| datagram::disconnect(fd, &t));
        }
    }
    let tunnel = match (settings(), dest) {
        (Some(s), Some(d)) if ordo_attach::through_tunnel(&s.routes, d.ip()) => Some((s, d)),
        // A name server of the host's while the tunnel has its own (`DNS =`): the query goes
        // to the tunnel's, the program still seeing the one it asked for (a resolver of its
        // own, as c-ares or Go's, checks where answers come from).
        (Some(s), Some(d)) => match dns_redirect(s, d) {
            Some(server) => return guarded(|| connect_through_tunnel(s, fd, server, addr::unmapped(d))),
            None => None,
        },
        _ => None,
    };
    let Some((s, dest)) = tunnel else {
        // SAFETY: the caller's address of `len` bytes, its family read if it has one.
        if settings().is_some() && unsafe { addr::is_family(address, len, libc::AF_UNIX) } {
            // Never an IP destination: the kernel's IP sockets refuse an AF_UNIX address.
            // Marked so that `ordo run`'s supervisor need not stop it.
            // SAFETY: the caller's arguments, unchanged.
            return unsafe { real::connect_unix(fd, address, len) };
        }
        // SAFETY: the caller's arguments, unchanged.
        return unsafe { real::connect(fd, address, len) };
    };
    guarded(|| connect_through_tunnel(s, fd, dest, addr::unmapped(dest)))
}

/// Connects `fd` through the tunnel to `dest`; `shown` is the remote the program is told (the
/// address it asked for, which a redirected DNS query's is not).
fn connect_through_tunnel(s: &Settings, fd: c_int, dest: std::net::SocketAddr, shown: std::net::SocketAddr) -> c_int {
    // Answers that came for programs that never asked (SO_ERROR) are read here, so that the
    // connections to the service they came on do not pile up.
    for t in sockets::pending() {
        connect_result(&t);
    }
    if let Some(t) = sockets::lookup(fd) {
        // connect(2) again on a socket already swapped: in progress, or done.
        set_errno(if t.pending.is_some() {
            libc::EALREADY
        } else {
            libc::EISCONN
        });
        return -1;
    }
    let (Some(ty), Some(family)) = (carried_type(fd), socket_family(fd)) else {
        set_errno(libc::ENOTSOCK);
        return -1;
    };
    let dest = addr::unmapped(dest);
    if ty == libc::SOCK_DGRAM {
        return connect_datagram(s, fd, family, dest, shown);
    }
    if ty != libc::SOCK_STREAM {
        // Other kinds of sockets to the tunnel are not carried: fail closed rather than let
        // the kernel send them elsewhere.
        set_errno(libc::ENETUNREACH);
        return -1;
    }
    let (mine, theirs) = match attach::socket_pair(libc::SOCK_STREAM) {
        Ok(p) => p,
        Err(e) => return fail(e),
    };
    // SAFETY: fcntl on the program's descriptor, reading flags only.
    let status = unsafe { real::fcntl(fd, libc::F_GETFL, 0) };
    let nonblocking = status >= 0 && status & libc::O_NONBLOCK != 0;
    // Every connect is made as a non-blocking one (see `fill`); a blocking connect then waits
    // for the answer, where a signal may interrupt it as it interrupts the kernel's.
    let filler = match fill(mine.as_raw_fd()) {
        Ok(f) => f,
        Err(e) => return fail(e),
    };
    let request = Request {
        op: Op::ConnectTcp,
        addr: dest,
        nonblocking: Some(filler),
        v6_only: false,
    };
    let control = match attach::send(&s.socket, &request, &[theirs.as_raw_fd(), mine.as_raw_fd()]) {
        Ok(c) => c,
        Err(e) => return fail_closed(e),
    };
    drop(theirs);
    // A blocking connect that fails leaves the socket as it was, to be connected again: the
    // program's own socket is kept aside until the answer.
    let original = if nonblocking {
        None
    } else {
        // SAFETY: F_DUPFD_CLOEXEC duplicates the program's descriptor; the copy is ours.
        let copy = unsafe { real::fcntl(fd, libc::F_DUPFD_CLOEXEC, 0) };
        // SAFETY: a descriptor fcntl just made, owned by nobody else.
        (copy >= 0).then(|| unsafe { std::os::fd::OwnedFd::from_raw_fd(copy) })
    };
    let old_inode = sockets::socket_inode(fd);
    let inode = match swap_in(fd, mine, status) {
        Ok(Some(inode)) => inode,
        Ok(None) => {
            set_errno(libc::ENOTSOCK);
            return -1;
        }
        Err(()) => return -1,
    };
    let entry = TunnelSocket {
        pending: Some(control.into_raw_fd()),
        ..TunnelSocket::new(inode, family, None, Some(shown))
    };
    sockets::remember(entry);
    if nonblocking {
        set_errno(libc::EINPROGRESS);
        return -1;
    }
    match wait_for_connect(&entry) {
        // Interrupted: as the kernel's, the connection goes on being made; the program
        // learns of it as after a non-blocking connect (writable, then SO_ERROR).
        None => {
            set_errno(libc::EINTR);
            -1
        }
        Some(0) => 0,
        Some(errno) => {
            // Refused, unreachable, timed out: the program's socket back in place, unconnected.
            if let Some(original) = original {
                // SAFETY: fcntl reading the stand-in's descriptor flags.
                let fd_flags = unsafe { real::fcntl(fd, libc::F_GETFD, 0) };
                let cloexec = if fd_flags >= 0 && fd_flags & libc::FD_CLOEXEC != 0 {
                    libc::O_CLOEXEC
                } else {
                    0
                };
                // SAFETY: both are open descriptors; dup3 atomically replaces `fd`'s file.
                if unsafe { real::dup3(original.as_raw_fd(), fd, cloexec) } >= 0 {
                    sockets::forget(inode);
                    if let Some(old) = old_inode {
                        epoll::carry_over(fd, inode, old);
                    }
                }
            }
            set_errno(errno);
            -1
        }
    }
}

/// Waits for the answer to the connect of `entry`: its errno (0: established), or None if
/// a signal interrupted the wait.
fn wait_for_connect(entry: &TunnelSocket) -> Option<c_int> {
    loop {
        if let Some(errno) = connect_result(entry) {
            return Some(errno);
        }
        let Some(control) = sockets::lookup_inode(entry.inode).and_then(|e| e.pending) else {
            // Answered meanwhile (another thread asked): its result.
            return Some(sockets::lookup_inode(entry.inode).map_or(libc::ECONNABORTED, |e| e.error));
        };
        let mut p = libc::pollfd {
            fd: control,
            events: libc::POLLIN,
            revents: 0,
        };
        // SAFETY: one valid pollfd; no timeout: the service answers within its own.
        if unsafe { libc::poll(&mut p, 1, -1) } < 0
            && std::io::Error::last_os_error().kind() == std::io::ErrorKind::Interrupted
        {
            return None;
        }
    }
}

/// Makes the stand-in `fd` unwritable until the service drains it: its send buffer at the
/// minimum, then filled. Returns what the service needs to undo it.
fn fill(fd: c_int) -> std::io::Result<ordo_attach::Filler> {
    let sndbuf = socket_option(fd, libc::SO_SNDBUF).ok_or_else(std::io::Error::last_os_error)?;
    let one: c_int = 1;
    // SAFETY: an int option; the kernel raises it to its minimum.
    unsafe {
        real::setsockopt(
            fd,
            libc::SOL_SOCKET,
            libc::SO_SNDBUF,
            (&one as *const c_int).cast(),
            std::mem::size_of::<c_int>() as socklen_t,
        )
    };
    let filler = ordo_attach::fill_send_buffer(fd)?;
    Ok(ordo_attach::Filler {
        filler,
        sndbuf: sndbuf as u32,
    })
}

/// The answer to a non-blocking connect, if it has come: its errno (0: established), and the
/// socket's entry updated. None: still in progress. Under the table's lock, so that two
/// threads asking at once do not both close the connection to the service.
pub(super) fn connect_result(t: &TunnelSocket) -> Option<c_int> {
    sockets::update(t.inode, |e| {
        let control = e.pending?;
        let reply = match attach::try_reply(control) {
            Ok(None) => return None,
            Ok(Some(r)) => Some(r),
            Err(_) => None,
        };
        // SAFETY: the table owned `control`; it is closed once, here, and forgotten.
        unsafe { libc::close(control) };
        e.pending = None;
        e.error = reply.map_or(libc::ECONNABORTED, |r| r.errno);
        if let Some(r) = reply {
            e.local = r.local.or(e.local);
            e.remote = r.remote.or(e.remote);
        }
        Some(e.error)
    })
    .flatten()
}
