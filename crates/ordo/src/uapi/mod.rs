//! The UAPI socket, /var/run/wireguard/IFNAME.sock (another user's: see [`socket_dir`]),
//! through which `wg` configures and reads the interface exactly as it does wireguard-go's.

pub mod client;
mod connections;
pub mod protocol;

use crate::device::peers::CoreCopy;
use crate::device::Device;
use crate::secret_text::{SecretReader, SecretText};
use connections::{Connections, MarkBusy, MarkIdle, Slot};
use ordo_proto::PresharedKey;
use protocol::{AllowedIpChange, DeviceView, Operation, PeerView, SetPlan, UapiError};
use std::io::{self, BufRead, Write};
use std::os::unix::fs::PermissionsExt;
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};
use zeroize::Zeroizing;

pub const SOCKET_DIR: &str = "/var/run/wireguard";
/// Longest line accepted; a key line is at most ~100 bytes.
const MAX_LINE: usize = 4096;
/// Most bytes one request may make us hold, each line counted with what holding it costs
/// (its `String` and its allocation, see [`held_bytes`]): a setconf of 10,000 peers is a few
/// MB, and a request of tiny lines cannot cost more than this.
const MAX_REQUEST_BYTES: usize = 64 << 20;
/// Longest a connection may stay silent in the middle of a request, or between requests, or
/// leave its reply unread, before it is closed: `wg` writes its request at once.
const READ_TIMEOUT: Duration = Duration::from_secs(10);
/// Pause after a failed accept (EMFILE: out of descriptors), rather than spin on it.
const ACCEPT_BACKOFF: Duration = Duration::from_millis(100);

/// Where this user's interfaces have their sockets: /var/run/wireguard for root (where `wg`
/// looks), and for any other user a directory of its own, since it may not write there (a
/// stack interface, `Inner = stack`, needs no privilege): `$XDG_RUNTIME_DIR/wireguard`, or
/// `/tmp/ordo-UID` without one.
pub fn socket_dir() -> PathBuf {
    // SAFETY: geteuid reads a process attribute.
    let uid = unsafe { libc::geteuid() };
    if uid == 0 {
        return PathBuf::from(SOCKET_DIR);
    }
    // The runtime directory only if it is this user's: a program started under another
    // user's environment (su, setpriv) inherits that user's.
    let runtime = std::env::var_os("XDG_RUNTIME_DIR").map(PathBuf::from).filter(|d| {
        use std::os::unix::fs::MetadataExt;
        d.is_absolute() && std::fs::metadata(d).is_ok_and(|m| m.is_dir() && m.uid() == uid)
    });
    match runtime {
        Some(runtime) => runtime.join("wireguard"),
        None => std::env::temp_dir().join(format!("ordo-{uid}")),
    }
}

pub fn socket_path(ifname: &str) -> PathBuf {
    socket_dir().join(format!("{ifname}.sock"))
}

/// Makes [`socket_dir`] if it is missing: 0755 for root's (as wireguard-go makes it), 0700
/// for a user's. A user's that exists must be a directory of that user's, closed to others:
/// in a shared place such as /tmp, another user could have made it first.
pub fn ensure_socket_dir() -> io::Result<PathBuf> {
    use std::os::unix::fs::{DirBuilderExt, MetadataExt};
    let dir = socket_dir();
    // SAFETY: geteuid reads a process attribute.
    let uid = unsafe { libc::geteuid() };
    let mode = if uid == 0 { 0o755 } else { 0o700 };
    match std::fs::DirBuilder::new().recursive(uid == 0).mode(mode).create(&dir) {
        Ok(()) => return Ok(dir),
        Err(e) if e.kind() == io::ErrorKind::AlreadyExists => {}
        Err(e) => return Err(io::Error::new(e.kind(), format!("creating {}: {e}", dir.display()))),
    }
    let meta = std::fs::symlink_metadata(&dir)?;
    if uid != 0 && (!meta.is_dir() || meta.uid() != uid || meta.mode() & 0o077 != 0) {
        return Err(io::Error::new(
            io::ErrorKind::PermissionDenied,
            format!("{} is not a directory of this user's closed to others", dir.display()),
        ));
    }
    Ok(dir)
}

/// Binds the socket (mode 0600), replacing a stale one.
pub fn listen(ifname: &str) -> io::Result<(UnixListener, PathBuf)> {
    let dir = ensure_socket_dir()?;
    let path = socket_path(ifname);
    let _lock = DirLock::take(&dir)?;
    Ok((listen_at(&path)?, path))
}

