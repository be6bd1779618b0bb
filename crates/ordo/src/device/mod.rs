//! The device: the protocol core wrapped with a TUN interface, UDP sockets and threads.
//!
//! The data plane is the pool model of [`pipeline`] over the kernel's I/O ([`kernel`]):
//! dispatch threads read the TUN device and the sockets in batches, a fixed pool of workers
//! does the crypto, and per-peer [`lane`]s deliver in order. One thread runs the timers. The
//! protocol core sits behind one lock that is taken once per batch and never held during
//! crypto.

pub mod batch;
pub mod kernel;
pub mod lane;
pub mod offload;
pub mod pipeline;
pub mod stats;
pub mod tun;
pub mod udp;

use kernel::KernelIo;
use ordo_proto::Interface;
use pipeline::{DataPlane, IoCounters, Job};
use std::io;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard, RwLock};
use std::thread;
use std::time::{Duration, Instant, SystemTime};
use tun::Tun;
use udp::Sockets;

/// Largest datagram or packet handled.
pub(crate) const MAX_PACKET: usize = 65535;
/// Longest the timer thread sleeps, so housekeeping (MTU, socket file) runs regularly.
const HOUSEKEEPING_INTERVAL: Duration = Duration::from_millis(250);

pub struct Device {
    pub name: String,
    pub(crate) plane: Arc<DataPlane<KernelIo>>,
    fwmark: Mutex<u32>,
    /// Bumped when sockets are replaced; a receive thread of an older generation exits.
    pub(crate) socket_generation: AtomicU64,
    stop: AtomicBool,
    stop_signal: (Mutex<bool>, Condvar),
    /// The UAPI socket path; the device stops when it disappears (as `wg-quick down` does).
    pub uapi_path: Mutex<Option<PathBuf>>,
    jobs: Mutex<Option<crossbeam_channel::Sender<Job>>>,
    started: Instant,
}

impl Device {
    /// Creates the TUN interface and binds the sockets (listen port 0: a free port).
    /// `workers`: crypto threads in the pool; 0 means one per available core.
    pub fn create(name: &str, workers: usize) -> io::Result<Arc<Device>> {
        let tun = Tun::create(name)?;
        // 1420 leaves room for the outer IPv6 + UDP + WireGuard headers on a 1500 link.
        let _ = tun.set_mtu(1420);
        let sockets = Sockets::bind(0, 0)?;
        let now = Instant::now();
        let mut core = Interface::new(now);
        core.set_mtu(tun.mtu().unwrap_or(1420) as usize);
        let io = KernelIo {
            tun,
            sockets: RwLock::new(Arc::new(sockets)),
        };
        Ok(Arc::new(Device {
            name: name.to_string(),
            plane: DataPlane::new(core, io, workers),
            fwmark: Mutex::new(0),
            socket_generation: AtomicU64::new(0),
            stop: AtomicBool::new(false),
            stop_signal: (Mutex::new(false), Condvar::new()),
            uapi_path: Mutex::new(None),
            jobs: Mutex::new(None),
            started: now,
        }))
    }

    /// Starts the data plane: the worker pool, the read and receive stages, the timers.
    pub fn start(self: &Arc<Self>) {
        let jobs = self.plane.start_workers();
        *self.jobs.lock().unwrap_or_else(|p| p.into_inner()) = Some(jobs.clone());
        let d = self.clone();
        thread::Builder::new()
            .name("ordo-read".into())
            .spawn(move || kernel::read_loop(d, jobs))
            .expect("spawn");
        let d = self.clone();
        thread::Builder::new()
            .name("ordo-timers".into())
            .spawn(move || d.timer_loop())
            .expect("spawn");
        self.spawn_receivers();
    }

    fn spawn_receivers(self: &Arc<Self>) {
        let Some(jobs) = self.jobs.lock().unwrap_or_else(|p| p.into_inner()).clone() else {
            return;
        };
        let generation = self.socket_generation.load(Ordering::SeqCst);
        let families = if self.sockets().v6.is_some() { 2 } else { 1 };
        for i in 0..families {
            let (d, jobs) = (self.clone(), jobs.clone());
            thread::Builder::new()
                .name(format!("ordo-receive{i}"))
                .spawn(move || kernel::receive_loop(d, i, generation, jobs))
                .expect("spawn");
        }
    }

