//! A shared stack interface: `ordo up` of a wg-quick file with `Inner = stack` (or
//! `--inner stack`, `ORDO_INNER=stack`). Any user runs it, no capability needed: a daemon
//! with Ordo's own TCP/IP stack as its inner side, configured by the file and then over its
//! UAPI socket (`ordo show`, and `wg` for root's), which programs of that user (or root)
//! join with `ordo run --attach NAME -- CMD`. Each program's connections are its own: they
//! are reached only through its descriptors, and one program ending or crashing ends only
//! its own connections.
//!
//! Beside the UAPI socket in [`uapi::socket_dir`]: `NAME.attach`, the attach socket, and
//! `NAME.stack`, what `ordo run --attach` needs that UAPI does not say (the interface's
//! addresses, its `DNS =`). `ordo down NAME` removes the UAPI socket, which ends the daemon.

use super::lifecycle::{AttachPoint, Bringup, Inner, StackInner};
use crate::config::wgquick::WgQuickConfig;
use crate::daemon::{self, privileges::Privileges};
use crate::inner::stack::{Attachers, Guests};
use crate::uapi;
use anyhow::{bail, Context, Result};
use ipnet::IpNet;
use ordo_attach::Dns;
use std::io::Write;
use std::os::unix::fs::OpenOptionsExt;
use std::os::unix::net::UnixListener;
use std::path::{Path, PathBuf};
use std::time::Duration;

/// The attach socket of the stack interface `ifname`.
pub fn attach_path(ifname: &str) -> PathBuf {
    uapi::socket_dir().join(format!("{ifname}.attach"))
}

fn info_path(ifname: &str) -> PathBuf {
    uapi::socket_dir().join(format!("{ifname}.stack"))
}

/// Whether `ifname` is a running stack interface of this user.
pub fn is_up(ifname: &str) -> bool {
    std::os::unix::net::UnixStream::connect(attach_path(ifname)).is_ok()
}

/// Starts the interface in the background (this executable again, `ordo up --foreground`)
/// and returns once it serves.
pub fn up(config: &Path, ifname: &str, privileges: &Privileges) -> Result<()> {
    if is_up(ifname) {
        bail!("{ifname} is already up");
    }
    let mut args: Vec<std::ffi::OsString> = vec!["up".into()];
    args.extend(privileges.to_args().into_iter().map(Into::into));
    args.extend(["--inner".into(), "stack".into(), "--foreground".into(), config.into()]);
    daemon::detach(&args, ifname)
}

/// Runs the interface in this process until `ordo down` (its UAPI socket removed), a
/// signal, or a fault ends it.
pub fn serve(cfg: &WgQuickConfig, source: &Path, ifname: &str, privileges: &Privileges) -> Result<()> {
    let guests = resolve_guests(cfg, source)?;
    // The interface is its starter's, whoever the daemon becomes.
    // SAFETY: getuid cannot fail.
    let owner = unsafe { libc::getuid() };
    let (settings, stack) = super::stack::settings(
        cfg,
        source,
        Attachers {
            owner,
            guests: guests.clone(),
        },
    )?;
    let attach = move || make_attach_point(cfg, ifname, &guests);
    let up = Bringup {
        name: ifname,
        settings,
        privileges: privileges.clone(),
        inner: Inner::Stack(StackInner {
            file: cfg,
            source,
            settings: stack,
            attach: Box::new(attach),
        }),
        daemon: true,
    }
    .start()?;
    up.wait();
    Ok(())
}

/// The attach socket and its information, in the user's socket directory; with guests, where
/// they can reach them (the user's own directory keeps everyone else out), linked from the
/// user's directory.
fn make_attach_point(cfg: &WgQuickConfig, ifname: &str, guests: &Guests) -> Result<AttachPoint> {
    let (attach, info) = if guests.is_empty() {
        (attach_path(ifname), info_path(ifname))
    } else {
        let shared = ensure_guest_dir().context("the guests' directory")?;
        (
            shared.join(format!("{ifname}.attach")),
            shared.join(format!("{ifname}.stack")),
        )
    };
    let mut files = vec![attach.clone(), info.clone()];
    let _ = std::fs::remove_file(&attach);
    let mode = if guests.is_empty() { 0o600 } else { 0o666 };
    let listener = bind_with_mode(&attach, mode).with_context(|| format!("binding {}", attach.display()))?;
    let made = (|| {
        let allowed: Vec<IpNet> = cfg.peers.iter().flat_map(|p| p.allowed_ips.iter().copied()).collect();
        write_info(
            &info,
            &cfg.interface.addresses,
            cfg.interface.dns.as_ref().map(|(_, d)| d),
            &allowed,
            if guests.is_empty() { 0o600 } else { 0o644 },
        )?;
        if !guests.is_empty() {
            for (link, target) in [(attach_path(ifname), &attach), (info_path(ifname), &info)] {
                let _ = std::fs::remove_file(&link);
                files.push(link.clone());
                std::os::unix::fs::symlink(target, &link).with_context(|| format!("linking {}", link.display()))?;
            }
        }
        Ok(())
    })();
    match made {
        Ok(()) => Ok(AttachPoint { listener, files }),
        Err(e) => {
            files.iter().for_each(|f| drop(std::fs::remove_file(f)));
            Err(e)
        }
    }
}

