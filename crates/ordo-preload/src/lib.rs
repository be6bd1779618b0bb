//! The preload library: loaded into an unmodified program (`LD_PRELOAD`, as `ordo run` does),
//! it sends the program's connections to tunnel destinations to Ordo's user-space TCP/IP
//! stack, and leaves everything else to the kernel.
//!
//! How (the attach protocol, `ordo_attach`): the program's socket stays a kernel socket until
//! it connects. A `connect` to an address inside the tunnel's routes hands one end of a Unix
//! socket pair to the service, which connects through its stack, and puts the other end in
//! place of the program's descriptor (dup3, same number, same flags). From then on it is a
//! real kernel descriptor, so read, write, send, recv, poll, epoll, select, dup, fork and
//! close need no hook. A `bind` to a tunnel address and `listen` make a listening socket in
//! the stack, whose connections `accept` takes; the name and option calls answer for tunnel
//! sockets as TCP sockets would; epoll registrations survive the swap (`epoll`). A UDP socket
//! connected to a tunnel address becomes one end of a seqpacket pair whose records are its
//! datagrams (the receive calls report its remote as their source); an unconnected one, bound
//! to a tunnel address or sending into the tunnel while bound to nothing, likewise, with
//! each record carrying its address (`datagram`). With the tunnel's
//! name servers set, `getaddrinfo` resolves through them (`resolve`). Without the service's
//! settings in the environment every hook is the C library's own call.
//!
//! Rules every hook keeps: a program's call reaches the C library unchanged unless it is
//! about the tunnel; no panic crosses into C (each hook catches and answers EIO); the C
//! library's functions are called through `real`, never through our own exported names.

mod addr;
mod attach;
mod datagram;
mod epoll;
mod hostent;
mod inherit;
mod real;
mod res;
mod resolve;
mod sockets;

use libc::{c_int, sockaddr, socklen_t};
use ordo_attach::{Op, Request, Route};
use std::os::fd::{AsRawFd, FromRawFd, IntoRawFd};
use std::path::PathBuf;
use std::sync::OnceLock;
use std::time::{Duration, Instant};

/// Where the service listens and what goes through the tunnel, from the environment.
struct Settings {
    socket: PathBuf,
    routes: Vec<Route>,
}

fn settings() -> Option<&'static Settings> {
    static SETTINGS: OnceLock<Option<Settings>> = OnceLock::new();
    SETTINGS
        .get_or_init(|| {
            let socket = PathBuf::from(std::env::var_os(ordo_attach::ENV_SOCKET)?);
            let routes = ordo_attach::parse_routes(&std::env::var(ordo_attach::ENV_ROUTES).unwrap_or_default());
            // The tunnel sockets an earlier image of this process held, if it exec'd.
            let _ = std::panic::catch_unwind(inherit::import);
            Some(Settings { socket, routes })
        })
        .as_ref()
}

fn set_errno(e: c_int) {
    // SAFETY: errno is this thread's.
    unsafe { *libc::__errno_location() = e };
}

/// Runs a hook's body; a panic becomes EIO instead of unwinding into C.
fn guarded(body: impl FnOnce() -> c_int) -> c_int {
    match std::panic::catch_unwind(std::panic::AssertUnwindSafe(body)) {
        Ok(r) => r,
        Err(_) => {
            set_errno(libc::EIO);
            -1
        }
    }
}

/// An int socket option of `fd` at SOL_SOCKET, through the C library's getsockopt.
fn socket_option(fd: c_int, name: c_int) -> Option<c_int> {
    let mut v: c_int = 0;
    let mut len = std::mem::size_of::<c_int>() as socklen_t;
    // SAFETY: `v` and `len` are valid for getsockopt's int option.
    let r = unsafe { real::getsockopt(fd, libc::SOL_SOCKET, name, (&mut v as *mut c_int).cast(), &mut len) };
    (r == 0).then_some(v)
}

fn socket_type(fd: c_int) -> Option<c_int> {
    socket_option(fd, libc::SO_TYPE)
}

fn socket_family(fd: c_int) -> Option<c_int> {
    socket_option(fd, libc::SO_DOMAIN)
}

/// connect(2): a TCP connection to a tunnel destination goes to the service.
///
/// # Safety
/// As connect(2).
#[no_mangle]
pub unsafe extern "C" fn connect(fd: c_int, address: *const sockaddr, len: socklen_t) -> c_int {
    // SAFETY: the caller's contract is connect(2)'s: `address` has `len` readable bytes.
    let dest = unsafe { addr::read(address, len) };
    if let (Some(s), Some(t)) = (settings(), datagram::addressed(fd)) {
        if let Some(d) = dest {
            return guarded(|| datagram::connect(s, fd, &t, addr::unmapped(d)));
        }
        // SAFETY: the caller's address of `len` bytes, its family read if it has one.
        if unsafe { addr::is_unspec(address, len) } {
            return guarded(|| datagram::disconnect(fd, &t));
        }
    }
    let tunnel = match (settings(), dest) {
        (Some(s), Some(d)) if ordo_attach::through_tunnel(&s.routes, d.ip()) => Some((s, d)),
        // A name server of the host's while the tunnel has its own (`DNS =`): the query goes
        // to the tunnel's, the program still seeing the one it asked for (a resolver of its
        // own, as c-ares or Go's, checks where answers come from).
        (Some(s), Some(d)) => match dns_redirect(s, d) {
            Some(server) => return guarded(|| connect_through_tunnel(s, fd, server, addr::unmapped(d))),
            None => None,
        },
        _ => None,
    };
    let Some((s, dest)) = tunnel else {
        // SAFETY: the caller's address of `len` bytes, its family read if it has one.
        if settings().is_some() && unsafe { addr::is_family(address, len, libc::AF_UNIX) } {
            // Never an IP destination: the kernel's IP sockets refuse an AF_UNIX address.
            // Marked so that `ordo run`'s supervisor need not stop it.
            // SAFETY: the caller's arguments, unchanged.
            return unsafe { real::connect_unix(fd, address, len) };
        }
        // SAFETY: the caller's arguments, unchanged.
        return unsafe { real::connect(fd, address, len) };
    };
    guarded(|| connect_through_tunnel(s, fd, dest, addr::unmapped(dest)))
}

/// Where a DNS query to `dest` goes instead (ordo_attach::dns_redirect), with `DNS =`.
fn dns_redirect(s: &Settings, dest: std::net::SocketAddr) -> Option<std::net::SocketAddr> {
    ordo_attach::dns_redirect(&s.routes, &resolve::settings()?.servers, dest)
}

/// Connects `fd` through the tunnel to `dest`; `shown` is the remote the program is told (the
/// address it asked for, which a redirected DNS query's is not).
fn connect_through_tunnel(s: &Settings, fd: c_int, dest: std::net::SocketAddr, shown: std::net::SocketAddr) -> c_int {
    // Answers that came for programs that never asked (SO_ERROR) are read here, so that the
    // connections to the service they came on do not pile up.
    for t in sockets::pending() {
        connect_result(&t);
    }
    if let Some(t) = sockets::lookup(fd) {
        // connect(2) again on a socket already swapped: in progress, or done.
        set_errno(if t.pending.is_some() {
            libc::EALREADY
        } else {
            libc::EISCONN
        });
        return -1;
    }
    let (Some(ty), Some(family)) = (socket_type(fd), socket_family(fd)) else {
        set_errno(libc::ENOTSOCK);
        return -1;
    };
    let dest = addr::unmapped(dest);
    if ty == libc::SOCK_DGRAM {
        return connect_datagram(s, fd, family, dest, shown);
    }
    if ty != libc::SOCK_STREAM {
        // Other kinds of sockets to the tunnel are not carried: fail closed rather than let
        // the kernel send them elsewhere.
        set_errno(libc::ENETUNREACH);
        return -1;
    }
    let (mine, theirs) = match attach::socket_pair(libc::SOCK_STREAM) {
        Ok(p) => p,
        Err(e) => return fail(e),
    };
    // SAFETY: fcntl on the program's descriptor, reading flags only.
    let status = unsafe { real::fcntl(fd, libc::F_GETFL, 0) };
    let nonblocking = status >= 0 && status & libc::O_NONBLOCK != 0;
    // Every connect is made as a non-blocking one (see `fill`); a blocking connect then waits
    // for the answer, where a signal may interrupt it as it interrupts the kernel's.
    let filler = match fill(mine.as_raw_fd()) {
        Ok(f) => f,
        Err(e) => return fail(e),
    };
    let request = Request {
        op: Op::ConnectTcp,
        addr: dest,
        nonblocking: Some(filler),
        v6_only: false,
    };
    let control = match attach::send(&s.socket, &request, &[theirs.as_raw_fd(), mine.as_raw_fd()]) {
        Ok(c) => c,
        Err(e) => return fail_closed(e),
    };
    drop(theirs);
    // A blocking connect that fails leaves the socket as it was, to be connected again: the
    // program's own socket is kept aside until the answer.
    let original = if nonblocking {
        None
    } else {
        // SAFETY: F_DUPFD_CLOEXEC duplicates the program's descriptor; the copy is ours.
        let copy = unsafe { real::fcntl(fd, libc::F_DUPFD_CLOEXEC, 0) };
        // SAFETY: a descriptor fcntl just made, owned by nobody else.
        (copy >= 0).then(|| unsafe { std::os::fd::OwnedFd::from_raw_fd(copy) })
    };
    let old_inode = sockets::socket_inode(fd);
    let inode = match swap_in(fd, mine, status) {
        Ok(Some(inode)) => inode,
        Ok(None) => {
            set_errno(libc::ENOTSOCK);
            return -1;
        }
        Err(()) => return -1,
    };
    let entry = TunnelSocket {
        pending: Some(control.into_raw_fd()),
        ..TunnelSocket::new(inode, family, None, Some(shown))
    };
    sockets::remember(entry);
    if nonblocking {
        set_errno(libc::EINPROGRESS);
        return -1;
    }
    match wait_for_connect(&entry) {
        // Interrupted: as the kernel's, the connection goes on being made; the program
        // learns of it as after a non-blocking connect (writable, then SO_ERROR).
        None => {
            set_errno(libc::EINTR);
            -1
        }
        Some(0) => 0,
        Some(errno) => {
            // Refused, unreachable, timed out: the program's socket back in place, unconnected.
            if let Some(original) = original {
                // SAFETY: fcntl reading the stand-in's descriptor flags.
                let fd_flags = unsafe { real::fcntl(fd, libc::F_GETFD, 0) };
                let cloexec = if fd_flags >= 0 && fd_flags & libc::FD_CLOEXEC != 0 {
                    libc::O_CLOEXEC
                } else {
                    0
                };
                // SAFETY: both are open descriptors; dup3 atomically replaces `fd`'s file.
                if unsafe { real::dup3(original.as_raw_fd(), fd, cloexec) } >= 0 {
                    sockets::forget(inode);
                    if let Some(old) = old_inode {
                        epoll::carry_over(fd, inode, old);
                    }
                }
            }
            set_errno(errno);
            -1
        }
    }
}

