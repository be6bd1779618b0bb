//! The one order in which an interface comes up and goes down, whatever its inner and outer
//! sides: a TUN daemon (`ordo IFNAME`), a shared stack interface (`ordo up` of an
//! `Inner = stack` file) and `ordo run`'s private interface all come up here.
//!
//! The order is the point. Everything that needs a privilege is made first: the device (a
//! TUN device; the UDP sockets; AF_XDP's program and sockets, which need CAP_BPF and
//! CAP_NET_ADMIN), the UAPI socket, the stack's attach socket, the metrics socket (a port
//! below 1024). Then the privileges go, while this is the process's only thread
//! (capabilities are per thread). Only then do threads start: the data plane's, the stack's
//! service, the UAPI's, the metrics endpoint's, the signals'. Readiness is reported last,
//! when the UAPI socket answers.

use crate::config::{self, wgquick::WgQuickConfig};
use crate::daemon;
use crate::daemon::janitor::{self, FileIdentity};
use crate::daemon::privileges::{self, Privileges};
use crate::device::Device;
use crate::inner::stack::service::Service;
use crate::inner::stack::StackSettings;
use crate::settings::InterfaceSettings;
use crate::uapi;
use anyhow::{Context, Result};
use std::os::unix::net::UnixListener;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::sync::Arc;

/// Test hook: behave as under load from the start, so the cookie exchange can be tested
/// without generating a real handshake flood.
const UNDER_LOAD_ENV: &str = "ORDO_TEST_UNDER_LOAD";
/// Test hook: renew the sessions Ordo initiated after this many seconds instead of
/// REKEY_AFTER_TIME's 120, so that a test sees a rekey with a real peer in seconds.
const REKEY_AFTER_ENV: &str = "ORDO_TEST_REKEY_AFTER";

/// An interface to bring up.
pub struct Bringup<'a> {
    pub name: &'a str,
    pub settings: InterfaceSettings,
    pub privileges: Privileges,
    pub inner: Inner<'a>,
    /// A daemon: it logs under its name, serves a UAPI socket, ends on a signal and reports
    /// readiness to whoever started it. `ordo run`'s private interface does none of these.
    pub daemon: bool,
}

/// The inner side to bring up.
pub enum Inner<'a> {
    /// A TUN device named after the interface, configured over its UAPI socket afterwards.
    Tun,
    /// Ordo's TCP/IP stack, configured from a wg-quick file before its threads start.
    Stack(StackInner<'a>),
}

/// A stack interface's parts.
pub struct StackInner<'a> {
    /// The wg-quick file (its peers and keys) and where it was read from, for errors.
    pub file: &'a WgQuickConfig,
    pub source: &'a Path,
    pub settings: StackSettings,
    /// Makes the attach socket, called once the UAPI socket says the name is this
    /// interface's (a daemon), or at once (`ordo run`).
    pub attach: Box<dyn FnOnce() -> Result<AttachPoint> + 'a>,
}

/// Where programs attach to a stack interface.
pub struct AttachPoint {
    pub listener: UnixListener,
    /// The files that go with it, removed when the interface ends (the socket among them).
    pub files: Vec<PathBuf>,
}

/// An interface that is up.
pub struct Up {
    pub device: Arc<Device>,
    /// The stack's attach service (stack interfaces only).
    pub service: Option<Service>,
    /// The UAPI socket, removed when the interface ends if it is still ours.
    uapi: Option<(PathBuf, Option<FileIdentity>)>,
    files: Cleanup,
    /// The fleet's return-route table, emptied of the interface's return routes when it ends
    /// (before its device goes, so that the routing daemon hears of it).
    return_routes: Option<u32>,
    /// Held until the interface ends: their closing tells the janitors to remove the files.
    _janitors: Vec<std::io::PipeWriter>,
}

