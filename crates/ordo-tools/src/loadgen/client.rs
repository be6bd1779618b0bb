//! The clients: each a real WireGuard peer (a protocol core of its own, with its key pair,
//! timers and rekeys) with its own outer UDP socket. A worker thread carries many clients:
//! it sends what is due (a heap of next-send times), receives what its sockets have (epoll),
//! and ticks the clients' timers.

use super::stats::{thread_cpu_seconds, Latency};
use super::wire::{self, Flow, Header, Kind};
use ordo_proto::{Interface, PeerId, PrivateKey, PublicKey, Received, Sent, SEND_HEADROOM};
use rand_chacha::ChaCha20Rng;
use rand_core::{RngCore, SeedableRng};
use std::cmp::Reverse;
use std::collections::BinaryHeap;
use std::io;
use std::net::{SocketAddr, UdpSocket};
use std::os::fd::AsRawFd;
use std::sync::atomic::{AtomicU64, AtomicU8, Ordering};
use std::time::{Duration, Instant, SystemTime};

/// The phases of a run, shared by every worker.
pub const HANDSHAKE: u8 = 0;
pub const TRAFFIC: u8 = 1;
/// No more sending; what is in flight is still received.
pub const DRAIN: u8 = 2;
pub const STOP: u8 = 3;

/// What each client does once traffic starts.
#[derive(Clone, Copy, Debug)]
pub struct Plan {
    /// Upload packets per second (0: none).
    pub up_rate: u32,
    /// Download packets per second asked of the target (0: none).
    pub down_rate: u32,
    pub size: usize,
    pub poisson: bool,
    /// Round trips (closed loop, one outstanding) instead of streams.
    pub rr: bool,
    /// Round-trip probes per second per client beside a stream (latency under load; at most
    /// one outstanding per client; 0: none).
    pub probe_rate: u32,
    /// How often a roaming client moves to another outer socket (None: no client roams).
    pub roam_every: Option<Duration>,
}

/// Counters the main thread reads while the run goes on (for the progress bar).
#[derive(Default)]
pub struct Live {
    pub sent: AtomicU64,
    pub received: AtomicU64,
    pub up: AtomicU64,
}

pub struct Client {
    pub id: u32,
    core: Interface,
    server: PeerId,
    sock: UdpSocket,
    flow: Flow,
    template: Vec<u8>,
    seq: u64,
    next_hello: Instant,
    pub up: bool,
    /// Data or requests sent; data or responses received, and their bytes.
    pub sent: u64,
    pub received: u64,
    pub rx_bytes: u64,
    /// Round trips: the outstanding request (seq, sent at), done and timed out. A probe
    /// beside a stream is a round trip too, but neither a send nor a receive of the stream.
    outstanding: Option<(u64, Instant)>,
    probing: bool,
    pub rr_done: u64,
    pub rr_lost: u64,
    /// When the last round trip completed: the tunnel worked both ways then.
    pub last_round_trip: Option<Instant>,
    /// Outer source addresses this client moves between, if it roams (see [`Client::roam`]).
    roam_binds: Vec<std::net::IpAddr>,
    next_roam: Option<Instant>,
    pub roams: u64,
}

impl Client {
    pub fn new(
        id: u32,
        key: PrivateKey,
        server_key: PublicKey,
        server: SocketAddr,
        bind: SocketAddr,
        flow: Flow,
        size: usize,
    ) -> io::Result<Client> {
        let now = Instant::now();
        let mut core = Interface::with_rng(now, ChaCha20Rng::seed_from_u64(id as u64 ^ 0x5eed));
        core.set_private_key(Some(key));
        let peer = core
            .add_peer(server_key)
            .ok_or_else(|| io::Error::new(io::ErrorKind::InvalidInput, "a client has the server's key"))?;
        core.set_endpoint(peer, server);
        core.add_allowed_ip(peer, ipnet::IpNet::from(std::net::IpAddr::from(flow.dst)));
        let sock = UdpSocket::bind(bind)?;
        sock.set_nonblocking(true)?;
        let mut template = vec![0u8; size];
        wire::build(&mut template, size, flow, &header(Kind::Data, id, 0, 0, 0));
        Ok(Client {
            id,
            core,
            server: peer,
            sock,
            flow,
            template,
            seq: 0,
            next_hello: now,
            up: false,
            sent: 0,
            received: 0,
            rx_bytes: 0,
            outstanding: None,
            probing: false,
            rr_done: 0,
            rr_lost: 0,
            last_round_trip: None,
            roam_binds: Vec::new(),
            next_roam: None,
            roams: 0,
        })
    }

