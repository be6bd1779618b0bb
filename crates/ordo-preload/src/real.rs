//! The C library's own functions, which the hooks call for everything that is not theirs.
//! Looked up with `dlsym(RTLD_NEXT)` (the next object after this library in the lookup order:
//! the C library), once each, and never through our own exported symbols, which would call
//! back into the hooks.

use libc::{c_int, c_void, sockaddr, socklen_t};
use std::sync::atomic::{AtomicUsize, Ordering};

/// One looked-up function: its address, 0 until the first call.
struct Real {
    name: &'static [u8],
    addr: AtomicUsize,
}

impl Real {
    const fn new(name: &'static [u8]) -> Real {
        Real {
            name,
            addr: AtomicUsize::new(0),
        }
    }

    fn get(&self) -> usize {
        let a = self.addr.load(Ordering::Acquire);
        if a != 0 {
            return a;
        }
        // SAFETY: `name` is a NUL-terminated byte string (every `Real` below is built from a
        // literal ending in \0); dlsym only reads it.
        let a = unsafe { libc::dlsym(libc::RTLD_NEXT, self.name.as_ptr().cast()) } as usize;
        if a == 0 {
            // No C library below us defines it: nothing sensible to call. Abort rather than
            // jump to address 0 (this cannot happen with glibc or musl).
            std::process::abort();
        }
        self.addr.store(a, Ordering::Release);
        a
    }
}

static CONNECT: Real = Real::new(b"connect\0");
static GETSOCKNAME: Real = Real::new(b"getsockname\0");
static GETPEERNAME: Real = Real::new(b"getpeername\0");
static SETSOCKOPT: Real = Real::new(b"setsockopt\0");
static GETSOCKOPT: Real = Real::new(b"getsockopt\0");
static EPOLL_CTL: Real = Real::new(b"epoll_ctl\0");
static SENDTO: Real = Real::new(b"sendto\0");
static BIND: Real = Real::new(b"bind\0");
static LISTEN: Real = Real::new(b"listen\0");
static ACCEPT4: Real = Real::new(b"accept4\0");
static SENDMSG: Real = Real::new(b"sendmsg\0");
static SENDMMSG: Real = Real::new(b"sendmmsg\0");
static RECVFROM: Real = Real::new(b"recvfrom\0");
static RECVMSG: Real = Real::new(b"recvmsg\0");
static RECVMMSG: Real = Real::new(b"recvmmsg\0");
static GETADDRINFO: Real = Real::new(b"getaddrinfo\0");
static READ: Real = Real::new(b"read\0");
static GETNAMEINFO: Real = Real::new(b"getnameinfo\0");
static EXECVE: Real = Real::new(b"execve\0");
static EXECV: Real = Real::new(b"execv\0");
static EXECVP: Real = Real::new(b"execvp\0");
static EXECVPE: Real = Real::new(b"execvpe\0");
static POSIX_SPAWN: Real = Real::new(b"posix_spawn\0");
static POSIX_SPAWNP: Real = Real::new(b"posix_spawnp\0");
static RECV: Real = Real::new(b"recv\0");
static DUP: Real = Real::new(b"dup\0");
static DUP2: Real = Real::new(b"dup2\0");
static DUP3: Real = Real::new(b"dup3\0");
static FCNTL: Real = Real::new(b"fcntl\0");
static FCNTL64: Real = Real::new(b"fcntl64\0");
static IOCTL: Real = Real::new(b"ioctl\0");
static GETHOSTBYNAME: Real = Real::new(b"gethostbyname\0");
static GETHOSTBYNAME2: Real = Real::new(b"gethostbyname2\0");
static GETHOSTBYNAME_R: Real = Real::new(b"gethostbyname_r\0");
static GETHOSTBYNAME2_R: Real = Real::new(b"gethostbyname2_r\0");
static GETHOSTBYADDR: Real = Real::new(b"gethostbyaddr\0");
static GETHOSTBYADDR_R: Real = Real::new(b"gethostbyaddr_r\0");

