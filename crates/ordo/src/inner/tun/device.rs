//! The TUN device: a file descriptor per queue that yields and takes IP packets, each behind a
//! virtio-net header ([`super::vnet`]).

use std::fs::{File, OpenOptions};
use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::os::unix::fs::OpenOptionsExt;

use super::vnet::{self, Unpacked};
use crate::port::PacketBuf;
use std::sync::atomic::{AtomicU64, Ordering};

const TUNSETIFF: libc::c_ulong = 0x4004_54ca;
const IFF_TUN: libc::c_short = 0x0001;
const IFF_NO_PI: libc::c_short = 0x1000;
/// Every packet is preceded by a virtio-net header (see `vnet`).
const IFF_VNET_HDR: libc::c_short = 0x4000;
const TUNSETOFFLOAD: libc::c_ulong = 0x4004_54d0;
/// Offloads we take: the kernel may hand us TCP segments of up to 64 KB with a partial
/// checksum (TSO), which we split and checksum ourselves (`packet::segment`).
const TUN_F_CSUM: libc::c_uint = 0x01;
const TUN_F_TSO4: libc::c_uint = 0x02;
const TUN_F_TSO6: libc::c_uint = 0x04;
const TUN_F_TSO_ECN: libc::c_uint = 0x08;
/// UDP segmentation offload (Linux 6.2): large UDP datagrams, split by `packet::segment`.
const TUN_F_USO4: libc::c_uint = 0x20;
const TUN_F_USO6: libc::c_uint = 0x40;

/// `struct ifreq` reduced to the two members used here.
#[repr(C)]
struct IfReq {
    name: [u8; libc::IFNAMSIZ],
    /// ifr_flags or ifr_mtu, depending on the request.
    value: libc::c_int,
    _pad: [u8; 20],
}

impl IfReq {
    fn new(name: &str) -> io::Result<Self> {
        if name.is_empty() || name.len() >= libc::IFNAMSIZ || name.contains(['/', ' ', '\0']) {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                format!("invalid interface name {name:?}"),
            ));
        }
        let mut r = IfReq {
            name: [0; libc::IFNAMSIZ],
            value: 0,
            _pad: [0; 20],
        };
        r.name[..name.len()].copy_from_slice(name.as_bytes());
        Ok(r)
    }
}

pub struct Tun {
    file: File,
    name: String,
    /// Packets carry a virtio-net header, so writes can be coalesced (`packet::coalesce`).
    vnet_hdr: bool,
    /// The kernel agreed to hand us TSO segments.
    tso: bool,
    /// ... and USO datagrams.
    uso: bool,
    /// Reads dropped because their virtio-net header or packet did not hold together.
    malformed_reads: AtomicU64,
}

impl std::os::fd::AsRawFd for Tun {
    fn as_raw_fd(&self) -> std::os::fd::RawFd {
        self.file.as_raw_fd()
    }
}

impl Tun {
    /// Creates (or attaches to) the TUN interface `name`, without packet information headers.
    pub fn create(name: &str) -> io::Result<Tun> {
        Tun::open(name, false)
    }

    /// Creates the TUN interface `name` with `queues` queues (IFF_MULTI_QUEUE when more than
    /// one): each is a descriptor of its own, for one thread. The kernel writes a flow's
    /// packets to the queue that last wrote that flow's packets (TUN's automatic queue
    /// selection), so replies tend to come back to the queue that delivered.
    pub fn create_queues(name: &str, queues: usize) -> io::Result<Vec<Tun>> {
        let multi = queues > 1;
        (0..queues.max(1)).map(|_| Tun::open(name, multi)).collect()
    }

    fn open(name: &str, multi_queue: bool) -> io::Result<Tun> {
        let file = OpenOptions::new()
            .read(true)
            .write(true)
            .custom_flags(libc::O_CLOEXEC)
            .open("/dev/net/tun")?;
        let mut req = IfReq::new(name)?;
        req.value = (IFF_TUN | IFF_NO_PI | IFF_VNET_HDR) as libc::c_int;
        if multi_queue {
            req.value |= libc::IFF_MULTI_QUEUE;
        }
        // SAFETY: TUNSETIFF reads and writes one `struct ifreq`; IfReq has its layout
        // (16-byte name, then a 24-byte union) and lives for the call.
        let rc = unsafe { libc::ioctl(file.as_raw_fd(), TUNSETIFF, &mut req as *mut IfReq) };
        if rc < 0 {
            return Err(io::Error::last_os_error());
        }
        // Non-blocking, so a batch read stops when the queue is empty (see read_batch).
        // SAFETY: F_GETFL/F_SETFL on a descriptor we own; no memory is passed.
        unsafe {
            let flags = libc::fcntl(file.as_raw_fd(), libc::F_GETFL);
            if flags < 0 || libc::fcntl(file.as_raw_fd(), libc::F_SETFL, flags | libc::O_NONBLOCK) < 0 {
                return Err(io::Error::last_os_error());
            }
        }
        let offloads = TUN_F_CSUM | TUN_F_TSO4 | TUN_F_TSO6 | TUN_F_TSO_ECN;
        // SAFETY: TUNSETOFFLOAD takes its argument by value; no memory is passed.
        let set = |o: libc::c_uint| unsafe { libc::ioctl(file.as_raw_fd(), TUNSETOFFLOAD, o as libc::c_ulong) } == 0;
        // Kernels before 6.2 refuse the USO bits: then TSO alone.
        let uso = set(offloads | TUN_F_USO4 | TUN_F_USO6);
        let tso = uso || set(offloads);
        Ok(Tun {
            file,
            name: name.to_string(),
            vnet_hdr: true,
            tso,
            uso,
            malformed_reads: AtomicU64::new(0),
        })
    }

