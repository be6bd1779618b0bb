//! The bpf(2) calls the XDP path makes: maps, loading a program from instructions, attaching
//! it to an interface with a BPF link, and running it on a test frame. Each call's attribute
//! block is the part of the kernel's `union bpf_attr` (include/uapi/linux/bpf.h) that the
//! command reads; the kernel treats a shorter block as zero beyond its end.

use super::insn::Insn;
use std::ffi::CString;
use std::fmt;
use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};

const BPF_MAP_CREATE: u32 = 0;
const BPF_MAP_LOOKUP_ELEM: u32 = 1;
const BPF_MAP_UPDATE_ELEM: u32 = 2;
const BPF_MAP_DELETE_ELEM: u32 = 3;
const BPF_PROG_LOAD: u32 = 5;
const BPF_PROG_TEST_RUN: u32 = 10;
const BPF_LINK_CREATE: u32 = 28;

const BPF_MAP_TYPE_ARRAY: u32 = 2;
const BPF_F_XDP_HAS_FRAGS: u32 = 1 << 5;
const BPF_MAP_TYPE_PERCPU_ARRAY: u32 = 6;
const BPF_MAP_TYPE_XSKMAP: u32 = 17;
const BPF_PROG_TYPE_XDP: u32 = 6;
/// `enum bpf_attach_type`'s BPF_XDP.
const BPF_XDP: u32 = 37;

/// The attach mode of an XDP program (the link's flags, as `XDP_FLAGS_*` in
/// include/uapi/linux/if_link.h).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum XdpMode {
    /// The driver runs it (native), or the kernel falls back to generic where it cannot.
    Any,
    /// In the driver only: refused where the driver has no XDP.
    Native,
    /// After the kernel built its socket buffer (generic, slower, every driver).
    Generic,
}

impl XdpMode {
    fn flags(self) -> u32 {
        match self {
            XdpMode::Any => 0,
            XdpMode::Generic => 1 << 1,
            XdpMode::Native => 1 << 2,
        }
    }
}

fn bpf<T>(cmd: u32, attr: &mut T) -> io::Result<i64> {
    // SAFETY: `attr` is a live, initialised attribute block of the layout the command reads,
    // and its size is passed; the kernel writes back only within that size.
    let r = unsafe { libc::syscall(libc::SYS_bpf, cmd, attr as *mut T, std::mem::size_of::<T>()) };
    if r < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(r)
}

/// A descriptor the kernel returned.
fn owned(r: i64) -> OwnedFd {
    // SAFETY: a successful bpf(2) call that makes an object returns a new descriptor, ours.
    unsafe { OwnedFd::from_raw_fd(r as RawFd) }
}

/// The kernel's name field: at most 15 bytes and a NUL, of the characters it accepts.
fn object_name(name: &str) -> [u8; 16] {
    let mut out = [0u8; 16];
    for (o, c) in out.iter_mut().zip(name.bytes().take(15)) {
        *o = if c.is_ascii_alphanumeric() || c == b'_' || c == b'.' {
            c
        } else {
            b'_'
        };
    }
    out
}

#[repr(C)]
#[derive(Default)]
struct MapCreate {
    map_type: u32,
    key_size: u32,
    value_size: u32,
    max_entries: u32,
    map_flags: u32,
    inner_map_fd: u32,
    numa_node: u32,
    map_name: [u8; 16],
}

#[repr(C)]
#[derive(Default)]
struct MapElem {
    map_fd: u32,
    _pad: u32,
    key: u64,
    value: u64,
    flags: u64,
}

/// A map of the kernel's, by its descriptor.
pub struct Map {
    fd: OwnedFd,
    /// Each entry's value size (per CPU, for a per-CPU map).
    value_size: usize,
    /// Where a per-CPU map's lookup writes its values (empty: not per CPU).
    per_cpu: std::sync::Mutex<Vec<u64>>,
}

/// The most CPUs a Linux kernel may have (NR_CPUS is at most 8192 on x86_64, 4096 on
/// arm64): a per-CPU lookup writes a value for each possible CPU, as many as the kernel
/// counts, and the buffer it writes into is sized by this bound, not by what sysfs says
/// (which a container may show otherwise).
const MAX_CPUS: usize = 8192;

impl Map {
    fn create(name: &str, map_type: u32, value_size: u32, entries: u32) -> io::Result<OwnedFd> {
        let mut attr = MapCreate {
            map_type,
            key_size: 4,
            value_size,
            max_entries: entries,
            map_name: object_name(name),
            ..Default::default()
        };
        bpf(BPF_MAP_CREATE, &mut attr).map(owned)
    }

