//! The device's figures as metric families. Each scrape builds them afresh from what the
//! device reports (nothing is kept between scrapes), in the Prometheus text format, which
//! Prometheus and `promtool check metrics` read alike.

use crate::device::report::DeviceReport;
use crate::device::Device;
use crate::port::CounterKind;
use ordo_proto::DropReason;
use prometheus::proto::{self, LabelPair, MetricFamily, MetricType};
use prometheus::TextEncoder;
use std::time::UNIX_EPOCH;

/// What the endpoint answers with.
pub const CONTENT_TYPE: &str = "text/plain; version=0.0.4; charset=utf-8";

/// One metric family being filled. Built on the `prometheus` crate's data model directly,
/// not through its registry: the registry validates and allocates a descriptor for every
/// labelled child, which made a scrape of 10,000 peers take a third of a second.
struct Family(MetricFamily);

impl Family {
    fn new(name: &str, help: &str, kind: MetricType) -> Family {
        let mut f = MetricFamily::default();
        f.set_name(name.to_string());
        f.set_help(help.to_string());
        f.set_field_type(kind);
        Family(f)
    }

    fn counter(name: &str, help: &str) -> Family {
        Family::new(name, help, MetricType::COUNTER)
    }

    fn gauge(name: &str, help: &str) -> Family {
        Family::new(name, help, MetricType::GAUGE)
    }

    /// One sample, with its labels.
    fn add(&mut self, labels: &[(&str, &str)], value: f64) {
        let labels = labels
            .iter()
            .map(|(k, v)| {
                let mut l = LabelPair::default();
                l.set_name(k.to_string());
                l.set_value(v.to_string());
                l
            })
            .collect();
        let mut m = proto::Metric::from_label(labels);
        if self.0.get_field_type() == MetricType::COUNTER {
            let mut c = proto::Counter::default();
            c.set_value(value);
            m.set_counter(c);
        } else {
            let mut g = proto::Gauge::default();
            g.set_value(value);
            m.set_gauge(g);
        }
        self.0.mut_metric().push(m);
    }

    /// A family of one sample without labels.
    fn single(name: &str, help: &str, kind: MetricType, value: f64) -> Family {
        let mut f = Family::new(name, help, kind);
        f.add(&[], value);
        f
    }
}

/// The scrape's body.
pub fn render(device: &Device) -> String {
    let mut families = Vec::new();
    let report = device.report();
    peers(&mut families, device, &report);
    plane(&mut families, device, &report);
    threads(&mut families, device);
    health(&mut families, device);
    let families: Vec<MetricFamily> = (families.into_iter())
        .filter(|f| !f.0.get_metric().is_empty())
        .map(|f| f.0)
        .collect();
    let mut out = String::new();
    // Encoding into memory fails only on a family the text format cannot hold, which the
    // names here rule out.
    let _ = TextEncoder::new().encode_utf8(&families, &mut out);
    out
}

