//! `ordo bench`: the data plane with its I/O in memory, so no kernel is in the loop. A server
//! data plane (any execution model, with real lanes, workers and protocol core) has N peers; the
//! peers are plain protocol cores that complete real handshakes with it in memory. Two
//! phases are timed: *seal* (packets in, messages out: the read stage, workers and outbound
//! delivery) and *open* (messages in, packets out: the receive stage, workers and inbound
//! delivery, replay window and allowed-IPs checks included). Each is reported beside the
//! AEAD ceiling, the same seal or open in a plain loop on one core, measured by the same
//! binary in the same run.
//!
//! The models that have queues (inline, auto) get one dispatching thread per queue, each
//! carrying the peers of its queue, as the kernel's steering would give them.

use crate::device::batch::{Datagram, BATCH};
use crate::device::model::{Model, Plan, PlaneConfig};
use crate::device::pipeline::{DataPlane, InboundBatch, Io};
use anyhow::{bail, Result};
use ordo_proto::messages::DATA_HEADER_LEN;
use ordo_proto::{Interface, PrivateKey, Sent, SEND_HEADROOM};
use rand_chacha::ChaCha20Rng;
use rand_core::SeedableRng;
use serde::Serialize;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant, SystemTime};

/// Counts what the data plane sends and delivers; keeps nothing.
#[derive(Default)]
struct MemIo {
    sent: AtomicU64,
    sent_bytes: AtomicU64,
    delivered: AtomicU64,
    delivered_bytes: AtomicU64,
}

impl Io for MemIo {
    fn write_inner(&self, _: &DataPlane<Self>, _: usize, _: &mut [InboundBatch], accepted: &[(usize, usize, usize)]) {
        self.delivered.fetch_add(accepted.len() as u64, Ordering::Relaxed);
        self.delivered_bytes
            .fetch_add(accepted.iter().map(|a| a.2 as u64).sum(), Ordering::Relaxed);
    }

    fn send_outer(&self, _: usize, _: SocketAddr, payloads: &[&[u8]]) -> usize {
        self.sent.fetch_add(payloads.len() as u64, Ordering::Relaxed);
        self.sent_bytes
            .fetch_add(payloads.iter().map(|p| p.len() as u64).sum(), Ordering::Relaxed);
        payloads.len()
    }
}

pub struct Options {
    pub model: Model,
    /// The machine's topology; None: read from /sys (tests inject a fake one).
    pub topology: Option<crate::device::topology::Topology>,
    pub peers: usize,
    /// Inner packet size in bytes (IPv4 UDP).
    pub size: usize,
    pub workers: usize,
    pub packets: usize,
}

#[derive(Serialize)]
pub struct Phase {
    pub phase: &'static str,
    pub packets: u64,
    pub seconds: f64,
    pub gbit_per_s: f64,
    pub mpps: f64,
    /// Per thread doing crypto (workers, or queues in inline), at most one per core.
    pub gbit_per_s_per_worker: f64,
    /// The same AEAD operation in a plain loop on one core, Gbit/s of inner packets.
    pub aead_ceiling_gbit_per_s: f64,
    /// gbit_per_s_per_worker / aead_ceiling_gbit_per_s.
    pub per_worker_vs_ceiling: f64,
}

#[derive(Serialize)]
pub struct Report {
    pub model: &'static str,
    pub peers: usize,
    pub size: usize,
    pub workers: usize,
    /// Threads that dispatch (one per queue in inline and auto).
    pub dispatchers: usize,
    pub phases: Vec<Phase>,
    /// The data plane's own stage counters over both phases (see `ordo show`).
    pub stages: std::collections::BTreeMap<String, u64>,
    /// Per thread: packets per stage and busy time, beside the OS's CPU time.
    pub threads: std::collections::BTreeMap<String, u64>,
    /// Each crypto worker's name and the CPUs it was allowed to run on.
    pub worker_cpus: Vec<(String, String)>,
}

fn client_ip(i: usize) -> [u8; 4] {
    [10, 1, (i >> 8) as u8, i as u8]
}

