//! Whether an application's end of a Unix socket is gone: how the service learns that a
//! program closed a socket or ended, since nothing else tells it.

use std::os::fd::RawFd;

/// Whether the other end of `fd` is closed (a read would give end of file). For a socket the
/// application never writes to (a listening socket's pair), anything else means open.
pub fn peer_closed(fd: RawFd) -> bool {
    let mut b = [0u8; 1];
    // SAFETY: peeking at most one byte into `b`.
    let n = unsafe { libc::recv(fd, b.as_mut_ptr().cast(), 1, libc::MSG_PEEK | libc::MSG_DONTWAIT) };
    n == 0
}

/// Whether the other end of the Unix socket `fd` is closed (POLLHUP), whatever it left
/// unread on ours.
pub fn hung_up(fd: RawFd) -> bool {
    let mut p = libc::pollfd {
        fd,
        events: 0,
        revents: 0,
    };
    // SAFETY: one valid pollfd, no wait.
    let r = unsafe { libc::poll(&mut p, 1, 0) };
    r > 0 && p.revents & (libc::POLLHUP | libc::POLLERR) != 0
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::fd::AsRawFd;
    use std::os::unix::net::UnixStream;

    #[test]
    fn a_closed_end_is_seen_whatever_is_left_unread() {
        let (ours, theirs) = UnixStream::pair().unwrap();
        assert!(!hung_up(ours.as_raw_fd()) && !peer_closed(ours.as_raw_fd()));
        std::io::Write::write_all(&mut &theirs, b"x").unwrap();
        drop(theirs);
        assert!(hung_up(ours.as_raw_fd()), "closed, with a byte unread");
        assert!(!peer_closed(ours.as_raw_fd()), "a byte is still there to read");
    }
}