/// Waits for the answer to the connect of `entry`: its errno (0: established), or None if
/// a signal interrupted the wait.
fn wait_for_connect(entry: &TunnelSocket) -> Option<c_int> {
    loop {
        if let Some(errno) = connect_result(entry) {
            return Some(errno);
        }
        let Some(control) = sockets::lookup_inode(entry.inode).and_then(|e| e.pending) else {
            // Answered meanwhile (another thread asked): its result.
            return Some(sockets::lookup_inode(entry.inode).map_or(libc::ECONNABORTED, |e| e.error));
        };
        let mut p = libc::pollfd {
            fd: control,
            events: libc::POLLIN,
            revents: 0,
        };
        // SAFETY: one valid pollfd; no timeout: the service answers within its own.
        if unsafe { libc::poll(&mut p, 1, -1) } < 0
            && std::io::Error::last_os_error().kind() == std::io::ErrorKind::Interrupted
        {
            return None;
        }
    }
}

/// A UDP socket connected to a tunnel address: its descriptor becomes one end of a Unix
/// seqpacket pair whose records are its datagrams, the other end the service's. Answered at
/// once, blocking or not: connecting UDP sends nothing.
fn connect_datagram(
    s: &Settings,
    fd: c_int,
    family: c_int,
    dest: std::net::SocketAddr,
    shown: std::net::SocketAddr,
) -> c_int {
    let request = Request {
        op: Op::ConnectUdp,
        addr: dest,
        nonblocking: None,
        v6_only: false,
    };
    let (reply, inode) = match stand_in_from_service(s, fd, libc::SOCK_SEQPACKET, &request, false) {
        Ok(r) => r,
        Err(r) => return r,
    };
    if let Some(inode) = inode {
        sockets::remember(TunnelSocket {
            datagram: true,
            ..TunnelSocket::new(inode, family, reply.local, Some(shown))
        });
    }
    0
}

/// Sends `request` to the service with one end of a fresh Unix socket pair of type `ty` (and
/// the program's `fd` itself if `with_fd`) and, once it has answered yes, puts the other end
/// in place of the program's `fd` ([`swap_in`]). Returns the reply and the stand-in's inode,
/// or the value the program's call returns (errno set): the service's refusal, or failing
/// closed without it.
fn stand_in_from_service(
    s: &Settings,
    fd: c_int,
    ty: c_int,
    request: &Request,
    with_fd: bool,
) -> Result<(ordo_attach::Reply, Option<u64>), c_int> {
    let (mine, theirs) = attach::socket_pair(ty).map_err(fail)?;
    // The program's O_NONBLOCK, read before the service may change it on the socket passed
    // to it (which shares the program's open file until the swap).
    // SAFETY: fcntl on the program's descriptor, reading flags only.
    let status = unsafe { real::fcntl(fd, libc::F_GETFL, 0) };
    let pass = [theirs.as_raw_fd(), fd];
    let pass = if with_fd { &pass[..] } else { &pass[..1] };
    let reply = match attach::ask(&s.socket, request, pass) {
        Ok(r) if r.errno != 0 => {
            set_errno(r.errno);
            return Err(-1);
        }
        Ok(r) => r,
        Err(e) => return Err(fail_closed(e)),
    };
    drop(theirs);
    let inode = swap_in(fd, mine, status).map_err(|()| -1)?;
    Ok((reply, inode))
}

/// Puts `stand_in` in place of the program's descriptor `fd`: the same number, its
/// O_NONBLOCK (which lives in the open file: `status` is its F_GETFL) and FD_CLOEXEC (in the
/// descriptor) kept, its epoll registrations carried over. Returns the stand-in's inode (None
/// if it cannot be read, which leaves the socket working but unnamed); Err with errno set if
/// `fd` was not replaced.
fn swap_in(fd: c_int, stand_in: std::os::fd::OwnedFd, status: c_int) -> Result<Option<u64>, ()> {
    // SAFETY: fcntl on the program's descriptor, reading flags only.
    let fd_flags = unsafe { real::fcntl(fd, libc::F_GETFD, 0) };
    let cloexec = if fd_flags >= 0 && fd_flags & libc::FD_CLOEXEC != 0 {
        libc::O_CLOEXEC
    } else {
        0
    };
    let old_inode = sockets::socket_inode(fd);
    let raw = stand_in.into_raw_fd();
    // SAFETY: both are open descriptors; dup3 atomically replaces `fd`'s file.
    let r = unsafe { real::dup3(raw, fd, cloexec) };
    // SAFETY: `raw` is ours (into_raw_fd above) and no longer needed.
    unsafe { libc::close(raw) };
    if r < 0 {
        return Err(());
    }
    if status >= 0 && status & libc::O_NONBLOCK != 0 {
        // SAFETY: setting a status flag on the descriptor we just put in place.
        unsafe { real::fcntl(fd, libc::F_SETFL, libc::O_NONBLOCK as libc::c_ulong) };
    }
    let inode = sockets::socket_inode(fd);
    if let (Some(old), Some(new)) = (old_inode, inode) {
        epoll::carry_over(fd, old, new);
    }
    Ok(inode)
}

fn fail(e: std::io::Error) -> c_int {
    set_errno(e.raw_os_error().unwrap_or(libc::EIO));
    -1
}

/// The service is gone or refused us: fail closed (never the kernel's route).
fn fail_closed(e: std::io::Error) -> c_int {
    set_errno(e.raw_os_error().unwrap_or(libc::ENETUNREACH));
    -1
}

/// Makes the stand-in `fd` unwritable until the service drains it: its send buffer at the
/// minimum, then filled. Returns what the service needs to undo it.
fn fill(fd: c_int) -> std::io::Result<ordo_attach::Filler> {
    let sndbuf = socket_option(fd, libc::SO_SNDBUF).ok_or_else(std::io::Error::last_os_error)?;
    let one: c_int = 1;
    // SAFETY: an int option; the kernel raises it to its minimum.
    unsafe {
        real::setsockopt(
            fd,
            libc::SOL_SOCKET,
            libc::SO_SNDBUF,
            (&one as *const c_int).cast(),
            std::mem::size_of::<c_int>() as socklen_t,
        )
    };
    let filler = ordo_attach::fill_send_buffer(fd)?;
    Ok(ordo_attach::Filler {
        filler,
        sndbuf: sndbuf as u32,
    })
}

/// The answer to a non-blocking connect, if it has come: its errno (0: established), and the
/// socket's entry updated. None: still in progress. Under the table's lock, so that two
/// threads asking at once do not both close the connection to the service.
fn connect_result(t: &TunnelSocket) -> Option<c_int> {
    sockets::update(t.inode, |e| {
        let control = e.pending?;
        let reply = match attach::try_reply(control) {
            Ok(None) => return None,
            Ok(Some(r)) => Some(r),
            Err(_) => None,
        };
        // SAFETY: the table owned `control`; it is closed once, here, and forgotten.
        unsafe { libc::close(control) };
        e.pending = None;
        e.error = reply.map_or(libc::ECONNABORTED, |r| r.errno);
        if let Some(r) = reply {
            e.local = r.local.or(e.local);
            e.remote = r.remote.or(e.remote);
        }
        Some(e.error)
    })
    .flatten()
}

/// getsockname(2): a tunnel socket reports its address in the tunnel.
///
/// # Safety
/// As getsockname(2).
#[no_mangle]
pub unsafe extern "C" fn getsockname(fd: c_int, out: *mut sockaddr, len: *mut socklen_t) -> c_int {
    if let Some(TunnelSocket {
        family, local: Some(a), ..
    }) = tunnel_socket(fd)
    {
        // SAFETY: the caller's buffer and length, as getsockname(2) promises them.
        unsafe { addr::write(a, family, out, len) };
        return 0;
    }
    if let Some((a, family)) = bound_socket(fd) {
        // SAFETY: as above.
        unsafe { addr::write(a, family, out, len) };
        return 0;
    }
    // SAFETY: the caller's arguments, unchanged.
    unsafe { real::getsockname(fd, out, len) }
}

