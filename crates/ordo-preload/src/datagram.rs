//! Unconnected UDP sockets through the tunnel: a UDP socket bound to a tunnel address, or
//! one whose first datagram goes to a tunnel address while it is bound to nothing, becomes
//! one end of a Unix seqpacket pair with a UDP socket of the stack at the other
//! (`ordo_attach::Op::BindUdp`). Its records carry addresses: the service starts each with
//! the datagram's source, which the receive hooks take off and report; the send hooks start
//! each with the socket's marker and the destination. A send without a destination (send,
//! write) is a record alone, which the service sends to the socket's remote once a connect
//! has given it one; connect is a marked record too, so that it is ordered with the
//! datagrams around it.
//!
//! A UDP socket bound to every address (0.0.0.0, ::) is bound by the kernel too, and brings
//! its kernel socket to the service, which relays it beside the stack's: the server hears
//! the host's networks and the tunnel at once, and answers each (`SendHeader::ToHost` for
//! the host's). Any other such socket is the tunnel's alone: a destination outside the
//! tunnel fails with ENETUNREACH (its port is the stack's, not the host's).

use crate::sockets::{self, TunnelSocket};
use crate::{addr, real, set_errno, Settings};
use libc::{c_int, sockaddr, socklen_t};
use ordo_attach::{Op, Request, SendHeader, Source, MARKER_LEN, SEND_HEADER_LEN, SOURCE_LEN};
use std::net::SocketAddr;

/// Makes the program's UDP socket `fd` an unconnected socket of the stack bound to `local`
/// (a tunnel address, or the unspecified address: all of the stack's). Returns its entry,
/// or the value the program's call returns (errno set).
pub fn bind(s: &Settings, fd: c_int, family: c_int, local: SocketAddr) -> Result<TunnelSocket, c_int> {
    bind_in_stack(s, fd, family, local, false, false)
}

/// Makes the program's UDP socket `fd`, which the kernel has just bound to the unspecified
/// address, one that the stack and the kernel both deliver to: the stack's socket
/// on the same port, the kernel's relayed beside it.
pub fn bind_everywhere(s: &Settings, fd: c_int, family: c_int) -> Result<TunnelSocket, c_int> {
    let port = addr::kernel_name(fd).map_err(|()| -1)?.map_or(0, |a| a.port());
    let v6_only = family == libc::AF_INET6 && crate::ipv6_only(fd);
    let local = SocketAddr::new(addr::unspecified(family), port);
    bind_in_stack(s, fd, family, local, v6_only, true)
}

fn bind_in_stack(
    s: &Settings,
    fd: c_int,
    family: c_int,
    local: SocketAddr,
    v6_only: bool,
    host: bool,
) -> Result<TunnelSocket, c_int> {
    let request = Request {
        op: Op::BindUdp,
        addr: local,
        nonblocking: None,
        v6_only,
    };
    let (reply, inode) = crate::stand_in::stand_in_from_service(s, fd, libc::SOCK_SEQPACKET, &request, host)?;
    let Some(marker) = reply.marker else {
        set_errno(libc::EPROTO);
        return Err(-1);
    };
    let entry = TunnelSocket {
        datagram: true,
        marker: Some(marker),
        host,
        ..TunnelSocket::new(inode.unwrap_or(0), family, reply.local.or(Some(local)), None)
    };
    if let Some(inode) = inode {
        sockets::remember(entry);
        sockets::mark_addressed(fd, inode, family);
    }
    Ok(entry)
}

/// For a datagram to a tunnel address from the program's socket `fd`, not a tunnel
/// socket: a UDP socket bound to nothing yet is bound in the stack (as the kernel binds it
/// on its first send) and its marker returned; anything else is refused with its errno
/// (bound by the kernel: its port cannot move; not UDP: not carried).
pub fn bind_for_send(s: &Settings, fd: c_int) -> Result<[u8; MARKER_LEN], c_int> {
    if crate::carried_type(fd) != Some(libc::SOCK_DGRAM) {
        return Err(libc::ENETUNREACH);
    }
    let family = crate::socket_family(fd).ok_or(libc::ENOTSOCK)?;
    let bound = addr::kernel_name(fd).map_err(|()| libc::ENOTSOCK)?;
    if bound.is_some_and(|a| a.port() != 0) {
        return Err(libc::ENETUNREACH);
    }
    // An AF_INET socket cannot be handed an IPv6 destination: the family decides.
    let any = SocketAddr::new(addr::unspecified(family), 0);
    let t =
        bind(s, fd, family, any).map_err(|_| std::io::Error::last_os_error().raw_os_error().unwrap_or(libc::EIO))?;
    t.marker.ok_or(libc::EPROTO)
}