impl Bringup<'_> {
    /// Brings the interface up, in the order the module's documentation gives.
    pub fn start(self) -> Result<Up> {
        let name = self.name;
        let become_user = self.user_to_become().map(str::to_string);
        if self.daemon {
            crate::logging::init(name, log::LevelFilter::Info);
        }
        if let Err(e) = daemon::raise_descriptor_limit() {
            log::warn!("cannot raise the limit on open descriptors: {e}");
        }
        let log = if self.daemon {
            daemon::open_detached_log()?
        } else {
            None
        };

        // What needs a privilege: the device and its sockets, then the sockets that answer.
        let (device, stack) = match &self.inner {
            Inner::Tun => {
                let device = Device::create(name, &self.settings);
                (device.with_context(|| format!("cannot create interface {name}"))?, None)
            }
            Inner::Stack(s) => {
                let (device, stack) = Device::create_stack(name, &self.settings, s.settings.mtu)
                    .context("creating the stack interface")?;
                (device, Some(stack))
            }
        };
        apply_test_hooks(&device);
        let uapi = if self.daemon {
            let (listener, path) =
                uapi::listen(name).with_context(|| format!("cannot create the UAPI socket for {name}"))?;
            *device.uapi_path.lock().unwrap_or_else(|p| p.into_inner()) = Some(path.clone());
            // Taken now, before anything else could replace the socket.
            let identity = FileIdentity::of(&path).ok();
            Some((listener, path, identity))
        } else {
            None
        };
        // Until the interface is up, the files it made go if it fails; the UAPI socket then
        // goes by the rule of `Up::wait`.
        let mut files = Cleanup(uapi.iter().map(|(_, path, _)| path.clone()).collect());
        let (stack_parts, attach) = match self.inner {
            Inner::Tun => (None, None),
            Inner::Stack(s) => {
                let point = (s.attach)()?;
                files.0.extend(point.files);
                (Some((s.file, s.source, s.settings)), Some(point.listener))
            }
        };
        daemon::exit_on_panic(uapi.as_ref().map(|(_, path, _)| path.clone()));
        let metrics = (self.settings.metrics)
            .map(crate::metrics::server::Endpoint::bind)
            .transpose()?;
        // Its TLS files are read now: the user the daemon becomes may not read them.
        // Any fleet setting without `Fleet =` is refused there, not ignored.
        let fleet = if self.settings.fleet != crate::settings::fleet::FleetSettings::default() {
            Some(crate::fleet::agent::Agent::prepare(&self.settings.fleet, name)?)
        } else {
            None
        };
        if self.daemon {
            // Not `ordo run`: its supervisor takes the filter's listener from the program
            // between fork and exec, which a non-dumpable parent's child would refuse it.
            privileges::not_dumpable()?;
        }

        // The privileges go while this is the only thread.
        let mut janitors = Vec::new();
        if let Some(user) = &become_user {
            for file in &files.0 {
                let stderr = match &log {
                    Some(f) => f.try_clone()?.into(),
                    None => Stdio::inherit(),
                };
                match janitor::spawn(file, stderr) {
                    Ok(pipe) => janitors.push(pipe),
                    Err(e) => log::warn!("{e:#}: {} may outlive the interface", file.display()),
                }
            }
            privileges::ensure_alone()?;
            privileges::drop_privileges(user, self.settings.placement.delivery_fifo)
                .context("cannot drop privileges (use --keep-privileges to run without dropping)")?;
        }

        // Threads, from here on.
        if let Some((file, source, _)) = &stack_parts {
            configure_from_file(&device, file, source)?;
        }
        device.start().context("cannot start the data plane")?;
        let service = match (stack, stack_parts, attach) {
            (Some(stack), Some((_, _, settings)), Some(listener)) => {
                Some(Service::start(stack, &settings, listener).context("starting the stack")?)
            }
            _ => None,
        };
        let metrics_address = metrics.as_ref().map(|m| m.address());
        if let Some(m) = metrics {
            m.serve(device.clone())?;
        }
        if let Some(agent) = fleet {
            agent.start(device.clone())?;
        }
        let uapi = match uapi {
            Some((listener, path, identity)) => {
                files.0.retain(|f| *f != path);
                let d = device.clone();
                std::thread::Builder::new()
                    .name("ordo-uapi-listen".into())
                    .spawn(move || uapi::serve(d, listener))?;
                Some((path, identity))
            }
            None => None,
        };
        if self.daemon {
            let d = device.clone();
            let mut signals = signal_hook::iterator::Signals::new([libc::SIGINT, libc::SIGTERM, libc::SIGHUP])?;
            std::thread::Builder::new().name("ordo-signals".into()).spawn(move || {
                if let Some(s) = signals.forever().next() {
                    d.shutdown(&format!("signal {s}"));
                }
            })?;
            daemon::report_ready(log)?;
            log_up(&device, service.is_some(), metrics_address);
        }
        Ok(Up {
            device,
            service,
            uapi,
            files,
            return_routes: self.settings.fleet.name.as_ref().and(self.settings.fleet.route_table),
            _janitors: janitors,
        })
    }

    /// The user to become after setup, if privileges are to be dropped: always for a TUN
    /// interface (its capabilities are more than it needs), and for a stack interface started
    /// as root (it needs none; started by another user, it has none to drop).
    fn user_to_become(&self) -> Option<&str> {
        let stack = matches!(self.inner, Inner::Stack(_));
        match &self.privileges {
            Privileges::Drop { user } if !stack || nix::unistd::geteuid().is_root() => Some(user),
            _ => None,
        }
    }
}

