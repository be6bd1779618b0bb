//! Sending: sendmmsg, with UDP GSO runs where the destination's route takes them.

use crate::addr::from_socket_addr;
use crate::options::UDP_SEGMENT;
use crate::CmsgBuf;
use std::collections::HashSet;
use std::io;
use std::net::{SocketAddr, UdpSocket};
use std::os::fd::AsRawFd;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Mutex;

/// Most segments one GSO send may carry (the kernel's UDP_MAX_SEGMENTS).
const GSO_MAX_SEGMENTS: usize = 64;
/// Most bytes one GSO send may carry: the largest UDP payload over IPv4.
const GSO_MAX_BYTES: usize = 65507;

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
    use crate::{enable_gro, gso_supported, Receiver};

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
}
