//! The target behind the server under test: a sink for upload traffic (counts each client's
//! packets and their one-way delay), a source of download traffic (sends each client what
//! its hello asked for), and an echo for round trips. It runs in the server's namespace, as
//! a child of `ordo loadgen run`, until its standard input closes; then it stops sending,
//! receives what is still in flight for a moment, and prints its figures as JSON on standard
//! output.

use super::stats::{Latency, LatencySummary};
use super::wire::{self, Flow, Header, Kind};
use anyhow::{Context, Result};
use serde::{Deserialize, Serialize};
use std::cmp::Reverse;
use std::collections::{BinaryHeap, HashMap};
use std::io::Read;
use std::net::{SocketAddr, SocketAddrV4, UdpSocket};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

/// What the sink saw of one client.
#[derive(Serialize, Deserialize, Default, Clone, Debug)]
pub struct SinkClient {
    pub client: u32,
    /// Upload packets received, and their bytes (inner UDP payload).
    pub received: u64,
    pub bytes: u64,
    /// Download packets sent to the client.
    pub sent: u64,
    /// Round-trip requests echoed.
    pub echoed: u64,
}

#[derive(Serialize, Deserialize, Default, Debug)]
pub struct SinkReport {
    pub clients: Vec<SinkClient>,
    /// One-way delay of upload packets, client to sink.
    pub one_way: LatencySummary,
    /// The sink's own CPU time over its run, in cores.
    pub cpu_cores: f64,
}

/// How long the sink still receives after it is told to stop.
const DRAIN: Duration = Duration::from_millis(300);

struct Download {
    flow: Flow,
    interval_ns: u64,
    size: usize,
    seq: u64,
}

#[derive(Default)]
struct State {
    clients: HashMap<u32, SinkClient>,
    downloads: HashMap<u32, Download>,
}

/// Runs the sink on `listen` until standard input closes.
pub fn run(listen: SocketAddrV4) -> Result<()> {
    let sock = UdpSocket::bind(listen).with_context(|| format!("sink: cannot bind {listen}"))?;
    // Bursts from thousands of clients: large buffers (forced past the sysctl cap as root).
    for opt in [libc::SO_RCVBUFFORCE, libc::SO_SNDBUFFORCE] {
        ordo_udp::set_int_option(&sock, libc::SOL_SOCKET, opt, 16 << 20);
    }
    sock.set_read_timeout(Some(Duration::from_millis(20)))?;
    let sock = Arc::new(sock);
    let state = Arc::new(Mutex::new(State::default()));
    let stop = Arc::new(AtomicBool::new(false));
    let started = super::stats::cpu_seconds();
    let t0 = std::time::Instant::now();
    {
        let stop = stop.clone();
        std::thread::spawn(move || {
            let mut sink = [0u8; 64];
            while matches!(std::io::stdin().read(&mut sink), Ok(n) if n > 0) {}
            stop.store(true, Ordering::SeqCst);
        });
    }
    let sender = {
        let (sock, state, stop) = (sock.clone(), state.clone(), stop.clone());
        std::thread::spawn(move || download_loop(&sock, &state, &stop))
    };
    let mut one_way = Latency::new();
    let mut buf = vec![0u8; 65536];
    let mut out = vec![0u8; 65536];
    let mut drain_until: Option<std::time::Instant> = None;
    loop {
        if stop.load(Ordering::SeqCst) {
            let until = *drain_until.get_or_insert_with(|| std::time::Instant::now() + DRAIN);
            if std::time::Instant::now() >= until {
                break;
            }
        }
        let Ok((n, from)) = sock.recv_from(&mut buf) else {
            continue;
        };
        let SocketAddr::V4(from) = from else { continue };
        let Some(h) = Header::parse(&buf[..n]) else { continue };
        let mut st = state.lock().unwrap_or_else(|p| p.into_inner());
        let c = st.clients.entry(h.client).or_insert_with(|| SinkClient {
            client: h.client,
            ..Default::default()
        });
        match h.kind {
            Kind::Data => {
                c.received += 1;
                c.bytes += n as u64;
                one_way.record(wire::now_ns().saturating_sub(h.sent_ns));
            }
            Kind::Request => {
                c.echoed += 1;
                drop(st);
                let reply = Header {
                    kind: Kind::Response,
                    ..h
                };
                reply.write(&mut out);
                let _ = sock.send_to(&out[..n.max(wire::PAYLOAD_HEADER)], from);
            }
            Kind::Hello if h.rate > 0 && !st.downloads.contains_key(&h.client) => {
                let flow = Flow {
                    src: *listen.ip(),
                    sport: listen.port(),
                    dst: *from.ip(),
                    dport: from.port(),
                };
                st.downloads.insert(
                    h.client,
                    Download {
                        flow,
                        interval_ns: 1_000_000_000 / h.rate as u64,
                        size: (h.size as usize).max(wire::MIN_PACKET) - wire::IP_HEADER - wire::UDP_HEADER,
                        seq: 0,
                    },
                );
            }
            Kind::Hello | Kind::Response => {}
        }
    }
    let _ = sender.join();
    let mut clients: Vec<SinkClient> = state
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .clients
        .values()
        .cloned()
        .collect();
    clients.sort_by_key(|c| c.client);
    let report = SinkReport {
        clients,
        one_way: one_way.summary(),
        cpu_cores: (super::stats::cpu_seconds() - started) / t0.elapsed().as_secs_f64().max(1e-3),
    };
    println!("{}", serde_json::to_string(&report)?);
    Ok(())
}

/// Sends each client that asked for a download its packets, on schedule.
fn download_loop(sock: &UdpSocket, state: &Mutex<State>, stop: &AtomicBool) {
    let mut due: BinaryHeap<Reverse<(u64, u32)>> = BinaryHeap::new();
    let mut known: HashMap<u32, ()> = HashMap::new();
    let mut buf = vec![0u8; 65536];
    while !stop.load(Ordering::SeqCst) {
        let now = wire::now_ns();
        {
            let st = state.lock().unwrap_or_else(|p| p.into_inner());
            for id in st.downloads.keys() {
                if known.insert(*id, ()).is_none() {
                    due.push(Reverse((now, *id)));
                }
            }
        }
        let mut sent_any = false;
        while let Some(&Reverse((at, id))) = due.peek() {
            if at > now {
                break;
            }
            due.pop();
            let mut st = state.lock().unwrap_or_else(|p| p.into_inner());
            let Some(d) = st.downloads.get_mut(&id) else { continue };
            d.seq += 1;
            let h = Header {
                kind: Kind::Data,
                client: id,
                seq: d.seq,
                sent_ns: wire::now_ns(),
                rate: 0,
                size: 0,
            };
            let (size, to, interval) = (d.size, SocketAddrV4::new(d.flow.dst, d.flow.dport), d.interval_ns);
            if let Some(c) = st.clients.get_mut(&id) {
                c.sent += 1;
            }
            drop(st);
            h.write(&mut buf);
            let _ = sock.send_to(&buf[..size], to);
            sent_any = true;
            // A source that fell behind catches up by at most one interval, not in a burst.
            due.push(Reverse(((at + interval).max(now.saturating_sub(interval)), id)));
        }
        if !sent_any {
            let wait = due.peek().map_or(1_000_000, |Reverse((at, _))| at.saturating_sub(now));
            std::thread::sleep(Duration::from_nanos(wait.min(1_000_000)));
        }
    }
}