/// Sends the payload in `iov` to `to` on the unconnected tunnel socket `fd`, as one record
/// after its header; the payload's length, or -1 with errno set.
///
/// # Safety
/// `iov` points to `iovlen` iovecs of readable buffers.
pub unsafe fn send_to(
    fd: c_int,
    marker: [u8; MARKER_LEN],
    to: SocketAddr,
    via_host: bool,
    iov: *const libc::iovec,
    iovlen: usize,
    flags: c_int,
) -> libc::ssize_t {
    let header = if via_host {
        SendHeader::ToHost(to)
    } else {
        SendHeader::To(to)
    }
    .encode(marker);
    let mut parts = Vec::with_capacity(iovlen + 1);
    parts.push(libc::iovec {
        iov_base: header.as_ptr() as *mut libc::c_void,
        iov_len: header.len(),
    });
    if !iov.is_null() {
        // SAFETY: the caller's `iovlen` iovecs.
        parts.extend_from_slice(unsafe { std::slice::from_raw_parts(iov, iovlen) });
    }
    // SAFETY: msghdr is plain data; all zeros is an empty message.
    let mut msg: libc::msghdr = unsafe { std::mem::zeroed() };
    msg.msg_iov = parts.as_mut_ptr();
    msg.msg_iovlen = parts.len();
    // SAFETY: `msg` points at `parts`, whose entries point at live buffers, for the call.
    let n = unsafe { real::sendmsg(fd, &msg, flags | libc::MSG_NOSIGNAL | ordo_attach::CHECKED_SEND) };
    if n < 0 {
        return n;
    }
    n - SEND_HEADER_LEN as libc::ssize_t
}

/// connect(2) on an unconnected tunnel socket: to a tunnel address, the stack's socket
/// takes that remote (ordered with the datagrams sent before); elsewhere, one with its
/// kernel socket takes that remote there, any other fails with ENETUNREACH.
pub fn connect(s: &Settings, fd: c_int, t: &TunnelSocket, to: SocketAddr) -> c_int {
    let Some(marker) = t.marker else {
        set_errno(libc::EISCONN);
        return -1;
    };
    let header = if ordo_attach::through_tunnel(&s.routes, to.ip()) {
        SendHeader::Connect(to)
    } else if t.host {
        SendHeader::ConnectHost(to)
    } else {
        set_errno(libc::ENETUNREACH);
        return -1;
    };
    let record = header.encode(marker);
    // SAFETY: sending our own record on the program's descriptor.
    let n = unsafe { libc::send(fd, record.as_ptr().cast(), record.len(), libc::MSG_NOSIGNAL) };
    if n < 0 {
        return -1;
    }
    sockets::update(t.inode, |e| e.remote = Some(to));
    0
}

/// connect(2) with AF_UNSPEC on an unconnected tunnel socket: it has no remote any more.
pub fn disconnect(fd: c_int, t: &TunnelSocket) -> c_int {
    let Some(marker) = t.marker else {
        set_errno(libc::EINVAL);
        return -1;
    };
    let record = SendHeader::Disconnect.encode(marker);
    // SAFETY: sending our own record on the program's descriptor.
    if unsafe { libc::send(fd, record.as_ptr().cast(), record.len(), libc::MSG_NOSIGNAL) } < 0 {
        return -1;
    }
    sockets::update(t.inode, |e| e.remote = None);
    0
}

/// The caller's iovecs [`recv`] takes without allocating.
const FEW_IOVECS: usize = 15;

