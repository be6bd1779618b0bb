//! `ordo lab report DIR`: turns a lab run's results.jsonl (written by lab/lab.sh, one line
//! per loadgen run) into SVG figures and a Markdown report that sets each figure beside the
//! paper figure it reproduces, with the figures in tables and the targets checked.

mod chart;
mod clients;
mod inversion;
mod soak;
mod tunnels;

use anyhow::{bail, Context, Result};
use clients::many_clients;
use inversion::inversion;
use serde_json::Value;
use soak::soak;
use std::collections::BTreeMap;
use std::path::Path;
use tunnels::many_tunnels;

/// One loadgen run of the lab.
struct Point {
    implementation: String,
    clients: u64,
    kind: String,
    report: Value,
    server: Value,
}

impl Point {
    fn f(&self, path: &[&str]) -> f64 {
        let mut v = &self.report;
        for p in path {
            v = &v[*p];
        }
        v.as_f64().unwrap_or(0.0)
    }

    /// Gbit/s the server carried in this run's direction.
    fn gbit(&self) -> f64 {
        self.f(&["up_gbit"]) + self.f(&["down_gbit"])
    }

    /// Busy share of each CPU (1 - idle).
    fn busy(&self) -> Vec<f64> {
        self.report["machine_cpu"]
            .as_array()
            .map(|a| a.iter().map(|c| 1.0 - c["idle"].as_f64().unwrap_or(1.0)).collect())
            .unwrap_or_default()
    }

    fn counter(&self, name: &str) -> f64 {
        self.server[name].as_f64().unwrap_or(0.0)
    }
}

fn load(dir: &Path) -> Result<Vec<Point>> {
    let path = dir.join("results.jsonl");
    let text = std::fs::read_to_string(&path).with_context(|| format!("cannot read {}", path.display()))?;
    let mut points = Vec::new();
    for (n, line) in text.lines().enumerate().filter(|(_, l)| !l.trim().is_empty()) {
        let v: Value = serde_json::from_str(line).with_context(|| format!("{}:{}", path.display(), n + 1))?;
        points.push(Point {
            implementation: v["impl"].as_str().unwrap_or("?").to_string(),
            clients: v["clients"].as_u64().unwrap_or(0),
            kind: v["kind"].as_str().unwrap_or("?").to_string(),
            report: v["report"].clone(),
            server: v["server"].clone(),
        });
    }
    if points.is_empty() {
        bail!("{} holds no results", path.display());
    }
    Ok(points)
}

/// Lines of (x, y) per implementation, from the points of one kind.
fn series(points: &[Point], kind: &str, y: impl Fn(&Point) -> f64) -> Lines {
    let mut s = Lines::new();
    for p in points.iter().filter(|p| p.kind == kind) {
        s.entry(p.implementation.clone())
            .or_default()
            .push((p.clients as f64, y(p)));
    }
    for v in s.values_mut() {
        v.sort_by(|a, b| a.0.total_cmp(&b.0));
    }
    s
}

/// A chart's lines by name: (x, y) points.
type Lines = BTreeMap<String, Vec<(f64, f64)>>;

