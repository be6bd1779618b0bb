//! `ordo bench`: the data plane with its I/O in memory, so no kernel is in the loop. A server
//! data plane (any execution model, with real lanes, workers and protocol core) has N peers; the
//! peers are plain protocol cores that complete real handshakes with it in memory. Two
//! phases are timed: *seal* (packets in, messages out: the read stage, workers and outbound
//! delivery) and *open* (messages in, packets out: the receive stage, workers and inbound
//! delivery, replay window and allowed-IPs checks included). Each runs `rounds` times, and
//! each round is followed by two AEAD ceilings measured by the same binary: the same seal or
//! open in a plain loop on one core, and on every crypto thread's CPU at once (what the
//! machine's cores give together). A ceiling does the round's work per thread and is timed
//! like the round, until its last thread is done. Figures are medians over the rounds.
//!
//! The models that have queues (inline, auto) get one dispatching thread per queue, pinned
//! where the device pins that queue's thread and carrying the peers of its queue, as the
//! kernel's steering would give them.
//!
//! `compare` (`ordo bench --threads 1,2`) sets up one data plane per thread count, each on
//! that many CPUs with as much work per thread, and interleaves their rounds: how the plane
//! scales is then a ratio of figures taken a moment apart, not of two runs minutes apart.

mod ceiling;
mod render;
mod rounds;

use anyhow::{bail, Result};
use ordo::host::topology::{self, Cpus};
use ordo::inner::memory::MemoryInner;
use ordo::outer::memory::MemoryOuter;
use ordo::placement::model::{Model, PlacementSettings, Plan};
use ordo::plane::DataPlane;
use ordo::port::Datagram;
use ordo_proto::{Interface, PrivateKey, Sent, SEND_HEADROOM};
use rand_chacha::ChaCha20Rng;
use rand_core::SeedableRng;
pub use render::{render, render_comparison};
use rounds::{median, median_phase, open_round, phase, seal_round};
use serde::Serialize;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime};

/// The data plane under test: over in-memory ports that count what it sends and delivers
/// and keep nothing, through the same traits as TUN and UDP.
type MemPlane = DataPlane<MemoryInner, MemoryOuter>;

#[derive(Clone)]
pub struct Options {
    pub model: Model,
    /// The machine's topology; None: read from /sys (tests inject a fake one).
    pub topology: Option<topology::Topology>,
    pub peers: usize,
    /// Inner packet size in bytes (IPv4 UDP).
    pub size: usize,
    pub workers: usize,
    pub packets: usize,
    /// Each phase runs this many times, each time beside its ceilings; figures are medians.
    pub rounds: usize,
}

/// One phase's figures: each the median over the rounds (the ratios are taken per round,
/// against the ceilings measured right after that round, then their median).
#[derive(Serialize, Clone, Copy, Default)]
pub struct Phase {
    pub phase: &'static str,
    /// Per round.
    pub packets: u64,
    pub rounds: usize,
    pub seconds: f64,
    pub gbit_per_s: f64,
    pub mpps: f64,
    /// Per thread doing crypto (workers, or queues in inline), at most one per core.
    pub gbit_per_s_per_worker: f64,
    /// The same AEAD operation in a plain loop on one core, Gbit/s of inner packets.
    pub aead_ceiling_gbit_per_s: f64,
    /// gbit_per_s_per_worker / aead_ceiling_gbit_per_s.
    pub per_worker_vs_ceiling: f64,
    /// gbit_per_s / aead_ceiling_gbit_per_s: what the threads together make of one core.
    pub vs_one_core_ceiling: f64,
    /// The same loop on every crypto thread's CPU at once: what this machine's cores give
    /// together when all are busy (shared caches, clocks and neighbours included).
    pub aead_ceiling_all_threads_gbit_per_s: f64,
    /// gbit_per_s / aead_ceiling_all_threads_gbit_per_s.
    pub vs_all_threads_ceiling: f64,
}

