//! A program's descriptor replaced by the service's answer: the request sent with one end of
//! a fresh Unix socket pair, and, once the service said yes, the other end put in place of
//! the program's descriptor (the stand-in), its flags and epoll registrations kept.

use crate::{attach, epoll, fail, fail_closed, real, set_errno, sockets, Settings};
use libc::c_int;
use ordo_attach::Request;
use std::os::fd::{AsRawFd, IntoRawFd};

/// Sends `request` to the service with one end of a fresh Unix socket pair of type `ty` (and
/// the program's `fd` itself if `with_fd`) and, once it has answered yes, puts the other end
/// in place of the program's `fd` ([`swap_in`]). Returns the reply and the stand-in's inode,
/// or the value the program's call returns (errno set): the service's refusal, or failing
/// closed without it.
pub(crate) fn stand_in_from_service(
    s: &Settings,
    fd: c_int,
    ty: c_int,
    request: &Request,
    with_fd: bool,
) -> Result<(ordo_attach::Reply, Option<u64>), c_int> {
    let (mine, theirs) = attach::socket_pair(ty).map_err(fail)?;
    // The program's O_NONBLOCK, read before the service may change it on the socket passed
    // to it (which shares the program's open file until the swap).
    // SAFETY: fcntl on the program's descriptor, reading flags only.
    let status = unsafe { real::fcntl(fd, libc::F_GETFL, 0) };
    let pass = [theirs.as_raw_fd(), fd];
    let pass = if with_fd { &pass[..] } else { &pass[..1] };
    let reply = match attach::ask(&s.socket, request, pass) {
        Ok(r) if r.errno != 0 => {
            set_errno(r.errno);
            return Err(-1);
        }
        Ok(r) => r,
        Err(e) => return Err(fail_closed(e)),
    };
    drop(theirs);
    let inode = swap_in(fd, mine, status).map_err(|()| -1)?;
    Ok((reply, inode))
}

/// Puts `stand_in` in place of the program's descriptor `fd`: the same number, its
/// O_NONBLOCK (which lives in the open file: `status` is its F_GETFL) and FD_CLOEXEC (in the
/// descriptor) kept, its epoll registrations carried over. Returns the stand-in's inode (None
/// if it cannot be read, which leaves the socket working but unnamed); Err with errno set if
/// `fd` was not replaced.
pub(crate) fn swap_in(fd: c_int, stand_in: std::os::fd::OwnedFd, status: c_int) -> Result<Option<u64>, ()> {
    // SAFETY: fcntl on the program's descriptor, reading flags only.
    let fd_flags = unsafe { real::fcntl(fd, libc::F_GETFD, 0) };
    let cloexec = if fd_flags >= 0 && fd_flags & libc::FD_CLOEXEC != 0 {
        libc::O_CLOEXEC
    } else {
        0
    };
    let old_inode = sockets::socket_inode(fd);
    let raw = stand_in.into_raw_fd();
    // SAFETY: both are open descriptors; dup3 atomically replaces `fd`'s file.
    let r = unsafe { real::dup3(raw, fd, cloexec) };
    // SAFETY: `raw` is ours (into_raw_fd above) and no longer needed.
    unsafe { libc::close(raw) };
    if r < 0 {
        return Err(());
    }
    if status >= 0 && status & libc::O_NONBLOCK != 0 {
        // SAFETY: setting a status flag on the descriptor we just put in place.
        unsafe { real::fcntl(fd, libc::F_SETFL, libc::O_NONBLOCK as libc::c_ulong) };
    }
    let inode = sockets::socket_inode(fd);
    if let (Some(old), Some(new)) = (old_inode, inode) {
        epoll::carry_over(fd, old, new);
    }
    Ok(inode)
}
