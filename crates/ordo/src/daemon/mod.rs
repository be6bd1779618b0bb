//! Running as a daemon, as the xplatform interface demands: `ordo IFNAME` starts the
//! interface detached in the background and returns only once the UAPI socket answers
//! ([`spawn_detached`], `report_ready`); the detached log, the panic hook, the descriptor
//! limit; the privileges given up after setup ([`privileges`]) and the process that removes
//! the UAPI socket when the daemon ends ([`janitor`]). The order in which an interface uses
//! them is `interface::lifecycle`'s.

pub mod janitor;
pub mod privileges;

use anyhow::{bail, Context, Result};
use privileges::Privileges;
use std::io::{self, BufRead, BufReader, Write};
use std::os::unix::process::CommandExt;
use std::path::Path;
use std::process::{Command, Stdio};

/// Set in the environment of the detached child: it reports readiness on stdout.
const READY_ENV: &str = "ORDO_REPORT_READY";
/// Where the detached daemon writes its log (default: nowhere).
pub const LOG_ENV: &str = "ORDO_LOG";

/// Starts the daemon for `ifname` in the background and waits until it is ready.
/// `settings`: the interface's settings as flags (`InterfaceSettings::to_args`).
pub fn spawn_detached(ifname: &str, privileges: &Privileges, settings: &[String]) -> Result<()> {
    let mut args: Vec<std::ffi::OsString> = vec!["--foreground".into()];
    args.extend(privileges.to_args().into_iter().map(Into::into));
    args.extend(settings.iter().map(Into::into));
    args.push(ifname.into());
    detach(&args, ifname)
}

/// Runs this executable again with `args` in the background, in a session of its own, and
/// waits until it says it is ready (`report_ready`) or fails.
pub fn detach(args: &[std::ffi::OsString], ifname: &str) -> Result<()> {
    let exe = std::env::current_exe().context("cannot find the ordo executable")?;
    let mut cmd = Command::new(exe);
    cmd.args(args)
        .env(READY_ENV, "1")
        .stdin(Stdio::null())
        .stdout(Stdio::piped());
    // SAFETY: setsid() is async-signal-safe and touches no memory of the parent.
    unsafe {
        cmd.pre_exec(|| {
            libc::setsid();
            Ok(())
        });
    }
    let mut child = cmd.spawn().context("cannot start the ordo daemon")?;
    let stdout = child.stdout.take().expect("piped");
    let mut line = String::new();
    BufReader::new(stdout).read_line(&mut line)?;
    if line.trim() == "ready" {
        return Ok(());
    }
    let status = child.wait()?;
    bail!("the ordo daemon for {ifname} failed to start ({status})")
}

/// The detached daemon's log ($ORDO_LOG, or /dev/null), opened while the daemon may still
/// open any path: after the drop its user may not reach the log's folder.
pub(crate) fn open_detached_log() -> Result<Option<std::fs::File>> {
    if std::env::var_os(READY_ENV).is_none() {
        return Ok(None);
    }
    let log = std::env::var(LOG_ENV).unwrap_or_else(|_| "/dev/null".into());
    let f = open_log(Path::new(&log)).with_context(|| format!("cannot open log {log}"))?;
    Ok(Some(f))
}

/// Tells the parent waiting in [`spawn_detached`] that we are up, then lets go of the
/// terminal: stdout and stderr move to the log.
pub(crate) fn report_ready(log: Option<std::fs::File>) -> Result<()> {
    let Some(f) = log else { return Ok(()) };
    let mut out = std::io::stdout();
    out.write_all(b"ready\n")?;
    out.flush()?;
    use std::os::fd::AsRawFd;
    // SAFETY: dup2 on valid descriptors; f stays open until after the calls.
    unsafe {
        libc::dup2(f.as_raw_fd(), 1);
        libc::dup2(f.as_raw_fd(), 2);
    }
    Ok(())
}

/// Opens (or creates, readable by its owner only: it names peers and endpoints) the log.
fn open_log(path: &Path) -> std::io::Result<std::fs::File> {
    use std::os::unix::fs::OpenOptionsExt;
    std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .mode(0o600)
        .open(path)
}

/// Exit status after a panic (sysexits' EX_SOFTWARE: an internal error).
pub const PANIC_EXIT: i32 = 70;

