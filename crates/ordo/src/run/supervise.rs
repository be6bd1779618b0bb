//! The supervisor of a program under `ordo run`: a seccomp filter with user notification
//! (seccomp_unotify(2)) on the program and its descendants, for what the preload library
//! cannot see. Statically linked programs, Go binaries (which make raw system calls) and the
//! C library's internal calls (its resolver's) reach the kernel without passing through the
//! library; a connection of theirs to a tunnel address would leave by the kernel's own route,
//! outside the tunnel. The filter stops every connect(2) (but the library's own, to the
//! stack: see the filter), every sendmsg(2) and sendmmsg(2), and every sendto(2) with a
//! destination, and hands it here. A TCP or UDP connect to a
//! tunnel address is made through the stack from outside (run/connect.rs); any other call
//! with a destination in the tunnel is refused with ENETUNREACH (fail closed, with a message
//! that says why); the rest goes on to the kernel untouched. The library never gives the
//! kernel a tunnel destination (it hands those connections to the stack), so what is taken
//! over or refused here is only what would have leaked. The filter also stops
//! getsockopt(SO_ERROR), getsockname(2) and getpeername(2), answered here for the stand-ins
//! made from outside (run/stand_ins.rs) and let go on for every other socket.
//!
//! io_uring_setup(2) fails with ENOSYS under the filter (io_uring submits connects and sends
//! that no filter sees; programs fall back to system calls), and so does every system call
//! of another ABI than the native one (i386's socketcall, x32).
//!
//! This keeps programs from leaking by accident; it is not a sandbox against a program that
//! means to escape it: one of its threads could change the destination between the check
//! here and the kernel's own reading of it, which the kernel documents for
//! SECCOMP_USER_NOTIF_FLAG_CONTINUE.
//!
//! The filter needs no privilege, only no_new_privs, which it sets for the program (a
//! setuid program then runs without its privileges, as it ignores LD_PRELOAD anyway).

use super::connect::{self, Answer};
use super::destination::{message_destinations, read_destinations, Call, Refusal};
use super::filter::Filter;
use super::listener::{
    inode, notif_sizes, notif_words, orphaned, respond, send_response, take_fd, thread_group, Caller,
};
use super::stand_ins::StandIns;
use anyhow::{Context, Result};
use ordo_attach::Route;
use std::collections::HashSet;
use std::io;
use std::mem::size_of;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::os::unix::process::CommandExt;
use std::path::PathBuf;
use std::process::{Child, Command};
use std::sync::Arc;
use std::thread::JoinHandle;

/// The most entries of one sendmmsg(2) looked at; the kernel's own limit (UIO_MAXIOV).
const MAX_MMSG: usize = 1024;

/// The pipes over which the child tells the supervisor where its filter's listener is, and
/// waits until the supervisor holds it.
pub struct ListenerHandover {
    /// The parent's ends.
    from_child: OwnedFd,
    to_child: OwnedFd,
    /// The child's ends, as numbers the child inherits; closed in the parent once the child
    /// is spawned ([`ListenerHandover::spawned`]), so that a child that died early reads as the end
    /// of the pipe, not as a wait forever.
    child_ends: std::sync::Mutex<Option<[OwnedFd; 2]>>,
    child_write: RawFd,
    child_read: RawFd,
}

/// A pipe: its read end, its write end.
fn pipe() -> io::Result<(OwnedFd, OwnedFd)> {
    let mut fds = [0; 2];
    // SAFETY: `fds` has room for the two descriptors pipe2 writes.
    if unsafe { libc::pipe2(fds.as_mut_ptr(), libc::O_CLOEXEC) } < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: descriptors pipe2 just made, ours alone.
    Ok(unsafe { (OwnedFd::from_raw_fd(fds[0]), OwnedFd::from_raw_fd(fds[1])) })
}