/// The device and its peers, as the WireGuard exporter names them (the device's name only on
/// the info families, as there), with where Ordo runs each peer.
fn peers(out: &mut Vec<Family>, device: &Device, report: &DeviceReport) {
    let public_key = report.public_key.map(|k| k.to_base64()).unwrap_or_default();
    let mut device_info = Family::gauge("wireguard_device_info", "Metadata about a device.");
    device_info.add(&[("device", &device.name), ("public_key", &public_key)], 1.0);
    out.push(device_info);
    let mut info = Family::gauge(
        "wireguard_peer_info",
        "Metadata about a peer. The public_key label on peer metrics refers to the peer's public key; not the device's public key.",
    );
    let mut received = Family::counter(
        "wireguard_peer_receive_bytes_total",
        "Number of bytes received from a given peer.",
    );
    let mut sent = Family::counter(
        "wireguard_peer_transmit_bytes_total",
        "Number of bytes transmitted to a given peer.",
    );
    let mut handshake = Family::gauge(
        "wireguard_peer_last_handshake_seconds",
        "UNIX timestamp for the last handshake with a given peer (0: none yet).",
    );
    let mut place = Family::gauge(
        "ordo_peer_placement_info",
        "Where a peer's work runs: its receive queue, the CPUs of that queue's thread, its NUMA node, and its crypto's regime (inline on its queue's core, pool, or pool+thread).",
    );
    let mut pps = Family::gauge(
        "ordo_peer_packets_per_second",
        "A peer's packets per second both ways, over the last placement interval.",
    );
    let mut cores = Family::gauge(
        "ordo_peer_crypto_cores",
        "Cores a peer's crypto took over the last placement interval.",
    );
    for p in &report.peers {
        let key = p.public_key.to_base64();
        let key = key.as_str();
        let endpoint = p.endpoint.map(|e| e.to_string()).unwrap_or_default();
        let allowed: Vec<String> = p.allowed_ips.iter().map(|n| n.to_string()).collect();
        info.add(
            &[
                ("allowed_ips", &allowed.join(",")),
                ("device", &device.name),
                ("endpoint", &endpoint),
                ("public_key", key),
            ],
            1.0,
        );
        received.add(&[("public_key", key)], p.rx_bytes as f64);
        sent.add(&[("public_key", key)], p.tx_bytes as f64);
        let at = p.last_handshake.and_then(|t| t.duration_since(UNIX_EPOCH).ok());
        handshake.add(&[("public_key", key)], at.map_or(0.0, |d| d.as_secs() as f64));
        let pl = &p.placement;
        place.add(
            &[
                ("cpus", &crate::host::topology::format_cpu_list(&pl.cpus)),
                ("node", &pl.node.to_string()),
                ("public_key", key),
                ("queue", &pl.queue.to_string()),
                ("regime", pl.regime.name()),
            ],
            1.0,
        );
        pps.add(&[("public_key", key)], pl.pps);
        cores.add(&[("public_key", key)], pl.cores);
    }
    out.extend([info, received, sent, handshake, place, pps, cores]);
}

