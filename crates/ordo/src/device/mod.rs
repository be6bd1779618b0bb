//! The device: where the data plane is composed with its ports and its threads. Ordo's
//! interface is the plane over a TUN device (`inner::tun`) and kernel UDP sockets
//! (`outer::udp`), in the execution model chosen for the interface (`placement::model`), with
//! the threads of `crate::threads` reading the ports and one thread for the timers and the
//! placement. Everything below knows nothing of the device; the device alone knows which
//! backends it put together, for the controls only they have (the listen port, the fwmark).

use crate::host::topology;
use crate::inner::tun::TunPort;
use crate::outer::udp::UdpPort;
use crate::placement::model::{Model, Plan, PlaneConfig};
use crate::placement::INTERVAL as PLACEMENT_INTERVAL;
use crate::plane::stats::Stats;
use crate::plane::DataPlane;
use crate::port::{Counter, InnerPort, OuterPort};
use crate::threads::{self, Exit, Stop};
use ordo_proto::Interface;
use std::io;
use std::path::PathBuf;
use std::sync::{Arc, Mutex, MutexGuard};
use std::thread;
use std::time::{Duration, Instant, SystemTime};

/// Longest the timer thread sleeps, so housekeeping (MTU, socket file) runs regularly.
const HOUSEKEEPING_INTERVAL: Duration = Duration::from_millis(250);

/// The data plane of an Ordo interface.
pub type KernelPlane = DataPlane<TunPort, UdpPort>;

pub struct Device {
    pub name: String,
    pub(crate) plane: Arc<KernelPlane>,
    fwmark: Mutex<u32>,
    stop: Arc<Stop>,
    /// The UAPI socket path; the device stops when it disappears (as `wg-quick down` does).
    pub uapi_path: Mutex<Option<PathBuf>>,
    started: Instant,
}

impl Device {
    /// Creates the TUN interface and binds the sockets (listen port 0: a free port), with
    /// as many queues as the execution model wants.
    pub fn create(name: &str, config: &PlaneConfig) -> io::Result<Arc<Device>> {
        let plan = Plan::new(config).map_err(|e| io::Error::new(io::ErrorKind::InvalidInput, e))?;
        let queues = plan.queues.len();
        let tun = TunPort::create(name, queues)?;
        let udp = UdpPort::bind(0, 0, queues)?;
        let now = Instant::now();
        let mut core = Interface::new(now);
        core.set_mtu(tun.mtu().unwrap_or(1420));
        Ok(Arc::new(Device {
            name: name.to_string(),
            plane: DataPlane::new(core, tun, udp, plan),
            fwmark: Mutex::new(0),
            stop: Arc::new(Stop::default()),
            uapi_path: Mutex::new(None),
            started: now,
        }))
    }

    /// Starts the data plane: the pools, the queues or the read and receive stages, the
    /// timers.
    pub fn start(self: &Arc<Self>) {
        self.plane.start();
        let plan = &self.plane.plan;
        if plan.model.has_queues() {
            for (q, &cpu) in plan.queues.iter().enumerate() {
                self.spawn_io(format!("ordo-queue{q}"), vec![cpu], move |plane, stop| {
                    threads::queue_loop(plane, q, stop)
                });
            }
        } else {
            let io_cpus = if plan.explicit {
                plan.io_cpus.clone()
            } else {
                Vec::new()
            };
            self.spawn_io("ordo-read".into(), io_cpus.clone(), threads::read_loop);
            // One receive thread per outer half (address family): each follows the port to
            // new sockets when the listen port changes.
            for (i, rx) in self.plane.outer.receivers(0).into_iter().enumerate() {
                let name = format!("receive{i}");
                self.spawn_io(format!("ordo-{name}"), io_cpus.clone(), move |plane, stop| {
                    threads::receive_loop(plane, rx, &name, stop)
                });
            }
        }
        let d = self.clone();
        thread::Builder::new()
            .name("ordo-timers".into())
            .spawn(move || d.timer_loop())
            .expect("spawn");
    }

    /// Spawns an I/O thread on `cpus` (none: wherever the scheduler puts it); when the inner
    /// side is gone the device shuts down.
    fn spawn_io(
        self: &Arc<Self>,
        name: String,
        cpus: Vec<usize>,
        body: impl FnOnce(&Arc<KernelPlane>, &Stop) -> Exit + Send + 'static,
    ) {
        let d = self.clone();
        thread::Builder::new()
            .name(name)
            .spawn(move || {
                if !cpus.is_empty() {
                    pin_io(&cpus);
                }
                if let Exit::InnerGone(e) = body(&d.plane, &d.stop) {
                    d.shutdown(&format!("TUN device {} is gone ({e})", d.plane.inner.name()));
                }
            })
            .expect("spawn");
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

    pub fn fwmark(&self) -> u32 {
        *self.fwmark.lock().unwrap_or_else(|p| p.into_inner())
    }

    pub fn uptime(&self) -> Duration {
        self.started.elapsed()
    }

    /// Rebinds the sockets on `port` (0: any free port). On failure the old sockets stay.
    pub fn set_listen_port(&self, port: u16) -> io::Result<()> {
        self.plane.outer.rebind(port, self.fwmark())
    }

    pub fn set_fwmark(&self, mark: u32) -> io::Result<()> {
        self.plane.outer.set_fwmark(mark)?;
        *self.fwmark.lock().unwrap_or_else(|p| p.into_inner()) = mark;
        Ok(())
    }

    pub fn stopped(&self) -> bool {
        self.stop.is_requested()
    }

    /// Asks every thread to finish; [`Self::wait`] returns afterwards.
    pub fn shutdown(&self, why: &str) {
        if !self.stop.request() {
            return;
        }
        eprintln!("ordo[{}]: shutting down: {why}", self.name);
        self.plane.outer.shutdown();
        self.plane.stop();
    }

    /// Blocks until [`Self::shutdown`] is called.
    pub fn wait(&self) {
        self.stop.wait();
    }

    /// Timers, plus housekeeping: follow the MTU, place peers by load, stop when the UAPI
    /// socket is removed.
    fn timer_loop(self: Arc<Self>) {
        let mut last_placement = Instant::now();
        loop {
            self.plane.tick(Instant::now(), SystemTime::now());
            if last_placement.elapsed() >= PLACEMENT_INTERVAL {
                last_placement = Instant::now();
                let transmits = self.plane.rebalance(last_placement, SystemTime::now());
                self.plane.send_transmits(0, transmits);
            }
            if let Some(p) = self.uapi_path.lock().unwrap_or_else(|p| p.into_inner()).as_ref() {
                if !p.exists() {
                    self.shutdown("UAPI socket was removed");
                }
            }
            let wait = (self.plane.until_next_deadline())
                .unwrap_or(HOUSEKEEPING_INTERVAL)
                .min(HOUSEKEEPING_INTERVAL);
            if self.stop.wait_timeout(wait) {
                return;
            }
        }
    }
}

fn pin_io(cpus: &[usize]) {
    if let Err(e) = topology::pin_current_thread(cpus) {
        eprintln!(
            "ordo: cannot pin an I/O thread to CPUs {}: {e}",
            topology::format_cpu_list(cpus)
        );
    }
}
