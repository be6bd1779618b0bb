//! The table across exec: a program that execs keeps its descriptors, tunnel sockets
//! included, but the new image starts with an empty table (its names, whether a descriptor
//! is a listening socket or a UDP socket whose records carry addresses). The exec hooks add
//! the table to the new program's environment ([`ENV`]), and the library of the new image
//! reads it back on its first call ([`import`]), keeping the entries whose sockets it holds.
//!
//! The hooks run where nothing may allocate or lock (between fork and exec, in a child of a
//! program with threads): the table is kept written out, ready, in one of two static buffers
//! (switched after each change, under the table's lock), and the new environment is built on
//! the stack. A program with more environment than [`MAX_ENV`] entries, or a table longer than
//! a buffer, execs without it (the sockets work; only their names are lost).

use crate::sockets::TunnelSocket;
use std::cell::UnsafeCell;
use std::fmt::Write;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicUsize, Ordering};

/// The environment variable the table crosses exec in.
pub const ENV: &str = "ORDO_ATTACH_SOCKETS";
/// Bytes of each buffer: `ENV=`, the entries and a NUL.
const BUFFER: usize = 64 * 1024;
/// Environment entries the exec hooks copy onto the stack, at most.
pub const MAX_ENV: usize = 1024;

struct Buffers(UnsafeCell<[[u8; BUFFER]; 2]>);

// SAFETY: written only under the table's lock (one writer at a time), and only the buffer
// that [`ACTIVE`] does not name; read through [`ACTIVE`] (see `current`).
unsafe impl Sync for Buffers {}

static BUFFERS: Buffers = Buffers(UnsafeCell::new([[0; BUFFER]; 2]));
/// Which buffer holds the table now, plus one (0: none, the table is empty or did not fit).
static ACTIVE: AtomicUsize = AtomicUsize::new(0);

/// A writer into a byte buffer that fails, instead of allocating, when it is full.
struct Cursor<'a> {
    buf: &'a mut [u8],
    len: usize,
}

impl Write for Cursor<'_> {
    fn write_str(&mut self, s: &str) -> std::fmt::Result {
        let end = self.len + s.len();
        // Room kept for the NUL.
        if end >= self.buf.len() {
            return Err(std::fmt::Error);
        }
        self.buf[self.len..end].copy_from_slice(s.as_bytes());
        self.len = end;
        Ok(())
    }
}

/// Writes `table` out for the next exec. Called under the table's lock after each change.
pub fn refresh(table: &[TunnelSocket]) {
    // Entries that cross exec: a connect's answer still awaited is not (its connection to
    // the service is close-on-exec).
    let mut entries = table.iter().filter(|t| t.pending.is_none()).peekable();
    if entries.peek().is_none() {
        ACTIVE.store(0, Ordering::Release);
        return;
    }
    let next = match ACTIVE.load(Ordering::Acquire) {
        1 => 1,
        _ => 0,
    };
    // SAFETY: the table's lock is held (one writer), and readers read the other buffer.
    let buf = unsafe { &mut (*BUFFERS.0.get())[next] };
    let mut c = Cursor { buf, len: 0 };
    let written = write!(c, "{ENV}=").is_ok() && entries.all(|t| write_entry(&mut c, t).is_ok());
    let len = c.len;
    if !written {
        ACTIVE.store(0, Ordering::Release);
        return;
    }
    buf[len] = 0;
    ACTIVE.store(next + 1, Ordering::Release);
}

fn write_entry(c: &mut Cursor, t: &TunnelSocket) -> std::fmt::Result {
    let flags = [(t.listening, "L"), (t.datagram, "D"), (t.host, "H")];
    write!(c, "{},{},", t.inode, t.family)?;
    for (set, letter) in flags {
        if set {
            c.write_str(letter)?;
        }
    }
    c.write_str(",")?;
    for a in [t.local, t.remote] {
        match a {
            Some(a) => write!(c, "{a},")?,
            None => c.write_str("-,")?,
        }
    }
    match t.marker {
        Some(m) => {
            for b in m {
                write!(c, "{b:02x}")?;
            }
        }
        None => c.write_str("-")?,
    }
    c.write_str(";")
}

