//! A supervised program's TCP or UDP connect to a tunnel address, made through the stack
//! from outside: what the preload library does from inside the program (crates/ordo-preload),
//! done here for programs it cannot reach (static, Go), whose connect the filter stopped
//! (run/supervise.rs). The program's socket is looked at through a copy (pidfd_getfd); a
//! Unix socket pair's end takes its place at the same descriptor number
//! (SECCOMP_IOCTL_NOTIF_ADDFD with SETFD, as dup2 would from inside), and the other end goes
//! to the stack with the request, as the library's does.
//!
//! A non-blocking connect (Go's are) returns EINPROGRESS at once; the stand-in is made
//! unwritable until the stack has the connection (the same filler protocol as the
//! library's). A blocking one is answered when the stack answers, from a thread of its own;
//! if it fails, the program's own socket is put back, unconnected, as the kernel leaves it.
//!
//! A UDP socket's connect is answered at once, its descriptor then one end of a Unix
//! seqpacket pair whose records are its datagrams, as the library makes it.
//!
//! What a Unix socket would say wrong of such a stand-in (SO_ERROR after a failed
//! non-blocking connect, getsockname, getpeername) the supervisor answers from
//! run/stand_ins.rs (the filter stops those calls too). A datagram's source still names the
//! Unix socket.

use super::listener::{inode, respond, Caller};
use super::stand_ins::{Names, StandIns};
use ordo_attach::rights::Rights;
use ordo_attach::{Filler, Op, Reply, Request, REPLY_LEN};
use std::io::{self, Read};
use std::net::SocketAddr;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::os::unix::net::UnixStream;
use std::path::Path;
use std::sync::Arc;

/// What the supervisor answers now.
pub enum Answer {
    /// Return this (0, or a negative errno) from the program's connect.
    Now(i32),
    /// A thread answers once the stack has.
    Later,
}

/// A stopped connect(2): where to answer it, and whose it is.
#[derive(Clone, Copy)]
pub struct Stopped<'a> {
    pub listener: &'a Arc<OwnedFd>,
    pub stand_ins: &'a StandIns,
    /// The notification's id.
    pub id: u64,
    /// The calling process.
    pub caller: &'a Caller,
    /// The program's socket.
    pub fd: RawFd,
}