    /// Reads up to `max` packets without waiting; each is copied into a buffer of its own. A
    /// TSO or USO packet becomes its segments; a malformed one is dropped. An error means the
    /// device is gone.
    pub fn read_batch(&self, scratch: &mut [u8], out: &mut Vec<PacketBuf>, max: usize) -> io::Result<()> {
        while out.len() < max {
            let n = match self.read(scratch) {
                Ok(n) => n,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => return Ok(()),
                Err(e) => return Err(e),
            };
            let packet = if self.vnet_hdr {
                match vnet::unpack(&mut scratch[..n], out) {
                    Unpacked::Packet(p) => p,
                    Unpacked::Segmented(_) => continue,
                    Unpacked::Malformed => {
                        self.malformed_reads.fetch_add(1, Ordering::Relaxed);
                        continue;
                    }
                }
            } else {
                &scratch[..n]
            };
            out.push(PacketBuf::copy_of(packet));
        }
        Ok(())
    }

    pub fn name(&self) -> &str {
        &self.name
    }

    /// Reads dropped as malformed (see [`vnet::unpack`]).
    pub fn malformed_reads(&self) -> u64 {
        self.malformed_reads.load(Ordering::Relaxed)
    }

    pub fn read(&self, buf: &mut [u8]) -> io::Result<usize> {
        use std::io::Read;
        (&self.file).read(buf)
    }

    /// Whether the kernel hands us TSO segments.
    pub fn has_tso(&self) -> bool {
        self.tso
    }

    /// Whether the kernel hands us USO datagrams.
    pub fn has_uso(&self) -> bool {
        self.uso
    }

    /// Whether writes start with a virtio-net header.
    pub fn has_vnet_hdr(&self) -> bool {
        self.vnet_hdr
    }

    /// Writes one packet, or with a virtio-net header, one (possibly coalesced) packet behind
    /// its header.
    pub fn write(&self, bytes: &[u8]) -> io::Result<usize> {
        use std::io::Write;
        (&self.file).write(bytes)
    }

    /// One packet from several parts (a TUN write is one packet whatever its iovecs).
    pub fn write_vectored(&self, parts: &[io::IoSlice<'_>]) -> io::Result<usize> {
        use std::io::Write;
        (&self.file).write_vectored(parts)
    }

    pub fn mtu(&self) -> io::Result<u32> {
        interface_ioctl(&self.name, libc::SIOCGIFMTU, None).map(|v| v as u32)
    }

    pub fn set_mtu(&self, mtu: u32) -> io::Result<()> {
        interface_ioctl(&self.name, libc::SIOCSIFMTU, Some(mtu as libc::c_int)).map(|_| ())
    }

    /// How many packets each queue holds for its reader before the kernel drops (the
    /// interface's txqueuelen: the length of every queue's ring).
    pub fn tx_queue_len(&self) -> io::Result<u32> {
        interface_ioctl(&self.name, libc::SIOCGIFTXQLEN, None).map(|v| v as u32)
    }

    pub fn set_tx_queue_len(&self, packets: u32) -> io::Result<()> {
        interface_ioctl(&self.name, libc::SIOCSIFTXQLEN, Some(packets as libc::c_int)).map(|_| ())
    }
}

/// Runs an interface ioctl that takes or returns one integer (the MTU, the queue length) on a
/// datagram socket.
fn interface_ioctl(name: &str, request: libc::c_ulong, set: Option<libc::c_int>) -> io::Result<libc::c_int> {
    let mut req = IfReq::new(name)?;
    req.value = set.unwrap_or(0);
    // SAFETY: socket() has no memory-safety preconditions; the result is checked below.
    let fd = unsafe { libc::socket(libc::AF_INET, libc::SOCK_DGRAM | libc::SOCK_CLOEXEC, 0) };
    if fd < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: fd is a fresh descriptor we own; OwnedFd closes it on every path.
    let sock = unsafe { OwnedFd::from_raw_fd(fd) };
    // SAFETY: SIOCGIFMTU/SIOCSIFMTU/SIOCGIFTXQLEN/SIOCSIFTXQLEN read or write a `struct ifreq`
    // whose union holds an int.
    let rc = unsafe { libc::ioctl(sock.as_raw_fd(), request, &mut req as *mut IfReq) };
    if rc < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(req.value)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ifreq_layout_matches_the_kernel() {
        assert_eq!(std::mem::size_of::<IfReq>(), 40);
        assert!(IfReq::new("a-name-that-is-too-long").is_err());
        assert!(IfReq::new("").is_err());
        assert!(IfReq::new("wg0").is_ok());
    }

    /// Needs root and /dev/net/tun; skipped (and says so) elsewhere.
    #[test]
    fn create_set_and_read_mtu() {
        let name = format!("ordot{}", std::process::id() % 100_000);
        let tun = match Tun::create(&name) {
            Ok(t) => t,
            Err(e) if e.kind() == io::ErrorKind::PermissionDenied || e.kind() == io::ErrorKind::NotFound => {
                eprintln!("skipped: cannot create a TUN device here ({e})");
                return;
            }
            Err(e) => panic!("{e}"),
        };
        tun.set_mtu(1333).unwrap();
        assert_eq!(tun.mtu().unwrap(), 1333);
    }
}
