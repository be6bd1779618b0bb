//! Descriptor helpers of the service: what a passed descriptor is, non-blocking mode,
//! reading a request with its descriptors, socket pairs.

use ordo_attach::rights::Rights;
use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};

pub(super) fn errno_of(e: &io::Error) -> i32 {
    e.raw_os_error().unwrap_or(libc::EIO)
}

/// A non-blocking Unix stream pair: ours, and the application's.
pub(super) fn stream_pair() -> io::Result<(OwnedFd, OwnedFd)> {
    let mut fds = [0 as libc::c_int; 2];
    let flags = libc::SOCK_STREAM | libc::SOCK_CLOEXEC;
    // SAFETY: `fds` has room for the two descriptors socketpair writes.
    if unsafe { libc::socketpair(libc::AF_UNIX, flags, 0, fds.as_mut_ptr()) } < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: socketpair succeeded: both are open descriptors that nothing else owns.
    let (ours, theirs) = unsafe { (OwnedFd::from_raw_fd(fds[0]), OwnedFd::from_raw_fd(fds[1])) };
    set_nonblocking(ours.as_raw_fd())?;
    Ok((ours, theirs))
}

/// Whether a datagram or record fits in `fd`'s send buffer now.
pub(super) fn writable(fd: RawFd) -> bool {
    let mut p = pollfd(fd, libc::POLLOUT);
    // SAFETY: one valid pollfd, no waiting.
    unsafe { libc::poll(&mut p, 1, 0) == 1 && p.revents & libc::POLLOUT != 0 }
}

/// An int option of a socket at SOL_SOCKET.
pub(super) fn socket_int(fd: RawFd, opt: libc::c_int) -> Option<libc::c_int> {
    let mut v: libc::c_int = -1;
    let mut len = std::mem::size_of::<libc::c_int>() as libc::socklen_t;
    // SAFETY: `v` and `len` are a valid buffer for an int socket option.
    let r = unsafe { libc::getsockopt(fd, libc::SOL_SOCKET, opt, (&mut v as *mut libc::c_int).cast(), &mut len) };
    (r == 0).then_some(v)
}

fn pollfd(fd: RawFd, events: i16) -> libc::pollfd {
    libc::pollfd { fd, events, revents: 0 }
}