/// An exclusive lock (flock(2)) on a socket directory, held while a socket there is bound or
/// removed: a janitor's check that the socket is still its daemon's and its removal are then
/// one step, with no new daemon's bind between them (which would lose its fresh socket).
pub struct DirLock {
    /// The directory, open: closing it lets go of the lock.
    _held: std::fs::File,
}

impl DirLock {
    /// Waits for the lock on `dir`.
    pub fn take(dir: &Path) -> io::Result<DirLock> {
        use std::os::fd::AsRawFd;
        let f = std::fs::File::open(dir)?;
        loop {
            // SAFETY: flock on a descriptor we own.
            if unsafe { libc::flock(f.as_raw_fd(), libc::LOCK_EX) } == 0 {
                return Ok(DirLock { _held: f });
            }
            let e = io::Error::last_os_error();
            if e.kind() != io::ErrorKind::Interrupted {
                return Err(e);
            }
        }
    }
}

/// Binds the socket at `path`, created with mode 0600 (a umask of 077 around the bind, as
/// wireguard-go does: setting the mode after the bind would leave a moment when anyone may
/// connect and read the keys). Call it before other threads start: the umask is the
/// process's.
fn listen_at(path: &Path) -> io::Result<UnixListener> {
    if path.exists() {
        if UnixStream::connect(path).is_ok() {
            return Err(io::Error::new(
                io::ErrorKind::AddrInUse,
                format!("{} is in use by another process", path.display()),
            ));
        }
        std::fs::remove_file(path)?;
    }
    // SAFETY: umask only swaps the process's file-creation mask.
    let old = unsafe { libc::umask(0o077) };
    let bound = UnixListener::bind(path);
    // SAFETY: as above, restoring the mask.
    unsafe { libc::umask(old) };
    let listener = bound?;
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o600))?;
    Ok(listener)
}

/// The key of an `ordo_get` reply's one line: the interface's report
/// (`device::report::InterfaceReport`) as JSON.
pub const ORDO_REPORT_KEY: &str = "ordo_report";

/// Serves connections until the device stops: each on a thread of its own, at most
/// [`connections::MAX_CONNECTIONS`] at once (idle ones shed to make room: connections.rs), closed after
/// [`READ_TIMEOUT`] of silence.
pub fn serve(device: Arc<Device>, listener: UnixListener) {
    let connections = Connections::default();
    for conn in listener.incoming() {
        if device.stopped() {
            return;
        }
        let conn = match conn {
            Ok(c) => c,
            Err(e) => {
                log::error!("UAPI accept failed: {e}");
                std::thread::sleep(ACCEPT_BACKOFF);
                continue;
            }
        };
        let Some(slot) = connections.admit(&conn) else {
            continue; // dropped: closed at once
        };
        // A client that neither writes nor reads its reply holds no thread for long.
        if conn.set_read_timeout(Some(READ_TIMEOUT)).is_err() || conn.set_write_timeout(Some(READ_TIMEOUT)).is_err() {
            continue;
        }
        let d = device.clone();
        std::thread::Builder::new()
            .name("ordo-uapi".into())
            .spawn(move || {
                let _ = handle_connection(&d, conn, &slot);
            })
            .ok();
    }
}

/// What holding a request line costs: its allocation (`capacity` bytes) and its `String`.
fn held_bytes(capacity: usize) -> usize {
    capacity.max(1) + std::mem::size_of::<String>()
}

/// Reads one line into `buf` (which holds MAX_LINE + 1 bytes, so it never grows and leaves no
/// copy behind) and returns it in a string of its own length, which grows no more either.
fn read_line<R: BufRead>(r: &mut R, buf: &mut Zeroizing<Vec<u8>>) -> io::Result<Option<String>> {
    buf.clear();
    let n = io::Read::take(&mut *r, MAX_LINE as u64 + 1).read_until(b'\n', buf)?;
    if n == 0 {
        return Ok(None);
    }
    if buf.last() != Some(&b'\n') {
        return Err(io::Error::new(
            io::ErrorKind::InvalidData,
            "line too long or unterminated",
        ));
    }
    let line = std::str::from_utf8(&buf[..n - 1])
        .map_err(|_| io::Error::new(io::ErrorKind::InvalidData, "not UTF-8"))?
        .to_owned();
    Ok(Some(line))
}

/// The buffer [`read_line`] reads into: room for the longest line, wiped when dropped.
fn line_buffer() -> Zeroizing<Vec<u8>> {
    Zeroizing::new(Vec::with_capacity(MAX_LINE + 1))
}

/// One request as read from a connection.
enum Request {
    /// The connection closed (between requests, or mid-request: then nothing is applied).
    Closed,
    /// Not an operation of the protocol, or larger than MAX_REQUEST_BYTES: refused whole.
    Refused,
    /// An operation and its key=value lines (keys included: erased when dropped).
    Op(Operation, Zeroizing<Vec<String>>),
}

