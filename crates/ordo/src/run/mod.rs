//! `ordo run -c FILE -- CMD ARGS`: a program uses the tunnel without root and without a TUN
//! device. This process becomes a private stack interface (`Inner = stack`) configured from
//! the wg-quick file, and runs CMD with the preload library (`crates/ordo-preload`), whose
//! connections to the tunnel's addresses reach the stack through the attach socket. When CMD
//! ends, the interface ends, and `ordo run` exits with CMD's status.
//!
//! `ordo run --attach NAME -- CMD ARGS` runs CMD attached to a running stack interface
//! instead ([`crate::interface::shared`]), which outlives it.

mod connect;
mod destination;
mod filter;
mod listener;
mod stand_ins;
mod supervise;

use crate::config;
use crate::daemon::privileges::Privileges;
use crate::inner::stack::Attachers;
use crate::interface::lifecycle::{AttachPoint, Bringup, Inner, StackInner};
use crate::interface::stack as stack_interface;
use crate::uapi;
use anyhow::{bail, Context, Result};
use ipnet::IpNet;
use ordo_attach::{Dns, Route};
use std::ffi::OsString;
use std::os::unix::fs::DirBuilderExt;
use std::os::unix::net::UnixListener;
use std::os::unix::process::{CommandExt, ExitStatusExt};
use std::path::{Path, PathBuf};
use std::process::Command;

/// The preload library's file name, found beside the `ordo` executable (cargo puts both in
/// `target/release`) unless `ORDO_PRELOAD` names it.
const PRELOAD_NAME: &str = "libordo_preload.so";

/// Runs `command` attached to a private stack interface made from the wg-quick file at
/// `config`; returns the exit code to leave with (the command's, or 128 + its signal).
pub fn run(config: &Path, command: &[OsString]) -> Result<i32> {
    // The stack holds descriptors per connection; the program gets the limit as it was
    // (programs that use select(2) count on a soft limit of 1024).
    let child_limit = descriptor_limit();
    if command.is_empty() {
        bail!("ordo run: no command given");
    }
    let preload = preload_library()?;
    let cfg = config::load(config)?;
    let dir = private_dir()?;
    let socket = dir.path.join("attach.sock");
    let name = format!("run{}", std::process::id());
    let (settings, stack) = stack_interface::settings(&cfg, config, Attachers::own())?;
    let attach = || {
        let listener = UnixListener::bind(&socket).with_context(|| format!("binding {}", socket.display()))?;
        // The private directory goes with the interface, and the socket with it.
        Ok(AttachPoint {
            listener,
            files: Vec::new(),
        })
    };
    // A panic in the stack's or the supervisor's thread ends `ordo run` (and so the program,
    // see Program::run), never leaving a program whose tunnel or supervisor is gone: the
    // lifecycle makes every panic end the process.
    let up = Bringup {
        name: &name,
        settings,
        privileges: Privileges::Keep,
        inner: Inner::Stack(StackInner {
            file: &cfg,
            source: config,
            settings: stack,
            attach: Box::new(attach),
        }),
        daemon: false,
    }
    .start()?;
    let peers_ips = cfg.peers.iter().flat_map(|p| p.allowed_ips.iter().copied());
    let program = Program {
        preload,
        socket: socket.clone(),
        routes: stack_interface::routes(&cfg.interface.addresses, peers_ips),
        dns: cfg.interface.dns.clone().map(|(_, d)| d),
        child_limit,
    };
    let status = program.run(command)?;
    // What the program wrote before it ended is still on its way: deliver it first.
    if let Some(service) = up.service {
        service.linger();
    }
    up.device.shutdown("the program ended");
    Ok(status)
}

/// Runs `command` attached to the running stack interface `name` (`ordo up` of an
/// `Inner = stack` file, by this user): its networks as it has them now (the peers' allowed
/// IPs read over UAPI), its `DNS =`. The interface runs on when the program ends.
pub fn run_attached(name: &str, command: &[OsString]) -> Result<i32> {
    crate::daemon::exit_on_panic(None);
    let preload = preload_library()?;
    if let Some((owner, name)) = name.split_once(':') {
        // Another user's interface, which lets this one attach (`AttachUsers =`): its
        // networks as they were when it came up (its UAPI socket is its user's alone).
        let shared = crate::interface::shared::guest_attach_info(owner, name)?;
        let program = Program {
            preload,
            socket: shared.socket,
            routes: stack_interface::routes(&shared.addresses, shared.allowed.into_iter()),
            dns: shared.dns,
            child_limit: None,
        };
        return program.run(command);
    }
    let shared = crate::interface::shared::attach_info(name)?;
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
        child_limit: None,
    };
    program.run(command)
}

