//! What the daemon keeps once its interface and sockets exist. Started as root, it becomes an
//! unprivileged user (`nobody` unless told otherwise) holding only the capabilities a running
//! interface uses, with no_new_privs, and not dumpable. A root process without capabilities
//! would still own every root-owned file (/etc/passwd is 0644 root's): the user switch is what
//! takes the file system out of an attacker's reach.

use anyhow::{bail, Context, Result};
use caps::{CapSet, Capability, CapsHashSet};
use nix::unistd::{Gid, Uid, User};

/// The user the daemon runs as after setup when started as root and not told otherwise.
pub const DEFAULT_USER: &str = "nobody";
/// The user, for `ordo IFNAME` started by wg-quick (which passes no flags).
pub const USER_ENV: &str = "ORDO_USER";

/// What to keep after setup.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Privileges {
    /// Everything the daemon was started with (`--keep-privileges`).
    Keep,
    /// Only the capabilities a running interface uses, as `user` if started as root
    /// (`root` keeps uid 0 without the other capabilities).
    Drop { user: String },
}

impl Privileges {
    /// From the flags: `--keep-privileges` wins; else `--user`, else $ORDO_USER, else nobody.
    pub fn from_flags(keep: bool, user: Option<String>) -> Privileges {
        if keep {
            return Privileges::Keep;
        }
        let user = user
            .or_else(|| std::env::var(USER_ENV).ok().filter(|u| !u.is_empty()))
            .unwrap_or_else(|| DEFAULT_USER.to_string());
        Privileges::Drop { user }
    }

    /// The flags that ask for this, for a daemon started as a child process.
    pub fn to_args(&self) -> Vec<String> {
        match self {
            Privileges::Keep => vec!["--keep-privileges".into()],
            Privileges::Drop { user } => vec!["--user".into(), user.clone()],
        }
    }
}

/// A user to become: found before anything is dropped, so a wrong name changes nothing.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Identity {
    uid: Uid,
    gid: Gid,
}

fn find_user(name: &str) -> Result<Identity> {
    match User::from_name(name).with_context(|| format!("looking up user {name}"))? {
        Some(u) => Ok(Identity { uid: u.uid, gid: u.gid }),
        None => bail!("no user named {name} (--user, ${USER_ENV})"),
    }
}

/// Keeps only what a running interface needs: CAP_NET_ADMIN (fwmark, more TUN queues) and
/// CAP_NET_BIND_SERVICE (a listen port below 1024 set later through the UAPI); with
/// `realtime` (the threaded model's SCHED_FIFO delivery, a lab setting) also CAP_SYS_NICE.
/// Everything else leaves the bounding, permitted, effective and inheritable sets, and no
/// exec can regain it. Started as root, the process then becomes `user` (its primary group,
/// no supplementary groups), keeping those capabilities across the switch. Capabilities are
/// per thread, so this runs before any thread is started.
pub fn drop_privileges(user: &str, realtime: bool) -> Result<()> {
    let target = find_user(user)?;
    let mut keep: CapsHashSet = [Capability::CAP_NET_ADMIN, Capability::CAP_NET_BIND_SERVICE]
        .into_iter()
        .collect();
    if realtime {
        keep.insert(Capability::CAP_SYS_NICE);
    }
    for c in caps::all() {
        if !keep.contains(&c) {
            caps::drop(None, CapSet::Bounding, c).with_context(|| format!("dropping {c} from the bounding set"))?;
        }
    }
    caps::set(None, CapSet::Inheritable, &CapsHashSet::new())?;
    if Uid::effective().is_root() && !target.uid.is_root() {
        become_user(target).with_context(|| format!("becoming user {user}"))?;
    }
    // The switch emptied the effective set; the permitted one still holds what root had.
    caps::set(None, CapSet::Effective, &keep)?;
    caps::set(None, CapSet::Permitted, &keep)?;
    no_new_privs()
}

/// Fails if the process has any thread but the calling one. Capabilities and no_new_privs
/// are each thread's own: a thread started before [`drop_privileges`] would keep what the
/// process gives up, so the daemon calls this first (its data plane starts after).
pub fn ensure_alone() -> Result<()> {
    let others = other_threads();
    if !others.is_empty() {
        bail!(
            "threads started before the privileges are dropped would keep them: {}",
            others.join(", ")
        );
    }
    Ok(())
}

/// The names of this process's threads other than the calling one.
fn other_threads() -> Vec<String> {
    // SAFETY: gettid cannot fail.
    let me = unsafe { libc::gettid() }.to_string();
    let Ok(tasks) = std::fs::read_dir("/proc/self/task") else {
        return Vec::new();
    };
    tasks
        .flatten()
        .filter(|t| t.file_name().to_string_lossy() != me)
        .map(|t| {
            let comm = std::fs::read_to_string(t.path().join("comm")).unwrap_or_default();
            format!("{} ({})", comm.trim(), t.file_name().to_string_lossy())
        })
        .collect()
}

