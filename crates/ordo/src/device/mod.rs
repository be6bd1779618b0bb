//! The device: the protocol core wrapped with a TUN interface, UDP sockets and threads.
//!
//! The data plane is the pool model of [`pipeline`]: dispatch threads read the TUN device and
//! the sockets in batches, a fixed pool of workers does the crypto, and per-peer [`lane`]s
//! deliver in order. One thread runs the timers. The protocol core sits behind one lock that
//! is taken once per batch and never held during crypto.

pub mod batch;
pub mod lane;
pub mod offload;
pub mod pipeline;
pub mod stats;
pub mod tun;
pub mod udp;

use ordo_proto::{Interface, PeerId, Transmit};
use pipeline::{Job, PeerLanes};
use std::collections::HashMap;
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
/// Work items waiting for a worker; a full queue makes the dispatchers wait, so the kernel's
/// socket and TUN queues absorb (and count) the excess instead of our memory. A work item is
/// at most one receive batch (32 receives of up to 64 KB with GRO: 2 MB), so this bounds the
/// queue at about 128 MB in the worst case, and is still 32 batches per worker on 2 cores.
const JOB_QUEUE: usize = 64;

/// Errors of the I/O layer, counted beside the core's drop reasons.
#[derive(Default)]
pub struct IoCounters {
    pub tun_write_errors: AtomicU64,
    pub udp_send_errors: AtomicU64,
    /// Writes to the TUN device, and packets that went in coalesced ones.
    pub tun_writes: AtomicU64,
    pub tun_coalesced_packets: AtomicU64,
}

pub struct Device {
    pub name: String,
    core: Mutex<Interface>,
    pub(crate) tun: Tun,
    sockets: RwLock<Arc<Sockets>>,
    fwmark: Mutex<u32>,
    /// Bumped when sockets are replaced; a receive thread of an older generation exits.
    pub(crate) socket_generation: AtomicU64,
    stop: AtomicBool,
    stop_signal: (Mutex<bool>, Condvar),
    /// The UAPI socket path; the device stops when it disappears (as `wg-quick down` does).
    pub uapi_path: Mutex<Option<PathBuf>>,
    pub io: IoCounters,
    pub stats: stats::Stats,
    lanes: Mutex<HashMap<PeerId, Arc<PeerLanes>>>,
    jobs: Mutex<Option<crossbeam_channel::Sender<Job>>>,
    workers: usize,
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
        let workers = if workers == 0 {
            thread::available_parallelism().map(|n| n.get()).unwrap_or(1)
        } else {
            workers
        };
        Ok(Arc::new(Device {
            name: name.to_string(),
            core: Mutex::new(core),
            tun,
            sockets: RwLock::new(Arc::new(sockets)),
            fwmark: Mutex::new(0),
            socket_generation: AtomicU64::new(0),
            stop: AtomicBool::new(false),
            stop_signal: (Mutex::new(false), Condvar::new()),
            uapi_path: Mutex::new(None),
            io: IoCounters::default(),
            stats: stats::Stats::default(),
            lanes: Mutex::new(HashMap::new()),
            jobs: Mutex::new(None),
            workers,
            started: now,
        }))
    }

    /// Starts the data plane: the worker pool, the read and receive stages, the timers.
    pub fn start(self: &Arc<Self>) {
        let (tx, rx) = crossbeam_channel::bounded(JOB_QUEUE);
        for i in 0..self.workers {
            let (d, rx) = (self.clone(), rx.clone());
            thread::Builder::new()
                .name(format!("ordo-worker{i}"))
                .spawn(move || pipeline::worker(d, rx, format!("worker{i}")))
                .expect("spawn");
        }
        *self.jobs.lock().unwrap_or_else(|p| p.into_inner()) = Some(tx.clone());
        let d = self.clone();
        thread::Builder::new()
            .name("ordo-read".into())
            .spawn(move || pipeline::read_loop(d, tx))
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
                .spawn(move || pipeline::receive_loop(d, i, generation, jobs))
                .expect("spawn");
        }
    }

    /// The lanes of a peer, created on first use.
    pub(crate) fn lanes(&self, peer: PeerId) -> Arc<PeerLanes> {
        self.lanes
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .entry(peer)
            .or_default()
            .clone()
    }

    pub fn workers(&self) -> usize {
        self.workers
    }
    pub fn core(&self) -> MutexGuard<'_, Interface> {
        self.core.lock().unwrap_or_else(|p| p.into_inner())
    }

    pub fn sockets(&self) -> Arc<Sockets> {
        self.sockets.read().unwrap_or_else(|p| p.into_inner()).clone()
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
        *self.sockets.write().unwrap_or_else(|p| p.into_inner()) = fresh;
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

    pub(crate) fn send_transmits(&self, transmits: Vec<Transmit>) {
        if transmits.is_empty() {
            return;
        }
        let sockets = self.sockets();
        for t in transmits {
            if sockets.send_to(&t.payload, t.to).is_err() {
                self.io.udp_send_errors.fetch_add(1, Ordering::Relaxed);
            }
        }
    }

    pub(crate) fn drain(core: &mut Interface) -> Vec<Transmit> {
        std::iter::from_fn(|| core.poll_transmit()).collect()
    }

    /// Timers, plus housekeeping: follow the MTU, stop when the UAPI socket is removed.
    fn timer_loop(self: Arc<Self>) {
        let (m, c) = &self.stop_signal;
        loop {
            let transmits = {
                let mut core = self.core();
                core.tick(Instant::now(), SystemTime::now());
                if let Ok(mtu) = self.tun.mtu() {
                    core.set_mtu(mtu as usize);
                }
                self.lanes
                    .lock()
                    .unwrap_or_else(|p| p.into_inner())
                    .retain(|id, _| core.peer(*id).is_some());
                Self::drain(&mut core)
            };
            self.send_transmits(transmits);
            if let Some(p) = self.uapi_path.lock().unwrap_or_else(|p| p.into_inner()).as_ref() {
                if !p.exists() {
                    self.shutdown("UAPI socket was removed");
                }
            }
            let wait = {
                let core = self.core();
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