type ConnectFn = unsafe extern "C" fn(c_int, *const sockaddr, socklen_t) -> c_int;
type NameFn = unsafe extern "C" fn(c_int, *mut sockaddr, *mut socklen_t) -> c_int;
type SetOptFn = unsafe extern "C" fn(c_int, c_int, c_int, *const c_void, socklen_t) -> c_int;
type BindFn = unsafe extern "C" fn(c_int, *const sockaddr, socklen_t) -> c_int;
type ListenFn = unsafe extern "C" fn(c_int, c_int) -> c_int;
type Accept4Fn = unsafe extern "C" fn(c_int, *mut sockaddr, *mut socklen_t, c_int) -> c_int;
type SendToFn =
    unsafe extern "C" fn(c_int, *const c_void, libc::size_t, c_int, *const sockaddr, socklen_t) -> libc::ssize_t;
type SendMsgFn = unsafe extern "C" fn(c_int, *const libc::msghdr, c_int) -> libc::ssize_t;
type SendMmsgFn = unsafe extern "C" fn(c_int, *mut libc::mmsghdr, libc::c_uint, c_int) -> c_int;
type RecvFromFn =
    unsafe extern "C" fn(c_int, *mut c_void, libc::size_t, c_int, *mut sockaddr, *mut socklen_t) -> libc::ssize_t;
type GetNameInfoFn = unsafe extern "C" fn(
    *const sockaddr,
    socklen_t,
    *mut libc::c_char,
    socklen_t,
    *mut libc::c_char,
    socklen_t,
    c_int,
) -> c_int;
type ExecveFn =
    unsafe extern "C" fn(*const libc::c_char, *const *const libc::c_char, *const *const libc::c_char) -> c_int;
type ExecvFn = unsafe extern "C" fn(*const libc::c_char, *const *const libc::c_char) -> c_int;
type SpawnFn = unsafe extern "C" fn(
    *mut libc::pid_t,
    *const libc::c_char,
    *const libc::posix_spawn_file_actions_t,
    *const libc::posix_spawnattr_t,
    *const *mut libc::c_char,
    *const *mut libc::c_char,
) -> c_int;
type ReadFn = unsafe extern "C" fn(c_int, *mut c_void, libc::size_t) -> libc::ssize_t;
type RecvFn = unsafe extern "C" fn(c_int, *mut c_void, libc::size_t, c_int) -> libc::ssize_t;
type RecvMsgFn = unsafe extern "C" fn(c_int, *mut libc::msghdr, c_int) -> libc::ssize_t;
type RecvMmsgFn = unsafe extern "C" fn(c_int, *mut libc::mmsghdr, libc::c_uint, c_int, *mut libc::timespec) -> c_int;
type GetAddrInfoFn = unsafe extern "C" fn(
    *const libc::c_char,
    *const libc::c_char,
    *const libc::addrinfo,
    *mut *mut libc::addrinfo,
) -> c_int;
type EpollCtlFn = unsafe extern "C" fn(c_int, c_int, c_int, *mut libc::epoll_event) -> c_int;
type GetOptFn = unsafe extern "C" fn(c_int, c_int, c_int, *mut c_void, *mut socklen_t) -> c_int;
type DupFn = unsafe extern "C" fn(c_int) -> c_int;
type Dup2Fn = unsafe extern "C" fn(c_int, c_int) -> c_int;
type Dup3Fn = unsafe extern "C" fn(c_int, c_int, c_int) -> c_int;
/// fcntl(2) and ioctl(2) are variadic: called with their one optional argument, which every
/// command passes in a register of its own whatever its type (an int or a pointer).
type FcntlFn = unsafe extern "C" fn(c_int, c_int, ...) -> c_int;
type IoctlFn = unsafe extern "C" fn(c_int, libc::c_ulong, ...) -> c_int;
type HostByNameFn = unsafe extern "C" fn(*const libc::c_char) -> *mut libc::hostent;
type HostByName2Fn = unsafe extern "C" fn(*const libc::c_char, c_int) -> *mut libc::hostent;
type HostByNameRFn = unsafe extern "C" fn(
    *const libc::c_char,
    *mut libc::hostent,
    *mut libc::c_char,
    libc::size_t,
    *mut *mut libc::hostent,
    *mut c_int,
) -> c_int;
type HostByName2RFn = unsafe extern "C" fn(
    *const libc::c_char,
    c_int,
    *mut libc::hostent,
    *mut libc::c_char,
    libc::size_t,
    *mut *mut libc::hostent,
    *mut c_int,
) -> c_int;
type HostByAddrFn = unsafe extern "C" fn(*const c_void, socklen_t, c_int) -> *mut libc::hostent;
type HostByAddrRFn = unsafe extern "C" fn(
    *const c_void,
    socklen_t,
    c_int,
    *mut libc::hostent,
    *mut libc::c_char,
    libc::size_t,
    *mut *mut libc::hostent,
    *mut c_int,
) -> c_int;

