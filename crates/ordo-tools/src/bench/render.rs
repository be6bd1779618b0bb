//! The bench's report as text: a table per phase, and the scaling between thread counts.

use super::{Comparison, Report};

pub fn render(r: &Report) -> String {
    let rounds = r.phases.first().map_or(0, |p| p.rounds);
    let mut s = format!(
        "ordo bench: model {}, {} peer(s), {}-byte packets, CPUs {}, {} worker(s), {} dispatcher(s), \
         {} crypto thread(s), medians of {rounds} round(s)\n\n\
         | phase | packets | Gbit/s | Mpps | Gbit/s per crypto thread | AEAD ceiling, 1 core | per thread / ceiling | x 1-core ceiling | AEAD ceiling, all threads at once | x all-threads ceiling |\n\
         |---|---|---|---|---|---|---|---|---|---|\n",
        r.model, r.peers, r.size, r.cpus, r.workers, r.dispatchers, r.crypto_threads
    );
    for p in &r.phases {
        s += &format!(
            "| {} | {} | {:.2} | {:.3} | {:.2} | {:.2} | {:.2} | {:.2} | {:.2} | {:.2} |\n",
            p.phase,
            p.packets,
            p.gbit_per_s,
            p.mpps,
            p.gbit_per_s_per_worker,
            p.aead_ceiling_gbit_per_s,
            p.per_worker_vs_ceiling,
            p.vs_one_core_ceiling,
            p.aead_ceiling_all_threads_gbit_per_s,
            p.vs_all_threads_ceiling,
        );
    }
    s
}

/// Each plane's table, then how each scaled against the first.
pub fn render_comparison(c: &Comparison) -> String {
    let mut s: String = c.planes.iter().map(|r| render(r) + "\n").collect();
    s += "Scaling, measured in this run (each plane's Gbit/s over the first's, round by round, median):\n\n\
          | crypto threads | seal Gbit/s | seal x first | open Gbit/s | open x first |\n\
          |---|---|---|---|---|\n";
    for (r, x) in c.planes.iter().zip(&c.scaling) {
        s += &format!(
            "| {} | {:.2} | {:.2} | {:.2} | {:.2} |\n",
            x.crypto_threads, r.phases[0].gbit_per_s, x.seal_vs_first, r.phases[1].gbit_per_s, x.open_vs_first
        );
    }
    s
}
