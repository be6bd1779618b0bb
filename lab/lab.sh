#!/usr/bin/env bash
# The papers' experiments on one machine, every server implementation under the same load in
# one run, with `ordo loadgen` playing the clients. Writes results.jsonl, SVG figures and
# report.md (each figure beside the paper figure it reproduces) under lab/out/SCENARIO.
#
#   lab/lab.sh many-clients [--short]   Mounah et al. (SYSTOR 2025) figures 1, 6-9: 10 ... 1,000 clients
#   lab/lab.sh inversion [--short]      execution order inversion made visible: Ordo's threaded
#                                       model with delivery at SCHED_FIFO, beside the normal ones
#   lab/lab.sh many-tunnels [--short]   Barone et al. (HPSR 2025) figures 4, 8, 9: two gateways, 1 ... 16 tunnels
#                                       with one TCP flow each, one tunnel with 1 ... 8 flows
#   lab/lab.sh soak [--short]           1,000 clients for 30 minutes (LAB_SOAK_SECONDS)
#                                       rekeying, a tenth roaming, peers added and removed every
#                                       second; the server's RSS and descriptors each second;
#                                       exits non-zero if a check is not met
#
# --short: tens of clients, a few seconds a point (what `make test` runs). LAB_IMPLS narrows the
# implementations; LAB_OUT changes the output directory; LAB_COUNTS, LAB_TOTAL and LAB_ADDRS
# change the many-clients grid (client counts, packets/s offered at the top count, client
# source addresses); LAB_PROBES the round-trip probes per client and second beside its
# upload. Run as root after a release build.
set -euo pipefail
ROOT="$(cd "$(dirname "$0")/.." && pwd)"
source "$ROOT/tests/interop/lib.sh"
SCENARIO=${1:?usage: lab/lab.sh many-clients|inversion|many-tunnels|soak [--short]}
SHORT=0
[[ ${2:-} == --short ]] && SHORT=1
OUT=${LAB_OUT:-$ROOT/lab/out/$SCENARIO}
mkdir -p "$OUT"
: >"$OUT/results.jsonl"
trap teardown EXIT

# Client outer addresses: WireGuard rate-limits handshakes per source address, and the papers'
# clients came from many machines.
ADDRS=${LAB_ADDRS:-32}

# lab_server IMPL CLIENTS: B runs the server, configured for CLIENTS clients from
# `ordo loadgen setup`; A gets the clients' outer addresses. IMPL: wireguard-go, boringtun,
# ordo-MODEL, or ordo-fifo (the threaded model with delivery at SCHED_FIFO).
lab_server() {
    local impl=$1 n=$2 model="" fifo=""
    case $impl in
        ordo-fifo) impl=ordo; model=threaded; fifo=1 ;;
        ordo-*) model=${impl#ordo-}; impl=ordo ;;
    esac
    make_hosts
    ip -n "$NS_B" route add 10.77.1.0/24 dev veth-b
    BIND=""
    for i in $(seq 1 $ADDRS); do
        ip -n "$NS_A" addr add "10.77.1.$i/16" dev veth-a
        BIND="$BIND${BIND:+,}10.77.1.$i"
    done
    ORDO_MODEL=$model ORDO_DELIVERY_FIFO=$fifo start_impl "$impl" "$NS_B" "$IF_B"
    "$ORDO" loadgen setup --clients "$n" --listen-port "$PORT_B" >"$LOGDIR/server.conf"
    ip netns exec "$NS_B" wg setconf "$IF_B" "$LOGDIR/server.conf"
    ip -n "$NS_B" addr add 10.200.0.1/16 dev "$IF_B"
    ip -n "$NS_B" link set "$IF_B" mtu 1420 up
    SERVER_PID=$(ip netns pids "$NS_B" | sed -n 1p)
}