#[derive(Serialize)]
pub struct Report {
    pub model: &'static str,
    pub peers: usize,
    pub size: usize,
    /// The CPUs the data plane was given.
    pub cpus: String,
    pub workers: usize,
    /// Threads that dispatch (one per queue in inline and auto).
    pub dispatchers: usize,
    /// Threads that do crypto: workers, or the queues that carry peers in inline.
    pub crypto_threads: usize,
    pub phases: Vec<Phase>,
    /// The data plane's own stage counters over both phases (see `ordo show`).
    pub stages: std::collections::BTreeMap<String, u64>,
    /// Per thread: packets per stage and busy time, beside the OS's CPU time.
    pub threads: std::collections::BTreeMap<String, u64>,
    /// Each crypto worker's name and the CPUs it was allowed to run on.
    pub worker_cpus: Vec<(String, String)>,
}

/// Data planes of one model with different thread counts, measured in one run (`compare`).
#[derive(Serialize)]
pub struct Comparison {
    pub planes: Vec<Report>,
    /// One per plane, the first included (1.0).
    pub scaling: Vec<Scaling>,
}

/// A plane's Gbit/s over the first plane's, per round (the two measured a moment apart),
/// then the median over the rounds.
#[derive(Serialize)]
pub struct Scaling {
    pub crypto_threads: usize,
    pub seal_vs_first: f64,
    pub open_vs_first: f64,
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

/// The open round carves its messages from buffers of this size: a fresh slot of the
/// receive stage's (see `batch::Receiver`).
const SLOT_BYTES: usize = ordo_udp::SLOT_RECEIVES * ordo::port::MAX_PACKET;

/// One data plane under test with its peers' cores: set up once (real handshakes, in
/// memory), then timed round by round. Several can live side by side, so that `compare`
/// interleaves their rounds.
struct Bench {
    o: Options,
    plane: Arc<MemPlane>,
    clients: Vec<(Interface, SocketAddr)>,
    /// Each peer's queue: the dispatcher that carries it (the kernel's steering).
    queue_of: Vec<usize>,
    /// Where each dispatcher runs, one entry per dispatcher: where the device pins its
    /// queue's thread (inline, auto), or the I/O CPUs, where the pool models' receive and
    /// read threads run.
    dispatcher_cpus: Vec<Cpus>,
    crypto_threads: usize,
    /// The CPUs the crypto threads run on, for the ceilings.
    ceiling_cpus: Vec<usize>,
    /// Inner packets to each peer (seal), and from each peer (open, sealed by its core).
    templates: Vec<Vec<u8>>,
    per_peer: Vec<Vec<u8>>,
    t0: Instant,
    wall: SystemTime,
    seal_rounds: Vec<Phase>,
    open_rounds: Vec<Phase>,
}

fn check(o: &Options) -> Result<()> {
    if o.peers == 0
        || o.peers > 65_000
        || !(28..=65_000).contains(&o.size)
        || o.packets == 0
        || !(1..=100).contains(&o.rounds)
    {
        bail!("bench: --peers must be 1..65000, --size 28..65000 bytes, --packets at least 1, --rounds 1..100");
    }
    Ok(())
}

impl Bench {
    /// A data plane of `o.model` on `cpus` (None: every CPU the process may use), with
    /// `o.peers` peers whose handshakes have completed.
    fn new(o: Options, cpus: Option<Cpus>) -> Result<Self> {
        let t0 = Instant::now();
        let wall = SystemTime::now();
        let mut rng = ChaCha20Rng::seed_from_u64(1);
        let server_key = PrivateKey::generate(&mut rng);
        let mut core = Interface::new(t0);
        core.set_mtu(o.size.max(576));
        core.set_private_key(Some(server_key.clone()));
        let config = PlacementSettings {
            model: o.model,
            workers: o.workers,
            cpus,
            topology: o.topology.clone(),
            ..Default::default()
        };
        let plan = Plan::new(&config).map_err(anyhow::Error::msg)?;
        let dispatchers = if o.model.has_queues() { plan.queues.len() } else { 1 };
        let mut crypto_threads = match o.model {
            // Dispatchers without a peer do nothing.
            Model::Inline => dispatchers.min(o.peers),
            Model::Auto => dispatchers.min(o.peers).max(plan.workers()),
            Model::Pool | Model::Threaded => plan.workers(),
        }
        .min(plan.cpus.len());
        let mut ceiling_cpus: Vec<usize> = plan.cpus.iter().copied().take(crypto_threads).collect();
        let dispatcher_cpus: Vec<Cpus> = if o.model.has_queues() {
            plan.queues.iter().map(|&c| vec![c]).collect()
        } else {
            vec![plan.io_cpus.clone()]
        };
        let queues = plan.queues.len();
        let inner = MemoryInner::counting(queues)?;
        let outer = MemoryOuter::new("192.0.2.1:51820".parse().unwrap(), queues)?;
        let plane = DataPlane::new(core, inner, outer, plan);
        plane.start();

        // Real handshakes, in memory: each client initiates and confirms its session.
        let server_pub = server_key.public_key();
        let mut clients = Vec::with_capacity(o.peers);
        let mut queue_of = Vec::with_capacity(o.peers);
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
                queue_of.push(core.peer(p).map_or(0, |x| x.queue as usize) % dispatchers);
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
        if o.model == Model::Inline {
            // The crypto runs where the peers' queues are: with one peer on queue 1, the
            // 1-core ceiling must be CPU 1's, not CPU 0's (the two differ by 10% here at
            // times); and only the queues that carry peers do crypto.
            let mut used: Vec<usize> = queue_of.iter().map(|&q| dispatcher_cpus[q][0]).collect();
            used.sort_unstable();
            used.dedup();
            if !used.is_empty() {
                crypto_threads = used.len();
                ceiling_cpus = used;
            }
        }
        Ok(Bench {
            templates: (0..o.peers).map(|i| packet(SERVER_IP, client_ip(i), o.size)).collect(),
            per_peer: (0..o.peers).map(|i| packet(client_ip(i), SERVER_IP, o.size)).collect(),
            o,
            plane,
            clients,
            queue_of,
            dispatcher_cpus,
            crypto_threads,
            ceiling_cpus,
            t0,
            wall,
            seal_rounds: Vec::new(),
            open_rounds: Vec::new(),
        })
    }

