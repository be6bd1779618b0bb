//! The device's figures as metric families. Each scrape builds them afresh from what the
//! device reports (nothing is kept between scrapes), in the Prometheus text format, which
//! Prometheus and `promtool check metrics` read alike.

use crate::device::Device;
use crate::port::CounterKind;
use ordo_proto::DropReason;
use prometheus::{CounterVec, Encoder, GaugeVec, Opts, Registry, TextEncoder};
use std::time::UNIX_EPOCH;

/// What the endpoint answers with.
pub const CONTENT_TYPE: &str = "text/plain; version=0.0.4; charset=utf-8";

/// The metric families of one scrape, each labelled with the interface's name.
struct Families {
    registry: Registry,
    device: String,
}

impl Families {
    fn opts(&self, name: &str, help: &str) -> Opts {
        Opts::new(name, help).const_label("device", self.device.as_str())
    }

    fn counter(&self, name: &str, help: &str, labels: &[&str]) -> CounterVec {
        let c = CounterVec::new(self.opts(name, help), labels).expect("a valid metric name");
        self.registry
            .register(Box::new(c.clone()))
            .expect("each name registered once");
        c
    }

    /// A counter without labels of its own, at `value`.
    fn count(&self, name: &str, help: &str, value: f64) {
        let c = prometheus::Counter::with_opts(self.opts(name, help)).expect("a valid metric name");
        c.inc_by(value);
        self.registry.register(Box::new(c)).expect("each name registered once");
    }

    /// A gauge without labels of its own, at `value`.
    fn level(&self, name: &str, help: &str, value: f64) {
        let g = prometheus::Gauge::with_opts(self.opts(name, help)).expect("a valid metric name");
        g.set(value);
        self.registry.register(Box::new(g)).expect("each name registered once");
    }

    fn gauge(&self, name: &str, help: &str, labels: &[&str]) -> GaugeVec {
        let g = GaugeVec::new(self.opts(name, help), labels).expect("a valid metric name");
        self.registry
            .register(Box::new(g.clone()))
            .expect("each name registered once");
        g
    }
}

/// The scrape's body.
pub fn render(device: &Device) -> String {
    let f = Families {
        registry: Registry::new(),
        device: device.name.clone(),
    };
    peers(&f, device);
    plane(&f, device);
    threads(&f, device);
    let mut out = Vec::new();
    // Encoding into memory fails only on a family the text format cannot hold, which the
    // names above rule out.
    let _ = TextEncoder::new().encode(&f.registry.gather(), &mut out);
    String::from_utf8(out).unwrap_or_default()
}

/// The device and its peers, as the WireGuard exporter names them, with where Ordo runs
/// each peer.
fn peers(f: &Families, device: &Device) {
    let public_key = device
        .core()
        .private_key()
        .map(|k| k.public_key().to_base64())
        .unwrap_or_default();
    f.gauge("wireguard_device_info", "Metadata about a device.", &["public_key"])
        .with_label_values(&[public_key.as_str()])
        .set(1.0);
    let info = f.gauge(
        "wireguard_peer_info",
        "Metadata about a peer. The public_key label on peer metrics refers to the peer's public key; not the device's public key.",
        &["public_key", "endpoint", "allowed_ips"],
    );
    let received = f.counter(
        "wireguard_peer_receive_bytes_total",
        "Number of bytes received from a given peer.",
        &["public_key"],
    );
    let sent = f.counter(
        "wireguard_peer_transmit_bytes_total",
        "Number of bytes transmitted to a given peer.",
        &["public_key"],
    );
    let handshake = f.gauge(
        "wireguard_peer_last_handshake_seconds",
        "UNIX timestamp for the last handshake with a given peer (0: none yet).",
        &["public_key"],
    );
    let queue = f.gauge(
        "ordo_peer_queue",
        "The receive queue a peer's datagrams go to.",
        &["public_key"],
    );
    let place = f.gauge(
        "ordo_peer_placement_info",
        "Where a peer's work runs: the CPUs of its queue's thread, its NUMA node, and its crypto's regime (inline on its queue's core, pool, or pool+thread).",
        &["public_key", "cpus", "node", "regime"],
    );
    let pps = f.gauge(
        "ordo_peer_packets_per_second",
        "A peer's packets per second both ways, over the last placement interval.",
        &["public_key"],
    );
    let cores = f.gauge(
        "ordo_peer_crypto_cores",
        "Cores a peer's crypto took over the last placement interval.",
        &["public_key"],
    );
    for p in device.peer_reports() {
        let key = p.public_key.to_base64();
        let key = key.as_str();
        let endpoint = p.endpoint.map(|e| e.to_string()).unwrap_or_default();
        let allowed: Vec<String> = p.allowed_ips.iter().map(|n| n.to_string()).collect();
        info.with_label_values(&[key, endpoint.as_str(), allowed.join(",").as_str()])
            .set(1.0);
        received.with_label_values(&[key]).inc_by(p.rx_bytes as f64);
        sent.with_label_values(&[key]).inc_by(p.tx_bytes as f64);
        let at = p.last_handshake.and_then(|t| t.duration_since(UNIX_EPOCH).ok());
        handshake
            .with_label_values(&[key])
            .set(at.map_or(0.0, |d| d.as_secs_f64()));
        let pl = &p.placement;
        queue.with_label_values(&[key]).set(pl.queue as f64);
        let cpus = crate::host::topology::format_cpu_list(&pl.cpus);
        place
            .with_label_values(&[key, cpus.as_str(), pl.node.to_string().as_str(), pl.regime.name()])
            .set(1.0);
        pps.with_label_values(&[key]).set(pl.pps);
        cores.with_label_values(&[key]).set(pl.cores);
    }
}