/// The C library's connect.
///
/// # Safety
/// As connect(2): `addr` points to `len` readable bytes.
pub unsafe fn connect(fd: c_int, addr: *const sockaddr, len: socklen_t) -> c_int {
    // SAFETY: the address is the C library's `connect`, whose type this is.
    let f: ConnectFn = unsafe { std::mem::transmute::<usize, ConnectFn>(CONNECT.get()) };
    // SAFETY: the caller's contract is connect(2)'s.
    unsafe { f(fd, addr, len) }
}

/// connect(2) to a Unix socket, marked for `ordo run`'s filter (ordo_attach::CHECKED_CONNECT).
/// A system call of its own: the C library's connect passes no fourth argument.
///
/// # Safety
/// As connect(2): `addr` points to `len` readable bytes, of an AF_UNIX address.
pub unsafe fn connect_unix(fd: c_int, addr: *const sockaddr, len: socklen_t) -> c_int {
    // SAFETY: connect's three arguments, as the caller's contract gives them, and the mark.
    unsafe { libc::syscall(libc::SYS_connect, fd, addr, len, ordo_attach::CHECKED_CONNECT) as c_int }
}

/// The C library's getsockname.
///
/// # Safety
/// As getsockname(2).
pub unsafe fn getsockname(fd: c_int, addr: *mut sockaddr, len: *mut socklen_t) -> c_int {
    // SAFETY: the address is the C library's `getsockname`, whose type this is.
    let f: NameFn = unsafe { std::mem::transmute::<usize, NameFn>(GETSOCKNAME.get()) };
    // SAFETY: the caller's contract is getsockname(2)'s.
    unsafe { f(fd, addr, len) }
}

/// The C library's getpeername.
///
/// # Safety
/// As getpeername(2).
pub unsafe fn getpeername(fd: c_int, addr: *mut sockaddr, len: *mut socklen_t) -> c_int {
    // SAFETY: the address is the C library's `getpeername`, whose type this is.
    let f: NameFn = unsafe { std::mem::transmute::<usize, NameFn>(GETPEERNAME.get()) };
    // SAFETY: the caller's contract is getpeername(2)'s.
    unsafe { f(fd, addr, len) }
}

/// The C library's setsockopt.
///
/// # Safety
/// As setsockopt(2).
pub unsafe fn setsockopt(fd: c_int, level: c_int, name: c_int, value: *const c_void, len: socklen_t) -> c_int {
    // SAFETY: the address is the C library's `setsockopt`, whose type this is.
    let f: SetOptFn = unsafe { std::mem::transmute::<usize, SetOptFn>(SETSOCKOPT.get()) };
    // SAFETY: the caller's contract is setsockopt(2)'s.
    unsafe { f(fd, level, name, value, len) }
}

/// The C library's getsockopt.
///
/// # Safety
/// As getsockopt(2).
pub unsafe fn getsockopt(fd: c_int, level: c_int, name: c_int, value: *mut c_void, len: *mut socklen_t) -> c_int {
    // SAFETY: the address is the C library's `getsockopt`, whose type this is.
    let f: GetOptFn = unsafe { std::mem::transmute::<usize, GetOptFn>(GETSOCKOPT.get()) };
    // SAFETY: the caller's contract is getsockopt(2)'s.
    unsafe { f(fd, level, name, value, len) }
}

/// The C library's epoll_ctl.
///
/// # Safety
/// As epoll_ctl(2).
pub unsafe fn epoll_ctl(epfd: c_int, op: c_int, fd: c_int, event: *mut libc::epoll_event) -> c_int {
    // SAFETY: the address is the C library's `epoll_ctl`, whose type this is.
    let f: EpollCtlFn = unsafe { std::mem::transmute::<usize, EpollCtlFn>(EPOLL_CTL.get()) };
    // SAFETY: the caller's contract is epoll_ctl(2)'s.
    unsafe { f(epfd, op, fd, event) }
}

/// The C library's sendto.
///
/// # Safety
/// As sendto(2).
pub unsafe fn sendto(
    fd: c_int,
    buf: *const c_void,
    len: libc::size_t,
    flags: c_int,
    addr: *const sockaddr,
    addr_len: socklen_t,
) -> libc::ssize_t {
    // SAFETY: the address is the C library's `sendto`, whose type this is.
    let f: SendToFn = unsafe { std::mem::transmute::<usize, SendToFn>(SENDTO.get()) };
    // SAFETY: the caller's contract is sendto(2)'s.
    unsafe { f(fd, buf, len, flags, addr, addr_len) }
}

