//! `ordo lab report DIR`: turns a lab run's results.jsonl (written by lab/lab.sh, one line
//! per loadgen run) into SVG figures and a Markdown report that sets each figure beside the
//! paper figure it reproduces, with the figures in tables and the targets checked.

use anyhow::{bail, Context, Result};
use plotters::prelude::*;
use serde_json::Value;
use std::collections::BTreeMap;
use std::fmt::Write;
use std::path::Path;

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

/// A number as an axis shows it: whole numbers without decimals, others with as few as
/// tell them apart (plotters' default prints "500.0" and "0.30000000000000004").
fn tick(v: f64) -> String {
    if (v - v.round()).abs() < 1e-9 {
        format!("{v:.0}")
    } else if v.abs() >= 10.0 {
        format!("{v:.1}")
    } else {
        let s = format!("{v:.2}");
        s.trim_end_matches('0').trim_end_matches('.').to_string()
    }
}

/// A duration unit for values measured in microseconds, so that a chart reads "600 ms" and
/// not "600000.0 microseconds".
struct TimeUnit {
    divisor: f64,
    name: &'static str,
}

fn time_unit(max_us: f64) -> TimeUnit {
    if max_us >= 1e6 {
        TimeUnit {
            divisor: 1e6,
            name: "seconds",
        }
    } else if max_us >= 1e3 {
        TimeUnit {
            divisor: 1e3,
            name: "milliseconds",
        }
    } else {
        TimeUnit {
            divisor: 1.0,
            name: "microseconds",
        }
    }
}

/// A chart's lines by name: (x, y) points.
type Lines = BTreeMap<String, Vec<(f64, f64)>>;

/// Lines of microseconds in the unit their largest value reads best in, and its name.
fn in_time_unit(lines: &Lines) -> (Lines, &'static str) {
    let max = lines.values().flatten().map(|p| p.1).fold(0.0f64, f64::max);
    let unit = time_unit(max);
    let scaled = (lines.iter())
        .map(|(k, pts)| (k.clone(), pts.iter().map(|&(x, y)| (x, y / unit.divisor)).collect()))
        .collect();
    (scaled, unit.name)
}

/// The colour of series `i`: Okabe and Ito's palette, which people with colour-blindness
/// tell apart, its yellow (hard to see on white) last.
fn series_color(i: usize) -> RGBAColor {
    const OKABE_ITO: [(u8, u8, u8); 8] = [
        (0, 114, 178),
        (213, 94, 0),
        (0, 158, 115),
        (204, 121, 167),
        (230, 159, 0),
        (86, 180, 233),
        (0, 0, 0),
        (240, 228, 66),
    ];
    let (r, g, b) = OKABE_ITO[i % OKABE_ITO.len()];
    RGBColor(r, g, b).to_rgba()
}

/// Width of the legend beside a chart: the legend never covers the data.
const LEGEND_WIDTH: u32 = 150;

/// One series in a legend: its name, its colour, and whether it is drawn as bars.
struct LegendEntry {
    name: String,
    color: RGBAColor,
    bar: bool,
}

/// The legend, in its own area right of the chart: a mark and a name per series.
fn legend<DB: DrawingBackend>(area: &DrawingArea<DB, plotters::coord::Shift>, entries: &[LegendEntry]) -> Result<()>
where
    DB::ErrorType: 'static,
{
    for (i, e) in entries.iter().enumerate() {
        let y = 50 + i as i32 * 22;
        if e.bar {
            area.draw(&Rectangle::new([(6, y - 6), (20, y + 6)], e.color.filled()))?;
        } else {
            area.draw(&PathElement::new(vec![(4, y), (22, y)], e.color.stroke_width(2)))?;
        }
        area.draw(&Text::new(e.name.clone(), (28, y - 7), ("sans-serif", 13)))?;
    }
    Ok(())
}

/// A line chart over a logarithmic x axis (clients, tunnels or flows).
fn line_chart(file: &Path, title: &str, y_label: &str, lines: &Lines) -> Result<()> {
    line_chart_x(file, title, "clients", y_label, lines)
}

