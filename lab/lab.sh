#!/usr/bin/env bash
# The papers' experiments on one machine, every server implementation under the same load in
# one run, with `ordo loadgen` playing the clients. Writes results.jsonl, SVG figures and
# report.md (each figure beside the paper figure it reproduces) under lab/out/SCENARIO.
#
#   lab/lab.sh many-clients [--short]   papers/000 figures 1, 6-9: 10 ... 1,000 clients
#   lab/lab.sh inversion [--short]      execution order inversion made visible: Ordo's threaded
#                                       model with delivery at SCHED_FIFO, beside the normal ones
#
# --short: tens of clients, a few seconds a point (what `make test` runs). LAB_IMPLS narrows the
# implementations; LAB_OUT changes the output directory. Run as root after a release build.
set -euo pipefail
ROOT="$(cd "$(dirname "$0")/.." && pwd)"
source "$ROOT/tests/interop/lib.sh"
SCENARIO=${1:?usage: lab/lab.sh many-clients|inversion [--short]}
SHORT=0
[[ ${2:-} == --short ]] && SHORT=1
OUT=${LAB_OUT:-$ROOT/lab/out/$SCENARIO}
mkdir -p "$OUT"
: >"$OUT/results.jsonl"
trap teardown EXIT

# Client outer addresses: WireGuard rate-limits handshakes per source address, and the papers'
# clients came from many machines.
ADDRS=32

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
    SERVER_PID=$(ip netns pids "$NS_B" | head -1)
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
    # Ordo's own counters, per stage (the per-thread ones, one per peer in the threaded
    # model, are left out).
    if [[ $impl == ordo* ]]; then
        "$ORDO" show "$IF_B" --json | python3 -c 'import json,sys
c = json.load(sys.stdin)[0]["counters"]
print(json.dumps({k: v for k, v in c.items() if not k.startswith("thread_")}))' >"$counters"
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

case $SCENARIO in
    many-clients)
        IMPLS=(${LAB_IMPLS:-ordo-pool ordo-inline ordo-threaded ordo-auto wireguard-go boringtun})
        if ((SHORT)); then COUNTS=(10 40); SECS=2; TOTAL=8000; else COUNTS=(10 100 1000); SECS=10; TOTAL=60000; fi
        # A fixed per-client rate, so that the machine saturates near the top count (the
        # papers' 25 Mbps per client); upload and download measured one after the other.
        RATE=$((TOTAL / COUNTS[-1]))
        for impl in "${IMPLS[@]}"; do
            for n in "${COUNTS[@]}"; do
                lab_server "$impl" "$n"
                point "$impl" "$n" up --rate "$RATE" --duration "$SECS" --direction up
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
    *)
        echo "unknown scenario $SCENARIO (many-clients, inversion)" >&2
        exit 2
        ;;
esac
"$ORDO" lab report "$OUT" --scenario "$SCENARIO"
echo "lab: $OUT/report.md"