/// The C library's sendmsg.
///
/// # Safety
/// As sendmsg(2).
pub unsafe fn sendmsg(fd: c_int, msg: *const libc::msghdr, flags: c_int) -> libc::ssize_t {
    // SAFETY: the address is the C library's `sendmsg`, whose type this is.
    let f: SendMsgFn = unsafe { std::mem::transmute::<usize, SendMsgFn>(SENDMSG.get()) };
    // SAFETY: the caller's contract is sendmsg(2)'s.
    unsafe { f(fd, msg, flags) }
}

/// The C library's sendmmsg.
///
/// # Safety
/// As sendmmsg(2).
pub unsafe fn sendmmsg(fd: c_int, msgs: *mut libc::mmsghdr, n: libc::c_uint, flags: c_int) -> c_int {
    // SAFETY: the address is the C library's `sendmmsg`, whose type this is.
    let f: SendMmsgFn = unsafe { std::mem::transmute::<usize, SendMmsgFn>(SENDMMSG.get()) };
    // SAFETY: the caller's contract is sendmmsg(2)'s.
    unsafe { f(fd, msgs, n, flags) }
}

/// The C library's bind.
///
/// # Safety
/// As bind(2).
pub unsafe fn bind(fd: c_int, addr: *const sockaddr, len: socklen_t) -> c_int {
    // SAFETY: the address is the C library's `bind`, whose type this is.
    let f: BindFn = unsafe { std::mem::transmute::<usize, BindFn>(BIND.get()) };
    // SAFETY: the caller's contract is bind(2)'s.
    unsafe { f(fd, addr, len) }
}

/// The C library's listen.
///
/// # Safety
/// As listen(2).
pub unsafe fn listen(fd: c_int, backlog: c_int) -> c_int {
    // SAFETY: the address is the C library's `listen`, whose type this is.
    let f: ListenFn = unsafe { std::mem::transmute::<usize, ListenFn>(LISTEN.get()) };
    // SAFETY: the caller's contract is listen(2)'s.
    unsafe { f(fd, backlog) }
}

/// The C library's accept4 (accept is accept4 with no flags).
///
/// # Safety
/// As accept4(2).
pub unsafe fn accept4(fd: c_int, addr: *mut sockaddr, len: *mut socklen_t, flags: c_int) -> c_int {
    // SAFETY: the address is the C library's `accept4`, whose type this is.
    let f: Accept4Fn = unsafe { std::mem::transmute::<usize, Accept4Fn>(ACCEPT4.get()) };
    // SAFETY: the caller's contract is accept4(2)'s.
    unsafe { f(fd, addr, len, flags) }
}

/// The C library's recvfrom.
///
/// # Safety
/// As recvfrom(2).
pub unsafe fn recvfrom(
    fd: c_int,
    buf: *mut c_void,
    len: libc::size_t,
    flags: c_int,
    addr: *mut sockaddr,
    addr_len: *mut socklen_t,
) -> libc::ssize_t {
    // SAFETY: the address is the C library's `recvfrom`, whose type this is.
    let f: RecvFromFn = unsafe { std::mem::transmute::<usize, RecvFromFn>(RECVFROM.get()) };
    // SAFETY: the caller's contract is recvfrom(2)'s.
    unsafe { f(fd, buf, len, flags, addr, addr_len) }
}

/// The C library's recvmsg.
///
/// # Safety
/// As recvmsg(2).
pub unsafe fn recvmsg(fd: c_int, msg: *mut libc::msghdr, flags: c_int) -> libc::ssize_t {
    // SAFETY: the address is the C library's `recvmsg`, whose type this is.
    let f: RecvMsgFn = unsafe { std::mem::transmute::<usize, RecvMsgFn>(RECVMSG.get()) };
    // SAFETY: the caller's contract is recvmsg(2)'s.
    unsafe { f(fd, msg, flags) }
}