pub(super) fn set_nonblocking(fd: RawFd) -> io::Result<()> {
    // SAFETY: fcntl on a descriptor we own.
    let flags = unsafe { libc::fcntl(fd, libc::F_GETFL) };
    // SAFETY: as above.
    if flags < 0 || unsafe { libc::fcntl(fd, libc::F_SETFL, flags | libc::O_NONBLOCK) } < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

/// Whether `fd` is a Unix stream socket (what the protocol passes), not any other file an
/// application might send instead.
pub(super) fn is_unix_stream(fd: RawFd) -> bool {
    is_unix(fd, libc::SOCK_STREAM)
}

/// Whether `fd` is a Unix socket of type `ty`.
pub(super) fn is_unix(fd: RawFd, ty: libc::c_int) -> bool {
    socket_int(fd, libc::SO_DOMAIN) == Some(libc::AF_UNIX) && socket_int(fd, libc::SO_TYPE) == Some(ty)
}

/// Reads up to `max` bytes and the descriptors passed with them. Empty bytes and no
/// descriptor: the other end closed.
pub(super) fn recv_with_fds(fd: RawFd, max: usize) -> io::Result<(Vec<u8>, Vec<OwnedFd>)> {
    let mut bytes = vec![0u8; max];
    let mut iov = libc::iovec {
        iov_base: bytes.as_mut_ptr().cast(),
        iov_len: bytes.len(),
    };
    let mut rights = Rights::default();
    let mut msg = rights.recv_header(&mut iov);
    // SAFETY: `msg` points into `rights` and `iov`, alive for the call.
    let n = unsafe { libc::recvmsg(fd, &mut msg, libc::MSG_CMSG_CLOEXEC | libc::MSG_DONTWAIT) };
    if n < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: filled by the recvmsg above; its descriptors are ours alone.
    let fds = unsafe { ordo_attach::rights::received(&msg) };
    bytes.truncate(n as usize);
    Ok((bytes, fds))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::net::{UnixDatagram, UnixStream};

    fn seqpacket_pair() -> (OwnedFd, OwnedFd) {
        let mut fds = [0 as libc::c_int; 2];
        // SAFETY: `fds` has room for the two descriptors socketpair writes.
        assert_eq!(
            unsafe { libc::socketpair(libc::AF_UNIX, libc::SOCK_SEQPACKET, 0, fds.as_mut_ptr()) },
            0
        );
        // SAFETY: both are open descriptors that nothing else owns.
        unsafe { (OwnedFd::from_raw_fd(fds[0]), OwnedFd::from_raw_fd(fds[1])) }
    }

    fn nonblocking(fd: RawFd) -> bool {
        // SAFETY: fcntl on an open descriptor.
        unsafe { libc::fcntl(fd, libc::F_GETFL) & libc::O_NONBLOCK != 0 }
    }

    #[test]
    fn a_passed_descriptor_is_told_by_its_domain_and_type() {
        let (stream, _) = UnixStream::pair().unwrap();
        let (seqpacket, _) = seqpacket_pair();
        let (datagram, _) = UnixDatagram::pair().unwrap();
        let udp = std::net::UdpSocket::bind("127.0.0.1:0").unwrap();
        let file = std::fs::File::open("/dev/null").unwrap();
        assert!(is_unix_stream(stream.as_raw_fd()));
        assert!(!is_unix_stream(seqpacket.as_raw_fd()) && is_unix(seqpacket.as_raw_fd(), libc::SOCK_SEQPACKET));
        assert!(!is_unix_stream(datagram.as_raw_fd()));
        assert!(!is_unix_stream(udp.as_raw_fd()) && !is_unix(udp.as_raw_fd(), libc::SOCK_DGRAM));
        assert!(!is_unix_stream(file.as_raw_fd()), "not a socket at all");
        assert_eq!(socket_int(file.as_raw_fd(), libc::SO_TYPE), None);
    }

    #[test]
    fn a_request_comes_with_its_descriptors_and_a_closed_end_reads_empty() {
        let (ours, theirs) = UnixStream::pair().unwrap();
        set_nonblocking(ours.as_raw_fd()).unwrap();
        assert!(nonblocking(ours.as_raw_fd()));
        let err = recv_with_fds(ours.as_raw_fd(), 16).unwrap_err();
        assert_eq!(err.kind(), io::ErrorKind::WouldBlock);
        let (passed, _keep) = UnixStream::pair().unwrap();
        let bytes = *b"request";
        let mut iov = libc::iovec {
            iov_base: bytes.as_ptr() as *mut libc::c_void,
            iov_len: bytes.len(),
        };
        let mut rights = Rights::default();
        let msg = rights.send_header(&mut iov, &[passed.as_raw_fd()]);
        // SAFETY: `msg` points into `rights` and `iov`, alive for the call.
        assert_eq!(
            unsafe { libc::sendmsg(theirs.as_raw_fd(), &msg, 0) },
            bytes.len() as isize
        );
        let (got, fds) = recv_with_fds(ours.as_raw_fd(), 16).unwrap();
        assert_eq!(got, b"request");
        assert_eq!(fds.len(), 1);
        assert!(is_unix_stream(fds[0].as_raw_fd()));
        assert_ne!(fds[0].as_raw_fd(), passed.as_raw_fd(), "a descriptor of our own");
        drop(theirs);
        let (got, fds) = recv_with_fds(ours.as_raw_fd(), 16).unwrap();
        assert!(got.is_empty() && fds.is_empty(), "the other end closed");
    }

    #[test]
    fn a_stream_pair_is_non_blocking_on_our_side_and_writable_until_full() {
        let (ours, theirs) = stream_pair().unwrap();
        assert!(nonblocking(ours.as_raw_fd()) && !nonblocking(theirs.as_raw_fd()));
        assert!(is_unix_stream(ours.as_raw_fd()) && is_unix_stream(theirs.as_raw_fd()));
        assert!(writable(ours.as_raw_fd()));
        let chunk = [0u8; 65536];
        // SAFETY: writing `chunk` to our non-blocking descriptor until it would block.
        while unsafe { libc::write(ours.as_raw_fd(), chunk.as_ptr().cast(), chunk.len()) } > 0 {}
        assert!(!writable(ours.as_raw_fd()), "its buffer is full");
        assert_eq!(errno_of(&io::Error::from_raw_os_error(libc::EAGAIN)), libc::EAGAIN);
        assert_eq!(errno_of(&io::Error::other("no errno")), libc::EIO);
    }
}
