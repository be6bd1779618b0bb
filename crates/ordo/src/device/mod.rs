//! The device: the protocol core wrapped with a TUN interface, UDP sockets and threads.
//!
//! The data plane ([`pipeline`]) runs over the kernel's I/O ([`kernel`]) in the execution
//! model chosen for the interface ([`model`]): receive and read threads feeding a crypto
//! pool, or one run-to-completion queue per CPU with its own sockets ([`steer`]) and TUN
//! queue, or both. Per-peer [`lane`]s deliver in order; [`peers`] places peers by load. One
//! thread runs the timers and the placement. The protocol core sits behind one lock that is
//! taken once per batch and never held during crypto.

pub mod affinity;
pub mod batch;
pub mod buffers;
pub mod cpuload;
pub mod kernel;
pub mod lane;
pub mod model;
pub mod offload;
pub mod osdrops;
pub mod peers;
pub mod pipeline;
pub mod stats;
pub mod steer;
pub mod topology;
pub mod tun;
pub mod udp;

use kernel::KernelIo;
use model::{Model, Plan, PlaneConfig};
use ordo_proto::Interface;
use pipeline::{DataPlane, IoCounters};
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
/// Packets each TUN queue holds for its reader (the interface's txqueuelen): 2048 of 1420
/// bytes are 31 ms at 0.75 Gbit/s of standing queue at worst, for senders that do not back
/// off; TCP's TSO packets fill it far less (one entry per 64 KB).
const TUN_QUEUE_LEN: u32 = 2048;
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
    started: Instant,
}

impl Device {
    /// Creates the TUN interface and binds the sockets (listen port 0: a free port), with
    /// as many queues as the execution model wants.
    pub fn create(name: &str, config: &PlaneConfig) -> io::Result<Arc<Device>> {
        let plan = Plan::new(config).map_err(|e| io::Error::new(io::ErrorKind::InvalidInput, e))?;
        let queues = plan.queues.len();
        let tun = Tun::create_queues(name, queues)?;
        // 1420 leaves room for the outer IPv6 + UDP + WireGuard headers on a 1500 link.
        let _ = tun[0].set_mtu(1420);
        // A TUN device queues 500 packets for its reader by default; a burst of small UDP
        // packets while a queue thread waits for its CPU overflowed that (5-7% loss at
        // 0.75 Gbit/s of 1392-byte datagrams on this 2-core machine; 0.04-0.9% at 1000, none
        // at 2048). A larger queue set by the user is kept.
        if tun[0].tx_queue_len().is_ok_and(|n| n < TUN_QUEUE_LEN) {
            let _ = tun[0].set_tx_queue_len(TUN_QUEUE_LEN);
        }
        let sockets = Sockets::bind_queues(0, 0, queues)?;
        let now = Instant::now();
        let mut core = Interface::new(now);
        core.set_mtu(tun[0].mtu().unwrap_or(1420) as usize);
        let io = KernelIo {
            tun,
            sockets: RwLock::new(Arc::new(sockets)),
            steered: Mutex::new((std::sync::Weak::new(), Vec::new())),
        };
        Ok(Arc::new(Device {
            name: name.to_string(),
            plane: DataPlane::new(core, io, plan),
            fwmark: Mutex::new(0),
            socket_generation: AtomicU64::new(0),
            stop: AtomicBool::new(false),
            stop_signal: (Mutex::new(false), Condvar::new()),
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
                let d = self.clone();
                thread::Builder::new()
                    .name(format!("ordo-queue{q}"))
                    .spawn(move || {
                        pin_io(&[cpu]);
                        kernel::queue_loop(d, q)
                    })
                    .expect("spawn");
            }
        } else {
            let d = self.clone();
            thread::Builder::new()
                .name("ordo-read".into())
                .spawn(move || {
                    d.pin_io_threads();
                    kernel::read_loop(d)
                })
                .expect("spawn");
        }
        let d = self.clone();
        thread::Builder::new()
            .name("ordo-timers".into())
            .spawn(move || d.timer_loop())
            .expect("spawn");
        self.spawn_receivers();
    }

    /// The pool models' receive threads, one per socket family (the queue models' queue
    /// threads pick up new sockets themselves).
    fn spawn_receivers(self: &Arc<Self>) {
        if self.plane.plan.model.has_queues() {
            return;
        }
        let generation = self.socket_generation.load(Ordering::SeqCst);
        let families = if self.sockets()[0].v6.is_some() { 2 } else { 1 };
        for i in 0..families {
            let d = self.clone();
            thread::Builder::new()
                .name(format!("ordo-receive{i}"))
                .spawn(move || {
                    d.pin_io_threads();
                    kernel::receive_loop(d, i, generation)
                })
                .expect("spawn");
        }
    }

    /// Receive and read threads keep to the I/O CPUs when the user named them.
    fn pin_io_threads(&self) {
        if self.plane.plan.explicit {
            pin_io(&self.plane.plan.io_cpus);
        }
    }

    pub fn model(&self) -> Model {
        self.plane.plan.model
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
        &self.plane.io.tun[0]
    }

    pub fn workers(&self) -> usize {
        self.plane.workers()
    }

    /// The sockets of every queue.
    pub fn sockets(&self) -> Arc<Vec<Sockets>> {
        self.plane.io.sockets()
    }

    pub fn listen_port(&self) -> u16 {
        self.sockets()[0].port
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
        if port == current[0].port && port != 0 {
            return Ok(());
        }
        let fresh = Arc::new(Sockets::bind_queues(port, self.fwmark(), current.len())?);
        *self.plane.io.sockets.write().unwrap_or_else(|p| p.into_inner()) = fresh;
        self.socket_generation.fetch_add(1, Ordering::SeqCst);
        current.iter().for_each(Sockets::shutdown);
        if !self.stopped() {
            self.spawn_receivers();
        }
        Ok(())
    }

    pub fn set_fwmark(&self, mark: u32) -> io::Result<()> {
        for s in self.sockets().iter() {
            s.set_fwmark(mark)?;
        }
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
        self.sockets().iter().for_each(Sockets::shutdown);
        self.plane.stop();
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

    /// Timers, plus housekeeping: follow the MTU, place peers by load, stop when the UAPI
    /// socket is removed.
    fn timer_loop(self: Arc<Self>) {
        let (m, c) = &self.stop_signal;
        let mut last_placement = Instant::now();
        loop {
            let mut transmits = {
                let mut core = self.plane.core();
                core.tick(Instant::now(), SystemTime::now());
                if let Ok(mtu) = self.tun().mtu() {
                    core.set_mtu(mtu as usize);
                }
                self.plane.forget_removed_peers(&core);
                pipeline::drain(&mut core)
            };
            if last_placement.elapsed() >= peers::INTERVAL {
                last_placement = Instant::now();
                transmits.extend(self.plane.rebalance(last_placement, SystemTime::now()));
            }
            self.plane.send_transmits(0, transmits);
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

fn pin_io(cpus: &[usize]) {
    if let Err(e) = topology::pin_current_thread(cpus) {
        eprintln!(
            "ordo: cannot pin an I/O thread to CPUs {}: {e}",
            topology::format_cpu_list(cpus)
        );
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