fn line_chart_x(file: &Path, title: &str, x_label: &str, y_label: &str, lines: &Lines) -> Result<()> {
    let root = SVGBackend::new(file, (720 + LEGEND_WIDTH, 420)).into_drawing_area();
    root.fill(&WHITE)?;
    let (plot, side) = root.split_horizontally(720);
    let xs = lines.values().flatten().map(|p| p.0);
    let (x_min, x_max) = xs.fold((f64::MAX, 1.0f64), |(a, b), x| (a.min(x), b.max(x)));
    let y_max = lines.values().flatten().map(|p| p.1).fold(0.0f64, f64::max).max(1e-6) * 1.15;
    let mut chart = ChartBuilder::on(&plot)
        .caption(title, ("sans-serif", 18))
        .margin(12)
        .x_label_area_size(40)
        .y_label_area_size(60)
        .build_cartesian_2d((x_min.max(1.0) * 0.8..x_max * 1.25).log_scale(), 0.0..y_max)?;
    chart
        .configure_mesh()
        .x_desc(x_label)
        .y_desc(y_label)
        .x_label_formatter(&|x| format!("{x:.0}"))
        .y_label_formatter(&|y| tick(*y))
        .draw()?;
    let mut entries = Vec::new();
    for (i, (name, pts)) in lines.iter().enumerate() {
        let color = series_color(i);
        chart.draw_series(LineSeries::new(pts.clone(), color.stroke_width(2)))?;
        chart.draw_series(pts.iter().map(|&(x, y)| Circle::new((x, y), 3, color.filled())))?;
        entries.push(LegendEntry {
            name: name.clone(),
            color,
            bar: false,
        });
    }
    legend(&side, &entries)?;
    root.present()?;
    Ok(())
}

/// Bars of each CPU's busy share, grouped by implementation.
fn core_chart(file: &Path, title: &str, rows: &[(String, Vec<f64>)]) -> Result<()> {
    let root = SVGBackend::new(file, (720 + LEGEND_WIDTH, 420)).into_drawing_area();
    root.fill(&WHITE)?;
    let (plot, side) = root.split_horizontally(720);
    let cores = rows.iter().map(|r| r.1.len()).max().unwrap_or(1).max(1);
    let slots = rows.len() * (cores + 1);
    let mut chart = ChartBuilder::on(&plot)
        .caption(title, ("sans-serif", 18))
        .margin(12)
        .x_label_area_size(40)
        .y_label_area_size(60)
        .build_cartesian_2d(0f64..slots as f64, 0f64..100f64)?;
    let names: Vec<String> = rows.iter().map(|r| r.0.clone()).collect();
    chart
        .configure_mesh()
        .disable_x_mesh()
        .y_desc("busy, % of the CPU")
        .y_label_formatter(&|y| tick(*y))
        .x_labels(slots + 1)
        .x_label_formatter(&|x| {
            let slot = (*x as usize) / (cores + 1);
            if (*x as usize) % (cores + 1) == cores / 2 {
                names.get(slot).cloned().unwrap_or_default()
            } else {
                String::new()
            }
        })
        .draw()?;
    let mut entries = Vec::new();
    for c in 0..cores {
        let color = series_color(c);
        chart.draw_series(rows.iter().enumerate().filter_map(|(i, (_, busy))| {
            let x = (i * (cores + 1) + c) as f64;
            busy.get(c)
                .map(|b| Rectangle::new([(x + 0.1, 0.0), (x + 0.9, b * 100.0)], color.filled()))
        }))?;
        entries.push(LegendEntry {
            name: format!("CPU {c}"),
            color,
            bar: true,
        });
    }
    legend(&side, &entries)?;
    root.present()?;
    Ok(())
}

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

const SCALE_NOTE: &str = "Scale: the paper's server had 18 cores and a 25 GbE NIC, with 21 client \
machines; here the server, the 1,000 clients (`ordo loadgen`), the sink and the kernel share \
one 2-core machine, so absolute figures are two orders of magnitude lower and only the shapes \
and the ratios between implementations measured in the same run compare.";

