//! The many-tunnels scenario's report: Barone et al. (HPSR 2025) figures 4, 8 and 9, two
//! gateways and 1 to 16 tunnels.

use super::chart::{core_chart, line_chart_x};
use super::{series, Point};
use anyhow::Result;
use std::fmt::Write;
use std::path::Path;

pub(super) fn many_tunnels(dir: &Path, points: &[Point]) -> Result<String> {
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
