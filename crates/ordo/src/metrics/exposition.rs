//! The device's figures as metric families. Each scrape builds them afresh from what the
//! device reports (nothing is kept between scrapes), in the Prometheus text format, which
//! Prometheus and `promtool check metrics` read alike.

use crate::device::report::InterfaceReport;
use crate::device::Device;
use prometheus::proto::{self, LabelPair, MetricFamily, MetricType};
use prometheus::TextEncoder;

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
    render_report(&device.report())
}

/// The families of one interface's report.
pub fn render_report(report: &InterfaceReport) -> String {
    let mut families = Vec::new();
    peers(&mut families, report);
    plane(&mut families, report);
    parts(&mut families, report);
    threads(&mut families, report);
    health(&mut families, report);
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
fn peers(out: &mut Vec<Family>, report: &InterfaceReport) {
    let device = report.name.as_str();
    let public_key = report.public_key.clone().unwrap_or_default();
    let mut device_info = Family::gauge("wireguard_device_info", "Metadata about a device.");
    device_info.add(&[("device", device), ("public_key", &public_key)], 1.0);
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
        let key = p.public_key.as_str();
        let endpoint = p.endpoint.clone().unwrap_or_default();
        info.add(
            &[
                ("allowed_ips", &p.allowed_ips.join(",")),
                ("device", device),
                ("endpoint", &endpoint),
                ("public_key", key),
            ],
            1.0,
        );
        received.add(&[("public_key", key)], p.rx_bytes as f64);
        sent.add(&[("public_key", key)], p.tx_bytes as f64);
        handshake.add(&[("public_key", key)], p.latest_handshake as f64);
        let Some(pl) = &p.placement else { continue };
        place.add(
            &[
                ("cpus", &pl.cpu),
                ("node", &pl.node.to_string()),
                ("public_key", key),
                ("queue", &pl.queue.to_string()),
                ("regime", &pl.regime),
            ],
            1.0,
        );
        pps.add(&[("public_key", key)], pl.pps as f64);
        cores.add(&[("public_key", key)], pl.millicores as f64 / 1000.0);
    }
    out.extend([info, received, sent, handshake, place, pps, cores]);
}

