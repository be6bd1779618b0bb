//! `ordo show`: what `wg show` prints, plus Ordo's own counters, from the interface's report
//! (`device::report`); `--json` prints the report itself.

use crate::device::report::InterfaceReport;
use crate::uapi::{client, ORDO_REPORT_KEY};
use anyhow::{Context, Result};
use std::fmt::Write;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

/// The interface's report, over its UAPI socket.
pub fn fetch(ifname: &str) -> Result<InterfaceReport> {
    let pairs = client::request(ifname, "ordo_get=1\n\n")?;
    let (_, json) = (pairs.iter()).find(|(k, _)| k == ORDO_REPORT_KEY).with_context(|| {
        format!("{ifname} sent no report: not an Ordo interface, or one started by an older ordo (restart it)")
    })?;
    serde_json::from_str(json).with_context(|| format!("{ifname}'s report"))
}

fn bytes(n: u64) -> String {
    const UNITS: [&str; 5] = ["B", "KiB", "MiB", "GiB", "TiB"];
    let mut v = n as f64;
    let mut u = 0;
    while v >= 1024.0 && u < UNITS.len() - 1 {
        v /= 1024.0;
        u += 1;
    }
    if u == 0 {
        format!("{n} B")
    } else {
        format!("{v:.2} {}", UNITS[u])
    }
}

fn ago(epoch_secs: u64) -> String {
    let then = UNIX_EPOCH + Duration::from_secs(epoch_secs);
    let secs = SystemTime::now().duration_since(then).unwrap_or_default().as_secs();
    let parts: Vec<String> = [
        (secs / 86400, "day"),
        (secs / 3600 % 24, "hour"),
        (secs / 60 % 60, "minute"),
        (secs % 60, "second"),
    ]
    .into_iter()
    .filter(|(n, _)| *n > 0)
    .map(|(n, unit)| format!("{n} {unit}{}", if n == 1 { "" } else { "s" }))
    .collect();
    if parts.is_empty() {
        "Now".into()
    } else {
        format!("{} ago", parts.join(", "))
    }
}