impl ListenerHandover {
    pub fn new() -> io::Result<ListenerHandover> {
        let (from_child, child_write) = pipe()?;
        let (child_read, to_child) = pipe()?;
        Ok(ListenerHandover {
            from_child,
            to_child,
            child_write: child_write.as_raw_fd(),
            child_read: child_read.as_raw_fd(),
            child_ends: std::sync::Mutex::new(Some([child_write, child_read])),
        })
    }

    /// In the parent, once spawn has returned (either way).
    pub fn spawned(&self) {
        self.child_ends.lock().unwrap_or_else(|p| p.into_inner()).take();
    }

    /// In the child, between fork and exec: no_new_privs, the filter, its listener's number
    /// to the parent, and the parent's word that it has taken it. Only system calls: the
    /// child of a threaded process may not allocate here.
    ///
    /// # Safety
    /// Called in the child after fork, before exec, with `filter` built before the fork.
    pub unsafe fn install_in_child(&self, filter: &Filter) -> io::Result<()> {
        // SAFETY: plain prctl.
        if unsafe { libc::prctl(libc::PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) } != 0 {
            return Err(io::Error::last_os_error());
        }
        let program = libc::sock_fprog {
            len: filter.instructions().len() as u16,
            filter: filter.instructions().as_ptr().cast_mut(),
        };
        // SAFETY: `program` points at the filter's instructions, alive for the call.
        let listener = unsafe {
            libc::syscall(
                libc::SYS_seccomp,
                libc::SECCOMP_SET_MODE_FILTER,
                libc::SECCOMP_FILTER_FLAG_NEW_LISTENER,
                &program as *const libc::sock_fprog,
            )
        };
        if listener < 0 {
            return Err(io::Error::last_os_error());
        }
        // SAFETY: getpid cannot fail.
        let pid = unsafe { libc::getpid() };
        let mut word = [0u8; 8];
        word[..4].copy_from_slice(&pid.to_ne_bytes());
        word[4..].copy_from_slice(&(listener as i32).to_ne_bytes());
        // SAFETY: writing 8 bytes from `word` to our pipe.
        let wrote = unsafe { libc::write(self.child_write, word.as_ptr().cast(), word.len()) };
        let mut answer = 0u8;
        // SAFETY: reading one byte into `answer` from our pipe.
        let read = unsafe { libc::read(self.child_read, (&mut answer as *mut u8).cast(), 1) };
        // SAFETY: the listener is ours; the program does not inherit it.
        unsafe { libc::close(listener as RawFd) };
        if wrote != 8 || read != 1 || answer != b'y' {
            // Not io::Error::other: no allocation here. The parent has the reason.
            return Err(io::Error::from_raw_os_error(libc::EPERM));
        }
        Ok(())
    }

    /// In the parent, on a thread of its own while the child is being spawned: takes the
    /// child's listener (pidfd_getfd) and lets the child go on. An Err leaves the child
    /// failing its spawn.
    pub fn take_listener(&self) -> Result<OwnedFd> {
        let mut word = [0u8; 8];
        read_exact(self.from_child.as_raw_fd(), &mut word).context("reading the child's listener")?;
        let pid = i32::from_ne_bytes(word[..4].try_into().unwrap_or_default());
        let fd = i32::from_ne_bytes(word[4..].try_into().unwrap_or_default());
        let taken = take_fd(pid, fd);
        let answer = if taken.is_ok() { b'y' } else { b'n' };
        // SAFETY: writing one byte to our pipe.
        unsafe { libc::write(self.to_child.as_raw_fd(), (&answer as *const u8).cast(), 1) };
        taken.with_context(|| format!("taking the seccomp listener of process {pid}"))
    }
}

fn read_exact(fd: RawFd, buf: &mut [u8]) -> io::Result<()> {
    let mut done = 0;
    while done < buf.len() {
        // SAFETY: reading into the rest of `buf`.
        let n = unsafe { libc::read(fd, buf[done..].as_mut_ptr().cast(), buf.len() - done) };
        if n < 0 {
            let e = io::Error::last_os_error();
            if e.kind() == io::ErrorKind::Interrupted {
                continue;
            }
            return Err(e);
        }
        if n == 0 {
            return Err(io::ErrorKind::UnexpectedEof.into());
        }
        done += n as usize;
    }
    Ok(())
}