/// getpeername(2): a tunnel socket reports the address it connected to.
///
/// # Safety
/// As getpeername(2).
#[no_mangle]
pub unsafe extern "C" fn getpeername(fd: c_int, out: *mut sockaddr, len: *mut socklen_t) -> c_int {
    match tunnel_socket(fd) {
        Some(TunnelSocket {
            family,
            remote: Some(a),
            ..
        }) => {
            // SAFETY: as above.
            unsafe { addr::write(a, family, out, len) };
            return 0;
        }
        // No remote (a listening socket, an unconnected UDP one): as the kernel's, not the
        // stand-in's own (unnamed) peer.
        Some(_) => {
            set_errno(libc::ENOTCONN);
            return -1;
        }
        None => {}
    }
    // SAFETY: the caller's arguments, unchanged.
    unsafe { real::getpeername(fd, out, len) }
}

use sockets::TunnelSocket;

fn tunnel_socket(fd: c_int) -> Option<TunnelSocket> {
    settings()?;
    std::panic::catch_unwind(|| sockets::lookup(fd)).ok().flatten()
}

/// setsockopt(2): on a tunnel socket, the TCP and IP options are the stack's business, not
/// the Unix socket's (which would refuse them): they are taken and succeed. Socket-level
/// options go to the Unix socket, where those that make sense there (buffer sizes,
/// timeouts) act.
///
/// # Safety
/// As setsockopt(2).
#[no_mangle]
pub unsafe extern "C" fn setsockopt(
    fd: c_int,
    level: c_int,
    name: c_int,
    value: *const libc::c_void,
    len: socklen_t,
) -> c_int {
    if tunnel_socket(fd).is_some() {
        match level {
            libc::IPPROTO_TCP | libc::IPPROTO_IP | libc::IPPROTO_IPV6 => return 0,
            _ => {
                // SAFETY: the caller's arguments, unchanged.
                let r = unsafe { real::setsockopt(fd, level, name, value, len) };
                let e = std::io::Error::last_os_error().raw_os_error();
                if r != 0 && matches!(e, Some(libc::ENOPROTOOPT) | Some(libc::EOPNOTSUPP)) {
                    return 0;
                }
                return r;
            }
        }
    }
    // SAFETY: the caller's arguments, unchanged.
    unsafe { real::setsockopt(fd, level, name, value, len) }
}

/// getsockopt(2): a tunnel socket answers as the TCP socket it stands for: its family and
/// protocol, and plausible TCP figures (TCP_INFO says established; the stack's own figures
/// are not reported yet).
///
/// # Safety
/// As getsockopt(2).
#[no_mangle]
pub unsafe extern "C" fn getsockopt(
    fd: c_int,
    level: c_int,
    name: c_int,
    value: *mut libc::c_void,
    len: *mut socklen_t,
) -> c_int {
    if let Some(t) = tunnel_socket(fd) {
        let int = match (level, name) {
            // A non-blocking connect's result, once: as the kernel reports it, then clears it.
            (libc::SOL_SOCKET, libc::SO_ERROR) if t.pending.is_some() || t.error != 0 => {
                let errno = if t.pending.is_some() {
                    connect_result(&t).unwrap_or(0)
                } else {
                    t.error
                };
                sockets::update(t.inode, |e| e.error = 0);
                Some(errno)
            }
            (libc::SOL_SOCKET, libc::SO_DOMAIN) => Some(t.family),
            (libc::SOL_SOCKET, libc::SO_PROTOCOL) if t.datagram => Some(libc::IPPROTO_UDP),
            (libc::SOL_SOCKET, libc::SO_PROTOCOL) => Some(libc::IPPROTO_TCP),
            // The stand-in of a UDP socket is a seqpacket socket: it answers as what it stands for.
            (libc::SOL_SOCKET, libc::SO_TYPE) if t.datagram => Some(libc::SOCK_DGRAM),
            (libc::IPPROTO_TCP, libc::TCP_INFO) => {
                // SAFETY: tcp_info is plain data; all zeros is valid.
                let mut info: libc::tcp_info = unsafe { std::mem::zeroed() };
                info.tcpi_state = 1; // TCP_ESTABLISHED
                                     // SAFETY: the caller's buffer of `*len` bytes.
                unsafe { copy_out(&info, value, len) };
                return 0;
            }
            (libc::IPPROTO_TCP, libc::TCP_MAXSEG) => Some(1380),
            (libc::IPPROTO_TCP, _) | (libc::IPPROTO_IP, _) | (libc::IPPROTO_IPV6, _) => Some(0),
            _ => None,
        };
        if let Some(v) = int {
            // SAFETY: as above.
            unsafe { copy_out(&v, value, len) };
            return 0;
        }
    }
    // SAFETY: the caller's arguments, unchanged.
    unsafe { real::getsockopt(fd, level, name, value, len) }
}

/// Copies `v` into a getsockopt buffer: truncated to `*len`, `*len` set to what was written.
///
/// # Safety
/// `out` has `*len` writable bytes; `len` is writable.
unsafe fn copy_out<T>(v: &T, out: *mut libc::c_void, len: *mut socklen_t) {
    if out.is_null() || len.is_null() {
        return;
    }
    // SAFETY: the caller's buffer; we copy at most `*len` bytes of `v`.
    unsafe {
        let n = (*len as usize).min(std::mem::size_of::<T>());
        std::ptr::copy_nonoverlapping((v as *const T).cast::<u8>(), out.cast::<u8>(), n);
        *len = n as socklen_t;
    }
}

/// epoll_ctl(2): the C library's, and a note of each socket's registration, so that a
/// socket registered before it connects keeps its registration through the swap.
///
/// # Safety
/// As epoll_ctl(2).
#[no_mangle]
pub unsafe extern "C" fn epoll_ctl(epfd: c_int, op: c_int, fd: c_int, event: *mut libc::epoll_event) -> c_int {
    // SAFETY: the caller's arguments, unchanged.
    let r = unsafe { real::epoll_ctl(epfd, op, fd, event) };
    if r == 0 && settings().is_some() {
        // SAFETY: for ADD and MOD, epoll_ctl just read `event`, so it is readable; it may be
        // unaligned (the structure is packed on some targets).
        let e = (!event.is_null() && op != libc::EPOLL_CTL_DEL).then(|| unsafe { std::ptr::read_unaligned(event) });
        let _ = std::panic::catch_unwind(|| epoll::note(epfd, op, fd, e));
    }
    r
}

extern "C" {
    /// The process's environment (the C library's).
    static environ: *const *const libc::c_char;
}

/// execve(2): the tunnel sockets' table goes along in the new program's environment
/// (`inherit`), so that the library there still knows them. Nothing here allocates: it runs
/// between fork and exec.
///
/// # Safety
/// As execve(2).
#[no_mangle]
pub unsafe extern "C" fn execve(
    path: *const libc::c_char,
    argv: *const *const libc::c_char,
    envp: *const *const libc::c_char,
) -> c_int {
    // SAFETY: the caller's arguments, the environment with the table.
    match unsafe { inherit::with_table(envp, |env| real::execve(path, argv, env)) } {
        Some(r) => r,
        // SAFETY: the caller's arguments, unchanged.
        None => unsafe { real::execve(path, argv, envp) },
    }
}

/// execvpe(3): as [`execve`].
///
/// # Safety
/// As execvpe(3).
#[no_mangle]
pub unsafe extern "C" fn execvpe(
    file: *const libc::c_char,
    argv: *const *const libc::c_char,
    envp: *const *const libc::c_char,
) -> c_int {
    // SAFETY: the caller's arguments, the environment with the table.
    match unsafe { inherit::with_table(envp, |env| real::execvpe(file, argv, env)) } {
        Some(r) => r,
        // SAFETY: the caller's arguments, unchanged.
        None => unsafe { real::execvpe(file, argv, envp) },
    }
}

/// execv(3): as [`execve`], with the process's environment.
///
/// # Safety
/// As execv(3).
#[no_mangle]
pub unsafe extern "C" fn execv(path: *const libc::c_char, argv: *const *const libc::c_char) -> c_int {
    // SAFETY: the C library's environment; the caller's arguments.
    match unsafe { inherit::with_table(environ, |env| real::execve(path, argv, env)) } {
        Some(r) => r,
        // SAFETY: the caller's arguments, unchanged.
        None => unsafe { real::execv(path, argv) },
    }
}

/// execvp(3): as [`execve`], with the process's environment.
///
/// # Safety
/// As execvp(3).
#[no_mangle]
pub unsafe extern "C" fn execvp(file: *const libc::c_char, argv: *const *const libc::c_char) -> c_int {
    // SAFETY: the C library's environment; the caller's arguments.
    match unsafe { inherit::with_table(environ, |env| real::execvpe(file, argv, env)) } {
        Some(r) => r,
        // SAFETY: the caller's arguments, unchanged.
        None => unsafe { real::execvp(file, argv) },
    }
}

