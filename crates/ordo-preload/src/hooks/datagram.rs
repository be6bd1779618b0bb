//! The datagram calls: a UDP connect to a tunnel destination, the send calls (each
//! destination judged, what cannot be read refused) and the receive calls on tunnel sockets
//! whose records carry addresses ([`crate::datagram`]).

use crate::resolve::dns_redirect;
use crate::sockets::TunnelSocket;
use crate::stand_in::stand_in_from_service;
use crate::{addr, datagram, real, set_errno, settings, socket_family, sockets, tunnel_socket, Settings};
use libc::{c_int, sockaddr, socklen_t};
use ordo_attach::{Op, Request};
use std::time::{Duration, Instant};

/// A UDP socket connected to a tunnel address: its descriptor becomes one end of a Unix
/// seqpacket pair whose records are its datagrams, the other end the service's. Answered at
/// once, blocking or not: connecting UDP sends nothing.
pub(super) fn connect_datagram(
    s: &Settings,
    fd: c_int,
    family: c_int,
    dest: std::net::SocketAddr,
    shown: std::net::SocketAddr,
) -> c_int {
    let request = Request {
        op: Op::ConnectUdp,
        addr: dest,
        nonblocking: None,
        v6_only: false,
    };
    let (reply, inode) = match stand_in_from_service(s, fd, libc::SOCK_SEQPACKET, &request, false) {
        Ok(r) => r,
        Err(r) => return r,
    };
    if let Some(inode) = inode {
        sockets::remember(TunnelSocket {
            datagram: true,
            ..TunnelSocket::new(inode, family, reply.local, Some(shown))
        });
    }
    0
}

/// What a send with a destination does on a descriptor.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Destination {
    /// Handed to the C library as it is: no destination, or one the library read and found
    /// outside the tunnel (so marked as checked for `ordo run`'s supervisor, [`checked`]).
    Kernel,
    /// Handed to the C library as it is, unmarked: a destination the library does not read
    /// (not IP, or an IPv6 address of the older 24-byte size, which the kernel takes), left
    /// for the supervisor to judge.
    Unread,
    /// Fails with this errno: ENETUNREACH for a tunnel destination from a socket that
    /// cannot reach it (bound by the kernel, or not UDP: it fails closed, never leaving by
    /// the kernel's route), or for a destination outside the tunnel from an unconnected
    /// tunnel UDP socket; EISCONN for a connected tunnel UDP socket given
    /// another destination than its remote (the kernel would send there; the stand-in
    /// reaches its remote only, so it must not be handed one it would misdirect).
    Refused(c_int),
    /// Left out: a tunnel socket is connected (a TCP one, or a UDP one sent to its own
    /// remote), and the kernel's TCP ignores a destination given to it, where the Unix
    /// stream socket standing in for it fails with EISCONN.
    Dropped,
    /// An unconnected tunnel UDP socket's datagram to a tunnel address: sent with its header
    /// (`datagram`).
    Addressed {
        to: std::net::SocketAddr,
        marker: [u8; ordo_attach::MARKER_LEN],
        /// Outside the tunnel, through the socket's kernel socket.
        via_host: bool,
    },
}

