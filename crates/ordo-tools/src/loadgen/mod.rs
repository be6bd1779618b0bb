//! `ordo loadgen`: plays N WireGuard clients against any server implementation.
//!
//! ```text
//! ordo loadgen setup --clients N [--seed S] [--listen-port P]   > server.conf  (wg setconf)
//! ordo loadgen run   --clients N [--seed S] --server ADDR:PORT --sink-netns NS [traffic...]
//! ordo loadgen sink  --listen ADDR:PORT                          (started by `run`)
//! ordo loadgen flood --server ADDR:PORT --kind junk|initiation --rate R [--answer-cookies]
//! ```
//!
//! Keys come from the seed, so `setup` and `run` agree on them without a key file: these are
//! test identities, never to be used for a real tunnel. Client i has the inner address
//! 10.200.0.0 + i + 2 (a /32 in the server's AllowedIPs); the target (the sink) listens on
//! the server's inner address, 10.200.0.1, in the server's namespace.
//!
//! A run: every client sends a hello, which starts its handshake; once all are up (or the
//! handshake timeout passes), traffic runs for the duration; then the sink reports what it
//! saw, and the figures are computed: per-client goodput, aggregate throughput, loss,
//! Jain's fairness index, one-way delay and round trips (p50, p99, p99.9), and the load
//! generator's own CPU time, with a warning when it was the bottleneck.

pub mod client;
pub mod flood;
pub mod sink;
pub mod stats;
pub mod wire;

use anyhow::{bail, Context, Result};
use client::{Client, Live, Plan, DRAIN, HANDSHAKE, STOP, TRAFFIC};
use ordo_proto::PrivateKey;
use rand_chacha::ChaCha20Rng;
use rand_core::SeedableRng;
use serde::Serialize;
use stats::{jain, LatencySummary};
use std::io::Write;
use std::net::{IpAddr, Ipv4Addr, SocketAddr, SocketAddrV4};
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicBool, AtomicU8, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// Most clients: the inner addresses of one /16.
pub const MAX_CLIENTS: usize = 65_000;
pub const TARGET: SocketAddrV4 = SocketAddrV4::new(Ipv4Addr::new(10, 200, 0, 1), 9000);
/// Every client's inner UDP port (their inner addresses differ).
const CLIENT_PORT: u16 = 40000;

pub fn client_ip(i: usize) -> Ipv4Addr {
    let n = u32::from(Ipv4Addr::new(10, 200, 0, 0)) + i as u32 + 2;
    Ipv4Addr::from(n)
}

/// The server's key and the clients' keys, from the seed.
pub fn keys(seed: u64, clients: usize) -> (PrivateKey, Vec<PrivateKey>) {
    let mut rng = ChaCha20Rng::seed_from_u64(seed);
    let server = PrivateKey::generate(&mut rng);
    (server, (0..clients).map(|_| PrivateKey::generate(&mut rng)).collect())
}

#[derive(clap::Subcommand)]
pub enum LoadgenCommand {
    /// Print the server's configuration (`wg setconf` format) for N clients.
    Setup {
        #[arg(long, value_parser = clap::value_parser!(u32).range(1..=MAX_CLIENTS as i64))]
        clients: u32,
        #[arg(long, default_value_t = 1)]
        seed: u64,
        #[arg(long, default_value_t = 51820)]
        listen_port: u16,
    },
    /// Run the clients against a server configured with `setup`'s output.
    Run(RunArgs),
    /// What an attacker without a key sends: junk or initiations with a valid mac1.
    Flood(flood::FloodArgs),
    /// The target behind the server (started by `run` in the server's namespace).
    Sink {
        #[arg(long, default_value_t = TARGET)]
        listen: SocketAddrV4,
    },
}

#[derive(clap::ValueEnum, Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Direction {
    Up,
    Down,
    Both,
}

