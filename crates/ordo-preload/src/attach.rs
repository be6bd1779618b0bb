//! Talking to the service: one fresh connection to its attach socket per request, so that a
//! forked child and its parent never share a conversation.

use crate::real;
use ordo_attach::rights::Rights;
use ordo_attach::{Reply, Request, REPLY_LEN};
use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::path::Path;

/// A Unix socket pair of type `ty` (SOCK_STREAM for a TCP connection, SOCK_SEQPACKET for a
/// listening socket or a UDP socket), close-on-exec.
pub fn socket_pair(ty: libc::c_int) -> io::Result<(OwnedFd, OwnedFd)> {
    let mut fds = [0 as libc::c_int; 2];
    // SAFETY: `fds` has room for the two descriptors socketpair writes.
    if unsafe { libc::socketpair(libc::AF_UNIX, ty | libc::SOCK_CLOEXEC, 0, fds.as_mut_ptr()) } < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: socketpair succeeded: both are open descriptors that nothing else owns.
    Ok(unsafe { (OwnedFd::from_raw_fd(fds[0]), OwnedFd::from_raw_fd(fds[1])) })
}

/// Sends `request` and the descriptors `pass` to the service at `socket`; waits for its reply.
pub fn ask(socket: &Path, request: &Request, pass: &[RawFd]) -> io::Result<Reply> {
    let control = send(socket, request, pass)?;
    let mut buf = [0u8; REPLY_LEN];
    read_exact(control.as_raw_fd(), &mut buf)?;
    decode(&buf)
}

/// Sends `request` and the descriptors `pass` to the service at `socket`, and returns the
/// connection on which the reply will come.
pub fn send(socket: &Path, request: &Request, pass: &[RawFd]) -> io::Result<OwnedFd> {
    // SAFETY: plain socket(2).
    let raw = unsafe { libc::socket(libc::AF_UNIX, libc::SOCK_STREAM | libc::SOCK_CLOEXEC, 0) };
    if raw < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: a descriptor socket(2) just returned, owned by nobody else.
    let control = unsafe { OwnedFd::from_raw_fd(raw) };
    connect_unix(control.as_raw_fd(), socket)?;
    if let Err(e) = send_with_fds(control.as_raw_fd(), &request.encode(), pass) {
        // A service that refuses this user says why and closes before the request is
        // sent: its answer (EACCES), if there is one, is the error.
        if let Ok(Some(reply)) = try_reply(control.as_raw_fd()) {
            if reply.errno != 0 {
                return Err(io::Error::from_raw_os_error(reply.errno));
            }
        }
        return Err(e);
    }
    Ok(control)
}

/// The reply on `control` if it has arrived whole (None: not yet). The service writes a reply
/// in one piece, far smaller than a socket buffer, so a reply is there whole or not at all.
pub fn try_reply(control: RawFd) -> io::Result<Option<Reply>> {
    let mut buf = [0u8; REPLY_LEN];
    // SAFETY: reading into `buf`, REPLY_LEN writable bytes.
    let n = unsafe {
        libc::recv(
            control,
            buf.as_mut_ptr().cast(),
            buf.len(),
            libc::MSG_DONTWAIT | libc::MSG_PEEK,
        )
    };
    if n < 0 {
        let e = io::Error::last_os_error();
        return match e.kind() {
            io::ErrorKind::WouldBlock | io::ErrorKind::Interrupted => Ok(None),
            _ => Err(e),
        };
    }
    if n == 0 {
        return Err(io::Error::new(
            io::ErrorKind::UnexpectedEof,
            "the service closed the request",
        ));
    }
    if (n as usize) < REPLY_LEN {
        return Ok(None);
    }
    read_exact(control, &mut buf)?;
    decode(&buf).map(Some)
}

fn decode(buf: &[u8]) -> io::Result<Reply> {
    Reply::decode(buf).map_err(|e| io::Error::new(io::ErrorKind::InvalidData, e))
}

