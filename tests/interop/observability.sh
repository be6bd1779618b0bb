# shellcheck shell=bash
# The daemon against a hostile local user, and what it says about itself: metrics, logs, the
# detectors, `ordo top`, `ordo doctor`.
# Sourced by interop.sh, whose helpers (run_test, fail, ping_ok) and lib.sh's it uses.

# A local user cannot take the daemon down. The daemon starts with a soft limit of
# 1024 descriptors, as a service gets by default, and raises it to its hard limit. While a
# flow runs through the tunnel, another unprivileged user keeps 3,000 connections to the
# metrics endpoint open, opening new ones as the endpoint sheds them, and tries the UAPI
# socket (out of its reach), and root holds 2,000 idle connections to the UAPI socket: the
# flow completes, `wg show` and fresh scrapes keep answering, the endpoint holds no more than
# its limit of connections (64), and the daemon is alive, with no panic in its log.
t_local_flood() {
    ulimit -Sn 1024
    ORDO_METRICS=9586 tunnel ordo wireguard-go
    ping_ok "$NS_A" "$IN_B" || fail "ping"
    local pid limits
    pid=$(pgrep -o -f -- "--foreground .*$IF_A\$")
    limits=$(awk '/^Max open files/ {print $4, $5}' "/proc/$pid/limits")
    [[ ${limits% *} == "${limits#* }" && ${limits% *} != 1024 ]] || fail "the soft descriptor limit stayed low: $limits"
    ip netns exec "$NS_B" iperf3 -s -1 -B "$IN_B" >/dev/null 2>&1 &
    sleep 0.5
    ip netns exec "$NS_A" iperf3 -c "$IN_B" -t 8 -J >"$LOGDIR/flood-iperf3.json" 2>&1 &
    local flow=$!
    ip netns exec "$NS_A" setpriv --reuid=daemon --regid=daemon --clear-groups --inh-caps=-all --bounding-set=-all -- \
        /usr/bin/python3 - "/var/run/wireguard/$IF_A.sock" >"$LOGDIR/flood-metrics.txt" 2>&1 <<'PY' &
import resource, socket, sys, time
soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
held, opened, failed, end = [], 0, 0, time.time() + 7
while time.time() < end:
    alive = []
    for s in held:
        try:
            if s.recv(1, socket.MSG_DONTWAIT) == b'':
                s.close()
                continue
        except BlockingIOError:
            pass
        except OSError:
            s.close()
            continue
        alive.append(s)
    held = alive
    # A connect the full backlog leaves unanswered is given up at once and tried again.
    misses = 0
    while len(held) < 3000 and time.time() < end and misses < 20:
        try:
            held.append(socket.create_connection(('127.0.0.1', 9586), timeout=0.2))
            opened += 1
        except OSError:
            failed += 1
            misses += 1
    time.sleep(0.05)
try:
    socket.socket(socket.AF_UNIX).connect(sys.argv[1])
    uapi = 'reached'
except OSError as e:
    uapi = type(e).__name__
print(opened, failed, uapi)
PY
    local metrics_flood=$!
    ip netns exec "$NS_A" python3 - "/var/run/wireguard/$IF_A.sock" >"$LOGDIR/flood-uapi.txt" 2>&1 <<'PY' &
import resource, socket, sys, time
soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
held = []
for _ in range(2000):
    s = socket.socket(socket.AF_UNIX)
    s.connect(sys.argv[1])
    held.append(s)
time.sleep(7)
print(len(held))
PY
    local uapi_flood=$!
    sleep 2
    local i scrape held most=0
    for i in 1 2 3; do
        wg show "$IF_A" dump >/dev/null || fail "wg show under the flood ($i)"
        scrape=$(ip netns exec "$NS_A" curl -fsS --max-time 5 http://127.0.0.1:9586/metrics) \
            || fail "no scrape under the flood ($i)"
        grep "^wireguard_peer_receive_bytes_total{" <<<"$scrape" >/dev/null || fail "a scrape without the peers ($i)"
        # The daemon's own: those the kernel completed and holds in the listen backlog are
        # bounded by the backlog and cost the daemon nothing.
        held=$(ip netns exec "$NS_A" ss -Htnp state established '( sport = :9586 )' | grep -c "pid=$pid," || true)
        ((held <= 64)) || fail "the endpoint holds $held connections"
        ((held > most)) && most=$held
        sleep 1
    done
    ((most > 0)) || fail "the flood's connections were not seen in the daemon"
    wait "$metrics_flood" || fail "the metrics flood: $(cat "$LOGDIR/flood-metrics.txt")"
    wait "$uapi_flood" || fail "the UAPI flood: $(cat "$LOGDIR/flood-uapi.txt")"
    wait "$flow" || fail "the flow under the flood: $(tail -n 5 "$LOGDIR/flood-iperf3.json")"
    local opened failed uapi
    read -r opened failed uapi <"$LOGDIR/flood-metrics.txt"
    log "    metrics flood: $opened connections opened, $failed failed, the daemon held at most $most; the UAPI socket: $uapi; UAPI flood: $(cat "$LOGDIR/flood-uapi.txt")"
    ((opened >= 1000)) || fail "the flood opened only $opened connections"
    [[ $uapi == PermissionError ]] || fail "another user's UAPI connect: $uapi"
    local bytes
    bytes=$(python3 -c "import json,sys; print(int(json.load(open(sys.argv[1]))['end']['sum_received']['bytes']))" \
        "$LOGDIR/flood-iperf3.json") || fail "iperf3's report"
    ((bytes > 0)) || fail "the flow carried nothing"
    kill -0 "$pid" || fail "the daemon is gone"
    ! grep -i "panick" "$LOGDIR/$IF_A.log" >/dev/null || fail "a panic: $(grep -i panick "$LOGDIR/$IF_A.log")"
    wg show "$IF_A" dump >/dev/null || fail "wg show after the flood"
}

# The metrics endpoint (MetricsAddress): its figures match wg show's, promtool finds them
# clean, and a real Prometheus server scrapes them.
t_metrics() {
    ORDO_METRICS=9586 tunnel ordo wireguard-go
    ping_ok "$NS_A" "$IN_B" || fail "ping"
    ip netns exec "$NS_A" ping -c 20 -i 0.01 -s 1200 -q "$IN_B" >/dev/null || fail "pings"
    grep "metrics at http://127.0.0.1:9586/metrics" "$LOGDIR/$IF_A.log" >/dev/null \
        || fail "the log does not say where the metrics are: $(cat "$LOGDIR/$IF_A.log")"
    [[ $(ip netns exec "$NS_A" ss -Htln 'sport = :9586' | awk '{print $4}') == 127.0.0.1:9586 ]] \
        || fail "not on the loopback address alone: $(ip netns exec "$NS_A" ss -tln)"
    local scrape="$LOGDIR/metrics.txt" lint before after
    # wg show's figures before and after the scrape: equal when nothing moved in between.
    for _ in 1 2 3; do
        before=$(wg show "$IF_A" dump | sed -n 2p | cut -f1,6,7)
        ip netns exec "$NS_A" curl -fsS http://127.0.0.1:9586/metrics >"$scrape" || fail "no answer at /metrics"
        after=$(wg show "$IF_A" dump | sed -n 2p | cut -f1,6,7)
        [[ $before == "$after" ]] && break
    done
    [[ $before == "$after" ]] || fail "traffic would not stop"
    lint=$(promtool check metrics <"$scrape" 2>&1) || fail "promtool: $lint"
    [[ -z $lint ]] || fail "promtool: $lint"
    local key rx tx
    read -r key rx tx <<<"$before"
    ((rx > 20 * 1200)) || fail "wg show counted only $rx bytes received"
    metric() { awk -v m="$1{" -v k="public_key=\"$key\"" 'index($0, m) == 1 && index($0, k) {print $NF}' "$scrape"; }
    [[ $(metric wireguard_peer_receive_bytes_total) == "$rx" ]] \
        || fail "received $(metric wireguard_peer_receive_bytes_total), wg show $rx"
    [[ $(metric wireguard_peer_transmit_bytes_total) == "$tx" ]] \
        || fail "sent $(metric wireguard_peer_transmit_bytes_total), wg show $tx"
    local handshake
    handshake=$(metric wireguard_peer_last_handshake_seconds)
    [[ ${handshake%.*} == "$(dump_field "$IF_A" handshake)" ]] \
        || fail "handshake $handshake, wg show $(dump_field "$IF_A" handshake)"
    # Ordo's own: drops by reason, stages per thread, the OS's CPU beside Ordo's, placement.
    for m in 'ordo_drops_total{' 'ordo_stage_packets_total{' 'ordo_thread_os_cpu_seconds_total{' \
        'ordo_peer_placement_info{' 'ordo_info{'; do
        grep -F "$m" "$scrape" >/dev/null || fail "no $m in the scrape"
    done
    local decrypted
    decrypted=$(awk '/^ordo_stage_packets_total\{/ && /stage="decrypt"/ {n += $NF} END {print n + 0}' "$scrape")
    ((decrypted >= 21)) || fail "the decrypt stage counted $decrypted packets, not the 21 pings' answers"
    # A Prometheus server scraping every 100 ms reads the same value.
    printf '%s\n' 'global: {scrape_interval: 100ms, scrape_timeout: 100ms}' 'scrape_configs:' \
        '  - job_name: ordo' "    static_configs: [{targets: ['127.0.0.1:9586']}]" >"$LOGDIR/prometheus.yml"
    ip netns exec "$NS_A" prometheus --config.file="$LOGDIR/prometheus.yml" \
        --storage.tsdb.path="$LOGDIR/prometheus" --web.listen-address=127.0.0.1:9090 \
        >"$LOGDIR/prometheus.log" 2>&1 &
    prom_query() {
        ip netns exec "$NS_A" curl -fsS "http://127.0.0.1:9090/api/v1/query?query=$1" 2>/dev/null \
            | python3 -c 'import json,sys; r=json.load(sys.stdin)["data"]["result"]; print(r[0]["value"][1] if r else "")' \
                2>/dev/null || true
    }
    local got=""
    for _ in $(seq 100); do
        got=$(prom_query wireguard_peer_receive_bytes_total)
        [[ -n $got ]] && break
        sleep 0.2
    done
    [[ $got == "$rx" ]] || fail "Prometheus read '$got', wg show $rx: $(tail -5 "$LOGDIR/prometheus.log")"
    [[ $(prom_query up) == 1 ]] || fail "Prometheus sees the target down"
    # The Grafana dashboard: its structure, and every panel's query on this server, a few
    # scrapes in (rates need two), the panels this setup feeds with data.
    sleep 1
    ip netns exec "$NS_A" python3 "$ROOT/grafana/check.py" "$ROOT/grafana/ordo-dashboard.json" http://127.0.0.1:9090 \
        "Traffic per peer" "Time since the last handshake" "Cores by stage (last second)" \
        "Warnings (1: the detector's condition holds)" "Threads: Ordo's clock beside the OS's charge" \
        "CPUs: the OS's time by kind and Ordo's threads there" "Where each peer runs" >"$LOGDIR/dashboard.txt" 2>&1 \
        || fail "$(cat "$LOGDIR/dashboard.txt")"
    # And it loads as Grafana's schema reads it (grafana/schema-check), which must also
    # refuse a panel with a field Grafana does not know.
    local check="$LOGDIR/schema-check"
    (cd "$ROOT/grafana/schema-check" && go build -o "$check" .) >"$LOGDIR/schema-check.txt" 2>&1 \
        || fail "schema-check does not build: $(tail -5 "$LOGDIR/schema-check.txt")"
    "$check" "$ROOT/grafana/ordo-dashboard.json" >>"$LOGDIR/schema-check.txt" 2>&1 \
        || fail "$(tail -5 "$LOGDIR/schema-check.txt")"
    python3 -c 'import json, sys; d = json.load(open(sys.argv[1])); d["panels"][0]["lineWidth"] = 1; json.dump(d, open(sys.argv[2], "w"))' \
        "$ROOT/grafana/ordo-dashboard.json" "$LOGDIR/broken-dashboard.json"
    if "$check" "$LOGDIR/broken-dashboard.json" >>"$LOGDIR/schema-check.txt" 2>&1; then
        fail "schema-check took a panel with a field Grafana does not know"
    fi
    grep "unexpected field 'lineWidth'" "$LOGDIR/schema-check.txt" >/dev/null \
        || fail "schema-check refused the broken dashboard for another reason: $(tail -3 "$LOGDIR/schema-check.txt")"
}

# The daemon's log: LOG_LEVEL as wireguard-go reads it; per-packet events at verbose, a few
# lines a second of each kind however hard the flood; never a key.
t_logs() {
    local log="$LOGDIR/$IF_A.log" key
    : >"$log"
    LOG_LEVEL=verbose flood_server
    flood --kind random --rate 20000 --duration 3 >"$LOGDIR/flood.json" || fail "the flood failed"
    local sent lines kinds
    sent=$(python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))["sent"])' "$LOGDIR/flood.json")
    lines=$(grep -c "dropped a datagram from" "$log" || true)
    kinds=$(grep -o "dropped a datagram from [^ ]*: [a-z_0-9]*" "$log" | awk '{print $NF}' | sort -u | wc -l)
    ((sent >= 10000)) || fail "the flood sent only $sent datagrams"
    ((kinds >= 3)) || fail "drops of $kinds kinds logged: $(tail -5 "$log")"
    # Four kinds for 3 s (and the second around them): 5 lines a kind a second at most.
    ((lines <= kinds * 5 * 5)) || fail "$lines lines for $sent dropped datagrams"
    grep -E "[0-9]+ more [a-z_0-9]+ events not logged \(at most 5 a second\)" "$log" >/dev/null \
        || fail "the lines held back are not counted"
    # Each line: a UTC timestamp, the level, the interface.
    local bad
    bad=$(grep -cvE "^[0-9]{4}-[0-9]{2}-[0-9]{2}T[0-9:.]+Z (ERROR|WARN |INFO |DEBUG) ordo\[$IF_A\]: " "$log" || true)
    ((bad == 0)) || fail "$bad lines without timestamp, level and interface: $(grep -m3 -vE " ordo\[$IF_A\]: " "$log")"
    grep -E "INFO  ordo\[$IF_A\]: up, listening on UDP port" "$log" >/dev/null || fail "no start line"
    key=$(awk '/^PrivateKey/ {print $3; exit}' "$LOGDIR/server.conf")
    [[ -n $key ]] || fail "no private key in the server's configuration"
    grep -F "$key" "$log" >/dev/null && fail "the private key is in the log"
    grep -F "$(echo "$key" | base64 -d | od -An -tx1 | tr -d ' \n')" "$log" >/dev/null && fail "the private key (hex) is in the log"
    teardown
    # Handshakes at verbose, named by the peer's public key.
    : >"$log"
    LOG_LEVEL=verbose tunnel ordo wireguard-go
    ping_ok "$NS_A" "$IN_B" || fail "ping"
    grep "peer $PUB_B: handshake completed, new session" "$log" >/dev/null || fail "no handshake event: $(cat "$log")"
    grep -F "$KEY_A" "$log" >/dev/null && fail "the private key is in the log"
    teardown
    # The default level: no library's internal chatter (netlink-packet-route warns of every
    # link attribute newer than it knows, which the XDP path's link look-ups meet).
    : >"$log"
    ORDO_OUTER=xdp tunnel ordo wireguard-go
    ping_ok "$NS_A" "$IN_B" || fail "ping at the default level"
    grep -i "NLA attribute\|netlink" "$log" >/dev/null && fail "a library's chatter: $(grep -m2 -i "NLA attribute\|netlink" "$log")"
    teardown
    # error: what went wrong only; silent: nothing.
    : >"$log"
    LOG_LEVEL=error tunnel ordo wireguard-go
    ping_ok "$NS_A" "$IN_B" || fail "ping at LOG_LEVEL=error"
    grep -E "INFO|DEBUG" "$log" >/dev/null && fail "LOG_LEVEL=error logged $(grep -m2 -E "INFO|DEBUG" "$log")"
    teardown
    : >"$log"
    LOG_LEVEL=silent tunnel ordo wireguard-go
    ping_ok "$NS_A" "$IN_B" || fail "ping at LOG_LEVEL=silent"
    [[ ! -s $log ]] || fail "LOG_LEVEL=silent logged: $(head -3 "$log")"
}