impl Up {
    /// Runs until the interface is asked to stop (a signal, its UAPI socket removed, its
    /// TUN device gone), then ends it and removes its files.
    pub fn wait(self) {
        self.device.wait();
        drop(self.service);
        if let Some(table) = self.return_routes {
            if let Err(e) = crate::fleet::routes::remove_all(&self.device.name, table) {
                log::warn!("fleet: removing the return routes from table {table}: {e:#}");
            }
        }
        // Fails once privileges are dropped: the janitor removes it as this process ends.
        // Not if it is another daemon's by now (ours was removed and the interface started
        // again).
        if let Some((path, Some(identity))) = &self.uapi {
            let _ = janitor::remove_if_same(path, *identity);
        }
        drop(self.files);
    }
}

/// The test hooks of the environment, said loudly in the log.
fn apply_test_hooks(device: &Device) {
    if std::env::var_os(UNDER_LOAD_ENV).is_some() {
        log::warn!("{UNDER_LOAD_ENV} is set: every handshake without a valid mac2 gets a cookie reply");
        device.core().force_under_load = true;
    }
    if let Some(secs) = std::env::var(REKEY_AFTER_ENV).ok().and_then(|v| v.parse::<u64>().ok()) {
        log::warn!("{REKEY_AFTER_ENV} is set: sessions Ordo initiated are renewed after {secs} s");
        device.core().rekey_after_time = std::time::Duration::from_secs(secs);
    }
}

/// Applies a wg-quick file's interface key and peers, as a UAPI `set` would: all or nothing.
fn configure_from_file(device: &Arc<Device>, file: &WgQuickConfig, source: &Path) -> Result<()> {
    let request = config::set_request(file, None)?;
    // The request's lines after `set=1`, up to the blank line that ends it.
    uapi::protocol::parse_set(request.as_str().lines().skip(1).take_while(|l| !l.is_empty()))
        .and_then(|p| uapi::apply(device, p))
        .map_err(|e| anyhow::anyhow!("{}: {}", source.display(), e.message))
}

/// The line that says the interface is up, and how.
fn log_up(device: &Device, stack: bool, metrics: Option<std::net::SocketAddr>) {
    let inner = if stack {
        format!(", inner side Ordo's stack (attach: ordo run --attach {})", device.name)
    } else {
        String::new()
    };
    log::info!(
        "up, listening on UDP port {}, model {}, {} queue(s), {} crypto worker(s), outer path {}{inner}",
        device.listen_port(),
        device.model(),
        device.plane.plan.queues.len(),
        device.workers(),
        device.outer_path()
    );
    if let Some(a) = metrics {
        log::info!("metrics at http://{a}/metrics");
    }
    if let Some(note) = &device.outer_note {
        log::warn!("{note}");
    }
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