/// A program to run with the preload library, and what the library needs to know.
struct Program {
    preload: PathBuf,
    socket: PathBuf,
    routes: Vec<Route>,
    dns: Option<Dns>,
    /// The limit on open descriptors the program starts with, where this process raised its
    /// own.
    child_limit: Option<libc::rlimit>,
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
        // library's getaddrinfo, and every DNS query to another server, by the library or the
        // supervisor); otherwise as the host resolves them.
        let dns_servers = self.dns.as_ref().map(|d| d.servers.clone()).unwrap_or_default();
        match &self.dns {
            Some(dns) if !dns.servers.is_empty() => command.env(ordo_attach::ENV_DNS, dns.format()),
            _ => command.env_remove(ordo_attach::ENV_DNS),
        };
        // Processes the program starts and leaves (a double fork, a daemon) stay this
        // process's descendants instead of going to init: the supervisor may read their
        // memory where Yama's ptrace scope allows descendants only, and they are waited
        // for below.
        // SAFETY: plain prctl.
        if unsafe { libc::prctl(libc::PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) } != 0 {
            return Err(std::io::Error::last_os_error()).context("becoming the program's subreaper");
        }
        // The program ends with this process, however it ends (a panic of ours, SIGKILL):
        // it must never run on unsupervised. Processes it left behind are not signalled,
        // but with the supervisor gone every call the filter stops fails (ENOSYS).
        // SAFETY: getpid cannot fail.
        let parent = unsafe { libc::getpid() };
        let child_limit = self.child_limit;
        // SAFETY: only system calls, between fork and exec.
        unsafe {
            command.pre_exec(move || {
                if let Some(limit) = &child_limit {
                    libc::setrlimit(libc::RLIMIT_NOFILE, limit);
                }
                if libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL, 0, 0, 0) != 0 {
                    return Err(std::io::Error::last_os_error());
                }
                if libc::getppid() != parent {
                    return Err(std::io::Error::from_raw_os_error(libc::ESRCH));
                }
                Ok(())
            })
        };
        // What bypasses the library (static programs, Go, raw system calls) is kept from the
        // kernel's route by a seccomp supervisor (supervise.rs): set up in the child between
        // fork and exec, its listener handed to this process.
        let supervise::Supervised { child, supervisor } =
            supervise::spawn(&mut command, self.routes.clone(), dns_servers, self.socket.clone())
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
        let status = wait_for_all(child.id() as libc::pid_t)?;
        // SAFETY: back to the default dispositions: a Ctrl-C now ends what follows.
        unsafe {
            libc::signal(libc::SIGINT, libc::SIG_DFL);
            libc::signal(libc::SIGQUIT, libc::SIG_DFL);
        }
        Ok(status)
    }
}

/// Waits for the program `main` and every process left under this one (the subreaper's
/// orphans, reaped as they end): they use the tunnel, which ends with this process. Returns
/// the program's exit code (or 128 + its signal).
fn wait_for_all(main: libc::pid_t) -> Result<i32> {
    let mut code = None;
    let mut told = false;
    loop {
        let mut status = 0;
        // Once the program has ended, a look without waiting first: to say why this goes on.
        let flags = if code.is_some() && !told { libc::WNOHANG } else { 0 };
        // SAFETY: waitpid writes the status into `status`.
        let pid = unsafe { libc::waitpid(-1, &mut status, flags) };
        if pid < 0 {
            match std::io::Error::last_os_error().raw_os_error() {
                Some(libc::EINTR) => continue,
                Some(libc::ECHILD) => break,
                _ => return Err(std::io::Error::last_os_error()).context("waiting for the program"),
            }
        }
        if pid == 0 {
            told = true;
            eprintln!(
                "ordo run: the program ended; processes it left behind still use the tunnel, waited for \
                 (Ctrl-C ends ordo run, and their tunnel with it)"
            );
            // SAFETY: the default disposition: a Ctrl-C now ends this process.
            unsafe { libc::signal(libc::SIGINT, libc::SIG_DFL) };
            continue;
        }
        if pid == main {
            let exit = std::process::ExitStatus::from_raw(status);
            code = Some(exit.code().unwrap_or_else(|| 128 + exit.signal().unwrap_or(0)));
        }
    }
    code.context("the program was not among this process's children")
}

/// This process's limit on open descriptors.
fn descriptor_limit() -> Option<libc::rlimit> {
    let mut limit = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: getrlimit fills `limit`.
    (unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut limit) } == 0).then_some(limit)
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
