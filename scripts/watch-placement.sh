#!/usr/bin/env bash
# Watches Ordo's placement during one TCP flow: two namespaces, Ordo at both tunnel ends (each
# its own daemon, as in `make bench`), one iperf3 flow A->B. Every second it prints, for each
# end, the peer's queue, its load, the handshakes so far, and per queue what its CPU did
# besides Ordo ("other"), its idle share and the queue thread's wait for its CPU (see
# crates/ordo/src/device/cpuload.rs). At the end: the flow's Gbit/s, the machine's CPU by
# kind, and each daemon thread's CPU time and the CPU it ran on last.
#
#   scripts/watch-placement.sh [MODEL=inline] [SECONDS=10]
set -euo pipefail
source "$(dirname "$0")/../tests/interop/lib.sh"
MODEL=${1:-inline}
SECS=${2:-10}
trap teardown EXIT

ORDO_MODEL=$MODEL tunnel ordo ordo >/dev/null
ip netns exec "$NS_A" ping -q -c 2 -i 0.2 -w 10 "$IN_B" >/dev/null
ip netns exec "$NS_B" iperf3 -s -1 >/dev/null 2>&1 &
for _ in $(seq 50); do ip netns exec "$NS_B" ss -ltn | grep ':5201 ' >/dev/null && break; sleep 0.1; done

# CPU time (user + system ticks) of a /proc stat file.
ticks() { awk '{print $14 + $15}' "$1" 2>/dev/null || echo 0; }
declare -A before
threads=()
for pid in $(ip netns pids "$NS_A") $(ip netns pids "$NS_B"); do
    for t in /proc/"$pid"/task/*; do threads+=("$t"); before[$t]=$(ticks "$t/stat"); done
done
read -r _ u0 n0 s0 i0 w0 q0 sq0 st0 _ </proc/stat
json=$(mktemp)
ip netns exec "$NS_A" iperf3 -c "$IN_B" -t "$SECS" -J >"$json" &
flow=$!

echo "second end queue load handshakes | per queue: other load, idle, thread wait"
start=$SECONDS
while kill -0 "$flow" 2>/dev/null; do
    # Until the next second, or the end of the flow (the figures below stop with it).
    for _ in $(seq 10); do kill -0 "$flow" 2>/dev/null && sleep 0.1; done
    kill -0 "$flow" 2>/dev/null || break
    t=$((SECONDS - start))
    for side in "$IF_A a" "$IF_B b"; do
        set -- $side
        "$ORDO" show "$1" --json | T=$t END=$2 python3 -c '
import json, os, sys
s = json.load(sys.stdin)[0]
c, p = s["counters"], s["peers"][0]["placement"]
q = []
for x in s["queues"]:
    seen = x["last_interval"]
    if seen:
        q.append("q%d %.2f %.2f %.2f" % (x["queue"], seen["other_millicores"] / 1000, seen["idle_permille"] / 1000, seen["thread_wait_permille"] / 1000))
print("%6s %3s %5d %5.2f %10d | %s" % (os.environ["T"], os.environ["END"], p["queue"], p["millicores"] / 1000, c["handshakes_completed"], "  ".join(q)))'
    done
done
read -r _ u1 n1 s1 i1 w1 q1 sq1 st1 _ </proc/stat
declare -A after
for t in "${threads[@]}"; do after[$t]=$(ticks "$t/stat"); done
wait "$flow"

python3 - "$json" "$((u1 + n1 - u0 - n0))" "$((s1 - s0))" "$((q1 + sq1 - q0 - sq0))" "$((i1 + w1 - i0 - w0))" "$((st1 - st0))" <<'PY'
import json, os, sys
e = json.load(open(sys.argv[1]))["end"]
user, system, softirq, idle, steal = map(int, sys.argv[2:7])
total = user + system + softirq + idle + steal
cores = lambda x: os.cpu_count() * x / total if total else 0
print(f"\nflow: {e['sum_received']['bits_per_second'] / 1e9:.2f} Gbit/s")
print(f"machine, in cores: user {cores(user):.2f}, system {cores(system):.2f}, "
      f"interrupts {cores(softirq):.2f}, steal {cores(steal):.2f}, idle {cores(idle):.2f}")
PY
hz=$(getconf CLK_TCK)
echo "threads in the namespaces above 0.05 cores: name, last CPU, cores"
for t in "${threads[@]}"; do
    [[ -e $t/stat ]] || continue
    d=$((${after[$t]} - ${before[$t]}))
    ((d * 20 > hz * SECS)) || continue
    printf '  %-14s cpu%-3s %s\n' "$(cat "$t/comm")" "$(awk '{print $39}' "$t/stat")" \
        "$(awk -v d="$d" -v hz="$hz" -v s="$SECS" 'BEGIN { printf "%.2f", d / hz / s }')"
done
rm -f "$json"