/// posix_spawn(3): as [`execve`] (the C library's runs in this process, as a vfork).
///
/// # Safety
/// As posix_spawn(3).
#[no_mangle]
pub unsafe extern "C" fn posix_spawn(
    pid: *mut libc::pid_t,
    path: *const libc::c_char,
    actions: *const libc::posix_spawn_file_actions_t,
    attr: *const libc::posix_spawnattr_t,
    argv: *const *mut libc::c_char,
    envp: *const *mut libc::c_char,
) -> c_int {
    // SAFETY: the caller's arguments, the environment with the table.
    let spawned = unsafe {
        inherit::with_table(envp.cast(), |env| {
            real::posix_spawn(false, pid, path, actions, attr, argv, env.cast())
        })
    };
    // SAFETY: the caller's arguments, unchanged.
    spawned.unwrap_or_else(|| unsafe { real::posix_spawn(false, pid, path, actions, attr, argv, envp) })
}

/// posix_spawnp(3): as [`posix_spawn`].
///
/// # Safety
/// As posix_spawnp(3).
#[no_mangle]
pub unsafe extern "C" fn posix_spawnp(
    pid: *mut libc::pid_t,
    file: *const libc::c_char,
    actions: *const libc::posix_spawn_file_actions_t,
    attr: *const libc::posix_spawnattr_t,
    argv: *const *mut libc::c_char,
    envp: *const *mut libc::c_char,
) -> c_int {
    // SAFETY: the caller's arguments, the environment with the table.
    let spawned = unsafe {
        inherit::with_table(envp.cast(), |env| {
            real::posix_spawn(true, pid, file, actions, attr, argv, env.cast())
        })
    };
    // SAFETY: the caller's arguments, unchanged.
    spawned.unwrap_or_else(|| unsafe { real::posix_spawn(true, pid, file, actions, attr, argv, envp) })
}

/// What a send with a destination does on a descriptor.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Destination {
    /// Handed to the C library as it is: no destination, or one the library read and found
    /// outside the tunnel (so marked as checked for `ordo run`'s supervisor, [`checked`]).
    Kernel,
    /// Handed to the C library as it is, unmarked: a destination the library does not read
    /// (not IP, or an IPv6 address of the older 24-byte size, which the kernel takes), left
    /// for the supervisor to judge.
    Unread,
    /// Fails with this errno: ENETUNREACH for a tunnel destination from a socket that
    /// cannot reach it (bound by the kernel, or not UDP: it fails closed, never leaving by
    /// the kernel's route), or for a destination outside the tunnel from an unconnected
    /// tunnel UDP socket; EISCONN for a connected tunnel UDP socket given
    /// another destination than its remote (the kernel would send there; the stand-in
    /// reaches its remote only, so it must not be handed one it would misdirect).
    Refused(c_int),
    /// Left out: a tunnel socket is connected (a TCP one, or a UDP one sent to its own
    /// remote), and the kernel's TCP ignores a destination given to it, where the Unix
    /// stream socket standing in for it fails with EISCONN.
    Dropped,
    /// An unconnected tunnel UDP socket's datagram to a tunnel address: sent with its header
    /// (`datagram`).
    Addressed {
        to: std::net::SocketAddr,
        marker: [u8; ordo_attach::MARKER_LEN],
        /// Outside the tunnel, through the socket's kernel socket.
        via_host: bool,
    },
}

/// What a send on `fd` to the destination `addr` does.
///
/// # Safety
/// `addr` is null or points to `len` readable bytes.
unsafe fn destination(fd: c_int, addr: *const sockaddr, len: socklen_t) -> Destination {
    let Some(s) = settings() else {
        return Destination::Kernel;
    };
    // SAFETY: the caller's contract, for both readings. A family of 0 is read as an IPv4
    // socket's send reads it; an IPv6 socket's takes it as no address (left unread, for the
    // supervisor, which judges both readings).
    let read = unsafe {
        addr::read(addr, len)
            .or_else(|| addr::unspec_as_ipv4(addr, len).filter(|_| socket_family(fd) == Some(libc::AF_INET)))
    };
    let Some(dest) = read.map(addr::unmapped) else {
        // No destination: an unconnected tunnel UDP socket has nowhere to send, as the
        // kernel's would not (its stand-in would take the record and the service drop it).
        return match datagram::addressed(fd) {
            Some(t) if t.remote.is_none() => Destination::Refused(libc::EDESTADDRREQ),
            _ if addr.is_null() => Destination::Kernel,
            _ => Destination::Unread,
        };
    };
    let to_tunnel = ordo_attach::through_tunnel(&s.routes, dest.ip());
    if dns_redirect(s, dest).is_some() {
        // A query to a host's name server while the tunnel has its own: not carried for an
        // unconnected socket (its answers would name another source), refused rather than
        // leaked.
        return Destination::Refused(libc::ENETUNREACH);
    }
    if !to_tunnel && !sockets::any_datagram() {
        // Neither a tunnel destination nor a tunnel UDP socket that could be misdirected:
        // the kernel's, without a look-up.
        return Destination::Kernel;
    }
    match tunnel_socket(fd) {
        Some(TunnelSocket {
            marker: Some(marker),
            host,
            ..
        }) if to_tunnel || host => Destination::Addressed {
            to: dest,
            marker,
            via_host: !to_tunnel,
        },
        Some(TunnelSocket { marker: Some(_), .. }) => Destination::Refused(libc::ENETUNREACH),
        Some(t) if t.datagram && t.remote != Some(dest) => Destination::Refused(libc::EISCONN),
        // The stand-in would ignore it (a Unix seqpacket socket) or refuse it (a stream
        // one); left out, no tunnel destination ever reaches the kernel from the library,
        // and `ordo run`'s supervisor refuses any that does (crates/ordo/src/run/supervise.rs).
        Some(_) => Destination::Dropped,
        // A UDP socket bound to nothing yet: bound in the stack by its first datagram, as
        // the kernel binds it on its first send.
        None if to_tunnel => match std::panic::catch_unwind(|| datagram::bind_for_send(s, fd)) {
            Ok(Ok(marker)) => Destination::Addressed {
                to: dest,
                marker,
                via_host: false,
            },
            Ok(Err(errno)) => Destination::Refused(errno),
            Err(_) => Destination::Refused(libc::EIO),
        },
        None => Destination::Kernel,
    }
}

/// `flags` marked as a send whose destination the library checked (or that has none), for
/// `ordo run`'s supervisor to let by (ordo_attach::CHECKED_SEND): only where the library
/// knows the tunnel's networks, so that it did check.
fn checked(flags: c_int) -> c_int {
    if settings().is_some() {
        flags | ordo_attach::CHECKED_SEND
    } else {
        flags
    }
}

/// sendto(2): see [`destination`]; everything else is the C library's.
///
/// # Safety
/// As sendto(2).
#[no_mangle]
pub unsafe extern "C" fn sendto(
    fd: c_int,
    buf: *const libc::c_void,
    len: libc::size_t,
    flags: c_int,
    addr: *const sockaddr,
    addr_len: socklen_t,
) -> libc::ssize_t {
    // SAFETY: the caller's address, as sendto(2) promises it.
    match unsafe { destination(fd, addr, addr_len) } {
        Destination::Refused(errno) => {
            set_errno(errno);
            -1
        }
        // SAFETY: the caller's buffer, without the destination.
        Destination::Dropped => unsafe { real::sendto(fd, buf, len, checked(flags), std::ptr::null(), 0) },
        Destination::Addressed { to, marker, via_host } => {
            let iov = libc::iovec {
                iov_base: buf as *mut libc::c_void,
                iov_len: len,
            };
            // SAFETY: one iovec of the caller's buffer.
            unsafe { datagram::send_to(fd, marker, to, via_host, &iov, 1, flags) }
        }
        // SAFETY: the caller's arguments, unchanged but for the mark.
        Destination::Kernel => unsafe { real::sendto(fd, buf, len, checked(flags), addr, addr_len) },
        // SAFETY: the caller's arguments, unchanged.
        Destination::Unread => unsafe { real::sendto(fd, buf, len, flags, addr, addr_len) },
    }
}

/// sendmsg(2): as [`sendto`], for the message's destination.
///
/// # Safety
/// As sendmsg(2).
#[no_mangle]
pub unsafe extern "C" fn sendmsg(fd: c_int, msg: *const libc::msghdr, flags: c_int) -> libc::ssize_t {
    let mut mark = false;
    if !msg.is_null() {
        // SAFETY: `msg` is the caller's message header, as sendmsg(2) promises it.
        match unsafe { destination(fd, (*msg).msg_name.cast(), (*msg).msg_namelen) } {
            Destination::Refused(errno) => {
                set_errno(errno);
                return -1;
            }
            Destination::Dropped => {
                // SAFETY: the caller's header, read to be copied.
                let mut m = unsafe { std::ptr::read(msg) };
                m.msg_name = std::ptr::null_mut();
                m.msg_namelen = 0;
                // SAFETY: the caller's message, without the destination.
                return unsafe { real::sendmsg(fd, &m, checked(flags)) };
            }
            Destination::Addressed { to, marker, via_host } => {
                // Its payload with the header; its control messages (the IP options of
                // the kernel's sockets) are not carried.
                // SAFETY: the caller's message's iovecs, as sendmsg(2) promises them.
                return unsafe {
                    datagram::send_to(fd, marker, to, via_host, (*msg).msg_iov, (*msg).msg_iovlen, flags)
                };
            }
            Destination::Kernel => mark = true,
            Destination::Unread => {}
        }
    }
    let flags = if mark { checked(flags) } else { flags };
    // SAFETY: the caller's arguments, unchanged but for the mark.
    unsafe { real::sendmsg(fd, msg, flags) }
}