/// What becomes of one stopped system call.
#[derive(Debug, PartialEq, Eq)]
enum Verdict {
    /// The kernel carries it out.
    Continue,
    /// A connect to the tunnel: made through the stack from outside, to `dest`; the program
    /// is told it is connected to `shown` (the address it asked for: a DNS query to the
    /// host's server goes to the tunnel's).
    Connect {
        fd: RawFd,
        dest: SocketAddr,
        shown: SocketAddr,
    },
    /// It fails with ENETUNREACH, for this reason.
    Refuse(Refusal),
    /// getsockopt(SO_ERROR): answered here if the socket is a stand-in whose connect failed.
    SocketError { fd: RawFd, value: u64, len: u64 },
    /// getsockname or getpeername (`peer`): answered here if the socket is a stand-in.
    Name { fd: RawFd, addr: u64, len: u64, peer: bool },
    /// prctl(PR_SET_DUMPABLE, 0): fails with EPERM, so that the program's memory stays
    /// readable here and its calls can be judged.
    StayDumpable,
}

/// Set, the supervisor panics at its first stopped call: how the leak suite sees that a
/// panic of `ordo run` ends its program too (tests/stack/stack.sh, t_leaks).
const TEST_PANIC_ENV: &str = "ORDO_TEST_SUPERVISOR_PANIC";

/// SECCOMP_IOCTL_NOTIF_SET_FLAGS's one flag (linux/seccomp.h, Linux 6.6), which the libc
/// crate does not define.
const SECCOMP_USER_NOTIF_FD_SYNC_WAKE_UP: u64 = 1;

/// The supervisor's side: answers the filter's notifications until the listener ends.
pub struct Supervisor {
    listener: Arc<OwnedFd>,
    routes: Vec<Route>,
    /// The tunnel's name servers (`DNS =`): DNS queries to others go to them.
    dns: Vec<IpAddr>,
    /// The stack's attach socket, for connects made from outside.
    socket: PathBuf,
    /// What each process was told already (one message of each kind).
    told: HashSet<(u32, &'static str)>,
    /// The stand-ins made from outside, for SO_ERROR and their names.
    stand_ins: StandIns,
}

impl Supervisor {
    pub fn new(listener: OwnedFd, routes: Vec<Route>, dns: Vec<IpAddr>, socket: PathBuf) -> Supervisor {
        // Each stopped call wakes this thread and then the caller: with the synchronous
        // wake-up (Linux 6.6), each of the two wakes the other on the CPU it runs on, as a
        // direct switch, instead of waking an idle CPU. Without it (older kernels) the
        // calls are answered the same, only slower.
        // SAFETY: an ioctl on our listener with a flags word.
        unsafe {
            libc::ioctl(
                listener.as_raw_fd(),
                libc::SECCOMP_IOCTL_NOTIF_SET_FLAGS,
                SECCOMP_USER_NOTIF_FD_SYNC_WAKE_UP,
            )
        };
        Supervisor {
            listener: Arc::new(listener),
            routes,
            dns,
            socket,
            told: HashSet::new(),
            stand_ins: StandIns::default(),
        }
    }

    /// Answers notifications on a thread of its own, for as long as the program (or a
    /// process it started) runs.
    pub fn spawn(self) -> Result<JoinHandle<()>> {
        std::thread::Builder::new()
            .name("ordo-supervise".into())
            .spawn(move || self.run())
            .context("starting the supervisor")
    }

