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
use super::listener::{inode, notif_sizes, notif_words, orphaned, respond, send_response, take_fd, thread_group};
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

#[cfg(target_arch = "x86_64")]
const AUDIT_ARCH: u32 = 0xC000_003E;
#[cfg(target_arch = "aarch64")]
const AUDIT_ARCH: u32 = 0xC000_00B7;
/// x32 system calls carry this bit in their number on x86_64.
const X32_SYSCALL_BIT: u32 = 0x4000_0000;

/// Where in `struct seccomp_data` the filter reads: the number, the ABI, the 2nd, 3rd and
/// 4th arguments' low words (getsockopt's level and name; sendmsg's flags; sendto's and
/// sendmmsg's flags), the 5th argument (sendto's destination) as two 32-bit words,
/// little-endian.
const DATA_NR: u32 = 0;
const DATA_ARCH: u32 = 4;
const DATA_ARG1_LOW: u32 = 16 + 8;
const DATA_ARG2_LOW: u32 = 16 + 2 * 8;
const DATA_ARG3_LOW: u32 = 16 + 3 * 8;
const DATA_ARG4_LOW: u32 = 16 + 4 * 8;
const DATA_ARG4_HIGH: u32 = DATA_ARG4_LOW + 4;

/// The most entries of one sendmmsg(2) looked at; the kernel's own limit (UIO_MAXIOV).
const MAX_MMSG: usize = 1024;
/// The largest socket address read from a program.
const MAX_SOCKADDR: usize = 128;

/// The filter's program, built before the fork (the child may not allocate).
pub struct Filter {
    instructions: Vec<libc::sock_filter>,
}

/// Where a jump of the filter goes.
#[derive(Clone, Copy, PartialEq, Eq)]
enum To {
    Next,
    Allow,
    Notify,
    NoSys,
    /// sendto: stopped only with a destination, unless the library checked it.
    Sendto,
    /// sendmsg, sendmmsg: stopped unless the library checked their destinations.
    Sendmsg,
    Sendmmsg,
    /// getsockopt: stopped only for SO_ERROR.
    Sockopt,
    /// connect: stopped unless its address is a whole sockaddr_un.
    Connect,
}

/// One step of the filter, before its jumps are counted.
enum Step {
    Load(u32),
    Jump {
        code: u32,
        k: u32,
        yes: To,
        no: To,
    },
    Return(u32),
    /// Where a named target is: the next step.
    Here(To),
}

/// The filter's steps as BPF: a jump's target named, its offset counted here.
fn assemble(steps: &[Step]) -> Vec<libc::sock_filter> {
    const LOAD: u32 = libc::BPF_LD | libc::BPF_W | libc::BPF_ABS;
    const RET: u32 = libc::BPF_RET | libc::BPF_K;
    let mut at = Vec::new();
    let mut pc = 0;
    for s in steps {
        match s {
            Step::Here(to) => at.push((*to, pc)),
            _ => pc += 1,
        }
    }
    let target = |to: To, pc: usize| -> u8 {
        if to == To::Next {
            return 0;
        }
        let (_, i) = at.iter().find(|(t, _)| *t == to).expect("every target is placed");
        (i - pc - 1) as u8
    };
    let mut out = Vec::new();
    for s in steps {
        let pc = out.len();
        let (code, k, jt, jf) = match *s {
            Step::Load(offset) => (LOAD, offset, 0, 0),
            Step::Jump { code, k, yes, no } => (code, k, target(yes, pc), target(no, pc)),
            Step::Return(verdict) => (RET, verdict, 0, 0),
            Step::Here(_) => continue,
        };
        out.push(libc::sock_filter {
            code: code as u16,
            jt,
            jf,
            k,
        });
    }
    out
}

