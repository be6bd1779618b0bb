#!/usr/bin/env bash
# A handshake flood against a server while an established peer runs one TCP flow through it
# Two hosts over veth: B is the server (configured for the established peer A
# and for NEW load-generator clients), A runs the established peer's tunnel end, iperf3's
# client, the flood (`ordo loadgen flood`, from SOURCES addresses of A's own) and, once the
# flood is under way, NEW clients that must complete their handshakes through it. Phases,
# each with a fresh flow of DURATION seconds:
#   none        no flood
#   junk        initiation-sized datagrams with a wrong mac1, at RATE per second: the
#               generator's own cost, and the baseline the others are held to
#   initiation  initiations with a valid mac1 for the server's key, at RATE
#   cookies     the same, answering every cookie reply (mac2 proves each source's address)
#   random      datagrams of every type and none, of every length check's lengths, some
#               past the MTU (FLOOD_PHASES=random,replay: not in the default set)
#   replay      copies of 256 data messages of a real session (the generator's own, as a
#               load-generator client), which the server has seen: its peer must have
#               received no byte more than the originals'
# Per phase: the flow (Gbit/s, and its share of the junk phase's), the server's RSS (sampled
# every second: first, largest, last), the new clients that came up and how long they took,
# what the flood sent, and for Ordo the cookie replies it sent and its drops by reason.
#
#   scripts/flood.sh [DURATION=20] [RATE=100000] [SOURCES=32] [ROUNDS=1]
# With ROUNDS > 1 the phases alternate ROUNDS times on one tunnel, and the table shows each
# phase's medians (flow, server CPU; its flow against the junk phase's of the same round),
# its worst new-client figures and its largest RSS.
# FLOOD_IMPLS: ordo (its default model), ordo-MODEL, wireguard-go, boringtun (default: ordo);
# FLOOD_PHASES narrows the phases.
# FLOOD_PERF=1 records a machine-wide profile of each phase's flow into the log directory.
# ORDO is the daemon under test; GENERATOR (default: ORDO) the ordo that floods and plays the
# new clients, so an older daemon can be measured with today's generator.
set -euo pipefail
source "$(dirname "$0")/../tests/interop/lib.sh"
# Names of our own, so a flood never meets an interop run's namespaces.
NS_A=ordo-flood-a
NS_B=ordo-flood-b
IF_A=wg-flood-a
IF_B=wg-flood-b
DURATION=${1:-20}
RATE=${2:-100000}
SOURCES=${3:-32}
ROUNDS=${4:-1}
# New clients need a cookie round (REKEY_TIMEOUT, 5 s) and then the handshake limit's.
((DURATION >= 12)) || { log "DURATION: at least 12 s, for the new clients' cookie rounds"; exit 2; }
((SOURCES >= 1 && SOURCES <= 200)) || { log "SOURCES: 1 to 200 (addresses 10.77.0.10 on)"; exit 2; }
IMPLS=(${FLOOD_IMPLS:-ordo})
GENERATOR=${GENERATOR:-$ORDO}
PHASES=(${FLOOD_PHASES:-none junk initiation cookies})
NEW=16
RESULTS=$LOGDIR/flood.jsonl
trap teardown EXIT
: >"$RESULTS"

# server_pid: the daemon serving B (the only process in B before a phase starts).
server_pid() { ip netns pids "$NS_B" | sed -n 1p; }