    fn run(mut self) {
        let panic_at_first = std::env::var_os(TEST_PANIC_ENV).is_some();
        let mut notif = vec![0u64; notif_words().0];
        loop {
            notif.fill(0);
            // SAFETY: `notif` has room for the kernel's seccomp_notif.
            if unsafe {
                libc::ioctl(
                    self.listener.as_raw_fd(),
                    libc::SECCOMP_IOCTL_NOTIF_RECV,
                    notif.as_mut_ptr(),
                )
            } < 0
            {
                match io::Error::last_os_error().raw_os_error() {
                    Some(libc::EINTR) => continue,
                    // The caller died before we read it, or no process is left under the
                    // filter: then every receive fails at once, and waiting on would spin.
                    Some(libc::ENOENT) if !orphaned(&self.listener) => continue,
                    _ => return,
                }
            }
            assert!(
                !panic_at_first,
                "{TEST_PANIC_ENV} is set: the supervisor panics at its first stopped call"
            );
            // SAFETY: the buffer is at least a seccomp_notif, aligned, filled by the kernel.
            let n: libc::seccomp_notif = unsafe { std::ptr::read(notif.as_ptr().cast()) };
            // Its memory opened, then the call checked to still wait: what is read and
            // written below is the caller's, not a process that took its number since.
            let Some(caller) = Caller::open(&self.listener, n.id, n.pid) else {
                continue;
            };
            let verdict = self.judge(&n, &caller);
            self.answer(&n, &caller, verdict);
        }
    }

    fn answer(&mut self, n: &libc::seccomp_notif, caller: &Caller, verdict: Verdict) {
        let listener = &self.listener;
        match verdict {
            Verdict::Continue => go_on(listener, n.id),
            Verdict::Connect { fd, dest, shown } => {
                let call = connect::Stopped {
                    listener,
                    stand_ins: &self.stand_ins,
                    id: n.id,
                    caller,
                    fd,
                };
                match connect::connect(call, &self.socket, dest, shown) {
                    Ok(Answer::Now(value)) => respond(listener, n.id, value),
                    Ok(Answer::Later) => {}
                    Err(errno) => {
                        respond(listener, n.id, -errno);
                        if errno == libc::ENETUNREACH {
                            let why = if shown == dest {
                                Refusal::Tunnel(dest)
                            } else {
                                Refusal::DnsNotCarried {
                                    asked: shown,
                                    server: dest,
                                }
                            };
                            self.tell(n.pid, why);
                        }
                    }
                }
            }
            Verdict::Refuse(why) => {
                respond(listener, n.id, -libc::ENETUNREACH);
                self.tell(n.pid, why);
            }
            Verdict::StayDumpable => {
                respond(listener, n.id, -libc::EPERM);
                self.tell_once(
                    n.pid,
                    "dumpable",
                    "asked not to be dumpable: refused (EPERM), so that where its connections go can still be \
                     read and checked",
                );
            }
            Verdict::SocketError { fd, value, len } => {
                let stand_in = caller
                    .take_fd(listener, n.id, fd)
                    .ok()
                    .and_then(|c| inode(c.as_raw_fd()));
                match stand_in.and_then(|i| self.stand_ins.take_error(i)) {
                    Some(errno) if write_int_option(caller, value, len, errno).is_some() => respond(listener, n.id, 0),
                    _ => go_on(listener, n.id),
                }
            }
            Verdict::Name { fd, addr, len, peer } => {
                let stand_in = caller
                    .take_fd(listener, n.id, fd)
                    .ok()
                    .and_then(|c| inode(c.as_raw_fd()));
                match stand_in.and_then(|i| self.stand_ins.names(i)) {
                    None => go_on(listener, n.id),
                    Some(names) if peer && !names.connected => respond(listener, n.id, -libc::ENOTCONN),
                    Some(names) => {
                        let name = if peer {
                            names.remote
                        } else {
                            names.local.unwrap_or_else(|| unspecified(names.remote))
                        };
                        match write_sockaddr(caller, addr, len, names.family, name) {
                            Some(()) => respond(listener, n.id, 0),
                            None => respond(listener, n.id, -libc::EFAULT),
                        }
                    }
                }
            }
        }
    }