/// What a send on `fd` to the destination `addr` does.
///
/// # Safety
/// `addr` is null or points to `len` readable bytes.
unsafe fn destination(fd: c_int, addr: *const sockaddr, len: socklen_t) -> Destination {
    let Some(s) = settings() else {
        return Destination::Kernel;
    };
    // SAFETY: the caller's contract, for both readings. A family of 0 is read as an IPv4
    // socket's send reads it; an IPv6 socket's takes it as no address (left unread, for the
    // supervisor, which judges both readings).
    let read = unsafe {
        addr::read(addr, len)
            .or_else(|| addr::unspec_as_ipv4(addr, len).filter(|_| socket_family(fd) == Some(libc::AF_INET)))
    };
    let Some(dest) = read.map(addr::unmapped) else {
        // No destination: an unconnected tunnel UDP socket has nowhere to send, as the
        // kernel's would not (its stand-in would take the record and the service drop it).
        return match datagram::addressed(fd) {
            Some(t) if t.remote.is_none() => Destination::Refused(libc::EDESTADDRREQ),
            _ if addr.is_null() => Destination::Kernel,
            _ => Destination::Unread,
        };
    };
    let to_tunnel = ordo_attach::through_tunnel(&s.routes, dest.ip());
    if dns_redirect(s, dest).is_some() {
        // A query to a host's name server while the tunnel has its own: not carried for an
        // unconnected socket (its answers would name another source), refused rather than
        // leaked.
        return Destination::Refused(libc::ENETUNREACH);
    }
    if !to_tunnel && !sockets::any_datagram() {
        // Neither a tunnel destination nor a tunnel UDP socket that could be misdirected:
        // the kernel's, without a look-up.
        return Destination::Kernel;
    }
    match tunnel_socket(fd) {
        Some(TunnelSocket {
            marker: Some(marker),
            host,
            ..
        }) if to_tunnel || host => Destination::Addressed {
            to: dest,
            marker,
            via_host: !to_tunnel,
        },
        Some(TunnelSocket { marker: Some(_), .. }) => Destination::Refused(libc::ENETUNREACH),
        Some(t) if t.datagram && t.remote != Some(dest) => Destination::Refused(libc::EISCONN),
        // The stand-in would ignore it (a Unix seqpacket socket) or refuse it (a stream
        // one); left out, no tunnel destination ever reaches the kernel from the library,
        // and `ordo run`'s supervisor refuses any that does (crates/ordo/src/run/supervise.rs).
        Some(_) => Destination::Dropped,
        // A UDP socket bound to nothing yet: bound in the stack by its first datagram, as
        // the kernel binds it on its first send.
        None if to_tunnel => match std::panic::catch_unwind(|| datagram::bind_for_send(s, fd)) {
            Ok(Ok(marker)) => Destination::Addressed {
                to: dest,
                marker,
                via_host: false,
            },
            Ok(Err(errno)) => Destination::Refused(errno),
            Err(_) => Destination::Refused(libc::EIO),
        },
        None => Destination::Kernel,
    }
}

/// `flags` marked as a send whose destination the library checked (or that has none), for
/// `ordo run`'s supervisor to let by (ordo_attach::CHECKED_SEND): only where the library
/// knows the tunnel's networks, so that it did check.
fn checked(flags: c_int) -> c_int {
    if settings().is_some() {
        flags | ordo_attach::CHECKED_SEND
    } else {
        flags
    }
}

/// sendto(2): see [`destination`]; everything else is the C library's.
///
/// # Safety
/// As sendto(2).
#[no_mangle]
pub unsafe extern "C" fn sendto(
    fd: c_int,
    buf: *const libc::c_void,
    len: libc::size_t,
    flags: c_int,
    addr: *const sockaddr,
    addr_len: socklen_t,
) -> libc::ssize_t {
    // SAFETY: the caller's address, as sendto(2) promises it.
    match unsafe { destination(fd, addr, addr_len) } {
        Destination::Refused(errno) => {
            set_errno(errno);
            -1
        }
        // SAFETY: the caller's buffer, without the destination.
        Destination::Dropped => unsafe { real::sendto(fd, buf, len, checked(flags), std::ptr::null(), 0) },
        Destination::Addressed { to, marker, via_host } => {
            let iov = libc::iovec {
                iov_base: buf as *mut libc::c_void,
                iov_len: len,
            };
            // SAFETY: one iovec of the caller's buffer.
            unsafe { datagram::send_to(fd, marker, to, via_host, &iov, 1, flags) }
        }
        // SAFETY: the caller's arguments, unchanged but for the mark.
        Destination::Kernel => unsafe { real::sendto(fd, buf, len, checked(flags), addr, addr_len) },
        // SAFETY: the caller's arguments, unchanged.
        Destination::Unread => unsafe { real::sendto(fd, buf, len, flags, addr, addr_len) },
    }
}