#[derive(clap::Args, Debug)]
pub struct RunArgs {
    #[arg(long, value_parser = clap::value_parser!(u32).range(1..=MAX_CLIENTS as i64))]
    pub clients: u32,
    #[arg(long, default_value_t = 1)]
    pub seed: u64,
    /// The server's outer address.
    #[arg(long)]
    pub server: SocketAddr,
    /// Outer source addresses for the clients, used in turn (each client has its own port).
    #[arg(long, value_delimiter = ',', default_value = "0.0.0.0")]
    pub bind: Vec<IpAddr>,
    /// Packets per second per client, each way that has traffic.
    #[arg(long, default_value_t = 100, value_parser = clap::value_parser!(u32).range(1..=10_000_000))]
    pub rate: u32,
    /// Poisson arrivals instead of a constant rate.
    #[arg(long)]
    pub poisson: bool,
    /// Inner packet size in bytes (IPv4 + UDP + payload).
    #[arg(long, default_value_t = 1400)]
    pub size: usize,
    #[arg(long, value_enum, default_value_t = Direction::Up)]
    pub direction: Direction,
    /// Round trips (one outstanding request per client, like netperf's TCP_RR) instead of
    /// streams; --rate then caps each client's request rate.
    #[arg(long)]
    pub rr: bool,
    /// Round-trip probes per second per client beside the stream, for latency under load:
    /// small requests the target echoes, at most one outstanding per client (0: none).
    #[arg(long, default_value_t = 0, conflicts_with = "rr", value_parser = clap::value_parser!(u32).range(0..=10_000))]
    pub probe_rate: u32,
    /// Seconds of traffic.
    #[arg(long, default_value_t = 10.0)]
    pub duration: f64,
    /// Share of the clients that roam: every --roam-every seconds each moves to a new outer
    /// socket (the next --bind address, a new port), spread over the interval.
    #[arg(long, default_value_t = 0.0)]
    pub roam_share: f64,
    #[arg(long, default_value_t = 30.0)]
    pub roam_every: f64,
    /// Seconds to wait for every handshake.
    #[arg(long, default_value_t = 30.0)]
    pub handshake_timeout: f64,
    /// Threads carrying the clients.
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u32).range(1..=256))]
    pub threads: u32,
    /// The network namespace of the server, where the sink is started.
    #[arg(long)]
    pub sink_netns: Option<String>,
    /// The server's process, whose CPU time over the traffic is reported.
    #[arg(long)]
    pub server_pid: Option<u32>,
    #[arg(long)]
    pub json: bool,
}

/// The server's configuration for `wg setconf`.
pub fn server_config(seed: u64, clients: usize, listen_port: u16) -> zeroize::Zeroizing<String> {
    use std::fmt::Write;
    let (server, keys) = keys(seed, clients);
    let mut s = zeroize::Zeroizing::new(String::new());
    let _ = writeln!(
        s,
        "[Interface]\nPrivateKey = {}\nListenPort = {listen_port}",
        server.to_base64().as_str()
    );
    for (i, k) in keys.iter().enumerate() {
        let _ = writeln!(
            s,
            "\n[Peer]\nPublicKey = {}\nAllowedIPs = {}/32",
            k.public_key().to_base64(),
            client_ip(i)
        );
    }
    s
}

#[derive(Serialize, Debug)]
pub struct ClientResult {
    pub client: u32,
    pub up: bool,
    pub sent: u64,
    pub received: u64,
    /// Goodput in Mbit/s of inner UDP payload: upload as the sink counted it, download as
    /// the client did.
    pub up_mbit: f64,
    pub down_mbit: f64,
    pub rr_done: u64,
    /// Seconds between the client's last completed round trip and the end of the traffic
    /// (None: none completed): with probes, whether its tunnel still worked at the end.
    pub last_round_trip_s: Option<f64>,
    /// Times it moved to another outer socket.
    pub roams: u64,
}