    /// One seal round: packets to every peer, round robin, through the read stage (each
    /// dispatcher takes the peers of its queue); then its ceilings, so that a ratio compares
    /// figures taken a moment apart on this shared machine.
    fn seal(&mut self) -> Result<()> {
        let o = &self.o;
        let round = self.seal_rounds.len() as u64 + 1;
        let plane = &self.plane;
        let sent = || plane.outer.sent() >= round * o.packets as u64;
        let took = seal_round(
            plane,
            o,
            (self.dispatcher_cpus.len(), &self.queue_of),
            &self.dispatcher_cpus,
            &self.templates,
            sent,
        )?;
        self.seal_rounds
            .push(phase("seal", o, self.crypto_threads, took, &self.ceiling_cpus));
        Ok(())
    }

    /// One open round: messages from every peer, made beforehand by the peers' own cores;
    /// then its ceilings.
    fn open(&mut self) -> Result<()> {
        let o = &self.o;
        let round = self.open_rounds.len() as u64 + 1;
        let mut messages: Vec<Vec<Datagram>> = (0..self.dispatcher_cpus.len()).map(|_| Vec::new()).collect();
        let mut out = vec![0u8; o.size + SEND_HEADROOM];
        for k in 0..o.packets {
            let (c, addr) = &mut self.clients[k % o.peers];
            if let Sent::Data { len, .. } = c.send(self.t0, self.wall, &self.per_peer[k % o.peers], &mut out) {
                messages[self.queue_of[k % o.peers]].push(Datagram {
                    data: bytes::BytesMut::from(&out[..len]),
                    src: *addr,
                });
            }
        }
        if messages.iter().map(Vec::len).sum::<usize>() != o.packets {
            bail!("bench: the peers could not seal every message");
        }
        let plane = &self.plane;
        let delivered = || plane.inner.delivered() >= round * o.packets as u64;
        let took = open_round(plane, messages, &self.dispatcher_cpus, delivered)?;
        self.open_rounds
            .push(phase("open", o, self.crypto_threads, took, &self.ceiling_cpus));
        Ok(())
    }