fn packet(src: [u8; 4], dst: [u8; 4], size: usize) -> Vec<u8> {
    let mut p = vec![0u8; size];
    p[0] = 0x45;
    p[2..4].copy_from_slice(&(size as u16).to_be_bytes());
    p[8] = 64;
    p[9] = 17;
    p[12..16].copy_from_slice(&src);
    p[16..20].copy_from_slice(&dst);
    p
}

const SERVER_IP: [u8; 4] = [10, 0, 0, 1];

/// Seals (or opens) `size`-byte packets in a plain loop on this thread: the ceiling.
fn aead_ceiling(size: usize, open: bool) -> f64 {
    let now = Instant::now();
    let keys = |s, r, we| ordo_proto::handshake::SessionKeys {
        send: zeroize::Zeroizing::new([s; 32]),
        recv: zeroize::Zeroizing::new([r; 32]),
        local_index: 1,
        remote_index: 1,
        we_initiated: we,
    };
    let (a, b) = (
        ordo_proto::session::Session::new(&keys(1, 2, true), now),
        ordo_proto::session::Session::new(&keys(2, 1, false), now),
    );
    let padded = ordo_proto::interface::padded_len(size, 65535);
    let mut buf = vec![0u8; DATA_HEADER_LEN + padded + 16];
    let sealed: Vec<u8> = {
        let mut m = buf.clone();
        a.seal_at(0, padded, &mut m);
        m
    };
    let start = Instant::now();
    let mut n = 0u64;
    while start.elapsed() < Duration::from_millis(400) {
        for _ in 0..256 {
            if open {
                buf.copy_from_slice(&sealed);
                std::hint::black_box(b.open_in_place(&mut buf).ok());
            } else {
                a.seal_at(n, padded, &mut buf);
            }
            n += 1;
        }
    }
    (n * size as u64 * 8) as f64 / start.elapsed().as_secs_f64() / 1e9
}