#[derive(Serialize, Debug)]
pub struct Report {
    pub clients: usize,
    pub clients_up: usize,
    pub handshake_seconds: f64,
    pub direction: Direction,
    pub rr: bool,
    pub rate_per_client: u32,
    /// Round-trip probes per second per client beside the stream (0: none).
    pub probe_rate_per_client: u32,
    /// Share of the clients that roamed, and how often each moved.
    pub roam_share: f64,
    pub roam_every_s: f64,
    pub size: usize,
    pub seconds: f64,
    pub up_gbit: f64,
    pub down_gbit: f64,
    pub up_loss: f64,
    pub down_loss: f64,
    /// Jain's index over the clients' goodput (each way that has traffic).
    pub fairness: f64,
    pub one_way_up: LatencySummary,
    pub one_way_down: LatencySummary,
    pub round_trip: LatencySummary,
    /// Round trips that timed out (1 s).
    pub rr_lost: u64,
    /// The load generator's CPU time over the traffic, in cores, against its threads.
    pub loadgen_cores: f64,
    pub loadgen_threads: u32,
    /// Sends more than 1 ms behind schedule, as a share of all sends.
    pub late_share: f64,
    /// Set when the generator, not the server, may have set the pace.
    pub warnings: Vec<String>,
    pub sink_cores: f64,
    /// The server process's CPU time over the traffic, in cores (with --server-pid).
    pub server_cores: Option<f64>,
    /// Every CPU of the machine over the traffic (user, system, softirq, idle shares).
    pub machine_cpu: Vec<stats::CoreCpu>,
    pub per_client: Vec<ClientResult>,
}

/// Checks what clap cannot.
fn check(a: &RunArgs) -> Result<()> {
    if a.size < wire::MIN_PACKET || a.size > 65_000 {
        bail!(
            "--size must be {} to 65000 bytes (IPv4 + UDP + our header)",
            wire::MIN_PACKET
        );
    }
    if !(a.duration > 0.0 && a.duration <= 86_400.0) {
        bail!("--duration must be more than 0 and at most 86400 seconds");
    }
    if !((0.0..=1.0).contains(&a.roam_share) && (0.1..=86_400.0).contains(&a.roam_every)) {
        bail!("--roam-share must be 0 to 1 and --roam-every 0.1 to 86400 seconds");
    }
    if let Some(b) = a
        .bind
        .iter()
        .find(|b| !b.is_unspecified() && b.is_ipv4() != a.server.is_ipv4())
    {
        bail!(
            "--bind {b}: not of the address family of --server {} (IPv4 and IPv6 do not mix on one socket)",
            a.server
        );
    }
    Ok(())
}

pub fn command(cmd: LoadgenCommand) -> Result<()> {
    match cmd {
        LoadgenCommand::Setup {
            clients,
            seed,
            listen_port,
        } => {
            std::io::stdout().write_all(server_config(seed, clients as usize, listen_port).as_bytes())?;
            Ok(())
        }
        LoadgenCommand::Sink { listen } => sink::run(listen),
        LoadgenCommand::Flood(a) => {
            let r = flood::run(&a)?;
            if a.json {
                println!("{}", serde_json::to_string_pretty(&r)?);
            } else {
                print!("{}", flood::render(&r));
            }
            Ok(())
        }
        LoadgenCommand::Run(a) => {
            let r = run(&a)?;
            if a.json {
                println!("{}", serde_json::to_string_pretty(&r)?);
            } else {
                print!("{}", render(&r));
            }
            Ok(())
        }
    }
}

/// The sink child: stopped by closing its standard input.
struct SinkChild(std::process::Child);

impl SinkChild {
    fn start(netns: &str) -> Result<SinkChild> {
        let exe = std::env::current_exe()?;
        let child = Command::new("ip")
            .args(["netns", "exec", netns])
            .arg(exe)
            .args(["loadgen", "sink", "--listen", &TARGET.to_string()])
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .spawn()
            .context("cannot start the sink with ip netns exec")?;
        Ok(SinkChild(child))
    }

    fn finish(mut self) -> Result<sink::SinkReport> {
        use std::io::Read;
        drop(self.0.stdin.take());
        let mut out = String::new();
        if let Some(mut o) = self.0.stdout.take() {
            o.read_to_string(&mut out)?;
        }
        serde_json::from_str(&out).with_context(|| format!("the sink's report: {out:?}"))
    }
}

