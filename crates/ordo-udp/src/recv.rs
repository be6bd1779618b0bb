//! Receiving: recvmmsg into large slots that datagrams are carved from, GRO batches split.

use crate::addr::to_socket_addr;
use crate::options::UDP_GRO;
use crate::{CmsgBuf, Datagram, BATCH};
use bytes::BytesMut;
use std::io;
use std::mem::MaybeUninit;
use std::net::UdpSocket;
use std::os::fd::AsRawFd;

/// Receive buffers for one thread. Each receive slot is a large buffer that datagrams are
/// carved from without copying: a GRO batch of many datagrams becomes many `BytesMut` that
/// share its allocation, each decrypted in place later on any thread. A slot that runs low
/// gets a fresh buffer; the old one is freed when its last datagram is.
pub struct Receiver {
    slots: Vec<BytesMut>,
    max_datagram: usize,
    cmsgs: Vec<CmsgBuf>,
}

/// A fresh slot holds this many maximal receives before it is replaced.
pub const SLOT_RECEIVES: usize = 4;

impl Receiver {
    /// `max_datagram`: the largest datagram (or GRO batch) accepted; longer ones are
    /// truncated by the kernel and dropped here.
    pub fn new(max_datagram: usize) -> Self {
        Receiver {
            slots: (0..BATCH)
                .map(|_| BytesMut::with_capacity(max_datagram * SLOT_RECEIVES))
                .collect(),
            max_datagram,
            cmsgs: vec![[0; 4]; BATCH],
        }
    }

    /// Blocks for at least one datagram (at most the socket's receive timeout, after which
    /// nothing is added), then takes up to [`BATCH`] receives without waiting more, splitting
    /// GRO batches. Returns how many were dropped as truncated.
    pub fn recv(&mut self, sock: &UdpSocket, out: &mut Vec<Datagram>) -> io::Result<usize> {
        match self.recv_with(sock, out, libc::MSG_WAITFORONE) {
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => Ok(0),
            r => r,
        }
    }

    /// As [`Receiver::recv`] without waiting for the first: for a thread that polls. An
    /// empty socket is no error: nothing is added.
    pub fn recv_ready(&mut self, sock: &UdpSocket, out: &mut Vec<Datagram>) -> io::Result<usize> {
        match self.recv_with(sock, out, libc::MSG_DONTWAIT) {
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => Ok(0),
            r => r,
        }
    }

    fn recv_with(&mut self, sock: &UdpSocket, out: &mut Vec<Datagram>, flags: libc::c_int) -> io::Result<usize> {
        let mut addrs: [MaybeUninit<libc::sockaddr_storage>; BATCH] = [MaybeUninit::uninit(); BATCH];
        for slot in &mut self.slots {
            if slot.capacity() < self.max_datagram {
                *slot = BytesMut::with_capacity(self.max_datagram * SLOT_RECEIVES);
            }
        }
        let max = self.max_datagram;
        let mut iovs: Vec<libc::iovec> = self
            .slots
            .iter_mut()
            .map(|b| libc::iovec {
                iov_base: b.spare_capacity_mut().as_mut_ptr() as *mut _,
                iov_len: max,
            })
            .collect();
        // SAFETY: mmsghdr is plain data; zero is a valid value for every field.
        let mut msgs: [libc::mmsghdr; BATCH] = unsafe { std::mem::zeroed() };
        for i in 0..BATCH {
            let h = &mut msgs[i].msg_hdr;
            h.msg_name = addrs[i].as_mut_ptr() as *mut _;
            h.msg_namelen = std::mem::size_of::<libc::sockaddr_storage>() as u32;
            h.msg_iov = &mut iovs[i];
            h.msg_iovlen = 1;
            h.msg_control = self.cmsgs[i].as_mut_ptr() as *mut _;
            h.msg_controllen = std::mem::size_of::<CmsgBuf>();
        }
        // SAFETY: every header points at live spare capacity of at least `max` bytes (checked
        // above) in self.slots, a live iovec, a live
        // address slot and a live control buffer, all of which outlive the call; the kernel
        // writes at most their lengths.
        let n = unsafe {
            libc::recvmmsg(
                sock.as_raw_fd(),
                msgs.as_mut_ptr(),
                BATCH as u32,
                flags,
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
            let Some(src) = to_socket_addr(ss) else { continue };
            let len = msgs[i].msg_len as usize;
            if len == 0 {
                // An empty datagram is one too: the core drops and counts it as malformed.
                out.push(Datagram {
                    data: BytesMut::new(),
                    src,
                });
                continue;
            }
            // With GRO one buffer may hold several datagrams of `segment` bytes, the last
            // possibly shorter.
            let segment = gro_segment_size(h).unwrap_or(len).max(1);
            let slot = &mut self.slots[i];
            // SAFETY: the kernel wrote `len` (at most `max`, within the spare capacity) bytes
            // at the start of this slot's spare capacity, so they are initialized.
            unsafe { slot.set_len(len) };
            let mut filled = slot.split_to(len);
            while !filled.is_empty() {
                let n = segment.min(filled.len());
                out.push(Datagram {
                    data: filled.split_to(n),
                    src,
                });
            }
        }
        Ok(truncated)
    }
}

/// The segment size of a GRO-coalesced receive, from its control messages.
fn gro_segment_size(h: &libc::msghdr) -> Option<usize> {
    // SAFETY: `h` is a header the kernel just filled; CMSG_FIRSTHDR/NXTHDR stay within
    // msg_control..msg_control + msg_controllen, which points at a live buffer.
    unsafe {
        let mut c = libc::CMSG_FIRSTHDR(h);
        while !c.is_null() {
            if (*c).cmsg_level == libc::SOL_UDP && (*c).cmsg_type == UDP_GRO {
                let v = std::ptr::read_unaligned(libc::CMSG_DATA(c) as *const libc::c_int);
                return (v > 0).then_some(v as usize);
            }
            c = libc::CMSG_NXTHDR(h, c);
        }
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{send_batch, Gso};

    #[test]
    fn batches_cross_loopback_with_sources_and_truncation() {
        let rx = UdpSocket::bind("127.0.0.1:0").unwrap();
        let tx = UdpSocket::bind("127.0.0.1:0").unwrap();
        let to = rx.local_addr().unwrap();
        let payloads: Vec<Vec<u8>> = (0..40u8).map(|i| vec![i; 10 + i as usize]).collect();
        let refs: Vec<&[u8]> = payloads.iter().map(|p| p.as_slice()).collect();
        assert_eq!(send_batch(&tx, to, &refs, &Gso::new(false)).unwrap(), 40);
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

    /// An empty datagram is received as one (of length 0), so that it is counted; it used to
    /// vanish between the kernel and the core.
    #[test]
    fn an_empty_datagram_is_received_as_one() {
        let rx = UdpSocket::bind("127.0.0.1:0").unwrap();
        let tx = UdpSocket::bind("127.0.0.1:0").unwrap();
        let to = rx.local_addr().unwrap();
        for p in [&b"a"[..], b"", b"bc"] {
            tx.send_to(p, to).unwrap();
        }
        rx.set_read_timeout(Some(std::time::Duration::from_millis(200)))
            .unwrap();
        let mut r = Receiver::new(64);
        let mut got = Vec::new();
        for _ in 0..5 {
            r.recv(&rx, &mut got).unwrap();
        }
        let lens: Vec<usize> = got.iter().map(|d| d.data.len()).collect();
        assert_eq!(lens, [1, 0, 2]);
        assert_eq!(got[1].src, tx.local_addr().unwrap());
    }
}
