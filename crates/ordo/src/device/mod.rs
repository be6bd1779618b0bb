//! The device: the protocol core wrapped with a TUN interface, UDP sockets and threads.
//!
//! This is Ordo's first, simple data plane: one thread reads the TUN device and encrypts,
//! one thread per socket receives and decrypts, one thread runs the timers. They share the
//! core behind one lock and do their I/O outside it. The multi-core pipeline replaces the
//! threads, not the core.

pub mod batch;
pub mod lane;
pub mod tun;
pub mod udp;

use ordo_proto::{Interface, Received, Sent, Transmit, SEND_HEADROOM};
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
const MAX_PACKET: usize = 65535;
/// Longest the timer thread sleeps, so housekeeping (MTU, socket file) runs regularly.
const HOUSEKEEPING_INTERVAL: Duration = Duration::from_millis(250);

/// Errors of the I/O layer, counted beside the core's drop reasons.
#[derive(Default)]
pub struct IoCounters {
    pub tun_write_errors: AtomicU64,
    pub udp_send_errors: AtomicU64,
}

pub struct Device {
    pub name: String,
    core: Mutex<Interface>,
    tun: Tun,
    sockets: RwLock<Arc<Sockets>>,
    fwmark: Mutex<u32>,
    /// Bumped when sockets are replaced; a receive thread of an older generation exits.
    socket_generation: AtomicU64,
    stop: AtomicBool,
    stop_signal: (Mutex<bool>, Condvar),
    /// The UAPI socket path; the device stops when it disappears (as `wg-quick down` does).
    pub uapi_path: Mutex<Option<PathBuf>>,
    pub io: IoCounters,
    started: Instant,
}

impl Device {
    /// Creates the TUN interface and binds the sockets (listen port 0: a free port).
    pub fn create(name: &str) -> io::Result<Arc<Device>> {
        let tun = Tun::create(name)?;
        // 1420 leaves room for the outer IPv6 + UDP + WireGuard headers on a 1500 link.
        let _ = tun.set_mtu(1420);
        let sockets = Sockets::bind(0, 0)?;
        let now = Instant::now();
        let mut core = Interface::new(now);
        core.set_mtu(tun.mtu().unwrap_or(1420) as usize);
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
            started: now,
        }))
    }

    /// Starts the data plane threads.
    pub fn start(self: &Arc<Self>) {
        let d = self.clone();
        thread::Builder::new()
            .name("ordo-tun".into())
            .spawn(move || d.tun_loop())
            .expect("spawn");
        let d = self.clone();
        thread::Builder::new()
            .name("ordo-timers".into())
            .spawn(move || d.timer_loop())
            .expect("spawn");
        self.spawn_receivers();
    }

    fn spawn_receivers(self: &Arc<Self>) {
        let generation = self.socket_generation.load(Ordering::SeqCst);
        let sockets = self.sockets();
        let families: [(&str, bool); 2] =
            [("ordo-udp4", true), ("ordo-udp6", sockets.v6.is_some())];
        for (i, (name, present)) in families.into_iter().enumerate() {
            if !present {
                continue;
            }
            let d = self.clone();
            let s = sockets.clone();
            thread::Builder::new()
                .name(name.into())
                .spawn(move || {
                    let sock = if i == 0 {
                        &s.v4
                    } else {
                        s.v6.as_ref().expect("present")
                    };
                    d.udp_loop(sock, generation)
                })
                .expect("spawn");
        }
    }

    pub fn core(&self) -> MutexGuard<'_, Interface> {
        self.core.lock().unwrap_or_else(|p| p.into_inner())
    }

    pub fn sockets(&self) -> Arc<Sockets> {
        self.sockets
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
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

    fn send_transmits(&self, transmits: Vec<Transmit>) {
        if transmits.is_empty() {
            return;
        }
        let sockets = self.sockets();
        for t in transmits {
            self.send_one(&sockets, &t.payload, t.to);
        }
    }

    fn send_one(&self, sockets: &Sockets, payload: &[u8], to: SocketAddr) {
        if sockets.send_to(payload, to).is_err() {
            self.io.udp_send_errors.fetch_add(1, Ordering::Relaxed);
        }
    }

    fn drain(core: &mut Interface) -> Vec<Transmit> {
        std::iter::from_fn(|| core.poll_transmit()).collect()
    }

    /// TUN -> encrypt -> UDP.
    fn tun_loop(self: Arc<Self>) {
        let mut packet = vec![0u8; MAX_PACKET];
        let mut out = vec![0u8; MAX_PACKET + SEND_HEADROOM];
        while !self.stopped() {
            let n = match self.tun.read(&mut packet) {
                Ok(n) => n,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                Err(e) => {
                    self.shutdown(&format!("TUN device {} is gone ({e})", self.tun.name()));
                    break;
                }
            };
            let (sent, transmits) = {
                let mut core = self.core();
                let sent = core.send(Instant::now(), SystemTime::now(), &packet[..n], &mut out);
                (sent, Self::drain(&mut core))
            };
            self.send_transmits(transmits);
            if let Sent::Data { to, len, .. } = sent {
                self.send_one(&self.sockets(), &out[..len], to);
            }
        }
    }

    /// UDP -> decrypt -> TUN.
    fn udp_loop(self: Arc<Self>, sock: &std::net::UdpSocket, generation: u64) {
        let mut buf = vec![0u8; MAX_PACKET];
        loop {
            let r = sock.recv_from(&mut buf);
            if self.stopped() || self.socket_generation.load(Ordering::SeqCst) != generation {
                return;
            }
            let (n, src) = match r {
                Ok(x) => x,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                Err(_) => continue,
            };
            let src = canonical(src);
            let (received, transmits) = {
                let mut core = self.core();
                let r = core.receive(Instant::now(), SystemTime::now(), src, &mut buf[..n]);
                (r, Self::drain(&mut core))
            };
            self.send_transmits(transmits);
            if let Received::Packet { range, .. } = received {
                if self.tun.write(&buf[range]).is_err() {
                    self.io.tun_write_errors.fetch_add(1, Ordering::Relaxed);
                }
            }
        }
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
                Self::drain(&mut core)
            };
            self.send_transmits(transmits);
            if let Some(p) = self
                .uapi_path
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .as_ref()
            {
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
            let (stopped, _) = c
                .wait_timeout(stopped, wait)
                .unwrap_or_else(|p| p.into_inner());
            if *stopped {
                return;
            }
        }
    }
}

/// IPv4-mapped IPv6 sources become plain IPv4, so an endpoint has one spelling.
fn canonical(a: SocketAddr) -> SocketAddr {
    match a {
        SocketAddr::V6(v6) => match v6.ip().to_ipv4_mapped() {
            Some(v4) => SocketAddr::new(v4.into(), v6.port()),
            None => a,
        },
        v4 => v4,
    }
}