    /// Makes the client roam over `binds` (outer source addresses, used in turn; a new port
    /// each time), as a device moving between networks does.
    pub fn roaming(mut self, binds: Vec<std::net::IpAddr>) -> Client {
        self.roam_binds = binds;
        self
    }

    /// Moves to a new outer socket: the next address of its list, a new port. The server
    /// learns the new endpoint from the next authenticated packet. Returns the old socket,
    /// for the caller to take out of its poll set before it closes.
    fn roam(&mut self) -> io::Result<UdpSocket> {
        let ip = self.roam_binds[(self.roams as usize + 1) % self.roam_binds.len()];
        let sock = UdpSocket::bind(SocketAddr::new(ip, 0))?;
        sock.set_nonblocking(true)?;
        self.roams += 1;
        Ok(std::mem::replace(&mut self.sock, sock))
    }

    /// Seals and sends one packet of ours; staged if the session is not up yet.
    fn send(&mut self, h: &Header, out: &mut [u8], len: usize) {
        let packet = &mut self.template;
        packet.resize(len, 0);
        h.write(&mut packet[wire::IP_HEADER + wire::UDP_HEADER..]);
        // The IP length (and so its checksum) changes only with the size: rebuild then.
        if wire::built_len(packet) != len {
            wire::build(packet, len, self.flow, h);
        }
        let (now, wall) = (Instant::now(), SystemTime::now());
        if let Sent::Data { len, to, .. } = self.core.send(now, wall, packet, out) {
            let _ = self.sock.send_to(&out[..len], to);
        }
        self.flush();
    }

    /// Sends what the core wants sent (handshakes, keepalives).
    fn flush(&mut self) {
        while let Some(t) = self.core.poll_transmit() {
            let _ = self.sock.send_to(&t.payload, t.to);
        }
    }

    fn tick(&mut self, now: Instant) {
        self.core.tick(now, SystemTime::now());
        self.flush();
        self.up = self.core.peer(self.server).is_some_and(|p| p.has_session(now));
    }

    /// Reads everything waiting on the socket.
    fn receive(&mut self, buf: &mut [u8], down: &mut Latency, rtt: &mut Latency) -> u64 {
        let mut got = 0;
        while let Ok((n, from)) = self.sock.recv_from(buf) {
            let (now, wall) = (Instant::now(), SystemTime::now());
            if let Received::Packet { range, .. } = self.core.receive(now, wall, from, &mut buf[..n]) {
                if let Some((_, h)) = wire::parse(&buf[range.clone()]) {
                    match h.kind {
                        Kind::Data => {
                            self.received += 1;
                            self.rx_bytes += range.len() as u64;
                            got += 1;
                            down.record(wire::now_ns().saturating_sub(h.sent_ns));
                        }
                        Kind::Response if self.outstanding.is_some_and(|(seq, _)| seq == h.seq) => {
                            if !self.probing {
                                self.received += 1;
                                self.rx_bytes += range.len() as u64;
                                got += 1;
                            }
                            self.rr_done += 1;
                            self.last_round_trip = Some(now);
                            rtt.record(wire::now_ns().saturating_sub(h.sent_ns));
                            self.outstanding = None;
                        }
                        _ => {}
                    }
                }
            }
            self.flush();
        }
        got
    }
}

fn header(kind: Kind, client: u32, seq: u64, rate: u32, size: usize) -> Header {
    Header {
        kind,
        client,
        seq,
        sent_ns: wire::now_ns(),
        rate,
        size: size as u16,
    }
}

/// What a worker hands back at the end.
pub struct WorkerResult {
    pub clients: Vec<Client>,
    pub down: Latency,
    pub rtt: Latency,
    /// Sends that left more than a millisecond after they were due.
    pub late: u64,
    pub cpu_seconds: f64,
    pub traffic_seconds: f64,
}

/// The next gap between two sends at `rate` per second: constant, or exponential (Poisson).
fn gap(rate: u32, poisson: bool, rng: &mut ChaCha20Rng) -> Duration {
    let mean = 1.0 / rate.max(1) as f64;
    if !poisson {
        return Duration::from_secs_f64(mean);
    }
    let u = (rng.next_u64() >> 11) as f64 / (1u64 << 53) as f64;
    Duration::from_secs_f64(-mean * (1.0 - u).ln())
}

