//! The seccomp listener's side of a stopped call, shared by the supervisor
//! (run/supervise.rs) and the connects it makes from outside (run/connect.rs): answering it,
//! and reaching the stopped program's memory and descriptors.

use std::fs::File;
use std::io;
use std::mem::size_of;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::os::unix::fs::FileExt;

/// The process of a stopped call, reached through handles opened before the call is checked
/// to still wait: a process that died meanwhile and whose number went to another would
/// otherwise have that other process read or written (seccomp_unotify(2), "Design goals;
/// the use of SECCOMP_USER_NOTIF_FLAG_CONTINUE" and the ID_VALID check it describes).
pub struct Caller {
    /// The calling thread.
    pub tid: u32,
    /// /proc/TID/mem, or why it could not be opened (a process that is not dumpable, or that
    /// Yama's ptrace scope keeps from us: its memory cannot be read).
    memory: Result<File, io::Error>,
    /// A pidfd of its process, once asked for ([`Caller::take_fd`]).
    process: std::cell::OnceCell<Option<OwnedFd>>,
}

impl Caller {
    /// The caller of notification `id` by thread `tid`; None if the call no longer waits.
    pub fn open(listener: &OwnedFd, id: u64, tid: u32) -> Option<Caller> {
        let memory = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .open(format!("/proc/{tid}/mem"));
        let caller = Caller {
            tid,
            memory,
            process: std::cell::OnceCell::new(),
        };
        still_waits(listener, id).then_some(caller)
    }

    /// Whether its memory can be read at all.
    pub fn readable(&self) -> bool {
        self.memory.is_ok()
    }

    /// `buf.len()` bytes at `address` in its memory; None if they cannot all be read.
    pub fn read(&self, address: u64, buf: &mut [u8]) -> Option<()> {
        if address == 0 || buf.is_empty() {
            return None;
        }
        self.memory.as_ref().ok()?.read_exact_at(buf, address).ok()
    }

    /// Writes `bytes` at `address` in its memory.
    pub fn write(&self, address: u64, bytes: &[u8]) -> Option<()> {
        if address == 0 {
            return None;
        }
        self.memory.as_ref().ok()?.write_all_at(bytes, address).ok()
    }

    /// A copy of its descriptor `fd` (pidfd_getfd(2)). The pidfd is opened at the first
    /// call and checked against notification `id`, so that the copy is of this process's.
    pub fn take_fd(&self, listener: &OwnedFd, id: u64, fd: RawFd) -> io::Result<OwnedFd> {
        let process = self.process.get_or_init(|| {
            let pid = thread_group(self.tid)?;
            let pidfd = pidfd_open(pid as i32).ok()?;
            still_waits(listener, id).then_some(pidfd)
        });
        let pidfd = process
            .as_ref()
            .ok_or_else(|| io::Error::from_raw_os_error(libc::ESRCH))?;
        pidfd_getfd(pidfd, fd)
    }
}

/// Whether notification `id` still waits for its answer (SECCOMP_IOCTL_NOTIF_ID_VALID).
pub fn still_waits(listener: &OwnedFd, id: u64) -> bool {
    // SAFETY: NOTIF_ID_VALID reads the id.
    unsafe { libc::ioctl(listener.as_raw_fd(), libc::SECCOMP_IOCTL_NOTIF_ID_VALID, &id) == 0 }
}

fn pidfd_open(pid: i32) -> io::Result<OwnedFd> {
    // SAFETY: plain pidfd_open.
    let pidfd = unsafe { libc::syscall(libc::SYS_pidfd_open, pid, 0) };
    if pidfd < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: a descriptor pidfd_open just returned, ours alone.
    Ok(unsafe { OwnedFd::from_raw_fd(pidfd as RawFd) })
}

fn pidfd_getfd(pidfd: &OwnedFd, fd: RawFd) -> io::Result<OwnedFd> {
    // SAFETY: plain pidfd_getfd on an open pidfd.
    let copy = unsafe { libc::syscall(libc::SYS_pidfd_getfd, pidfd.as_raw_fd(), fd, 0) };
    if copy < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: a descriptor pidfd_getfd just returned, ours alone.
    Ok(unsafe { OwnedFd::from_raw_fd(copy as RawFd) })
}

