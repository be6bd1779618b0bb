//! The device: where the data plane is composed with its ports and its threads. Ordo's
//! interface is the plane over a TUN device (`inner::tun`) or Ordo's own TCP/IP stack
//! (`inner::stack`) and kernel UDP sockets (`outer::udp`) or AF_XDP beside them
//! (`outer::xdp`), each chosen at run time (`port::chosen`), in the execution model chosen
//! for the interface (`placement::model`), with the threads of `crate::threads` reading the
//! ports and one thread for the timers and the placement. Everything below knows nothing of
//! the device.

pub mod peers;
pub mod report;

use crate::inner::stack::service::Stack;
use crate::inner::stack::StackPort;
use crate::inner::tun::TunPort;
use crate::outer::udp::UdpPort;
use crate::outer::xdp::port::{Fallback, XdpPort};
use crate::outer::OuterKind;
use crate::placement::model::{Model, Plan};
use crate::plane::stats::Stats;
use crate::plane::DataPlane;
use crate::port::chosen::{ChosenInner, ChosenOuter};
use crate::port::{Counter, InnerPort, OuterPort};
use crate::settings::InterfaceSettings;
use crate::threads::{self, Stop};
use ordo_proto::Interface;
use std::io;
use std::path::PathBuf;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

/// A peer carrying at least this many packets a second counts as active for the detectors.
const ACTIVE_PEER_PPS: f64 = 100.0;

/// The data plane of an Ordo interface, over the ports its settings chose.
pub type KernelPlane = DataPlane<ChosenInner, ChosenOuter>;

pub struct Device {
    pub name: String,
    pub(crate) plane: Arc<KernelPlane>,
    fwmark: Mutex<u32>,
    stop: Arc<Stop>,
    /// The UAPI socket path; the device stops when it disappears (as `wg-quick down` does).
    pub uapi_path: Mutex<Option<PathBuf>>,
    started: Instant,
    /// The plane watching itself: figures per interval and the detectors' warnings.
    pub health: crate::health::Monitor,
    /// Why the outer side is not what was asked for (`Outer = xdp` fell back to udp).
    pub outer_note: Option<String>,
    /// Parts beside the data plane that report figures with the interface's (see
    /// [`Device::add_part`]).
    parts: Mutex<Vec<Part>>,
}

/// What a part beside the data plane counts, read when the interface is reported on.
pub type FigureSource = Box<dyn Fn() -> Vec<Counter> + Send + Sync>;

struct Part {
    name: &'static str,
    figures: FigureSource,
}

impl Device {
    /// Creates the TUN interface and binds the sockets (listen port 0: a free port), with
    /// as many queues as the execution model wants.
    pub fn create(name: &str, config: &InterfaceSettings) -> io::Result<Arc<Device>> {
        let plan = Plan::new(&config.placement).map_err(|e| io::Error::new(io::ErrorKind::InvalidInput, e))?;
        let tun = TunPort::create(name, plan.queues.len())?;
        Device::compose(name, plan, ChosenInner::new(tun), config)
    }

    /// An interface whose inner side is Ordo's own TCP/IP stack: no TUN device, nothing that
    /// needs a privilege. Returns the stack, for its service
    /// (`inner::stack::service::Service::start`); the plane's reader runs it.
    pub fn create_stack(name: &str, config: &InterfaceSettings, mtu: usize) -> io::Result<(Arc<Device>, Arc<Stack>)> {
        let plan = Plan::new(&config.placement).map_err(|e| io::Error::new(io::ErrorKind::InvalidInput, e))?;
        let (port, stack) = StackPort::new(plan.queues.len(), mtu)?;
        Ok((Device::compose(name, plan, ChosenInner::new(port), config)?, stack))
    }

    fn compose(name: &str, plan: Plan, inner: ChosenInner, config: &InterfaceSettings) -> io::Result<Arc<Device>> {
        let udp = UdpPort::bind(0, 0, plan.queues.len())?;
        let mut outer_note = None;
        let outer = match config.outer {
            OuterKind::Udp => ChosenOuter::new(udp),
            OuterKind::Xdp => match XdpPort::open(udp, &config.xdp_interfaces, config.xdp_mode, plan.queues.len()) {
                Ok(x) => ChosenOuter::new(x),
                Err(Fallback { udp, reason }) => {
                    let note = format!("Outer = xdp unavailable, running on udp: {reason}");
                    // Said now, to whoever started the interface, and again in the log.
                    log::warn!("{note}");
                    outer_note = Some(note);
                    ChosenOuter::new(udp)
                }
            },
        };
        let now = Instant::now();
        let mut core = Interface::new(now);
        core.set_mtu(inner.mtu().unwrap_or(1420));
        let plan_cpus = plan.cpus.clone();
        Ok(Arc::new(Device {
            name: name.to_string(),
            plane: DataPlane::new(core, inner, outer, plan),
            fwmark: Mutex::new(0),
            stop: Arc::new(Stop::default()),
            uapi_path: Mutex::new(None),
            started: now,
            health: crate::health::Monitor::new(plan_cpus),
            outer_note,
            parts: Mutex::new(Vec::new()),
        }))
    }