fn many_clients(dir: &Path, points: &[Point]) -> Result<String> {
    let mut md = String::from("# Lab: many clients (Mounah et al., SYSTOR 2025)\n\n");
    let _ = writeln!(
        md,
        "Every implementation served the same clients in one run (`lab/lab.sh many-clients`): \
         a fixed rate per client, upload and download measured one after the other, then round \
         trips. {SCALE_NOTE}\n"
    );
    let up = series(points, "up", Point::gbit);
    let down = series(points, "down", Point::gbit);
    line_chart(
        &dir.join("throughput-up.svg"),
        "Server receive (upload) throughput",
        "Gbit/s",
        &up,
    )?;
    line_chart(
        &dir.join("throughput-down.svg"),
        "Server transmit (download) throughput",
        "Gbit/s",
        &down,
    )?;
    let cpg = series(points, "up", |p| {
        p.report["server_cores"].as_f64().unwrap_or(0.0) / p.gbit().max(1e-9)
    });
    line_chart(
        &dir.join("cpu-per-gbit.svg"),
        "Server CPU per Gbit/s (upload)",
        "cores per Gbit/s",
        &cpg,
    )?;
    // Round trips under load: probes beside the upload stream; and alone, closed loop.
    let (rtt, unit) = in_time_unit(&series(points, "up", |p| p.f(&["round_trip", "p99_us"])));
    line_chart(
        &dir.join("rtt-p99.svg"),
        "Round-trip p99 through the server, under upload load",
        unit,
        &rtt,
    )?;
    let (rr, unit) = in_time_unit(&series(points, "rr", |p| p.f(&["round_trip", "p99_us"])));
    line_chart(
        &dir.join("rtt-p99-rr.svg"),
        "Round-trip p99 through the server, round trips only",
        unit,
        &rr,
    )?;
    let top = points.iter().map(|p| p.clients).max().unwrap_or(0);
    let cores: Vec<(String, Vec<f64>)> = points
        .iter()
        .filter(|p| p.kind == "up" && p.clients == top)
        .map(|p| (p.implementation.clone(), p.busy()))
        .collect();
    core_chart(
        &dir.join("cores-up.svg"),
        &format!("Per-CPU busy, upload, {top} clients"),
        &cores,
    )?;

    for (file, paper, what) in [
        ("throughput-up.svg", "figures 1 and 8", "receive throughput against clients: kernel WireGuard's collapses (4.5 Gbps at 1,000 clients) while transmit keeps growing"),
        ("throughput-down.svg", "figures 1 and 8", "transmit throughput against clients (22 Gbps at 1,000 clients)"),
        ("cores-up.svg", "figure 6", "per-core CPU on receive at 1,000 clients: one core saturated by the in-order stage, the others underused"),
        ("cpu-per-gbit.svg", "figure 7", "total CPU against clients"),
        ("rtt-p99.svg", "figure 9", "p99 latency against clients, under load (46-65% lower once the inversion is removed); measured by round-trip probes beside the upload stream"),
        ("rtt-p99-rr.svg", "figure 9", "the same latency with no stream: closed-loop round trips alone (netperf TCP_RR)"),
    ] {
        let _ = writeln!(md, "## {file}\n\n![{file}]({file})\n\nReproduces Mounah et al., SYSTOR 2025, {paper}: {what}.\n");
    }
    let _ = writeln!(md, "## The figures\n");
    let _ = writeln!(
        md,
        "| implementation | clients | upload Gbit/s | download Gbit/s | receive / transmit | server cores (upload) | cores per Gbit/s | upload loss | per-CPU busy (upload) | rtt p99 us under load | rtt p99 us, round trips only | fairness (upload) | generator warnings |"
    );
    let _ = writeln!(md, "|---|---|---|---|---|---|---|---|---|---|---|---|---|");
    let mut keys: Vec<(String, u64)> = points.iter().map(|p| (p.implementation.clone(), p.clients)).collect();
    keys.dedup();
    let find = |i: &str, n: u64, k: &str| {
        points
            .iter()
            .find(|p| p.implementation == i && p.clients == n && p.kind == k)
    };
    let mut verdicts = Vec::new();
    for (i, n) in &keys {
        let (Some(u), d, r) = (find(i, *n, "up"), find(i, *n, "down"), find(i, *n, "rr")) else {
            continue;
        };
        let (ug, dg) = (u.gbit(), d.map_or(0.0, Point::gbit));
        let busy = u.busy();
        let sc = u.report["server_cores"].as_f64().unwrap_or(0.0);
        let warnings = u.report["warnings"].as_array().map_or(0, Vec::len);
        let _ =
            writeln!(
            md,
            "| {i} | {n} | {ug:.3} | {dg:.3} | {:.2} | {sc:.2} | {:.2} | {:.2}% | {} | {:.0} | {:.0} | {:.3} | {warnings} |",
            ug / dg.max(1e-9),
            sc / ug.max(1e-9),
            u.f(&["up_loss"]) * 100.0,
            busy.iter().map(|b| format!("{:.0}%", b * 100.0)).collect::<Vec<_>>().join(" "),
            u.f(&["round_trip", "p99_us"]),
            r.map_or(0.0, |r| r.f(&["round_trip", "p99_us"])),
            u.f(&["fairness"]),
        );
        if i.starts_with("ordo") && *n == top {
            let mean = busy.iter().sum::<f64>() / busy.len().max(1) as f64;
            let spread = busy
                .iter()
                .map(|b| (b - mean).abs() / mean.max(1e-9))
                .fold(0.0, f64::max);
            verdicts.push(format!(
                "- {i} at {n} clients: receive {:.2}x transmit (target at least 0.9x: {}); per-CPU busy within {:.0}% of the mean (target 20%: {})",
                ug / dg.max(1e-9),
                if ug >= 0.9 * dg { "met" } else { "not met" },
                spread * 100.0,
                if spread <= 0.2 { "met" } else { "not met" }
            ));
        }
    }
    let _ = writeln!(md, "\n## Issue 4's targets, for Ordo\n\n{}\n", verdicts.join("\n"));
    let _ = writeln!(
        md,
        "A run where the generator warned (last column) may have been paced by the generator \
         rather than the server: the machine is shared by both. Per-CPU busy is the whole \
         machine's (/proc/stat), as the paper's figures are.\n"
    );
    Ok(md)
}