/// Reads one request: an operation line, key=value lines, and the blank line that ends it.
fn read_request<R: BufRead>(r: &mut R, buf: &mut Zeroizing<Vec<u8>>) -> io::Result<Request> {
    let Some(first) = read_line(r, buf)? else {
        return Ok(Request::Closed);
    };
    let Some(op) = protocol::parse_operation(&first) else {
        return Ok(Request::Refused);
    };
    let mut lines = Zeroizing::new(Vec::new());
    let mut request_bytes = 0;
    loop {
        match read_line(r, buf)? {
            None => return Ok(Request::Closed),
            Some(l) if l.is_empty() => return Ok(Request::Op(op, lines)),
            Some(l) => {
                request_bytes += held_bytes(l.capacity());
                if request_bytes > MAX_REQUEST_BYTES {
                    return Ok(Request::Refused);
                }
                lines.push(l)
            }
        }
    }
}

/// Handles requests on one connection until it closes. wg sends one request per connection;
/// others may send several.
fn handle_connection(device: &Arc<Device>, conn: UnixStream, slot: &Slot) -> io::Result<()> {
    let reader = MarkBusy {
        inner: SecretReader::new(conn.try_clone()?),
        busy: slot.busy.clone(),
    };
    let writer = MarkIdle {
        inner: conn,
        busy: slot.busy.clone(),
    };
    serve_requests(device, reader, writer)
}

/// Answers the requests read from `reader` on `out` until the reader ends. Request and reply
/// carry keys: read through a wiped buffer into lines that are wiped, built in [`SecretText`].
pub fn serve_requests(device: &Arc<Device>, mut reader: impl BufRead, mut out: impl Write) -> io::Result<()> {
    let mut buf = line_buffer();
    loop {
        let (op, lines) = match read_request(&mut reader, &mut buf)? {
            Request::Closed => return Ok(()),
            Request::Refused => {
                out.write_all(format!("errno=-{}\n\n", protocol::EINVAL).as_bytes())?;
                return Ok(());
            }
            Request::Op(op, lines) => (op, lines),
        };
        let reply = match op {
            Operation::Get | Operation::OrdoGet if !lines.is_empty() => {
                plain(format!("errno=-{}\n\n", protocol::EINVAL))
            }
            Operation::Get => {
                let mut r = protocol::format_get(&view(device));
                r.push_str("errno=0\n\n");
                r
            }
            Operation::OrdoGet => {
                // The report is one line of JSON (a string holds no raw newline) and no
                // secret: `ordo show` has no need of the private key `get` carries.
                let report = serde_json::to_string(&device.report()).unwrap_or_default();
                plain(format!("{ORDO_REPORT_KEY}={report}\nerrno=0\n\n"))
            }
            Operation::Set => {
                match protocol::parse_set(lines.iter().map(String::as_str)).and_then(|p| apply(device, p)) {
                    Ok(()) => plain("errno=0\n\n".into()),
                    Err(e) => {
                        log::warn!("UAPI set refused: {}", e.message);
                        plain(format!("errno=-{}\n\n", e.errno))
                    }
                }
            }
        };
        out.write_all(reply.as_str().as_bytes())?;
    }
}

/// A reply with no secret in it, as [`SecretText`] for one type of reply.
fn plain(text: String) -> SecretText {
    let mut t = SecretText::new();
    t.push_str(&text);
    t
}

/// What `get` reports, the core's lock held only to copy (see `device::peers`).
fn view(device: &Device) -> DeviceView {
    let (listen_port, fwmark) = (device.listen_port(), device.fwmark());
    let (private_key, copied) = {
        let core = device.core();
        (core.private_key().cloned(), CoreCopy::of(&core))
    };
    let peers = (copied.peers().into_iter())
        .map(|p| PeerView {
            public_key: p.public_key,
            preshared_key: p.preshared_key,
            endpoint: p.endpoint,
            last_handshake: p.last_handshake,
            tx_bytes: p.tx_bytes,
            rx_bytes: p.rx_bytes,
            persistent_keepalive: p.persistent_keepalive,
            allowed_ips: p.allowed_ips,
        })
        .collect();
    DeviceView {
        private_key,
        listen_port,
        fwmark,
        peers,
    }
}

