//! The short run of a target that `make test` does on the stable toolchain: every input of
//! its kept corpus and its seeds as they are, then a fixed number of inputs mutated from
//! them by a seeded generator (bit flips, byte changes, insertions, deletions, copies,
//! splices, truncations). Not libFuzzer (no coverage feedback): a quick check that the
//! campaigns' findings stay fixed and the targets still hold on their own inputs.

use crate::Target;
use rand_chacha::ChaCha20Rng;
use rand_core::{RngCore, SeedableRng};
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::path::{Path, PathBuf};

/// What a short run did.
#[derive(Debug)]
pub struct ShortRun {
    pub corpus_inputs: usize,
    pub executions: u64,
}

/// An input that broke an invariant, saved where [`run`] says.
#[derive(Debug)]
pub struct Finding {
    pub target: &'static str,
    pub message: String,
    pub saved: PathBuf,
}

/// How long a short run mutates, at most and at least.
#[derive(Debug, Clone, Copy)]
pub struct Budget {
    /// Mutated inputs at most.
    pub mutations: u64,
    /// Time at most, once the corpus and seeds have run (a slow target runs fewer).
    pub time: std::time::Duration,
}

/// Runs `target` over the files in the `corpus` folders (those that exist), its seeds, and mutated inputs
/// drawn with `seed` within `budget` (the same inputs in the same order on every run). The
/// first input that panics is saved under `findings` and returned.
pub fn run(
    target: &Target,
    corpus: &[PathBuf],
    budget: Budget,
    seed: u64,
    findings: &Path,
) -> Result<ShortRun, Finding> {
    let mut inputs: Vec<Vec<u8>> = corpus
        .iter()
        .filter_map(|dir| std::fs::read_dir(dir).ok())
        .flatten()
        .filter_map(|e| std::fs::read(e.ok()?.path()).ok())
        .collect();
    let corpus_inputs = inputs.len();
    inputs.extend((target.seeds)());
    if inputs.is_empty() {
        inputs.push(Vec::new());
    }
    let try_one = |input: &[u8]| -> Result<(), Finding> {
        catch_unwind(AssertUnwindSafe(|| (target.run)(input))).map_err(|e| {
            let message = e
                .downcast_ref::<String>()
                .cloned()
                .or_else(|| e.downcast_ref::<&str>().map(|s| s.to_string()))
                .unwrap_or_default();
            let _ = std::fs::create_dir_all(findings);
            let saved = findings.join(format!("{}-{:016x}", target.name, name_of(input)));
            let _ = std::fs::write(&saved, input);
            Finding {
                target: target.name,
                message,
                saved,
            }
        })
    };
    for input in &inputs {
        try_one(input)?;
    }
    let mut rng = ChaCha20Rng::seed_from_u64(seed);
    let start = std::time::Instant::now();
    let mut mutations = 0;
    while mutations < budget.mutations && start.elapsed() < budget.time {
        mutations += 1;
        let base = &inputs[rng.next_u32() as usize % inputs.len()];
        let other = &inputs[rng.next_u32() as usize % inputs.len()];
        let input = mutate(base, other, &mut rng);
        try_one(&input)?;
    }
    Ok(ShortRun {
        corpus_inputs,
        executions: inputs.len() as u64 + mutations,
    })
}

/// One to four random edits of `base`, some taking bytes from `other`.
pub fn mutate(base: &[u8], other: &[u8], rng: &mut ChaCha20Rng) -> Vec<u8> {
    let mut b = base.to_vec();
    let below = |rng: &mut ChaCha20Rng, n: usize| rng.next_u32() as usize % n.max(1);
    for _ in 0..1 + below(rng, 4) {
        match below(rng, 8) {
            0 if !b.is_empty() => {
                let i = below(rng, b.len());
                b[i] ^= 1 << below(rng, 8);
            }
            1 if !b.is_empty() => {
                let i = below(rng, b.len());
                b[i] = [0, 1, 0x7f, 0x80, 0xff][below(rng, 5)];
            }
            2 => {
                let i = below(rng, b.len() + 1);
                let n = 1 + below(rng, 16);
                let bytes: Vec<u8> = (0..n).map(|_| rng.next_u32() as u8).collect();
                b.splice(i..i, bytes);
            }
            3 if !b.is_empty() => {
                let i = below(rng, b.len());
                let n = 1 + below(rng, (b.len() - i).min(32));
                b.drain(i..i + n);
            }
            4 if !b.is_empty() => {
                let i = below(rng, b.len());
                let n = 1 + below(rng, (b.len() - i).min(32));
                let copy = b[i..i + n].to_vec();
                let at = below(rng, b.len() + 1);
                b.splice(at..at, copy);
            }
            5 if !other.is_empty() => {
                let cut = below(rng, b.len() + 1);
                let from = below(rng, other.len());
                b.truncate(cut);
                b.extend_from_slice(&other[from..]);
            }
            6 => {
                let n = below(rng, b.len() + 1);
                b.truncate(n);
            }
            _ if !b.is_empty() => {
                let i = below(rng, b.len());
                b[i] = rng.next_u32() as u8;
            }
            _ => b.push(rng.next_u32() as u8),
        }
    }
    b
}

/// A name for an input (FNV-1a of its bytes).
pub fn name_of(b: &[u8]) -> u64 {
    b.iter().fold(0xcbf2_9ce4_8422_2325, |h, &x| {
        (h ^ x as u64).wrapping_mul(0x100_0000_01b3)
    })
}