/// The C library's recvmmsg.
///
/// # Safety
/// As recvmmsg(2).
pub unsafe fn recvmmsg(
    fd: c_int,
    msgs: *mut libc::mmsghdr,
    n: libc::c_uint,
    flags: c_int,
    timeout: *mut libc::timespec,
) -> c_int {
    // SAFETY: the address is the C library's `recvmmsg`, whose type this is.
    let f: RecvMmsgFn = unsafe { std::mem::transmute::<usize, RecvMmsgFn>(RECVMMSG.get()) };
    // SAFETY: the caller's contract is recvmmsg(2)'s.
    unsafe { f(fd, msgs, n, flags, timeout) }
}

/// The C library's getaddrinfo.
///
/// # Safety
/// As getaddrinfo(3).
pub unsafe fn getaddrinfo(
    node: *const libc::c_char,
    service: *const libc::c_char,
    hints: *const libc::addrinfo,
    res: *mut *mut libc::addrinfo,
) -> c_int {
    // SAFETY: the address is the C library's `getaddrinfo`, whose type this is.
    let f: GetAddrInfoFn = unsafe { std::mem::transmute::<usize, GetAddrInfoFn>(GETADDRINFO.get()) };
    // SAFETY: the caller's contract is getaddrinfo(3)'s.
    unsafe { f(node, service, hints, res) }
}

/// The C library's read.
///
/// # Safety
/// As read(2).
pub unsafe fn read(fd: c_int, buf: *mut c_void, len: libc::size_t) -> libc::ssize_t {
    // SAFETY: the address is the C library's `read`, whose type this is.
    let f: ReadFn = unsafe { std::mem::transmute::<usize, ReadFn>(READ.get()) };
    // SAFETY: the caller's contract is read(2)'s.
    unsafe { f(fd, buf, len) }
}

/// The C library's recv.
///
/// # Safety
/// As recv(2).
pub unsafe fn recv(fd: c_int, buf: *mut c_void, len: libc::size_t, flags: c_int) -> libc::ssize_t {
    // SAFETY: the address is the C library's `recv`, whose type this is.
    let f: RecvFn = unsafe { std::mem::transmute::<usize, RecvFn>(RECV.get()) };
    // SAFETY: the caller's contract is recv(2)'s.
    unsafe { f(fd, buf, len, flags) }
}

/// The C library's getnameinfo.
///
/// # Safety
/// As getnameinfo(3).
pub unsafe fn getnameinfo(
    sa: *const sockaddr,
    salen: socklen_t,
    host: *mut libc::c_char,
    hostlen: socklen_t,
    serv: *mut libc::c_char,
    servlen: socklen_t,
    flags: c_int,
) -> c_int {
    // SAFETY: the address is the C library's `getnameinfo`, whose type this is.
    let f: GetNameInfoFn = unsafe { std::mem::transmute::<usize, GetNameInfoFn>(GETNAMEINFO.get()) };
    // SAFETY: the caller's contract is getnameinfo(3)'s.
    unsafe { f(sa, salen, host, hostlen, serv, servlen, flags) }
}

/// The C library's execve.
///
/// # Safety
/// As execve(2).
pub unsafe fn execve(
    path: *const libc::c_char,
    argv: *const *const libc::c_char,
    envp: *const *const libc::c_char,
) -> c_int {
    // SAFETY: the address is the C library's `execve`, whose type this is.
    let f: ExecveFn = unsafe { std::mem::transmute::<usize, ExecveFn>(EXECVE.get()) };
    // SAFETY: the caller's contract is execve(2)'s.
    unsafe { f(path, argv, envp) }
}

/// The C library's execvpe.
///
/// # Safety
/// As execvpe(3).
pub unsafe fn execvpe(
    file: *const libc::c_char,
    argv: *const *const libc::c_char,
    envp: *const *const libc::c_char,
) -> c_int {
    // SAFETY: the address is the C library's `execvpe`, whose type this is.
    let f: ExecveFn = unsafe { std::mem::transmute::<usize, ExecveFn>(EXECVPE.get()) };
    // SAFETY: the caller's contract is execvpe(3)'s.
    unsafe { f(file, argv, envp) }
}

/// The C library's execv.
///
/// # Safety
/// As execv(3).
pub unsafe fn execv(path: *const libc::c_char, argv: *const *const libc::c_char) -> c_int {
    // SAFETY: the address is the C library's `execv`, whose type this is.
    let f: ExecvFn = unsafe { std::mem::transmute::<usize, ExecvFn>(EXECV.get()) };
    // SAFETY: the caller's contract is execv(3)'s.
    unsafe { f(path, argv) }
}