pub fn render(s: &InterfaceReport) -> String {
    let mut o = String::new();
    let _ = writeln!(o, "interface: {}", s.name);
    if let Some(k) = &s.public_key {
        let _ = writeln!(o, "  public key: {k}\n  private key: (hidden)");
    }
    let _ = writeln!(o, "  listening port: {}", s.listen_port);
    if s.fwmark != 0 {
        let _ = writeln!(o, "  fwmark: 0x{:x}", s.fwmark);
    }
    for p in &s.peers {
        let _ = writeln!(o, "\npeer: {}", p.public_key);
        if p.preshared_key {
            let _ = writeln!(o, "  preshared key: (hidden)");
        }
        if let Some(e) = &p.endpoint {
            let _ = writeln!(o, "  endpoint: {e}");
        }
        let ips = if p.allowed_ips.is_empty() {
            "(none)".to_string()
        } else {
            p.allowed_ips.join(", ")
        };
        let _ = writeln!(o, "  allowed ips: {ips}");
        if p.latest_handshake != 0 {
            let _ = writeln!(o, "  latest handshake: {}", ago(p.latest_handshake));
        }
        if p.rx_bytes + p.tx_bytes > 0 {
            let _ = writeln!(
                o,
                "  transfer: {} received, {} sent",
                bytes(p.rx_bytes),
                bytes(p.tx_bytes)
            );
        }
        if p.persistent_keepalive != 0 {
            let _ = writeln!(o, "  persistent keepalive: every {} seconds", p.persistent_keepalive);
        }
        if let Some(pl) = &p.placement {
            // A list: the pool models' I/O CPUs, or a queue released under contention.
            let list = pl.cpu.contains([',', '-']);
            let _ = writeln!(
                o,
                "  placement: {}, queue {} on CPU{} {}, node {}, {} packets/s, {:.2} cores",
                pl.regime,
                pl.queue,
                if list { "s" } else { "" },
                pl.cpu,
                pl.node,
                pl.pps,
                pl.millicores as f64 / 1000.0
            );
        }
    }
    let queues = s.counters.get("queues").copied().unwrap_or(1);
    let workers = s.counters.get("workers").copied().unwrap_or(0);
    let _ = writeln!(
        o,
        "\nordo: model {}, {queues} queue{}, {workers} crypto worker{}",
        s.model,
        if queues == 1 { "" } else { "s" },
        if workers == 1 { "" } else { "s" }
    );
    if !s.outer.is_empty() {
        let _ = writeln!(o, "  outer path: {}", s.outer);
    }
    let offloads: Vec<&str> = ["udp_gso", "udp_gro", "tun_tso", "tun_uso"]
        .into_iter()
        .filter(|k| s.counters.get(*k).is_some_and(|v| *v > 0))
        .collect();
    if !offloads.is_empty() {
        let _ = writeln!(o, "  offloads: {}", offloads.join(" ").replace('_', " "));
    }
    let busy: Vec<String> = (s.stages.iter())
        .filter(|st| st.millicores > 0)
        .map(|st| format!("{} {:.2}", st.name.replace('_', " "), st.millicores as f64 / 1000.0))
        .collect();
    if !s.stages.is_empty() {
        let _ = writeln!(
            o,
            "  cores by stage, last second: {}",
            if busy.is_empty() {
                "idle".to_string()
            } else {
                busy.join(", ")
            }
        );
    }
    let drops: Vec<String> = s
        .counters
        .iter()
        .filter(|(k, v)| k.starts_with("drop_") && **v > 0)
        .map(|(k, v)| format!("{}={v}", &k["drop_".len()..]))
        .collect();
    let _ = writeln!(
        o,
        "  drops: {}",
        if drops.is_empty() {
            "none".to_string()
        } else {
            drops.join(" ")
        }
    );
    for p in &s.parts {
        let figures: Vec<String> = p.figures.iter().map(|f| format!("{}={}", f.name, f.value)).collect();
        let _ = writeln!(o, "  {}: {}", p.part, figures.join(" "));
    }
    if s.warnings.is_empty() {
        let _ = writeln!(o, "  warnings: none");
    } else {
        let _ = writeln!(o, "  warnings:");
        for w in &s.warnings {
            let _ = writeln!(o, "    {w}");
        }
    }
    o
}