    /// An array of `entries` 64-bit counters, one of each per CPU (so the program adds
    /// without atomics); [`Map::sum`] adds them up.
    pub fn counters(name: &str, entries: u32) -> io::Result<Map> {
        Ok(Map {
            fd: Map::create(name, BPF_MAP_TYPE_PERCPU_ARRAY, 8, entries)?,
            value_size: 8,
            // Zeros past the possible CPUs, which no lookup writes: they add nothing.
            per_cpu: std::sync::Mutex::new(vec![0; MAX_CPUS]),
        })
    }

    /// An array of `entries` 32-bit values, shared by every CPU: settings a program reads
    /// and the process changes while it runs ([`Map::set_u32`]). Changing an entry needs
    /// only the map's descriptor, no capability, so it works after the daemon dropped its
    /// privileges.
    pub fn values(name: &str, entries: u32) -> io::Result<Map> {
        Ok(Map {
            fd: Map::create(name, BPF_MAP_TYPE_ARRAY, 4, entries)?,
            value_size: 4,
            per_cpu: std::sync::Mutex::new(Vec::new()),
        })
    }

    /// Sets entry `key` of a map of 32-bit values ([`Map::values`], [`Map::sockets`]).
    pub fn set_u32(&self, key: u32, value: u32) -> io::Result<()> {
        debug_assert_eq!(self.value_size, 4);
        let mut attr = MapElem {
            map_fd: self.fd.as_raw_fd() as u32,
            key: &key as *const u32 as u64,
            value: &value as *const u32 as u64,
            ..Default::default()
        };
        bpf(BPF_MAP_UPDATE_ELEM, &mut attr).map(drop)
    }

    /// A map of AF_XDP sockets by index (`bpf_redirect_map`'s target).
    pub fn sockets(name: &str, entries: u32) -> io::Result<Map> {
        Ok(Map {
            fd: Map::create(name, BPF_MAP_TYPE_XSKMAP, 4, entries)?,
            value_size: 4,
            per_cpu: std::sync::Mutex::new(Vec::new()),
        })
    }

    /// Counter `key` of a [`Map::counters`], summed over the CPUs.
    pub fn sum(&self, key: u32) -> io::Result<u64> {
        let mut values = self.per_cpu.lock().unwrap_or_else(|p| p.into_inner());
        if values.len() < MAX_CPUS || self.value_size != 8 {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                "not a map of per-CPU counters",
            ));
        }
        let mut attr = MapElem {
            map_fd: self.fd.as_raw_fd() as u32,
            key: &key as *const u32 as u64,
            value: values.as_mut_ptr() as u64,
            ..Default::default()
        };
        bpf(BPF_MAP_LOOKUP_ELEM, &mut attr)?;
        Ok(values.iter().sum())
    }

    /// Puts socket `fd` at `key` of a [`Map::sockets`] (the kernel takes the descriptor as
    /// the entry's 32-bit value).
    pub fn set_socket(&self, key: u32, fd: RawFd) -> io::Result<()> {
        self.set_u32(key, fd as u32)
    }

    /// Takes the socket at `key` out of a [`Map::sockets`].
    pub fn clear_socket(&self, key: u32) -> io::Result<()> {
        let mut attr = MapElem {
            map_fd: self.fd.as_raw_fd() as u32,
            key: &key as *const u32 as u64,
            ..Default::default()
        };
        bpf(BPF_MAP_DELETE_ELEM, &mut attr).map(drop)
    }
}

impl AsRawFd for Map {
    fn as_raw_fd(&self) -> RawFd {
        self.fd.as_raw_fd()
    }
}

#[repr(C)]
#[derive(Default)]
struct ProgLoad {
    prog_type: u32,
    insn_cnt: u32,
    insns: u64,
    license: u64,
    log_level: u32,
    log_size: u32,
    log_buf: u64,
    kern_version: u32,
    prog_flags: u32,
    prog_name: [u8; 16],
    prog_ifindex: u32,
    expected_attach_type: u32,
}

#[repr(C)]
#[derive(Default)]
struct TestRun {
    prog_fd: u32,
    retval: u32,
    data_size_in: u32,
    data_size_out: u32,
    data_in: u64,
    data_out: u64,
    repeat: u32,
    duration: u32,
}

/// The verifier refused a program: its log says why.
#[derive(Debug)]
pub struct Refused {
    pub error: io::Error,
    pub log: String,
}

impl fmt::Display for Refused {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "the kernel refused the XDP program: {}", self.error)?;
        // The log's last lines name the instruction and the rule.
        let tail: Vec<&str> = self.log.lines().rev().take(6).collect();
        for line in tail.iter().rev() {
            write!(f, "\n  {line}")?;
        }
        Ok(())
    }
}

impl std::error::Error for Refused {}

/// A loaded XDP program.
pub struct Program {
    fd: OwnedFd,
}