impl Filter {
    pub fn new() -> Filter {
        const JEQ: u32 = libc::BPF_JMP | libc::BPF_JEQ | libc::BPF_K;
        const JGE: u32 = libc::BPF_JMP | libc::BPF_JGE | libc::BPF_K;
        const JSET: u32 = libc::BPF_JMP | libc::BPF_JSET | libc::BPF_K;
        let checked = |yes: To, no: To| Step::Jump {
            code: JSET,
            k: ordo_attach::CHECKED_SEND as u32,
            yes,
            no,
        };
        let jeq = |k: u32, yes: To, no: To| Step::Jump { code: JEQ, k, yes, no };
        let is = |nr: libc::c_long, yes: To| jeq(nr as u32, yes, To::Next);
        let steps = [
            Step::Load(DATA_ARCH),
            jeq(AUDIT_ARCH, To::Next, To::NoSys),
            Step::Load(DATA_NR),
            Step::Jump {
                code: JGE,
                k: X32_SYSCALL_BIT,
                yes: To::NoSys,
                no: To::Next,
            },
            is(libc::SYS_connect, To::Connect),
            is(libc::SYS_sendmsg, To::Sendmsg),
            is(libc::SYS_sendmmsg, To::Sendmmsg),
            is(libc::SYS_getsockname, To::Notify),
            is(libc::SYS_getpeername, To::Notify),
            is(libc::SYS_io_uring_setup, To::NoSys),
            is(libc::SYS_getsockopt, To::Sockopt),
            jeq(libc::SYS_sendto as u32, To::Sendto, To::Allow),
            // The library's own sends, their destinations checked (ordo_attach::CHECKED_SEND):
            // a stop for each would cost a tunnel datagram of an unconnected socket, and a
            // datagram to the host's networks, a round trip to this process.
            Step::Here(To::Sendmsg),
            Step::Load(DATA_ARG2_LOW),
            checked(To::Allow, To::Notify),
            Step::Here(To::Sendmmsg),
            Step::Load(DATA_ARG3_LOW),
            checked(To::Allow, To::Notify),
            // sendto: only with a destination (a null pointer is a plain send).
            Step::Here(To::Sendto),
            Step::Load(DATA_ARG3_LOW),
            checked(To::Allow, To::Next),
            Step::Load(DATA_ARG4_LOW),
            jeq(0, To::Next, To::Notify),
            Step::Load(DATA_ARG4_HIGH),
            jeq(0, To::Allow, To::Notify),
            // connect: not with an address the size of a whole sockaddr_un, as the preload
            // library gives when it reaches the stack (it never gives the kernel a tunnel
            // address): a connect per connection spared. Nothing else gives an IPv4 or
            // IPv6 address that length but a program that means to slip by.
            Step::Here(To::Connect),
            Step::Load(DATA_ARG2_LOW),
            jeq(size_of::<libc::sockaddr_un>() as u32, To::Allow, To::Notify),
            // getsockopt: only SO_ERROR (how a connect made from outside ended).
            Step::Here(To::Sockopt),
            Step::Load(DATA_ARG1_LOW),
            jeq(libc::SOL_SOCKET as u32, To::Next, To::Allow),
            Step::Load(DATA_ARG2_LOW),
            jeq(libc::SO_ERROR as u32, To::Notify, To::Allow),
            Step::Here(To::Allow),
            Step::Return(libc::SECCOMP_RET_ALLOW),
            Step::Here(To::Notify),
            Step::Return(libc::SECCOMP_RET_USER_NOTIF),
            Step::Here(To::NoSys),
            Step::Return(libc::SECCOMP_RET_ERRNO | libc::ENOSYS as u32),
        ];
        Filter {
            instructions: assemble(&steps),
        }
    }
}

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
            len: filter.instructions.len() as u16,
            filter: filter.instructions.as_ptr().cast_mut(),
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
    /// A connect to the tunnel: made through the stack from outside.
    Connect { fd: RawFd, dest: SocketAddr },
    /// It fails with ENETUNREACH: its destination is in the tunnel.
    Refuse(SocketAddr),
    /// getsockopt(SO_ERROR): answered here if the socket is a stand-in whose connect failed.
    SocketError { fd: RawFd, value: u64, len: u64 },
    /// getsockname or getpeername (`peer`): answered here if the socket is a stand-in.
    Name { fd: RawFd, addr: u64, len: u64, peer: bool },
}

/// SECCOMP_IOCTL_NOTIF_SET_FLAGS's one flag (linux/seccomp.h, Linux 6.6), which the libc
/// crate does not define.
const SECCOMP_USER_NOTIF_FD_SYNC_WAKE_UP: u64 = 1;

/// The supervisor's side: answers the filter's notifications until the listener ends.
pub struct Supervisor {
    listener: Arc<OwnedFd>,
    routes: Vec<Route>,
    /// The stack's attach socket, for connects made from outside.
    socket: PathBuf,
    /// Processes told about already (one message each).
    told: HashSet<u32>,
    /// The stand-ins made from outside, for SO_ERROR and their names.
    stand_ins: StandIns,
}

