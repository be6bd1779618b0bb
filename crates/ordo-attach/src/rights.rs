//! Descriptors passed over a Unix socket (SCM_RIGHTS), as both ends of the protocol pass
//! them: the control-message buffer and the message header over it, and the descriptors a
//! received message carried. The system calls stay with the caller: the preload library
//! makes them through the C library's own functions, never through its own hooks.

use std::os::fd::{FromRawFd, OwnedFd, RawFd};

/// Descriptors one message carries at most.
pub const MAX_FDS: usize = 8;

/// A control-message buffer, aligned as `cmsghdr` wants, with room for [`MAX_FDS`].
#[derive(Default)]
pub struct Rights {
    buf: [u64; 8],
}

impl Rights {
    /// A header for sendmsg of `iov` with `fds` (at most [`MAX_FDS`]). The header points into
    /// `self` and `iov`: both must outlive the call it is used in.
    pub fn send_header(&mut self, iov: &mut libc::iovec, fds: &[RawFd]) -> libc::msghdr {
        assert!(!fds.is_empty() && fds.len() <= MAX_FDS);
        let fds_len = std::mem::size_of_val(fds) as u32;
        let mut msg = self.header(iov);
        // SAFETY: CMSG_SPACE only computes a size.
        msg.msg_controllen = unsafe { libc::CMSG_SPACE(fds_len) } as usize;
        // SAFETY: msg_control points to `self.buf`, larger than CMSG_SPACE of MAX_FDS
        // descriptors; CMSG_FIRSTHDR and CMSG_DATA stay inside it.
        unsafe {
            let c = libc::CMSG_FIRSTHDR(&msg);
            (*c).cmsg_level = libc::SOL_SOCKET;
            (*c).cmsg_type = libc::SCM_RIGHTS;
            (*c).cmsg_len = libc::CMSG_LEN(fds_len) as usize;
            for (i, fd) in fds.iter().enumerate() {
                std::ptr::write_unaligned(libc::CMSG_DATA(c).cast::<RawFd>().add(i), *fd);
            }
        }
        msg
    }

    /// A header for recvmsg into `iov`, with room for [`MAX_FDS`] descriptors (the kernel
    /// closes any beyond). The header points into `self` and `iov`, as above.
    pub fn recv_header(&mut self, iov: &mut libc::iovec) -> libc::msghdr {
        let mut msg = self.header(iov);
        msg.msg_controllen = std::mem::size_of_val(&self.buf);
        msg
    }

    fn header(&mut self, iov: &mut libc::iovec) -> libc::msghdr {
        // SAFETY: msghdr is plain data for which all zeros is valid.
        let mut msg: libc::msghdr = unsafe { std::mem::zeroed() };
        msg.msg_iov = iov;
        msg.msg_iovlen = 1;
        msg.msg_control = self.buf.as_mut_ptr().cast();
        msg
    }
}

/// The descriptors the message in `msg` carried, now the caller's.
///
/// # Safety
/// `msg` is a header from [`Rights::recv_header`] that a successful recvmsg filled, its
/// buffer still alive; its descriptors are taken by nothing else.
pub unsafe fn received(msg: &libc::msghdr) -> Vec<OwnedFd> {
    let mut fds = Vec::new();
    // SAFETY: walking the control messages the kernel wrote, within msg_controllen; each
    // SCM_RIGHTS payload is an array of descriptors (the caller's contract: ours alone).
    unsafe {
        let mut c = libc::CMSG_FIRSTHDR(msg);
        while !c.is_null() {
            if (*c).cmsg_level == libc::SOL_SOCKET && (*c).cmsg_type == libc::SCM_RIGHTS {
                let data = libc::CMSG_DATA(c).cast::<RawFd>();
                let count = ((*c).cmsg_len - libc::CMSG_LEN(0) as usize) / std::mem::size_of::<RawFd>();
                for k in 0..count {
                    fds.push(OwnedFd::from_raw_fd(std::ptr::read_unaligned(data.add(k))));
                }
            }
            c = libc::CMSG_NXTHDR(msg, c);
        }
    }
    fds
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::fd::AsRawFd;

    /// Two descriptors sent with bytes arrive with them, open, as new descriptors.
    #[test]
    fn descriptors_cross_a_socket_pair() {
        let mut sv = [0; 2];
        // SAFETY: `sv` has room for the pair.
        assert_eq!(
            unsafe { libc::socketpair(libc::AF_UNIX, libc::SOCK_STREAM, 0, sv.as_mut_ptr()) },
            0
        );
        // SAFETY: fresh descriptors.
        let (a, b) = unsafe { (OwnedFd::from_raw_fd(sv[0]), OwnedFd::from_raw_fd(sv[1])) };
        let mut bytes = *b"hello";
        let mut iov = libc::iovec {
            iov_base: bytes.as_mut_ptr().cast(),
            iov_len: bytes.len(),
        };
        let mut rights = Rights::default();
        let msg = rights.send_header(&mut iov, &[a.as_raw_fd(), b.as_raw_fd()]);
        // SAFETY: `msg` points into `rights` and `iov`, alive here.
        assert_eq!(unsafe { libc::sendmsg(a.as_raw_fd(), &msg, 0) }, 5);
        let mut got = [0u8; 5];
        let mut iov = libc::iovec {
            iov_base: got.as_mut_ptr().cast(),
            iov_len: got.len(),
        };
        let mut rights = Rights::default();
        let mut msg = rights.recv_header(&mut iov);
        // SAFETY: as above.
        assert_eq!(unsafe { libc::recvmsg(b.as_raw_fd(), &mut msg, 0) }, 5);
        // SAFETY: filled by recvmsg just now.
        let fds = unsafe { received(&msg) };
        assert_eq!(&got, b"hello");
        assert_eq!(fds.len(), 2);
        assert!(fds
            .iter()
            .all(|f| f.as_raw_fd() != a.as_raw_fd() && f.as_raw_fd() != b.as_raw_fd()));
    }
}