pub fn run(o: &Options) -> Result<Report> {
    if o.peers == 0 || o.peers > 65_000 || !(28..=65_000).contains(&o.size) || o.packets == 0 {
        bail!("bench: --peers must be 1..65000, --size 28..65000 bytes, --packets at least 1");
    }
    let t0 = Instant::now();
    let wall = SystemTime::now();
    let mut rng = ChaCha20Rng::seed_from_u64(1);
    let server_key = PrivateKey::generate(&mut rng);
    let mut core = Interface::new(t0);
    core.set_mtu(o.size.max(576));
    core.set_private_key(Some(server_key.clone()));
    let config = PlaneConfig {
        model: o.model,
        workers: o.workers,
        topology: o.topology.clone(),
        ..Default::default()
    };
    let plan = Plan::new(&config).map_err(anyhow::Error::msg)?;
    let dispatchers = if o.model.has_queues() { plan.queues.len() } else { 1 };
    let crypto_threads = match o.model {
        // Dispatchers without a peer do nothing.
        Model::Inline => dispatchers.min(o.peers),
        Model::Auto => dispatchers.min(o.peers).max(plan.workers()),
        Model::Pool | Model::Threaded => plan.workers(),
    }
    .min(plan.cpus.len());
    let plane = DataPlane::new(core, MemIo::default(), plan);
    plane.start();
    // The auto model decides from measured load: let it, as the device's timer thread does.
    let placing = std::sync::atomic::AtomicBool::new(o.model == Model::Auto);

    // Real handshakes, in memory: each client initiates and confirms its session.
    let server_pub = server_key.public_key();
    let mut clients = Vec::with_capacity(o.peers);
    for i in 0..o.peers {
        let mut c = Interface::new(t0);
        c.set_mtu(o.size.max(576));
        let key = PrivateKey::generate(&mut rng);
        let client_pub = key.public_key();
        c.set_private_key(Some(key));
        let s = c.add_peer(server_pub).expect("distinct keys");
        let server_addr: SocketAddr = "192.0.2.1:51820".parse().unwrap();
        let client_addr = SocketAddr::new(std::net::Ipv4Addr::new(198, 18, (i >> 8) as u8, i as u8).into(), 51820);
        c.set_endpoint(s, server_addr);
        c.add_allowed_ip(s, "0.0.0.0/0".parse().unwrap());
        {
            let mut core = plane.core();
            let p = core.add_peer(client_pub).expect("distinct keys");
            core.add_allowed_ip(p, ipnet::IpNet::from(std::net::IpAddr::from(client_ip(i))));
        }
        let first = packet(client_ip(i), SERVER_IP, 64);
        let mut out = vec![0u8; first.len() + SEND_HEADROOM];
        c.send(t0, wall, &first, &mut out);
        for _ in 0..3 {
            while let Some(mut t) = c.poll_transmit() {
                let mut core = plane.core();
                core.receive(t0, wall, client_addr, &mut t.payload);
                while let Some(mut back) = core.poll_transmit() {
                    c.receive(t0, wall, server_addr, &mut back.payload);
                }
            }
        }
        if plane.core().peers().filter(|(_, p)| p.has_session(t0)).count() != i + 1 {
            bail!("bench: the in-memory handshake with peer {i} did not complete");
        }
        clients.push((c, client_addr));
    }

    let mut phases = Vec::new();

    // Seal: packets to every peer, round robin, through the read stage (each dispatcher
    // takes the peers of its queue).
    let templates: Vec<Vec<u8>> = (0..o.peers).map(|i| packet(SERVER_IP, client_ip(i), o.size)).collect();
    let share = |d: usize| (0..o.packets).filter(|k| (k % o.peers) % dispatchers == d).count();
    let start = Instant::now();
    std::thread::scope(|scope| {
        if placing.load(Ordering::Relaxed) {
            scope.spawn(|| place_while(&plane, &placing));
        }
        let handles: Vec<_> = (0..dispatchers)
            .map(|d| {
                let (plane, templates) = (&plane, &templates);
                let own: Vec<usize> = (0..o.peers).filter(|i| i % dispatchers == d).collect();
                let total = share(d);
                scope.spawn(move || {
                    let ctx = plane.register(&format!("bench{d}"), d);
                    let mut made = 0;
                    let mut batch: Vec<Vec<u8>> = Vec::with_capacity(BATCH);
                    while made < total {
                        for _ in 0..BATCH.min(total - made) {
                            let t = &templates[own[made % own.len()]];
                            let mut b = Vec::with_capacity(DATA_HEADER_LEN + t.len() + 32);
                            b.resize(DATA_HEADER_LEN, 0);
                            b.extend_from_slice(t);
                            batch.push(b);
                            made += 1;
                        }
                        plane.dispatch_outbound(&mut batch, &ctx);
                    }
                })
            })
            .collect();
        handles.into_iter().for_each(|h| h.join().expect("dispatcher"));
        placing.store(false, Ordering::Relaxed);
    });
    wait_for(
        || plane.io.sent.load(Ordering::Relaxed) >= o.packets as u64,
        "sealed messages",
    )?;
    phases.push(phase(
        "seal",
        o,
        crypto_threads,
        start.elapsed(),
        aead_ceiling(o.size, false),
    ));

    // Open: messages from every peer, made beforehand by the peers' own cores.
    let mut messages: Vec<Vec<Datagram>> = (0..dispatchers).map(|_| Vec::new()).collect();
    let per_peer: Vec<Vec<u8>> = (0..o.peers).map(|i| packet(client_ip(i), SERVER_IP, o.size)).collect();
    let mut out = vec![0u8; o.size + SEND_HEADROOM];
    for k in 0..o.packets {
        let (c, addr) = &mut clients[k % o.peers];
        if let Sent::Data { len, .. } = c.send(t0, wall, &per_peer[k % o.peers], &mut out) {
            messages[(k % o.peers) % dispatchers].push(Datagram {
                data: bytes::BytesMut::from(&out[..len]),
                src: *addr,
            });
        }
    }
    if messages.iter().map(Vec::len).sum::<usize>() != o.packets {
        bail!("bench: the peers could not seal every message");
    }
    let start = Instant::now();
    placing.store(o.model == Model::Auto, Ordering::Relaxed);
    std::thread::scope(|scope| {
        if placing.load(Ordering::Relaxed) {
            scope.spawn(|| place_while(&plane, &placing));
        }
        let handles: Vec<_> = messages
            .into_iter()
            .enumerate()
            .map(|(d, list)| {
                let plane = &plane;
                scope.spawn(move || {
                    let ctx = plane.register(&format!("bench{d}"), d);
                    let mut it = list.into_iter();
                    loop {
                        let mut batch: Vec<Datagram> = it.by_ref().take(BATCH).collect();
                        if batch.is_empty() {
                            break;
                        }
                        plane.dispatch_inbound(&mut batch, 0, &ctx);
                    }
                })
            })
            .collect();
        handles.into_iter().for_each(|h| h.join().expect("dispatcher"));
        placing.store(false, Ordering::Relaxed);
    });
    wait_for(
        || plane.io.delivered.load(Ordering::Relaxed) >= o.packets as u64,
        "opened messages",
    )?;
    phases.push(phase(
        "open",
        o,
        crypto_threads,
        start.elapsed(),
        aead_ceiling(o.size, true),
    ));
    // Every packet went through the replay window and allowed-IPs check and was delivered.
    let dropped: u64 = plane.core().stats.drops.values().sum();
    if dropped != 0 || plane.io.delivered.load(Ordering::Relaxed) != o.packets as u64 {
        bail!("bench: {dropped} packets were dropped; the figures would not be honest");
    }
    let counters = plane.stats.counters();
    let stages = counters
        .iter()
        .filter(|(k, _)| k.starts_with("stage_"))
        .cloned()
        .collect();
    let threads = counters.into_iter().filter(|(k, _)| k.starts_with("thread_")).collect();
    let worker_cpus = plane
        .stats
        .threads()
        .iter()
        .filter(|t| t.name.starts_with("worker"))
        .map(|t| (t.name.clone(), thread_cpus(t.tid)))
        .collect();
    plane.stop();
    Ok(Report {
        model: o.model.name(),
        peers: o.peers,
        size: o.size,
        workers: plane.workers(),
        dispatchers,
        phases,
        stages,
        threads,
        worker_cpus,
    })
}