/// sendmsg(2): as [`sendto`], for the message's destination.
///
/// # Safety
/// As sendmsg(2).
#[no_mangle]
pub unsafe extern "C" fn sendmsg(fd: c_int, msg: *const libc::msghdr, flags: c_int) -> libc::ssize_t {
    let mut mark = false;
    if !msg.is_null() {
        // SAFETY: `msg` is the caller's message header, as sendmsg(2) promises it.
        match unsafe { destination(fd, (*msg).msg_name.cast(), (*msg).msg_namelen) } {
            Destination::Refused(errno) => {
                set_errno(errno);
                return -1;
            }
            Destination::Dropped => {
                // SAFETY: the caller's header, read to be copied.
                let mut m = unsafe { std::ptr::read(msg) };
                m.msg_name = std::ptr::null_mut();
                m.msg_namelen = 0;
                // SAFETY: the caller's message, without the destination.
                return unsafe { real::sendmsg(fd, &m, checked(flags)) };
            }
            Destination::Addressed { to, marker, via_host } => {
                // Its payload with the header; its control messages (the IP options of
                // the kernel's sockets) are not carried.
                // SAFETY: the caller's message's iovecs, as sendmsg(2) promises them.
                return unsafe {
                    datagram::send_to(fd, marker, to, via_host, (*msg).msg_iov, (*msg).msg_iovlen, flags)
                };
            }
            Destination::Kernel => mark = true,
            Destination::Unread => {}
        }
    }
    let flags = if mark { checked(flags) } else { flags };
    // SAFETY: the caller's arguments, unchanged but for the mark.
    unsafe { real::sendmsg(fd, msg, flags) }
}

/// sendmmsg(2): as [`sendto`]; the messages before the first refused are sent, and their
/// count returned (none: that message's errno).
///
/// # Safety
/// As sendmmsg(2).
#[no_mangle]
pub unsafe extern "C" fn sendmmsg(fd: c_int, msgs: *mut libc::mmsghdr, n: libc::c_uint, flags: c_int) -> c_int {
    if settings().is_some() && !msgs.is_null() && n > 0 {
        // SAFETY: `msgs` has `n` > 0 entries.
        let first = unsafe { &(*msgs).msg_hdr };
        // An unconnected tunnel UDP socket (or one the first message makes so): each message
        // is a record of its own, sent as sendmsg sends it.
        let addressed = datagram::addressed(fd).is_some()
            // SAFETY: the first entry's own destination.
            || matches!(unsafe { destination(fd, first.msg_name.cast(), first.msg_namelen) }, Destination::Addressed { .. });
        if addressed {
            let mut sent = 0;
            for i in 0..n as usize {
                // SAFETY: entry `i` < `n` of the caller's array.
                let m = unsafe { &mut *msgs.add(i) };
                // SAFETY: the entry's own header.
                let r = unsafe { sendmsg(fd, &m.msg_hdr, flags) };
                if r < 0 {
                    return if sent == 0 { -1 } else { sent };
                }
                m.msg_len = r as libc::c_uint;
                sent += 1;
            }
            return sent;
        }
    }
    let mut allowed = n;
    let mut refused = 0;
    let mut dropped = false;
    let mut unread = false;
    if settings().is_some() && !msgs.is_null() {
        for i in 0..n {
            // SAFETY: `msgs` has `n` entries, as sendmmsg(2) promises.
            let h = unsafe { &(*msgs.add(i as usize)).msg_hdr };
            // SAFETY: the entry's own destination.
            match unsafe { destination(fd, h.msg_name.cast(), h.msg_namelen) } {
                Destination::Refused(errno) => {
                    allowed = i;
                    refused = errno;
                    break;
                }
                Destination::Dropped => dropped = true,
                Destination::Unread => unread = true,
                // Taken above.
                Destination::Addressed { .. } | Destination::Kernel => {}
            }
        }
    }
    if dropped && allowed > 0 {
        // A tunnel TCP socket: the messages go without their destinations, from a copy,
        // and what was sent of each is reported in the caller's.
        // SAFETY: `msgs` has at least `allowed` entries.
        let mut copy: Vec<libc::mmsghdr> = unsafe { std::slice::from_raw_parts(msgs, allowed as usize) }.to_vec();
        for m in &mut copy {
            m.msg_hdr.msg_name = std::ptr::null_mut();
            m.msg_hdr.msg_namelen = 0;
        }
        // SAFETY: the copy has `allowed` entries, pointing at the caller's buffers.
        let sent = unsafe { real::sendmmsg(fd, copy.as_mut_ptr(), allowed, checked(flags)) };
        for (i, m) in copy.iter().enumerate().take(sent.max(0) as usize) {
            // SAFETY: `i` < `allowed`, an entry of the caller's array.
            unsafe { (*msgs.add(i)).msg_len = m.msg_len };
        }
        return sent;
    }
    if allowed == 0 && n > 0 {
        set_errno(refused);
        return -1;
    }
    // Marked only if every message's destination was read (none was, without the settings:
    // then the mark is not set at all).
    let flags = if unread || msgs.is_null() {
        flags
    } else {
        checked(flags)
    };
    // SAFETY: the caller's arguments, the count cut at the first refused message.
    unsafe { real::sendmmsg(fd, msgs, allowed, flags) }
}

