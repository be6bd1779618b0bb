//! Socket options: the offloads asked for and looked up.

use std::net::UdpSocket;
use std::os::fd::AsRawFd;

/// From linux/udp.h (not in the libc crate for glibc targets).
pub(crate) const UDP_SEGMENT: libc::c_int = 103;
pub(crate) const UDP_GRO: libc::c_int = 104;

/// Sets an integer socket option; returns whether the kernel accepted it.
pub fn set_int_option(fd: &impl AsRawFd, level: libc::c_int, option: libc::c_int, value: libc::c_int) -> bool {
    // SAFETY: setsockopt reads one int from a live local.
    let rc = unsafe {
        libc::setsockopt(
            fd.as_raw_fd(),
            level,
            option,
            &value as *const _ as *const libc::c_void,
            std::mem::size_of::<libc::c_int>() as libc::socklen_t,
        )
    };
    rc == 0
}

/// Asks the kernel to coalesce received datagrams (UDP GRO); returns whether it agreed.
pub fn enable_gro(sock: &UdpSocket) -> bool {
    set_int_option(sock, libc::SOL_UDP, UDP_GRO, 1)
}

/// Turns UDP GRO off again: the kernel then merges no datagrams for this port.
pub fn disable_gro(sock: &UdpSocket) -> bool {
    set_int_option(sock, libc::SOL_UDP, UDP_GRO, 0)
}
/// Whether the kernel offers UDP GSO on this socket (it answers for UDP_SEGMENT); asked
/// once per socket, so that a send's error is not taken for a missing feature.
pub fn gso_supported(sock: &UdpSocket) -> bool {
    let mut value: libc::c_int = 0;
    let mut len = std::mem::size_of::<libc::c_int>() as libc::socklen_t;
    // SAFETY: getsockopt writes at most `len` bytes into a live local int.
    let rc = unsafe {
        libc::getsockopt(
            sock.as_raw_fd(),
            libc::SOL_UDP,
            UDP_SEGMENT,
            &mut value as *mut libc::c_int as *mut libc::c_void,
            &mut len,
        )
    };
    rc == 0
}
