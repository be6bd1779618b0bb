//! The UAPI socket's janitor. Once set up, the daemon runs as an unprivileged user and can no
//! longer remove its socket from /var/run/wireguard, which is root's. Before dropping
//! privileges it starts this small process: a fresh exec of `ordo` (none of the daemon's
//! memory, so no key), which closes every descriptor it inherited, keeps uid 0 (the
//! directory's owner) but no capability, and waits on a pipe whose write end only the daemon
//! holds. However the daemon ends (a clean stop, a panic, SIGKILL, the OOM killer), the pipe
//! then reads end-of-file and the janitor removes the socket, if it is still the one the
//! daemon bound: a daemon started since for the same interface keeps its own.

use super::privileges;
use anyhow::{Context, Result};
use std::io::{PipeWriter, Read};
use std::os::unix::fs::MetadataExt;
use std::path::Path;
use std::process::{Command, Stdio};

/// The hidden subcommand: `ordo uapi-janitor PATH DEV INO CHANGED`, the pipe on stdin.
pub const SUBCOMMAND: &str = "uapi-janitor";

/// Which file the daemon bound: another file at the same path belongs to someone else. The
/// inode number alone does not say: a file made after one was removed may get its number.
/// Its status change time (nanoseconds) is when it was made and set up, which no later file
/// shares.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct FileIdentity {
    pub dev: u64,
    pub ino: u64,
    /// Its last status change, in nanoseconds since the epoch.
    pub changed: i64,
}

impl FileIdentity {
    pub fn of(path: &Path) -> std::io::Result<FileIdentity> {
        let m = std::fs::symlink_metadata(path)?;
        Ok(FileIdentity {
            dev: m.dev(),
            ino: m.ino(),
            changed: m.ctime().saturating_mul(1_000_000_000).saturating_add(m.ctime_nsec()),
        })
    }
}

/// Starts the janitor for the socket at `path`. The daemon keeps the returned pipe end open
/// for as long as it lives (it is close-on-exec: no other program inherits it).
pub fn spawn(path: &Path, stderr: Stdio) -> Result<PipeWriter> {
    let identity = FileIdentity::of(path).with_context(|| format!("{}", path.display()))?;
    let (reader, writer) = std::io::pipe()?;
    let exe = std::env::current_exe().context("cannot find the ordo executable")?;
    Command::new(exe)
        .arg(SUBCOMMAND)
        .arg(path)
        .arg(identity.dev.to_string())
        .arg(identity.ino.to_string())
        .arg(identity.changed.to_string())
        .stdin(reader)
        .stdout(Stdio::null())
        .stderr(stderr)
        .spawn()
        .context("cannot start the UAPI socket's janitor")?;
    Ok(writer)
}

/// The janitor's whole life, in its own process: give up what it does not need, wait for the
/// daemon to be gone, remove the socket.
pub fn run(path: &Path, identity: FileIdentity) -> Result<()> {
    close_inherited_descriptors();
    ignore_stop_signals();
    privileges::drop_all_capabilities().context("the janitor dropping its capabilities")?;
    wait_for_end_of_file(&mut std::io::stdin().lock());
    remove_if_same(path, identity)
}

/// Blocks until the other end of `pipe` is closed by every process that held it.
fn wait_for_end_of_file(pipe: &mut impl Read) {
    let mut buf = [0u8; 64];
    loop {
        match pipe.read(&mut buf) {
            Ok(0) => return,
            Ok(_) => continue,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
            Err(_) => return,
        }
    }
}

/// Removes `path` if it is still the file the daemon bound, under the directory's lock (a
/// daemon binding its socket holds it too: uapi::DirLock).
pub fn remove_if_same(path: &Path, identity: FileIdentity) -> Result<()> {
    let dir = path.parent().unwrap_or(Path::new("/"));
    let _lock = crate::uapi::DirLock::take(dir).with_context(|| format!("locking {}", dir.display()))?;
    match FileIdentity::of(path) {
        Ok(now) if now == identity => {
            std::fs::remove_file(path).with_context(|| format!("removing {}", path.display()))
        }
        // Gone already (the daemon removed it, or `wg-quick down` did), or replaced.
        _ => Ok(()),
    }
}