fn many_tunnels(dir: &Path, points: &[Point]) -> Result<String> {
    let mut md = String::from("# Lab: many tunnels (Barone et al., HPSR 2025)\n\n");
    let _ = writeln!(
        md,
        "Two gateways between a source and a drain namespace (`lab/lab.sh many-tunnels`): \
         1 ... 16 tunnels with one TCP flow each, then one tunnel with 1 ... 8 flows, every \
         implementation in one run (a daemon per tunnel end). Scale: the paper's gateways had \
         32 cores on two NUMA nodes and 100 GbE; here both gateways, the source, the drain and \
         every iperf3 share one 2-core machine, so only the shapes and the same-run ratios \
         compare.\n"
    );
    let tunnels = series(points, "tunnels", Point::gbit);
    let flows = series(points, "flows", Point::gbit);
    line_chart_x(
        &dir.join("tunnels.svg"),
        "Aggregate throughput, one flow per tunnel",
        "tunnels",
        "Gbit/s",
        &tunnels,
    )?;
    line_chart_x(
        &dir.join("flows.svg"),
        "Aggregate throughput, one tunnel",
        "TCP flows",
        "Gbit/s",
        &flows,
    )?;
    let top = points
        .iter()
        .filter(|p| p.kind == "tunnels")
        .map(|p| p.clients)
        .max()
        .unwrap_or(0);
    let cores: Vec<(String, Vec<f64>)> = points
        .iter()
        .filter(|p| p.kind == "tunnels" && p.clients == top)
        .map(|p| (p.implementation.clone(), p.busy()))
        .collect();
    core_chart(&dir.join("cores.svg"), &format!("Per-CPU busy, {top} tunnels"), &cores)?;
    for (file, paper, what) in [
        ("tunnels.svg", "figure 8", "aggregate throughput as tunnels and flows grow: vanilla flattens, Inline scales linearly (2x vanilla at 32 tunnels)"),
        ("flows.svg", "figure 4", "a single tunnel is bound by its serial stages (about 5-7 Gbps) however many flows it carries"),
        ("cores.svg", "figure 9", "per-core CPU of the receiving gateway with 8 flows over 8 tunnels: the black hole, NAPI polls converging on one core"),
    ] {
        let _ = writeln!(md, "## {file}\n\n![{file}]({file})\n\nReproduces Barone et al., HPSR 2025, {paper}: {what}.\n");
    }
    let _ = writeln!(md, "## The figures\n");
    let _ = writeln!(
        md,
        "| implementation | tunnels x flows | Gbit/s | gateways' daemons, cores | sending / receiving gateway, cores | cores per Gbit/s | per-CPU busy |"
    );
    let _ = writeln!(md, "|---|---|---|---|---|---|---|");
    for p in points {
        let (t, f) = if p.kind == "tunnels" {
            (p.clients, 1)
        } else {
            (1, p.clients)
        };
        let sc = p.report["server_cores"].as_f64().unwrap_or(0.0);
        // Each gateway's own daemons (lab-gw1 sends into the tunnels, lab-gw2 receives).
        let gateway = |i: usize| p.report["gateway_cores"][i].as_f64().unwrap_or(0.0);
        let _ = writeln!(
            md,
            "| {} | {t} x {f} | {:.2} | {sc:.2} | {:.2} / {:.2} | {:.2} | {} |",
            p.implementation,
            p.gbit(),
            gateway(0),
            gateway(1),
            sc / p.gbit().max(1e-9),
            p.busy()
                .iter()
                .map(|b| format!("{:.0}%", b * 100.0))
                .collect::<Vec<_>>()
                .join(" "),
        );
    }
    Ok(md)
}

