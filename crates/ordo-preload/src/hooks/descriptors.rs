//! The descriptor calls that must know tunnel sockets: epoll registrations made again on a
//! stand-in, and dup, fcntl and ioctl keeping the table of tunnel sockets true.

use crate::{datagram, epoll, real, settings, sockets};
use libc::c_int;

/// epoll_ctl(2): the C library's, and a note of each socket's registration, so that a
/// socket registered before it connects keeps its registration through the swap.
///
/// # Safety
/// As epoll_ctl(2).
#[no_mangle]
pub unsafe extern "C" fn epoll_ctl(epfd: c_int, op: c_int, fd: c_int, event: *mut libc::epoll_event) -> c_int {
    // SAFETY: the caller's arguments, unchanged.
    let r = unsafe { real::epoll_ctl(epfd, op, fd, event) };
    if r == 0 && settings().is_some() {
        // SAFETY: for ADD and MOD, epoll_ctl just read `event`, so it is readable; it may be
        // unaligned (the structure is packed on some targets).
        let e = (!event.is_null() && op != libc::EPOLL_CTL_DEL).then(|| unsafe { std::ptr::read_unaligned(event) });
        let _ = std::panic::catch_unwind(|| epoll::note(epfd, op, fd, e));
    }
    r
}

/// A descriptor copied from `fd` (the result of a dup, `copy`) is marked as `fd` is: the
/// receive hooks take the headers off an unconnected tunnel UDP socket's copies too.
fn copied(fd: c_int, copy: c_int) {
    if copy >= 0 {
        sockets::mark_copy(fd, copy);
    }
}

/// dup(2), as the C library's, the copy marked as the original ([`copied`]).
///
/// # Safety
/// As dup(2).
#[no_mangle]
pub unsafe extern "C" fn dup(fd: c_int) -> c_int {
    // SAFETY: the caller's arguments, unchanged.
    let copy = unsafe { real::dup(fd) };
    copied(fd, copy);
    copy
}

/// dup2(2), as [`dup`].
///
/// # Safety
/// As dup2(2).
#[no_mangle]
pub unsafe extern "C" fn dup2(fd: c_int, to: c_int) -> c_int {
    // SAFETY: the caller's arguments, unchanged.
    let copy = unsafe { real::dup2(fd, to) };
    copied(fd, copy);
    copy
}

/// dup3(2), as [`dup`].
///
/// # Safety
/// As dup3(2).
#[no_mangle]
pub unsafe extern "C" fn dup3(fd: c_int, to: c_int, flags: c_int) -> c_int {
    // SAFETY: the caller's arguments, unchanged.
    let copy = unsafe { real::dup3(fd, to, flags) };
    copied(fd, copy);
    copy
}

/// fcntl(2), as the C library's; F_DUPFD and F_DUPFD_CLOEXEC as [`dup`]. The C declaration
/// is variadic; its one optional argument arrives as the third (an int or a pointer, in a
/// register of its own either way on the ABIs this library is built for).
///
/// # Safety
/// As fcntl(2).
#[no_mangle]
pub unsafe extern "C" fn fcntl(fd: c_int, cmd: c_int, arg: libc::c_ulong) -> c_int {
    // SAFETY: the caller's arguments, unchanged.
    let r = unsafe { real::fcntl(fd, cmd, arg) };
    if cmd == libc::F_DUPFD || cmd == libc::F_DUPFD_CLOEXEC {
        copied(fd, r);
    }
    r
}

/// fcntl64: what programs built with 64-bit file offsets call for fcntl (glibc's headers
/// rename it), as [`fcntl`].
///
/// # Safety
/// As fcntl(2).
#[no_mangle]
pub unsafe extern "C" fn fcntl64(fd: c_int, cmd: c_int, arg: libc::c_ulong) -> c_int {
    // SAFETY: the caller's arguments, unchanged.
    let r = unsafe { real::fcntl64(fd, cmd, arg) };
    if cmd == libc::F_DUPFD || cmd == libc::F_DUPFD_CLOEXEC {
        copied(fd, r);
    }
    r
}

/// ioctl(2), as the C library's; FIONREAD on an unconnected tunnel UDP socket counts the next
/// datagram's payload, as the kernel's UDP does, not the source the service's record starts
/// with. Variadic in C, as [`fcntl`].
///
/// # Safety
/// As ioctl(2).
#[no_mangle]
pub unsafe extern "C" fn ioctl(fd: c_int, request: libc::c_ulong, arg: *mut libc::c_void) -> c_int {
    // SAFETY: the caller's arguments, unchanged.
    let r = unsafe { real::ioctl(fd, request, arg) };
    if r == 0
        && request == libc::FIONREAD as libc::c_ulong
        && !arg.is_null()
        && datagram::addressed_family(fd).is_some()
    {
        let n = arg.cast::<c_int>();
        // SAFETY: FIONREAD's argument is an int the call just wrote.
        unsafe { *n = (*n - ordo_attach::SOURCE_LEN as c_int).max(0) };
    }
    r
}