/// Writes the figures and report.md of `scenario` into `dir`.
pub fn report(dir: &Path, scenario: &str) -> Result<()> {
    let points = load(dir)?;
    let md = match scenario {
        "many-clients" => many_clients(dir, &points)?,
        "inversion" => inversion(dir, &points)?,
        "many-tunnels" => many_tunnels(dir, &points)?,
        "soak" => soak(dir, &points)?,
        _ => bail!("unknown scenario {scenario:?} (many-clients, inversion, many-tunnels, soak)"),
    };
    std::fs::write(dir.join("report.md"), md)?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A report built from a hand-made results file: figures and tables appear.
    #[test]
    fn report_from_results() {
        let dir = std::env::temp_dir().join(format!("ordo-lab-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let mut lines = String::new();
        for (i, n) in [
            ("ordo-pool", 10),
            ("ordo-pool", 40),
            ("wireguard-go", 10),
            ("wireguard-go", 40),
        ] {
            for (kind, up, down) in [("up", 0.2, 0.0), ("down", 0.0, 0.21), ("rr", 0.0, 0.0)] {
                lines += &serde_json::json!({
                    "impl": i, "clients": n, "kind": kind,
                    "report": {"up_gbit": up, "down_gbit": down, "up_loss": 0.0, "fairness": 1.0,
                               "server_cores": 0.3, "round_trip": {"p99_us": 150.0},
                               "machine_cpu": [{"idle": 0.5}, {"idle": 0.45}], "warnings": []},
                    "server": {"stage_deliver_inbound_wakeups": 10, "stage_deliver_inbound_wasted_wakeups": 0,
                               "stage_deliver_inbound_packets": 500}
                })
                .to_string();
                lines.push('\n');
            }
        }
        std::fs::write(dir.join("results.jsonl"), lines).unwrap();
        report(&dir, "many-clients").unwrap();
        let md = std::fs::read_to_string(dir.join("report.md")).unwrap();
        assert!(md.contains("| ordo-pool | 40 | 0.200 | 0.210 | 0.95 |"), "{md}");
        assert!(
            md.contains("receive 0.95x transmit (target at least 0.9x: met)"),
            "{md}"
        );
        for f in [
            "throughput-up.svg",
            "throughput-down.svg",
            "cpu-per-gbit.svg",
            "rtt-p99.svg",
            "rtt-p99-rr.svg",
            "cores-up.svg",
        ] {
            let svg = std::fs::read_to_string(dir.join(f)).unwrap();
            assert!(
                svg.starts_with("<svg") && svg.contains("ordo-pool") || f == "cores-up.svg",
                "{f}"
            );
        }
        report(&dir, "inversion").unwrap();
        assert!(std::fs::read_to_string(dir.join("report.md"))
            .unwrap()
            .contains("| ordo-pool | 10 | 0.200 |"));
        assert!(report(&dir, "nonsense").is_err());
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn many_tunnels_report_splits_the_gateways() {
        let dir = std::env::temp_dir().join(format!("ordo-lab-tunnels-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let mut lines = String::new();
        for (i, kind, n, gbit) in [
            ("ordo-inline", "tunnels", 1, 2.0),
            ("ordo-inline", "tunnels", 16, 3.0),
            ("ordo-inline", "flows", 4, 1.5),
            ("wireguard-go", "tunnels", 16, 1.0),
        ] {
            lines += &serde_json::json!({
                "impl": i, "clients": n, "kind": kind, "server": null,
                "report": {"up_gbit": gbit, "down_gbit": 0.0, "server_cores": 1.5,
                           "gateway_cores": [0.75, 0.5], "machine_cpu": [{"idle": 0.1}, {"idle": 0.2}]}
            })
            .to_string();
            lines.push('\n');
        }
        std::fs::write(dir.join("results.jsonl"), lines).unwrap();
        report(&dir, "many-tunnels").unwrap();
        let md = std::fs::read_to_string(dir.join("report.md")).unwrap();
        assert!(
            md.contains("| ordo-inline | 16 x 1 | 3.00 | 1.50 | 0.75 / 0.50 | 0.50 | 90% 80% |"),
            "{md}"
        );
        assert!(md.contains("| ordo-inline | 1 x 4 | 1.50 |"), "{md}");
        for f in ["tunnels.svg", "flows.svg", "cores.svg"] {
            assert!(std::fs::read_to_string(dir.join(f)).unwrap().starts_with("<svg"), "{f}");
        }
        let _ = std::fs::remove_dir_all(&dir);
    }

    /// The soak's checks read what the run left: met with every client alive, flat memory
    /// and explained drops; NOT met when a client went quiet, memory grew or a drop is
    /// unexplained.
    #[test]
    fn soak_report_checks_liveness_memory_and_drops() {
        let dir = std::env::temp_dir().join(format!("ordo-lab-soak-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let write = |rss_growth: f64, quiet: bool, drop: &str| {
            let point = serde_json::json!({
                "impl": "ordo", "clients": 20, "kind": "soak",
                "report": {"seconds": 140.0, "rate_per_client": 20, "roam_every_s": 20.0,
                           "up_loss": 0.0, "down_loss": 0.0},
                "server": {"handshakes_completed": 45, drop: 3, "drop_replay": 0}
            });
            std::fs::write(dir.join("results.jsonl"), format!("{point}\n")).unwrap();
            let mut tsv = String::from("t\trss_kb\tfds\tpeers\n");
            for t in 0..100 {
                let rss = 50_000.0 + if t >= 50 { rss_growth * t as f64 } else { 0.0 };
                tsv += &format!("{t}\t{rss}\t16\t25\n");
            }
            std::fs::write(dir.join("samples.tsv"), tsv).unwrap();
            let clients: Vec<_> = (0..20)
                .map(|i| {
                    let last = if quiet && i == 7 { 30.0 } else { 0.4 };
                    serde_json::json!({"client": i, "last_round_trip_s": last, "roams": (i % 10 == 9) as u64 * 7})
                })
                .collect();
            std::fs::write(dir.join("clients.json"), serde_json::to_string(&clients).unwrap()).unwrap();
            report(&dir, "soak").unwrap();
            std::fs::read_to_string(dir.join("report.md")).unwrap()
        };
        let md = write(0.0, false, "drop_no_route");
        assert!(!md.contains("NOT met"), "{md}");
        assert!(
            md.contains("| clients with a round trip in the last 10 s | 20 of 20 |"),
            "{md}"
        );
        assert!(md.contains("| roams | 14 by 2 clients |"), "{md}");
        assert!(std::fs::read_to_string(dir.join("rss.svg"))
            .unwrap()
            .starts_with("<svg"));
        let md = write(0.0, true, "drop_no_route");
        assert!(md.contains("exchanged traffic in the last 10 s: NOT met"), "{md}");
        let md = write(200.0, false, "drop_no_route");
        assert!(
            md.contains("RSS flat (second half's peak within 10% + 2 MB of the first's): NOT met"),
            "{md}"
        );
        let md = write(0.0, false, "drop_unknown_receiver");
        assert!(
            md.contains("within their bounds: NOT met (drop_unknown_receiver)"),
            "{md}"
        );
        let _ = std::fs::remove_dir_all(&dir);
    }
}