/// Where a datagram read from `fd` came from, if `fd` is a tunnel UDP socket: its remote
/// (the only source a connected socket receives from), in the family it was made with.
fn datagram_source(fd: c_int) -> Option<(std::net::SocketAddr, c_int)> {
    if !sockets::any_datagram() {
        return None;
    }
    match tunnel_socket(fd)? {
        TunnelSocket {
            datagram: true,
            remote: Some(r),
            family,
            ..
        } => Some((r, family)),
        _ => None,
    }
}

/// recvfrom(2): the C library's; on a tunnel UDP socket, the source it reports is the
/// socket's remote (the stand-in has no such address to give).
///
/// # Safety
/// As recvfrom(2).
#[no_mangle]
pub unsafe extern "C" fn recvfrom(
    fd: c_int,
    buf: *mut libc::c_void,
    len: libc::size_t,
    flags: c_int,
    addr: *mut sockaddr,
    addr_len: *mut socklen_t,
) -> libc::ssize_t {
    if let Some(family) = datagram::addressed_family(fd) {
        let iov = libc::iovec {
            iov_base: buf,
            iov_len: len,
        };
        // SAFETY: one iovec of the caller's buffer; the caller's address buffer.
        return unsafe { datagram::recv(fd, family, &iov, 1, flags, addr, addr_len, std::ptr::null_mut()) };
    }
    // Only a caller asking where the datagram came from needs the look-up.
    let source = if addr.is_null() || addr_len.is_null() {
        None
    } else {
        datagram_source(fd)
    };
    // The kernel sets the length to the stand-in's (empty) source: the buffer's size is
    // taken first.
    // SAFETY: `addr_len` is non-null whenever `source` is set, and the caller's to read.
    let room = source.map(|_| unsafe { *addr_len });
    // SAFETY: the caller's arguments, unchanged.
    let n = unsafe { real::recvfrom(fd, buf, len, flags, addr, addr_len) };
    if let (true, Some((a, family)), Some(room)) = (n >= 0, source, room) {
        // SAFETY: the caller's address buffer of `room` bytes and its length, non-null.
        unsafe {
            *addr_len = room;
            addr::write(a, family, addr, addr_len);
        }
    }
    n
}

