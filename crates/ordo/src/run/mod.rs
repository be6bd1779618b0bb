//! `ordo run -c FILE -- CMD ARGS`: a program uses the tunnel without root and without a TUN
//! device. This process becomes a private stack interface (`Inner = stack`) configured from
//! the wg-quick file, and runs CMD with the preload library (`crates/ordo-preload`), whose
//! connections to the tunnel's addresses reach the stack through the attach socket. When CMD
//! ends, the interface ends, and `ordo run` exits with CMD's status.
//!
//! `ordo run --attach NAME -- CMD ARGS` runs CMD attached to a running stack interface
//! instead ([`crate::shared_stack`]), which outlives it.

mod connect;
mod listener;
mod stand_ins;
mod supervise;

use crate::config;
use crate::stack_interface;
use crate::uapi;
use anyhow::{bail, Context, Result};
use ipnet::IpNet;
use ordo_attach::{Dns, Route};
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
    if command.is_empty() {
        bail!("ordo run: no command given");
    }
    let preload = preload_library()?;
    let cfg = config::load(config)?;
    let dir = private_dir()?;
    let socket = dir.path.join("attach.sock");
    let listener = UnixListener::bind(&socket).with_context(|| format!("binding {}", socket.display()))?;
    let name = format!("run{}", std::process::id());
    let stack = stack_interface::start(&cfg, config, &name, listener, crate::inner::stack::Attachers::own())?;
    let program = Program {
        preload,
        socket,
        routes: stack.routes.clone(),
        dns: cfg.interface.dns.map(|(_, d)| d),
    };
    let status = program.run(command)?;
    // What the program wrote before it ended is still on its way: deliver it first.
    stack.service.linger();
    stack.device.shutdown("the program ended");
    Ok(status)
}

/// Runs `command` attached to the running stack interface `name` (`ordo up` of an
/// `Inner = stack` file, by this user): its networks as it has them now (the peers' allowed
/// IPs read over UAPI), its `DNS =`. The interface runs on when the program ends.
pub fn run_attached(name: &str, command: &[OsString]) -> Result<i32> {
    let preload = preload_library()?;
    if let Some((owner, name)) = name.split_once(':') {
        // Another user's interface, which lets this one attach (`AttachUsers =`): its
        // networks as they were when it came up (its UAPI socket is its user's alone).
        let shared = crate::shared_stack::guest_attach_info(owner, name)?;
        let program = Program {
            preload,
            socket: shared.socket,
            routes: stack_interface::routes(&shared.addresses, shared.allowed.into_iter()),
            dns: shared.dns,
        };
        return program.run(command);
    }
    let shared = crate::shared_stack::attach_info(name)?;
    let pairs = uapi::client::request(name, "get=1\n\n").with_context(|| format!("reading {name}'s peers"))?;
    let allowed = pairs
        .iter()
        .filter(|(k, _)| k == "allowed_ip")
        .filter_map(|(_, v)| v.parse::<IpNet>().ok());
    let program = Program {
        preload,
        socket: shared.socket,
        routes: stack_interface::routes(&shared.addresses, allowed),
        dns: shared.dns,
    };
    program.run(command)
}

/// A program to run with the preload library, and what the library needs to know.
struct Program {
    preload: PathBuf,
    socket: PathBuf,
    routes: Vec<Route>,
    dns: Option<Dns>,
}

impl Program {
    /// Runs `command` and returns its exit code (or 128 + its signal).
    fn run(&self, command: &[OsString]) -> Result<i32> {
        let Some((program, args)) = command.split_first() else {
            bail!("ordo run: no command given");
        };
        let mut ld_preload = self.preload.clone().into_os_string();
        if let Some(old) = std::env::var_os("LD_PRELOAD").filter(|v| !v.is_empty()) {
            ld_preload.push(":");
            ld_preload.push(old);
        }
        let mut command = Command::new(program);
        command
            .args(args)
            .env("LD_PRELOAD", ld_preload)
            .env(ordo_attach::ENV_SOCKET, &self.socket)
            .env(ordo_attach::ENV_ROUTES, ordo_attach::format_routes(&self.routes));
        // Names resolve through the tunnel's servers when the file names them (the preload
        // library's getaddrinfo); otherwise as the host resolves them.
        match &self.dns {
            Some(dns) if !dns.servers.is_empty() => command.env(ordo_attach::ENV_DNS, dns.format()),
            _ => command.env_remove(ordo_attach::ENV_DNS),
        };
        // What bypasses the library (static programs, Go, raw system calls) is kept from the
        // kernel's route by a seccomp supervisor (supervise.rs): set up in the child between
        // fork and exec, its listener handed to this process.
        let supervise::Supervised { mut child, supervisor } =
            supervise::spawn(&mut command, self.routes.clone(), self.socket.clone())
                .with_context(|| format!("cannot run {}", program.to_string_lossy()))?;
        // Not waited for: processes the program leaves behind stay under the filter, and the
        // supervisor answers them until the last one ends.
        drop(supervisor);
        // A terminal's Ctrl-C reaches the program too: let it decide, and end when it ends.
        // SAFETY: setting a signal's disposition to ignored; no handler runs.
        unsafe {
            libc::signal(libc::SIGINT, libc::SIG_IGN);
            libc::signal(libc::SIGQUIT, libc::SIG_IGN);
        }
        let status = child.wait().context("waiting for the program")?;
        // SAFETY: back to the default dispositions: a Ctrl-C now ends what follows.
        unsafe {
            libc::signal(libc::SIGINT, libc::SIG_DFL);
            libc::signal(libc::SIGQUIT, libc::SIG_DFL);
        }
        Ok(status.code().unwrap_or_else(|| 128 + status.signal().unwrap_or(0)))
    }
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
