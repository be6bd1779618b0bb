//! bind, listen and accept: a socket bound to a tunnel address listens in the stack, and a
//! wildcard one in both the stack and the kernel; accept takes either's connections.

use crate::sockets::TunnelSocket;
use crate::stand_in::stand_in_from_service;
use crate::{
    addr, attach, carried_type, datagram, fail, guarded, ipv6_only, real, set_errno, settings, socket_family, sockets,
    tunnel_socket, Settings,
};
use libc::{c_int, sockaddr, socklen_t};
use ordo_attach::{Op, Request};
use std::os::fd::IntoRawFd;

/// The tunnel address a not yet listening socket was bound to, and its family.
pub(super) fn bound_socket(fd: c_int) -> Option<(std::net::SocketAddr, c_int)> {
    settings()?;
    // A wildcard is bound by the kernel, which names it (with the port it chose).
    let a = sockets::bound_to(sockets::socket_inode(fd)?).filter(|a| !a.ip().is_unspecified())?;
    Some((a, socket_family(fd)?))
}

/// bind(2): a TCP socket bound to a tunnel address is the stack's: the kernel never sees the
/// bind (it would refuse an address that is not the host's); listen makes it a listening
/// socket in the stack. One bound to the unspecified address (0.0.0.0, ::) is bound by the
/// kernel and noted: listen makes it listen on the tunnel's addresses too.
///
/// # Safety
/// As bind(2).
#[no_mangle]
pub unsafe extern "C" fn bind(fd: c_int, address: *const sockaddr, len: socklen_t) -> c_int {
    // SAFETY: the caller's address, as bind(2) promises it.
    let dest = unsafe { addr::read(address, len) };
    if let (Some(s), Some(a)) = (settings(), dest) {
        let tunnel = ordo_attach::through_tunnel(&s.routes, a.ip());
        if (tunnel || a.ip().is_unspecified()) && carried_type(fd) == Some(libc::SOCK_DGRAM) {
            if !tunnel {
                // Every address: the kernel's bind first (its port, its errors), then the
                // stack's on the same port, with the kernel's socket relayed beside it.
                // SAFETY: the caller's arguments, unchanged.
                let r = unsafe { real::bind(fd, address, len) };
                if r != 0 {
                    return r;
                }
            }
            return guarded(|| {
                let Some(family) = socket_family(fd) else {
                    set_errno(libc::ENOTSOCK);
                    return -1;
                };
                let bound = if tunnel {
                    datagram::bind(s, fd, family, addr::unmapped(a))
                } else {
                    datagram::bind_everywhere(s, fd, family)
                };
                match bound {
                    Ok(_) => 0,
                    Err(r) => r,
                }
            });
        }
    }
    let stream = |s: &Settings, a: std::net::SocketAddr| {
        (ordo_attach::through_tunnel(&s.routes, a.ip()) || a.ip().is_unspecified())
            && carried_type(fd) == Some(libc::SOCK_STREAM)
    };
    let Some((a, wildcard)) = settings()
        .zip(dest)
        .filter(|(s, a)| stream(s, *a))
        .map(|(_, a)| (addr::unmapped(a), a.ip().is_unspecified()))
    else {
        // SAFETY: the caller's arguments, unchanged.
        return unsafe { real::bind(fd, address, len) };
    };
    if wildcard {
        // SAFETY: the caller's arguments, unchanged.
        let r = unsafe { real::bind(fd, address, len) };
        if r == 0 {
            if let Some(inode) = sockets::socket_inode(fd) {
                let _ = std::panic::catch_unwind(|| sockets::bound(inode, a));
            }
        }
        return r;
    }
    guarded(|| match sockets::socket_inode(fd) {
        Some(inode) => {
            sockets::bound(inode, a);
            0
        }
        None => {
            set_errno(libc::ENOTSOCK);
            -1
        }
    })
}