/// Receives one datagram on the unconnected tunnel socket `fd` into `iov`: its source, in
/// the socket's `family`, into `name` (if not null; `*name_len` its room, then its length)
/// and the receive flags into `msg_flags`. Returns what recvmsg(2) would: the payload's
/// length (its whole length with MSG_TRUNC), or -1 with errno set.
///
/// # Safety
/// `iov` points to `iovlen` iovecs of writable buffers; `name` is null or has `*name_len`
/// writable bytes; `name_len` and `msg_flags` are null or writable.
#[allow(clippy::too_many_arguments)]
pub unsafe fn recv(
    fd: c_int,
    family: c_int,
    iov: *const libc::iovec,
    iovlen: usize,
    flags: c_int,
    name: *mut sockaddr,
    name_len: *mut socklen_t,
    msg_flags: *mut c_int,
) -> libc::ssize_t {
    let mut source = [0u8; SOURCE_LEN];
    let head = libc::iovec {
        iov_base: source.as_mut_ptr().cast(),
        iov_len: source.len(),
    };
    let caller: &[libc::iovec] = if iov.is_null() {
        &[]
    } else {
        // SAFETY: the caller's `iovlen` iovecs.
        unsafe { std::slice::from_raw_parts(iov, iovlen) }
    };
    // The source's iovec, then the caller's: on the stack for a few (no allocation, which a
    // signal handler's read must not do), on the heap beyond.
    let mut few = [head; FEW_IOVECS + 1];
    let mut many = Vec::new();
    let parts: &mut [libc::iovec] = if caller.len() <= FEW_IOVECS {
        few[1..=caller.len()].copy_from_slice(caller);
        &mut few[..=caller.len()]
    } else {
        many.push(head);
        many.extend_from_slice(caller);
        &mut many
    };
    // SAFETY: msghdr is plain data; all zeros is an empty message.
    let mut msg: libc::msghdr = unsafe { std::mem::zeroed() };
    msg.msg_iov = parts.as_mut_ptr();
    msg.msg_iovlen = parts.len();
    // SAFETY: `msg` points at `parts`, whose entries point at live buffers, for the call.
    let n = unsafe { real::recvmsg(fd, &mut msg, flags) };
    if n < 0 {
        return n;
    }
    if !msg_flags.is_null() {
        // SAFETY: the caller's flags, writable.
        unsafe { *msg_flags = msg.msg_flags };
    }
    let from = Source::decode(&source).ok().map(|s| s.0);
    if !name.is_null() && !name_len.is_null() {
        match from {
            // SAFETY: the caller's buffer and its room.
            Some(a) => unsafe { addr::write(a, family, name, name_len) },
            // SAFETY: as above.
            None => unsafe { *name_len = 0 },
        }
    }
    // Zero: the service closed its end (every record of its has a source).
    (n - SOURCE_LEN as libc::ssize_t).max(0)
}

/// The unconnected tunnel socket `fd` is, if it is one (looked up only for descriptors
/// that may be: [`sockets::addressed`]).
pub fn addressed(fd: c_int) -> Option<TunnelSocket> {
    if matches!(sockets::addressed(fd), sockets::Addressed::No) {
        return None;
    }
    crate::tunnel_socket(fd).filter(|t| t.marker.is_some())
}

/// The family of the unconnected tunnel socket `fd`, if it is one: for the receive hooks,
/// without the table's lock below [`sockets::addressed`]'s numbers.
pub fn addressed_family(fd: c_int) -> Option<c_int> {
    match sockets::addressed(fd) {
        sockets::Addressed::No => None,
        sockets::Addressed::Family(f) => Some(f),
        sockets::Addressed::LookUp => crate::tunnel_socket(fd)
            .filter(|t| t.marker.is_some())
            .map(|t| t.family),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::fd::AsRawFd;
    use std::os::unix::net::UnixDatagram;

    /// A record read into the caller's buffers without its source, and the source reported:
    /// into few buffers (on the stack) and into more than [`FEW_IOVECS`] (on the heap).
    #[test]
    fn a_record_is_received_into_few_or_many_buffers() {
        let (program, service) = UnixDatagram::pair().unwrap();
        let from: SocketAddr = "10.99.0.2:5353".parse().unwrap();
        for buffers in [1, FEW_IOVECS, FEW_IOVECS + 5] {
            let payload: Vec<u8> = (0..buffers as u8 * 3).collect();
            let mut record = Source(from).encode().to_vec();
            record.extend_from_slice(&payload);
            service.send(&record).unwrap();
            let mut into = vec![[0u8; 3]; buffers];
            let iov: Vec<libc::iovec> = (into.iter_mut())
                .map(|b| libc::iovec {
                    iov_base: b.as_mut_ptr().cast(),
                    iov_len: b.len(),
                })
                .collect();
            // SAFETY: sockaddr_storage is plain data.
            let mut name: libc::sockaddr_storage = unsafe { std::mem::zeroed() };
            let mut name_len = std::mem::size_of_val(&name) as socklen_t;
            let mut msg_flags = 0;
            // SAFETY: `iov` points at `into`'s buffers, `name` has `name_len` bytes.
            let n = unsafe {
                recv(
                    program.as_raw_fd(),
                    libc::AF_INET,
                    iov.as_ptr(),
                    iov.len(),
                    0,
                    (&mut name as *mut libc::sockaddr_storage).cast(),
                    &mut name_len,
                    &mut msg_flags,
                )
            };
            assert_eq!(n, payload.len() as libc::ssize_t, "{buffers} buffers");
            assert_eq!(into.concat(), payload);
            // SAFETY: `name` holds `name_len` bytes the call wrote.
            let got = unsafe { addr::read((&name as *const libc::sockaddr_storage).cast(), name_len) };
            assert_eq!(got, Some(from));
        }
    }
}
