//! `ordo run -c FILE -- CMD ARGS`: a program uses the tunnel without root and without a TUN
//! device. This process becomes a private stack interface (`Inner = stack`) configured from
//! the wg-quick file, and runs CMD with the preload library (`crates/ordo-preload`), whose
//! connections to the tunnel's addresses reach the stack through the attach socket. When CMD
//! ends, the interface ends, and `ordo run` exits with CMD's status.

use crate::device::Device;
use crate::inner::stack::service::Service;
use crate::inner::stack::StackSettings;
use crate::placement::model::PlaneConfig;
use crate::quick;
use crate::uapi;
use anyhow::{bail, Context, Result};
use ordo_attach::Route;
use std::ffi::OsString;
use std::os::unix::fs::DirBuilderExt;
use std::os::unix::net::UnixListener;
use std::os::unix::process::ExitStatusExt;
use std::path::{Path, PathBuf};
use std::process::Command;

/// The preload library's file name, found beside the `ordo` executable (cargo puts both in
/// `target/release`) unless `ORDO_PRELOAD` names it.
const PRELOAD_NAME: &str = "libordo_preload.so";

/// Runs `command` attached to a private stack interface made from the wg-quick file at
/// `config`; returns the exit code to leave with (the command's, or 128 + its signal).
pub fn run(config: &Path, command: &[OsString]) -> Result<i32> {
    let Some((program, args)) = command.split_first() else {
        bail!("ordo run: no command given");
    };
    let preload = preload_library()?;
    let cfg = quick::load(config)?;
    if cfg.interface.addresses.is_empty() {
        bail!(
            "{}: an Address is needed: it is the program's address in the tunnel",
            config.display()
        );
    }
    let mut plane = PlaneConfig::from_env().map_err(anyhow::Error::msg)?;
    for (name, value) in &cfg.interface.plane {
        plane.set(name, value).map_err(anyhow::Error::msg)?;
    }
    let settings = StackSettings {
        addresses: cfg.interface.addresses.clone(),
        mtu: cfg.interface.mtu.unwrap_or(1420) as usize,
    };
    let name = format!("run{}", std::process::id());
    let (device, wires) = Device::create_stack(&name, &plane, settings.mtu).context("creating the stack interface")?;
    let request = quick::set_request(&cfg, None)?;
    // The request's lines after `set=1`, up to the blank line that ends it.
    uapi::protocol::parse_set(request.as_str().lines().skip(1).take_while(|l| !l.is_empty()))
        .and_then(|p| uapi::apply(&device, p))
        .map_err(|e| anyhow::anyhow!("{}: {}", config.display(), e.message))?;
    drop(request);
    device.start().context("starting the data plane")?;

    let dir = private_dir()?;
    let socket = dir.path.join("attach.sock");
    let listener = UnixListener::bind(&socket).with_context(|| format!("binding {}", socket.display()))?;
    let service = Service::start(wires, &settings, listener).context("starting the stack")?;

    let mut routes: Vec<Route> = cfg
        .interface
        .addresses
        .iter()
        .map(|n| n.trunc())
        .chain(cfg.peers.iter().flat_map(|p| p.allowed_ips.iter().copied()))
        .map(|n| Route {
            addr: n.addr(),
            prefix: n.prefix_len(),
        })
        .collect();
    routes.dedup();
    let mut ld_preload = preload.into_os_string();
    if let Some(old) = std::env::var_os("LD_PRELOAD").filter(|v| !v.is_empty()) {
        ld_preload.push(":");
        ld_preload.push(old);
    }
    let mut command = Command::new(program);
    command
        .args(args)
        .env("LD_PRELOAD", ld_preload)
        .env(ordo_attach::ENV_SOCKET, &socket)
        .env(ordo_attach::ENV_ROUTES, ordo_attach::format_routes(&routes));
    // Names resolve through the tunnel's servers when the file names them (the preload
    // library's getaddrinfo); otherwise as the host resolves them.
    match &cfg.interface.dns {
        Some((_, dns)) if !dns.servers.is_empty() => command.env(ordo_attach::ENV_DNS, dns.format()),
        _ => command.env_remove(ordo_attach::ENV_DNS),
    };
    let mut child = command
        .spawn()
        .with_context(|| format!("cannot run {}", program.to_string_lossy()))?;
    // A terminal's Ctrl-C reaches the program too: let it decide, and end when it ends.
    // SAFETY: setting a signal's disposition to ignored; no handler runs.
    unsafe {
        libc::signal(libc::SIGINT, libc::SIG_IGN);
        libc::signal(libc::SIGQUIT, libc::SIG_IGN);
    }
    let status = child.wait().context("waiting for the program")?;
    // SAFETY: back to the default dispositions: a Ctrl-C now ends the wait below.
    unsafe {
        libc::signal(libc::SIGINT, libc::SIG_DFL);
        libc::signal(libc::SIGQUIT, libc::SIG_DFL);
    }
    // What the program wrote before it ended is still on its way: deliver it first.
    service.linger();
    device.shutdown("the program ended");
    Ok(status.code().unwrap_or_else(|| 128 + status.signal().unwrap_or(0)))
}

/// Where the preload library is.
fn preload_library() -> Result<PathBuf> {
    if let Some(p) = std::env::var_os("ORDO_PRELOAD") {
        return Ok(PathBuf::from(p));
    }
    let exe = std::env::current_exe().context("finding the ordo executable")?;
    let beside = exe.with_file_name(PRELOAD_NAME);
    if beside.exists() {
        return Ok(beside);
    }
    bail!(
        "cannot find {PRELOAD_NAME} beside {} (build the workspace with `cargo build --release`, \
         or set ORDO_PRELOAD to its path)",
        exe.display()
    )
}

/// A directory only this user can enter, removed when dropped: the attach socket's.
struct PrivateDir {
    path: PathBuf,
}

fn private_dir() -> Result<PrivateDir> {
    let base = std::env::var_os("XDG_RUNTIME_DIR")
        .map(PathBuf::from)
        .filter(|p| p.is_dir())
        .unwrap_or_else(std::env::temp_dir);
    for _ in 0..16 {
        let tag = rand_core::RngCore::next_u64(&mut rand_core::OsRng);
        let path = base.join(format!("ordo-run.{tag:016x}"));
        match std::fs::DirBuilder::new().mode(0o700).create(&path) {
            Ok(()) => return Ok(PrivateDir { path }),
            Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => continue,
            Err(e) => return Err(e).with_context(|| format!("creating {}", path.display())),
        }
    }
    bail!("cannot create a private directory in {}", base.display())
}

impl Drop for PrivateDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.path);
    }
}