/// recvmsg(2): as [`recvfrom`], for the message's name.
///
/// # Safety
/// As recvmsg(2).
#[no_mangle]
pub unsafe extern "C" fn recvmsg(fd: c_int, msg: *mut libc::msghdr, flags: c_int) -> libc::ssize_t {
    if let (Some(family), false) = (datagram::addressed_family(fd), msg.is_null()) {
        // SAFETY: the caller's message header, as recvmsg(2) promises it.
        let m = unsafe { &mut *msg };
        // No control messages come with the stack's datagrams.
        m.msg_controllen = 0;
        let (name, name_len) = if m.msg_name.is_null() {
            (std::ptr::null_mut(), std::ptr::null_mut())
        } else {
            (m.msg_name.cast(), &mut m.msg_namelen as *mut socklen_t)
        };
        // SAFETY: the header's iovecs and name buffer, as recvmsg(2) promises them.
        return unsafe {
            datagram::recv(
                fd,
                family,
                m.msg_iov,
                m.msg_iovlen,
                flags,
                name,
                name_len,
                &mut m.msg_flags,
            )
        };
    }
    // SAFETY: `msg` is null or the caller's message header, as recvmsg(2) promises it.
    let source = if msg.is_null() || unsafe { (*msg).msg_name.is_null() } {
        None
    } else {
        datagram_source(fd)
    };
    // As in recvfrom: the name buffer's size, before the kernel overwrites it.
    // SAFETY: `msg` is non-null whenever `source` is set.
    let room = source.map(|_| unsafe { (*msg).msg_namelen });
    // SAFETY: the caller's arguments, unchanged.
    let n = unsafe { real::recvmsg(fd, msg, flags) };
    if let (true, Some((a, family)), Some(room)) = (n >= 0, source, room) {
        // SAFETY: the header's name buffer (non-null, checked above) of `room` bytes.
        unsafe {
            (*msg).msg_namelen = room;
            addr::write(a, family, (*msg).msg_name.cast(), &mut (*msg).msg_namelen);
        }
    }
    n
}

/// An unconnected tunnel socket's records into `msgs` ([`recvmmsg`]), one recvmsg each, as
/// the kernel fills them: the first as `flags` say; the others at once with MSG_WAITFORONE,
/// else waiting for each until `deadline` (the kernel looks at its timeout only after each
/// datagram, so a caller whose datagrams stop waits for ever there; here the wait ends at
/// the deadline), or without a deadline until all `n` came. A non-blocking socket returns
/// what was there. Returns how many were received, or -1 with errno if none.
///
/// # Safety
/// `msgs` points to `n` writable entries, as recvmmsg(2) promises.
unsafe fn receive_records(
    fd: c_int,
    msgs: *mut libc::mmsghdr,
    n: usize,
    flags: c_int,
    deadline: Option<Instant>,
) -> c_int {
    let one = flags & !libc::MSG_WAITFORONE;
    let mut got = 0;
    for i in 0..n {
        let f = if i == 0 {
            one
        } else if flags & libc::MSG_WAITFORONE != 0 {
            one | libc::MSG_DONTWAIT
        } else if let Some(d) = deadline {
            let left = d.saturating_duration_since(Instant::now());
            let mut p = libc::pollfd {
                fd,
                events: libc::POLLIN,
                revents: 0,
            };
            // Rounded up: poll's milliseconds end at or after the deadline, not before it.
            let ms = left.as_nanos().div_ceil(1_000_000).min(c_int::MAX as u128) as c_int;
            // SAFETY: one pollfd of ours. Interrupted or timed out: what came so far.
            if left.is_zero() || unsafe { libc::poll(&mut p, 1, ms) } <= 0 {
                break;
            }
            one | libc::MSG_DONTWAIT
        } else {
            one
        };
        // SAFETY: entry `i` < `n` of the caller's array.
        let m = unsafe { &mut *msgs.add(i) };
        // SAFETY: the entry's own header.
        let r = unsafe { recvmsg(fd, &mut m.msg_hdr, f) };
        if r < 0 {
            return if got == 0 { -1 } else { got };
        }
        m.msg_len = r as libc::c_uint;
        got += 1;
    }
    got
}