/// Makes the stopped connect to `dest` through the stack at `socket`; the program is told
/// its remote is `shown`. Err: the errno to fail the call with.
pub fn connect(call: Stopped, socket: &Path, dest: SocketAddr, shown: SocketAddr) -> Result<Answer, i32> {
    let (listener, stand_ins, id, tid, fd) = (call.listener, call.stand_ins, call.id, call.caller.tid, call.fd);
    let original = call.caller.take_fd(listener, id, fd).map_err(|e| errno(&e))?;
    let family = int_option(original.as_raw_fd(), libc::SO_DOMAIN).unwrap_or(0);
    let inet = family == libc::AF_INET || family == libc::AF_INET6;
    // TCP and UDP are carried; anything else to the tunnel fails closed (SCTP's stream
    // sockets and UDP-Lite's datagram ones among them: the type alone does not tell).
    let protocol = int_option(original.as_raw_fd(), libc::SO_PROTOCOL);
    match (int_option(original.as_raw_fd(), libc::SO_TYPE), protocol) {
        (Some(libc::SOCK_STREAM), Some(libc::IPPROTO_TCP)) if inet => {}
        (Some(libc::SOCK_DGRAM), Some(libc::IPPROTO_UDP)) if inet => {
            return connect_datagram(call, family, socket, dest, shown)
        }
        _ => return Err(libc::ENETUNREACH),
    }
    // SAFETY: reading the status flags of our copy (the same open file as the program's).
    let status = unsafe { libc::fcntl(original.as_raw_fd(), libc::F_GETFL) };
    let nonblocking = status >= 0 && status & libc::O_NONBLOCK != 0;
    let cloexec = close_on_exec(tid, fd);

    let (stand_in, service_end) = socket_pair(libc::SOCK_STREAM).map_err(|e| errno(&e))?;
    let filler = fill(stand_in.as_raw_fd()).map_err(|e| errno(&e))?;
    let request = Request {
        op: Op::ConnectTcp,
        addr: dest,
        nonblocking: Some(filler),
        v6_only: false,
    };
    // No stack to ask: fail closed, as the library does.
    let control =
        ask(socket, &request, &[service_end.as_raw_fd(), stand_in.as_raw_fd()]).map_err(|_| libc::ENETUNREACH)?;
    drop(service_end);
    if nonblocking {
        // SAFETY: setting a status flag on our stand-in, before the program has it.
        unsafe { libc::fcntl(stand_in.as_raw_fd(), libc::F_SETFL, libc::O_NONBLOCK) };
    }
    let stand_in_inode = inode(stand_in.as_raw_fd());
    put_in_place(listener, id, stand_in.as_raw_fd(), fd, cloexec).map_err(|e| errno(&e))?;
    drop(stand_in);
    let names = Names {
        family,
        local: None,
        remote: shown,
        connected: false,
    };
    if let Some(i) = stand_in_inode {
        stand_ins.made(i, names, None);
    }
    // The stack's answer, when it comes: the stand-in's SO_ERROR and names.
    let answer = {
        let stand_ins = stand_ins.clone();
        move |control| {
            let (errno, local) = match reply(control) {
                Ok(r) => (r.errno, r.local),
                Err(e) => (errno(&e), None),
            };
            if let Some(i) = stand_in_inode {
                stand_ins.answered(i, errno, local);
            }
            errno
        }
    };

    if nonblocking {
        // The stand-in turns writable when the connection is made; if it fails, the
        // service closes its end and the program asks SO_ERROR.
        std::thread::spawn(move || answer(control));
        return Ok(Answer::Now(-libc::EINPROGRESS));
    }
    let listener = listener.clone();
    let stand_ins = stand_ins.clone();
    std::thread::spawn(move || {
        let errno = answer(control);
        if errno != 0 {
            // Refused, unreachable, timed out: the program's socket back, unconnected.
            let _ = put_in_place(&listener, id, original.as_raw_fd(), fd, cloexec);
            if let Some(i) = stand_in_inode {
                stand_ins.forget(i);
            }
        }
        respond(&listener, id, -errno);
    });
    Ok(Answer::Later)
}

/// A UDP socket's connect: its descriptor becomes one end of a Unix seqpacket pair whose
/// records are its datagrams, as the library makes it (`connect_datagram` in
/// crates/ordo-preload). Answered at once: connecting UDP sends nothing.
fn connect_datagram(
    call: Stopped,
    family: i32,
    socket: &Path,
    dest: SocketAddr,
    shown: SocketAddr,
) -> Result<Answer, i32> {
    let cloexec = close_on_exec(call.caller.tid, call.fd);
    let (stand_in, service_end) = socket_pair(libc::SOCK_SEQPACKET).map_err(|e| errno(&e))?;
    let request = Request {
        op: Op::ConnectUdp,
        addr: dest,
        nonblocking: None,
        v6_only: false,
    };
    let control = ask(socket, &request, &[service_end.as_raw_fd()]).map_err(|_| libc::ENETUNREACH)?;
    drop(service_end);
    let answer = reply(control).map_err(|_| libc::ENETUNREACH)?;
    if answer.errno != 0 {
        return Err(answer.errno);
    }
    let stand_in_inode = inode(stand_in.as_raw_fd());
    put_in_place(call.listener, call.id, stand_in.as_raw_fd(), call.fd, cloexec).map_err(|e| errno(&e))?;
    if let Some(i) = stand_in_inode {
        let names = Names {
            family,
            local: answer.local,
            remote: shown,
            connected: true,
        };
        call.stand_ins.made(i, names, Some(0));
    }
    Ok(Answer::Now(0))
}

fn errno(e: &io::Error) -> i32 {
    e.raw_os_error().unwrap_or(libc::EIO)
}

fn int_option(fd: RawFd, name: libc::c_int) -> Option<libc::c_int> {
    let mut value: libc::c_int = 0;
    let mut len = std::mem::size_of::<libc::c_int>() as libc::socklen_t;
    // SAFETY: an int option read into `value`, `len` its size.
    let r = unsafe {
        libc::getsockopt(
            fd,
            libc::SOL_SOCKET,
            name,
            (&mut value as *mut libc::c_int).cast(),
            &mut len,
        )
    };
    (r == 0).then_some(value)
}