    /// The verdict on one stopped call: a connect to the tunnel is carried, a send with any
    /// destination in the tunnel refused, and so is any call whose destination cannot be read
    /// for certain.
    fn judge(&self, n: &libc::seccomp_notif, caller: &Caller) -> Verdict {
        let args = n.data.args;
        let destinations = match i64::from(n.data.nr) {
            libc::SYS_connect => {
                return match read_destinations(caller, args[1], args[2], Call::Connect) {
                    Err(why) => Verdict::Refuse(why),
                    Ok(d) => match d.first() {
                        Some(&dest) if ordo_attach::through_tunnel(&self.routes, dest.ip()) => Verdict::Connect {
                            fd: args[0] as RawFd,
                            dest,
                            shown: dest,
                        },
                        Some(&shown) => match ordo_attach::dns_redirect(&self.routes, &self.dns, shown) {
                            Some(dest) => Verdict::Connect {
                                fd: args[0] as RawFd,
                                dest,
                                shown,
                            },
                            None => Verdict::Continue,
                        },
                        _ => Verdict::Continue,
                    },
                };
            }
            libc::SYS_getsockname | libc::SYS_getpeername => {
                return Verdict::Name {
                    fd: args[0] as RawFd,
                    addr: args[1],
                    len: args[2],
                    peer: i64::from(n.data.nr) == libc::SYS_getpeername,
                };
            }
            libc::SYS_getsockopt => {
                return Verdict::SocketError {
                    fd: args[0] as RawFd,
                    value: args[3],
                    len: args[4],
                };
            }
            libc::SYS_prctl if args[0] == libc::PR_SET_DUMPABLE as u64 && args[1] == 0 => {
                return Verdict::StayDumpable;
            }
            libc::SYS_sendto => vec![read_destinations(caller, args[4], args[5], Call::Send)],
            libc::SYS_sendmsg => vec![message_destinations(caller, args[1])],
            libc::SYS_sendmmsg => (0..(args[2] as usize).min(MAX_MMSG))
                .map(|i| message_destinations(caller, args[1] + (i * size_of::<libc::mmsghdr>()) as u64))
                .collect(),
            _ => return Verdict::Continue,
        };
        let mut all = Vec::new();
        for d in destinations {
            match d {
                Ok(d) => all.extend(d),
                Err(why) => return Verdict::Refuse(why),
            }
        }
        for d in all {
            if ordo_attach::through_tunnel(&self.routes, d.ip()) {
                return Verdict::Refuse(Refusal::Tunnel(d));
            }
            if ordo_attach::dns_redirect(&self.routes, &self.dns, d).is_some() {
                return Verdict::Refuse(Refusal::Dns(d));
            }
        }
        Verdict::Continue
    }

    /// One message per process and kind of refusal: why its call failed.
    fn tell(&mut self, tid: u32, why: Refusal) {
        match why {
            Refusal::Tunnel(dest) => self.tell_once(
                tid,
                "tunnel",
                &format!(
                    "reached for {dest} without the C library (a static or Go program, or a raw system call): \
                     refused (ENETUNREACH) rather than let it leave by the kernel's route. Programs that bypass the \
                     C library are carried through the stack for TCP and connected UDP only; run others with \
                     `ordo up` and TUN"
                ),
            ),
            Refusal::Unreadable => self.tell_once(
                tid,
                "unreadable",
                "made a connect or a send whose destination cannot be read (the process is not dumpable, or the \
                 address is not in its memory): refused (ENETUNREACH), since it could be a tunnel address. Run \
                 programs that must not be dumpable with `ordo up` and TUN",
            ),
            Refusal::Dns(dest) => self.tell_once(
                tid,
                "dns",
                &format!(
                    "sent a DNS query to {dest}, a name server outside the tunnel, from an unconnected socket while \
                     the tunnel has its own (DNS =): refused (ENETUNREACH) rather than let the name leave outside \
                     the tunnel (a connected socket's queries go to the tunnel's server)"
                ),
            ),
            Refusal::DnsNotCarried { asked, server } => self.tell_once(
                tid,
                "dns",
                &format!(
                    "connected to {asked} for DNS, a name server outside the tunnel, which goes to the tunnel's \
                     server {server} instead (DNS =); that connection cannot be carried (a socket neither TCP nor \
                     UDP): refused (ENETUNREACH) rather than let the name leave outside the tunnel"
                ),
            ),
            Refusal::Short { family, len } => self.tell_once(
                tid,
                "short",
                &format!(
                    "gave a socket address of family {family} and {len} bytes, too short to hold an IP address: \
                     refused (ENETUNREACH) rather than guess where the kernel would send it"
                ),
            ),
        }
    }