/// A copy of descriptor `fd` of process `pid` (pidfd_getfd(2): the parent may, as it may
/// trace its child).
pub fn take_fd(pid: i32, fd: i32) -> io::Result<OwnedFd> {
    pidfd_getfd(&pidfd_open(pid)?, fd)
}

/// Whether every process under the filter has ended: the listener then reports a hang-up
/// (seccomp_unotify(2)), and a receive on it fails at once with ENOENT, as it does for one
/// caller killed while stopped.
pub fn orphaned(listener: &OwnedFd) -> bool {
    let mut p = libc::pollfd {
        fd: listener.as_raw_fd(),
        events: libc::POLLIN,
        revents: 0,
    };
    // SAFETY: one valid pollfd, no wait.
    let r = unsafe { libc::poll(&mut p, 1, 0) };
    r > 0 && p.revents & libc::POLLHUP != 0
}

/// Answers the stopped call `id` with `value`: 0 or more is returned, below 0 a negated
/// errno. From any thread; a caller gone meanwhile is no error.
pub fn respond(listener: &OwnedFd, id: u64, value: i32) {
    let mut answer = libc::seccomp_notif_resp {
        id,
        val: 0,
        error: 0,
        flags: 0,
    };
    if value < 0 {
        answer.error = value;
    } else {
        answer.val = i64::from(value);
    }
    send_response(listener, answer);
}

/// Sends `answer` from a buffer as large as this kernel's response structure.
pub fn send_response(listener: &OwnedFd, answer: libc::seccomp_notif_resp) {
    let mut resp = vec![0u64; notif_words().1];
    // SAFETY: the buffer is at least a seccomp_notif_resp, aligned.
    unsafe { std::ptr::write(resp.as_mut_ptr().cast(), answer) };
    // SAFETY: `resp` holds the answer, as large as the kernel reads.
    unsafe { libc::ioctl(listener.as_raw_fd(), libc::SECCOMP_IOCTL_NOTIF_SEND, resp.as_ptr()) };
}

/// The sizes of this kernel's notification structures (SECCOMP_GET_NOTIF_SIZES); an error
/// where the kernel has no seccomp user notification.
pub fn notif_sizes() -> io::Result<libc::seccomp_notif_sizes> {
    let mut sizes = libc::seccomp_notif_sizes {
        seccomp_notif: 0,
        seccomp_notif_resp: 0,
        seccomp_data: 0,
    };
    // SAFETY: `sizes` is the structure SECCOMP_GET_NOTIF_SIZES fills.
    let r = unsafe {
        libc::syscall(
            libc::SYS_seccomp,
            libc::SECCOMP_GET_NOTIF_SIZES,
            0,
            &mut sizes as *mut libc::seccomp_notif_sizes,
        )
    };
    if r != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(sizes)
}

/// The kernel's notification and response structures, in 8-byte words: they may be larger
/// than this build knows.
pub fn notif_words() -> (usize, usize) {
    let (kernel_notif, kernel_resp) = notif_sizes().map_or((0, 0), |s| (s.seccomp_notif, s.seccomp_notif_resp));
    let words = |kernel: u16, ours: usize| usize::from(kernel).max(ours).div_ceil(8);
    (
        words(kernel_notif, size_of::<libc::seccomp_notif>()),
        words(kernel_resp, size_of::<libc::seccomp_notif_resp>()),
    )
}

/// The inode of the file `fd` is: a stand-in is known by it whatever its descriptor number.
pub fn inode(fd: RawFd) -> Option<u64> {
    // SAFETY: an all-zero stat is a valid value of the plain C structure.
    let mut st: libc::stat = unsafe { std::mem::zeroed() };
    // SAFETY: `st` is writable and the structure fstat fills.
    (unsafe { libc::fstat(fd, &mut st) } == 0).then_some(st.st_ino)
}

/// The thread group (process) of thread `tid`.
pub fn thread_group(tid: u32) -> Option<u32> {
    let status = std::fs::read_to_string(format!("/proc/{tid}/status")).ok()?;
    status
        .lines()
        .find_map(|l| l.strip_prefix("Tgid:"))
        .and_then(|v| v.trim().parse().ok())
}