/// The CPUs a thread of this process may run on, as the kernel lists them.
fn thread_cpus(tid: i32) -> String {
    std::fs::read_to_string(format!("/proc/self/task/{tid}/status"))
        .ok()
        .and_then(|s| {
            s.lines()
                .find_map(|l| l.strip_prefix("Cpus_allowed_list:").map(|v| v.trim().to_string()))
        })
        .unwrap_or_default()
}

/// Runs the placement decisions while the flag is set, as the device's timer thread does.
fn place_while(plane: &DataPlane<MemIo>, running: &std::sync::atomic::AtomicBool) {
    while running.load(Ordering::Relaxed) {
        std::thread::sleep(Duration::from_millis(100));
        let _ = plane.rebalance(Instant::now(), SystemTime::now());
    }
}

fn wait_for(done: impl Fn() -> bool, what: &str) -> Result<()> {
    let deadline = Instant::now() + Duration::from_secs(120);
    while !done() {
        if Instant::now() > deadline {
            bail!("bench: timed out waiting for the {what}");
        }
        std::thread::sleep(Duration::from_micros(200));
    }
    Ok(())
}

fn phase(name: &'static str, o: &Options, crypto_threads: usize, took: Duration, ceiling: f64) -> Phase {
    let secs = took.as_secs_f64();
    let gbps = (o.packets * o.size * 8) as f64 / secs / 1e9;
    let per_worker = gbps / crypto_threads.max(1) as f64;
    Phase {
        phase: name,
        packets: o.packets as u64,
        seconds: secs,
        gbit_per_s: gbps,
        mpps: o.packets as f64 / secs / 1e6,
        gbit_per_s_per_worker: per_worker,
        aead_ceiling_gbit_per_s: ceiling,
        per_worker_vs_ceiling: per_worker / ceiling,
    }
}