    fn tell_once(&mut self, tid: u32, kind: &'static str, what: &str) {
        let pid = thread_group(tid).unwrap_or(tid);
        if !self.told.insert((pid, kind)) {
            return;
        }
        let name = std::fs::read_to_string(format!("/proc/{tid}/comm")).unwrap_or_default();
        eprintln!("ordo run: {} (pid {pid}) {what}.", name.trim());
    }
}

/// Lets the stopped call `id` go on to the kernel.
fn go_on(listener: &OwnedFd, id: u64) {
    send_response(
        listener,
        libc::seccomp_notif_resp {
            id,
            val: 0,
            error: 0,
            flags: libc::SECCOMP_USER_NOTIF_FLAG_CONTINUE as u32,
        },
    );
}

/// The unspecified address of `like`'s family, port 0: a stand-in's name before the stack
/// has told it.
fn unspecified(like: SocketAddr) -> SocketAddr {
    match like {
        SocketAddr::V4(_) => SocketAddr::from((Ipv4Addr::UNSPECIFIED, 0)),
        SocketAddr::V6(_) => SocketAddr::from((Ipv6Addr::UNSPECIFIED, 0)),
    }
}

/// `addr` as a socket address of `family` (an IPv4 one in an IPv6 socket is mapped).
fn sockaddr_bytes(family: i32, addr: SocketAddr) -> Vec<u8> {
    let (ip, port) = (addr.ip(), addr.port());
    if family == libc::AF_INET6 {
        let v6 = match ip {
            IpAddr::V4(v4) => v4.to_ipv6_mapped(),
            IpAddr::V6(v6) => v6,
        };
        let mut b = vec![0u8; size_of::<libc::sockaddr_in6>()];
        b[..2].copy_from_slice(&(libc::AF_INET6 as u16).to_ne_bytes());
        b[2..4].copy_from_slice(&port.to_be_bytes());
        b[8..24].copy_from_slice(&v6.octets());
        b
    } else {
        let v4 = match ip {
            IpAddr::V4(v4) => v4,
            IpAddr::V6(v6) => v6.to_ipv4_mapped().unwrap_or(Ipv4Addr::UNSPECIFIED),
        };
        let mut b = vec![0u8; size_of::<libc::sockaddr_in>()];
        b[..2].copy_from_slice(&(libc::AF_INET as u16).to_ne_bytes());
        b[2..4].copy_from_slice(&port.to_be_bytes());
        b[4..8].copy_from_slice(&v4.octets());
        b
    }
}

/// Writes `addr` as getsockname(2) does: at most the program's `*len` bytes at `address`,
/// and the whole length at `len_address`.
fn write_sockaddr(caller: &Caller, address: u64, len_address: u64, family: i32, addr: SocketAddr) -> Option<()> {
    let mut len = [0u8; 4];
    caller.read(len_address, &mut len)?;
    let room = u32::from_ne_bytes(len) as usize;
    let bytes = sockaddr_bytes(family, addr);
    let n = room.min(bytes.len());
    if n > 0 {
        caller.write(address, &bytes[..n])?;
    }
    caller.write(len_address, &(bytes.len() as u32).to_ne_bytes())
}

/// Writes `value` as an int socket option's answer: at `address`, its length (4) at
/// `len_address`, if the program's buffer has room for it.
fn write_int_option(caller: &Caller, address: u64, len_address: u64, value: i32) -> Option<()> {
    let mut len = [0u8; 4];
    caller.read(len_address, &mut len)?;
    if u32::from_ne_bytes(len) < 4 {
        return None;
    }
    caller.write(address, &value.to_ne_bytes())?;
    caller.write(len_address, &4u32.to_ne_bytes())
}

/// A program started under the filter, and the thread that answers its filter's
/// notifications (it ends when no process is left under the filter).
pub struct Supervised {
    pub child: Child,
    pub supervisor: JoinHandle<()>,
}

/// Spawns `command` under the filter, with the supervisor answering for it: TCP and UDP
/// connects to `routes` made through the stack at `socket`, other calls with destinations
/// in them refused. The filter is set in the child between fork and exec, and its listener
/// handed to this process over [`ListenerHandover`].
pub fn spawn(command: &mut Command, routes: Vec<Route>, dns: Vec<IpAddr>, socket: PathBuf) -> Result<Supervised> {
    notif_sizes().context(
        "this kernel has no seccomp user notification: programs that bypass the C library could not be kept \
         from the kernel's route",
    )?;
    let filter = Arc::new(Filter::new());
    let handover = Arc::new(ListenerHandover::new().context("making the supervisor's pipes")?);
    let in_child = handover.clone();
    // SAFETY: install_in_child makes only system calls, with the filter built here.
    unsafe { command.pre_exec(move || in_child.install_in_child(&filter)) };
    let taker = {
        let handover = handover.clone();
        std::thread::spawn(move || handover.take_listener())
    };
    let spawned = command.spawn();
    handover.spawned();
    let listener = taker
        .join()
        .unwrap_or_else(|_| Err(anyhow::anyhow!("the supervisor's thread panicked")));
    match (spawned, listener) {
        (Ok(child), Ok(listener)) => {
            let supervisor = Supervisor::new(listener, routes, dns, socket).spawn()?;
            Ok(Supervised { child, supervisor })
        }
        // The child stopped before exec because the listener was not taken: the reason is
        // this side's.
        (Err(_), Err(why)) => Err(why).context("cannot supervise the program (run it with `ordo up` and TUN)"),
        (Err(e), Ok(_)) => Err(e.into()),
        (Ok(mut child), Err(why)) => {
            let _ = child.kill();
            Err(why).context("the program started unsupervised, and was stopped")
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A stand-in for the stack's attach service: every connect asked of it fails with
    /// EHOSTDOWN, an errno nothing else here gives, so that a call taken to the stack shows.
    fn refusing_stack() -> PathBuf {
        let dir = std::env::temp_dir().join(format!("ordo-supervise-test-{}", std::process::id()));
        let _ = std::fs::create_dir_all(&dir);
        let path = dir.join("attach.sock");
        let _ = std::fs::remove_file(&path);
        let listener = std::os::unix::net::UnixListener::bind(&path).unwrap();
        std::thread::spawn(move || {
            for mut conn in listener.incoming().flatten() {
                use std::io::{Read, Write};
                let mut request = [0u8; ordo_attach::REQUEST_LEN];
                let _ = conn.read_exact(&mut request);
                let reply = ordo_attach::Reply {
                    errno: libc::EHOSTDOWN,
                    local: None,
                    remote: None,
                    marker: None,
                };
                let _ = conn.write_all(&reply.encode());
            }
        });
        path
    }

    /// The filter on a real child: a TCP connect to an address the "tunnel" holds is taken to
    /// the stack (EHOSTDOWN from the stand-in above), one elsewhere reaches the kernel
    /// (ECONNREFUSED from loopback); sendto and sendmsg with a tunnel destination fail
    /// unless marked as the library's checked sends (to port 0, which the kernel refuses
    /// with EINVAL once a send is let by), and io_uring is not there. The forms a program
    /// may give by accident are judged as the kernel reads them: a sendto with family 0
    /// (AF_UNSPEC, IPv4 to the kernel), a connect with an IPv4 address the length of a
    /// sockaddr_un (a union of socket addresses), an address too short to read; and the
    /// program may not make itself undumpable (its destinations could no longer be read).
    #[test]
    fn a_child_under_the_filter() {
        let routes = vec![Route {
            addr: "192.0.2.0".parse().unwrap(),
            prefix: 24,
        }];
        let script = "import socket, errno, sys, ctypes, struct\n\
            libc = ctypes.CDLL(None, use_errno=True)\n\
            out = []\n\
            def err(r): return 'ok' if r >= 0 else errno.errorcode[ctypes.get_errno()]\n\
            s = socket.socket()\n\
            try: s.connect(('192.0.2.7', 80)); out.append('connected')\n\
            except OSError as e: out.append(errno.errorcode[e.errno])\n\
            s = socket.socket()\n\
            try: s.connect(('127.0.0.1', 9)); out.append('connected')\n\
            except OSError as e: out.append(errno.errorcode[e.errno])\n\
            u = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)\n\
            try: u.sendto(b'x', ('192.0.2.7', 53)); out.append('sent')\n\
            except OSError as e: out.append(errno.errorcode[e.errno])\n\
            u.sendto(b'x', ('127.0.0.1', 9)); out.append('sent')\n\
            to = ('192.0.2.7', 0)\n\
            for send in (lambda f: u.sendto(b'x', f, to), lambda f: u.sendmsg([b'x'], [], f, to)):\n\
            \x20   for flags in (0, CHECKED):\n\
            \x20       try: send(flags); out.append('sent')\n\
            \x20       except OSError as e: out.append(errno.errorcode[e.errno])\n\
            def sin(family, ip, port, size):\n\
            \x20   b = struct.pack('=HH4s', family, socket.htons(port), socket.inet_aton(ip))\n\
            \x20   return ctypes.create_string_buffer(b + bytes(max(0, size - len(b))), max(size, len(b)))\n\
            for family, ip in ((0, '192.0.2.7'), (0, '127.0.0.1'), (2, '192.0.2.7')):\n\
            \x20   out.append(err(libc.sendto(u.fileno(), b'x', 1, 0, sin(family, ip, 0, 16), 16)))\n\
            out.append(err(libc.sendto(u.fileno(), b'x', 1, 0, sin(2, '127.0.0.1', 9, 16), 8)))\n\
            t = socket.socket()\n\
            out.append(err(libc.connect(t.fileno(), sin(2, '192.0.2.7', 9, 110), 110)))\n\
            out.append(err(libc.prctl(4, 0, 0, 0, 0)) + str(libc.prctl(3, 0, 0, 0, 0)))\n\
            print(' '.join(out))\n";
        let script = format!("CHECKED = {}\n{script}", ordo_attach::CHECKED_SEND);
        let mut command = Command::new("python3");
        command.args(["-c", &script]).stdout(std::process::Stdio::piped());
        let Supervised { child, supervisor } =
            spawn(&mut command, routes, Vec::new(), refusing_stack()).expect("spawning python3 under the filter");
        let out = child.wait_with_output().unwrap();
        assert_eq!(
            String::from_utf8_lossy(&out.stdout).trim(),
            "EHOSTDOWN ECONNREFUSED ENETUNREACH sent ENETUNREACH EINVAL ENETUNREACH EINVAL \
             ENETUNREACH EINVAL ENETUNREACH ENETUNREACH EHOSTDOWN EPERM1"
        );
        // With the program gone, the supervisor ends (it used to spin on the receive's ENOENT
        // for as long as `ordo run` lingered).
        let gone = std::time::Instant::now() + std::time::Duration::from_secs(5);
        while !supervisor.is_finished() && std::time::Instant::now() < gone {
            std::thread::sleep(std::time::Duration::from_millis(10));
        }
        assert!(supervisor.is_finished(), "the supervisor outlived the program by 5 s");
    }
}