/// Makes a panic in any thread end the whole process, with the panic's message, after
/// removing `uapi_path` (which fails once privileges are dropped: then the janitor removes
/// it as the process ends). Without it a panic ends only its own thread: a worker or a queue
/// thread gone leaves the daemon half alive (a lane that never delivers, a queue nobody
/// reads) where a supervisor would see it running. `_exit`, not `exit`: the other threads
/// may hold locks that exit's handlers (stdout's flush) would wait on.
pub fn exit_on_panic(uapi_path: Option<std::path::PathBuf>) {
    let report = std::panic::take_hook();
    std::panic::set_hook(Box::new(move |info| {
        report(info);
        if let Some(p) = &uapi_path {
            let _ = std::fs::remove_file(p);
        }
        eprintln!("ordo: a thread panicked; the daemon exits with status {PANIC_EXIT} rather than run half alive");
        // SAFETY: _exit ends the process at once; it touches no memory of ours.
        unsafe { libc::_exit(PANIC_EXIT) };
    }));
}

/// Raises this process's soft limit on open descriptors to its hard limit. A service gets a
/// soft limit of 1024 by default (systemd's, for select(2)'s sake, which Ordo does not use):
/// clients of the metrics endpoint, the UAPI socket and the stack's connections must not run
/// the data plane out of descriptors long before the hard limit. Returns the limit now.
pub fn raise_descriptor_limit() -> io::Result<u64> {
    let mut limit = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: getrlimit fills `limit`.
    if unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut limit) } != 0 {
        return Err(io::Error::last_os_error());
    }
    if limit.rlim_cur < limit.rlim_max {
        limit.rlim_cur = limit.rlim_max;
        // SAFETY: setrlimit reads `limit`; raising the soft limit up to the hard one needs no
        // privilege.
        if unsafe { libc::setrlimit(libc::RLIMIT_NOFILE, &limit) } != 0 {
            return Err(io::Error::last_os_error());
        }
    }
    Ok(limit.rlim_cur)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[test]
    fn the_log_is_readable_by_its_owner_only_and_the_process_not_dumpable() {
        use std::os::unix::fs::PermissionsExt;
        let dir = std::env::temp_dir().join(format!("ordo-log-test-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let log = dir.join("ordo.log");
        open_log(&log).unwrap();
        assert_eq!(std::fs::metadata(&log).unwrap().permissions().mode() & 0o777, 0o600);
        let _ = std::fs::remove_dir_all(&dir);
        privileges::not_dumpable().unwrap();
        // SAFETY: PR_GET_DUMPABLE only reads the flag.
        assert_eq!(unsafe { libc::prctl(libc::PR_GET_DUMPABLE, 0, 0, 0, 0) }, 0);
    }

    /// Set in the environment of the child process the test below starts.
    const CHILD_ENV: &str = "ORDO_TEST_PANIC_CHILD";

    /// A panic in a thread other than the main one ends the whole process with
    /// [`PANIC_EXIT`] and the panic's message, and removes the UAPI socket. Runs itself again
    /// as a child process, whose exit it can watch.
    #[test]
    fn a_panic_in_any_thread_ends_the_process() {
        if let Some(path) = std::env::var_os(CHILD_ENV) {
            exit_on_panic(Some(path.into()));
            let _ = std::thread::spawn(|| panic!("a worker broke")).join();
            std::thread::sleep(Duration::from_secs(30));
            return; // not reached: the child exits from the panic
        }
        let dir = std::env::temp_dir().join(format!("ordo-panic-test-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let socket = dir.join("wg9.sock");
        std::fs::write(&socket, b"").unwrap();
        let out = Command::new(std::env::current_exe().unwrap())
            .args([
                "--exact",
                "daemon::tests::a_panic_in_any_thread_ends_the_process",
                "--nocapture",
            ])
            .env(CHILD_ENV, &socket)
            .output()
            .unwrap();
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(PANIC_EXIT), "{stderr}");
        assert!(stderr.contains("a worker broke"), "the panic's own message: {stderr}");
        assert!(stderr.contains("rather than run half alive"), "{stderr}");
        assert!(!socket.exists(), "the UAPI socket is removed");
        let _ = std::fs::remove_dir_all(&dir);
    }
}