/// [`render`], then every counter by name (`ordo show --all`).
pub fn render_all(s: &InterfaceReport) -> String {
    let mut o = render(s);
    let _ = writeln!(o, "  counters:");
    for (k, v) in &s.counters {
        let _ = writeln!(o, "    {}: {v}", k.replace('_', " "));
    }
    if !s.queues.is_empty() {
        let _ = writeln!(o, "  queues:");
    }
    for q in &s.queues {
        let mut line = format!("    queue {} on CPU {}", q.queue, q.cpu);
        if let Some(l) = &q.last_interval {
            let _ = write!(
                line,
                ": other work {:.2} cores, idle {}%, its thread waited {}%",
                l.other_millicores as f64 / 1000.0,
                l.idle_permille / 10,
                l.thread_wait_permille / 10
            );
        }
        let released = if q.released { "released" } else { "pinned" };
        let _ = writeln!(o, "{line}; {released}, released {} times", q.releases);
    }
    if !s.thread_totals.is_empty() {
        let _ = writeln!(o, "  threads (since they started):");
    }
    for t in &s.thread_totals {
        let os = t.os.as_ref().map_or(String::new(), |os| {
            format!(
                "; the OS: {:.3} s, {} sleeps, {} preemptions",
                os.cpu_us as f64 / 1e6,
                os.sleeps,
                os.preemptions
            )
        });
        let _ = writeln!(
            o,
            "    {} ({}): busy {:.3} s{os}",
            t.name,
            t.tid,
            t.busy_us as f64 / 1e6
        );
        for st in &t.stages {
            let wakeups = match (st.wakeups, st.wasted_wakeups) {
                (Some(w), Some(x)) => format!(", {w} wake-ups ({x} wasted)"),
                _ => String::new(),
            };
            let _ = writeln!(
                o,
                "      {}: {} packets in {} batches, {:.3} s{wakeups}",
                st.stage.replace('_', " "),
                st.packets,
                st.batches,
                st.busy_us as f64 / 1e6
            );
        }
    }
    o
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::device::report::{
        PeerReport, PlacementReport, QueueLoad, QueueReport, StageShow, StageTotals, ThreadTotals, WarningReport,
    };

    #[test]
    fn human_units() {
        assert_eq!(bytes(512), "512 B");
        assert_eq!(bytes(1536), "1.50 KiB");
        assert_eq!(bytes(3 << 30), "3.00 GiB");
    }

    #[test]
    fn render_lists_drops_by_reason() {
        let mut s = InterfaceReport {
            name: "wg0".into(),
            listen_port: 1,
            ..Default::default()
        };
        s.model = "inline".into();
        s.outer = "xdp on veth0 (native, copy, 1 socket)".into();
        s.counters.insert("drop_replay".into(), 3);
        s.counters.insert("drop_bad_mac1".into(), 0);
        s.peers.push(PeerReport {
            public_key: "k".into(),
            allowed_ips: vec!["10.0.0.2/32".into()],
            rx_bytes: 2048,
            tx_bytes: 1,
            ..Default::default()
        });
        s.peers[0].placement = Some(PlacementReport {
            queue: 1,
            cpu: "1".into(),
            node: 0,
            regime: "inline".into(),
            pps: 1500,
            millicores: 250,
        });
        let r = render(&s);
        assert!(r.contains("drops: replay=3\n"), "{r}");
        assert!(r.contains("ordo: model inline, 1 queue, 0 crypto workers\n"), "{r}");
        assert!(r.contains("warnings: none\n"), "{r}");
        assert!(!r.contains("counters:"), "every counter only with --all: {r}");
        s.warnings.push(WarningReport {
            detector: "black_hole".into(),
            text: "CPU 0 carries 95%".into(),
        });
        s.stages.push(StageShow {
            name: "decrypt".into(),
            millicores: 250,
            ..Default::default()
        });
        let r = render(&s);
        assert!(r.contains("  warnings:\n    black_hole: CPU 0 carries 95%\n"), "{r}");
        assert!(r.contains("cores by stage, last second: decrypt 0.25\n"), "{r}");
        assert!(render_all(&s).contains("    drop replay: 3\n"));
        s.queues.push(QueueReport {
            queue: 1,
            cpu: 1,
            releases: 2,
            last_interval: Some(QueueLoad {
                other_millicores: 250,
                idle_permille: 500,
                thread_wait_permille: 30,
            }),
            ..Default::default()
        });
        s.thread_totals.push(ThreadTotals {
            name: "queue1".into(),
            tid: 9,
            busy_us: 1_500_000,
            os: None,
            stages: vec![StageTotals {
                stage: "deliver_inbound".into(),
                packets: 10,
                batches: 2,
                busy_us: 1000,
                wakeups: Some(2),
                wasted_wakeups: Some(0),
            }],
        });
        let all = render_all(&s);
        assert!(
            all.contains("    queue 1 on CPU 1: other work 0.25 cores, idle 50%, its thread waited 3%; pinned, released 2 times\n"),
            "{all}"
        );
        assert!(all.contains("    queue1 (9): busy 1.500 s\n"), "{all}");
        assert!(
            all.contains("      deliver inbound: 10 packets in 2 batches, 0.001 s, 2 wake-ups (0 wasted)\n"),
            "{all}"
        );
        assert!(
            r.contains("  outer path: xdp on veth0 (native, copy, 1 socket)\n"),
            "{r}"
        );
        assert!(
            r.contains("placement: inline, queue 1 on CPU 1, node 0, 1500 packets/s, 0.25 cores\n"),
            "{r}"
        );
        assert!(r.contains("transfer: 2.00 KiB received, 1 B sent"), "{r}");
        // A queue released under contention runs on a list of CPUs.
        s.peers[0].placement = Some(PlacementReport {
            queue: 1,
            cpu: "0-1".into(),
            regime: "inline".into(),
            pps: 1,
            ..Default::default()
        });
        assert!(render(&s).contains("queue 1 on CPUs 0-1, node 0"), "{}", render(&s));
    }
}