/// The interface as a whole: its paths and offloads, drops by reason (Ordo's and the
/// kernel's), handshakes, placement.
fn plane(f: &Families, device: &Device) {
    f.gauge(
        "ordo_info",
        "The interface's execution model and outer path.",
        &["model", "outer_path"],
    )
    .with_label_values(&[device.model().name(), device.outer_path().as_str()])
    .set(1.0);
    let (stats, under_load, mtu) = {
        let core = device.core();
        (
            core.stats.clone(),
            core.under_load(std::time::Instant::now()),
            core.mtu(),
        )
    };
    let drops = f.counter(
        "ordo_drops_total",
        "Packets dropped, by reason and by who counted them: Ordo, or the kernel before Ordo saw them (a full socket buffer or ring).",
        &["reason", "counted_by"],
    );
    for r in DropReason::ALL {
        drops
            .with_label_values(&[r.name(), "ordo"])
            .inc_by(stats.dropped(r) as f64);
    }
    let state = f.gauge(
        "ordo_port_state",
        "How a port stands: an offload or XDP mode on (1) or off (0), how many queues or AF_XDP sockets.",
        &["name"],
    );
    let events = f.counter(
        "ordo_port_events_total",
        "What a port counts besides drops: writes, coalesced packets, frames sent, the XDP program's verdicts.",
        &["name"],
    );
    for c in device.port_counters() {
        if let Some(reason) = c.name.strip_prefix("drop_os_") {
            drops.with_label_values(&[reason, "kernel"]).inc_by(c.value as f64);
        } else if let Some(reason) = c.name.strip_prefix("drop_") {
            drops.with_label_values(&[reason, "ordo"]).inc_by(c.value as f64);
        } else if c.kind == CounterKind::Level {
            state.with_label_values(&[c.name]).set(c.value as f64);
        } else {
            events.with_label_values(&[c.name]).inc_by(c.value as f64);
        }
    }
    for (name, help, value) in [
        (
            "ordo_handshakes_initiated_total",
            "Handshakes this interface began.",
            stats.handshakes_initiated,
        ),
        (
            "ordo_handshakes_completed_total",
            "Handshakes that gave a session.",
            stats.handshakes_completed,
        ),
        (
            "ordo_cookie_replies_sent_total",
            "Cookie replies sent to peers while under load.",
            stats.cookie_replies_sent,
        ),
        (
            "ordo_cookie_replies_accepted_total",
            "Cookie replies accepted from peers.",
            stats.cookie_replies_accepted,
        ),
    ] {
        f.count(name, help, value as f64);
    }
    for (name, help, value) in [
        (
            "ordo_under_load",
            "Whether handshakes are answered with cookies (1) or not (0).",
            under_load as u64 as f64,
        ),
        ("ordo_mtu_bytes", "The tunnel's MTU.", mtu as f64),
        ("ordo_crypto_workers", "Crypto worker threads.", device.workers() as f64),
        (
            "ordo_uptime_seconds",
            "Seconds since the interface started.",
            device.uptime().as_secs_f64(),
        ),
    ] {
        f.level(name, help, value);
    }
    let moves = device.plane.moves();
    let m = f.counter(
        "ordo_placement_moves_total",
        "Peers moved by the load-aware placement: to another queue, another NUMA node's pool, or their crypto between their queue and the pool (spread).",
        &["kind"],
    );
    for (kind, n) in [("queue", moves.queue), ("pool", moves.pool), ("spread", moves.spread)] {
        m.with_label_values(&[kind]).inc_by(n as f64);
    }
    let plan = &device.plane.plan;
    if !plan.model.has_queues() {
        return;
    }
    let released = f.gauge(
        "ordo_queue_released",
        "Whether a queue's thread is released from its CPU under contention (1) or pinned (0).",
        &["queue", "cpu"],
    );
    let releases = f.counter(
        "ordo_queue_releases_total",
        "Times a queue's thread was released from its CPU.",
        &["queue", "cpu"],
    );
    for (q, a) in device.plane.queue_affinity().iter().enumerate() {
        let (queue, cpu) = (q.to_string(), plan.queues[q].to_string());
        let labels = [queue.as_str(), cpu.as_str()];
        released.with_label_values(&labels).set(a.is_released() as u64 as f64);
        releases.with_label_values(&labels).inc_by(a.releases as f64);
    }
    let other = f.gauge(
        "ordo_queue_cpu_other_cores",
        "Cores of other work on a queue's CPU over the last placement interval (other processes, the kernel's softirq work).",
        &["queue", "cpu"],
    );
    let idle = f.gauge(
        "ordo_queue_cpu_idle_ratio",
        "How idle a queue's CPU was over the last placement interval.",
        &["queue", "cpu"],
    );
    let wait = f.gauge(
        "ordo_queue_thread_wait_ratio",
        "The share of the last placement interval a queue's thread waited to run.",
        &["queue", "cpu"],
    );
    for (q, seen) in device.plane.queues_last_seen().iter().enumerate() {
        let (queue, cpu) = (q.to_string(), plan.queues[q].to_string());
        let labels = [queue.as_str(), cpu.as_str()];
        other.with_label_values(&labels).set(seen.other);
        idle.with_label_values(&labels).set(seen.idle);
        wait.with_label_values(&labels).set(seen.wait);
    }
}

