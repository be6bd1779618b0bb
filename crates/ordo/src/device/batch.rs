//! Batched UDP I/O: recvmmsg and sendmmsg move up to [`BATCH`] datagrams per system call.

use std::io;
use std::mem::MaybeUninit;
use std::net::{SocketAddr, SocketAddrV4, SocketAddrV6, UdpSocket};
use std::os::fd::AsRawFd;

/// Datagrams per system call and per work item.
pub const BATCH: usize = 32;

/// A received datagram: its bytes and where it came from.
pub struct Datagram {
    pub data: Vec<u8>,
    pub src: SocketAddr,
}

fn to_socket_addr(ss: &libc::sockaddr_storage) -> Option<SocketAddr> {
    match ss.ss_family as i32 {
        libc::AF_INET => {
            // SAFETY: the family says the storage holds a sockaddr_in, which it is large enough for.
            let a = unsafe { &*(ss as *const _ as *const libc::sockaddr_in) };
            Some(SocketAddr::V4(SocketAddrV4::new(
                u32::from_be(a.sin_addr.s_addr).into(),
                u16::from_be(a.sin_port),
            )))
        }
        libc::AF_INET6 => {
            // SAFETY: as above, for sockaddr_in6.
            let a = unsafe { &*(ss as *const _ as *const libc::sockaddr_in6) };
            Some(SocketAddr::V6(SocketAddrV6::new(
                a.sin6_addr.s6_addr.into(),
                u16::from_be(a.sin6_port),
                a.sin6_flowinfo,
                a.sin6_scope_id,
            )))
        }
        _ => None,
    }
}

fn from_socket_addr(a: &SocketAddr, ss: &mut libc::sockaddr_storage) -> libc::socklen_t {
    match a {
        SocketAddr::V4(v4) => {
            // SAFETY: sockaddr_storage is large enough and suitably aligned for sockaddr_in.
            let s = unsafe { &mut *(ss as *mut _ as *mut libc::sockaddr_in) };
            s.sin_family = libc::AF_INET as libc::sa_family_t;
            s.sin_port = v4.port().to_be();
            s.sin_addr.s_addr = u32::from(*v4.ip()).to_be();
            std::mem::size_of::<libc::sockaddr_in>() as libc::socklen_t
        }
        SocketAddr::V6(v6) => {
            // SAFETY: as above, for sockaddr_in6.
            let s = unsafe { &mut *(ss as *mut _ as *mut libc::sockaddr_in6) };
            s.sin6_family = libc::AF_INET6 as libc::sa_family_t;
            s.sin6_port = v6.port().to_be();
            s.sin6_flowinfo = v6.flowinfo();
            s.sin6_addr.s6_addr = v6.ip().octets();
            s.sin6_scope_id = v6.scope_id();
            std::mem::size_of::<libc::sockaddr_in6>() as libc::socklen_t
        }
    }
}

/// Reusable receive buffers for one thread.
pub struct Receiver {
    bufs: Vec<Vec<u8>>,
}

impl Receiver {
    /// `max_datagram`: the largest datagram accepted; longer ones are truncated by the kernel
    /// and dropped here.
    pub fn new(max_datagram: usize) -> Self {
        Receiver {
            bufs: (0..BATCH).map(|_| vec![0u8; max_datagram]).collect(),
        }
    }

    /// Blocks for at least one datagram, then takes up to [`BATCH`] without waiting more.
    /// Returns the datagrams and how many were dropped as truncated.
    pub fn recv(&mut self, sock: &UdpSocket, out: &mut Vec<Datagram>) -> io::Result<usize> {
        let mut addrs: [MaybeUninit<libc::sockaddr_storage>; BATCH] = [MaybeUninit::uninit(); BATCH];
        let mut iovs: Vec<libc::iovec> = self
            .bufs
            .iter_mut()
            .map(|b| libc::iovec {
                iov_base: b.as_mut_ptr() as *mut _,
                iov_len: b.len(),
            })
            .collect();
        // SAFETY: mmsghdr is plain data; zero is a valid value for every field.
        let mut msgs: [libc::mmsghdr; BATCH] = unsafe { std::mem::zeroed() };
        for i in 0..BATCH {
            msgs[i].msg_hdr.msg_name = addrs[i].as_mut_ptr() as *mut _;
            msgs[i].msg_hdr.msg_namelen = std::mem::size_of::<libc::sockaddr_storage>() as u32;
            msgs[i].msg_hdr.msg_iov = &mut iovs[i];
            msgs[i].msg_hdr.msg_iovlen = 1;
        }
        // SAFETY: every header points at a live buffer (self.bufs), a live iovec and a live
        // address slot, all of which outlive the call; the kernel writes at most their lengths.
        let n = unsafe {
            libc::recvmmsg(
                sock.as_raw_fd(),
                msgs.as_mut_ptr(),
                BATCH as u32,
                libc::MSG_WAITFORONE,
                std::ptr::null_mut(),
            )
        };
        if n < 0 {
            return Err(io::Error::last_os_error());
        }
        let mut truncated = 0;
        for i in 0..n as usize {
            let h = &msgs[i].msg_hdr;
            if h.msg_flags & libc::MSG_TRUNC != 0 {
                truncated += 1;
                continue;
            }
            // SAFETY: the kernel filled msg_namelen bytes of this slot (at most its size).
            let ss = unsafe { addrs[i].assume_init_ref() };
            let Some(src) = to_socket_addr(ss) else {
                continue;
            };
            let len = msgs[i].msg_len as usize;
            out.push(Datagram {
                data: self.bufs[i][..len].to_vec(),
                src,
            });
        }
        Ok(truncated)
    }
}

