//! The seccomp listener's side of a stopped call, shared by the supervisor
//! (run/supervise.rs) and the connects it makes from outside (run/connect.rs): answering it,
//! and reaching the stopped program's descriptors.

use std::io;
use std::mem::size_of;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};

/// A copy of descriptor `fd` of process `pid` (pidfd_getfd(2): the parent may, as it may
/// trace its child).
pub fn take_fd(pid: i32, fd: i32) -> io::Result<OwnedFd> {
    // SAFETY: plain pidfd_open.
    let pidfd = unsafe { libc::syscall(libc::SYS_pidfd_open, pid, 0) };
    if pidfd < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: a descriptor pidfd_open just returned, ours alone.
    let pidfd = unsafe { OwnedFd::from_raw_fd(pidfd as RawFd) };
    // SAFETY: plain pidfd_getfd on the pidfd above.
    let copy = unsafe { libc::syscall(libc::SYS_pidfd_getfd, pidfd.as_raw_fd(), fd, 0) };
    if copy < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: a descriptor pidfd_getfd just returned, ours alone.
    Ok(unsafe { OwnedFd::from_raw_fd(copy as RawFd) })
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