# point IMPL CLIENTS KIND LOADGEN-ARGS...: one loadgen run against the server in place,
# appended to results.jsonl with Ordo's own counters when the server is Ordo.
point() {
    local impl=$1 n=$2 kind=$3
    shift 3
    local report=$LOGDIR/report.json counters=$LOGDIR/counters.json
    ip netns exec "$NS_A" "$ORDO" loadgen run --clients "$n" --server "$OUT_B:$PORT_B" \
        --sink-netns "$NS_B" --server-pid "$SERVER_PID" --bind "$BIND" --handshake-timeout 90 \
        --json "$@" >"$report"
    # Ordo's own counters: the interface's and each stage's (not each thread's).
    if [[ $impl == ordo* ]]; then
        "$ORDO" show "$IF_B" --json | python3 -c 'import json,sys
print(json.dumps(json.load(sys.stdin)[0]["counters"]))' >"$counters"
    else
        echo null >"$counters"
    fi
    python3 - "$report" "$impl" "$n" "$kind" "$counters" >>"$OUT/results.jsonl" <<'EOF'
import json, sys
r = json.load(open(sys.argv[1]))
r.pop("per_client", None)
print(json.dumps({"impl": sys.argv[2], "clients": int(sys.argv[3]), "kind": sys.argv[4],
                  "report": r, "server": json.load(open(sys.argv[5]))}))
EOF
    printf '  %-14s %5s clients %-9s up %.3f Gbit/s, down %.3f Gbit/s, rtt p99 %s us\n' "$impl" "$n" "$kind" \
        "$(python3 -c "import json;print(json.load(open('$report'))['up_gbit'])")" \
        "$(python3 -c "import json;print(json.load(open('$report'))['down_gbit'])")" \
        "$(python3 -c "import json;print(json.load(open('$report'))['round_trip']['p99_us'])")"
}

# ---- soak -------------------------------------------------------------------------------------

# soak_sampler PID FILE: each second, the seconds elapsed, the server's RSS (kB), its open
# descriptors and its peers, until it is killed.
soak_sampler() {
    local pid=$1 file=$2 start=$SECONDS
    printf 't\trss_kb\tfds\tpeers\n' >"$file"
    while kill -0 "$pid" 2>/dev/null; do
        printf '%s\t%s\t%s\t%s\n' $((SECONDS - start)) "$(awk '/^VmRSS/ {print $2}' "/proc/$pid/status")" \
            "$(ls "/proc/$pid/fd" | wc -l)" "$(ip netns exec "$NS_B" wg show "$IF_B" peers | wc -l)" >>"$file"
        sleep 1
    done
}

# soak_churn PID LOG: each second a new peer (a fresh key, a /32 of its own) added through the
# UAPI, and the one added five seconds before removed, until it is killed or the server PID
# is gone.
soak_churn() {
    local pid=$1 log=$2 i=0 keys=()
    while kill -0 "$pid" 2>/dev/null; do
        keys[i % 5]=$(pubkey "$(genkey)")
        ip netns exec "$NS_B" wg set "$IF_B" peer "${keys[i % 5]}" allowed-ips "10.201.$((i / 250 % 250)).$((i % 250 + 1))/32"
        i=$((i + 1))
        if ((i >= 5)); then
            ip netns exec "$NS_B" wg set "$IF_B" peer "${keys[i % 5]}" remove
        fi
        echo "$i" >"$log"
        sleep 1
    done
}

# ---- many tunnels (Barone et al.): source -> gw1 => T tunnels => gw2 -> drain --------------------
GW_NS=(lab-src lab-gw1 lab-gw2 lab-dst)

gw_teardown() {
    for ns in "${GW_NS[@]}"; do
        ip netns pids "$ns" 2>/dev/null | xargs -r kill 2>/dev/null || true
    done
    for ns in "${GW_NS[@]}"; do
        for _ in $(seq 50); do [[ -z "$(ip netns pids "$ns" 2>/dev/null)" ]] && break; sleep 0.1; done
        ip netns del "$ns" 2>/dev/null || true
    done
    rm -f /var/run/wireguard/lgw*.sock
}

# Four hosts in a row: src (10.230.t.1 per tunnel t) - gw1 - gw2 - dst (10.220.t.2 per tunnel).
gw_topology() {
    gw_teardown
    for ns in "${GW_NS[@]}"; do ip netns add "$ns"; ip -n "$ns" link set lo up; done
    ip link add s0 netns lab-src type veth peer name g1a netns lab-gw1
    ip link add g1b netns lab-gw1 type veth peer name g2a netns lab-gw2
    ip link add g2b netns lab-gw2 type veth peer name d0 netns lab-dst
    local pair
    for pair in "lab-src s0 10.240.1.1" "lab-gw1 g1a 10.240.1.2" "lab-gw1 g1b 10.240.2.1" \
        "lab-gw2 g2a 10.240.2.2" "lab-gw2 g2b 10.240.3.1" "lab-dst d0 10.240.3.2"; do
        set -- $pair
        ip -n "$1" addr add "$3/24" dev "$2"
        ip -n "$1" link set "$2" up
    done
    for gw in lab-gw1 lab-gw2; do ip netns exec "$gw" sysctl -qw net.ipv4.ip_forward=1; done
    ip -n lab-src route add default via 10.240.1.2
    ip -n lab-dst route add default via 10.240.3.1
}