/// sendmmsg(2): as [`sendto`]; the messages before the first refused are sent, and their
/// count returned (none: that message's errno).
///
/// # Safety
/// As sendmmsg(2).
#[no_mangle]
pub unsafe extern "C" fn sendmmsg(fd: c_int, msgs: *mut libc::mmsghdr, n: libc::c_uint, flags: c_int) -> c_int {
    if settings().is_some() && !msgs.is_null() && n > 0 {
        // SAFETY: `msgs` has `n` > 0 entries.
        let first = unsafe { &(*msgs).msg_hdr };
        // An unconnected tunnel UDP socket (or one the first message makes so): each message
        // is a record of its own, sent as sendmsg sends it.
        let addressed = datagram::addressed(fd).is_some()
            // SAFETY: the first entry's own destination.
            || matches!(unsafe { destination(fd, first.msg_name.cast(), first.msg_namelen) }, Destination::Addressed { .. });
        if addressed {
            let mut sent = 0;
            for i in 0..n as usize {
                // SAFETY: entry `i` < `n` of the caller's array.
                let m = unsafe { &mut *msgs.add(i) };
                // SAFETY: the entry's own header.
                let r = unsafe { sendmsg(fd, &m.msg_hdr, flags) };
                if r < 0 {
                    return if sent == 0 { -1 } else { sent };
                }
                m.msg_len = r as libc::c_uint;
                sent += 1;
            }
            return sent;
        }
    }
    let mut allowed = n;
    let mut refused = 0;
    let mut dropped = false;
    let mut unread = false;
    if settings().is_some() && !msgs.is_null() {
        for i in 0..n {
            // SAFETY: `msgs` has `n` entries, as sendmmsg(2) promises.
            let h = unsafe { &(*msgs.add(i as usize)).msg_hdr };
            // SAFETY: the entry's own destination.
            match unsafe { destination(fd, h.msg_name.cast(), h.msg_namelen) } {
                Destination::Refused(errno) => {
                    allowed = i;
                    refused = errno;
                    break;
                }
                Destination::Dropped => dropped = true,
                Destination::Unread => unread = true,
                // Taken above.
                Destination::Addressed { .. } | Destination::Kernel => {}
            }
        }
    }
    if dropped && allowed > 0 {
        // A tunnel TCP socket: the messages go without their destinations, from a copy,
        // and what was sent of each is reported in the caller's.
        // SAFETY: `msgs` has at least `allowed` entries.
        let mut copy: Vec<libc::mmsghdr> = unsafe { std::slice::from_raw_parts(msgs, allowed as usize) }.to_vec();
        for m in &mut copy {
            m.msg_hdr.msg_name = std::ptr::null_mut();
            m.msg_hdr.msg_namelen = 0;
        }
        // SAFETY: the copy has `allowed` entries, pointing at the caller's buffers.
        let sent = unsafe { real::sendmmsg(fd, copy.as_mut_ptr(), allowed, checked(flags)) };
        for (i, m) in copy.iter().enumerate().take(sent.max(0) as usize) {
            // SAFETY: `i` < `allowed`, an entry of the caller's array.
            unsafe { (*msgs.add(i)).msg_len = m.msg_len };
        }
        return sent;
    }
    if allowed == 0 && n > 0 {
        set_errno(refused);
        return -1;
    }
    // Marked only if every message's destination was read (none was, without the settings:
    // then the mark is not set at all).
    let flags = if unread || msgs.is_null() {
        flags
    } else {
        checked(flags)
    };
    // SAFETY: the caller's arguments, the count cut at the first refused message.
    unsafe { real::sendmmsg(fd, msgs, allowed, flags) }
}

/// Where a datagram read from `fd` came from, if `fd` is a tunnel UDP socket: its remote
/// (the only source a connected socket receives from), in the family it was made with.
fn datagram_source(fd: c_int) -> Option<(std::net::SocketAddr, c_int)> {
    if !sockets::any_datagram() {
        return None;
    }
    match tunnel_socket(fd)? {
        TunnelSocket {
            datagram: true,
            remote: Some(r),
            family,
            ..
        } => Some((r, family)),
        _ => None,
    }
}

/// recvfrom(2): the C library's; on a tunnel UDP socket, the source it reports is the
/// socket's remote (the stand-in has no such address to give).
///
/// # Safety
/// As recvfrom(2).
#[no_mangle]
pub unsafe extern "C" fn recvfrom(
    fd: c_int,
    buf: *mut libc::c_void,
    len: libc::size_t,
    flags: c_int,
    addr: *mut sockaddr,
    addr_len: *mut socklen_t,
) -> libc::ssize_t {
    if let Some(family) = datagram::addressed_family(fd) {
        let iov = libc::iovec {
            iov_base: buf,
            iov_len: len,
        };
        // SAFETY: one iovec of the caller's buffer; the caller's address buffer.
        return unsafe { datagram::recv(fd, family, &iov, 1, flags, addr, addr_len, std::ptr::null_mut()) };
    }
    // Only a caller asking where the datagram came from needs the look-up.
    let source = if addr.is_null() || addr_len.is_null() {
        None
    } else {
        datagram_source(fd)
    };
    // The kernel sets the length to the stand-in's (empty) source: the buffer's size is
    // taken first.
    // SAFETY: `addr_len` is non-null whenever `source` is set, and the caller's to read.
    let room = source.map(|_| unsafe { *addr_len });
    // SAFETY: the caller's arguments, unchanged.
    let n = unsafe { real::recvfrom(fd, buf, len, flags, addr, addr_len) };
    if let (true, Some((a, family)), Some(room)) = (n >= 0, source, room) {
        // SAFETY: the caller's address buffer of `room` bytes and its length, non-null.
        unsafe {
            *addr_len = room;
            addr::write(a, family, addr, addr_len);
        }
    }
    n
}

/// recvmsg(2): as [`recvfrom`], for the message's name.
///
/// # Safety
/// As recvmsg(2).
#[no_mangle]
pub unsafe extern "C" fn recvmsg(fd: c_int, msg: *mut libc::msghdr, flags: c_int) -> libc::ssize_t {
    if let (Some(family), false) = (datagram::addressed_family(fd), msg.is_null()) {
        // SAFETY: the caller's message header, as recvmsg(2) promises it.
        let m = unsafe { &mut *msg };
        // No control messages come with the stack's datagrams.
        m.msg_controllen = 0;
        let (name, name_len) = if m.msg_name.is_null() {
            (std::ptr::null_mut(), std::ptr::null_mut())
        } else {
            (m.msg_name.cast(), &mut m.msg_namelen as *mut socklen_t)
        };
        // SAFETY: the header's iovecs and name buffer, as recvmsg(2) promises them.
        return unsafe {
            datagram::recv(
                fd,
                family,
                m.msg_iov,
                m.msg_iovlen,
                flags,
                name,
                name_len,
                &mut m.msg_flags,
            )
        };
    }
    // SAFETY: `msg` is null or the caller's message header, as recvmsg(2) promises it.
    let source = if msg.is_null() || unsafe { (*msg).msg_name.is_null() } {
        None
    } else {
        datagram_source(fd)
    };
    // As in recvfrom: the name buffer's size, before the kernel overwrites it.
    // SAFETY: `msg` is non-null whenever `source` is set.
    let room = source.map(|_| unsafe { (*msg).msg_namelen });
    // SAFETY: the caller's arguments, unchanged.
    let n = unsafe { real::recvmsg(fd, msg, flags) };
    if let (true, Some((a, family)), Some(room)) = (n >= 0, source, room) {
        // SAFETY: the header's name buffer (non-null, checked above) of `room` bytes.
        unsafe {
            (*msg).msg_namelen = room;
            addr::write(a, family, (*msg).msg_name.cast(), &mut (*msg).msg_namelen);
        }
    }
    n
}

/// An unconnected tunnel socket's records into `msgs` ([`recvmmsg`]), one recvmsg each, as
/// the kernel fills them: the first as `flags` say; the others at once with MSG_WAITFORONE,
/// else waiting for each until `deadline` (the kernel looks at its timeout only after each
/// datagram, so a caller whose datagrams stop waits for ever there; here the wait ends at
/// the deadline), or without a deadline until all `n` came. A non-blocking socket returns
/// what was there. Returns how many were received, or -1 with errno if none.
///
/// # Safety
/// `msgs` points to `n` writable entries, as recvmmsg(2) promises.
unsafe fn receive_records(
    fd: c_int,
    msgs: *mut libc::mmsghdr,
    n: usize,
    flags: c_int,
    deadline: Option<Instant>,
) -> c_int {
    let one = flags & !libc::MSG_WAITFORONE;
    let mut got = 0;
    for i in 0..n {
        let f = if i == 0 {
            one
        } else if flags & libc::MSG_WAITFORONE != 0 {
            one | libc::MSG_DONTWAIT
        } else if let Some(d) = deadline {
            let left = d.saturating_duration_since(Instant::now());
            let mut p = libc::pollfd {
                fd,
                events: libc::POLLIN,
                revents: 0,
            };
            // Rounded up: poll's milliseconds end at or after the deadline, not before it.
            let ms = left.as_nanos().div_ceil(1_000_000).min(c_int::MAX as u128) as c_int;
            // SAFETY: one pollfd of ours. Interrupted or timed out: what came so far.
            if left.is_zero() || unsafe { libc::poll(&mut p, 1, ms) } <= 0 {
                break;
            }
            one | libc::MSG_DONTWAIT
        } else {
            one
        };
        // SAFETY: entry `i` < `n` of the caller's array.
        let m = unsafe { &mut *msgs.add(i) };
        // SAFETY: the entry's own header.
        let r = unsafe { recvmsg(fd, &mut m.msg_hdr, f) };
        if r < 0 {
            return if got == 0 { -1 } else { got };
        }
        m.msg_len = r as libc::c_uint;
        got += 1;
    }
    got
}