/// The interface as a whole: its paths and offloads, drops by reason (Ordo's and the
/// kernel's), handshakes, placement.
fn plane(out: &mut Vec<Family>, report: &InterfaceReport) {
    let mut info = Family::gauge("ordo_info", "The interface's execution model and outer path.");
    info.add(
        &[
            ("device", &report.name),
            ("model", &report.model),
            ("outer_path", &report.outer),
        ],
        1.0,
    );
    out.push(info);
    let mut drops = Family::counter(
        "ordo_drops_total",
        "Packets dropped, by reason and by who counted them: Ordo, or the kernel before Ordo saw them (a full socket buffer or ring).",
    );
    let mut state = Family::gauge(
        "ordo_port_state",
        "How a port stands: an offload or XDP mode on (1) or off (0), how many queues or AF_XDP sockets.",
    );
    let mut events = Family::counter(
        "ordo_port_events_total",
        "What a port counts besides drops: writes, coalesced packets, frames sent, the XDP program's verdicts.",
    );
    let count = |name: &str| report.counters.get(name).copied().unwrap_or(0) as f64;
    for (name, value) in &report.counters {
        let value = *value as f64;
        if let Some(reason) = name.strip_prefix("drop_os_") {
            drops.add(&[("counted_by", "kernel"), ("reason", reason)], value);
        } else if let Some(reason) = name.strip_prefix("drop_") {
            drops.add(&[("counted_by", "ordo"), ("reason", reason)], value);
        }
    }
    // The ports' drops are in the drops family above.
    for p in (report.port_figures.iter()).filter(|p| !p.name.starts_with("drop_")) {
        let family = if p.level { &mut state } else { &mut events };
        family.add(&[("name", &p.name)], count(&p.name));
    }
    out.extend([drops, state, events]);
    for (name, help, value) in [
        (
            "ordo_handshakes_initiated_total",
            "Handshakes this interface began.",
            count("handshakes_initiated"),
        ),
        (
            "ordo_handshakes_completed_total",
            "Handshakes that gave a session.",
            count("handshakes_completed"),
        ),
        (
            "ordo_cookie_replies_sent_total",
            "Cookie replies sent to peers while under load.",
            count("cookie_replies_sent"),
        ),
        (
            "ordo_cookie_replies_accepted_total",
            "Cookie replies accepted from peers.",
            count("cookie_replies_accepted"),
        ),
        (
            "ordo_fleet_forwarded_total",
            "Data messages passed to the fleet's gateway that holds their session.",
            count("fleet_forwarded"),
        ),
        (
            "ordo_fleet_takeovers_total",
            "Clients of a fleet's gateway that was down taken over with a handshake from here.",
            count("fleet_takeovers"),
        ),
        (
            "ordo_fleet_envelopes_opened_total",
            "Datagrams passed here by other gateways of the fleet.",
            count("fleet_envelopes_opened"),
        ),
    ] {
        out.push(Family::single(name, help, MetricType::COUNTER, value));
    }
    for (name, help, value) in [
        (
            "ordo_under_load",
            "Whether handshakes are answered with cookies (1) or not (0).",
            count("under_load"),
        ),
        ("ordo_mtu_bytes", "The tunnel's MTU.", count("mtu")),
        ("ordo_crypto_workers", "Crypto worker threads.", count("workers")),
        (
            "ordo_uptime_seconds",
            "Seconds since the interface started.",
            count("uptime_sec"),
        ),
    ] {
        out.push(Family::single(name, help, MetricType::GAUGE, value));
    }
    let moves = report.moves;
    let mut m = Family::counter(
        "ordo_placement_moves_total",
        "Peers moved by the load-aware placement: to another queue, another NUMA node's pool, or their crypto between their queue and the pool (spread).",
    );
    for (kind, n) in [("queue", moves.queue), ("pool", moves.pool), ("spread", moves.spread)] {
        m.add(&[("kind", kind)], n as f64);
    }
    out.push(m);
    if report.queues.is_empty() {
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
    for q in &report.queues {
        let (queue, cpu) = (q.queue.to_string(), q.cpu.to_string());
        let labels = [("cpu", cpu.as_str()), ("queue", queue.as_str())];
        released.add(&labels, q.released as u64 as f64);
        releases.add(&labels, q.releases as f64);
        if let Some(seen) = &q.last_interval {
            other.add(&labels, seen.other_millicores as f64 / 1000.0);
            idle.add(&labels, seen.idle_permille as f64 / 1000.0);
            wait.add(&labels, seen.thread_wait_permille as f64 / 1000.0);
        }
    }
    out.extend([released, releases, other, idle, wait]);
}

/// The figures of the parts beside the data plane (the fleet's agent), by part and name.
fn parts(out: &mut Vec<Family>, report: &InterfaceReport) {
    let mut part_state = Family::gauge(
        "ordo_part_state",
        "How a part beside the data plane stands (the fleet's agent: etcd reached, its revision, its peers and return routes).",
    );
    let mut part_events = Family::counter(
        "ordo_part_events_total",
        "What a part beside the data plane counts (the fleet's agent: records refused, etcd lost, changes applied).",
    );
    for p in &report.parts {
        for f in &p.figures {
            let family = if f.level { &mut part_state } else { &mut part_events };
            family.add(&[("part", &p.part), ("name", &f.name)], f.value as f64);
        }
    }
    out.extend([part_state, part_events]);
}

/// Per thread and stage, Ordo's own measure of its work, beside what the OS charged each
/// thread (the two can disagree: the kernel counts softirq work in interrupt context as idle).
fn threads(out: &mut Vec<Family>, report: &InterfaceReport) {
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
    for t in &report.thread_totals {
        let tid = t.tid.to_string();
        let th = [("thread", t.name.as_str()), ("tid", tid.as_str())];
        own.add(&th, t.busy_us as f64 / 1e6);
        if let Some(o) = &t.os {
            os.add(&th, o.cpu_us as f64 / 1e6);
            sleeps.add(&th, o.sleeps as f64);
            preemptions.add(&th, o.preemptions as f64);
        }
        for st in &t.stages {
            let l = [
                ("stage", st.stage.as_str()),
                ("thread", t.name.as_str()),
                ("tid", tid.as_str()),
            ];
            packets.add(&l, st.packets as f64);
            batches.add(&l, st.batches as f64);
            busy.add(&l, st.busy_us as f64 / 1e6);
            if let (Some(w), Some(x)) = (st.wakeups, st.wasted_wakeups) {
                wakeups.add(&l, w as f64);
                wasted.add(&l, x as f64);
            }
        }
    }
    out.extend([packets, batches, busy, wakeups, wasted, own, os, sleeps, preemptions]);
}

/// The last second as the plane judged it (`crate::health`): the detectors' verdicts, the
/// cores per stage, and each CPU's time by kind beside Ordo's threads there.
fn health(out: &mut Vec<Family>, report: &InterfaceReport) {
    use crate::health::Detector;
    let mut active = Family::gauge(
        "ordo_warning_active",
        "Whether a detector found its condition in the last second (1) or not (0): execution order inversion, a black hole, Ordo's clock and the OS's accounting disagreeing. `ordo show` words it.",
    );
    for d in Detector::ALL {
        let on = report.warnings.iter().any(|w| w.detector == d.name());
        active.add(&[("detector", d.name())], on as u64 as f64);
    }
    out.push(active);
    if report.stages.is_empty() && report.cpus.is_empty() {
        return;
    }
    let mut stage = Family::gauge(
        "ordo_stage_cores",
        "Cores a stage took in the last second, by Ordo's clock.",
    );
    for st in &report.stages {
        stage.add(&[("stage", &st.name)], st.millicores as f64 / 1000.0);
    }
    let mut time = Family::gauge(
        "ordo_cpu_time_ratio",
        "A CPU's last second by kind, as the OS accounts it (/proc/stat): tasks, irq, softirq, steal, idle.",
    );
    let mut ordo = Family::gauge(
        "ordo_cpu_ordo_cores",
        "Ordo's threads on a CPU in the last second: by Ordo's clock (waits for the CPU taken out) and as the OS charged them.",
    );
    for c in &report.cpus {
        let cpu = c.cpu.to_string();
        for (kind, v) in [
            ("tasks", c.tasks),
            ("irq", c.irq),
            ("softirq", c.softirq),
            ("steal", c.steal),
            ("idle", c.idle),
        ] {
            time.add(&[("cpu", &cpu), ("kind", kind)], v as f64 / 1000.0);
        }
        ordo.add(&[("clock", "ordo"), ("cpu", &cpu)], c.ordo_clock as f64 / 1000.0);
        ordo.add(&[("clock", "os"), ("cpu", &cpu)], c.ordo_os as f64 / 1000.0);
    }
    out.extend([stage, time, ordo]);
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::device::report::{
        PartFigure, PartReport, PeerReport, PlacementReport, PortFigure, QueueLoad, QueueReport, WarningReport,
    };

    /// Each figure of the report lands in its family, with its kind and labels: drops by who
    /// counted them, a port's levels as gauges and its events as counters, the interface's
    /// own figures in families of their own, thousandths back to units.
    #[test]
    fn a_report_renders_into_its_families() {
        let report = InterfaceReport {
            name: "wg0".into(),
            model: "auto".into(),
            outer: "udp".into(),
            peers: vec![PeerReport {
                public_key: "pk".into(),
                rx_bytes: 7,
                placement: Some(PlacementReport {
                    cpu: "0".into(),
                    regime: "inline".into(),
                    millicores: 250,
                    ..Default::default()
                }),
                ..Default::default()
            }],
            queues: vec![QueueReport {
                queue: 0,
                cpu: 1,
                last_interval: Some(QueueLoad {
                    idle_permille: 500,
                    ..Default::default()
                }),
                ..Default::default()
            }],
            counters: [
                ("drop_replay", 3),
                ("drop_os_udp_receive_buffer", 5),
                ("udp_gro", 1),
                ("tun_writes", 9),
                ("handshakes_completed", 2),
                ("mtu", 1420),
                ("stage_receive_packets", 11),
            ]
            .map(|(k, v)| (k.to_string(), v))
            .into(),
            port_figures: [
                ("udp_gro", true),
                ("tun_writes", false),
                ("drop_os_udp_receive_buffer", false),
            ]
            .map(|(name, level)| PortFigure {
                name: name.into(),
                level,
            })
            .into(),
            warnings: vec![WarningReport {
                detector: "black_hole".into(),
                text: "x".into(),
            }],
            parts: vec![PartReport {
                part: "fleet".into(),
                figures: vec![
                    PartFigure {
                        name: "etcd_up".into(),
                        value: 1,
                        level: true,
                    },
                    PartFigure {
                        name: "records_refused".into(),
                        value: 4,
                        level: false,
                    },
                ],
            }],
            ..Default::default()
        };
        let text = render_report(&report);
        for line in [
            "wireguard_peer_receive_bytes_total{public_key=\"pk\"} 7",
            "ordo_peer_crypto_cores{public_key=\"pk\"} 0.25",
            "ordo_drops_total{counted_by=\"ordo\",reason=\"replay\"} 3",
            "ordo_drops_total{counted_by=\"kernel\",reason=\"udp_receive_buffer\"} 5",
            "ordo_port_state{name=\"udp_gro\"} 1",
            "ordo_port_events_total{name=\"tun_writes\"} 9",
            "ordo_handshakes_completed_total 2",
            "ordo_mtu_bytes 1420",
            "ordo_queue_cpu_idle_ratio{cpu=\"1\",queue=\"0\"} 0.5",
            "ordo_warning_active{detector=\"black_hole\"} 1",
            "ordo_warning_active{detector=\"inversion\"} 0",
            "ordo_part_state{part=\"fleet\",name=\"etcd_up\"} 1",
            "ordo_part_events_total{part=\"fleet\",name=\"records_refused\"} 4",
        ] {
            assert!(text.lines().any(|l| l == line), "{line} missing from:\n{text}");
        }
        for absent in ["name=\"mtu\"", "name=\"stage_receive_packets\"", "name=\"drop_replay\""] {
            assert!(!text.contains(absent), "{absent} is not a port's figure");
        }
        assert!(text.contains("# TYPE ordo_port_events_total counter"));
        assert!(text.contains("# TYPE ordo_port_state gauge"));
    }
}
