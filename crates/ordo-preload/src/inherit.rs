//! The table across exec: a program that execs (or spawns: posix_spawn) keeps its
//! descriptors, tunnel sockets included, but the new image starts with an empty table (its names, whether a descriptor
//! is a listening socket or a UDP socket whose records carry addresses). The exec hooks add
//! the table to the new program's environment ([`ENV`]), and the library of the new image
//! reads it back on its first call ([`import`]), keeping the entries whose sockets it holds.
//!
//! The hooks run where nothing may allocate or wait for a lock (between fork and exec, in a
//! child of a program with threads): the table is written out into a static buffer, under
//! its lock taken without waiting (a lock another thread held at the fork stays held: then
//! the exec goes without the table), newest entries first, as many as fit; the new
//! environment is built on the stack. A program with more environment than [`MAX_ENV`]
//! entries execs without the table too (the sockets work; only their names are lost).

use crate::sockets::TunnelSocket;
use std::cell::UnsafeCell;
use std::fmt::Write;
use std::net::SocketAddr;

/// The environment variable the table crosses exec in.
pub const ENV: &str = "ORDO_ATTACH_SOCKETS";
/// Bytes of each buffer: `ENV=`, the entries and a NUL.
const BUFFER: usize = 64 * 1024;
/// Environment entries the exec hooks copy onto the stack, at most.
pub const MAX_ENV: usize = 1024;

struct Buffer(UnsafeCell<[u8; BUFFER]>);

// SAFETY: written and read only under the table's lock (see `with_table`).
unsafe impl Sync for Buffer {}

static OUT: Buffer = Buffer(UnsafeCell::new([0; BUFFER]));

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

/// Writes `table` out into `buf` as `ENV=...` with its NUL, newest entries first, as many as
/// fit; false if none does (then there is nothing to hand on).
fn write_out(table: &[TunnelSocket], buf: &mut [u8]) -> bool {
    let mut c = Cursor { buf, len: 0 };
    if write!(c, "{ENV}=").is_err() {
        return false;
    }
    let start = c.len;
    // Not a connect's answer still awaited: its connection to the service is close-on-exec.
    for t in table.iter().rev().filter(|t| t.pending.is_none()) {
        let before = c.len;
        if write_entry(&mut c, t).is_err() {
            c.len = before;
            break;
        }
    }
    if c.len == start {
        return false;
    }
    let len = c.len;
    buf[len] = 0;
    true
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

/// Builds on the stack the environment for an exec: `envp` without any table an earlier
/// image left in it, plus this one's; then calls `exec` with it. None if there is no table to
/// hand on, or it cannot be had without waiting, or the environment does not fit (the caller
/// execs with `envp` as it is).
///
/// # Safety
/// `envp` is null or a null-terminated array of C strings.
pub unsafe fn with_table<R>(
    envp: *const *const libc::c_char,
    exec: impl FnOnce(*const *const libc::c_char) -> R,
) -> Option<R> {
    // Held until the exec returns (it returns only if it failed), so that no other thread
    // writes the buffer meanwhile.
    let table = crate::sockets::try_table()?;
    // SAFETY: the buffer is only touched under the table's lock, which is held.
    let buf = unsafe { &mut *OUT.0.get() };
    if !write_out(&table, buf) {
        return None;
    }
    let ours: *const libc::c_char = buf.as_ptr().cast();
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
    let r = exec(env.as_ptr());
    drop(table);
    Some(r)
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
        listening: flags.contains('L'),
        datagram: flags.contains('D'),
        marker,
        host: flags.contains('H'),
        ..TunnelSocket::new(inode, family, local, remote)
    })
}

/// Reads the table an earlier image left ([`ENV`]) into this one's: the entries whose
/// sockets this process still holds.
pub fn import() {
    let Ok(text) = std::env::var(ENV) else { return };
    for (entry, fds) in parse(&text, &crate::sockets::held_sockets().unwrap_or_default()) {
        crate::sockets::remember(entry);
        if entry.marker.is_some() {
            for fd in fds {
                crate::sockets::mark_addressed(fd, entry.inode, entry.family);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn entry(inode: u64) -> TunnelSocket {
        TunnelSocket {
            datagram: true,
            marker: Some(*b"\x00\x01\x02\xfdmark"),
            host: true,
            ..TunnelSocket::new(inode, libc::AF_INET6, Some("[fd99::1]:5353".parse().unwrap()), None)
        }
    }

    #[test]
    fn the_table_crosses_exec_whole_and_only_for_sockets_still_held() {
        let tcp = TunnelSocket::new(
            7,
            libc::AF_INET,
            Some("10.99.0.1:40000".parse().unwrap()),
            Some("10.99.0.2:80".parse().unwrap()),
        );
        let waiting = TunnelSocket {
            inode: 9,
            pending: Some(3),
            ..tcp
        };
        let mut buf = vec![0u8; 4096];
        assert!(write_out(&[tcp, entry(8), waiting], &mut buf));
        let text = std::ffi::CStr::from_bytes_until_nul(&buf).unwrap().to_str().unwrap();
        let value = text.strip_prefix("ORDO_ATTACH_SOCKETS=").unwrap();
        let mut got = parse(value, &[(5, 7), (6, 8), (11, 8), (4, 9), (3, 1)]);
        got.sort_by_key(|(t, _)| t.inode);
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
        // Nothing to hand on; and a buffer that holds only some: the newest.
        assert!(!write_out(&[waiting], &mut buf));
        let mut small = vec![0u8; 80];
        assert!(write_out(&[tcp, entry(8)], &mut small));
        let text = std::ffi::CStr::from_bytes_until_nul(&small).unwrap().to_str().unwrap();
        assert!(
            text.starts_with("ORDO_ATTACH_SOCKETS=8,") && !text.contains(";7,"),
            "{text}"
        );
    }

    #[test]
    fn an_exec_s_environment_carries_one_table() {
        crate::sockets::remember(entry(8));
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
        crate::sockets::forget(8);
        assert_eq!(seen.len(), 2);
        assert_eq!(seen[0], "PATH=/bin");
        assert!(
            seen[1].starts_with("ORDO_ATTACH_SOCKETS=8,10,DH,[fd99::1]:5353,-,"),
            "{}",
            seen[1]
        );
    }
}