fn duration_of(t: &libc::timespec) -> Duration {
    Duration::new(t.tv_sec.max(0) as u64, t.tv_nsec.clamp(0, 999_999_999) as u32)
}

/// recvmmsg(2): as [`recvfrom`], for each message received.
///
/// # Safety
/// As recvmmsg(2).
#[no_mangle]
pub unsafe extern "C" fn recvmmsg(
    fd: c_int,
    msgs: *mut libc::mmsghdr,
    n: libc::c_uint,
    flags: c_int,
    timeout: *mut libc::timespec,
) -> c_int {
    if let (Some(_), false) = (datagram::addressed_family(fd), msgs.is_null()) {
        // SAFETY: `timeout` is null or the caller's, readable and writable.
        let deadline = unsafe { timeout.as_ref() }.map(|t| Instant::now() + duration_of(t));
        // SAFETY: `msgs` has `n` entries.
        let got = unsafe { receive_records(fd, msgs, n as usize, flags, deadline) };
        if let (Some(d), false) = (deadline, timeout.is_null()) {
            // As the kernel: the time that was left.
            let left = d.saturating_duration_since(Instant::now());
            // SAFETY: the caller's timespec, writable.
            unsafe {
                (*timeout).tv_sec = left.as_secs() as libc::time_t;
                (*timeout).tv_nsec = left.subsec_nanos() as libc::c_long;
            }
        }
        return got;
    }
    let source = if msgs.is_null() { None } else { datagram_source(fd) };
    // As in recvfrom: each name buffer's size, before the kernel overwrites it.
    let rooms: Vec<socklen_t> = match source {
        // SAFETY: `msgs` has `n` entries, as recvmmsg(2) promises.
        Some(_) => (0..n as usize)
            .map(|i| unsafe { (*msgs.add(i)).msg_hdr.msg_namelen })
            .collect(),
        None => Vec::new(),
    };
    // SAFETY: the caller's arguments, unchanged.
    let got = unsafe { real::recvmmsg(fd, msgs, n, flags, timeout) };
    if let Some((a, family)) = source {
        for (i, room) in rooms.iter().enumerate().take(got.max(0) as usize) {
            // SAFETY: the kernel filled the first `got` of the caller's `n` entries.
            let h = unsafe { &mut (*msgs.add(i)).msg_hdr };
            if !h.msg_name.is_null() {
                h.msg_namelen = *room;
                // SAFETY: the entry's name buffer of `room` bytes and its length field.
                unsafe { addr::write(a, family, h.msg_name.cast(), &mut h.msg_namelen) };
            }
        }
    }
    got
}

/// recv(2): on an unconnected tunnel UDP socket, the payload without its source.
///
/// # Safety
/// As recv(2).
#[no_mangle]
pub unsafe extern "C" fn recv(fd: c_int, buf: *mut libc::c_void, len: libc::size_t, flags: c_int) -> libc::ssize_t {
    if datagram::addressed_family(fd).is_some() {
        // SAFETY: the caller's arguments, as recvfrom(2) takes them.
        return unsafe { recvfrom(fd, buf, len, flags, std::ptr::null_mut(), std::ptr::null_mut()) };
    }
    // SAFETY: the caller's arguments, unchanged.
    unsafe { real::recv(fd, buf, len, flags) }
}

/// read(2): as [`recv`]; every other descriptor's read is the C library's after one look at
/// a slot (`sockets::addressed`).
///
/// # Safety
/// As read(2).
#[no_mangle]
pub unsafe extern "C" fn read(fd: c_int, buf: *mut libc::c_void, len: libc::size_t) -> libc::ssize_t {
    if let Some(family) = datagram::addressed_family(fd) {
        let iov = libc::iovec {
            iov_base: buf,
            iov_len: len,
        };
        let (name, name_len, msg_flags) = (std::ptr::null_mut(), std::ptr::null_mut(), std::ptr::null_mut());
        // SAFETY: one iovec of the caller's buffer.
        return unsafe { datagram::recv(fd, family, &iov, 1, 0, name, name_len, msg_flags) };
    }
    // SAFETY: the caller's arguments, unchanged.
    unsafe { real::read(fd, buf, len) }
}

/// A descriptor copied from `fd` (the result of a dup, `copy`) is marked as `fd` is: the
/// receive hooks take the headers off an unconnected tunnel UDP socket's copies too.
fn copied(fd: c_int, copy: c_int) {
    if copy >= 0 {
        sockets::mark_copy(fd, copy);
    }
}

/// dup(2), as the C library's, the copy marked as the original ([`copied`]).
///
/// # Safety
/// As dup(2).
#[no_mangle]
pub unsafe extern "C" fn dup(fd: c_int) -> c_int {
    // SAFETY: the caller's arguments, unchanged.
    let copy = unsafe { real::dup(fd) };
    copied(fd, copy);
    copy
}

/// dup2(2), as [`dup`].
///
/// # Safety
/// As dup2(2).
#[no_mangle]
pub unsafe extern "C" fn dup2(fd: c_int, to: c_int) -> c_int {
    // SAFETY: the caller's arguments, unchanged.
    let copy = unsafe { real::dup2(fd, to) };
    copied(fd, copy);
    copy
}

/// dup3(2), as [`dup`].
///
/// # Safety
/// As dup3(2).
#[no_mangle]
pub unsafe extern "C" fn dup3(fd: c_int, to: c_int, flags: c_int) -> c_int {
    // SAFETY: the caller's arguments, unchanged.
    let copy = unsafe { real::dup3(fd, to, flags) };
    copied(fd, copy);
    copy
}

/// fcntl(2), as the C library's; F_DUPFD and F_DUPFD_CLOEXEC as [`dup`]. The C declaration
/// is variadic; its one optional argument arrives as the third (an int or a pointer, in a
/// register of its own either way on the ABIs this library is built for).
///
/// # Safety
/// As fcntl(2).
#[no_mangle]
pub unsafe extern "C" fn fcntl(fd: c_int, cmd: c_int, arg: libc::c_ulong) -> c_int {
    // SAFETY: the caller's arguments, unchanged.
    let r = unsafe { real::fcntl(fd, cmd, arg) };
    if cmd == libc::F_DUPFD || cmd == libc::F_DUPFD_CLOEXEC {
        copied(fd, r);
    }
    r
}

/// fcntl64: what programs built with 64-bit file offsets call for fcntl (glibc's headers
/// rename it), as [`fcntl`].
///
/// # Safety
/// As fcntl(2).
#[no_mangle]
pub unsafe extern "C" fn fcntl64(fd: c_int, cmd: c_int, arg: libc::c_ulong) -> c_int {
    // SAFETY: the caller's arguments, unchanged.
    let r = unsafe { real::fcntl64(fd, cmd, arg) };
    if cmd == libc::F_DUPFD || cmd == libc::F_DUPFD_CLOEXEC {
        copied(fd, r);
    }
    r
}

/// ioctl(2), as the C library's; FIONREAD on an unconnected tunnel UDP socket counts the next
/// datagram's payload, as the kernel's UDP does, not the source the service's record starts
/// with. Variadic in C, as [`fcntl`].
///
/// # Safety
/// As ioctl(2).
#[no_mangle]
pub unsafe extern "C" fn ioctl(fd: c_int, request: libc::c_ulong, arg: *mut libc::c_void) -> c_int {
    // SAFETY: the caller's arguments, unchanged.
    let r = unsafe { real::ioctl(fd, request, arg) };
    if r == 0
        && request == libc::FIONREAD as libc::c_ulong
        && !arg.is_null()
        && datagram::addressed_family(fd).is_some()
    {
        let n = arg.cast::<c_int>();
        // SAFETY: FIONREAD's argument is an int the call just wrote.
        unsafe { *n = (*n - ordo_attach::SOURCE_LEN as c_int).max(0) };
    }
    r
}

/// The tunnel address a not yet listening socket was bound to, and its family.
fn bound_socket(fd: c_int) -> Option<(std::net::SocketAddr, c_int)> {
    settings()?;
    // A wildcard is bound by the kernel, which names it (with the port it chose).
    let a = sockets::bound_to(sockets::socket_inode(fd)?).filter(|a| !a.ip().is_unspecified())?;
    Some((a, socket_family(fd)?))
}

