//! `make test`'s short run of every fuzz target: the inputs that once broke it
//! (fuzz/regressions/NAME), its kept corpus (fuzz/corpus/NAME), its seeds, and seeded
//! mutations of them: up to 100,000 per target, for at most
//! ORDO_FUZZ_SECONDS (default 2) each. The slowest targets (a handshake per input) run a few
//! hundred a second in a debug build.

use ordo_fuzz_targets::short::{self, Budget};
use ordo_fuzz_targets::TARGETS;
use std::path::Path;
use std::time::Duration;

#[test]
fn every_target_holds_on_its_corpus_and_mutations() {
    let seconds = std::env::var("ORDO_FUZZ_SECONDS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(2.0);
    let budget = Budget {
        mutations: 100_000,
        time: Duration::from_secs_f64(seconds),
    };
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../fuzz");
    let findings = Path::new(env!("CARGO_TARGET_TMPDIR")).join("fuzz-findings");
    for (i, t) in TARGETS.iter().enumerate() {
        let start = std::time::Instant::now();
        match short::run(t, &inputs_of(&root, t.name), budget, i as u64, &findings) {
            Ok(r) => eprintln!(
                "fuzz-short {}: {} corpus inputs, {} executions, {:.1} s",
                t.name,
                r.corpus_inputs,
                r.executions,
                start.elapsed().as_secs_f64()
            ),
            Err(f) => panic!(
                "fuzz target {} broke: {} (input saved at {})",
                f.target,
                f.message,
                f.saved.display()
            ),
        }
    }
}

/// The folders of inputs kept for `name`.
fn inputs_of(root: &Path, name: &str) -> Vec<std::path::PathBuf> {
    vec![root.join("regressions").join(name), root.join("corpus").join(name)]
}

/// The driver finds what a target rejects: a target that panics on any input with a zero
/// byte is caught, and the input is saved.
#[test]
fn a_broken_target_is_caught_and_its_input_saved() {
    fn fragile(data: &[u8]) {
        assert!(!data.contains(&0), "a zero byte");
    }
    let t = ordo_fuzz_targets::Target {
        name: "fragile",
        run: fragile,
        seeds: || vec![b"abc".to_vec()],
    };
    let findings = Path::new(env!("CARGO_TARGET_TMPDIR")).join("fuzz-findings-selftest");
    let budget = Budget {
        mutations: 100_000,
        time: Duration::from_secs(10),
    };
    let f = short::run(&t, &[], budget, 1, &findings).unwrap_err();
    assert!(f.message.contains("a zero byte"), "{}", f.message);
    assert!(std::fs::read(&f.saved).unwrap().contains(&0));
}