impl Supervisor {
    pub fn new(listener: OwnedFd, routes: Vec<Route>, socket: PathBuf) -> Supervisor {
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
            // SAFETY: the buffer is at least a seccomp_notif, aligned, filled by the kernel.
            let n: libc::seccomp_notif = unsafe { std::ptr::read(notif.as_ptr().cast()) };
            let verdict = self.judge(&n);
            // The program's memory was read: the answer holds only if the call still waits
            // (the caller was not killed and its id reused meanwhile).
            // SAFETY: NOTIF_ID_VALID reads the id.
            if unsafe { libc::ioctl(self.listener.as_raw_fd(), libc::SECCOMP_IOCTL_NOTIF_ID_VALID, &n.id) } < 0 {
                continue;
            }
            match verdict {
                Verdict::Continue => go_on(&self.listener, n.id),
                Verdict::Connect { fd, dest } => {
                    let call = connect::Stopped {
                        listener: &self.listener,
                        stand_ins: &self.stand_ins,
                        id: n.id,
                        tid: n.pid,
                        fd,
                    };
                    match connect::connect(call, &self.socket, dest) {
                        Ok(Answer::Now(value)) => respond(&self.listener, n.id, value),
                        Ok(Answer::Later) => {}
                        Err(errno) => {
                            if errno == libc::ENETUNREACH {
                                self.tell(n.pid, dest);
                            }
                            respond(&self.listener, n.id, -errno);
                        }
                    }
                }
                Verdict::Refuse(dest) => {
                    self.tell(n.pid, dest);
                    respond(&self.listener, n.id, -libc::ENETUNREACH);
                }
                Verdict::SocketError { fd, value, len } => {
                    let memory = Memory { pid: n.pid };
                    match stand_in(n.pid, fd).and_then(|i| self.stand_ins.take_error(i)) {
                        Some(errno) if memory.write_int_option(value, len, errno).is_some() => {
                            respond(&self.listener, n.id, 0)
                        }
                        _ => go_on(&self.listener, n.id),
                    }
                }
                Verdict::Name { fd, addr, len, peer } => {
                    let memory = Memory { pid: n.pid };
                    match stand_in(n.pid, fd).and_then(|i| self.stand_ins.names(i)) {
                        None => go_on(&self.listener, n.id),
                        Some(names) if peer && !names.connected => respond(&self.listener, n.id, -libc::ENOTCONN),
                        Some(names) => {
                            let name = if peer {
                                names.remote
                            } else {
                                names.local.unwrap_or_else(|| unspecified(names.remote))
                            };
                            match memory.write_sockaddr(addr, len, names.family, name) {
                                Some(()) => respond(&self.listener, n.id, 0),
                                None => respond(&self.listener, n.id, -libc::EFAULT),
                            }
                        }
                    }
                }
            }
        }
    }

    /// The verdict on one stopped call: refused if any of its destinations is in the tunnel.
    fn judge(&self, n: &libc::seccomp_notif) -> Verdict {
        let args = n.data.args;
        let memory = Memory { pid: n.pid };
        let destinations = match i64::from(n.data.nr) {
            libc::SYS_connect => {
                return match memory.sockaddr(args[1], args[2]) {
                    Some(dest) if ordo_attach::through_tunnel(&self.routes, dest.ip()) => Verdict::Connect {
                        fd: args[0] as RawFd,
                        dest,
                    },
                    _ => Verdict::Continue,
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
            libc::SYS_sendto => vec![memory.sockaddr(args[4], args[5])],
            libc::SYS_sendmsg => vec![memory.message_destination(args[1])],
            libc::SYS_sendmmsg => (0..(args[2] as usize).min(MAX_MMSG))
                .map(|i| memory.message_destination(args[1] + (i * size_of::<libc::mmsghdr>()) as u64))
                .collect(),
            _ => Vec::new(),
        };
        destinations
            .into_iter()
            .flatten()
            .find(|d| ordo_attach::through_tunnel(&self.routes, d.ip()))
            .map_or(Verdict::Continue, Verdict::Refuse)
    }

    fn tell(&mut self, tid: u32, dest: SocketAddr) {
        let pid = thread_group(tid).unwrap_or(tid);
        if !self.told.insert(pid) {
            return;
        }
        let name = std::fs::read_to_string(format!("/proc/{tid}/comm")).unwrap_or_default();
        eprintln!(
            "ordo run: {} (pid {pid}) reached for {dest} without the C library (a static or Go program, or a raw \
             system call): refused (ENETUNREACH) rather than let it leave by the kernel's route. Programs that \
             bypass the C library are not carried through the stack yet; run them with `ordo up` and TUN.",
            name.trim()
        );
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

/// The inode of thread `tid`'s descriptor `fd`: a stand-in of ours, perhaps.
fn stand_in(tid: u32, fd: RawFd) -> Option<u64> {
    let pid = thread_group(tid)?;
    let copy = take_fd(pid as i32, fd).ok()?;
    inode(copy.as_raw_fd())
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

/// A stopped program's memory, read with process_vm_readv(2).
struct Memory {
    pid: u32,
}

impl Memory {
    fn read(&self, address: u64, buf: &mut [u8]) -> Option<()> {
        if address == 0 || buf.is_empty() {
            return None;
        }
        let local = libc::iovec {
            iov_base: buf.as_mut_ptr().cast(),
            iov_len: buf.len(),
        };
        let remote = libc::iovec {
            iov_base: address as *mut libc::c_void,
            iov_len: buf.len(),
        };
        // SAFETY: `local` is our buffer; the remote address is only read by the kernel, in
        // the program's address space, and checked there.
        let n = unsafe { libc::process_vm_readv(self.pid as libc::pid_t, &local, 1, &remote, 1, 0) };
        (n == buf.len() as isize).then_some(())
    }

    /// The socket address of `len` bytes at `address`, if it is an IPv4 or IPv6 one.
    fn sockaddr(&self, address: u64, len: u64) -> Option<SocketAddr> {
        let len = (len as usize).min(MAX_SOCKADDR);
        let mut buf = [0u8; MAX_SOCKADDR];
        self.read(address, &mut buf[..len])?;
        parse_sockaddr(&buf[..len])
    }

    /// Writes `addr` as getsockname(2) does: at most the program's `*len` bytes at
    /// `address`, and the whole length at `len_address`.
    fn write_sockaddr(&self, address: u64, len_address: u64, family: i32, addr: SocketAddr) -> Option<()> {
        let mut len = [0u8; 4];
        self.read(len_address, &mut len)?;
        let room = u32::from_ne_bytes(len) as usize;
        let bytes = sockaddr_bytes(family, addr);
        let n = room.min(bytes.len());
        if n > 0 {
            self.write(address, &bytes[..n])?;
        }
        self.write(len_address, &(bytes.len() as u32).to_ne_bytes())
    }

    /// Writes `value` as an int socket option's answer: at `address`, its length (4) at
    /// `len_address`, if the program's buffer has room for it.
    fn write_int_option(&self, address: u64, len_address: u64, value: i32) -> Option<()> {
        let mut len = [0u8; 4];
        self.read(len_address, &mut len)?;
        if u32::from_ne_bytes(len) < 4 {
            return None;
        }
        self.write(address, &value.to_ne_bytes())?;
        self.write(len_address, &4u32.to_ne_bytes())
    }

    fn write(&self, address: u64, bytes: &[u8]) -> Option<()> {
        if address == 0 {
            return None;
        }
        let local = libc::iovec {
            iov_base: bytes.as_ptr() as *mut libc::c_void,
            iov_len: bytes.len(),
        };
        let remote = libc::iovec {
            iov_base: address as *mut libc::c_void,
            iov_len: bytes.len(),
        };
        // SAFETY: `local` is only read; the remote address is written by the kernel in the
        // program's address space, where the program gave it for this answer.
        let n = unsafe { libc::process_vm_writev(self.pid as libc::pid_t, &local, 1, &remote, 1, 0) };
        (n == bytes.len() as isize).then_some(())
    }

    /// The destination of the message header at `address`, if it names one.
    fn message_destination(&self, address: u64) -> Option<SocketAddr> {
        let mut buf = [0u8; size_of::<libc::msghdr>()];
        self.read(address, &mut buf)?;
        // SAFETY: `buf` holds the bytes of a msghdr; every bit pattern is one.
        let header: libc::msghdr = unsafe { std::ptr::read_unaligned(buf.as_ptr().cast()) };
        self.sockaddr(header.msg_name as u64, u64::from(header.msg_namelen))
    }
}

/// An IPv4 or IPv6 socket address from its bytes (an IPv4-mapped IPv6 one as IPv4, as the
/// kernel would send it).
fn parse_sockaddr(b: &[u8]) -> Option<SocketAddr> {
    let family = i32::from(u16::from_ne_bytes(b.get(..2)?.try_into().ok()?));
    let port = u16::from_be_bytes(b.get(2..4)?.try_into().ok()?);
    let ip = match family {
        libc::AF_INET => IpAddr::V4(Ipv4Addr::from(<[u8; 4]>::try_from(b.get(4..8)?).ok()?)),
        libc::AF_INET6 => {
            let v6 = Ipv6Addr::from(<[u8; 16]>::try_from(b.get(8..24)?).ok()?);
            v6.to_ipv4_mapped().map_or(IpAddr::V6(v6), IpAddr::V4)
        }
        _ => return None,
    };
    Some(SocketAddr::new(ip, port))
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
pub fn spawn(command: &mut Command, routes: Vec<Route>, socket: PathBuf) -> Result<Supervised> {
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
            let supervisor = Supervisor::new(listener, routes, socket).spawn()?;
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

    fn v4(a: [u8; 4], port: u16) -> Vec<u8> {
        let mut b = vec![0u8; 16];
        b[..2].copy_from_slice(&(libc::AF_INET as u16).to_ne_bytes());
        b[2..4].copy_from_slice(&port.to_be_bytes());
        b[4..8].copy_from_slice(&a);
        b
    }

    #[test]
    fn socket_addresses_are_parsed() {
        assert_eq!(
            parse_sockaddr(&v4([10, 1, 2, 3], 443)),
            Some("10.1.2.3:443".parse().unwrap())
        );
        let mut b = vec![0u8; 28];
        b[..2].copy_from_slice(&(libc::AF_INET6 as u16).to_ne_bytes());
        b[2..4].copy_from_slice(&53u16.to_be_bytes());
        b[8..24].copy_from_slice(&"::ffff:10.9.8.7".parse::<Ipv6Addr>().unwrap().octets());
        assert_eq!(parse_sockaddr(&b), Some("10.9.8.7:53".parse().unwrap()));
        b[8..24].copy_from_slice(&"fd00::1".parse::<Ipv6Addr>().unwrap().octets());
        assert_eq!(parse_sockaddr(&b), Some("[fd00::1]:53".parse().unwrap()));
        // Short, or another family: not a destination.
        assert_eq!(parse_sockaddr(&v4([10, 1, 2, 3], 443)[..6]), None);
        let mut unix = v4([0; 4], 0);
        unix[..2].copy_from_slice(&(libc::AF_UNIX as u16).to_ne_bytes());
        assert_eq!(parse_sockaddr(&unix), None);
    }

    #[test]
    fn the_filter_jumps_land_on_its_verdicts() {
        let f = Filter::new();
        let last = f.instructions.len() - 1;
        for (i, ins) in f.instructions.iter().enumerate() {
            if u32::from(ins.code) & 0x07 == libc::BPF_JMP {
                assert!(i + 1 + usize::from(ins.jt) <= last, "instruction {i}: jt past the end");
                assert!(i + 1 + usize::from(ins.jf) <= last, "instruction {i}: jf past the end");
            }
        }
        let verdicts: Vec<u32> = f.instructions[last - 2..].iter().map(|i| i.k).collect();
        assert_eq!(
            verdicts,
            [
                libc::SECCOMP_RET_ALLOW,
                libc::SECCOMP_RET_USER_NOTIF,
                libc::SECCOMP_RET_ERRNO | libc::ENOSYS as u32
            ]
        );
    }

    /// The filter on a real child: a connect to an address the "tunnel" holds fails with
    /// ENETUNREACH, one elsewhere reaches the kernel (ECONNREFUSED from loopback), sendto
    /// and sendmsg with a tunnel destination fail unless marked as the library's checked
    /// sends (to port 0, which the kernel refuses with EINVAL once a send is let by), and
    /// io_uring is not there.
    #[test]
    fn a_child_under_the_filter() {
        let routes = vec![Route {
            addr: "192.0.2.0".parse().unwrap(),
            prefix: 24,
        }];
        let script = "import socket, errno, sys\n\
            out = []\n\
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
            print(' '.join(out))\n";
        let script = format!("CHECKED = {}\n{script}", ordo_attach::CHECKED_SEND);
        let mut command = Command::new("python3");
        command.args(["-c", &script]).stdout(std::process::Stdio::piped());
        // No stack behind the socket: the connect to the tunnel fails closed.
        let Supervised { child, supervisor } =
            spawn(&mut command, routes, "/nonexistent/attach.sock".into()).expect("spawning python3 under the filter");
        let out = child.wait_with_output().unwrap();
        assert_eq!(
            String::from_utf8_lossy(&out.stdout).trim(),
            "ENETUNREACH ECONNREFUSED ENETUNREACH sent ENETUNREACH EINVAL ENETUNREACH EINVAL"
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