fn duration_of(t: &libc::timespec) -> Duration {
    Duration::new(t.tv_sec.max(0) as u64, t.tv_nsec.clamp(0, 999_999_999) as u32)
}

/// recvmmsg(2): as [`recvfrom`], for each message received.
///
/// # Safety
/// As recvmmsg(2).
#[no_mangle]
pub unsafe extern "C" fn recvmmsg(
    fd: c_int,
    msgs: *mut libc::mmsghdr,
    n: libc::c_uint,
    flags: c_int,
    timeout: *mut libc::timespec,
) -> c_int {
    if let (Some(_), false) = (datagram::addressed_family(fd), msgs.is_null()) {
        // SAFETY: `timeout` is null or the caller's, readable and writable.
        let deadline = unsafe { timeout.as_ref() }.map(|t| Instant::now() + duration_of(t));
        // SAFETY: `msgs` has `n` entries.
        let got = unsafe { receive_records(fd, msgs, n as usize, flags, deadline) };
        if let (Some(d), false) = (deadline, timeout.is_null()) {
            // As the kernel: the time that was left.
            let left = d.saturating_duration_since(Instant::now());
            // SAFETY: the caller's timespec, writable.
            unsafe {
                (*timeout).tv_sec = left.as_secs() as libc::time_t;
                (*timeout).tv_nsec = left.subsec_nanos() as libc::c_long;
            }
        }
        return got;
    }
    let source = if msgs.is_null() { None } else { datagram_source(fd) };
    // As in recvfrom: each name buffer's size, before the kernel overwrites it.
    let rooms: Vec<socklen_t> = match source {
        // SAFETY: `msgs` has `n` entries, as recvmmsg(2) promises.
        Some(_) => (0..n as usize)
            .map(|i| unsafe { (*msgs.add(i)).msg_hdr.msg_namelen })
            .collect(),
        None => Vec::new(),
    };
    // SAFETY: the caller's arguments, unchanged.
    let got = unsafe { real::recvmmsg(fd, msgs, n, flags, timeout) };
    if let Some((a, family)) = source {
        for (i, room) in rooms.iter().enumerate().take(got.max(0) as usize) {
            // SAFETY: the kernel filled the first `got` of the caller's `n` entries.
            let h = unsafe { &mut (*msgs.add(i)).msg_hdr };
            if !h.msg_name.is_null() {
                h.msg_namelen = *room;
                // SAFETY: the entry's name buffer of `room` bytes and its length field.
                unsafe { addr::write(a, family, h.msg_name.cast(), &mut h.msg_namelen) };
            }
        }
    }
    got
}

/// recv(2): on an unconnected tunnel UDP socket, the payload without its source.
///
/// # Safety
/// As recv(2).
#[no_mangle]
pub unsafe extern "C" fn recv(fd: c_int, buf: *mut libc::c_void, len: libc::size_t, flags: c_int) -> libc::ssize_t {
    if datagram::addressed_family(fd).is_some() {
        // SAFETY: the caller's arguments, as recvfrom(2) takes them.
        return unsafe { recvfrom(fd, buf, len, flags, std::ptr::null_mut(), std::ptr::null_mut()) };
    }
    // SAFETY: the caller's arguments, unchanged.
    unsafe { real::recv(fd, buf, len, flags) }
}