pub fn render(r: &Report) -> String {
    let mut s = format!(
        "ordo bench: model {}, {} peer(s), {}-byte packets, {} worker(s), {} dispatcher(s)\n\n\
         | phase | packets | Gbit/s | Mpps | Gbit/s per worker | AEAD ceiling, 1 core | per worker / ceiling |\n\
         |---|---|---|---|---|---|---|\n",
        r.model, r.peers, r.size, r.workers, r.dispatchers
    );
    for p in &r.phases {
        s += &format!(
            "| {} | {} | {:.2} | {:.3} | {:.2} | {:.2} | {:.2} |\n",
            p.phase,
            p.packets,
            p.gbit_per_s,
            p.mpps,
            p.gbit_per_s_per_worker,
            p.aead_ceiling_gbit_per_s,
            p.per_worker_vs_ceiling
        );
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The whole pool pipeline (dispatch, workers, lanes, in-order acceptance) in memory:
    /// every packet of several peers is sealed and every message opened and delivered, with
    /// no drop (run() refuses to report otherwise).
    #[test]
    fn pipeline_carries_every_packet_of_every_peer_in_every_model() {
        for model in Model::ALL {
            let r = run(&Options {
                model,
                topology: None,
                peers: 3,
                size: 200,
                workers: 2,
                packets: 3000,
            })
            .unwrap();
            assert_eq!(r.model, model.name());
            assert_eq!(r.phases.len(), 2);
            assert!(r.phases.iter().all(|p| p.packets == 3000 && p.gbit_per_s > 0.0));
            if model == Model::Threaded {
                // Every delivery of the threaded model is a wake-up of a peer's thread.
                assert!(r.stages["stage_deliver_inbound_wakeups"] > 0);
            } else {
                assert_eq!(r.stages["stage_deliver_inbound_wasted_wakeups"], 0, "{model}");
            }
        }
    }

    /// NUMA (LESSONS rule 5) on a faked two-node machine: one worker per node, pinned to its
    /// node's CPUs, and each peer's crypto done whole by the pool of one node. Three peers of
    /// 1,000 packets each way go to nodes 0, 1, 0: the workers carry exactly 2,000 and 1,000.
    #[test]
    fn a_peer_stays_on_one_numa_node() {
        let cpus = crate::device::topology::allowed_cpus();
        if cpus.len() < 2 {
            eprintln!("skipped: needs two CPUs");
            return;
        }
        let (c0, c1) = (cpus[0], cpus[1]);
        let dir = std::env::temp_dir().join(format!("ordo-numa-{}", std::process::id()));
        for (n, c) in [(0, c0), (1, c1)] {
            let d = dir.join(format!("devices/system/node/node{n}"));
            std::fs::create_dir_all(&d).unwrap();
            std::fs::write(d.join("cpulist"), format!("{c}\n")).unwrap();
        }
        let topology = crate::device::topology::Topology::from_sysfs(&dir).unwrap();
        let _ = std::fs::remove_dir_all(&dir);
        let r = run(&Options {
            model: Model::Pool,
            topology: Some(topology),
            peers: 3,
            size: 200,
            workers: 0,
            packets: 3000,
        })
        .unwrap();
        let mut allowed: Vec<String> = r.worker_cpus.iter().map(|(_, c)| c.clone()).collect();
        allowed.sort();
        assert_eq!(allowed, vec![c0.to_string(), c1.to_string()], "{:?}", r.worker_cpus);
        for stage in ["encrypt", "decrypt"] {
            let mut per_worker: Vec<u64> = r
                .threads
                .iter()
                .filter(|(k, _)| k.starts_with("thread_worker") && k.ends_with(&format!("_{stage}_packets")))
                .map(|(_, v)| *v)
                .collect();
            per_worker.sort();
            assert_eq!(per_worker, vec![1000, 2000], "{stage}: {:?}", r.threads);
        }
    }

    #[test]
    fn bad_options_are_refused() {
        assert!(run(&Options {
            model: Model::Pool,
            topology: None,
            peers: 0,
            size: 200,
            workers: 1,
            packets: 1
        })
        .is_err());
        assert!(run(&Options {
            model: Model::Pool,
            topology: None,
            peers: 1,
            size: 10,
            workers: 1,
            packets: 1
        })
        .is_err());
    }
}