/// bind(2): a TCP socket bound to a tunnel address is the stack's: the kernel never sees the
/// bind (it would refuse an address that is not the host's); listen makes it a listening
/// socket in the stack. One bound to the unspecified address (0.0.0.0, ::) is bound by the
/// kernel and noted: listen makes it listen on the tunnel's addresses too.
///
/// # Safety
/// As bind(2).
#[no_mangle]
pub unsafe extern "C" fn bind(fd: c_int, address: *const sockaddr, len: socklen_t) -> c_int {
    // SAFETY: the caller's address, as bind(2) promises it.
    let dest = unsafe { addr::read(address, len) };
    if let (Some(s), Some(a)) = (settings(), dest) {
        let tunnel = ordo_attach::through_tunnel(&s.routes, a.ip());
        if (tunnel || a.ip().is_unspecified()) && socket_type(fd) == Some(libc::SOCK_DGRAM) {
            if !tunnel {
                // Every address: the kernel's bind first (its port, its errors), then the
                // stack's on the same port, with the kernel's socket relayed beside it.
                // SAFETY: the caller's arguments, unchanged.
                let r = unsafe { real::bind(fd, address, len) };
                if r != 0 {
                    return r;
                }
            }
            return guarded(|| {
                let Some(family) = socket_family(fd) else {
                    set_errno(libc::ENOTSOCK);
                    return -1;
                };
                let bound = if tunnel {
                    datagram::bind(s, fd, family, addr::unmapped(a))
                } else {
                    datagram::bind_everywhere(s, fd, family)
                };
                match bound {
                    Ok(_) => 0,
                    Err(r) => r,
                }
            });
        }
    }
    let stream = |s: &Settings, a: std::net::SocketAddr| {
        (ordo_attach::through_tunnel(&s.routes, a.ip()) || a.ip().is_unspecified())
            && socket_type(fd) == Some(libc::SOCK_STREAM)
    };
    let Some((a, wildcard)) = settings()
        .zip(dest)
        .filter(|(s, a)| stream(s, *a))
        .map(|(_, a)| (addr::unmapped(a), a.ip().is_unspecified()))
    else {
        // SAFETY: the caller's arguments, unchanged.
        return unsafe { real::bind(fd, address, len) };
    };
    if wildcard {
        // SAFETY: the caller's arguments, unchanged.
        let r = unsafe { real::bind(fd, address, len) };
        if r == 0 {
            if let Some(inode) = sockets::socket_inode(fd) {
                let _ = std::panic::catch_unwind(|| sockets::bound(inode, a));
            }
        }
        return r;
    }
    guarded(|| match sockets::socket_inode(fd) {
        Some(inode) => {
            sockets::bound(inode, a);
            0
        }
        None => {
            set_errno(libc::ENOTSOCK);
            -1
        }
    })
}

/// listen(2): a socket bound to a tunnel address listens in the stack; its descriptor
/// becomes the listening end of a Unix seqpacket pair over which the service sends each
/// connection it accepts. One bound to the unspecified address listens in the kernel too, and
/// the service hands over the kernel's connections on the same pair.
///
/// # Safety
/// As listen(2).
#[no_mangle]
pub unsafe extern "C" fn listen(fd: c_int, backlog: c_int) -> c_int {
    if let Some((s, inode, local)) = settings().and_then(|s| {
        let inode = sockets::socket_inode(fd)?;
        Some((s, inode, sockets::bound_to(inode)?))
    }) {
        if local.ip().is_unspecified() {
            // SAFETY: the caller's arguments, unchanged.
            let r = unsafe { real::listen(fd, backlog) };
            if r != 0 {
                return r;
            }
        }
        return guarded(|| listen_in_stack(s, fd, inode, local));
    }
    // SAFETY: the caller's arguments, unchanged.
    unsafe { real::listen(fd, backlog) }
}

fn listen_in_stack(s: &Settings, fd: c_int, inode: u64, mut local: std::net::SocketAddr) -> c_int {
    let Some(family) = socket_family(fd) else {
        set_errno(libc::ENOTSOCK);
        return -1;
    };
    let wildcard = local.ip().is_unspecified();
    let mut v6_only = false;
    if wildcard {
        // The kernel's socket listens already: its port (chosen by the kernel for port 0),
        // and whether it takes IPv4 too.
        match addr::kernel_name(fd) {
            Err(()) => return -1,
            Ok(Some(a)) => local.set_port(a.port()),
            Ok(None) => {}
        }
        v6_only = family == libc::AF_INET6 && ipv6_only(fd);
    }
    let request = Request {
        op: Op::ListenTcp,
        addr: local,
        nonblocking: None,
        v6_only,
    };
    let (reply, new) = match stand_in_from_service(s, fd, libc::SOCK_SEQPACKET, &request, wildcard) {
        Ok(r) => r,
        Err(r) => return r,
    };
    sockets::forget_bound(inode);
    if let Some(new) = new {
        sockets::remember(TunnelSocket {
            listening: true,
            ..TunnelSocket::new(new, family, reply.local.or(Some(local)), None)
        });
    }
    0
}

/// Whether an IPv6 socket is IPV6_V6ONLY.
fn ipv6_only(fd: c_int) -> bool {
    let mut v: c_int = 0;
    let mut len = std::mem::size_of::<c_int>() as socklen_t;
    // SAFETY: `v` and `len` are valid for an int option.
    let r = unsafe {
        real::getsockopt(
            fd,
            libc::IPPROTO_IPV6,
            libc::IPV6_V6ONLY,
            (&mut v as *mut c_int).cast(),
            &mut len,
        )
    };
    r == 0 && v != 0
}

/// accept(2).
///
/// # Safety
/// As accept(2).
#[no_mangle]
pub unsafe extern "C" fn accept(fd: c_int, address: *mut sockaddr, len: *mut socklen_t) -> c_int {
    // SAFETY: the caller's arguments.
    unsafe { accept4(fd, address, len, 0) }
}

/// accept4(2): on a tunnel listening socket, the next connection the service sent over it,
/// with the flags asked for and the peer's address.
///
/// # Safety
/// As accept4(2).
#[no_mangle]
pub unsafe extern "C" fn accept4(fd: c_int, address: *mut sockaddr, len: *mut socklen_t, flags: c_int) -> c_int {
    match tunnel_socket(fd) {
        Some(t) if t.listening => guarded(|| {
            // SAFETY: the caller's address buffer, as accept4(2) promises it.
            unsafe { accept_from_stack(fd, &t, address, len, flags) }
        }),
        // SAFETY: the caller's arguments, unchanged.
        _ => unsafe { real::accept4(fd, address, len, flags) },
    }
}

/// # Safety
/// `address` is null or has `*len` writable bytes.
unsafe fn accept_from_stack(
    fd: c_int,
    t: &TunnelSocket,
    address: *mut sockaddr,
    len: *mut socklen_t,
    flags: c_int,
) -> c_int {
    let (accepted, conn) = match attach::recv_accepted(fd, flags & libc::SOCK_CLOEXEC != 0) {
        Ok(a) => a,
        Err(e) => return fail(e),
    };
    let cfd = conn.into_raw_fd();
    if flags & libc::SOCK_NONBLOCK != 0 {
        // SAFETY: a status flag on the descriptor we just received.
        unsafe { real::fcntl(cfd, libc::F_SETFL, libc::O_NONBLOCK as libc::c_ulong) };
    }
    if !address.is_null() && !len.is_null() {
        // SAFETY: the caller's buffer and length.
        unsafe { addr::write(accepted.remote, t.family, address, len) };
    }
    if accepted.kernel {
        // The kernel's own TCP socket: nothing to stand in for.
        return cfd;
    }
    if let Some(inode) = sockets::socket_inode(cfd) {
        sockets::remember(TunnelSocket::new(
            inode,
            t.family,
            Some(accepted.local),
            Some(accepted.remote),
        ));
    }
    cfd
}

/// getaddrinfo(3): with the tunnel's name servers set (`DNS =`), a name the host's
/// `/etc/hosts` does not know is looked up through them ([`resolve`]); the result is built
/// by the C library from the addresses found, so that services, socket types and
/// `freeaddrinfo` are all its own. Numeric hosts, and everything without `DNS =`, are the C
/// library's.
///
/// # Safety
/// As getaddrinfo(3).
#[no_mangle]
pub unsafe extern "C" fn getaddrinfo(
    node: *const libc::c_char,
    service: *const libc::c_char,
    hints: *const libc::addrinfo,
    res: *mut *mut libc::addrinfo,
) -> c_int {
    let through_tunnel = match resolve::settings() {
        Some(dns) if !node.is_null() && !res.is_null() => {
            // SAFETY: `node` is a NUL-terminated string, as getaddrinfo(3) promises.
            let name = unsafe { std::ffi::CStr::from_ptr(node) };
            // SAFETY: `hints` is null or readable, as getaddrinfo(3) promises.
            let hints = unsafe { hints.as_ref() };
            name.to_str()
                .ok()
                .filter(|n| resolved_by_tunnel(n, hints))
                .map(|n| (dns, n))
        }
        _ => None,
    };
    let Some((dns, name)) = through_tunnel else {
        // SAFETY: the caller's arguments, unchanged.
        return unsafe { real::getaddrinfo(node, service, hints, res) };
    };
    match std::panic::catch_unwind(|| {
        // SAFETY: the caller's arguments, as getaddrinfo(3) promises them.
        unsafe { addrinfo_from_tunnel(dns, name, service, hints, res) }
    }) {
        Ok(r) => r,
        Err(_) => libc::EAI_SYSTEM,
    }
}