/// Per thread and stage, Ordo's own measure of its work, beside what the OS charged each
/// thread (papers/001: the two can disagree).
fn threads(f: &Families, device: &Device) {
    use crate::plane::stats::Stage;
    use std::sync::atomic::Ordering::Relaxed;
    let labels = ["thread", "tid", "stage"];
    let packets = f.counter(
        "ordo_stage_packets_total",
        "Packets through a stage, by thread.",
        &labels,
    );
    let batches = f.counter(
        "ordo_stage_batches_total",
        "Batches through a stage, by thread.",
        &labels,
    );
    let busy = f.counter(
        "ordo_stage_busy_seconds_total",
        "Time a thread spent in a stage, by Ordo's own clock.",
        &labels,
    );
    let wakeups = f.counter(
        "ordo_stage_wakeups_total",
        "Times a delivery stage started work (became a lane's deliverer).",
        &labels,
    );
    let wasted = f.counter(
        "ordo_stage_wasted_wakeups_total",
        "Times a delivery stage started and found nothing to do.",
        &labels,
    );
    let thread = ["thread", "tid"];
    let own = f.counter(
        "ordo_thread_busy_seconds_total",
        "Time a data-plane thread spent working, by Ordo's own clock.",
        &thread,
    );
    let os = f.counter(
        "ordo_thread_os_cpu_seconds_total",
        "CPU time the OS charged to a data-plane thread (user and system).",
        &thread,
    );
    let sleeps = f.counter(
        "ordo_thread_os_sleeps_total",
        "Times the OS switched a thread out because it waited (voluntary switches).",
        &thread,
    );
    let preemptions = f.counter(
        "ordo_thread_os_preemptions_total",
        "Times the OS switched a thread out while it could still run (involuntary switches).",
        &thread,
    );
    for t in device.stats().threads() {
        let tid = t.tid.to_string();
        let th = [t.name.as_str(), tid.as_str()];
        own.with_label_values(&th).inc_by(t.busy_ns.load(Relaxed) as f64 / 1e9);
        if let Some(o) = t.os() {
            os.with_label_values(&th).inc_by(o.cpu.as_secs_f64());
            sleeps.with_label_values(&th).inc_by(o.sleeps as f64);
            preemptions.with_label_values(&th).inc_by(o.preemptions as f64);
        }
        for s in Stage::ALL {
            let st = t.stage(s);
            let w = st.wakeups.load(Relaxed);
            if st.batches.load(Relaxed) + w == 0 {
                // A stage this thread does not run.
                continue;
            }
            let l = [t.name.as_str(), tid.as_str(), s.name()];
            packets.with_label_values(&l).inc_by(st.packets.load(Relaxed) as f64);
            batches.with_label_values(&l).inc_by(st.batches.load(Relaxed) as f64);
            busy.with_label_values(&l).inc_by(st.busy_ns.load(Relaxed) as f64 / 1e9);
            if matches!(s, Stage::DeliverInbound | Stage::DeliverOutbound) {
                wakeups.with_label_values(&l).inc_by(w as f64);
                wasted
                    .with_label_values(&l)
                    .inc_by(st.wasted_wakeups.load(Relaxed) as f64);
            }
        }
    }
}