/// The written-out table, `ENV=...` with its NUL, if there is one: for an exec hook.
pub fn current() -> Option<*const libc::c_char> {
    match ACTIVE.load(Ordering::Acquire) {
        0 => None,
        // SAFETY: the buffer is static; its writer is done with it (it writes the other).
        n => Some(unsafe { (*BUFFERS.0.get())[n - 1].as_ptr().cast() }),
    }
}

/// Builds on the stack the environment for an exec: `envp` without any table an earlier
/// image left in it, plus this one's; then calls `exec` with it. None if it does not fit
/// (the caller execs with `envp` as it is).
///
/// # Safety
/// `envp` is null or a null-terminated array of C strings.
pub unsafe fn with_table<R>(
    envp: *const *const libc::c_char,
    exec: impl FnOnce(*const *const libc::c_char) -> R,
) -> Option<R> {
    let ours = current()?;
    let mut env: [*const libc::c_char; MAX_ENV + 2] = [std::ptr::null(); MAX_ENV + 2];
    let mut n = 0;
    let mut i = 0;
    while !envp.is_null() {
        // SAFETY: the caller's null-terminated array; `i` stops at its null.
        let e = unsafe { *envp.add(i) };
        if e.is_null() {
            break;
        }
        i += 1;
        // SAFETY: a C string of the caller's.
        if unsafe { is_table(e) } {
            continue;
        }
        if n == MAX_ENV {
            return None;
        }
        env[n] = e;
        n += 1;
    }
    env[n] = ours;
    Some(exec(env.as_ptr()))
}

/// Whether the C string `e` is an `ENV=` entry.
///
/// # Safety
/// `e` is a NUL-terminated string.
unsafe fn is_table(e: *const libc::c_char) -> bool {
    let name = ENV.as_bytes();
    for (k, b) in name.iter().enumerate() {
        // SAFETY: within the string: a mismatch (its NUL included) stops the loop first.
        if unsafe { *e.add(k) } as u8 != *b {
            return false;
        }
    }
    // SAFETY: as above, the byte after a matched prefix.
    unsafe { *e.add(name.len()) as u8 == b'=' }
}

/// The entries `text` (an [`ENV`] value) holds whose sockets this process holds (`held`: the
/// inodes of its open descriptors), each with the descriptor numbers it is at.
pub fn parse(text: &str, held: &[(i32, u64)]) -> Vec<(TunnelSocket, Vec<i32>)> {
    text.split(';')
        .filter_map(parse_entry)
        .filter_map(|t| {
            let fds: Vec<i32> = held
                .iter()
                .filter(|(_, ino)| *ino == t.inode)
                .map(|(fd, _)| *fd)
                .collect();
            (!fds.is_empty()).then_some((t, fds))
        })
        .collect()
}

fn parse_entry(e: &str) -> Option<TunnelSocket> {
    let mut f = e.split(',');
    let inode = f.next()?.parse().ok()?;
    let family = f.next()?.parse().ok()?;
    let flags = f.next()?;
    let addr = |s: &str| -> Option<Option<SocketAddr>> {
        match s {
            "-" => Some(None),
            a => a.parse().ok().map(Some),
        }
    };
    let local = addr(f.next()?)?;
    let remote = addr(f.next()?)?;
    let marker = match f.next()? {
        "-" => None,
        hex if hex.len() == 16 => {
            let mut m = [0u8; ordo_attach::MARKER_LEN];
            for (k, b) in m.iter_mut().enumerate() {
                *b = u8::from_str_radix(hex.get(2 * k..2 * k + 2)?, 16).ok()?;
            }
            Some(m)
        }
        _ => return None,
    };
    if f.next().is_some() {
        return None;
    }
    Some(TunnelSocket {
        inode,
        family,
        local,
        remote,
        pending: None,
        error: 0,
        listening: flags.contains('L'),
        datagram: flags.contains('D'),
        marker,
        host: flags.contains('H'),
    })
}

