//! Batched UDP I/O: recvmmsg and sendmmsg move up to [`BATCH`] datagrams per system call,
//! and, where the kernel offers them, UDP GSO (one send carries many equal-sized datagrams,
//! split by the kernel or the NIC) and UDP GRO (one receive returns many coalesced ones).
//! Both are detected at run time: GRO is asked for and used if granted; GSO is used until a
//! send fails in the way that means "not supported here", then not again on that socket set.

use crate::port::{Datagram, BATCH};
use bytes::BytesMut;
use std::collections::HashSet;
use std::io;
use std::mem::MaybeUninit;
use std::net::{SocketAddr, SocketAddrV4, SocketAddrV6, UdpSocket};
use std::os::fd::AsRawFd;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Mutex;

/// From linux/udp.h (not in the libc crate for glibc targets).
const UDP_SEGMENT: libc::c_int = 103;
const UDP_GRO: libc::c_int = 104;
/// Most segments one GSO send may carry (the kernel's UDP_MAX_SEGMENTS).
const GSO_MAX_SEGMENTS: usize = 64;
/// Most bytes one GSO send may carry: the largest UDP payload over IPv4.
const GSO_MAX_BYTES: usize = 65507;
/// Room for one control message carrying an int, 8-byte aligned.
type CmsgBuf = [u64; 4];

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
pub(crate) const SLOT_RECEIVES: usize = 4;

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

