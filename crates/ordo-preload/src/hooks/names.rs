//! The name and option calls on tunnel sockets: getsockname, getpeername, setsockopt and
//! getsockopt answer as the TCP or UDP socket the program made would.

use super::listen::bound_socket;
use super::stream::connect_result;
use crate::sockets::TunnelSocket;
use crate::{addr, real, set_errno, sockets, tunnel_socket};
use libc::{c_int, sockaddr, socklen_t};

/// getsockname(2): a tunnel socket reports its address in the tunnel.
///
/// # Safety
/// As getsockname(2).
#[no_mangle]
pub unsafe extern "C" fn getsockname(fd: c_int, out: *mut sockaddr, len: *mut socklen_t) -> c_int {
    if let Some(TunnelSocket {
        family, local: Some(a), ..
    }) = tunnel_socket(fd)
    {
        // SAFETY: the caller's buffer and length, as getsockname(2) promises them.
        unsafe { addr::write(a, family, out, len) };
        return 0;
    }
    if let Some((a, family)) = bound_socket(fd) {
        // SAFETY: as above.
        unsafe { addr::write(a, family, out, len) };
        return 0;
    }
    // SAFETY: the caller's arguments, unchanged.
    unsafe { real::getsockname(fd, out, len) }
}

/// getpeername(2): a tunnel socket reports the address it connected to.
///
/// # Safety
/// As getpeername(2).
#[no_mangle]
pub unsafe extern "C" fn getpeername(fd: c_int, out: *mut sockaddr, len: *mut socklen_t) -> c_int {
    match tunnel_socket(fd) {
        Some(TunnelSocket {
            family,
            remote: Some(a),
            ..
        }) => {
            // SAFETY: as above.
            unsafe { addr::write(a, family, out, len) };
            return 0;
        }
        // No remote (a listening socket, an unconnected UDP one): as the kernel's, not the
        // stand-in's own (unnamed) peer.
        Some(_) => {
            set_errno(libc::ENOTCONN);
            return -1;
        }
        None => {}
    }
    // SAFETY: the caller's arguments, unchanged.
    unsafe { real::getpeername(fd, out, len) }
}

/// setsockopt(2): on a tunnel socket, the TCP and IP options are the stack's business, not
/// the Unix socket's (which would refuse them): they are taken and succeed. Socket-level
/// options go to the Unix socket, where those that make sense there (buffer sizes,
/// timeouts) act.
///
/// # Safety
/// As setsockopt(2).
#[no_mangle]
pub unsafe extern "C" fn setsockopt(
    fd: c_int,
    level: c_int,
    name: c_int,
    value: *const libc::c_void,
    len: socklen_t,
) -> c_int {
    if tunnel_socket(fd).is_some() {
        match level {
            libc::IPPROTO_TCP | libc::IPPROTO_IP | libc::IPPROTO_IPV6 => return 0,
            _ => {
                // SAFETY: the caller's arguments, unchanged.
                let r = unsafe { real::setsockopt(fd, level, name, value, len) };
                let e = std::io::Error::last_os_error().raw_os_error();
                if r != 0 && matches!(e, Some(libc::ENOPROTOOPT) | Some(libc::EOPNOTSUPP)) {
                    return 0;
                }
                return r;
            }
        }
    }
    // SAFETY: the caller's arguments, unchanged.
    unsafe { real::setsockopt(fd, level, name, value, len) }
}

/// getsockopt(2): a tunnel socket answers as the TCP socket it stands for: its family and
/// protocol, and plausible TCP figures (TCP_INFO says established; the stack's own figures
/// are not reported yet).
///
/// # Safety
/// As getsockopt(2).
#[no_mangle]
pub unsafe extern "C" fn getsockopt(
    fd: c_int,
    level: c_int,
    name: c_int,
    value: *mut libc::c_void,
    len: *mut socklen_t,
) -> c_int {
    if let Some(t) = tunnel_socket(fd) {
        let int = match (level, name) {
            // A non-blocking connect's result, once: as the kernel reports it, then clears it.
            (libc::SOL_SOCKET, libc::SO_ERROR) if t.pending.is_some() || t.error != 0 => {
                let errno = if t.pending.is_some() {
                    connect_result(&t).unwrap_or(0)
                } else {
                    t.error
                };
                sockets::update(t.inode, |e| e.error = 0);
                Some(errno)
            }
            (libc::SOL_SOCKET, libc::SO_DOMAIN) => Some(t.family),
            (libc::SOL_SOCKET, libc::SO_PROTOCOL) if t.datagram => Some(libc::IPPROTO_UDP),
            (libc::SOL_SOCKET, libc::SO_PROTOCOL) => Some(libc::IPPROTO_TCP),
            // The stand-in of a UDP socket is a seqpacket socket: it answers as what it stands for.
            (libc::SOL_SOCKET, libc::SO_TYPE) if t.datagram => Some(libc::SOCK_DGRAM),
            (libc::IPPROTO_TCP, libc::TCP_INFO) => {
                // SAFETY: tcp_info is plain data; all zeros is valid.
                let mut info: libc::tcp_info = unsafe { std::mem::zeroed() };
                info.tcpi_state = 1; // TCP_ESTABLISHED
                                     // SAFETY: the caller's buffer of `*len` bytes.
                unsafe { copy_out(&info, value, len) };
                return 0;
            }
            (libc::IPPROTO_TCP, libc::TCP_MAXSEG) => Some(1380),
            (libc::IPPROTO_TCP, _) | (libc::IPPROTO_IP, _) | (libc::IPPROTO_IPV6, _) => Some(0),
            _ => None,
        };
        if let Some(v) = int {
            // SAFETY: as above.
            unsafe { copy_out(&v, value, len) };
            return 0;
        }
    }
    // SAFETY: the caller's arguments, unchanged.
    unsafe { real::getsockopt(fd, level, name, value, len) }
}

/// Copies `v` into a getsockopt buffer: truncated to `*len`, `*len` set to what was written.
///
/// # Safety
/// `out` has `*len` writable bytes; `len` is writable.
unsafe fn copy_out<T>(v: &T, out: *mut libc::c_void, len: *mut socklen_t) {
    if out.is_null() || len.is_null() {
        return;
    }
    // SAFETY: the caller's buffer; we copy at most `*len` bytes of `v`.
    unsafe {
        let n = (*len as usize).min(std::mem::size_of::<T>());
        std::ptr::copy_nonoverlapping((v as *const T).cast::<u8>(), out.cast::<u8>(), n);
        *len = n as socklen_t;
    }
}