/// The C library's execvp.
///
/// # Safety
/// As execvp(3).
pub unsafe fn execvp(file: *const libc::c_char, argv: *const *const libc::c_char) -> c_int {
    // SAFETY: the address is the C library's `execvp`, whose type this is.
    let f: ExecvFn = unsafe { std::mem::transmute::<usize, ExecvFn>(EXECVP.get()) };
    // SAFETY: the caller's contract is execvp(3)'s.
    unsafe { f(file, argv) }
}

/// The C library's posix_spawn (`path` searched in PATH: posix_spawnp).
///
/// # Safety
/// As posix_spawn(3).
pub unsafe fn posix_spawn(
    search: bool,
    pid: *mut libc::pid_t,
    path: *const libc::c_char,
    actions: *const libc::posix_spawn_file_actions_t,
    attr: *const libc::posix_spawnattr_t,
    argv: *const *mut libc::c_char,
    envp: *const *mut libc::c_char,
) -> c_int {
    let real = if search { &POSIX_SPAWNP } else { &POSIX_SPAWN };
    // SAFETY: the address is the C library's `posix_spawn` or `posix_spawnp`, of this type.
    let f: SpawnFn = unsafe { std::mem::transmute::<usize, SpawnFn>(real.get()) };
    // SAFETY: the caller's contract is posix_spawn(3)'s.
    unsafe { f(pid, path, actions, attr, argv, envp) }
}

/// The C library's dup.
///
/// # Safety
/// As dup(2).
pub unsafe fn dup(fd: c_int) -> c_int {
    // SAFETY: the address is the C library's `dup`, whose type this is.
    let f: DupFn = unsafe { std::mem::transmute::<usize, DupFn>(DUP.get()) };
    // SAFETY: the caller's contract is dup(2)'s.
    unsafe { f(fd) }
}

/// The C library's dup2.
///
/// # Safety
/// As dup2(2).
pub unsafe fn dup2(fd: c_int, to: c_int) -> c_int {
    // SAFETY: the address is the C library's `dup2`, whose type this is.
    let f: Dup2Fn = unsafe { std::mem::transmute::<usize, Dup2Fn>(DUP2.get()) };
    // SAFETY: the caller's contract is dup2(2)'s.
    unsafe { f(fd, to) }
}

/// The C library's dup3.
///
/// # Safety
/// As dup3(2).
pub unsafe fn dup3(fd: c_int, to: c_int, flags: c_int) -> c_int {
    // SAFETY: the address is the C library's `dup3`, whose type this is.
    let f: Dup3Fn = unsafe { std::mem::transmute::<usize, Dup3Fn>(DUP3.get()) };
    // SAFETY: the caller's contract is dup3(2)'s.
    unsafe { f(fd, to, flags) }
}

/// The C library's fcntl, with the command's argument (an int, or a pointer as an integer;
/// ignored by the commands that take none).
///
/// # Safety
/// As fcntl(2): `arg` is what `cmd` takes.
pub unsafe fn fcntl(fd: c_int, cmd: c_int, arg: libc::c_ulong) -> c_int {
    // SAFETY: the address is the C library's `fcntl`, whose type this is.
    let f: FcntlFn = unsafe { std::mem::transmute::<usize, FcntlFn>(FCNTL.get()) };
    // SAFETY: the caller's contract is fcntl(2)'s.
    unsafe { f(fd, cmd, arg) }
}

/// The C library's ioctl, with the request's argument.
///
/// # Safety
/// As ioctl(2): `arg` is what `request` takes.
pub unsafe fn ioctl(fd: c_int, request: libc::c_ulong, arg: *mut c_void) -> c_int {
    // SAFETY: the address is the C library's `ioctl`, whose type this is.
    let f: IoctlFn = unsafe { std::mem::transmute::<usize, IoctlFn>(IOCTL.get()) };
    // SAFETY: the caller's contract is ioctl(2)'s.
    unsafe { f(fd, request, arg) }
}

/// The C library's fcntl64 (glibc's name for fcntl in programs built with 64-bit file
/// offsets: the headers call it instead), as [`fcntl`].
///
/// # Safety
/// As fcntl(2): `arg` is what `cmd` takes.
pub unsafe fn fcntl64(fd: c_int, cmd: c_int, arg: libc::c_ulong) -> c_int {
    // SAFETY: the address is the C library's `fcntl64`, whose type is fcntl's.
    let f: FcntlFn = unsafe { std::mem::transmute::<usize, FcntlFn>(FCNTL64.get()) };
    // SAFETY: the caller's contract is fcntl(2)'s.
    unsafe { f(fd, cmd, arg) }
}