fn connect_unix(fd: RawFd, path: &Path) -> io::Result<()> {
    use std::os::unix::ffi::OsStrExt;
    // SAFETY: sockaddr_un is plain data for which all zeros is valid.
    let mut sun: libc::sockaddr_un = unsafe { std::mem::zeroed() };
    sun.sun_family = libc::AF_UNIX as libc::sa_family_t;
    let bytes = path.as_os_str().as_bytes();
    if bytes.len() >= sun.sun_path.len() {
        return Err(io::Error::from_raw_os_error(libc::ENAMETOOLONG));
    }
    for (d, s) in sun.sun_path.iter_mut().zip(bytes) {
        *d = *s as libc::c_char;
    }
    let len = std::mem::size_of::<libc::sockaddr_un>() as libc::socklen_t;
    loop {
        // SAFETY: `sun` is a valid sockaddr_un of `len` bytes. Not our hook: a Unix socket is
        // never the tunnel's, and our hook must not see its own calls.
        if unsafe { real::connect_unix(fd, (&sun as *const libc::sockaddr_un).cast(), len) } == 0 {
            return Ok(());
        }
        let e = io::Error::last_os_error();
        if e.kind() != io::ErrorKind::Interrupted {
            return Err(e);
        }
    }
}

fn send_with_fds(fd: RawFd, bytes: &[u8], pass: &[RawFd]) -> io::Result<()> {
    let mut iov = libc::iovec {
        iov_base: bytes.as_ptr() as *mut libc::c_void,
        iov_len: bytes.len(),
    };
    let mut rights = Rights::default();
    let msg = rights.send_header(&mut iov, pass);
    loop {
        // SAFETY: `msg` describes `bytes` and the control buffer, both alive for the call.
        let n = unsafe { real::sendmsg(fd, &msg, libc::MSG_NOSIGNAL | ordo_attach::CHECKED_SEND) };
        if n == bytes.len() as isize {
            return Ok(());
        }
        if n >= 0 {
            return Err(io::Error::new(io::ErrorKind::WriteZero, "short request"));
        }
        let e = io::Error::last_os_error();
        if e.kind() != io::ErrorKind::Interrupted {
            return Err(e);
        }
    }
}

fn read_exact(fd: RawFd, buf: &mut [u8]) -> io::Result<()> {
    let mut got = 0;
    while got < buf.len() {
        // SAFETY: reading into the unfilled rest of `buf`.
        let n = unsafe { libc::recv(fd, buf[got..].as_mut_ptr().cast(), buf.len() - got, 0) };
        match n {
            0 => {
                return Err(io::Error::new(
                    io::ErrorKind::UnexpectedEof,
                    "the service closed the request",
                ))
            }
            n if n > 0 => got += n as usize,
            _ => {
                let e = io::Error::last_os_error();
                if e.kind() != io::ErrorKind::Interrupted {
                    return Err(e);
                }
            }
        }
    }
    Ok(())
}

/// The next connection the service sent over a listening socket `fd`: what it says, and its
/// descriptor (close-on-exec if asked). Blocks as the socket does (EAGAIN when non-blocking
/// and none waits).
pub fn recv_accepted(fd: RawFd, cloexec: bool) -> io::Result<(ordo_attach::Accepted, OwnedFd)> {
    let mut bytes = [0u8; ordo_attach::ACCEPTED_LEN];
    let mut iov = libc::iovec {
        iov_base: bytes.as_mut_ptr().cast(),
        iov_len: bytes.len(),
    };
    let mut rights = Rights::default();
    let mut msg = rights.recv_header(&mut iov);
    let flags = if cloexec { libc::MSG_CMSG_CLOEXEC } else { 0 };
    // SAFETY: `msg` points into `rights` and `iov`, alive for the call.
    let n = unsafe { real::recvmsg(fd, &mut msg, flags) };
    if n < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: filled by the recvmsg above; its descriptors are ours alone.
    let passed = unsafe { ordo_attach::rights::received(&msg) };
    if n == 0 {
        // The service is gone: the listening socket will give no more connections.
        return Err(io::Error::from_raw_os_error(libc::EINVAL));
    }
    let accepted = ordo_attach::Accepted::decode(&bytes[..n as usize])
        .map_err(|_| io::Error::from_raw_os_error(libc::ECONNABORTED))?;
    let conn = passed
        .into_iter()
        .next()
        .ok_or_else(|| io::Error::from_raw_os_error(libc::ECONNABORTED))?;
    Ok((accepted, conn))
}