# warnings IFNAME: the detectors' findings over the last second, one a line.
warnings() {
    "$ORDO" show "$1" --json | python3 -c 'import json,sys; print("\n".join([w["detector"] + ": " + w["text"] for w in json.load(sys.stdin)[0]["warnings"]]))'
}

# watch IFNAME SECONDS: every detector finding of each second for SECONDS seconds.
watch_warnings() {
    local i
    for i in $(seq "$2"); do
        sleep 1
        warnings "$1"
    done
}

# loadgen_up CPUS [RATE]: 4 clients uploading RATE (20,000) packets a second each for 6 s, on
# CPUS.
loadgen_up() {
    taskset -c "$1" ip netns exec "$NS_B" "$ORDO" loadgen run --clients "$FLOOD_CLIENTS" --server "$OUT_A:$PORT_A" \
        --bind "$FLOOD_SOURCES" --sink-netns "$NS_A" --duration 6 --rate "${2:-20000}" --json >"$LOGDIR/loadgen.json" 2>&1
}

# The detectors (crate::health): a black hole with everything on one CPU, execution order
# inversion with the threaded model's delivery at SCHED_FIFO, and neither on healthy runs of
# the same traffic.
t_detectors() {
    local seen
    # Four peers on a server kept to CPU 0, their clients there too: CPU 1 idles. They offer
    # more than one CPU carries: a load CPU 0 can keep up with leaves it under the detector's
    # threshold, and no black hole is reported, rightly.
    ORDO_CORES=0 ORDO_METRICS=9586 flood_server
    loadgen_up 0 60000 &
    # The warnings and the gauge, each second: the gauge is the last second's finding, so a
    # single scrape could fall in a second the detector judged otherwise.
    local i scrapes=""
    seen=""
    for i in 1 2 3 4 5; do
        sleep 1
        seen+=$(warnings "$IF_A")$'\n'
        scrapes+=$(ip netns exec "$NS_A" curl -fsS http://127.0.0.1:9586/metrics | grep '^ordo_warning_active')$'\n'
    done
    wait
    grep "^black_hole: CPU 0 is" <<<"$seen" >/dev/null || fail "no black hole seen: $seen"
    grep 'ordo_warning_active{detector="black_hole"} 1' <<<"$scrapes" >/dev/null \
        || fail "the metrics never said so: $scrapes"
    teardown
    # The same traffic with the server on both CPUs.
    flood_server
    loadgen_up 0-1 &
    seen=$(watch_warnings "$IF_A" 5)
    wait
    grep -E "^(black_hole|inversion)" <<<"$seen" && fail "warnings on a healthy run: $seen"
    teardown
    # Four TCP flows into B, whose delivery threads run at SCHED_FIFO above its workers.
    ORDO_MODEL=threaded ORDO_DELIVERY_FIFO=1 tunnel ordo ordo
    ip netns exec "$NS_B" iperf3 -s -1 >/dev/null 2>&1 &
    sleep 0.3
    ip netns exec "$NS_A" iperf3 -c "$IN_B" -t 6 -P 4 >/dev/null &
    seen=$(watch_warnings "$IF_B" 5)
    wait
    grep "^inversion: inbound delivery runs ahead of decrypt" <<<"$seen" >/dev/null \
        || fail "no inversion seen: $seen$(tail -3 "$LOGDIR/$IF_B.log")"
    teardown
    # The default model with the same flows.
    tunnel ordo ordo
    ip netns exec "$NS_B" iperf3 -s -1 >/dev/null 2>&1 &
    sleep 0.3
    ip netns exec "$NS_A" iperf3 -c "$IN_B" -t 6 -P 4 >/dev/null &
    seen=$(watch_warnings "$IF_B" 5)
    wait
    grep -E "^(black_hole|inversion)" <<<"$seen" && fail "warnings on a healthy run: $seen"
    true
}

# ordo top under tmux: the live view of B while a flow runs, and it leaves on `q`.
t_top() {
    "$ORDO" top nosuch0 >"$LOGDIR/top-nosuch.txt" 2>&1 && fail "ordo top of a missing interface succeeded"
    grep -i "nosuch0" "$LOGDIR/top-nosuch.txt" >/dev/null || fail "the error does not name the interface"
    tunnel ordo ordo
    ping_ok "$NS_A" "$IN_B" || fail "ping"
    ip netns exec "$NS_B" iperf3 -s -1 >/dev/null 2>&1 &
    sleep 0.3
    ip netns exec "$NS_A" iperf3 -c "$IN_B" -t 6 >/dev/null &
    local session="ordo-top-$$" screen
    tmux kill-session -t "$session" 2>/dev/null || true
    tmux new-session -d -s "$session" -x 110 -y 40 "$ORDO top $IF_B"
    sleep 4
    screen=$(tmux capture-pane -p -t "$session")
    echo "$screen" >"$LOGDIR/top.txt"
    grep "ordo top: $IF_B, model auto, outer path udp, 1 peer (q: quit)" <<<"$screen" >/dev/null \
        || fail "no title: $screen"
    grep -E "^│decrypt +0\.[0-9]{2} +[0-9]{4,}" <<<"$screen" >/dev/null || fail "no decrypt stage at work: $screen"
    # The key's start as it is (a base64 key may hold + and /), then the rate on its line.
    grep -F "│${PUB_A:0:12} " <<<"$screen" | grep -E "^│.{12} +[0-9.]+ (G|M)bit/s" >/dev/null \
        || fail "no rate for A: $screen"
    grep -E "^│(0|1) +[0-9]+%" <<<"$screen" >/dev/null || fail "no CPU rows: $screen"
    grep "Warnings" <<<"$screen" >/dev/null || fail "no warnings box: $screen"
    tmux send-keys -t "$session" q
    local gone=0
    for _ in $(seq 20); do
        tmux has-session -t "$session" 2>/dev/null || { gone=1; break; }
        sleep 0.1
    done
    ((gone)) || { tmux kill-session -t "$session"; fail "ordo top did not leave on q"; }
    wait
}

# doctor NS ARGS...: `ordo doctor` run in namespace NS for the interface of A, on veth-a.
doctor() {
    local ns=$1
    shift
    ip netns exec "$ns" "$ORDO" doctor "$IF_A" --outer veth-a "$@"
}

# doctor_names TEXT SEVERITY CHECK FIX: the doctor's report names CHECK at SEVERITY with FIX.
doctor_names() {
    grep -F "[$2] $3" <<<"$1" >/dev/null || fail "doctor does not name '$3' as $2: $1"
    grep "^  fix:  " <<<"$1" | grep -F "$4" >/dev/null || fail "no fix '$4' for '$3': $1"
}

# ordo doctor: nothing on a clean setup; each misconfiguration injected on A's veth named,
# with its fix, and gone once fixed.
t_doctor() {
    tunnel ordo wireguard-go
    ping_ok "$NS_A" "$IN_B" || fail "ping"
    # Clean: the offloads on, threaded NAPI (veth has NAPI once GRO is on).
    ip netns exec "$NS_A" ethtool -K veth-a gro on gso on tso on rx-udp-gro-forwarding on >/dev/null
    ip netns exec "$NS_A" sh -c 'echo 1 > /sys/class/net/veth-a/threaded'
    local report rc
    report=$(doctor "$NS_A" --json) || fail "doctor failed on a clean setup: $report"
    python3 -c '
import json, sys
f = json.load(sys.stdin)
bad = [x for x in f if x["severity"] in ("advice", "problem")]
for x in bad:
    print("    %s: %s: %s" % (x["severity"], x["check"], x["read"]), file=sys.stderr)
assert f and not bad
' <<<"$report" || fail "the clean setup has findings"
    # The queues' CPUs, which the interrupt and NUMA checks judge against: one per queue
    # thread, on a CPU of this machine.
    "$ORDO" show "$IF_A" --json | python3 -c '
import json, os, sys
q = json.load(sys.stdin)[0]["queues"]
assert q and [x["queue"] for x in q] == list(range(len(q))), q
assert all(x["cpu"] < os.cpu_count() for x in q), q
' || fail "ordo show --json has no queues"
    # GRO off: not flagged on a virtual link, where a sender's GSO batch crosses whole and
    # turning GRO on made no measured difference (docs/benchmarks-log.md, "GRO on a veth").
    ip netns exec "$NS_A" ethtool -K veth-a gro off
    report=$(doctor "$NS_A" --json) || fail "doctor flagged GRO off on a veth: $report"
    python3 -c '
import json, sys
f = [x for x in json.load(sys.stdin) if x["check"] == "generic-receive-offload of veth-a"]
assert len(f) == 1 and f[0]["severity"] == "ok" and "virtual link" in f[0]["read"], f
' <<<"$report" || fail "GRO off on a veth: $report"
    ip netns exec "$NS_A" ethtool -K veth-a gro on
    # GSO off: a problem, exit status 1.
    ip netns exec "$NS_A" ethtool -K veth-a gso off
    rc=0
    report=$(doctor "$NS_A") || rc=$?
    ((rc == 1)) || fail "doctor exited $rc with a problem found"
    doctor_names "$report" problem "generic-segmentation-offload of veth-a" "ethtool -K veth-a gso on"
    ip netns exec "$NS_A" ethtool -K veth-a gso on
    # RPS on the receive queue.
    ip netns exec "$NS_A" sh -c 'echo 3 > /sys/class/net/veth-a/queues/rx-0/rps_cpus'
    report=$(doctor "$NS_A") || fail "doctor failed: $report"
    doctor_names "$report" advice "receive steering (RPS) of veth-a" "echo 0 > \$q/rps_cpus"
    ip netns exec "$NS_A" sh -c 'echo 0 > /sys/class/net/veth-a/queues/rx-0/rps_cpus'
    # NAPI back in softirq.
    ip netns exec "$NS_A" sh -c 'echo 0 > /sys/class/net/veth-a/threaded'
    report=$(doctor "$NS_A") || fail "doctor failed: $report"
    doctor_names "$report" advice "threaded NAPI of veth-a" "echo 1 > /sys/class/net/veth-a/threaded"
    ip netns exec "$NS_A" sh -c 'echo 1 > /sys/class/net/veth-a/threaded'
    # An outer MTU too small for the tunnel's.
    ip -n "$NS_A" link set veth-a mtu 1440
    report=$(doctor "$NS_A") && fail "no problem found with the MTU"
    doctor_names "$report" problem "MTU of veth-a against the tunnel's" "ip link set $IF_A mtu 1360"
    ip -n "$NS_A" link set veth-a mtu 1500
    # Conntrack on: a stateful rule, then tunnel traffic.
    ip netns exec "$NS_A" nft -f - <<EOF
table inet ordo_test {
    chain input {
        type filter hook input priority 0;
        ct state established accept
    }
}
EOF
    ping_ok "$NS_A" "$IN_B" || fail "ping with conntrack"
    report=$(doctor "$NS_A") || fail "doctor failed: $report"
    doctor_names "$report" advice "connection tracking of the UDP port" "nft add table inet ordo_notrack"
    # Its fix, as given: the tunnel's datagrams are tracked no more.
    local fix
    fix=$(grep -A3 -F "[advice] connection tracking of the UDP port" <<<"$report" | sed -n 's/^  fix:  //p')
    ip netns exec "$NS_A" sh -c "$fix" || fail "the fix failed: $fix"
    # The flows tracked before the fix stay until they expire: flushed, then traffic again.
    ip netns exec "$NS_A" conntrack -F >/dev/null 2>&1
    ping_ok "$NS_A" "$IN_B" || fail "ping after the fix"
    ip netns exec "$NS_A" nft flush table inet ordo_test
    ip netns exec "$NS_A" nft delete table inet ordo_test
    report=$(doctor "$NS_A") || fail "doctor failed after the fixes: $report"
    grep -E "^\[(problem|advice)\]" <<<"$report" && fail "findings left after the fixes: $report"
    true
}