/// A round-trip probe beside the stream: a small request the target echoes, unless the
/// previous one is still out (under a second); one out longer is counted lost.
fn probe(c: &mut Client, now: Instant, out: &mut [u8]) {
    if let Some((_, sent)) = c.outstanding {
        if now.duration_since(sent) < Duration::from_secs(1) {
            return;
        }
        c.rr_lost += 1;
    }
    c.seq += 1;
    c.outstanding = Some((c.seq, now));
    c.send(&header(Kind::Request, c.id, c.seq, 0, 0), out, wire::MIN_PACKET);
}

/// Moves client `i` to a new socket and its poll registration with it; a client that cannot
/// open one stays where it is.
fn roam(ep: libc::c_int, c: &mut Client, i: usize) {
    let Ok(old) = c.roam() else { return };
    let mut ev = libc::epoll_event {
        events: libc::EPOLLIN as u32,
        u64: i as u64,
    };
    // SAFETY: a valid epoll descriptor and sockets we own (the old one still open); an event
    // that outlives the calls.
    unsafe {
        libc::epoll_ctl(ep, libc::EPOLL_CTL_DEL, old.as_raw_fd(), std::ptr::null_mut());
        libc::epoll_ctl(ep, libc::EPOLL_CTL_ADD, c.sock.as_raw_fd(), &mut ev);
    }
}