impl Drop for SinkChild {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// Lets as many sockets be open as there are clients (and some).
fn raise_fd_limit(clients: usize) -> Result<()> {
    let want = (clients + 256) as u64;
    // SAFETY: rlimit is plain data; getrlimit fills it.
    let mut r: libc::rlimit = unsafe { std::mem::zeroed() };
    // SAFETY: a valid rlimit for RLIMIT_NOFILE.
    unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut r) };
    if r.rlim_cur >= want {
        return Ok(());
    }
    r.rlim_cur = want.min(r.rlim_max.max(want));
    r.rlim_max = r.rlim_max.max(r.rlim_cur);
    // SAFETY: a valid rlimit for RLIMIT_NOFILE.
    if unsafe { libc::setrlimit(libc::RLIMIT_NOFILE, &r) } != 0 {
        bail!(
            "cannot open {clients} sockets: the open-file limit is {} ({})",
            r.rlim_cur,
            std::io::Error::last_os_error()
        );
    }
    Ok(())
}

pub fn run(a: &RunArgs) -> Result<Report> {
    check(a)?;
    let n = a.clients as usize;
    raise_fd_limit(n)?;
    let (server_key, keys) = keys(a.seed, n);
    let server_pub = server_key.public_key();
    drop(server_key);
    let target = *TARGET.ip();
    let mut clients = Vec::with_capacity(n);
    for (i, k) in keys.into_iter().enumerate() {
        let flow = wire::Flow {
            src: client_ip(i),
            sport: CLIENT_PORT,
            dst: target,
            dport: TARGET.port(),
        };
        let bind = match a.bind[i % a.bind.len()] {
            // Unspecified: any address of the server's family.
            b if b.is_unspecified() && a.server.is_ipv6() => IpAddr::from(std::net::Ipv6Addr::UNSPECIFIED),
            b if b.is_unspecified() => IpAddr::from(Ipv4Addr::UNSPECIFIED),
            b => b,
        };
        let bind = SocketAddr::new(bind, 0);
        let client = Client::new(i as u32, k, server_pub, a.server, bind, flow, a.size)
            .with_context(|| format!("client {i}: cannot open its socket on {bind}"))?;
        // Every (1 / share)-th client roams, over the bind addresses from its own on.
        let roams = a.roam_share > 0.0 && (i as f64 * a.roam_share).floor() != ((i + 1) as f64 * a.roam_share).floor();
        clients.push(if roams {
            let binds = (0..a.bind.len())
                .map(|k| match a.bind[(i + k) % a.bind.len()] {
                    b if b.is_unspecified() => bind.ip(),
                    b => b,
                })
                .collect();
            client.roaming(binds)
        } else {
            client
        });
    }
    let sink = a.sink_netns.as_deref().map(SinkChild::start).transpose()?;
    let plan = Plan {
        up_rate: if a.direction == Direction::Down && !a.rr {
            0
        } else {
            a.rate
        },
        down_rate: if matches!(a.direction, Direction::Down | Direction::Both) && !a.rr {
            a.rate
        } else {
            0
        },
        size: a.size,
        poisson: a.poisson,
        rr: a.rr,
        probe_rate: a.probe_rate,
        roam_every: (a.roam_share > 0.0).then(|| Duration::from_secs_f64(a.roam_every)),
    };
    let phase = Arc::new(AtomicU8::new(HANDSHAKE));
    let live = Arc::new(Live::default());
    let interrupted = Arc::new(AtomicBool::new(false));
    signal_hook::flag::register(signal_hook::consts::SIGINT, interrupted.clone())?;
    signal_hook::flag::register(signal_hook::consts::SIGTERM, interrupted.clone())?;
    // Deal the clients out to the threads.
    let threads = (a.threads as usize).min(n);
    let mut shares: Vec<Vec<Client>> = (0..threads).map(|_| Vec::new()).collect();
    for (i, c) in clients.into_iter().enumerate() {
        shares[i % threads].push(c);
    }
    let handles: Vec<_> = shares
        .into_iter()
        .enumerate()
        .map(|(t, share)| {
            let (phase, live) = (phase.clone(), live.clone());
            std::thread::Builder::new()
                .name(format!("loadgen{t}"))
                .spawn(move || client::worker(share, plan, &phase, &live, a_seed(t)))
                .expect("spawn")
        })
        .collect();
    let bar = indicatif::ProgressBar::new(n as u64);
    bar.set_style(
        indicatif::ProgressStyle::with_template("{prefix:>10} [{bar:30}] {pos}/{len} {msg}")
            .expect("valid template")
            .progress_chars("=> "),
    );
    bar.set_prefix("handshakes");
    let t0 = Instant::now();
    let deadline = t0 + Duration::from_secs_f64(a.handshake_timeout);
    while live.up.load(Ordering::Relaxed) < n as u64 && Instant::now() < deadline && !interrupted.load(Ordering::SeqCst)
    {
        bar.set_position(live.up.load(Ordering::Relaxed).min(n as u64));
        std::thread::sleep(Duration::from_millis(50));
    }
    let handshake_seconds = t0.elapsed().as_secs_f64();
    bar.set_position(live.up.load(Ordering::Relaxed).min(n as u64));
    phase.store(TRAFFIC, Ordering::SeqCst);
    let traffic = Instant::now();
    let machine0 = stats::proc_stat();
    let server0 = a.server_pid.and_then(stats::process_cpu_seconds);
    bar.set_prefix("traffic");
    bar.set_length((a.duration * 10.0) as u64);
    bar.set_position(0);
    while traffic.elapsed().as_secs_f64() < a.duration && !interrupted.load(Ordering::SeqCst) {
        std::thread::sleep(Duration::from_millis(100));
        bar.set_position((traffic.elapsed().as_secs_f64() * 10.0) as u64);
        bar.set_message(format!(
            "{} sent, {} received",
            live.sent.load(Ordering::Relaxed),
            live.received.load(Ordering::Relaxed)
        ));
    }
    // The end: clients stop sending, the sink stops its downloads and drains what is in
    // flight toward it, the clients drain what is in flight toward them; then the figures.
    let seconds = traffic.elapsed().as_secs_f64();
    let machine_cpu = stats::core_shares(&machine0, &stats::proc_stat());
    let server_cores = match (server0, a.server_pid.and_then(stats::process_cpu_seconds)) {
        (Some(b), Some(e)) => Some((e - b) / seconds.max(1e-3)),
        _ => None,
    };
    phase.store(DRAIN, Ordering::SeqCst);
    bar.finish_and_clear();
    let sink_report = sink.map(SinkChild::finish).transpose();
    std::thread::sleep(Duration::from_millis(200));
    phase.store(STOP, Ordering::SeqCst);
    let results: Vec<client::WorkerResult> = handles.into_iter().map(|h| h.join().expect("worker")).collect();
    if interrupted.load(Ordering::SeqCst) {
        bail!("interrupted");
    }
    let ended = traffic + Duration::from_secs_f64(seconds);
    let mut r = report(a, handshake_seconds, seconds, ended, results, sink_report?);
    r.machine_cpu = machine_cpu;
    r.server_cores = server_cores;
    Ok(r)
}