    /// Starts the data plane: the pools, the threads its model asks for, the timers (which
    /// also stop the device when its UAPI socket is removed).
    pub fn start(self: &Arc<Self>) -> io::Result<()> {
        self.plane.start();
        let d = Arc::downgrade(self);
        let housekeeping = move || {
            let d = d.upgrade()?;
            d.health.observe(&d.plane.stats, || {
                // Measured by the placement each interval.
                let planes = d.plane.peer_planes();
                planes.iter().filter(|p| p.load().pps >= ACTIVE_PEER_PPS).count()
            });
            let path = d.uapi_path.lock().unwrap_or_else(|p| p.into_inner()).clone();
            (path.is_some_and(|p| !p.exists())).then(|| "UAPI socket was removed".to_string())
        };
        threads::start(&self.plane, &self.stop, housekeeping)?;
        Ok(())
    }

    pub fn model(&self) -> Model {
        self.plane.plan.model
    }

    pub fn core(&self) -> MutexGuard<'_, Interface> {
        self.plane.core()
    }

    pub fn stats(&self) -> &Stats {
        &self.plane.stats
    }

    /// Adds a part beside the data plane (the fleet's agent) whose figures `ordo show`, the
    /// metrics and the report show with the interface's: a part above the device reports
    /// through it without the device knowing the part.
    pub fn add_part(&self, name: &'static str, figures: FigureSource) {
        self.parts
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .push(Part { name, figures });
    }

    /// Each part's figures, by part.
    pub fn part_figures(&self) -> Vec<(&'static str, Vec<Counter>)> {
        let parts = self.parts.lock().unwrap_or_else(|p| p.into_inner());
        parts.iter().map(|p| (p.name, (p.figures)())).collect()
    }

    /// What the two ports count about themselves (errors, drops, offloads in use).
    pub fn port_counters(&self) -> Vec<Counter> {
        let mut c = self.plane.outer.counters();
        c.extend(self.plane.inner.counters());
        c
    }

    pub fn workers(&self) -> usize {
        self.plane.workers()
    }

    pub fn listen_port(&self) -> u16 {
        self.plane.outer.listen_port()
    }

    /// Which outer path runs (`udp`, or `xdp` with its interfaces and modes).
    pub fn outer_path(&self) -> String {
        self.plane.outer.describe()
    }

    pub fn fwmark(&self) -> u32 {
        *self.fwmark.lock().unwrap_or_else(|p| p.into_inner())
    }

    pub fn uptime(&self) -> Duration {
        self.started.elapsed()
    }

    /// Rebinds the sockets on `port` (0: any free port), marked `mark` (None: as now). On
    /// failure the old sockets stay, with their mark.
    pub fn set_listen_port(&self, port: u16, mark: Option<u32>) -> io::Result<()> {
        let mut fwmark = self.fwmark.lock().unwrap_or_else(|p| p.into_inner());
        let mark = mark.unwrap_or(*fwmark);
        if port != 0 && port == self.listen_port() {
            // No new sockets: the mark alone, if it changes.
            if mark != *fwmark {
                self.plane.outer.set_fwmark(mark, *fwmark)?;
            }
        } else {
            self.plane.outer.rebind(port, mark)?;
        }
        *fwmark = mark;
        Ok(())
    }

    /// Marks every socket `mark`, or, on failure, leaves every one as it was.
    pub fn set_fwmark(&self, mark: u32) -> io::Result<()> {
        let mut fwmark = self.fwmark.lock().unwrap_or_else(|p| p.into_inner());
        self.plane.outer.set_fwmark(mark, *fwmark)?;
        *fwmark = mark;
        Ok(())
    }

    pub fn stopped(&self) -> bool {
        self.stop.is_requested()
    }

    /// Asks every thread to finish; [`Self::wait`] returns afterwards.
    pub fn shutdown(&self, why: &str) {
        self.stop.request(why);
        self.wake_threads();
    }

    /// Wakes the threads that wait on the ports or the pools, so that they see the stop.
    fn wake_threads(&self) {
        self.plane.inner.shutdown();
        self.plane.outer.shutdown();
        self.plane.stop();
    }

    /// Blocks until the device is asked to stop (a signal, its UAPI socket removed, its TUN
    /// device gone); says why, and wakes every thread to end.
    pub fn wait(&self) {
        self.stop.wait();
        let why = self.stop.reason().unwrap_or_default();
        log::info!("shutting down: {why}");
        self.wake_threads();
    }
}