impl Program {
    /// Loads `insns` as an XDP program named `name`.
    pub fn load_xdp(name: &str, insns: &[Insn]) -> Result<Program, Refused> {
        let license = CString::new("GPL").expect("no NUL");
        let mut log = vec![0u8; 1 << 16];
        let mut attr = ProgLoad {
            prog_type: BPF_PROG_TYPE_XDP,
            insn_cnt: insns.len() as u32,
            insns: insns.as_ptr() as u64,
            license: license.as_ptr() as u64,
            log_level: 1,
            log_size: log.len() as u32,
            log_buf: log.as_mut_ptr() as u64,
            prog_name: object_name(name),
            expected_attach_type: BPF_XDP,
            // Multi-buffer aware (BPF_F_XDP_HAS_FRAGS): without it, generic mode drops a
            // frame longer than a page (a peer's UDP GSO batch) before the program runs;
            // with it the program sees the first buffer, which holds the headers.
            prog_flags: BPF_F_XDP_HAS_FRAGS,
            ..Default::default()
        };
        match bpf(BPF_PROG_LOAD, &mut attr) {
            Ok(fd) => Ok(Program { fd: owned(fd) }),
            Err(error) => {
                let end = log.iter().position(|&b| b == 0).unwrap_or(log.len());
                Err(Refused {
                    error,
                    log: String::from_utf8_lossy(&log[..end]).into_owned(),
                })
            }
        }
    }

    /// Runs the program once on `frame` (an Ethernet frame) without any interface, and
    /// returns its verdict (`XDP_PASS`, `XDP_REDIRECT`, ...).
    pub fn test_run(&self, frame: &[u8]) -> io::Result<u32> {
        let mut attr = TestRun {
            prog_fd: self.fd.as_raw_fd() as u32,
            data_size_in: frame.len() as u32,
            data_in: frame.as_ptr() as u64,
            repeat: 1,
            ..Default::default()
        };
        bpf(BPF_PROG_TEST_RUN, &mut attr)?;
        Ok(attr.retval)
    }
}

impl AsRawFd for Program {
    fn as_raw_fd(&self) -> RawFd {
        self.fd.as_raw_fd()
    }
}

#[repr(C)]
#[derive(Default)]
struct LinkCreate {
    prog_fd: u32,
    target_ifindex: u32,
    attach_type: u32,
    flags: u32,
}

/// An XDP program attached to an interface through a BPF link: it stays attached while the
/// link's descriptor is open and leaves when it closes, so also when the process dies, however
/// it dies. The kernel attaches no link over a program already on the interface (EBUSY), so
/// no other tool's program is replaced.
pub struct Link {
    /// Held, never read: closing it detaches the program.
    _fd: OwnedFd,
}

impl Link {
    pub fn xdp(program: &Program, ifindex: u32, mode: XdpMode) -> io::Result<Link> {
        let mut attr = LinkCreate {
            prog_fd: program.as_raw_fd() as u32,
            target_ifindex: ifindex,
            attach_type: BPF_XDP,
            flags: mode.flags(),
        };
        bpf(BPF_LINK_CREATE, &mut attr).map(|fd| Link { _fd: owned(fd) })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A per-CPU counter is summed over every possible CPU, into a buffer the kernel cannot
    /// overrun whatever sysfs says; a map of another kind is refused. Needs CAP_BPF (root).
    #[test]
    fn per_cpu_counters_are_summed_over_every_cpu() {
        let map = match Map::counters("ordo_test_sum", 2) {
            Ok(m) => m,
            Err(e) if e.raw_os_error() == Some(libc::EPERM) => {
                eprintln!("no CAP_BPF: not run");
                return;
            }
            Err(e) => panic!("creating a per-CPU map: {e}"),
        };
        assert_eq!(map.sum(1).unwrap(), 0);
        // Each possible CPU's value set to its number + 1 (an update reads one per CPU).
        let possible = std::fs::read_to_string("/sys/devices/system/cpu/possible").unwrap();
        let cpus = crate::host::topology::parse_cpu_list(&possible).unwrap().len() as u64;
        let values: Vec<u64> = (1..=MAX_CPUS as u64).collect();
        let key = 1u32;
        let mut attr = MapElem {
            map_fd: map.as_raw_fd() as u32,
            key: &key as *const u32 as u64,
            value: values.as_ptr() as u64,
            ..Default::default()
        };
        bpf(BPF_MAP_UPDATE_ELEM, &mut attr).unwrap();
        assert_eq!(map.sum(1).unwrap(), cpus * (cpus + 1) / 2);
        let plain = Map::values("ordo_test_vals", 1).unwrap();
        assert!(plain.sum(0).is_err(), "not a per-CPU map");
    }
}
