#!/usr/bin/env bash
# The fuzz campaign: every target of crates/ordo-fuzz-targets under libFuzzer (cargo-fuzz,
# nightly toolchain, debug assertions and overflow checks on but in the curve arithmetic:
# fuzz/Cargo.toml and scripts/fuzz-rustc.sh say why; its results are remembered under the
# fuzzer: crates/ordo-proto/src/curve.rs), SECONDS each, one after another. The packet targets
# run under AddressSanitizer (the checksum's AVX2 path is unsafe code); the others reach only
# safe Rust, where ASan finds nothing and costs several times the executions.
#
#   scripts/fuzz-campaign.sh [SECONDS=3600] [TARGET...]
#
# A target stops at SECONDS or when its executions recorded in fuzz/campaign.tsv reach
# FUZZ_GOAL (10^8 by default), whichever comes first, so the campaign
# can be run again and again until every target has its 10^8; a target past its goal is
# skipped (FUZZ_GOAL=0 runs it anyway). FUZZ_SANITIZER=none|address overrides the sanitizer.
#
# Each target starts from its kept corpus (fuzz/corpus/NAME) and its seeds; what it finds is
# merged back into fuzz/corpus/NAME minimised (libFuzzer's -merge=1: the smallest set of
# inputs with the same coverage), for the repository. A crash leaves its input in
# fuzz/artifacts/NAME/: turn it into a regression test (a unit test where the bug was, and
# the input into fuzz/regressions/NAME, which make test's short run replays and the campaign
# starts from, but never minimises away), then fix it.
# Prints, and appends to fuzz/campaign.tsv: date, commit, target, sanitizer, seconds, executions,
# executions per second, coverage (libFuzzer's cov: edges; ft: features), corpus size,
# crashes.
set -uo pipefail
cd "$(dirname "$0")/.."
SECONDS_EACH=${1:-3600}
shift || true
ALL=$(sed -n 's/^ *name: "\([a-z_0-9]*\)",$/\1/p' crates/ordo-fuzz-targets/src/lib.rs)
TARGETS=("$@")
((${#TARGETS[@]})) || read -r -a TARGETS <<<"$(echo $ALL)"
command -v cargo-fuzz >/dev/null || cargo install -q cargo-fuzz --locked
cargo +nightly --version >/dev/null || { echo "fuzz-campaign: needs the nightly toolchain" >&2; exit 1; }

WORK=$(mktemp -d /tmp/ordo-fuzz.XXXXXX)
trap 'rm -rf "$WORK"' EXIT
cargo run -q --release -p ordo-fuzz-targets --bin fuzz-seeds "$WORK/seeds"
TABLE=fuzz/campaign.tsv
[[ -s $TABLE ]] || printf 'date\tcommit\ttarget\tsanitizer\tseconds\texecutions\texec_per_s\tcov\tft\tcorpus\tcrashes\n' >"$TABLE"
COMMIT=$(git rev-parse --short HEAD)
FAILED=0
cd fuzz
# -O: cargo-fuzz's release build without its blanket -Cdebug-assertions, so that the profile
# in fuzz/Cargo.toml decides, crate by crate.
export RUSTC_WRAPPER=$PWD/../scripts/fuzz-rustc.sh
sanitizer() {
    if [[ -n ${FUZZ_SANITIZER:-} ]]; then echo "$FUZZ_SANITIZER"; return; fi
    case $1 in tun_read | tun_write | ip_headers) echo address ;; *) echo none ;; esac
}
GOAL=${FUZZ_GOAL:-100000000}
# Findings: crashes, leaks, timeouts, out-of-memory. libFuzzer also keeps "slow-unit-" inputs
# (slower than 10 s once, which a machine busy elsewhere or a stopped process produces): not
# findings.
findings() { find "artifacts/$1" -maxdepth 1 -type f \( -name 'crash-*' -o -name 'leak-*' -o -name 'timeout-*' -o -name 'oom-*' \) | wc -l; }
# The executions fuzz/campaign.tsv records for target $1 (unknown counts as none).
recorded() { awk -F'\t' -v t="$1" 'NR > 1 && $3 == t && $6 ~ /^[0-9]+$/ { n += $6 } END { printf "%d", n }' "../$TABLE"; }
for t in "${TARGETS[@]}"; do
    san=$(sanitizer "$t")
    runs=()
    if ((GOAL > 0)); then
        left=$((GOAL - $(recorded "$t")))
        if ((left <= 0)); then
            echo "fuzz-campaign: $t already has $(recorded "$t") executions recorded (goal $GOAL); skipped"
            continue
        fi
        runs=(-runs="$left")
    fi
    mkdir -p "corpus/$t" "regressions/$t" "$WORK/new/$t" "artifacts/$t"
    cargo +nightly fuzz build -O -s "$san" "$t" >/dev/null 2>&1 || { echo "fuzz-campaign: $t does not build" >&2; exit 1; }
    crashes_before=$(findings "$t")
    log="$WORK/$t.log"
    cargo +nightly fuzz run -O -s "$san" "$t" "$WORK/new/$t" "corpus/$t" "regressions/$t" "$WORK/seeds/$t" -- \
        -max_total_time="$SECONDS_EACH" "${runs[@]}" -print_final_stats=1 -timeout=10 -rss_limit_mb=2048 >"$log" 2>&1
    crashes=$(($(findings "$t") - crashes_before))
    execs=$(sed -n 's/^stat::number_of_executed_units: *//p' "$log" | tail -1)
    rate=$(sed -n 's/^stat::average_exec_per_sec: *//p' "$log" | tail -1)
    cov=$(grep -o 'cov: [0-9]*' "$log" | tail -1 | cut -d' ' -f2)
    ft=$(grep -o 'ft: [0-9]*' "$log" | tail -1 | cut -d' ' -f2)
    # Minimise: what was kept plus what was found, into a fresh folder that replaces it.
    mkdir -p "$WORK/min/$t"
    cargo +nightly fuzz run -O -s "$san" "$t" -- -merge=1 "$WORK/min/$t" "corpus/$t" "$WORK/new/$t" >/dev/null 2>&1
    if [[ -n "$(ls "$WORK/min/$t")" ]]; then
        rm -rf "corpus/$t"
        mv "$WORK/min/$t" "corpus/$t"
    fi
    corpus=$(ls "corpus/$t" | wc -l)
    took=$(sed -n 's/^Done [0-9]* runs in \([0-9]*\) second.*/\1/p' "$log" | tail -1)
    # A run that ended otherwise (a finding, an interruption) has no "Done" line: its time
    # from its count and rate.
    if [[ -z $took && -n ${execs:-} && ${rate:-0} -gt 0 ]]; then took=$((execs / rate)); fi
    row="$(date -u +%F)	$COMMIT	$t	$san	${took:-$SECONDS_EACH}	${execs:-?}	${rate:-?}	${cov:-?}	${ft:-?}	$corpus	$crashes"
    echo "$row" >>"../$TABLE"
    echo "$row"
    if ((crashes > 0)); then
        FAILED=1
        echo "fuzz-campaign: $t crashed; inputs in fuzz/artifacts/$t; log:" >&2
        grep -A30 -m1 -E 'panicked|ERROR: AddressSanitizer|ERROR: libFuzzer' "$log" >&2
    fi
done
echo "fuzz-campaign: executions recorded per target (goal $GOAL):"
for t in $ALL; do printf '  %-20s %12d\n' "$t" "$(recorded "$t")"; done
exit $FAILED
