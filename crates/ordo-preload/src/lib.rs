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
//!
//! Where: the hooks, every exported symbol, by family in `hooks/` (stream, datagram, listen,
//! names, descriptors, exec, resolver, hostent, res); what they share here and in the modules
//! beside this one: the table of tunnel sockets (`sockets`, carried across exec by
//! `inherit`), the conversation with the service (`attach`) and the swap of a program's
//! descriptor for the service's stand-in (`stand_in`), addresses (`addr`), unconnected UDP
//! sockets' records (`datagram`), epoll registrations (`epoll`), the resolver (`resolve`),
//! and the C library's own functions (`real`).

mod addr;
mod attach;
mod datagram;
mod epoll;
mod hooks;
mod inherit;
mod real;
mod resolve;
mod sockets;
mod stand_in;

use libc::{c_int, socklen_t};
use ordo_attach::Route;
use std::path::PathBuf;
use std::sync::OnceLock;

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

/// The socket's type, for the kinds the stack carries: SOCK_STREAM for TCP, SOCK_DGRAM for
/// UDP. Any other protocol of those types (SCTP's stream sockets, UDP-Lite) is SOCK_RAW here,
/// which nothing carries: the type alone does not tell, and what is not carried to the tunnel
/// fails closed.
fn carried_type(fd: c_int) -> Option<c_int> {
    let ty = socket_option(fd, libc::SO_TYPE)?;
    match (ty, socket_option(fd, libc::SO_PROTOCOL)?) {
        (libc::SOCK_STREAM, libc::IPPROTO_TCP) | (libc::SOCK_DGRAM, libc::IPPROTO_UDP) => Some(ty),
        _ => Some(libc::SOCK_RAW),
    }
}

fn socket_family(fd: c_int) -> Option<c_int> {
    socket_option(fd, libc::SO_DOMAIN)
}

fn tunnel_socket(fd: c_int) -> Option<sockets::TunnelSocket> {
    settings()?;
    std::panic::catch_unwind(|| sockets::lookup(fd)).ok().flatten()
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

fn fail(e: std::io::Error) -> c_int {
    set_errno(e.raw_os_error().unwrap_or(libc::EIO));
    -1
}

/// The service is gone or refused us: fail closed (never the kernel's route).
fn fail_closed(e: std::io::Error) -> c_int {
    set_errno(e.raw_os_error().unwrap_or(libc::ENETUNREACH));
    -1
}