/// read(2): as [`recv`]; every other descriptor's read is the C library's after one look at
/// a slot (`sockets::addressed`).
///
/// # Safety
/// As read(2).
#[no_mangle]
pub unsafe extern "C" fn read(fd: c_int, buf: *mut libc::c_void, len: libc::size_t) -> libc::ssize_t {
    if let Some(family) = datagram::addressed_family(fd) {
        let iov = libc::iovec {
            iov_base: buf,
            iov_len: len,
        };
        let (name, name_len, msg_flags) = (std::ptr::null_mut(), std::ptr::null_mut(), std::ptr::null_mut());
        // SAFETY: one iovec of the caller's buffer.
        return unsafe { datagram::recv(fd, family, &iov, 1, 0, name, name_len, msg_flags) };
    }
    // SAFETY: the caller's arguments, unchanged.
    unsafe { real::read(fd, buf, len) }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::fd::AsRawFd;
    use std::os::unix::net::UnixDatagram;

    /// recvmmsg on an unconnected tunnel socket (its stand-in's records carry sources):
    /// what is there at once with MSG_WAITFORONE; with a timeout, the wait for more ends
    /// there and the time left is written back; with neither, it waits until all came.
    #[test]
    fn recvmmsg_on_a_tunnel_socket_waits_as_its_flags_and_timeout_say() {
        let (program, service) = UnixDatagram::pair().unwrap();
        let fd = program.as_raw_fd();
        sockets::mark_addressed(fd, sockets::socket_inode(fd).unwrap(), libc::AF_INET);
        let from: std::net::SocketAddr = "10.99.0.2:53".parse().unwrap();
        let send = move |s: &UnixDatagram, byte: u8| {
            let mut record = ordo_attach::Source(from).encode().to_vec();
            record.push(byte);
            s.send(&record).unwrap();
        };
        let mut bufs = [[0u8; 8]; 4];
        let mut iovs: Vec<libc::iovec> = (bufs.iter_mut())
            .map(|b| libc::iovec {
                iov_base: b.as_mut_ptr().cast(),
                iov_len: b.len(),
            })
            .collect();
        // SAFETY: mmsghdr is plain data; each gets one iovec of `bufs` below.
        let mut msgs: Vec<libc::mmsghdr> = (0..4).map(|_| unsafe { std::mem::zeroed() }).collect();
        for (m, iov) in msgs.iter_mut().zip(iovs.iter_mut()) {
            m.msg_hdr.msg_iov = iov;
            m.msg_hdr.msg_iovlen = 1;
        }
        let received = |msgs: &mut Vec<libc::mmsghdr>, flags, timeout: *mut libc::timespec| {
            // SAFETY: 4 entries, each with a live buffer; `timeout` null or ours.
            unsafe { recvmmsg(fd, msgs.as_mut_ptr(), 4, flags, timeout) }
        };

        send(&service, 1);
        send(&service, 2);
        assert_eq!(received(&mut msgs, libc::MSG_WAITFORONE, std::ptr::null_mut()), 2);
        assert_eq!((bufs[0][0], bufs[1][0], msgs[0].msg_len), (1, 2, 1));

        send(&service, 3);
        send(&service, 4);
        let mut timeout = libc::timespec {
            tv_sec: 0,
            tv_nsec: 100_000_000,
        };
        let start = Instant::now();
        assert_eq!(received(&mut msgs, 0, &mut timeout), 2);
        let waited = start.elapsed();
        assert!(
            waited >= Duration::from_millis(90) && waited < Duration::from_secs(5),
            "{waited:?}"
        );
        assert_eq!((timeout.tv_sec, timeout.tv_nsec), (0, 0), "no time left");

        send(&service, 5);
        send(&service, 6);
        let later = service.try_clone().unwrap();
        let sender = std::thread::spawn(move || {
            // The receiver is waiting by then, whenever it started.
            std::thread::sleep(Duration::from_millis(50));
            send(&later, 7);
            send(&later, 8);
        });
        assert_eq!(received(&mut msgs, 0, std::ptr::null_mut()), 4);
        assert_eq!(bufs.map(|b| b[0]), [5, 6, 7, 8]);
        sender.join().unwrap();
    }
}
