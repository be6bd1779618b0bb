//! Putting Ordo's program on an interface, in the best mode the interface allows, or saying
//! why it cannot be done so that the caller carries on over kernel UDP: missing privileges,
//! another program already on the interface, a kernel or driver without XDP.

use super::bpf::{Link, Map, Program, Refused, XdpMode};
use super::filter::{self, Filter, Verdict};
use std::fmt;
use std::io;
use std::os::fd::{AsRawFd, RawFd};

/// Where the program runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mode {
    /// In the driver, before the kernel allocates anything for the frame.
    Native,
    /// After the kernel built its socket buffer: any interface, slower, and it does not
    /// split a peer's UDP GSO batches (../shared/notes/afxdp-facts.md).
    Generic,
}

impl std::str::FromStr for Mode {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s.trim().to_ascii_lowercase().as_str() {
            "native" => Ok(Mode::Native),
            "generic" => Ok(Mode::Generic),
            _ => Err(format!("unknown XDP mode {s:?} (native or generic)")),
        }
    }
}

impl fmt::Display for Mode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Mode::Native => "native",
            Mode::Generic => "generic",
        })
    }
}

/// Ordo's program on an interface, with its maps; it leaves when this is dropped.
pub struct Attachment {
    pub link: Link,
    pub program: Program,
    /// The AF_XDP sockets the program redirects to, by index.
    pub sockets: Map,
    /// The program's verdicts ([`Verdict`]).
    pub counters: Map,
    /// What the program reads as it runs: the listen port ([`filter::PORT_KEY`]).
    pub settings: Map,
    pub mode: Mode,
}

/// Why the program is not on the interface.
#[derive(Debug)]
pub enum Unavailable {
    /// Loading or attaching needs CAP_BPF (or CAP_SYS_ADMIN) and CAP_NET_ADMIN.
    NotPermitted(io::Error),
    /// Another XDP program is on the interface; Ordo does not replace what it does not own.
    Busy,
    /// The kernel or the interface has no XDP for Ordo.
    Unsupported(io::Error),
    /// The kernel's verifier refused the program (a bug of Ordo's).
    Refused(Refused),
}

impl fmt::Display for Unavailable {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Unavailable::NotPermitted(e) => {
                write!(f, "not permitted ({e}): XDP needs CAP_BPF and CAP_NET_ADMIN")
            }
            Unavailable::Busy => write!(f, "another XDP program is attached to the interface"),
            Unavailable::Unsupported(e) => write!(f, "the kernel or the interface has no XDP for Ordo ({e})"),
            Unavailable::Refused(r) => write!(f, "{r}"),
        }
    }
}

impl std::error::Error for Unavailable {}

fn classify(e: io::Error) -> Unavailable {
    match e.raw_os_error() {
        Some(libc::EPERM) | Some(libc::EACCES) => Unavailable::NotPermitted(e),
        Some(libc::EBUSY) | Some(libc::EEXIST) => Unavailable::Busy,
        _ => Unavailable::Unsupported(e),
    }
}

/// Loads the program for `filter` with room for `sockets` AF_XDP sockets and attaches it to
/// interface `ifindex`: in `mode` if given, else natively where the driver can and in
/// generic mode where it cannot.
pub fn attach(ifindex: u32, filter: &Filter, sockets: u32, mode: Option<Mode>) -> Result<Attachment, Unavailable> {
    let socket_map = Map::sockets("ordo_xsks", sockets.max(1)).map_err(classify)?;
    let counters = Map::counters("ordo_verdicts", Verdict::ALL.len() as u32).map_err(classify)?;
    let settings = Map::values("ordo_settings", filter::SETTINGS).map_err(classify)?;
    settings
        .set_u32(filter::PORT_KEY, filter::port_value(filter.port))
        .map_err(classify)?;
    let insns = filter.program(socket_map.as_raw_fd(), counters.as_raw_fd(), settings.as_raw_fd());
    let program = match Program::load_xdp("ordo", &insns) {
        Ok(p) => p,
        Err(r) if matches!(r.error.raw_os_error(), Some(libc::EPERM) | Some(libc::EACCES)) => {
            return Err(Unavailable::NotPermitted(r.error))
        }
        Err(r) => return Err(Unavailable::Refused(r)),
    };
    let (link, mode) = match mode {
        Some(Mode::Generic) => (
            Link::xdp(&program, ifindex, XdpMode::Generic).map_err(classify)?,
            Mode::Generic,
        ),
        Some(Mode::Native) => (
            Link::xdp(&program, ifindex, XdpMode::Native).map_err(classify)?,
            Mode::Native,
        ),
        None => attach_best(&program, ifindex)?,
    };
    Ok(Attachment {
        link,
        program,
        sockets: socket_map,
        counters,
        settings,
        mode,
    })
}

/// Native where the driver can, else generic.
fn attach_best(program: &Program, ifindex: u32) -> Result<(Link, Mode), Unavailable> {
    match Link::xdp(program, ifindex, XdpMode::Native) {
        Ok(link) => Ok((link, Mode::Native)),
        // A driver without native XDP says it does not support the operation.
        Err(e) if matches!(e.raw_os_error(), Some(libc::EOPNOTSUPP) | Some(libc::EINVAL)) => {
            let link = Link::xdp(program, ifindex, XdpMode::Generic).map_err(classify)?;
            Ok((link, Mode::Generic))
        }
        Err(e) => Err(classify(e)),
    }
}

impl Attachment {
    /// Has the program take datagrams to `port` from now on (no privilege needed).
    pub fn set_port(&self, port: u16) -> io::Result<()> {
        self.settings.set_u32(filter::PORT_KEY, filter::port_value(port))
    }

    /// Each verdict's count so far, summed over the CPUs.
    pub fn verdicts(&self) -> Vec<(Verdict, u64)> {
        Verdict::ALL
            .iter()
            .map(|v| (*v, self.counters.sum(*v as u32).unwrap_or(0)))
            .collect()
    }
}

/// `SOL_XDP` and its `XDP_OPTIONS` (include/uapi/linux/if_xdp.h).
const SOL_XDP: libc::c_int = 283;
const XDP_OPTIONS: libc::c_int = 8;
const XDP_OPTIONS_ZEROCOPY: u32 = 1;

/// Whether the bound AF_XDP socket `fd` runs zero-copy (the driver's own rings in the UMEM)
/// rather than copying each frame.
pub fn zero_copy(fd: RawFd) -> io::Result<bool> {
    let mut flags = 0u32;
    let mut len = std::mem::size_of::<u32>() as libc::socklen_t;
    // SAFETY: the kernel writes at most `len` bytes into `flags`, a u32 of that size.
    let r = unsafe { libc::getsockopt(fd, SOL_XDP, XDP_OPTIONS, (&mut flags as *mut u32).cast(), &mut len) };
    if r != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(flags & XDP_OPTIONS_ZEROCOPY != 0)
}