/// The C library's gethostbyname.
///
/// # Safety
/// As gethostbyname(3).
pub unsafe fn gethostbyname(name: *const libc::c_char) -> *mut libc::hostent {
    // SAFETY: the address is the C library's `gethostbyname`, whose type this is.
    let f: HostByNameFn = unsafe { std::mem::transmute::<usize, HostByNameFn>(GETHOSTBYNAME.get()) };
    // SAFETY: the caller's contract is gethostbyname(3)'s.
    unsafe { f(name) }
}

/// The C library's gethostbyname2.
///
/// # Safety
/// As gethostbyname2(3).
pub unsafe fn gethostbyname2(name: *const libc::c_char, family: c_int) -> *mut libc::hostent {
    // SAFETY: the address is the C library's `gethostbyname2`, whose type this is.
    let f: HostByName2Fn = unsafe { std::mem::transmute::<usize, HostByName2Fn>(GETHOSTBYNAME2.get()) };
    // SAFETY: the caller's contract is gethostbyname2(3)'s.
    unsafe { f(name, family) }
}

/// The C library's gethostbyname_r.
///
/// # Safety
/// As gethostbyname_r(3).
pub unsafe fn gethostbyname_r(
    name: *const libc::c_char,
    ret: *mut libc::hostent,
    buf: *mut libc::c_char,
    len: libc::size_t,
    result: *mut *mut libc::hostent,
    h_errnop: *mut c_int,
) -> c_int {
    // SAFETY: the address is the C library's `gethostbyname_r`, whose type this is.
    let f: HostByNameRFn = unsafe { std::mem::transmute::<usize, HostByNameRFn>(GETHOSTBYNAME_R.get()) };
    // SAFETY: the caller's contract is gethostbyname_r(3)'s.
    unsafe { f(name, ret, buf, len, result, h_errnop) }
}

/// The C library's gethostbyname2_r.
///
/// # Safety
/// As gethostbyname2_r(3).
pub unsafe fn gethostbyname2_r(
    name: *const libc::c_char,
    family: c_int,
    ret: *mut libc::hostent,
    buf: *mut libc::c_char,
    len: libc::size_t,
    result: *mut *mut libc::hostent,
    h_errnop: *mut c_int,
) -> c_int {
    // SAFETY: the address is the C library's `gethostbyname2_r`, whose type this is.
    let f: HostByName2RFn = unsafe { std::mem::transmute::<usize, HostByName2RFn>(GETHOSTBYNAME2_R.get()) };
    // SAFETY: the caller's contract is gethostbyname2_r(3)'s.
    unsafe { f(name, family, ret, buf, len, result, h_errnop) }
}

/// The C library's gethostbyaddr.
///
/// # Safety
/// As gethostbyaddr(3).
pub unsafe fn gethostbyaddr(addr: *const c_void, len: socklen_t, family: c_int) -> *mut libc::hostent {
    // SAFETY: the address is the C library's `gethostbyaddr`, whose type this is.
    let f: HostByAddrFn = unsafe { std::mem::transmute::<usize, HostByAddrFn>(GETHOSTBYADDR.get()) };
    // SAFETY: the caller's contract is gethostbyaddr(3)'s.
    unsafe { f(addr, len, family) }
}

/// The C library's gethostbyaddr_r.
///
/// # Safety
/// As gethostbyaddr_r(3).
#[allow(clippy::too_many_arguments)]
pub unsafe fn gethostbyaddr_r(
    addr: *const c_void,
    len: socklen_t,
    family: c_int,
    ret: *mut libc::hostent,
    buf: *mut libc::c_char,
    buflen: libc::size_t,
    result: *mut *mut libc::hostent,
    h_errnop: *mut c_int,
) -> c_int {
    // SAFETY: the address is the C library's `gethostbyaddr_r`, whose type this is.
    let f: HostByAddrRFn = unsafe { std::mem::transmute::<usize, HostByAddrRFn>(GETHOSTBYADDR_R.get()) };
    // SAFETY: the caller's contract is gethostbyaddr_r(3)'s.
    unsafe { f(addr, len, family, ret, buf, buflen, result, h_errnop) }
}