/// Everything but stdin (the pipe), stdout and stderr: whatever the daemon had open that was
/// not close-on-exec (the TUN device, sockets) must not be kept alive by the janitor.
fn close_inherited_descriptors() {
    // SAFETY: close_range only closes descriptors; this process uses none above 2 (std
    // opened none yet), so nothing refers to what it closes.
    unsafe { libc::syscall(libc::SYS_close_range, 3u32, u32::MAX, 0u32) };
}

/// Ctrl-C on a foreground daemon, a hang-up, or a `kill` of every process of the namespace
/// reaches the janitor too: it must outlive the daemon, and it ends by itself when the daemon
/// does.
fn ignore_stop_signals() {
    for s in [libc::SIGINT, libc::SIGTERM, libc::SIGHUP] {
        // SAFETY: setting a signal to SIG_IGN installs no handler and touches no memory.
        unsafe { libc::signal(s, libc::SIG_IGN) };
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Write;

    fn temp_dir(name: &str) -> std::path::PathBuf {
        let dir = std::env::temp_dir().join(format!("ordo-janitor-{name}-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        dir
    }

    #[test]
    fn the_file_goes_once_every_writer_is_gone_and_not_before() {
        let dir = temp_dir("eof");
        let path = dir.join("wg0.sock");
        std::fs::write(&path, b"").unwrap();
        let identity = FileIdentity::of(&path).unwrap();
        let (mut reader, mut writer) = std::io::pipe().unwrap();
        let (tx, rx) = std::sync::mpsc::channel();
        let p = path.clone();
        std::thread::spawn(move || {
            wait_for_end_of_file(&mut reader);
            tx.send(remove_if_same(&p, identity).is_ok()).unwrap();
        });
        // Bytes written are not an end: the janitor waits on.
        writer.write_all(b"still here").unwrap();
        assert!(rx.recv_timeout(std::time::Duration::from_millis(200)).is_err());
        assert!(path.exists());
        drop(writer);
        assert!(rx.recv_timeout(std::time::Duration::from_secs(5)).unwrap());
        assert!(!path.exists());
        let _ = std::fs::remove_dir_all(&dir);
    }

    /// A daemon binding its socket holds the directory's lock: the janitor waits for it
    /// before it checks and removes, so that a socket bound in between is not taken for the
    /// old one (it used to check, then remove by path whatever was there by then).
    #[test]
    fn the_janitor_waits_for_a_bind_in_progress() {
        let dir = temp_dir("locked");
        let path = dir.join("wg0.sock");
        std::fs::write(&path, b"").unwrap();
        let identity = FileIdentity::of(&path).unwrap();
        let binding = crate::uapi::DirLock::take(&dir).unwrap();
        let p = path.clone();
        let janitor = std::thread::spawn(move || remove_if_same(&p, identity).unwrap());
        std::thread::sleep(std::time::Duration::from_millis(200));
        assert!(!janitor.is_finished(), "the janitor did not wait for the bind");
        // The new daemon replaces the stale socket with its own, then lets go.
        std::fs::remove_file(&path).unwrap();
        std::fs::write(&path, b"new").unwrap();
        drop(binding);
        janitor.join().unwrap();
        assert!(path.exists(), "the new daemon's socket was removed");
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn a_socket_bound_since_by_another_daemon_stays() {
        let dir = temp_dir("replaced");
        let path = dir.join("wg0.sock");
        std::fs::write(&path, b"").unwrap();
        let identity = FileIdentity::of(&path).unwrap();
        // The daemon went, a new one removed the stale file and bound its own.
        let keep = dir.join("keep");
        std::fs::write(&keep, b"").unwrap();
        std::fs::remove_file(&path).unwrap();
        std::fs::rename(&keep, &path).unwrap();
        remove_if_same(&path, identity).unwrap();
        assert!(path.exists(), "another daemon's socket was removed");
        // And one already gone is no error.
        std::fs::remove_file(&path).unwrap();
        remove_if_same(&path, identity).unwrap();
        let _ = std::fs::remove_dir_all(&dir);
    }
}