/// Each worker's random stream (Poisson gaps, start offsets).
fn a_seed(thread: usize) -> u64 {
    0x10ad_6e00 + thread as u64
}

fn report(
    a: &RunArgs,
    handshake_seconds: f64,
    seconds: f64,
    ended: Instant,
    results: Vec<client::WorkerResult>,
    sink: Option<sink::SinkReport>,
) -> Report {
    let seconds = seconds.max(1e-3);
    let worker_seconds = results.iter().map(|r| r.traffic_seconds).fold(0.0, f64::max).max(1e-3);
    let (mut down, mut rtt) = (stats::Latency::new(), stats::Latency::new());
    let mut late = 0;
    let mut cpu = 0.0;
    let mut per_client = Vec::new();
    let sink_clients: std::collections::HashMap<u32, &sink::SinkClient> = sink
        .as_ref()
        .map(|s| s.clients.iter().map(|c| (c.client, c)).collect())
        .unwrap_or_default();
    let (mut up_sent, mut up_recv, mut down_sent, mut down_recv, mut rr_lost) = (0u64, 0u64, 0u64, 0u64, 0u64);
    let (mut up_bytes, mut down_bytes) = (0u64, 0u64);
    for r in &results {
        down.merge(&r.down);
        rtt.merge(&r.rtt);
        late += r.late;
        cpu += r.cpu_seconds;
        for c in &r.clients {
            let s = sink_clients.get(&c.id);
            let sink_bytes = s.map_or(0, |s| s.bytes);
            if !a.rr {
                up_sent += c.sent;
                up_recv += s.map_or(0, |s| s.received);
                down_sent += s.map_or(0, |s| s.sent);
                down_recv += c.received;
                up_bytes += sink_bytes;
                down_bytes += c.rx_bytes;
            }
            rr_lost += c.rr_lost;
            per_client.push(ClientResult {
                client: c.id,
                up: c.up,
                sent: c.sent,
                received: c.received,
                up_mbit: sink_bytes as f64 * 8.0 / seconds / 1e6,
                down_mbit: c.rx_bytes as f64 * 8.0 / seconds / 1e6,
                rr_done: c.rr_done,
                last_round_trip_s: c
                    .last_round_trip
                    .map(|t| ended.saturating_duration_since(t).as_secs_f64()),
                roams: c.roams,
            });
        }
    }
    per_client.sort_by_key(|c| c.client);
    let goodputs: Vec<f64> = per_client
        .iter()
        .map(|c| match a.direction {
            _ if a.rr => c.rr_done as f64,
            Direction::Up => c.up_mbit,
            Direction::Down => c.down_mbit,
            Direction::Both => c.up_mbit + c.down_mbit,
        })
        .collect();
    let loss = |sent: u64, recv: u64| {
        if sent == 0 {
            0.0
        } else {
            1.0 - recv.min(sent) as f64 / sent as f64
        }
    };
    let loadgen_cores = cpu / worker_seconds;
    let sends: u64 = per_client.iter().map(|c| c.sent).sum();
    let late_share = if sends == 0 { 0.0 } else { late as f64 / sends as f64 };
    let mut warnings = Vec::new();
    if loadgen_cores > 0.9 * a.threads as f64 {
        warnings.push(format!(
            "the load generator used {loadgen_cores:.2} cores with {} thread(s): it may be the bottleneck (try --threads)",
            a.threads
        ));
    }
    if late_share > 0.05 {
        warnings.push(format!(
            "{:.0}% of sends left more than 1 ms late: the generator could not keep the offered rate",
            late_share * 100.0
        ));
    }
    let clients_up = per_client.iter().filter(|c| c.up).count();
    if clients_up < per_client.len() {
        warnings.push(format!(
            "{} client(s) had no session at the end",
            per_client.len() - clients_up
        ));
    }
    if sink.is_none() {
        warnings.push("no sink (--sink-netns): upload figures are missing".into());
    }
    Report {
        clients: per_client.len(),
        clients_up,
        handshake_seconds,
        direction: a.direction,
        rr: a.rr,
        rate_per_client: a.rate,
        probe_rate_per_client: a.probe_rate,
        roam_share: a.roam_share,
        roam_every_s: a.roam_every,
        size: a.size,
        seconds,
        up_gbit: up_bytes as f64 * 8.0 / seconds / 1e9,
        down_gbit: down_bytes as f64 * 8.0 / seconds / 1e9,
        up_loss: loss(up_sent, up_recv),
        down_loss: loss(down_sent, down_recv),
        fairness: jain(&goodputs),
        one_way_up: sink.as_ref().map(|s| s.one_way.clone()).unwrap_or_default(),
        one_way_down: down.summary(),
        round_trip: rtt.summary(),
        rr_lost,
        loadgen_cores,
        loadgen_threads: a.threads,
        late_share,
        warnings,
        sink_cores: sink.as_ref().map_or(0.0, |s| s.cpu_cores),
        server_cores: None,
        machine_cpu: Vec::new(),
        per_client,
    }
}