/// Ends the interface: its UAPI socket removed, the daemon notices and ends (within its
/// housekeeping period), taking its other files with it.
pub fn down(ifname: &str) -> Result<()> {
    let socket = uapi::socket_path(ifname);
    std::fs::remove_file(&socket).with_context(|| format!("{ifname} is not up ({})", socket.display()))?;
    for _ in 0..100 {
        if !attach_path(ifname).exists() {
            return Ok(());
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    bail!("{ifname} did not end within 5 s")
}

/// What a program attaching to `ifname` needs.
pub struct AttachInfo {
    pub socket: PathBuf,
    pub addresses: Vec<IpNet>,
    pub dns: Option<Dns>,
    /// The peers' allowed IPs as the interface came up (its own user reads them as they are
    /// now, over UAPI; guests cannot).
    pub allowed: Vec<IpNet>,
}

/// Reads `ifname`'s attach information (see the module's documentation).
pub fn attach_info(ifname: &str) -> Result<AttachInfo> {
    let socket = attach_path(ifname);
    if !is_up(ifname) {
        bail!(
            "{ifname} is not a running stack interface of this user (no {}): `ordo up` a file with Inner = stack",
            socket.display()
        );
    }
    read_info(socket, &info_path(ifname))
}

/// Reads the attach information of `owner`'s stack interface `ifname`, which lets this
/// user attach (`AttachUsers =`): `ordo run --attach OWNER:NAME`.
pub fn guest_attach_info(owner: &str, ifname: &str) -> Result<AttachInfo> {
    use std::os::unix::fs::MetadataExt;
    let uid = match owner.parse::<u32>() {
        Ok(uid) => uid,
        Err(_) => nix::unistd::User::from_name(owner)
            .ok()
            .flatten()
            .with_context(|| format!("no user {owner:?}"))?
            .uid
            .as_raw(),
    };
    let dir = guest_dir(uid);
    // Only a directory of the owner's, which nobody else can write to, is theirs: in /tmp,
    // anyone could have made one by that name first.
    let meta = std::fs::symlink_metadata(&dir)
        .with_context(|| format!("{owner} shares no stack interface ({} is missing)", dir.display()))?;
    if !meta.is_dir() || meta.uid() != uid || meta.mode() & 0o022 != 0 {
        bail!(
            "{} is not {owner}'s (or others may write to it): not used",
            dir.display()
        );
    }
    let socket = dir.join(format!("{ifname}.attach"));
    if !socket.exists() {
        bail!("{owner} shares no stack interface {ifname} (no {})", socket.display());
    }
    read_info(socket, &dir.join(format!("{ifname}.stack")))
}

fn read_info(socket: PathBuf, path: &Path) -> Result<AttachInfo> {
    let text = std::fs::read_to_string(path).with_context(|| format!("reading {}", path.display()))?;
    let (addresses, dns, allowed) = parse_info(&text).with_context(|| format!("{} is damaged", path.display()))?;
    Ok(AttachInfo {
        socket,
        addresses,
        dns,
        allowed,
    })
}

/// Where a stack interface with guests keeps its attach socket and information for them.
/// Fixed, not $TMPDIR, so that the owner and the guests agree on it.
fn guest_dir(owner: u32) -> PathBuf {
    PathBuf::from(format!("/tmp/ordo-attach-{owner}"))
}

/// Makes this user's [`guest_dir`]: 0711, so that others reach a name in it but cannot
/// list it or add to it. One that exists must be this user's and closed to writes.
fn ensure_guest_dir() -> Result<PathBuf> {
    use std::os::unix::fs::{DirBuilderExt, MetadataExt, PermissionsExt};
    // SAFETY: geteuid reads a process attribute.
    let uid = unsafe { libc::geteuid() };
    let dir = guest_dir(uid);
    match std::fs::DirBuilder::new().mode(0o711).create(&dir) {
        Ok(()) => {}
        Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {
            let meta = std::fs::symlink_metadata(&dir)?;
            if !meta.is_dir() || meta.uid() != uid {
                bail!("{} is not a directory of this user's", dir.display());
            }
        }
        Err(e) => return Err(e).with_context(|| format!("creating {}", dir.display())),
    }
    // The mode asked for above is cut by the umask; and one left by an earlier run may be
    // another.
    std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o711))?;
    Ok(dir)
}