fn inversion(dir: &Path, points: &[Point]) -> Result<String> {
    let mut md = String::from("# Lab: execution order inversion made visible (Mounah et al., SYSTOR 2025)\n\n");
    let _ = writeln!(
        md,
        "The same many-clients upload (the server's receive path) against Ordo in three \
         configurations, one run (`lab/lab.sh inversion`): the pool model (in-order delivery \
         by whoever finishes a peer's head), the threaded model (a delivery thread per peer, \
         woken on every finished batch, as threaded NAPI), and the threaded model with its \
         delivery threads at SCHED_FIFO above the workers, as kernel WireGuard's softirq is \
         above its decryption workqueue: the inversion reproduced on purpose. {SCALE_NOTE}\n"
    );
    let rows: Vec<(String, Vec<f64>)> = points
        .iter()
        .filter(|p| p.kind == "up")
        .map(|p| (p.implementation.clone(), p.busy()))
        .collect();
    core_chart(&dir.join("cores.svg"), "Per-CPU busy, upload", &rows)?;
    let _ = writeln!(
        md,
        "## cores.svg\n\n![cores.svg](cores.svg)\n\nReproduces Mounah et al. figure 6 (per-core \
         CPU on receive) for each configuration.\n"
    );
    let _ = writeln!(
        md,
        "| configuration | clients | upload Gbit/s | loss | delivery wake-ups | wasted | packets per wake-up | per-CPU busy | server cores |"
    );
    let _ = writeln!(md, "|---|---|---|---|---|---|---|---|---|");
    for p in points.iter().filter(|p| p.kind == "up") {
        let (w, x, pk) = (
            p.counter("stage_deliver_inbound_wakeups"),
            p.counter("stage_deliver_inbound_wasted_wakeups"),
            p.counter("stage_deliver_inbound_packets"),
        );
        let _ = writeln!(
            md,
            "| {} | {} | {:.3} | {:.2}% | {w:.0} | {x:.0} ({:.1}%) | {:.1} | {} | {:.2} |",
            p.implementation,
            p.clients,
            p.gbit(),
            p.f(&["up_loss"]) * 100.0,
            100.0 * x / w.max(1.0),
            pk / w.max(1.0),
            p.busy()
                .iter()
                .map(|b| format!("{:.0}%", b * 100.0))
                .collect::<Vec<_>>()
                .join(" "),
            p.report["server_cores"].as_f64().unwrap_or(0.0),
        );
    }
    let _ = writeln!(
        md,
        "\nWasted wake-ups (a delivery woken to find the peer's head still in crypto) and \
         packets per wake-up are the direct measures of the inversion (Mounah et al., figure 4 \
         and section 4). The pool model cannot waste a wake-up by construction; packets per \
         wake-up grow with the load, since each wake-up takes every batch that is ready (at a \
         light load each batch is one packet). The threaded configurations are where a \
         wake-up can find nothing ready.\n"
    );
    Ok(md)
}

