//! The soak's report: many clients for a long run with rekeys, roaming and peers changed, checked
//! for liveness, memory and drops.

use super::chart::time_chart;
use super::Point;
use anyhow::{bail, Context, Result};
use std::fmt::Write;

use serde_json::Value;
use std::path::Path;

/// One sample of the soak's server, taken each second by lab/lab.sh.
pub(super) struct Sample {
    seconds: f64,
    rss_mb: f64,
    fds: f64,
    peers: f64,
}

pub(super) fn load_samples(path: &Path) -> Result<Vec<Sample>> {
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

/// How long before the end a client's last round trip may be and still count as alive: the
/// probes come at random (Poisson) twice a second, so a gap of 10 s has odds of e^-20.
pub(super) const ALIVE_WITHIN_S: f64 = 10.0;

/// How many of a drop a soak may show.
#[derive(Clone, Copy)]
pub(super) enum DropBound {
    /// At most this many over the whole run.
    Count(f64),
    /// At most this share of the handshakes the server completed.
    PerHandshake(f64),
}

/// A drop a soak may show, why, and how many.
pub(super) struct ExplainedDrop {
    counter: &'static str,
    why: &'static str,
    bound: DropBound,
}

/// Drops a soak may show: anything else, or more, is a check not met.
pub(super) const EXPLAINED_DROPS: [ExplainedDrop; 4] = [
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
pub(super) fn soak(dir: &Path, points: &[Point]) -> Result<String> {
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