# setup IMPL: the server in B for A and NEW clients; A's tunnel end; flood sources on A.
setup() {
    local impl=$1
    # ordo-MODEL: Ordo in that execution model at both ends.
    [[ $impl == ordo-* ]] && { export ORDO_MODEL=${impl#ordo-}; impl=ordo; }
    make_hosts
    start_impl "$impl" "$NS_B" "$IF_B"
    start_impl "$impl" "$NS_A" "$IF_A"
    SERVER_PID=$(server_pid)
    REPLAY_PUB=
    # One client more than the new ones: the session the replay phase replays.
    "$GENERATOR" loadgen setup --clients "$((NEW + 1))" --listen-port "$PORT_B" >"$LOGDIR/server.conf"
    local server_pub
    server_pub=$(awk '/^PrivateKey/ {print $3}' "$LOGDIR/server.conf" | "$ORDO" pubkey)
    KEY_A=$(genkey)
    PUB_A=$(pubkey "$KEY_A")
    ip netns exec "$NS_B" wg setconf "$IF_B" "$LOGDIR/server.conf"
    REPLAY_PUB=$(awk '/^PublicKey/ {k = $3} END {print k}' "$LOGDIR/server.conf")
    ip netns exec "$NS_B" wg set "$IF_B" peer "$PUB_A" allowed-ips "$IN_A/32"
    ip -n "$NS_B" addr add "$IN_B/24" dev "$IF_B"
    ip -n "$NS_B" addr add 10.200.0.1/16 dev "$IF_B"
    ip -n "$NS_B" link set "$IF_B" mtu 1420 up
    configure "$NS_A" "$IF_A" "$KEY_A" "$PORT_A" "$server_pub" "$OUT_B:$PORT_B" "$IN_B/32"
    ip -n "$NS_A" addr add "$IN_A/24" dev "$IF_A"
    ip -n "$NS_A" link set "$IF_A" mtu 1420 up
    FLOOD_BIND=()
    for i in $(seq 10 $((9 + SOURCES))); do
        ip -n "$NS_A" addr add "10.77.0.$i/24" dev veth-a
        FLOOD_BIND+=("10.77.0.$i")
    done
    ip netns exec "$NS_A" ping -q -c 2 -i 0.2 -w 10 "$IN_B" >/dev/null
}

# counters: Ordo's counters on B as JSON ({} for other implementations).
counters() {
    ip netns exec "$NS_B" "$ORDO" show "$IF_B" --json 2>/dev/null |
        python3 -c 'import json,sys; print(json.dumps(json.load(sys.stdin)[0]["counters"]))' 2>/dev/null || echo '{}'
}

# replay_rx: bytes the server accepted from the client the replay phase plays.
replay_rx() {
    ip netns exec "$NS_B" wg show "$IF_B" dump | awk -v k="$REPLAY_PUB" '$1 == k {print $6; f = 1} END {if (!f) print 0}'
}

# phase IMPL PHASE: one flow under one kind of flood; appends a JSON line to $RESULTS.
phase() {
    local impl=$1 phase=$2 flood_pid="" rss_pid flood_args=()
    case "$phase" in
        none) ;;
        junk) flood_args=(--kind junk) ;;
        initiation) flood_args=(--kind initiation) ;;
        cookies) flood_args=(--kind initiation --answer-cookies) ;;
        random) flood_args=(--kind random) ;;
        replay) flood_args=(--kind replay --as-client "$NEW") ;;
    esac
    local before after bind cpu0 cpu1 replay_rx0 replay_rx
    before=$(counters)
    # The replayed client's peer on the server: bytes it accepted from it (wg show dump).
    replay_rx0=$(replay_rx)
    cpu0=$(awk '{print $14 + $15}' "/proc/$SERVER_PID/stat")
    local t0
    t0=$(date +%s%N)
    bind=$(IFS=,; echo "${FLOOD_BIND[*]}")
    # RSS each second, for the whole phase.
    (while kill -0 "$SERVER_PID" 2>/dev/null; do
        awk '/^VmRSS/ {print $2}' "/proc/$SERVER_PID/status"
        sleep 1
    done) >"$LOGDIR/rss.$phase" &
    rss_pid=$!
    ip netns exec "$NS_B" iperf3 -s -1 >/dev/null 2>&1 &
    local srv=$!
    for _ in $(seq 50); do ip netns exec "$NS_B" ss -ltn | grep ':5201 ' >/dev/null && break; sleep 0.1; done
    if ((${#flood_args[@]})); then
        ip netns exec "$NS_A" "$GENERATOR" loadgen flood --server "$OUT_B:$PORT_B" --rate "$RATE" \
            --duration "$((DURATION + 3))" --bind "$bind" --json "${flood_args[@]}" >"$LOGDIR/flood.$phase" &
        flood_pid=$!
        sleep 1
    fi
    ip netns exec "$NS_A" iperf3 -c "$IN_B" -t "$DURATION" -J >"$LOGDIR/iperf.$phase" &
    local client=$!
    # FLOOD_PERF=1: the whole machine profiled over the flow (perf report -i the file).
    [[ -n ${FLOOD_PERF:-} ]] && perf record -q -a -g -o "$LOGDIR/perf.$phase" -- sleep "$((DURATION - 2))" >/dev/null 2>&1 &
    # New clients once the flood (and the flow) are under way.
    sleep 2
    ip netns exec "$NS_A" "$GENERATOR" loadgen run --clients "$NEW" --server "$OUT_B:$PORT_B" \
        --sink-netns "$NS_B" --json --duration 1 --rate 10 --handshake-timeout "$((DURATION - 4))" \
        >"$LOGDIR/new.$phase" 2>"$LOGDIR/new.$phase.err" || true
    wait "$client"
    [[ -n $flood_pid ]] && wait "$flood_pid"
    wait "$srv" 2>/dev/null || true
    kill "$rss_pid" 2>/dev/null || true
    wait "$rss_pid" 2>/dev/null || true
    after=$(counters)
    replay_rx=$(replay_rx)
    cpu1=$(awk '{print $14 + $15}' "/proc/$SERVER_PID/stat")
    python3 - "$impl" "$phase" "$LOGDIR" "$before" "$after" "$((cpu1 - cpu0))" "$(($(date +%s%N) - t0))" "$((replay_rx - replay_rx0))" >>"$RESULTS" <<'EOF'
import json, os, sys
impl, phase, d, before, after = sys.argv[1:6]
server_cores = int(sys.argv[6]) / os.sysconf("SC_CLK_TCK") / (int(sys.argv[7]) / 1e9)
e = json.load(open(f"{d}/iperf.{phase}"))["end"]
rss = [int(l) / 1024 for l in open(f"{d}/rss.{phase}") if l.strip()]
try:
    new = json.load(open(f"{d}/new.{phase}"))
    new = {"up": new["clients_up"], "of": new["clients"], "seconds": round(new["handshake_seconds"], 2)}
except Exception:
    new = {"up": 0, "of": None, "seconds": None}
try:
    flood = json.load(open(f"{d}/flood.{phase}"))
except Exception:
    flood = {}
b, a = json.loads(before), json.loads(after)
delta = {k: a[k] - b.get(k, 0) for k in a if isinstance(a[k], int) and a[k] != b.get(k, 0)}
print(json.dumps({
    "impl": impl, "phase": phase,
    "gbit": e["sum_received"]["bits_per_second"] / 1e9,
    "server_cores": round(server_cores, 2),
    "rss_mb": [round(rss[0], 1), round(max(rss), 1), round(rss[-1], 1)] if rss else None,
    "new": new,
    "flood_per_second": round(flood.get("sent_per_second", 0)),
    "flood_cores": round(flood.get("cores", 0), 2),
    "cookie_replies_received": flood.get("cookie_replies", 0),
    "cookies_opened": flood.get("cookies_opened", 0),
    "counters": delta,
    # Bytes the server accepted from the replayed client beyond its initiation (148) and the
    # captured messages sent once: replays that got through (0 unless a replay phase).
    "replayed_accepted_bytes": int(sys.argv[8]) - 148 - flood["captured_bytes"] if flood.get("captured") else 0,
}))
EOF
}

for impl in "${IMPLS[@]}"; do
    log "== $impl"
    setup "$impl"
    for round in $(seq "$ROUNDS"); do
        for p in "${PHASES[@]}"; do
            log "   $p ($round/$ROUNDS)"
            phase "$impl" "$p"
        done
    done
    teardown
done

python3 - "$RESULTS" "$DURATION" "$RATE" "$SOURCES" "$ROUNDS" <<'EOF'
import json, statistics, sys
rows = [json.loads(l) for l in open(sys.argv[1])]
duration, rate, sources, rounds = sys.argv[2:6]
print(f"flood: {rate} datagrams/s from {sources} sources, {duration} s flows, {rounds} round(s); medians")
print(f"{'impl':14} {'phase':11} {'Gbit/s':>7} {'/junk':>6} {'server cores':>12} {'RSS MB max':>10} {'new up':>7} {'hs s':>5} {'flood/s':>8} {'cookies/s':>9}  drops (last round)")
def med(xs):
    return statistics.median(xs)
groups = {}
for r in rows:
    groups.setdefault((r["impl"], r["phase"]), []).append(r)
for (impl, phase), rs in groups.items():
    junk = groups.get((impl, "junk"))
    gbit = med([r["gbit"] for r in rs])
    # Each round's flow against the same round's junk phase, then the median: rounds drift
    # (host steal), phases within one round much less.
    share = f"{med([r['gbit'] / j['gbit'] for r, j in zip(rs, junk)]):.2f}" if junk else "-"
    rss = max((r["rss_mb"][1] for r in rs if r["rss_mb"]), default=0)
    up = min(r["new"]["up"] for r in rs)
    hs = max((r["new"]["seconds"] or 0) for r in rs)
    c = rs[-1]["counters"]
    cookies = f"{med([r['counters'].get('cookie_replies_sent', 0) for r in rs]) / (float(duration) + 3):.0f}" if c else "-"
    drops = ", ".join(f"{k[len('drop_'):] if k.startswith('drop_') else k}={v}" for k, v in sorted(c.items()) if 'drop' in k)
    if phase == "replay":
        drops += f"; replayed bytes accepted: {max(r['replayed_accepted_bytes'] for r in rs)}"
    print(f"{impl:14} {phase:11} {gbit:7.2f} {share:>6} {med([r['server_cores'] for r in rs]):>12.2f} {rss:>10} {up:>4}/{rs[0]['new']['of']:<2} {hs:>5} {med([r['flood_per_second'] for r in rs]):>8.0f} {cookies:>9}  {drops}")
for impl in dict.fromkeys(r["impl"] for r in rows):
    rss = [r["rss_mb"] for r in rows if r["impl"] == impl and r["rss_mb"]]
    print(f"{impl}: server RSS over the run: first {rss[0][0]} MB, largest {max(x[1] for x in rss)} MB, last {rss[-1][2]} MB")
EOF
echo "details: $RESULTS"