/// Runs a share of the clients until the phase is STOP.
pub fn worker(mut clients: Vec<Client>, plan: Plan, phase: &AtomicU8, live: &Live, seed: u64) -> WorkerResult {
    // SAFETY: epoll_create1 has no memory arguments.
    let ep = unsafe { libc::epoll_create1(libc::EPOLL_CLOEXEC) };
    for (i, c) in clients.iter().enumerate() {
        let mut ev = libc::epoll_event {
            events: libc::EPOLLIN as u32,
            u64: i as u64,
        };
        // SAFETY: a valid epoll descriptor, a socket we own, an event that outlives the call.
        unsafe { libc::epoll_ctl(ep, libc::EPOLL_CTL_ADD, c.sock.as_raw_fd(), &mut ev) };
    }
    let mut rng = ChaCha20Rng::seed_from_u64(seed);
    let mut due: BinaryHeap<Reverse<(Instant, usize)>> = BinaryHeap::new();
    let (mut down, mut rtt) = (Latency::new(), Latency::new());
    let mut buf = vec![0u8; 65536];
    let mut out = vec![0u8; 65536 + SEND_HEADROOM];
    let mut events = vec![libc::epoll_event { events: 0, u64: 0 }; 256];
    let mut last_tick = Instant::now();
    let mut started: Option<(Instant, f64)> = None;
    let mut late = 0;
    let mut hello_scan = Instant::now();
    // Heap entries at `probes + i` are client i's next probe, the others its next send.
    let probes = clients.len();
    for c in &mut clients {
        c.probing = plan.probe_rate > 0;
    }
    loop {
        let now = Instant::now();
        let p = phase.load(Ordering::SeqCst);
        if p == STOP {
            break;
        }
        // Hellos are looked for ten times a second: a scan of every client on every wake-up
        // would cost the generator more than its sends at 10,000 clients.
        let mut hellos = now >= hello_scan;
        if hellos {
            hello_scan = now + Duration::from_millis(100);
        }
        if p == HANDSHAKE && hellos {
            // A hello starts each handshake, and is repeated until the session is up.
            for c in clients.iter_mut().filter(|c| !c.up && c.next_hello <= now) {
                c.next_hello = now + Duration::from_secs(1);
                c.send(&header(Kind::Hello, c.id, 0, 0, 0), &mut out, wire::MIN_PACKET);
            }
        } else if p != HANDSHAKE && started.is_none() {
            started = Some((now, thread_cpu_seconds()));
            hellos = true; // the downloads' hellos go at once
            let roamers = clients.iter().filter(|c| !c.roam_binds.is_empty()).count().max(1);
            let mut k = 0;
            for (i, c) in clients.iter_mut().enumerate() {
                c.next_hello = now;
                if let (Some(every), false) = (plan.roam_every, c.roam_binds.is_empty()) {
                    // Spread over the interval, so the server sees a steady trickle of moves.
                    c.next_roam = Some(now + every.mul_f64((k as f64 + 1.0) / roamers as f64));
                    k += 1;
                }
                if plan.up_rate > 0 || plan.rr {
                    // Spread the first sends over one gap so clients do not start in step.
                    let first = gap(plan.up_rate.max(1), true, &mut rng).min(Duration::from_secs(1));
                    due.push(Reverse((now + first, i)));
                }
                if plan.probe_rate > 0 {
                    let first = gap(plan.probe_rate, true, &mut rng).min(Duration::from_secs(1));
                    due.push(Reverse((now + first, probes + i)));
                }
            }
        }
        if p == TRAFFIC && plan.down_rate > 0 && hellos {
            // The hello that asks the target for a download, repeated until the download
            // arrives: a lost hello would leave the client without one.
            for c in clients.iter_mut().filter(|c| c.received == 0 && c.next_hello <= now) {
                c.next_hello = now + Duration::from_millis(500);
                c.send(
                    &header(Kind::Hello, c.id, 0, plan.down_rate, plan.size),
                    &mut out,
                    wire::MIN_PACKET,
                );
            }
        }
        // Sends that are due; at most a few hundred per round so receiving keeps up.
        for _ in 0..if p == TRAFFIC { 512 } else { 0 } {
            let Some(&Reverse((at, i))) = due.peek() else { break };
            if at > now {
                break;
            }
            due.pop();
            if i >= probes {
                probe(&mut clients[i - probes], now, &mut out);
                let next = gap(plan.probe_rate, true, &mut rng);
                due.push(Reverse((now + next, i)));
                continue;
            }
            let c = &mut clients[i];
            if plan.rr {
                if let Some((_, sent)) = c.outstanding {
                    if now.duration_since(sent) < Duration::from_secs(1) {
                        // Closed loop: the next request goes when the response is back.
                        due.push(Reverse((now + Duration::from_micros(50), i)));
                        continue;
                    }
                    c.rr_lost += 1;
                }
                c.seq += 1;
                c.outstanding = Some((c.seq, now));
                c.send(&header(Kind::Request, c.id, c.seq, 0, 0), &mut out, plan.size);
            } else {
                c.seq += 1;
                c.send(&header(Kind::Data, c.id, c.seq, 0, 0), &mut out, plan.size);
            }
            c.sent += 1;
            live.sent.fetch_add(1, Ordering::Relaxed);
            // Late: a send that left more than a millisecond after it was due (a round trip
            // waiting for its response is not late).
            if now.duration_since(at) > Duration::from_millis(1) {
                late += 1;
            }
            let next = if plan.rr && plan.up_rate == 0 {
                Duration::from_micros(50)
            } else {
                gap(plan.up_rate, plan.poisson, &mut rng)
            };
            // Behind schedule: catch up by at most one gap, not in a burst.
            let floor = now.checked_sub(next).unwrap_or(now);
            due.push(Reverse(((at + next).max(floor), i)));
        }
        // Sleep until the next send is due (at most a millisecond, for the phase and the
        // timers), to the microsecond: a millisecond's granularity would make sends late.
        let wait = match (p, due.peek()) {
            (TRAFFIC, Some(Reverse((at, _)))) => at.saturating_duration_since(Instant::now()),
            _ => Duration::from_millis(1),
        }
        .min(Duration::from_millis(1));
        let timeout = libc::timespec {
            tv_sec: 0,
            tv_nsec: wait.as_nanos() as libc::c_long,
        };
        // SAFETY: a valid epoll descriptor, an event buffer of the length passed, a valid
        // timeout and no signal mask.
        let n = unsafe { libc::epoll_pwait2(ep, events.as_mut_ptr(), events.len() as i32, &timeout, std::ptr::null()) };
        for ev in events.iter().take(n.max(0) as usize) {
            let i = ev.u64 as usize;
            let got = clients[i].receive(&mut buf, &mut down, &mut rtt);
            live.received.fetch_add(got, Ordering::Relaxed);
        }
        if last_tick.elapsed() >= Duration::from_millis(100) {
            last_tick = Instant::now();
            let mut up = 0;
            for (i, c) in clients.iter_mut().enumerate() {
                let was = c.up;
                c.tick(last_tick);
                up += (c.up && !was) as u64;
                if p == TRAFFIC && c.next_roam.is_some_and(|t| t <= last_tick) {
                    c.next_roam = plan.roam_every.map(|every| last_tick + every);
                    roam(ep, c, i);
                }
            }
            live.up.fetch_add(up, Ordering::Relaxed);
        }
    }
    // SAFETY: closing the epoll descriptor we created.
    unsafe { libc::close(ep) };
    let (t0, cpu0) = started.unwrap_or((Instant::now(), thread_cpu_seconds()));
    WorkerResult {
        clients,
        down,
        rtt,
        late,
        cpu_seconds: thread_cpu_seconds() - cpu0,
        traffic_seconds: t0.elapsed().as_secs_f64(),
    }
}