/// Sends `payloads` to `to` with as few system calls as possible; returns how many were sent.
pub fn send_batch(sock: &UdpSocket, to: SocketAddr, payloads: &[&[u8]]) -> io::Result<usize> {
    // SAFETY: sockaddr_storage is plain data; zero is valid.
    let mut ss: libc::sockaddr_storage = unsafe { std::mem::zeroed() };
    let namelen = from_socket_addr(&to, &mut ss);
    let mut sent = 0;
    while sent < payloads.len() {
        let chunk = &payloads[sent..payloads.len().min(sent + BATCH)];
        let mut iovs: Vec<libc::iovec> = chunk
            .iter()
            .map(|p| libc::iovec {
                iov_base: p.as_ptr() as *mut _,
                iov_len: p.len(),
            })
            .collect();
        // SAFETY: mmsghdr is plain data; zero is valid.
        let mut msgs: Vec<libc::mmsghdr> = (0..chunk.len()).map(|_| unsafe { std::mem::zeroed() }).collect();
        for (m, iov) in msgs.iter_mut().zip(iovs.iter_mut()) {
            m.msg_hdr.msg_name = &mut ss as *mut _ as *mut _;
            m.msg_hdr.msg_namelen = namelen;
            m.msg_hdr.msg_iov = iov;
            m.msg_hdr.msg_iovlen = 1;
        }
        // SAFETY: each header points at a live iovec over a payload that outlives the call,
        // and at `ss`, which holds a valid address of `namelen` bytes; the kernel only reads them.
        let n = unsafe { libc::sendmmsg(sock.as_raw_fd(), msgs.as_mut_ptr(), msgs.len() as u32, 0) };
        if n < 0 {
            let e = io::Error::last_os_error();
            if e.kind() == io::ErrorKind::Interrupted {
                continue;
            }
            return if sent > 0 { Ok(sent) } else { Err(e) };
        }
        sent += n as usize;
    }
    Ok(sent)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn batches_cross_loopback_with_sources_and_truncation() {
        let rx = UdpSocket::bind("127.0.0.1:0").unwrap();
        let tx = UdpSocket::bind("127.0.0.1:0").unwrap();
        let to = rx.local_addr().unwrap();
        let payloads: Vec<Vec<u8>> = (0..40u8).map(|i| vec![i; 10 + i as usize]).collect();
        let refs: Vec<&[u8]> = payloads.iter().map(|p| p.as_slice()).collect();
        assert_eq!(send_batch(&tx, to, &refs).unwrap(), 40);
        tx.send_to(&[9u8; 100], to).unwrap(); // longer than the receiver accepts

        let mut r = Receiver::new(64);
        let mut got = Vec::new();
        let mut truncated = 0;
        while got.len() + truncated < 41 {
            truncated += r.recv(&rx, &mut got).unwrap();
        }
        assert_eq!(truncated, 1);
        assert_eq!(got.len(), 40);
        for (i, d) in got.iter().enumerate() {
            assert_eq!(d.data, payloads[i], "datagram {i} arrives whole and in order");
            assert_eq!(d.src, tx.local_addr().unwrap());
        }
    }

    #[test]
    fn ipv6_addresses_round_trip() {
        let a: SocketAddr = "[2001:db8::1%3]:51820".parse().unwrap();
        // SAFETY: zero is a valid sockaddr_storage.
        let mut ss: libc::sockaddr_storage = unsafe { std::mem::zeroed() };
        from_socket_addr(&a, &mut ss);
        assert_eq!(to_socket_addr(&ss), Some(a));
        let b: SocketAddr = "192.0.2.1:7".parse().unwrap();
        from_socket_addr(&b, &mut ss);
        assert_eq!(to_socket_addr(&ss), Some(b));
    }
}
