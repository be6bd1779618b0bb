#!/usr/bin/env bash
# End-to-end throughput, Ordo against wireguard-go and boringtun in one run: two hosts over
# veth, the same implementation at both ends, one iperf3 TCP flow A->B for DURATION seconds,
# RUNS times; prints the median Gbit/s, the CPU time both daemons used (from /proc), and
# ratios against wireguard-go measured in the same run.
#
#   scripts/bench-e2e.sh [DURATION=10] [RUNS=3]
set -euo pipefail
source "$(dirname "$0")/../tests/interop/lib.sh"
DURATION=${1:-10}
RUNS=${2:-3}
IMPLS=(${BENCH_IMPLS:-ordo wireguard-go boringtun})
trap teardown EXIT

# CPU seconds (user + system) of every process in a namespace.
ns_cpu() {
    local total=0 t
    for pid in $(ip netns pids "$1"); do
        t=$(awk '{print $14 + $15}' "/proc/$pid/stat" 2>/dev/null || echo 0)
        total=$((total + t))
    done
    echo "$total"
}

results=$(mktemp)
for impl in "${IMPLS[@]}"; do
    for run in $(seq "$RUNS"); do
        tunnel "$impl" "$impl" >/dev/null
        ip netns exec "$NS_A" ping -q -c 2 -i 0.2 -w 10 "$IN_B" >/dev/null
        # Daemons only: start iperf3 after taking the CPU baseline so it is not counted.
        cpu0=$(( $(ns_cpu "$NS_A") + $(ns_cpu "$NS_B") ))
        ip netns exec "$NS_B" iperf3 -s -1 >/dev/null 2>&1 &
        for _ in $(seq 50); do ip netns exec "$NS_B" ss -ltn | grep -q ':5201 ' && break; sleep 0.1; done
        srv=$!
        json=$(ip netns exec "$NS_A" iperf3 -c "$IN_B" -t "$DURATION" -J)
        wait $srv 2>/dev/null || true
        cpu1=$(( $(ns_cpu "$NS_A") + $(ns_cpu "$NS_B") ))
        echo "$json" | python3 -c "
import json, sys, os
r = json.load(sys.stdin)['end']
ticks = os.sysconf('SC_CLK_TCK')
print('$impl', r['sum_received']['bits_per_second'] / 1e9, ($cpu1 - $cpu0) / ticks / $DURATION, r['sum_sent'].get('retransmits', 0))
" >>"$results"
        if [[ $impl == ordo ]]; then
            # The in-order stage at saturation: receiver's inbound and sender's outbound lanes.
            for side in "$IF_B deliver_inbound" "$IF_A deliver_outbound"; do
                set -- $side
                "$ORDO" show "$1" --json | python3 -c "
import json, sys
c = json.load(sys.stdin)[0]['counters']
w = c['stage_$2_wakeups']
print('lane', '$2', c['stage_$2_packets'], w, c['stage_$2_wasted_wakeups'])" >>"$results"
            done
        fi
        teardown
    done
done

python3 - "$results" "$DURATION" "$RUNS" <<'PY'
import sys, statistics, datetime, platform, os
rows, lanes = {}, {}
for line in open(sys.argv[1]):
    if line.startswith("lane "):
        _, stage, packets, wakeups, wasted = line.split()
        lanes.setdefault(stage, []).append((int(packets), int(wakeups), int(wasted)))
        continue
    impl, gbps, cores, retr = line.split()
    rows.setdefault(impl, []).append((float(gbps), float(cores), int(retr)))
def med(impl, i):
    return statistics.median(r[i] for r in rows[impl])
ref = "wireguard-go" if "wireguard-go" in rows else None
print(f"date {datetime.date.today()}, {os.cpu_count()} cores, kernel {platform.release()}, "
      f"one TCP flow, {sys.argv[2]} s x {sys.argv[3]} runs, median")
print()
print("| implementation | Gbit/s | x wireguard-go | daemon cores (both ends) | cores per Gbit/s | x wireguard-go | retransmits |")
print("|---|---|---|---|---|---|---|")
for impl in rows:
    g, c = med(impl, 0), med(impl, 1)
    cpg = c / g if g else float("inf")
    rg = g / med(ref, 0) if ref else float("nan")
    rc = cpg / (med(ref, 1) / med(ref, 0)) if ref else float("nan")
    print(f"| {impl} | {g:.2f} | {rg:.2f} | {c:.2f} | {cpg:.2f} | {rc:.2f} | {int(med(impl, 2))} |")
if lanes:
    print()
    print("Ordo's in-order stage at saturation (pool model), summed over the runs:")
    print()
    print("| stage | packets | delivery wake-ups | packets per wake-up | wasted wake-ups |")
    print("|---|---|---|---|---|")
    for stage, v in lanes.items():
        p, w, x = (sum(r[i] for r in v) for i in range(3))
        print(f"| {stage} | {p} | {w} | {p / max(w, 1):.1f} | {x} ({100 * x / max(w, 1):.2f}%) |")
PY
