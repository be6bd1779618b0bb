//! How fast a fuzz target runs without libFuzzer's instrumentation: its kept corpus
//! (fuzz/corpus/NAME), input after input, for SECONDS. The ceiling of the executions a second
//! a campaign can reach on this machine, which `make fuzz-rate` measures (built with
//! `--cfg fuzzing`, as the campaign builds the protocol: crates/ordo-proto/src/memo.rs).
//!
//!   fuzz-rate TARGET [SECONDS=20] [CORPUS=fuzz/corpus/TARGET]
//!
//! Prints the first pass over the corpus apart (the remembered curve and KDF results not yet
//! there, as for inputs a campaign has not met) and the passes after it.

use std::time::{Duration, Instant};

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let Some(name) = args.first() else {
        eprintln!("usage: fuzz-rate TARGET [SECONDS] [CORPUS]");
        std::process::exit(2);
    };
    let Some(target) = ordo_fuzz_targets::TARGETS.iter().find(|t| t.name == name) else {
        eprintln!("fuzz-rate: no target {name}");
        std::process::exit(2);
    };
    let seconds: u64 = args.get(1).and_then(|s| s.parse().ok()).unwrap_or(20);
    let folder = args.get(2).cloned().unwrap_or_else(|| format!("fuzz/corpus/{name}"));
    let mut inputs: Vec<Vec<u8>> = std::fs::read_dir(&folder)
        .unwrap_or_else(|e| panic!("reading {folder}: {e}"))
        .flatten()
        .filter_map(|e| std::fs::read(e.path()).ok())
        .collect();
    inputs.sort();
    if inputs.is_empty() {
        eprintln!("fuzz-rate: {folder} holds no input");
        std::process::exit(1);
    }
    let started = Instant::now();
    inputs.iter().for_each(|i| (target.run)(i));
    let first = started.elapsed();
    let (mut runs, until) = (0u64, started + Duration::from_secs(seconds));
    let later = Instant::now();
    while Instant::now() < until {
        inputs.iter().for_each(|i| (target.run)(i));
        runs += inputs.len() as u64;
    }
    let n = inputs.len() as f64;
    println!(
        "{name}: {} inputs; first pass {:.0} executions/s; after it {:.0}/s ({runs} executions in {:.1} s)",
        inputs.len(),
        n / first.as_secs_f64(),
        runs as f64 / later.elapsed().as_secs_f64().max(1e-9),
        later.elapsed().as_secs_f64()
    );
}
