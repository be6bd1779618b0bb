#!/usr/bin/env bash
# Before and after in the same run, for a change that must not move the figures (a
# restructuring): one TCP flow end to end (bench-e2e's `tcp` case, ordo-auto at both ends)
# and `ordo bench` (inline, one peer: seal and open against the same round's AEAD ceiling),
# alternating REV's build and the working tree's, ROUNDS times, so that the machine's drift
# falls on both alike. Prints each round and the medians, after against before. Run as root.
#
#   scripts/bench-compare.sh REV [ROUNDS=3]
#
# BEFORE=PATH names REV's `ordo` already built (its worktree's target/release/ordo) instead.
set -euo pipefail
cd "$(dirname "$0")/.."
REV=${1:?usage: scripts/bench-compare.sh REV [ROUNDS]}
ROUNDS=${2:-3}
WORK=$(mktemp -d /tmp/ordo-compare.XXXXXX)
cleanup() {
    git worktree remove --force "$WORK/before" 2>/dev/null || true
    rm -rf "$WORK"
}
trap cleanup EXIT
if [[ -z ${BEFORE:-} ]]; then
    git worktree add -q --detach "$WORK/before" "$REV"
    echo "bench-compare: building $REV" >&2
    (cd "$WORK/before" && cargo build --release --locked -q)
    BEFORE=$WORK/before/target/release/ordo
fi
cargo build --release --locked -q
declare -A BIN=([before]="$BEFORE" [after]="$PWD/target/release/ordo")
RESULTS=$WORK/results
for round in $(seq "$ROUNDS"); do
    for side in before after; do
        flow=$(ORDO=${BIN[$side]} BENCH_IMPLS=ordo-auto BENCH_CASES=tcp scripts/bench-e2e.sh 10 1 2>/dev/null |
            awk -F'|' '$2 ~ /^ *tcp *$/ && $3 ~ /ordo-auto/ {gsub(/ /, "", $4); print $4; exit}')
        bench=$("${BIN[$side]}" bench --model inline --peers 1 --packets 300000 --rounds 3 --json 2>/dev/null |
            python3 -c 'import json,sys; p={x["phase"]: x["vs_one_core_ceiling"] for x in json.load(sys.stdin)["phases"]}; print(p["seal"], p["open"])')
        echo "$round $side ${flow:-0} $bench" | tee -a "$RESULTS"
    done
done
python3 - "$RESULTS" "$REV" <<'EOF'
import statistics, sys
rows = [l.split() for l in open(sys.argv[1])]
med = lambda side, i: statistics.median(float(r[i]) for r in rows if r[1] == side)
print(f"medians over {len(rows) // 2} rounds, before = {sys.argv[2]}, after = the working tree:")
for name, i in (("one flow, Gbit/s", 2), ("ordo bench seal, x ceiling", 3), ("ordo bench open, x ceiling", 4)):
    b, a = med("before", i), med("after", i)
    print(f"  {name:28} before {b:6.2f}  after {a:6.2f}  after/before {a / b if b else 0:5.2f}")
EOF