/// This process's open descriptors that are sockets, with their inodes.
pub fn held_sockets() -> Vec<(i32, u64)> {
    let Ok(dir) = std::fs::read_dir("/proc/self/fd") else {
        return Vec::new();
    };
    dir.filter_map(|e| e.ok()?.file_name().to_str()?.parse::<i32>().ok())
        .filter_map(|fd| Some((fd, crate::sockets::socket_inode(fd)?)))
        .collect()
}

/// Reads the table an earlier image left ([`ENV`]) into this one's: the entries whose
/// sockets this process still holds.
pub fn import() {
    let Ok(text) = std::env::var(ENV) else { return };
    for (entry, fds) in parse(&text, &held_sockets()) {
        crate::sockets::remember(entry);
        if entry.marker.is_some() {
            for fd in fds {
                crate::sockets::mark_addressed(fd);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The buffers are the process's: one test at a time.
    static SERIAL: std::sync::Mutex<()> = std::sync::Mutex::new(());

    fn entry(inode: u64) -> TunnelSocket {
        TunnelSocket {
            inode,
            family: libc::AF_INET6,
            local: Some("[fd99::1]:5353".parse().unwrap()),
            remote: None,
            pending: None,
            error: 0,
            listening: false,
            datagram: true,
            marker: Some(*b"\x00\x01\x02\xfdmark"),
            host: true,
        }
    }

    #[test]
    fn the_table_crosses_exec_whole_and_only_for_sockets_still_held() {
        let _one = SERIAL.lock().unwrap_or_else(|p| p.into_inner());
        let tcp = TunnelSocket {
            inode: 7,
            family: libc::AF_INET,
            local: Some("10.99.0.1:40000".parse().unwrap()),
            remote: Some("10.99.0.2:80".parse().unwrap()),
            pending: None,
            error: 0,
            listening: false,
            datagram: false,
            marker: None,
            host: false,
        };
        let waiting = TunnelSocket {
            inode: 9,
            pending: Some(3),
            ..tcp
        };
        refresh(&[tcp, entry(8), waiting]);
        let ptr = current().expect("written");
        // SAFETY: the buffer is NUL-terminated.
        let text = unsafe { std::ffi::CStr::from_ptr(ptr) }.to_str().unwrap();
        let value = text.strip_prefix("ORDO_ATTACH_SOCKETS=").unwrap();
        let got = parse(value, &[(5, 7), (6, 8), (11, 8), (4, 9), (3, 1)]);
        assert_eq!(got.len(), 2, "{value}");
        assert_eq!(
            (got[0].0.inode, got[0].0.remote, &got[0].1[..]),
            (7, tcp.remote, &[5][..])
        );
        let udp = got[1].0;
        assert_eq!(
            (udp.marker, udp.host, udp.datagram, udp.local),
            (entry(8).marker, true, true, entry(8).local)
        );
        assert_eq!(got[1].1, [6, 11]);
        // Garbage is skipped, not a panic.
        assert!(parse("x;1,2;7,2,,-,-,zz;;", &[(1, 7)]).is_empty());
        refresh(&[]);
        assert!(current().is_none());
    }

    #[test]
    fn an_exec_s_environment_carries_one_table() {
        let _one = SERIAL.lock().unwrap_or_else(|p| p.into_inner());
        refresh(&[entry(8)]);
        let old = c"ORDO_ATTACH_SOCKETS=stale";
        let other = c"PATH=/bin";
        let envp = [other.as_ptr(), old.as_ptr(), std::ptr::null()];
        // SAFETY: a null-terminated array of C strings.
        let seen = unsafe {
            with_table(envp.as_ptr(), |env| {
                let mut v = Vec::new();
                let mut i = 0;
                while !(*env.add(i)).is_null() {
                    v.push(std::ffi::CStr::from_ptr(*env.add(i)).to_str().unwrap().to_string());
                    i += 1;
                }
                v
            })
        }
        .unwrap();
        assert_eq!(seen.len(), 2);
        assert_eq!(seen[0], "PATH=/bin");
        assert!(
            seen[1].starts_with("ORDO_ATTACH_SOCKETS=8,10,DH,[fd99::1]:5353,-,"),
            "{}",
            seen[1]
        );
        refresh(&[]);
    }
}