    /// The medians of the rounds run, and the plane's counters; refuses if any packet was
    /// dropped or not delivered.
    fn report(&self) -> Result<Report> {
        let o = &self.o;
        let plane = &self.plane;
        let phases = vec![median_phase(&self.seal_rounds), median_phase(&self.open_rounds)];
        // Every packet went through the replay window and allowed-IPs check and was delivered.
        let dropped: u64 = plane.core().stats.drops.values().sum();
        let expected = (self.open_rounds.len() * o.packets) as u64;
        if dropped != 0 || plane.inner.delivered() != expected {
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
            .map(|t| {
                let cpus = topology::thread_cpus(t.tid).unwrap_or_default();
                (t.name.clone(), topology::format_cpu_list(&cpus))
            })
            .collect();
        Ok(Report {
            model: o.model.name(),
            peers: o.peers,
            size: o.size,
            cpus: topology::format_cpu_list(&plane.plan.cpus),
            workers: plane.workers(),
            dispatchers: self.dispatcher_cpus.len(),
            crypto_threads: self.crypto_threads,
            phases,
            stages,
            threads,
            worker_cpus,
        })
    }
}

impl Drop for Bench {
    fn drop(&mut self) {
        self.plane.stop();
    }
}

/// Runs `o.rounds` rounds of each phase on one data plane with every CPU the process may use.
pub fn run(o: &Options) -> Result<Report> {
    check(o)?;
    let mut b = Bench::new(o.clone(), None)?;
    for _ in 0..o.rounds {
        b.seal()?;
        b.open()?;
    }
    b.report()
}

/// How a data plane scales with its threads, measured in one run: one plane per entry of
/// `threads`, given that many CPUs (the first the process may use; in the pool models as
/// many workers, unless `o.workers` says otherwise). Each thread has the same work as the
/// first plane's: a plane with k times its threads has k times its peers and packets per
/// round. Their rounds are interleaved (the order reversed every other round), so that each
/// ratio to the first plane is taken between rounds a moment apart: across separate runs,
/// this shared machine's speed moved by more than the effect measured.
pub fn compare(o: &Options, threads: &[usize]) -> Result<Comparison> {
    check(o)?;
    let allowed = topology::allowed_cpus();
    if threads.is_empty() || threads.iter().any(|&n| n == 0 || n > allowed.len()) {
        bail!(
            "bench: --threads takes thread counts from 1 to {} (the CPUs this process may use: {})",
            allowed.len(),
            topology::format_cpu_list(&allowed)
        );
    }
    let first = threads[0];
    let mut benches = threads
        .iter()
        .map(|&n| {
            let scaled = |x: usize| (x * n).div_ceil(first);
            let each = Options {
                peers: scaled(o.peers),
                packets: scaled(o.packets),
                ..o.clone()
            };
            Bench::new(each, Some(allowed[..n].to_vec()))
        })
        .collect::<Result<Vec<_>>>()?;
    for round in 0..o.rounds {
        let mut order: Vec<usize> = (0..benches.len()).collect();
        if round % 2 == 1 {
            order.reverse();
        }
        for &i in &order {
            benches[i].seal()?;
        }
        for &i in &order {
            benches[i].open()?;
        }
    }
    let vs_first = |rounds: fn(&Bench) -> &[Phase], b: &Bench| -> f64 {
        let ratios = rounds(b)
            .iter()
            .zip(rounds(&benches[0]))
            .map(|(p, f)| p.gbit_per_s / f.gbit_per_s.max(1e-9));
        median(ratios.collect())
    };
    let scaling = benches
        .iter()
        .map(|b| Scaling {
            crypto_threads: b.crypto_threads,
            seal_vs_first: vs_first(|b| &b.seal_rounds, b),
            open_vs_first: vs_first(|b| &b.open_rounds, b),
        })
        .collect();
    Ok(Comparison {
        planes: benches.iter().map(Bench::report).collect::<Result<_>>()?,
        scaling,
    })
}

/// Runs the placement decisions while the flag is set, as the device's timer thread does.
fn place_while(plane: &MemPlane, running: &AtomicBool) {
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
                rounds: 2,
            })
            .unwrap();
            assert_eq!(r.model, model.name());
            assert_eq!(r.phases.len(), 2);
            assert!(r
                .phases
                .iter()
                .all(|p| p.packets == 3000 && p.rounds == 2 && p.gbit_per_s > 0.0));
            assert!(r.phases.iter().all(|p| p.aead_ceiling_all_threads_gbit_per_s > 0.0));
            assert_eq!(r.stages["stage_encrypt_packets"], 6000, "{model}");
            assert_eq!(r.stages["stage_deliver_inbound_packets"], 6000, "{model}");
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
        let cpus = topology::allowed_cpus();
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
        let topology = topology::Topology::from_sysfs(&dir).unwrap();
        let _ = std::fs::remove_dir_all(&dir);
        let r = run(&Options {
            model: Model::Pool,
            topology: Some(topology),
            peers: 3,
            size: 200,
            workers: 0,
            packets: 3000,
            rounds: 1,
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

    /// Planes of one and two threads in one run: the second carries twice the peers and
    /// packets, all of them delivered; the first is the measure of the others.
    #[test]
    fn compare_gives_each_thread_the_same_work() {
        let cpus = topology::allowed_cpus();
        let threads: Vec<usize> = if cpus.len() >= 2 { vec![1, 2] } else { vec![1] };
        let o = Options {
            model: Model::Inline,
            topology: None,
            peers: 1,
            size: 200,
            workers: 0,
            packets: 2000,
            rounds: 2,
        };
        let c = compare(&o, &threads).unwrap();
        assert_eq!(c.planes.len(), threads.len());
        for ((r, x), &n) in c.planes.iter().zip(&c.scaling).zip(&threads) {
            assert_eq!((r.peers, r.crypto_threads, x.crypto_threads), (n, n, n));
            assert_eq!(r.cpus, topology::format_cpu_list(&cpus[..n]));
            assert_eq!(r.stages["stage_encrypt_packets"], 2 * 2000 * n as u64);
            assert_eq!(r.stages["stage_deliver_inbound_packets"], 2 * 2000 * n as u64);
            assert!(x.seal_vs_first > 0.0 && x.open_vs_first > 0.0);
        }
        assert_eq!((c.scaling[0].seal_vs_first, c.scaling[0].open_vs_first), (1.0, 1.0));
        let text = render_comparison(&c);
        assert!(
            text.contains("| crypto threads | seal Gbit/s | seal x first |"),
            "{text}"
        );
        for bad in [vec![], vec![0], vec![1, cpus.len() + 1]] {
            let e = compare(&o, &bad).err().expect("refused").to_string();
            assert!(e.contains("--threads takes thread counts from 1 to"), "{e}");
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
            packets: 1,
            rounds: 1,
        })
        .is_err());
        assert!(run(&Options {
            model: Model::Pool,
            topology: None,
            peers: 1,
            size: 10,
            workers: 1,
            packets: 1,
            rounds: 1,
        })
        .is_err());
    }
}