    pub fn core(&self) -> MutexGuard<'_, Interface> {
        self.plane.core()
    }

    pub fn stats(&self) -> &stats::Stats {
        &self.plane.stats
    }

    pub fn counters(&self) -> &IoCounters {
        &self.plane.counters
    }

    pub fn tun(&self) -> &Tun {
        &self.plane.io.tun
    }

    pub fn workers(&self) -> usize {
        self.plane.workers()
    }

    pub fn sockets(&self) -> Arc<Sockets> {
        self.plane.io.sockets()
    }

    pub fn listen_port(&self) -> u16 {
        self.sockets().port
    }

    pub fn fwmark(&self) -> u32 {
        *self.fwmark.lock().unwrap_or_else(|p| p.into_inner())
    }

    pub fn uptime(&self) -> Duration {
        self.started.elapsed()
    }

    /// Rebinds the sockets on `port` (0: any free port). On failure the old sockets stay.
    pub fn set_listen_port(self: &Arc<Self>, port: u16) -> io::Result<()> {
        let current = self.sockets();
        if port == current.port && port != 0 {
            return Ok(());
        }
        let fresh = Arc::new(Sockets::bind(port, self.fwmark())?);
        *self.plane.io.sockets.write().unwrap_or_else(|p| p.into_inner()) = fresh;
        self.socket_generation.fetch_add(1, Ordering::SeqCst);
        current.shutdown();
        if !self.stopped() {
            self.spawn_receivers();
        }
        Ok(())
    }

    pub fn set_fwmark(&self, mark: u32) -> io::Result<()> {
        self.sockets().set_fwmark(mark)?;
        *self.fwmark.lock().unwrap_or_else(|p| p.into_inner()) = mark;
        Ok(())
    }

    pub fn stopped(&self) -> bool {
        self.stop.load(Ordering::SeqCst)
    }

    /// Asks every thread to finish; [`Self::wait`] returns afterwards.
    pub fn shutdown(&self, why: &str) {
        if self.stop.swap(true, Ordering::SeqCst) {
            return;
        }
        eprintln!("ordo[{}]: shutting down: {why}", self.name);
        self.sockets().shutdown();
        let (m, c) = &self.stop_signal;
        *m.lock().unwrap_or_else(|p| p.into_inner()) = true;
        c.notify_all();
    }

    /// Blocks until [`Self::shutdown`] is called.
    pub fn wait(&self) {
        let (m, c) = &self.stop_signal;
        let mut stopped = m.lock().unwrap_or_else(|p| p.into_inner());
        while !*stopped {
            stopped = c.wait(stopped).unwrap_or_else(|p| p.into_inner());
        }
    }

    /// Timers, plus housekeeping: follow the MTU, stop when the UAPI socket is removed.
    fn timer_loop(self: Arc<Self>) {
        let (m, c) = &self.stop_signal;
        loop {
            let transmits = {
                let mut core = self.plane.core();
                core.tick(Instant::now(), SystemTime::now());
                if let Ok(mtu) = self.plane.io.tun.mtu() {
                    core.set_mtu(mtu as usize);
                }
                self.plane.forget_removed_peers(&core);
                pipeline::drain(&mut core)
            };
            self.plane.send_transmits(transmits);
            if let Some(p) = self.uapi_path.lock().unwrap_or_else(|p| p.into_inner()).as_ref() {
                if !p.exists() {
                    self.shutdown("UAPI socket was removed");
                }
            }
            let wait = {
                let core = self.plane.core();
                core.next_deadline()
                    .map(|d| d.saturating_duration_since(Instant::now()))
                    .unwrap_or(HOUSEKEEPING_INTERVAL)
                    .min(HOUSEKEEPING_INTERVAL)
            };
            let stopped = m.lock().unwrap_or_else(|p| p.into_inner());
            if *stopped {
                return;
            }
            let (stopped, _) = c.wait_timeout(stopped, wait).unwrap_or_else(|p| p.into_inner());
            if *stopped {
                return;
            }
        }
    }
}

/// IPv4-mapped IPv6 sources become plain IPv4, so an endpoint has one spelling.
pub(crate) fn canonical(a: SocketAddr) -> SocketAddr {
    match a {
        SocketAddr::V6(v6) => match v6.ip().to_ipv4_mapped() {
            Some(v4) => SocketAddr::new(v4.into(), v6.port()),
            None => a,
        },
        v4 => v4,
    }
}