/// One sample of the soak's server, taken each second by lab/lab.sh.
struct Sample {
    seconds: f64,
    rss_mb: f64,
    fds: f64,
    peers: f64,
}

fn load_samples(path: &Path) -> Result<Vec<Sample>> {
    let text = std::fs::read_to_string(path).with_context(|| format!("cannot read {}", path.display()))?;
    let mut out = Vec::new();
    for (n, line) in text.lines().enumerate().skip(1) {
        let f: Vec<f64> = line.split('\t').map(|x| x.trim().parse().unwrap_or(f64::NAN)).collect();
        if f.len() != 4 || f.iter().any(|x| x.is_nan()) {
            bail!("{}:{}: want t, rss_kb, fds, peers", path.display(), n + 1);
        }
        out.push(Sample {
            seconds: f[0],
            rss_mb: f[1] / 1024.0,
            fds: f[2],
            peers: f[3],
        });
    }
    if out.len() < 4 {
        bail!("{}: too few samples ({})", path.display(), out.len());
    }
    Ok(out)
}

/// A line over time (linear axes).
fn time_chart(file: &Path, title: &str, y_label: &str, pts: &[(f64, f64)]) -> Result<()> {
    let root = SVGBackend::new(file, (720, 360)).into_drawing_area();
    root.fill(&WHITE)?;
    let x_max = pts.iter().map(|p| p.0).fold(1.0f64, f64::max);
    let y_max = pts.iter().map(|p| p.1).fold(1e-6f64, f64::max) * 1.15;
    let mut chart = ChartBuilder::on(&root)
        .caption(title, ("sans-serif", 18))
        .margin(12)
        .x_label_area_size(40)
        .y_label_area_size(60)
        .build_cartesian_2d(0.0..x_max, 0.0..y_max)?;
    chart
        .configure_mesh()
        .x_desc("seconds")
        .y_desc(y_label)
        .x_label_formatter(&|x| tick(*x))
        .y_label_formatter(&|y| tick(*y))
        .draw()?;
    chart.draw_series(LineSeries::new(pts.to_vec(), series_color(0).stroke_width(2)))?;
    root.present()?;
    Ok(())
}

/// How long before the end a client's last round trip may be and still count as alive: the
/// probes come at random (Poisson) twice a second, so a gap of 10 s has odds of e^-20.
const ALIVE_WITHIN_S: f64 = 10.0;

/// How many of a drop a soak may show.
#[derive(Clone, Copy)]
enum DropBound {
    /// At most this many over the whole run.
    Count(f64),
    /// At most this share of the handshakes the server completed.
    PerHandshake(f64),
}

/// A drop a soak may show, why, and how many.
struct ExplainedDrop {
    counter: &'static str,
    why: &'static str,
    bound: DropBound,
}

/// Drops a soak may show: anything else, or more, is a check not met.
const EXPLAINED_DROPS: [ExplainedDrop; 4] = [
    ExplainedDrop {
        counter: "drop_no_route",
        why: "the server host's own packets into the interface for addresses no peer has (IPv6 \
              router solicitations and multicast listener reports)",
        bound: DropBound::Count(100.0),
    },
    ExplainedDrop {
        counter: "drop_unexpected_handshake",
        why: "a response to an initiation the client had already replaced (rekey timers and \
              retransmissions crossing, a roaming client's retry)",
        bound: DropBound::PerHandshake(0.01),
    },
    ExplainedDrop {
        counter: "drop_handshake_flood",
        why: "an initiation within 20 ms of the client's previous one (a retransmission crossing \
              the response)",
        bound: DropBound::PerHandshake(0.01),
    },
    ExplainedDrop {
        counter: "drop_handshake_replay",
        why: "a retransmitted initiation whose original was taken (its timestamp no longer newer)",
        bound: DropBound::PerHandshake(0.01),
    },
];

