#!/usr/bin/env bash
# The load generator end to end, short: N clients (`ordo loadgen run`) in one namespace
# against a server in another (Ordo, wireguard-go, boringtun), configured from
# `ordo loadgen setup` with `wg setconf`, the sink behind it. Checks that every client
# completed a real handshake, that the traffic of each kind arrived, and that the figures
# hang together; then that clients rekey on their own timers (130 s; LOADGEN_QUICK=1 skips
# it). Run as root after `cargo build --release`:
#
#   tests/loadgen.sh [IMPL...]        (default: ordo wireguard-go boringtun)
set -uo pipefail
source "$(dirname "$0")/interop/lib.sh"
IMPLS=("${@:-ordo wireguard-go boringtun}")
read -ra IMPLS <<<"${IMPLS[*]}"
CLIENTS=${LOADGEN_CLIENTS:-24}
trap teardown EXIT
PASSED=0
FAILED=0

# server IMPL: the server under test in B, configured for $CLIENTS clients.
server() {
    make_hosts
    start_impl "$1" "$NS_B" "$IF_B"
    "$ORDO" loadgen setup --clients "$CLIENTS" --listen-port "$PORT_B" >"$LOGDIR/server.conf"
    ip netns exec "$NS_B" wg setconf "$IF_B" "$LOGDIR/server.conf"
    ip -n "$NS_B" addr add 10.200.0.1/16 dev "$IF_B"
    ip -n "$NS_B" link set "$IF_B" mtu 1420 up
}

# loadgen ARGS...: a run from A; prints the JSON report.
loadgen() {
    ip netns exec "$NS_A" "$ORDO" loadgen run --clients "$CLIENTS" --server "${SERVER:-$OUT_B:$PORT_B}" \
        --sink-netns "$NS_B" --json --handshake-timeout 20 "$@"
}

# check NAME PYTHON-ASSERTIONS: the report (in r) must satisfy them.
check() {
    local name=$1 cond=$2 report=$LOGDIR/report.json
    shift 2
    if loadgen "$@" >"$report" 2>"$LOGDIR/loadgen.err" && python3 -c "
import json, sys
r = json.load(open(sys.argv[1]))
print('    ' + ', '.join(f'{k}={r[k]}' for k in ('clients_up', 'up_gbit', 'down_gbit', 'up_loss', 'down_loss', 'fairness', 'loadgen_cores')))
$cond
" "$report"; then
        PASSED=$((PASSED + 1))
        printf 'ok    %s\n' "$name"
    else
        FAILED=$((FAILED + 1))
        printf 'FAIL  %s   (logs: %s)\n' "$name" "$LOGDIR"
        cat "$LOGDIR/loadgen.err" >&2
    fi
}

for impl in "${IMPLS[@]}"; do
    server "$impl"
    # Upload at 200 packets/s per client: every client's packets reach the sink. Beside it,
    # round-trip probes (latency under load), which are neither upload sends nor receives.
    check "upload[$impl]" "
assert r['clients_up'] == $CLIENTS, 'every client has a session'
assert all(c['up_mbit'] > 0 for c in r['per_client']), 'every client delivered'
assert r['up_loss'] < 0.02, r['up_loss']
assert r['one_way_up']['count'] > 0 and r['one_way_up']['p50_us'] > 0
assert r['fairness'] > 0.9
assert r['probe_rate_per_client'] == 20
assert r['round_trip']['count'] > $CLIENTS and r['round_trip']['p99_us'] >= r['round_trip']['p50_us'] > 0
assert all(c['rr_done'] > 0 for c in r['per_client']), 'every client was probed'
" --rate 200 --duration 2 --direction up --probe-rate 20
    # Download: the sink sends each client what its hello asked for, through the server.
    check "download[$impl]" "
assert all(c['down_mbit'] > 0 for c in r['per_client']), 'every client received'
assert r['down_loss'] < 0.05, r['down_loss']
assert r['one_way_down']['count'] > 0
" --rate 200 --duration 2 --direction down
    # Round trips: each client keeps one request outstanding.
    check "round_trips[$impl]" "
assert r['round_trip']['count'] > 100 and r['round_trip']['p99_us'] >= r['round_trip']['p50_us'] > 0
assert all(c['rr_done'] > 0 for c in r['per_client'])
" --rr --rate 100 --duration 2 --size 100
    # The clients' outer traffic over IPv6, from two source addresses.
    ip -n "$NS_A" addr add fd77::10/64 dev veth-a nodad
    ip -n "$NS_A" addr add fd77::11/64 dev veth-a nodad
    SERVER="[$OUT6_B]:$PORT_B" check "upload_ipv6_outer[$impl]" "
assert r['clients_up'] == $CLIENTS, 'every client has a session'
assert all(c['up_mbit'] > 0 for c in r['per_client']), 'every client delivered'
assert r['up_loss'] < 0.02, r['up_loss']
" --rate 200 --duration 2 --direction up --bind fd77::10,fd77::11
    teardown
done
# Real timers: 8 clients for 130 s rekey once each (REKEY_AFTER_TIME is 120 s) with no loss;
# the server (Ordo) counts every handshake it completed. LOADGEN_QUICK=1 skips it.
if [[ -z ${LOADGEN_QUICK:-} ]]; then
    CLIENTS=8
    server ordo
    failed_before=$FAILED
    check "rekey[ordo]" "
assert r['clients_up'] == 8 and r['up_loss'] < 0.01, r['up_loss']
" --rate 20 --duration 130
    if ((FAILED == failed_before)) && ! ip netns exec "$NS_B" "$ORDO" show "$IF_B" --json | python3 -c '
import json, sys
n = json.load(sys.stdin)[0]["counters"]["handshakes_completed"]
print("    handshakes completed by the server:", n)
assert n >= 16, "each client handshook at least twice"
'; then
        PASSED=$((PASSED - 1))
        FAILED=$((FAILED + 1))
        echo "FAIL  rekey[ordo]: fewer than two handshakes per client"
    fi
    teardown
fi
echo "loadgen: $PASSED passed, $FAILED failed"
((FAILED == 0))