/// The interface as a whole: its paths and offloads, drops by reason (Ordo's and the
/// kernel's), handshakes, placement.
fn plane(out: &mut Vec<Family>, device: &Device, report: &DeviceReport) {
    let mut info = Family::gauge("ordo_info", "The interface's execution model and outer path.");
    info.add(
        &[
            ("device", &device.name),
            ("model", device.model().name()),
            ("outer_path", &device.outer_path()),
        ],
        1.0,
    );
    out.push(info);
    let DeviceReport {
        stats, under_load, mtu, ..
    } = report;
    let mut drops = Family::counter(
        "ordo_drops_total",
        "Packets dropped, by reason and by who counted them: Ordo, or the kernel before Ordo saw them (a full socket buffer or ring).",
    );
    for r in DropReason::ALL {
        drops.add(&[("counted_by", "ordo"), ("reason", r.name())], stats.dropped(r) as f64);
    }
    let mut state = Family::gauge(
        "ordo_port_state",
        "How a port stands: an offload or XDP mode on (1) or off (0), how many queues or AF_XDP sockets.",
    );
    let mut events = Family::counter(
        "ordo_port_events_total",
        "What a port counts besides drops: writes, coalesced packets, frames sent, the XDP program's verdicts.",
    );
    for c in device.port_counters() {
        let value = c.value as f64;
        if let Some(reason) = c.name.strip_prefix("drop_os_") {
            drops.add(&[("counted_by", "kernel"), ("reason", reason)], value);
        } else if let Some(reason) = c.name.strip_prefix("drop_") {
            drops.add(&[("counted_by", "ordo"), ("reason", reason)], value);
        } else if c.kind == CounterKind::Level {
            state.add(&[("name", c.name)], value);
        } else {
            events.add(&[("name", c.name)], value);
        }
    }
    out.extend([drops, state, events]);
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
        out.push(Family::single(name, help, MetricType::COUNTER, value as f64));
    }
    for (name, help, value) in [
        (
            "ordo_under_load",
            "Whether handshakes are answered with cookies (1) or not (0).",
            *under_load as u64 as f64,
        ),
        ("ordo_mtu_bytes", "The tunnel's MTU.", *mtu as f64),
        ("ordo_crypto_workers", "Crypto worker threads.", device.workers() as f64),
        (
            "ordo_uptime_seconds",
            "Seconds since the interface started.",
            device.uptime().as_secs_f64(),
        ),
    ] {
        out.push(Family::single(name, help, MetricType::GAUGE, value));
    }
    let moves = device.plane.moves();
    let mut m = Family::counter(
        "ordo_placement_moves_total",
        "Peers moved by the load-aware placement: to another queue, another NUMA node's pool, or their crypto between their queue and the pool (spread).",
    );
    for (kind, n) in [("queue", moves.queue), ("pool", moves.pool), ("spread", moves.spread)] {
        m.add(&[("kind", kind)], n as f64);
    }
    out.push(m);
    let plan = &device.plane.plan;
    if !plan.model.has_queues() {
        return;
    }
    let mut released = Family::gauge(
        "ordo_queue_released",
        "Whether a queue's thread is released from its CPU under contention (1) or pinned (0).",
    );
    let mut releases = Family::counter(
        "ordo_queue_releases_total",
        "Times a queue's thread was released from its CPU.",
    );
    for (q, a) in device.plane.queue_affinity().iter().enumerate() {
        let (queue, cpu) = (q.to_string(), plan.queues[q].to_string());
        let labels = [("cpu", cpu.as_str()), ("queue", queue.as_str())];
        released.add(&labels, a.is_released() as u64 as f64);
        releases.add(&labels, a.releases as f64);
    }
    let mut other = Family::gauge(
        "ordo_queue_cpu_other_cores",
        "Cores of other work on a queue's CPU over the last placement interval (other processes, the kernel's softirq work).",
    );
    let mut idle = Family::gauge(
        "ordo_queue_cpu_idle_ratio",
        "How idle a queue's CPU was over the last placement interval.",
    );
    let mut wait = Family::gauge(
        "ordo_queue_thread_wait_ratio",
        "The share of the last placement interval a queue's thread waited to run.",
    );
    for (q, seen) in device.plane.queues_last_seen().iter().enumerate() {
        let (queue, cpu) = (q.to_string(), plan.queues[q].to_string());
        let labels = [("cpu", cpu.as_str()), ("queue", queue.as_str())];
        other.add(&labels, seen.other);
        idle.add(&labels, seen.idle);
        wait.add(&labels, seen.wait);
    }
    out.extend([released, releases, other, idle, wait]);
}

