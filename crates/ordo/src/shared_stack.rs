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

use crate::config::wgquick::WgQuickConfig;
use crate::daemon;
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
pub fn up(config: &Path, ifname: &str) -> Result<()> {
    if is_up(ifname) {
        bail!("{ifname} is already up");
    }
    let args = [
        "up".into(),
        "--inner".into(),
        "stack".into(),
        "--foreground".into(),
        config.into(),
    ];
    daemon::detach(&args, ifname)
}

/// Runs the interface in this process until `ordo down` (its UAPI socket removed), a
/// signal, or a fault ends it.
pub fn serve(cfg: &WgQuickConfig, source: &Path, ifname: &str) -> Result<()> {
    let log = daemon::open_detached_log()?;
    let dir = uapi::ensure_socket_dir().context("the sockets' directory")?;
    let (uapi_listener, uapi_path) =
        uapi::listen(ifname).with_context(|| format!("cannot create the UAPI socket for {ifname}"))?;
    let attach = attach_path(ifname);
    let _ = std::fs::remove_file(&attach);
    let attach_listener = bind_private(&attach).with_context(|| format!("binding {}", attach.display()))?;
    let info = info_path(ifname);
    let files = Cleanup(vec![uapi_path.clone(), attach.clone(), info.clone()]);
    write_info(
        &info,
        &cfg.interface.addresses,
        cfg.interface.dns.as_ref().map(|(_, d)| d),
    )?;
    daemon::exit_on_panic(Some(uapi_path.clone()));
    daemon::privileges::not_dumpable()?;
    let stack = crate::stack_interface::start(cfg, source, ifname, attach_listener)?;
    *stack.device.uapi_path.lock().unwrap_or_else(|p| p.into_inner()) = Some(uapi_path);
    let d = stack.device.clone();
    std::thread::Builder::new()
        .name("ordo-uapi-listen".into())
        .spawn(move || uapi::serve(d, uapi_listener))?;
    let d = stack.device.clone();
    let mut signals = signal_hook::iterator::Signals::new([libc::SIGINT, libc::SIGTERM, libc::SIGHUP])?;
    std::thread::Builder::new().name("ordo-signals".into()).spawn(move || {
        if let Some(s) = signals.forever().next() {
            d.shutdown(&format!("signal {s}"));
        }
    })?;
    daemon::report_ready(log)?;
    eprintln!(
        "ordo[{ifname}]: up, inner side Ordo's stack (attach: ordo run --attach {ifname}), sockets in {}, \
         listening on UDP port {}",
        dir.display(),
        stack.device.listen_port()
    );
    stack.device.wait();
    drop(stack.service);
    drop(files);
    Ok(())
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
    let path = info_path(ifname);
    let text = std::fs::read_to_string(&path).with_context(|| format!("reading {}", path.display()))?;
    let (addresses, dns) = parse_info(&text).with_context(|| format!("{} is damaged", path.display()))?;
    Ok(AttachInfo { socket, addresses, dns })
}

fn write_info(path: &Path, addresses: &[IpNet], dns: Option<&Dns>) -> Result<()> {
    let mut f = std::fs::OpenOptions::new()
        .create(true)
        .truncate(true)
        .write(true)
        .mode(0o600)
        .open(path)
        .with_context(|| format!("writing {}", path.display()))?;
    for a in addresses {
        writeln!(f, "address={a}")?;
    }
    if let Some(d) = dns {
        writeln!(f, "dns={}", d.format())?;
    }
    Ok(())
}

fn parse_info(text: &str) -> Result<(Vec<IpNet>, Option<Dns>)> {
    let mut addresses = Vec::new();
    let mut dns = None;
    for line in text.lines() {
        match line.split_once('=') {
            Some(("address", a)) => addresses.push(a.parse().map_err(|_| anyhow::anyhow!("address {a:?}"))?),
            Some(("dns", d)) => dns = Some(Dns::parse(d).map_err(anyhow::Error::msg)?),
            _ => bail!("line {line:?}"),
        }
    }
    Ok((addresses, dns))
}

/// A Unix socket bound with mode 0600 (its directory keeps others out too).
fn bind_private(path: &Path) -> std::io::Result<UnixListener> {
    // SAFETY: umask only swaps the process's file-creation mask; no other thread runs yet.
    let old = unsafe { libc::umask(0o077) };
    let bound = UnixListener::bind(path);
    // SAFETY: as above, restoring it.
    unsafe { libc::umask(old) };
    bound
}

/// Files removed when dropped.
struct Cleanup(Vec<PathBuf>);

impl Drop for Cleanup {
    fn drop(&mut self) {
        for p in &self.0 {
            let _ = std::fs::remove_file(p);
        }
    }
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
        write_info(&path, &addresses, Some(&dns)).unwrap();
        let text = std::fs::read_to_string(&path).unwrap();
        assert_eq!(parse_info(&text).unwrap(), (addresses, Some(dns)));
        assert!(parse_info("address=nonsense\n").is_err());
        assert!(parse_info("what=ever\n").is_err());
        let _ = std::fs::remove_dir_all(&dir);
    }
}