pub fn render(r: &Report) -> String {
    let lat = |l: &LatencySummary| {
        if l.count == 0 {
            "-".to_string()
        } else {
            format!(
                "p50 {:.0} us, p99 {:.0} us, p99.9 {:.0} us ({} samples)",
                l.p50_us, l.p99_us, l.p999_us, l.count
            )
        }
    };
    let mut s = format!(
        "ordo loadgen: {} clients ({} up, handshakes took {:.1} s), {:?}{}, {} packets/s of {} bytes each, {:.1} s\n",
        r.clients,
        r.clients_up,
        r.handshake_seconds,
        r.direction,
        if r.rr { ", round trips" } else { "" },
        r.rate_per_client,
        r.size,
        r.seconds
    );
    s += &format!(
        "  upload   {:.3} Gbit/s, loss {:.2}%, one-way {}\n",
        r.up_gbit,
        r.up_loss * 100.0,
        lat(&r.one_way_up)
    );
    s += &format!(
        "  download {:.3} Gbit/s, loss {:.2}%, one-way {}\n",
        r.down_gbit,
        r.down_loss * 100.0,
        lat(&r.one_way_down)
    );
    if r.rr {
        s += &format!("  round trips: {}, {} timed out\n", lat(&r.round_trip), r.rr_lost);
    } else if r.probe_rate_per_client > 0 {
        s += &format!(
            "  round trips under load ({} probes/s per client): {}, {} timed out\n",
            r.probe_rate_per_client,
            lat(&r.round_trip),
            r.rr_lost
        );
    }
    s += &format!(
        "  fairness (Jain) {:.3}; load generator {:.2} cores on {} thread(s), sink {:.2} cores\n",
        r.fairness, r.loadgen_cores, r.loadgen_threads, r.sink_cores
    );
    for w in &r.warnings {
        s += &format!("  warning: {w}\n");
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn setup_lists_every_client_once_with_its_address() {
        let conf = server_config(7, 300, 51820);
        assert_eq!(conf.matches("[Peer]").count(), 300);
        assert!(conf.contains("AllowedIPs = 10.200.0.2/32\n"));
        assert!(
            conf.contains("AllowedIPs = 10.200.1.45/32\n"),
            "client 299 is 10.200.0.0 + 301"
        );
        // The same seed gives the same keys: `setup` and `run` agree.
        assert_eq!(keys(7, 3).1[2].public_key(), keys(7, 5).1[2].public_key());
        assert_ne!(keys(7, 1).0.public_key(), keys(8, 1).0.public_key());
    }

    #[test]
    fn bad_arguments_are_refused_with_a_reason() {
        use clap::Parser;
        #[derive(clap::Parser)]
        struct T {
            #[command(subcommand)]
            c: LoadgenCommand,
        }
        let parse = |args: &[&str]| T::try_parse_from(std::iter::once("t").chain(args.iter().copied()));
        assert!(parse(&["run", "--clients", "0", "--server", "1.2.3.4:5"]).is_err());
        assert!(parse(&["run", "--clients", "10", "--server", "nowhere"]).is_err());
        assert!(parse(&["setup", "--clients", "70000"]).is_err());
        let T {
            c: LoadgenCommand::Run(a),
        } = parse(&["run", "--clients", "2", "--server", "1.2.3.4:5", "--size", "20"]).unwrap()
        else {
            panic!("run")
        };
        assert!(check(&a).unwrap_err().to_string().contains("--size"));
        // Probes beside a stream, not beside round trips.
        assert!(parse(&[
            "run",
            "--clients",
            "2",
            "--server",
            "1.2.3.4:5",
            "--rr",
            "--probe-rate",
            "5"
        ])
        .is_err());
        // IPv6 outer addresses, but not mixed with an IPv4 server.
        let run = |args: &[&str]| {
            let mut all = vec!["run", "--clients", "2"];
            all.extend_from_slice(args);
            match parse(&all).unwrap() {
                T {
                    c: LoadgenCommand::Run(a),
                } => check(&a),
                _ => panic!("run"),
            }
        };
        assert!(run(&["--server", "[fd00::2]:51820", "--bind", "fd00::10,fd00::11"]).is_ok());
        assert!(
            run(&["--server", "[fd00::2]:51820"]).is_ok(),
            "0.0.0.0 means any address"
        );
        let mixed = run(&["--server", "10.0.0.2:51820", "--bind", "fd00::10"]).unwrap_err();
        assert!(mixed.to_string().contains("address family"), "{mixed}");
    }
}
