#!/usr/bin/env bash
# What the metrics endpoint costs, in one run:
#   1. one TCP flow A->B through an Ordo tunnel (the same as `make bench`'s), with and
#      without a scraper reading both daemons' /metrics every 100 ms; the runs alternate,
#      and the ratio of the medians is the cost;
#   2. the time to answer one scrape with 10,000 peers configured (median and worst of 20).
#
#   scripts/bench-metrics.sh [SECONDS] [PAIRS]     default: 10 s, 5 pairs of runs
set -euo pipefail
source "$(dirname "$0")/../tests/interop/lib.sh"
DURATION=${1:-10}
PAIRS=${2:-5}
PEERS=${BENCH_METRICS_PEERS:-10000}
trap teardown EXIT

# flow SCRAPE: one iperf3 run through a fresh tunnel; prints Gbit/s. SCRAPE=1 reads both
# daemons' metrics every 100 ms meanwhile (a curl each, as a Prometheus server would).
flow() {
    local scrape=$1 scraper=""
    ORDO_METRICS=9586 tunnel ordo ordo >/dev/null
    ip netns exec "$NS_A" ping -q -c 2 -i 0.2 -w 10 "$IN_B" >/dev/null
    ip netns exec "$NS_B" iperf3 -s -1 >/dev/null 2>&1 &
    sleep 0.3
    if ((scrape)); then
        # One resident scraper per daemon, on a kept-alive connection, as Prometheus scrapes.
        for ns in "$NS_A" "$NS_B"; do
            ip netns exec "$ns" python3 -c '
import http.client, sys, time
end = time.monotonic() + float(sys.argv[1])
c = http.client.HTTPConnection("127.0.0.1", 9586)
while time.monotonic() < end:
    c.request("GET", "/metrics")
    r = c.getresponse()
    assert r.status == 200 and r.read()
    time.sleep(0.1)
' "$((DURATION + 2))" &
            scraper+=" $!"
        done
    fi
    ip netns exec "$NS_A" iperf3 -c "$IN_B" -t "$DURATION" -J \
        | python3 -c 'import json,sys; print("%.3f" % (json.load(sys.stdin)["end"]["sum_received"]["bits_per_second"] / 1e9))'
    # The endpoint's own CPU time, both daemons (its thread is named ordo-metrics).
    local ms=0 t
    for t in /proc/[0-9]*/task/[0-9]*; do
        [[ $(cat "$t/comm" 2>/dev/null) == ordo-metrics ]] || continue
        ms=$((ms + $(awk '{print ($14 + $15) * 10}' "$t/stat")))
    done
    echo "$ms" >>"$LOGDIR/metrics-ms"
    for pid in $scraper; do
        kill "$pid" 2>/dev/null || true
        wait "$pid" 2>/dev/null || true
    done
    teardown
}

median() { tr ' ' '\n' | sort -g | awk '{v[NR] = $1} END {print (NR % 2) ? v[(NR + 1) / 2] : (v[NR / 2] + v[NR / 2 + 1]) / 2}'; }

without=() with=()
for ((i = 0; i < PAIRS; i++)); do
    without+=("$(flow 0)")
    with+=("$(flow 1)")
done
m0=$(echo "${without[*]}" | median)
m1=$(echo "${with[*]}" | median)
# CPU ms of the endpoints in the scraped runs (the other runs' threads answered nothing).
endpoint_ms=$(awk 'NR % 2 == 0 {s += $1; n++} END {printf "%.0f", s / n}' "$LOGDIR/metrics-ms")

# A daemon with $PEERS peers (random public keys, one /32 each): how long a scrape takes.
make_hosts
ORDO_METRICS=9586 start_impl ordo "$NS_A" "$IF_A"
conf="$LOGDIR/peers.conf"
python3 - "$PEERS" >"$conf" <<'EOF'
import base64, os, sys
n = int(sys.argv[1])
print("[Interface]\nPrivateKey = %s\nListenPort = 51900" % base64.b64encode(os.urandom(32)).decode())
for i in range(n):
    print("[Peer]\nPublicKey = %s\nAllowedIPs = 10.%d.%d.%d/32"
          % (base64.b64encode(os.urandom(32)).decode(), 100 + i // 65536, i // 256 % 256, i % 256))
EOF
ip netns exec "$NS_A" wg setconf "$IF_A" "$conf"
configured=$(wg show "$IF_A" peers | wc -l)
times=()
for _ in $(seq 20); do
    times+=("$(ip netns exec "$NS_A" curl -fsS -o "$LOGDIR/scrape.txt" -w '%{time_total}' http://127.0.0.1:9586/metrics)")
done
lines=$(wc -l <"$LOGDIR/scrape.txt")
bytes=$(wc -c <"$LOGDIR/scrape.txt")
t_med=$(echo "${times[*]}" | median)
t_max=$(printf '%s\n' "${times[@]}" | sort -g | tail -1)

echo "date $(date +%F), commit $(git -C "$(dirname "$0")/.." rev-parse --short HEAD), $(nproc) cores, kernel $(uname -r)"
echo
echo "| one TCP flow, Gbit/s | without scrapes | scraped every 100 ms | ratio | endpoints' CPU per run | runs without | runs with |"
echo "|---|---|---|---|---|---|---|"
printf '| ordo (default model) | %s | %s | %s | %s ms | %s | %s |\n' "$m0" "$m1" \
    "$(awk -v a="$m1" -v b="$m0" 'BEGIN {printf "%.3f", a / b}')" "$endpoint_ms" "${without[*]}" "${with[*]}"
echo
echo "| peers | scrape, median ms | worst of 20, ms | lines | bytes |"
echo "|---|---|---|---|---|"
ms() { awk -v s="$1" 'BEGIN {printf "%.1f", s * 1000}'; }
printf '| %s | %s | %s | %s | %s |\n' "$configured" "$(ms "$t_med")" "$(ms "$t_max")" "$lines" "$bytes"