/// Per thread and stage, Ordo's own measure of its work, beside what the OS charged each
/// thread (the two can disagree: the kernel counts softirq work in interrupt context as idle).
fn threads(out: &mut Vec<Family>, device: &Device) {
    use crate::plane::stats::Stage;
    use std::sync::atomic::Ordering::Relaxed;
    let mut packets = Family::counter("ordo_stage_packets_total", "Packets through a stage, by thread.");
    let mut batches = Family::counter("ordo_stage_batches_total", "Batches through a stage, by thread.");
    let mut busy = Family::counter(
        "ordo_stage_busy_seconds_total",
        "Time a thread spent in a stage, by Ordo's own clock.",
    );
    let mut wakeups = Family::counter(
        "ordo_stage_wakeups_total",
        "Times a delivery stage started work (became a lane's deliverer).",
    );
    let mut wasted = Family::counter(
        "ordo_stage_wasted_wakeups_total",
        "Times a delivery stage started and found nothing to do.",
    );
    let mut own = Family::counter(
        "ordo_thread_busy_seconds_total",
        "Time a data-plane thread spent working, by Ordo's own clock.",
    );
    let mut os = Family::counter(
        "ordo_thread_os_cpu_seconds_total",
        "CPU time the OS charged to a data-plane thread (user and system).",
    );
    let mut sleeps = Family::counter(
        "ordo_thread_os_sleeps_total",
        "Times the OS switched a thread out because it waited (voluntary switches).",
    );
    let mut preemptions = Family::counter(
        "ordo_thread_os_preemptions_total",
        "Times the OS switched a thread out while it could still run (involuntary switches).",
    );
    for t in device.stats().threads() {
        let tid = t.tid.to_string();
        let th = [("thread", t.name.as_str()), ("tid", tid.as_str())];
        own.add(&th, t.busy_ns.load(Relaxed) as f64 / 1e9);
        if let Some(o) = t.os() {
            os.add(&th, o.cpu.as_secs_f64());
            sleeps.add(&th, o.sleeps as f64);
            preemptions.add(&th, o.preemptions as f64);
        }
        for s in Stage::ALL {
            let st = t.stage(s);
            let w = st.wakeups.load(Relaxed);
            if st.batches.load(Relaxed) + w == 0 {
                // A stage this thread does not run.
                continue;
            }
            let l = [("stage", s.name()), ("thread", t.name.as_str()), ("tid", tid.as_str())];
            packets.add(&l, st.packets.load(Relaxed) as f64);
            batches.add(&l, st.batches.load(Relaxed) as f64);
            busy.add(&l, st.busy_ns.load(Relaxed) as f64 / 1e9);
            if matches!(s, Stage::DeliverInbound | Stage::DeliverOutbound) {
                wakeups.add(&l, w as f64);
                wasted.add(&l, st.wasted_wakeups.load(Relaxed) as f64);
            }
        }
    }
    out.extend([packets, batches, busy, wakeups, wasted, own, os, sleeps, preemptions]);
}

/// The last second as the plane judged it (`crate::health`): the detectors' verdicts, the
/// cores per stage, and each CPU's time by kind beside Ordo's threads there.
fn health(out: &mut Vec<Family>, device: &Device) {
    use crate::health::Detector;
    let report = device.health.report();
    let mut active = Family::gauge(
        "ordo_warning_active",
        "Whether a detector found its condition in the last second (1) or not (0): execution order inversion, a black hole, Ordo's clock and the OS's accounting disagreeing. `ordo show` words it.",
    );
    for d in Detector::ALL {
        let on = report.warnings.iter().any(|w| w.detector == d);
        active.add(&[("detector", d.name())], on as u64 as f64);
    }
    out.push(active);
    let Some(i) = report.interval else {
        return;
    };
    let mut stage = Family::gauge(
        "ordo_stage_cores",
        "Cores a stage took in the last second, by Ordo's clock.",
    );
    for st in &i.stages {
        stage.add(&[("stage", st.stage.name())], st.cores);
    }
    let mut time = Family::gauge(
        "ordo_cpu_time_ratio",
        "A CPU's last second by kind, as the OS accounts it (/proc/stat): tasks, irq, softirq, steal, idle.",
    );
    let mut ordo = Family::gauge(
        "ordo_cpu_ordo_cores",
        "Ordo's threads on a CPU in the last second: by Ordo's clock (waits for the CPU taken out) and as the OS charged them.",
    );
    for c in &i.cpus {
        let cpu = c.cpu.to_string();
        for (kind, v) in [
            ("tasks", c.tasks),
            ("irq", c.irq),
            ("softirq", c.softirq),
            ("steal", c.steal),
            ("idle", c.idle),
        ] {
            time.add(&[("cpu", &cpu), ("kind", kind)], v);
        }
        ordo.add(&[("clock", "ordo"), ("cpu", &cpu)], c.ordo_clock);
        ordo.add(&[("clock", "os"), ("cpu", &cpu)], c.ordo_os);
    }
    out.extend([stage, time, ordo]);
}