/// Drops every capability, bounding set included, and sets no_new_privs: for a helper that
/// needs only what its user id gives it.
pub fn drop_all_capabilities() -> Result<()> {
    for c in caps::all() {
        caps::drop(None, CapSet::Bounding, c).with_context(|| format!("dropping {c} from the bounding set"))?;
    }
    for set in [CapSet::Inheritable, CapSet::Effective, CapSet::Permitted] {
        caps::clear(None, set)?;
    }
    no_new_privs()
}

/// setgroups, then setresgid, then setresuid (each needs the capability the next one gives
/// up), with PR_SET_KEEPCAPS so the permitted set survives the change of user.
fn become_user(target: Identity) -> Result<()> {
    // SAFETY: prctl(PR_SET_KEEPCAPS) only sets a flag on this process.
    if unsafe { libc::prctl(libc::PR_SET_KEEPCAPS, 1, 0, 0, 0) } != 0 {
        bail!("prctl(PR_SET_KEEPCAPS): {}", std::io::Error::last_os_error());
    }
    nix::unistd::setgroups(&[]).context("setgroups")?;
    nix::unistd::setresgid(target.gid, target.gid, target.gid).context("setresgid")?;
    nix::unistd::setresuid(target.uid, target.uid, target.uid).context("setresuid")?;
    // SAFETY: as above, clearing the flag.
    unsafe { libc::prctl(libc::PR_SET_KEEPCAPS, 0, 0, 0, 0) };
    Ok(())
}

fn no_new_privs() -> Result<()> {
    // SAFETY: prctl(PR_SET_NO_NEW_PRIVS, 1) only sets a flag on this process.
    if unsafe { libc::prctl(libc::PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) } != 0 {
        bail!("prctl(PR_SET_NO_NEW_PRIVS): {}", std::io::Error::last_os_error());
    }
    Ok(())
}

/// Makes the process not dumpable: no core file, and no other process of the same user may
/// attach to it or read its memory (/proc/PID/mem), where the keys are.
pub fn not_dumpable() -> Result<()> {
    // SAFETY: prctl(PR_SET_DUMPABLE, 0) only sets a flag on this process.
    if unsafe { libc::prctl(libc::PR_SET_DUMPABLE, 0, 0, 0, 0) } != 0 {
        bail!("prctl(PR_SET_DUMPABLE): {}", std::io::Error::last_os_error());
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::process::Command;

    #[test]
    fn keep_wins_then_the_flag_then_nobody() {
        assert_eq!(Privileges::from_flags(true, Some("daemon".into())), Privileges::Keep);
        assert_eq!(
            Privileges::from_flags(false, Some("daemon".into())),
            Privileges::Drop { user: "daemon".into() }
        );
        assert_eq!(
            Privileges::from_flags(false, Some("daemon".into())).to_args(),
            ["--user", "daemon"]
        );
        assert_eq!(Privileges::Keep.to_args(), ["--keep-privileges"]);
    }

    #[test]
    fn an_unknown_user_is_refused_by_name() {
        let e = drop_privileges("no-such-user-ordo", false).unwrap_err();
        assert!(format!("{e:#}").contains("no user named no-such-user-ordo"), "{e:#}");
    }

    /// Set in the environment of the child process the test below starts.
    const CHILD_ENV: &str = "ORDO_TEST_PRIVILEGES_CHILD";

    /// As root, the daemon's drop leaves the process as nobody with exactly the two
    /// capabilities, no_new_privs, unable to write a root-owned file; runs itself again as a
    /// child (capabilities and users do not come back within a process).
    #[test]
    fn started_as_root_it_becomes_nobody_with_two_capabilities() {
        if !Uid::effective().is_root() {
            eprintln!("skipped: needs root");
            return;
        }
        if std::env::var_os(CHILD_ENV).is_some() {
            drop_privileges(DEFAULT_USER, false).unwrap();
            // The test's own thread: capabilities and no_new_privs are per thread.
            let status = std::fs::read_to_string("/proc/thread-self/status").unwrap();
            let field = |name: &str| {
                let line = status.lines().find(|l| l.starts_with(name)).unwrap();
                line.split_whitespace().skip(1).collect::<Vec<_>>().join(" ")
            };
            let root_file = std::fs::OpenOptions::new().append(true).open("/etc/passwd");
            println!(
                "uid={} caps={} nnp={} write_root_file={}",
                field("Uid:"),
                field("CapEff:"),
                field("NoNewPrivs:"),
                root_file.is_ok()
            );
            return;
        }
        let nobody = find_user(DEFAULT_USER).unwrap().uid.as_raw();
        let out = Command::new(std::env::current_exe().unwrap())
            .args([
                "--exact",
                "daemon::privileges::tests::started_as_root_it_becomes_nobody_with_two_capabilities",
                "--nocapture",
            ])
            .env(CHILD_ENV, "1")
            .output()
            .unwrap();
        let stdout = String::from_utf8_lossy(&out.stdout);
        assert!(out.status.success(), "{stdout}{}", String::from_utf8_lossy(&out.stderr));
        let want = format!("uid={nobody} {nobody} {nobody} {nobody} caps=0000000000001400 nnp=1 write_root_file=false");
        assert!(stdout.contains(&want), "want {want} in {stdout}");
    }
}