/// Applies a parsed plan, whole or not at all: the listen port and the fwmark, the only
/// changes that can fail after parsing, are made first and together (new sockets bound with
/// the new mark), and on failure leave everything as it was.
pub fn apply(device: &Arc<Device>, plan: SetPlan) -> Result<(), UapiError> {
    match (plan.listen_port, plan.fwmark) {
        (Some(port), mark) => device
            .set_listen_port(port, mark)
            .map_err(|e| UapiError::new(protocol::EADDRINUSE, format!("listen_port {port}: {e}")))?,
        (None, Some(mark)) => device
            .set_fwmark(mark)
            .map_err(|e| UapiError::new(protocol::EIO, format!("fwmark: {e}")))?,
        (None, None) => {}
    }
    let now = Instant::now();
    let mut core = device.core();
    if let Some(key) = plan.private_key {
        core.set_private_key(key);
    }
    if plan.replace_peers {
        core.remove_all_peers();
    }
    for p in &plan.peers {
        let existing = core.peer_id(&p.public_key);
        if p.remove {
            if let Some(id) = existing {
                core.remove_peer(id);
            }
            continue;
        }
        if p.update_only && existing.is_none() {
            continue;
        }
        // Our own public key as a peer is ignored, as the kernel does.
        let Some(id) = existing.or_else(|| core.add_peer(p.public_key)) else {
            continue;
        };
        if let Some(psk) = &p.preshared_key {
            // A copy, not a move out of the box: a box moved out of is freed unwiped.
            core.set_preshared_key(id, PresharedKey::clone(psk));
        }
        if let Some(e) = p.endpoint {
            core.set_endpoint(id, e);
        }
        if p.replace_allowed_ips {
            core.clear_allowed_ips(id);
        }
        for change in &p.allowed_ips {
            match change {
                AllowedIpChange::Add(net) => core.add_allowed_ip(id, *net),
                AllowedIpChange::Remove(net) => {
                    core.remove_allowed_ip(id, *net);
                }
            }
        }
        if let Some(k) = p.persistent_keepalive {
            core.set_persistent_keepalive(id, k, now);
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Cursor;

    fn read(input: &[u8]) -> Request {
        read_request(&mut Cursor::new(input.to_vec()), &mut line_buffer()).unwrap()
    }

    #[test]
    fn requests_are_framed_by_a_blank_line() {
        match read(b"set=1\nlisten_port=1\n\nget=1\n\n") {
            Request::Op(Operation::Set, lines) => assert_eq!(lines.as_slice(), ["listen_port=1"]),
            _ => panic!("a set request"),
        }
        assert!(
            matches!(read(b"set=1\nlisten_port=1\n"), Request::Closed),
            "cut short: nothing to apply"
        );
        assert!(matches!(read(b""), Request::Closed));
        assert!(matches!(read(b"bogus=1\n\n"), Request::Refused));
    }

    /// A request of tiny lines is charged what holding them costs, not only their bytes:
    /// three million one-byte lines (6 MB on the wire) would hold far more than
    /// MAX_REQUEST_BYTES, and are refused.
    #[test]
    fn a_request_of_tiny_lines_is_charged_what_it_holds() {
        let mut input = b"set=1\n".to_vec();
        let lines = MAX_REQUEST_BYTES / held_bytes(1) + 1;
        input.extend(std::iter::repeat_n(&b"x\n"[..], lines).flatten());
        input.extend_from_slice(b"\n");
        assert!(input.len() < MAX_REQUEST_BYTES / 4, "small on the wire");
        assert!(matches!(read(&input), Request::Refused));
    }

    /// The socket is created 0600, and the process's umask is as it was.
    #[test]
    fn the_socket_is_private_from_the_start() {
        let dir = std::env::temp_dir().join(format!("ordo-uapi-test-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("wg7.sock");
        // SAFETY: reading the mask means setting it; it is put back at once.
        let before = unsafe { libc::umask(0o022) };
        unsafe { libc::umask(before) };
        let _listener = listen_at(&path).unwrap();
        let mode = std::fs::metadata(&path).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode, 0o600);
        // SAFETY: as above.
        let after = unsafe { libc::umask(before) };
        assert_eq!(after, before, "the umask is restored");
        assert!(listen_at(&path).is_err(), "a live socket is not replaced");
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn oversized_requests_are_refused_not_held() {
        let line = format!("allowed_ip={}\n", "1".repeat(1000));
        let mut big = b"set=1\n".to_vec();
        while big.len() <= MAX_REQUEST_BYTES + line.len() {
            big.extend_from_slice(line.as_bytes());
        }
        big.extend_from_slice(b"\n");
        assert!(matches!(read(&big), Request::Refused));
        let long_line = [b"set=1\n".as_slice(), &vec![b'a'; MAX_LINE + 10], b"\n\n"].concat();
        assert!(
            read_request(&mut Cursor::new(long_line), &mut line_buffer()).is_err(),
            "a line over 4 KiB is an error"
        );
    }
}