# gw_tunnel IMPL T: tunnel number T between the gateways (a daemon of IMPL on each side).
gw_tunnel() {
    local impl=$1 t=$2 model=""
    [[ $impl == ordo-* ]] && { model=${impl#ordo-}; impl=ordo; }
    local k1 k2
    k1=$(genkey); k2=$(genkey)
    ORDO_MODEL=$model start_impl "$impl" lab-gw1 "lgw1t$t"
    ORDO_MODEL=$model start_impl "$impl" lab-gw2 "lgw2t$t"
    (umask 077; echo "$k1" >"$LOGDIR/k1"; echo "$k2" >"$LOGDIR/k2")
    ip netns exec lab-gw1 wg set "lgw1t$t" private-key "$LOGDIR/k1" listen-port $((52000 + t)) \
        peer "$(pubkey "$k2")" endpoint "10.240.2.2:$((53000 + t))" allowed-ips "10.220.$t.0/24"
    ip netns exec lab-gw2 wg set "lgw2t$t" private-key "$LOGDIR/k2" listen-port $((53000 + t)) \
        peer "$(pubkey "$k1")" endpoint "10.240.2.1:$((52000 + t))" allowed-ips "10.230.$t.0/24"
    ip -n lab-gw1 link set "lgw1t$t" mtu 1420 up
    ip -n lab-gw2 link set "lgw2t$t" mtu 1420 up
    ip -n lab-gw1 route add "10.220.$t.0/24" dev "lgw1t$t"
    ip -n lab-gw2 route add "10.230.$t.0/24" dev "lgw2t$t"
    ip -n lab-gw1 route add "10.230.$t.0/24" via 10.240.1.1
    ip -n lab-gw2 route add "10.220.$t.0/24" via 10.240.3.2
    ip -n lab-src addr add "10.230.$t.1/32" dev s0
    ip -n lab-dst addr add "10.220.$t.2/32" dev d0
}

# gw_point IMPL KIND N TUNNELS FLOWS: FLOWS TCP flows over each of TUNNELS tunnels for SECS;
# one line of results.jsonl (aggregate throughput, the gateways' daemons' CPU, per-CPU shares).
gw_point() {
    local impl=$1 kind=$2 n=$3 tunnels=$4 flows=$5 t f port
    gw_topology
    for t in $(seq 1 "$tunnels"); do gw_tunnel "$impl" "$t"; done
    for t in $(seq 1 "$tunnels"); do
        ip netns exec lab-src ping -q -c 1 -w 10 -I "10.230.$t.1" "10.220.$t.2" >/dev/null
        for f in $(seq 1 "$flows"); do
            port=$((5200 + 10 * t + f))
            ip netns exec lab-dst iperf3 -s -1 -B "10.220.$t.2" -p "$port" >/dev/null 2>&1 &
            for _ in $(seq 50); do ip netns exec lab-dst ss -ltn | grep ":$port " >/dev/null && break; sleep 0.1; done
        done
    done
    local stat0 gw1 gw2 t0 pids=()
    stat0=$(cat /proc/stat)
    gw1=$(ns_cpu lab-gw1)
    gw2=$(ns_cpu lab-gw2)
    t0=$(date +%s.%N)
    for t in $(seq 1 "$tunnels"); do
        for f in $(seq 1 "$flows"); do
            ip netns exec lab-src iperf3 -c "10.220.$t.2" -B "10.230.$t.1" -p $((5200 + 10 * t + f)) \
                -t "$SECS" -J >"$LOGDIR/flow-$t-$f.json" 2>/dev/null &
            pids+=($!)
        done
    done
    wait "${pids[@]}" || true
    local elapsed
    gw1=$(($(ns_cpu lab-gw1) - gw1))
    gw2=$(($(ns_cpu lab-gw2) - gw2))
    # The CPU time is over the whole window, which is longer than SECS when many flows
    # start one after another: divide by the window, not by SECS.
    elapsed=$(python3 -c "import sys; print(float(sys.argv[2]) - float(sys.argv[1]))" "$t0" "$(date +%s.%N)")
    python3 "$ROOT/lab/gw_point.py" "$impl" "$kind" "$n" "$elapsed" "$gw1,$gw2" "$(getconf CLK_TCK)" \
        "$LOGDIR" "$stat0" >>"$OUT/results.jsonl"
    rm -f "$LOGDIR"/flow-*.json
    tail -1 "$OUT/results.jsonl" | python3 -c 'import json, sys
r = json.load(sys.stdin)
print("  %-14s %-8s %2d: %.2f Gbit/s, gateways %.2f cores (%.2f + %.2f)" % (r["impl"], r["kind"],
      r["clients"], r["report"]["up_gbit"], r["report"]["server_cores"], *r["report"]["gateway_cores"]))'
    gw_teardown
}

case $SCENARIO in
    many-tunnels)
        trap 'gw_teardown; teardown' EXIT
        IMPLS=(${LAB_IMPLS:-ordo-pool ordo-inline wireguard-go boringtun})
        if ((SHORT)); then TUNNELS=(1 2); FLOWS=(1 2); SECS=2; else TUNNELS=(1 2 4 8 16); FLOWS=(1 2 4 8); SECS=8; fi
        for impl in "${IMPLS[@]}"; do
            for t in "${TUNNELS[@]}"; do gw_point "$impl" tunnels "$t" "$t" 1; done
            for f in "${FLOWS[@]}"; do gw_point "$impl" flows "$f" 1 "$f"; done
        done
        ;;
    many-clients)
        IMPLS=(${LAB_IMPLS:-ordo-pool ordo-inline ordo-threaded ordo-auto wireguard-go boringtun})
        if ((SHORT)); then COUNTS=(10 40); SECS=2; TOTAL=8000; else COUNTS=(10 100 1000); SECS=10; TOTAL=60000; fi
        # LAB_COUNTS / LAB_TOTAL (packets/s offered at the top count) change the grid.
        [[ -n ${LAB_COUNTS:-} ]] && read -ra COUNTS <<<"$LAB_COUNTS"
        TOTAL=${LAB_TOTAL:-$TOTAL}
        # A fixed per-client rate, so that the machine saturates near the top count (the
        # papers' 25 Mbps per client); upload and download measured one after the other.
        RATE=$((TOTAL / COUNTS[-1]))
        # Round-trip probes beside the upload (latency under load): a few per client and
        # second, small, so they add little to the offered load.
        PROBES=${LAB_PROBES:-5}
        for impl in "${IMPLS[@]}"; do
            for n in "${COUNTS[@]}"; do
                lab_server "$impl" "$n"
                point "$impl" "$n" up --rate "$RATE" --duration "$SECS" --direction up --probe-rate "$PROBES"
                point "$impl" "$n" down --rate "$RATE" --duration "$SECS" --direction down
                point "$impl" "$n" rr --rr --rate 50 --duration "$SECS" --size 100
                teardown
            done
        done
        ;;
    inversion)
        IMPLS=(${LAB_IMPLS:-ordo-pool ordo-threaded ordo-fifo})
        if ((SHORT)); then N=40; SECS=2; RATE=150; else N=1000; SECS=10; RATE=60; fi
        for impl in "${IMPLS[@]}"; do
            lab_server "$impl" "$N"
            point "$impl" "$N" up --rate "$RATE" --duration "$SECS" --direction up
            teardown
        done
        ;;
    soak)
        # Short (make test): 100 clients for 140 s, so each rekeys once (REKEY_AFTER_TIME).
        if ((SHORT)); then N=100; SECS=140; RATE=20; ROAM_EVERY=20; else N=1000; SECS=${LAB_SOAK_SECONDS:-1800}; RATE=10; ROAM_EVERY=60; fi
        lab_server ordo "$N"
        soak_sampler "$SERVER_PID" "$OUT/samples.tsv" &
        SAMPLER=$!
        soak_churn "$SERVER_PID" "$OUT/churn.log" &
        CHURN=$!
        point ordo "$N" soak --direction both --rate "$RATE" --probe-rate 2 --roam-share 0.1 \
            --roam-every "$ROAM_EVERY" --duration "$SECS"
        kill "$SAMPLER" "$CHURN" 2>/dev/null || true
        wait "$SAMPLER" "$CHURN" 2>/dev/null || true
        python3 -c 'import json, sys; json.dump(json.load(open(sys.argv[1]))["per_client"], open(sys.argv[2], "w"))' \
            "$LOGDIR/report.json" "$OUT/clients.json"
        teardown
        ;;
    *)
        echo "unknown scenario $SCENARIO (many-clients, inversion, many-tunnels, soak)" >&2
        exit 2
        ;;
esac
"$ORDO" lab report "$OUT" --scenario "$SCENARIO"
echo "lab: $OUT/report.md"
if grep "NOT met" "$OUT/report.md" >&2; then
    exit 1
fi