/// listen(2): a socket bound to a tunnel address listens in the stack; its descriptor
/// becomes the listening end of a Unix seqpacket pair over which the service sends each
/// connection it accepts. One bound to the unspecified address listens in the kernel too, and
/// the service hands over the kernel's connections on the same pair.
///
/// # Safety
/// As listen(2).
#[no_mangle]
pub unsafe extern "C" fn listen(fd: c_int, backlog: c_int) -> c_int {
    if let Some((s, inode, local)) = settings().and_then(|s| {
        let inode = sockets::socket_inode(fd)?;
        Some((s, inode, sockets::bound_to(inode)?))
    }) {
        if local.ip().is_unspecified() {
            // SAFETY: the caller's arguments, unchanged.
            let r = unsafe { real::listen(fd, backlog) };
            if r != 0 {
                return r;
            }
        }
        return guarded(|| listen_in_stack(s, fd, inode, local));
    }
    // SAFETY: the caller's arguments, unchanged.
    unsafe { real::listen(fd, backlog) }
}

fn listen_in_stack(s: &Settings, fd: c_int, inode: u64, mut local: std::net::SocketAddr) -> c_int {
    let Some(family) = socket_family(fd) else {
        set_errno(libc::ENOTSOCK);
        return -1;
    };
    let wildcard = local.ip().is_unspecified();
    let mut v6_only = false;
    if wildcard {
        // The kernel's socket listens already: its port (chosen by the kernel for port 0),
        // and whether it takes IPv4 too.
        match addr::kernel_name(fd) {
            Err(()) => return -1,
            Ok(Some(a)) => local.set_port(a.port()),
            Ok(None) => {}
        }
        v6_only = family == libc::AF_INET6 && ipv6_only(fd);
    }
    let request = Request {
        op: Op::ListenTcp,
        addr: local,
        nonblocking: None,
        v6_only,
    };
    let (reply, new) = match stand_in_from_service(s, fd, libc::SOCK_SEQPACKET, &request, wildcard) {
        Ok(r) => r,
        Err(r) => return r,
    };
    sockets::forget_bound(inode);
    if let Some(new) = new {
        sockets::remember(TunnelSocket {
            listening: true,
            ..TunnelSocket::new(new, family, reply.local.or(Some(local)), None)
        });
    }
    0
}

/// accept(2).
///
/// # Safety
/// As accept(2).
#[no_mangle]
pub unsafe extern "C" fn accept(fd: c_int, address: *mut sockaddr, len: *mut socklen_t) -> c_int {
    // SAFETY: the caller's arguments.
    unsafe { accept4(fd, address, len, 0) }
}

/// accept4(2): on a tunnel listening socket, the next connection the service sent over it,
/// with the flags asked for and the peer's address.
///
/// # Safety
/// As accept4(2).
#[no_mangle]
pub unsafe extern "C" fn accept4(fd: c_int, address: *mut sockaddr, len: *mut socklen_t, flags: c_int) -> c_int {
    match tunnel_socket(fd) {
        Some(t) if t.listening => guarded(|| {
            // SAFETY: the caller's address buffer, as accept4(2) promises it.
            unsafe { accept_from_stack(fd, &t, address, len, flags) }
        }),
        // SAFETY: the caller's arguments, unchanged.
        _ => unsafe { real::accept4(fd, address, len, flags) },
    }
}

/// # Safety
/// `address` is null or has `*len` writable bytes.
unsafe fn accept_from_stack(
    fd: c_int,
    t: &TunnelSocket,
    address: *mut sockaddr,
    len: *mut socklen_t,
    flags: c_int,
) -> c_int {
    let (accepted, conn) = match attach::recv_accepted(fd, flags & libc::SOCK_CLOEXEC != 0) {
        Ok(a) => a,
        Err(e) => return fail(e),
    };
    let cfd = conn.into_raw_fd();
    if flags & libc::SOCK_NONBLOCK != 0 {
        // SAFETY: a status flag on the descriptor we just received.
        unsafe { real::fcntl(cfd, libc::F_SETFL, libc::O_NONBLOCK as libc::c_ulong) };
    }
    if !address.is_null() && !len.is_null() {
        // SAFETY: the caller's buffer and length.
        unsafe { addr::write(accepted.remote, t.family, address, len) };
    }
    if accepted.kernel {
        // The kernel's own TCP socket: nothing to stand in for.
        return cfd;
    }
    if let Some(inode) = sockets::socket_inode(cfd) {
        sockets::remember(TunnelSocket::new(
            inode,
            t.family,
            Some(accepted.local),
            Some(accepted.remote),
        ));
    }
    cfd
}