/// The soak: one long run of many clients against Ordo with rekeys, roaming and
/// peer churn; the server's memory and descriptors sampled each second. Its checks end in
/// "met" or "NOT met" lines, which lab/lab.sh turns into its exit status.
fn soak(dir: &Path, points: &[Point]) -> Result<String> {
    let p = points.first().context("no soak run")?;
    let samples = load_samples(&dir.join("samples.tsv"))?;
    let clients: Value = {
        let path = dir.join("clients.json");
        let text = std::fs::read_to_string(&path).with_context(|| format!("cannot read {}", path.display()))?;
        serde_json::from_str(&text)?
    };
    let per_client = clients.as_array().context("clients.json holds no list")?;
    let alive = per_client
        .iter()
        .filter(|c| c["last_round_trip_s"].as_f64().is_some_and(|s| s <= ALIVE_WITHIN_S))
        .count();
    let roams: u64 = per_client.iter().map(|c| c["roams"].as_u64().unwrap_or(0)).sum();
    let roamers = per_client
        .iter()
        .filter(|c| c["roams"].as_u64().unwrap_or(0) > 0)
        .count();
    time_chart(
        &dir.join("rss.svg"),
        "Server memory (RSS) over the soak",
        "MB",
        &samples.iter().map(|s| (s.seconds, s.rss_mb)).collect::<Vec<_>>(),
    )?;
    time_chart(
        &dir.join("fds.svg"),
        "Server file descriptors over the soak",
        "open descriptors",
        &samples.iter().map(|s| (s.seconds, s.fds)).collect::<Vec<_>>(),
    )?;
    // Flat: the second half never above the first half's peak by more than a tenth (plus
    // 2 MB of allocator slack); descriptors within the few a UAPI connection holds.
    let half = samples.len() / 2;
    let peak = |s: &[Sample]| s.iter().map(|x| x.rss_mb).fold(0.0, f64::max);
    let (first, second) = (peak(&samples[..half]), peak(&samples[half..]));
    let rss_flat = second <= first * 1.1 + 2.0;
    let fds: Vec<f64> = samples.iter().map(|s| s.fds).collect();
    let (fd_min, fd_max) = (
        fds.iter().cloned().fold(f64::MAX, f64::min),
        fds.iter().cloned().fold(0.0, f64::max),
    );
    let fds_flat = fd_max - fd_min <= 4.0;
    let peers = samples.iter().map(|s| s.peers).fold(0.0, f64::max);
    let verdict = |ok: bool| if ok { "met" } else { "NOT met" };
    let n = p.clients as usize;
    let mut md = String::from("# Lab: soak\n\n");
    let _ = writeln!(
        md,
        "{n} clients (`ordo loadgen`) against Ordo for {:.0} s (`lab/lab.sh soak`): {} packets/s \
         each way per client, round-trip probes (two a second per client), every client rekeying \
         on its own timers, one in ten moving to another outer address and port every \
         {} s, and a peer added and one removed through the UAPI every second (up to {peers:.0} \
         peers at once). The server's RSS and open descriptors were sampled each second.\n",
        p.f(&["seconds"]),
        p.f(&["rate_per_client"]),
        p.report["roam_every_s"]
            .as_f64()
            .map_or("?".into(), |s| format!("{s:.0}")),
    );
    md += "| | |\n|---|---|\n";
    let _ = writeln!(
        md,
        "| clients with a round trip in the last {ALIVE_WITHIN_S:.0} s | {alive} of {n} |"
    );
    let _ = writeln!(md, "| roams | {roams} by {roamers} clients |");
    let _ = writeln!(
        md,
        "| handshakes the server completed | {:.0} |",
        p.counter("handshakes_completed")
    );
    let _ = writeln!(
        md,
        "| loss up / down | {:.4} / {:.4} |",
        p.f(&["up_loss"]),
        p.f(&["down_loss"])
    );
    let _ = writeln!(md, "| RSS: first / peak of the first half / of the second half / last | {:.1} / {first:.1} / {second:.1} / {:.1} MB |", samples[0].rss_mb, samples[samples.len() - 1].rss_mb);
    let _ = writeln!(md, "| open descriptors: least / most | {fd_min:.0} / {fd_max:.0} |");
    let drops: Vec<(String, f64)> = p
        .server
        .as_object()
        .map(|o| {
            o.iter()
                .map(|(k, v)| (k.clone(), v.as_f64().unwrap_or(0.0)))
                .filter(|(k, v)| k.starts_with("drop_") && *v > 0.0)
                .collect()
        })
        .unwrap_or_default();
    let listed: Vec<String> = drops.iter().map(|(k, v)| format!("{k} {v}")).collect();
    let _ = writeln!(
        md,
        "| drops by reason | {} |",
        if listed.is_empty() {
            "none".into()
        } else {
            listed.join(", ")
        }
    );
    let handshakes = p.counter("handshakes_completed");
    let unexplained: Vec<&str> = drops
        .iter()
        .filter(|(k, v)| {
            !EXPLAINED_DROPS.iter().any(|e| {
                e.counter == k
                    && match e.bound {
                        DropBound::Count(n) => *v <= n,
                        DropBound::PerHandshake(share) => *v <= share * handshakes,
                    }
            })
        })
        .map(|(k, _)| k.as_str())
        .collect();
    md += "\n![RSS](rss.svg)\n\n![descriptors](fds.svg)\n\n## Checks\n\n";
    let _ = writeln!(
        md,
        "- every client exchanged traffic in the last {ALIVE_WITHIN_S:.0} s: {}",
        verdict(alive == n)
    );
    let _ = writeln!(
        md,
        "- one client in ten roamed: {}",
        verdict(roamers >= n / 10 && roamers > 0)
    );
    let _ = writeln!(
        md,
        "- every client rekeyed (the server completed at least two handshakes per client): {}",
        verdict(p.counter("handshakes_completed") >= 2.0 * n as f64)
    );
    let _ = writeln!(
        md,
        "- RSS flat (second half's peak within 10% + 2 MB of the first's): {}",
        verdict(rss_flat)
    );
    let _ = writeln!(md, "- descriptors flat (within 4): {}", verdict(fds_flat));
    let _ = writeln!(
        md,
        "- drops only for the reasons explained below, within their bounds: {}{}",
        verdict(unexplained.is_empty()),
        if unexplained.is_empty() {
            String::new()
        } else {
            format!(" ({})", unexplained.join(", "))
        }
    );
    md += "\nDrops explained:\n\n";
    for e in &EXPLAINED_DROPS {
        let bound = match e.bound {
            DropBound::Count(n) => format!("at most {n:.0}"),
            DropBound::PerHandshake(share) => format!("at most {:.0}% of the handshakes", share * 100.0),
        };
        let _ = writeln!(md, "- `{}`: {} ({bound}).", e.counter, e.why);
    }
    Ok(md)
}

#[cfg(test)]
mod tests {
    #[test]
    fn axes_read_as_people_write_numbers() {
        assert_eq!(tick(500.0), "500");
        assert_eq!(tick(0.30000000000000004), "0.3");
        assert_eq!(tick(2.5), "2.5");
        assert_eq!(tick(12.25), "12.2");
        // 600,000 microseconds read as 600 milliseconds.
        let lines = Lines::from([("ordo".to_string(), vec![(10.0, 600_000.0), (100.0, 250_000.0)])]);
        let (ms, unit) = in_time_unit(&lines);
        assert_eq!(unit, "milliseconds");
        assert_eq!(ms["ordo"], vec![(10.0, 600.0), (100.0, 250.0)]);
        assert_eq!(
            in_time_unit(&Lines::from([("x".to_string(), vec![(1.0, 2.5e6)])])).1,
            "seconds"
        );
        assert_eq!(
            in_time_unit(&Lines::from([("x".to_string(), vec![(1.0, 400.0)])])).1,
            "microseconds"
        );
    }

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