/// getnameinfo(3): with the tunnel's name servers set (`DNS =`), an address's name is asked
/// of them (its PTR record) unless `/etc/hosts` names it or the caller asks for the number;
/// the service's name and every other case are the C library's.
///
/// # Safety
/// As getnameinfo(3).
#[no_mangle]
pub unsafe extern "C" fn getnameinfo(
    sa: *const sockaddr,
    salen: socklen_t,
    host: *mut libc::c_char,
    hostlen: socklen_t,
    serv: *mut libc::c_char,
    servlen: socklen_t,
    flags: c_int,
) -> c_int {
    let wanted = !host.is_null() && hostlen > 0 && flags & libc::NI_NUMERICHOST == 0;
    // SAFETY: the caller's address, as getnameinfo(3) promises it.
    let ip = wanted
        .then(|| unsafe { addr::read(sa, salen) })
        .flatten()
        .map(|a| addr::unmapped(a).ip());
    let (Some(dns), Some(ip)) = (resolve::settings(), ip) else {
        // SAFETY: the caller's arguments, unchanged.
        return unsafe { real::getnameinfo(sa, salen, host, hostlen, serv, servlen, flags) };
    };
    if ip.is_loopback() || resolve::hosts_name_of(ip).is_some() {
        // SAFETY: as above.
        return unsafe { real::getnameinfo(sa, salen, host, hostlen, serv, servlen, flags) };
    }
    std::panic::catch_unwind(|| {
        let name = match resolve::reverse(dns, ip) {
            Ok(name) => name,
            Err(e) if flags & libc::NI_NAMEREQD != 0 => return e,
            // No name: the number, as the C library gives it.
            Err(_) => {
                // SAFETY: the caller's arguments, the number asked for.
                return unsafe {
                    real::getnameinfo(sa, salen, host, hostlen, serv, servlen, flags | libc::NI_NUMERICHOST)
                };
            }
        };
        let name = if flags & libc::NI_NOFQDN != 0 {
            name.split('.').next().unwrap_or(&name).to_string()
        } else {
            name
        };
        if name.len() + 1 > hostlen as usize {
            return libc::EAI_OVERFLOW;
        }
        // SAFETY: `host` has `hostlen` writable bytes, more than the name and its NUL.
        unsafe {
            std::ptr::copy_nonoverlapping(name.as_ptr(), host.cast::<u8>(), name.len());
            *host.add(name.len()) = 0;
        }
        if serv.is_null() || servlen == 0 {
            return 0;
        }
        // SAFETY: the caller's address and service buffer; the host part is done.
        unsafe { real::getnameinfo(sa, salen, std::ptr::null_mut(), 0, serv, servlen, flags) }
    })
    .unwrap_or(libc::EAI_SYSTEM)
}

/// Whether `name` is one for the tunnel's name servers: not numeric, not asked to be, not in
/// the hosts file.
pub(crate) fn resolved_by_tunnel(name: &str, hints: Option<&libc::addrinfo>) -> bool {
    let numeric_only = hints.is_some_and(|h| h.ai_flags & libc::AI_NUMERICHOST != 0);
    // Addresses in any form the C library parses (IPv6 with a scope, IPv4 with fewer
    // parts) are numbers: its own business.
    let numeric = name.contains(':') || name.bytes().all(|b| b.is_ascii_digit() || b == b'.');
    !numeric_only && !numeric && !name.is_empty() && !resolve::in_hosts_file(name)
}

/// # Safety
/// As getaddrinfo(3): `service` null or a string, `hints` null or readable, `res` writable.
unsafe fn addrinfo_from_tunnel(
    dns: &ordo_attach::Dns,
    name: &str,
    service: *const libc::c_char,
    hints: *const libc::addrinfo,
    res: *mut *mut libc::addrinfo,
) -> c_int {
    // SAFETY: the caller's contract.
    let asked: Option<libc::addrinfo> = unsafe { hints.as_ref() }.copied();
    let family = asked.map_or(libc::AF_UNSPEC, |h| h.ai_family);
    let mut found = match resolve::lookup(dns, name, family) {
        Ok(f) => f,
        Err(eai) => return eai,
    };
    // IPv4 first: any peer reaches it, where the tunnel may carry no IPv6.
    found.addresses.sort_by_key(|a| a.is_ipv6());
    found.addresses.dedup();
    // SAFETY: addrinfo is plain data; all zeros is "no hints".
    let mut numeric: libc::addrinfo = asked.unwrap_or(unsafe { std::mem::zeroed() });
    // The C library makes each entry from the number; the name and the host's address
    // families are this lookup's business, not its.
    numeric.ai_flags = (numeric.ai_flags | libc::AI_NUMERICHOST) & !(libc::AI_CANONNAME | libc::AI_ADDRCONFIG);
    let mut head: *mut libc::addrinfo = std::ptr::null_mut();
    let mut tail: *mut libc::addrinfo = std::ptr::null_mut();
    // An address the hints rule out is skipped; an error about the request itself (its
    // service, its socket type) is the same for every address, and is the answer.
    let mut error = libc::EAI_NONAME;
    for a in &found.addresses {
        let Ok(text) = std::ffi::CString::new(a.to_string()) else {
            continue;
        };
        let mut part: *mut libc::addrinfo = std::ptr::null_mut();
        // SAFETY: a numeric host, the caller's service, our hints, our result pointer.
        let r = unsafe { real::getaddrinfo(text.as_ptr(), service, &numeric, &mut part) };
        if r != 0 || part.is_null() {
            error = if r != 0 { r } else { libc::EAI_NONAME };
            continue;
        }
        if head.is_null() {
            head = part;
        } else {
            // SAFETY: `tail` is the last entry of the chain built so far, ours to link.
            unsafe { (*tail).ai_next = part };
        }
        tail = part;
        loop {
            // SAFETY: `tail` is an entry of the C library's fresh list.
            let next = unsafe { (*tail).ai_next };
            if next.is_null() {
                break;
            }
            tail = next;
        }
    }
    if head.is_null() {
        return error;
    }
    if asked.is_some_and(|h| h.ai_flags & libc::AI_CANONNAME != 0) {
        if let Ok(canonical) = std::ffi::CString::new(found.canonical) {
            // SAFETY: the first entry is ours; freeaddrinfo frees its name with free(3), so
            // the name is made by the C library's strdup.
            unsafe { (*head).ai_canonname = libc::strdup(canonical.as_ptr()) };
        }
    }
    // SAFETY: `res` is writable, as getaddrinfo(3) promises.
    unsafe { *res = head };
    0
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::net::UnixDatagram;

    /// recvmmsg on an unconnected tunnel socket (its stand-in's records carry sources):
    /// what is there at once with MSG_WAITFORONE; with a timeout, the wait for more ends
    /// there and the time left is written back; with neither, it waits until all came.
    #[test]
    fn recvmmsg_on_a_tunnel_socket_waits_as_its_flags_and_timeout_say() {
        let (program, service) = UnixDatagram::pair().unwrap();
        let fd = program.as_raw_fd();
        sockets::mark_addressed(fd, sockets::socket_inode(fd).unwrap(), libc::AF_INET);
        let from: std::net::SocketAddr = "10.99.0.2:53".parse().unwrap();
        let send = move |s: &UnixDatagram, byte: u8| {
            let mut record = ordo_attach::Source(from).encode().to_vec();
            record.push(byte);
            s.send(&record).unwrap();
        };
        let mut bufs = [[0u8; 8]; 4];
        let mut iovs: Vec<libc::iovec> = (bufs.iter_mut())
            .map(|b| libc::iovec {
                iov_base: b.as_mut_ptr().cast(),
                iov_len: b.len(),
            })
            .collect();
        // SAFETY: mmsghdr is plain data; each gets one iovec of `bufs` below.
        let mut msgs: Vec<libc::mmsghdr> = (0..4).map(|_| unsafe { std::mem::zeroed() }).collect();
        for (m, iov) in msgs.iter_mut().zip(iovs.iter_mut()) {
            m.msg_hdr.msg_iov = iov;
            m.msg_hdr.msg_iovlen = 1;
        }
        let received = |msgs: &mut Vec<libc::mmsghdr>, flags, timeout: *mut libc::timespec| {
            // SAFETY: 4 entries, each with a live buffer; `timeout` null or ours.
            unsafe { recvmmsg(fd, msgs.as_mut_ptr(), 4, flags, timeout) }
        };

        send(&service, 1);
        send(&service, 2);
        assert_eq!(received(&mut msgs, libc::MSG_WAITFORONE, std::ptr::null_mut()), 2);
        assert_eq!((bufs[0][0], bufs[1][0], msgs[0].msg_len), (1, 2, 1));

        send(&service, 3);
        send(&service, 4);
        let mut timeout = libc::timespec {
            tv_sec: 0,
            tv_nsec: 100_000_000,
        };
        let start = Instant::now();
        assert_eq!(received(&mut msgs, 0, &mut timeout), 2);
        let waited = start.elapsed();
        assert!(
            waited >= Duration::from_millis(90) && waited < Duration::from_secs(5),
            "{waited:?}"
        );
        assert_eq!((timeout.tv_sec, timeout.tv_nsec), (0, 0), "no time left");

        send(&service, 5);
        send(&service, 6);
        let later = service.try_clone().unwrap();
        let sender = std::thread::spawn(move || {
            // The receiver is waiting by then, whenever it started.
            std::thread::sleep(Duration::from_millis(50));
            send(&later, 7);
            send(&later, 8);
        });
        assert_eq!(received(&mut msgs, 0, std::ptr::null_mut()), 4);
        assert_eq!(bufs.map(|b| b[0]), [5, 6, 7, 8]);
        sender.join().unwrap();
    }

    #[test]
    fn numbers_and_asked_for_numbers_stay_the_c_library_s() {
        // SAFETY: addrinfo is plain data; all zeros is "no hints".
        let mut numeric: libc::addrinfo = unsafe { std::mem::zeroed() };
        numeric.ai_flags = libc::AI_NUMERICHOST;
        for n in ["10.0.0.1", "127.1", "fe80::1%eth0", "::1", ""] {
            assert!(!resolved_by_tunnel(n, None), "{n}");
        }
        assert!(!resolved_by_tunnel("web.example", Some(&numeric)));
        assert!(resolved_by_tunnel("web.example", None));
        assert!(resolved_by_tunnel("10.0.0.1.example", None));
    }
}