/// `AttachUsers =` as user and group ids, each name looked up; an entry nobody has is an
/// error naming the file and line.
fn resolve_guests(cfg: &WgQuickConfig, source: &Path) -> Result<Guests> {
    use nix::unistd::{Group, User};
    let mut guests = Guests::default();
    for (line, entry) in &cfg.interface.attach_users {
        let at = || format!("{}:{line}: AttachUsers", source.display());
        match entry.strip_prefix('@') {
            Some(group) => {
                let gid = match group.parse::<u32>() {
                    Ok(gid) => gid,
                    Err(_) => Group::from_name(group)
                        .ok()
                        .flatten()
                        .with_context(|| format!("{}: no group {group:?}", at()))?
                        .gid
                        .as_raw(),
                };
                guests.gids.push(gid);
            }
            None => {
                let uid = match entry.parse::<u32>() {
                    Ok(uid) => uid,
                    Err(_) => User::from_name(entry)
                        .ok()
                        .flatten()
                        .with_context(|| format!("{}: no user {entry:?}", at()))?
                        .uid
                        .as_raw(),
                };
                guests.uids.push(uid);
            }
        }
    }
    Ok(guests)
}

fn write_info(path: &Path, addresses: &[IpNet], dns: Option<&Dns>, allowed: &[IpNet], mode: u32) -> Result<()> {
    let _ = std::fs::remove_file(path);
    let mut f = std::fs::OpenOptions::new()
        .create_new(true)
        .write(true)
        .mode(mode)
        .open(path)
        .with_context(|| format!("writing {}", path.display()))?;
    // The mode asked for is cut by the umask.
    std::fs::set_permissions(path, std::os::unix::fs::PermissionsExt::from_mode(mode))?;
    for a in addresses {
        writeln!(f, "address={a}")?;
    }
    if let Some(d) = dns {
        writeln!(f, "dns={}", d.format())?;
    }
    for a in allowed {
        writeln!(f, "allowed={a}")?;
    }
    Ok(())
}

fn parse_info(text: &str) -> Result<(Vec<IpNet>, Option<Dns>, Vec<IpNet>)> {
    let mut addresses = Vec::new();
    let mut dns = None;
    let mut allowed = Vec::new();
    for line in text.lines() {
        match line.split_once('=') {
            Some(("address", a)) => addresses.push(a.parse().map_err(|_| anyhow::anyhow!("address {a:?}"))?),
            Some(("dns", d)) => dns = Some(Dns::parse(d).map_err(anyhow::Error::msg)?),
            Some(("allowed", a)) => allowed.push(a.parse().map_err(|_| anyhow::anyhow!("allowed {a:?}"))?),
            _ => bail!("line {line:?}"),
        }
    }
    Ok((addresses, dns, allowed))
}

/// A Unix socket bound with `mode` (0600: its user's; 0666: anyone may connect, the service
/// checking who with SO_PEERCRED).
fn bind_with_mode(path: &Path, mode: u32) -> std::io::Result<UnixListener> {
    // SAFETY: umask only swaps the process's file-creation mask; no other thread runs yet.
    let old = unsafe { libc::umask(0o777 & !mode) };
    let bound = UnixListener::bind(path);
    // SAFETY: as above, restoring it.
    unsafe { libc::umask(old) };
    bound
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn attach_information_round_trips() {
        let dir = std::env::temp_dir().join(format!("ordo-shared-stack-test-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("x.stack");
        let addresses: Vec<IpNet> = vec!["10.99.0.1/24".parse().unwrap(), "fd99::1/64".parse().unwrap()];
        let dns = Dns::parse("10.99.0.2,corp.example").unwrap();
        let allowed: Vec<IpNet> = vec!["10.99.0.2/32".parse().unwrap()];
        write_info(&path, &addresses, Some(&dns), &allowed, 0o644).unwrap();
        let text = std::fs::read_to_string(&path).unwrap();
        assert_eq!(parse_info(&text).unwrap(), (addresses, Some(dns), allowed));
        assert!(parse_info("address=nonsense\n").is_err());
        assert!(parse_info("what=ever\n").is_err());
        let _ = std::fs::remove_dir_all(&dir);
    }
}