/// Whether the program's descriptor `fd` is close-on-exec (its /proc fdinfo's flags).
fn close_on_exec(tid: u32, fd: RawFd) -> bool {
    let info = std::fs::read_to_string(format!("/proc/{tid}/fdinfo/{fd}")).unwrap_or_default();
    info.lines()
        .find_map(|l| l.strip_prefix("flags:"))
        .and_then(|v| u32::from_str_radix(v.trim(), 8).ok())
        .is_some_and(|flags| flags & libc::O_CLOEXEC as u32 != 0)
}

/// A Unix socket pair of type `ty`: the stand-in's end, the service's.
fn socket_pair(ty: libc::c_int) -> io::Result<(OwnedFd, OwnedFd)> {
    let mut fds = [0 as libc::c_int; 2];
    // SAFETY: `fds` has room for the two descriptors socketpair writes.
    if unsafe { libc::socketpair(libc::AF_UNIX, ty | libc::SOCK_CLOEXEC, 0, fds.as_mut_ptr()) } < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: socketpair succeeded: both are open descriptors that nothing else owns.
    Ok(unsafe { (OwnedFd::from_raw_fd(fds[0]), OwnedFd::from_raw_fd(fds[1])) })
}

/// Makes the stand-in unwritable until the stack drains it (the library's protocol, see
/// `fill` in crates/ordo-preload): its send buffer at the minimum, filled with zeros.
fn fill(fd: RawFd) -> io::Result<Filler> {
    let sndbuf = int_option(fd, libc::SO_SNDBUF).ok_or_else(io::Error::last_os_error)?;
    let one: libc::c_int = 1;
    // SAFETY: an int option; the kernel raises it to its minimum.
    unsafe {
        libc::setsockopt(
            fd,
            libc::SOL_SOCKET,
            libc::SO_SNDBUF,
            (&one as *const libc::c_int).cast(),
            std::mem::size_of::<libc::c_int>() as libc::socklen_t,
        )
    };
    let filler = ordo_attach::fill_send_buffer(fd)?;
    Ok(Filler {
        filler,
        sndbuf: sndbuf as u32,
    })
}

/// Sends `request` with the descriptors `pass` to the service at `socket`; the connection
/// its answer will come on.
fn ask(socket: &Path, request: &Request, pass: &[RawFd]) -> io::Result<UnixStream> {
    let control = UnixStream::connect(socket)?;
    let bytes = request.encode();
    let mut iov = libc::iovec {
        iov_base: bytes.as_ptr() as *mut libc::c_void,
        iov_len: bytes.len(),
    };
    let mut rights = Rights::default();
    let msg = rights.send_header(&mut iov, pass);
    // SAFETY: `msg` describes `bytes` and the control buffer, both alive for the call.
    let n = unsafe { libc::sendmsg(control.as_raw_fd(), &msg, libc::MSG_NOSIGNAL) };
    if n != bytes.len() as isize {
        return Err(if n < 0 {
            io::Error::last_os_error()
        } else {
            io::Error::new(io::ErrorKind::WriteZero, "short request")
        });
    }
    Ok(control)
}

fn reply(mut control: UnixStream) -> io::Result<Reply> {
    let mut buf = [0u8; REPLY_LEN];
    control.read_exact(&mut buf)?;
    Reply::decode(&buf).map_err(|e| io::Error::new(io::ErrorKind::InvalidData, e))
}

/// Puts our descriptor `ours` at the program's `fd` (SECCOMP_IOCTL_NOTIF_ADDFD with SETFD:
/// as dup2 from inside), close-on-exec if the program's was.
fn put_in_place(listener: &OwnedFd, id: u64, ours: RawFd, fd: RawFd, cloexec: bool) -> io::Result<()> {
    let add = libc::seccomp_notif_addfd {
        id,
        flags: libc::SECCOMP_ADDFD_FLAG_SETFD as u32,
        srcfd: ours as u32,
        newfd: fd as u32,
        newfd_flags: if cloexec { libc::O_CLOEXEC as u32 } else { 0 },
    };
    // SAFETY: ADDFD reads `add`; the descriptor it names is ours, open.
    if unsafe { libc::ioctl(listener.as_raw_fd(), libc::SECCOMP_IOCTL_NOTIF_ADDFD, &add) } < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}