/// Splits payloads into runs one GSO send can carry: equal sizes, except that the last may be
/// shorter; at most GSO_MAX_SEGMENTS segments and GSO_MAX_BYTES bytes. Returns index ranges.
fn gso_runs(payloads: &[&[u8]]) -> Vec<(usize, usize)> {
    let mut runs = Vec::new();
    let mut i = 0;
    while i < payloads.len() {
        let size = payloads[i].len();
        let (mut j, mut bytes) = (i + 1, size);
        while j < payloads.len() && j - i < GSO_MAX_SEGMENTS && bytes + payloads[j].len() <= GSO_MAX_BYTES {
            let len = payloads[j].len();
            if len > size {
                break;
            }
            bytes += len;
            j += 1;
            if len < size {
                break; // a shorter segment ends the run
            }
        }
        runs.push((i, j));
        i = j;
    }
    runs
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

/// Whether a socket sends with UDP GSO: on where the kernel offers it, and off for each
/// destination whose route cannot take it, the others keeping it. The kernel refuses a GSO
/// send with EIO when the route's device has no checksum offload or the route transforms
/// (net/ipv4/udp.c, udp_send_skb): a matter of the route, so of the destination.
pub struct Gso {
    enabled: AtomicBool,
    /// How many destinations refused it: while none, a send asks no lock.
    refused_count: AtomicUsize,
    refused: Mutex<HashSet<SocketAddr>>,
}

/// Destinations remembered as refusing GSO; beyond them, GSO is off for all (a host where
/// that many routes refuse it has no offload to speak of).
const MAX_REFUSED: usize = 256;

impl Gso {
    pub fn new(enabled: bool) -> Gso {
        Gso {
            enabled: AtomicBool::new(enabled),
            refused_count: AtomicUsize::new(0),
            refused: Mutex::new(HashSet::new()),
        }
    }

    /// Whether it is on at all (for the metrics).
    pub fn enabled(&self) -> bool {
        self.enabled.load(Ordering::Relaxed)
    }

    /// How many destinations it is off for.
    pub fn refused_destinations(&self) -> usize {
        self.refused_count.load(Ordering::Relaxed)
    }

    /// Whether a send to `to` uses it.
    pub fn allowed(&self, to: SocketAddr) -> bool {
        self.enabled()
            && (self.refused_count.load(Ordering::Acquire) == 0
                || !self.refused.lock().unwrap_or_else(|p| p.into_inner()).contains(&to))
    }

    /// `to`'s route cannot take it: off for `to` from now on.
    fn refuse(&self, to: SocketAddr) {
        let mut refused = self.refused.lock().unwrap_or_else(|p| p.into_inner());
        if refused.len() >= MAX_REFUSED {
            self.enabled.store(false, Ordering::Relaxed);
            return;
        }
        refused.insert(to);
        self.refused_count.store(refused.len(), Ordering::Release);
    }
}

/// Sends `payloads` to `to` with as few system calls as possible, with UDP GSO where `gso`
/// allows it. Returns how many were sent; an error only if none was.
///
/// A refusal costs only what was refused: a GSO run the kernel refuses for its size or
/// segment count (EINVAL, EMSGSIZE: a path MTU that shrank for this endpoint) goes again as
/// single datagrams in its place, and GSO stays on; an error that says the route's device
/// cannot segment (EIO, ENOPROTOOPT) turns it off for this destination only. A refused
/// single is skipped and the rest go on. A full socket buffer (ENOBUFS, EAGAIN) ends the
/// batch: the rest would meet it too.
pub fn send_batch(sock: &UdpSocket, to: SocketAddr, payloads: &[&[u8]], gso: &Gso) -> io::Result<usize> {
    let runs = if payloads.len() > 1 && gso.allowed(to) {
        gso_runs(payloads)
    } else {
        singles(0, payloads.len())
    };
    send_runs(sock, to, payloads, runs, gso)
}

/// One run a payload each, for payloads `a..b`.
fn singles(a: usize, b: usize) -> Vec<(usize, usize)> {
    (a..b).map(|i| (i, i + 1)).collect()
}

/// [`send_batch`] over given runs (a run of more than one payload is one GSO datagram).
fn send_runs(
    sock: &UdpSocket,
    to: SocketAddr,
    payloads: &[&[u8]],
    mut runs: Vec<(usize, usize)>,
    gso: &Gso,
) -> io::Result<usize> {
    let (mut at, mut sent, mut last_error) = (0, 0, None);
    while at < runs.len() {
        let (n, error) = send_mmsg(sock, to, payloads, &runs[at..]);
        sent += runs[at..at + n].iter().map(|(a, b)| b - a).sum::<usize>();
        at += n;
        let Some(e) = error else { continue };
        let (a, b) = runs[at];
        let gso_run = b - a > 1;
        match e.raw_os_error() {
            Some(libc::ENOBUFS) | Some(libc::EAGAIN) => {
                last_error = Some(e);
                break;
            }
            Some(libc::EIO) | Some(libc::ENOPROTOOPT) if gso_run => {
                gso.refuse(to);
                let rest: Vec<_> = runs[at..].iter().flat_map(|&(a, b)| singles(a, b)).collect();
                runs.truncate(at);
                runs.extend(rest);
            }
            Some(libc::EINVAL) | Some(libc::EMSGSIZE) if gso_run => {
                runs.splice(at..=at, singles(a, b));
            }
            _ => {
                at += 1;
                last_error = Some(e);
            }
        }
    }
    match last_error {
        Some(e) if sent == 0 => Err(e),
        _ => Ok(sent),
    }
}

/// One sendmmsg entry per run, from the first run on; returns how many runs went out and the
/// error that stopped the rest (it concerns the run after those that went out).
fn send_mmsg(
    sock: &UdpSocket,
    to: SocketAddr,
    payloads: &[&[u8]],
    runs: &[(usize, usize)],
) -> (usize, Option<io::Error>) {
    // SAFETY: sockaddr_storage is plain data; zero is valid.
    let mut ss: libc::sockaddr_storage = unsafe { std::mem::zeroed() };
    let namelen = from_socket_addr(&to, &mut ss);
    let mut iovs: Vec<libc::iovec> = payloads
        .iter()
        .map(|p| libc::iovec {
            iov_base: p.as_ptr() as *mut _,
            iov_len: p.len(),
        })
        .collect();
    let mut cmsgs: Vec<CmsgBuf> = vec![[0; 4]; runs.len()];
    // SAFETY: mmsghdr is plain data; zero is valid.
    let mut msgs: Vec<libc::mmsghdr> = (0..runs.len()).map(|_| unsafe { std::mem::zeroed() }).collect();
    for (k, &(a, b)) in runs.iter().enumerate() {
        let h = &mut msgs[k].msg_hdr;
        h.msg_name = &mut ss as *mut _ as *mut _;
        h.msg_namelen = namelen;
        h.msg_iov = iovs[a..].as_mut_ptr();
        h.msg_iovlen = b - a;
        if b - a > 1 {
            h.msg_control = cmsgs[k].as_mut_ptr() as *mut _;
            // SAFETY: CMSG_SPACE is a pure size computation.
            h.msg_controllen = unsafe { libc::CMSG_SPACE(std::mem::size_of::<u16>() as u32) } as usize;
            // SAFETY: the control buffer is live, 8-byte aligned, and CMSG_SPACE(2) fits in it,
            // so the first header and its 2-byte payload lie inside it.
            unsafe {
                let c = libc::CMSG_FIRSTHDR(h);
                (*c).cmsg_level = libc::SOL_UDP;
                (*c).cmsg_type = UDP_SEGMENT;
                (*c).cmsg_len = libc::CMSG_LEN(std::mem::size_of::<u16>() as u32) as usize;
                std::ptr::write_unaligned(libc::CMSG_DATA(c) as *mut u16, payloads[a].len() as u16);
            }
        }
    }
    let mut done = 0;
    while done < runs.len() {
        // SAFETY: every header points at live iovecs over payloads that outlive the call, at
        // `ss` (a valid address of `namelen` bytes) and at a live control buffer; the kernel
        // only reads them.
        let n = unsafe {
            libc::sendmmsg(
                sock.as_raw_fd(),
                msgs[done..].as_mut_ptr(),
                (runs.len() - done) as u32,
                0,
            )
        };
        if n < 0 {
            let e = io::Error::last_os_error();
            if e.kind() == io::ErrorKind::Interrupted {
                continue;
            }
            return (done, Some(e));
        }
        done += n as usize;
    }
    (done, None)
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

    #[test]
    fn gso_runs_follow_the_kernel_rules() {
        let sizes = [100, 100, 100, 60, 100, 100, 120, 120];
        let bufs: Vec<Vec<u8>> = sizes.iter().map(|&n| vec![0; n]).collect();
        let refs: Vec<&[u8]> = bufs.iter().map(|b| b.as_slice()).collect();
        assert_eq!(gso_runs(&refs), vec![(0, 4), (4, 6), (6, 8)]);
        let many: Vec<&[u8]> = (0..100).map(|_| &bufs[0][..]).collect();
        assert_eq!(gso_runs(&many), vec![(0, 64), (64, 100)]);
        let big = vec![0u8; 1500];
        let bigs: Vec<&[u8]> = (0..50).map(|_| &big[..]).collect();
        assert_eq!(gso_runs(&bigs)[0], (0, 43), "at most 65507 bytes per send");
    }

    /// GSO out and GRO in over loopback: every datagram arrives whole and in order, whichever
    /// of the two the kernel supports (the fallback path is taken where it does not).
    #[test]
    fn gso_and_gro_round_trip() {
        let rx = UdpSocket::bind("127.0.0.1:0").unwrap();
        let tx = UdpSocket::bind("127.0.0.1:0").unwrap();
        let gro = enable_gro(&rx);
        let to = rx.local_addr().unwrap();
        let mut payloads: Vec<Vec<u8>> = (0..50u8).map(|i| vec![i; 1200]).collect();
        payloads.push(vec![99; 500]);
        let refs: Vec<&[u8]> = payloads.iter().map(|p| p.as_slice()).collect();
        let gso = Gso::new(true);
        assert_eq!(send_batch(&tx, to, &refs, &gso).unwrap(), 51);
        let mut r = Receiver::new(65536);
        let mut got = Vec::new();
        while got.len() < 51 {
            r.recv(&rx, &mut got).unwrap();
        }
        assert_eq!(got.len(), 51);
        for (i, d) in got.iter().enumerate() {
            assert_eq!(d.data, payloads[i], "datagram {i}");
        }
        eprintln!("gso still enabled: {}, gro granted: {gro}", gso.enabled());
    }

    /// A GSO run the kernel refuses (more segments than it takes: EINVAL) goes again as
    /// single datagrams, in its place: every datagram arrives, in order, and GSO stays on.
    #[test]
    fn a_refused_gso_run_goes_as_singles_and_gso_stays_on() {
        let rx = UdpSocket::bind("127.0.0.1:0").unwrap();
        let tx = UdpSocket::bind("127.0.0.1:0").unwrap();
        let to = rx.local_addr().unwrap();
        if !gso_supported(&tx) {
            eprintln!("no UDP GSO on this kernel: nothing to refuse");
            return;
        }
        let payloads: Vec<Vec<u8>> = (0..200u32).map(|i| vec![i as u8; 100]).collect();
        let refs: Vec<&[u8]> = payloads.iter().map(|p| p.as_slice()).collect();
        let gso = Gso::new(true);
        // Ten payloads first, then one run of 190: past the kernel's UDP_MAX_SEGMENTS.
        let runs = vec![(0, 10), (10, 200)];
        assert_eq!(send_runs(&tx, to, &refs, runs, &gso).unwrap(), 200);
        assert!(gso.enabled(), "one refused run does not turn GSO off");
        let mut r = Receiver::new(65536);
        let mut got = Vec::new();
        while got.len() < 200 {
            r.recv(&rx, &mut got).unwrap();
        }
        for (i, d) in got.iter().enumerate() {
            assert_eq!(d.data, payloads[i], "datagram {i}, in order");
        }
    }

    /// A single datagram the kernel refuses (EMSGSIZE: longer than UDP allows) is skipped;
    /// those before and after it go.
    #[test]
    fn a_refused_datagram_is_skipped_and_the_rest_go() {
        let rx = UdpSocket::bind("127.0.0.1:0").unwrap();
        let tx = UdpSocket::bind("127.0.0.1:0").unwrap();
        let to = rx.local_addr().unwrap();
        let huge = vec![7u8; 70_000];
        let small: Vec<Vec<u8>> = (0..5u8).map(|i| vec![i; 50 + i as usize]).collect();
        let refs: Vec<&[u8]> = vec![&small[0], &small[1], &huge, &small[2], &small[3], &small[4]];
        assert_eq!(send_batch(&tx, to, &refs, &Gso::new(false)).unwrap(), 5);
        let mut r = Receiver::new(65536);
        let mut got = Vec::new();
        while got.len() < 5 {
            r.recv(&rx, &mut got).unwrap();
        }
        let lens: Vec<usize> = got.iter().map(|d| d.data.len()).collect();
        assert_eq!(lens, [50, 51, 52, 53, 54], "all but the refused one, in order");
        // Nothing sent at all is an error, with the kernel's reason.
        let e = send_batch(&tx, to, &[&huge], &Gso::new(false)).unwrap_err();
        assert_eq!(e.raw_os_error(), Some(libc::EMSGSIZE));
    }

    /// A destination whose route cannot take GSO (the kernel's EIO) loses it alone; past
    /// MAX_REFUSED such destinations it is off for all. (EIO itself cannot be had here: this
    /// kernel segments in software where a device cannot, and has no IPsec to route through.)
    #[test]
    fn gso_refused_by_one_route_stays_on_for_the_others() {
        let gso = Gso::new(true);
        let a: SocketAddr = "192.0.2.1:51820".parse().unwrap();
        let b: SocketAddr = "192.0.2.2:51820".parse().unwrap();
        assert!(gso.allowed(a) && gso.allowed(b));
        gso.refuse(a);
        assert!(!gso.allowed(a), "off for the refusing destination");
        assert!(gso.allowed(b), "on for the others");
        assert!(gso.enabled());
        assert_eq!(gso.refused_destinations(), 1);
        for port in 0..MAX_REFUSED as u16 {
            gso.refuse(SocketAddr::new(a.ip(), port));
        }
        assert!(
            !gso.enabled() && !gso.allowed(b),
            "too many refusing routes: off for all"
        );
        assert!(!Gso::new(false).allowed(b), "off where the kernel has none");
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
