#!/usr/bin/env bash
# A program through Ordo's own TCP/IP stack (`ordo run -- iperf3`, Inner = stack) against the
# same program through Ordo's TUN path, in one run. Host B runs Ordo
# with TUN and the iperf3 server, with two peers: A's TUN interface (10.99.0.1) and A's
# `ordo run` stack (10.99.0.3), so that both paths exist at once and the runs interleave:
# stack, tun, stack, tun... one TCP flow each way.
#
# Each row: Gbit/s (the receiver's count) and CPU per Gbit/s, in cores: "A's processes" is
# the daemon or `ordo run`, and iperf3; "machine" is the whole machine's busy time
# from /proc/stat (both hosts, both stacks, softirq included: on the TUN path part of A's
# work is the kernel's and is charged to no process).
#
#   scripts/bench-stack.sh [DURATION=5] [RUNS=3] [KIND=stream]
#
# KIND: stream (one iperf3 TCP flow each way, the default); rr (one connection, a byte each
# way per transaction, as netperf's TCP_RR: transactions a second); connect (connections
# opened and closed a second, one at a time); fairness (iperf3 -P 100: 100 flows at once B
# to A, their total and Jain's fairness index over the flows' bytes); loss (as stream, with
# LOSS_PERMILLE of the tunnel's datagrams dropped both ways by an nftables rule in B: how
# each TCP recovers). The request/response client and server are python3's, the same
# through both paths. A to B (the stack sends), stream and loss also run the TUN path with
# the kernel's TCP on CUBIC (tun-cubic), the stack's algorithm, beside the kernel's default
# (tun). B to A, B's kernel sends on both paths, with its namespace's default algorithm:
# CC_B=ALGORITHM sets that (cubic, say, where the host's default is BBR), for how the
# stack receives from a sender of that kind.
#
# PERF_DIR=DIR (with CPUS_A; needs perf) records `perf record -g` of host A's CPUs during each
# stream, loss, rr or connect run, to DIR/PATH[-R].data (rr, connect: DIR/PATH-KIND.data;
# the last run of each is kept): where A's CPU goes on each path (`perf report -i FILE
# --no-children --sort dso,sym`). The CPU columns then include perf's own sampling.
# PERF_CALL_GRAPH=dwarf records the callers of functions without frame pointers too (the C
# library's memcpy), at a much higher cost.
#
# CPUS_A=0 CPUS_B=1 (taskset lists) confine each host's processes (daemons, `ordo run`,
# clients, servers) to those CPUs: two hosts of their own instead of two sharing the
# machine's CPUs, where each run's peer lands on a queue whose CPU the other host's may be
# busy on, and the placement takes a few seconds to part them.
set -euo pipefail
source "$(dirname "$0")/../tests/interop/lib.sh"
DURATION=${1:-5}
RUNS=${2:-3}
KIND=${3:-stream}
LOSS_PERMILLE=${LOSS_PERMILLE:-10}
IN_STACK=10.99.0.3
WORK=$(mktemp -d /tmp/ordo-bench-stack.XXXXXX)
PIN_A=()
PIN_B=()
[[ -n ${CPUS_A:-} ]] && PIN_A=(taskset -c "$CPUS_A")
[[ -n ${CPUS_B:-} ]] && PIN_B=(taskset -c "$CPUS_B")
trap 'teardown; rm -rf "$WORK"' EXIT

# busy total: the machine's busy and total CPU ticks so far.
machine_ticks() { awk '/^cpu /{t = 0; for (i = 2; i <= NF; i++) t += $i; print t - $5 - $6, t; exit}' /proc/stat; }

setup() {
    tunnel ordo ordo
    KEY_S=$(genkey)
    PUB_S=$(pubkey "$KEY_S")
    ip netns exec "$NS_B" wg set "$IF_B" peer "$PUB_S" allowed-ips "$IN_STACK/32"
    CONF="$WORK/stack.conf"
    cat >"$CONF" <<EOF
[Interface]
PrivateKey = $KEY_S
Address = $IN_STACK/24

[Peer]
PublicKey = $PUB_B
Endpoint = $OUT_B:$PORT_B
AllowedIPs = $IN_B/32
EOF
    chmod 600 "$CONF"
    # Two iperf3 servers: only one is ever told a congestion control (tun-cubic's -C), because an
    # iperf3 server keeps the last one it was told for the tests after.
    ip netns exec "$NS_B" "${PIN_B[@]}" iperf3 -s -B "$IN_B" -p 5201 >/dev/null 2>&1 &
    ip netns exec "$NS_B" "${PIN_B[@]}" iperf3 -s -B "$IN_B" -p 5202 >/dev/null 2>&1 &
    # An echo server for rr and connect: a thread per connection, each byte back.
    ip netns exec "$NS_B" "${PIN_B[@]}" python3 -c "
import socket, socketserver
class Echo(socketserver.BaseRequestHandler):
    def handle(self):
        self.request.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        while (b := self.request.recv(64)):
            self.request.sendall(b)
socketserver.ThreadingTCPServer.allow_reuse_address = True
socketserver.ThreadingTCPServer.daemon_threads = True
# socketserver's backlog of 5 overflows at a few thousand connections a second: SYNs dropped,
# a second's retransmission each.
socketserver.ThreadingTCPServer.request_queue_size = 4096
socketserver.ThreadingTCPServer(('$IN_B', 7007), Echo).serve_forever()
" >/dev/null 2>&1 &
    for _ in $(seq 50); do
        ip netns exec "$NS_B" ss -ltn | grep ':5201 ' >/dev/null &&
            ip netns exec "$NS_B" ss -ltn | grep ':5202 ' >/dev/null &&
            ip netns exec "$NS_B" ss -ltn | grep ':7007 ' >/dev/null && break
        sleep 0.1
    done
    if [[ $KIND == loss ]]; then
        # Random drops of the tunnel's datagrams into and out of B (this kernel has no
        # netem): the data of one direction and the acknowledgements of the other. A UDP GSO
        # batch crosses veth as one packet, which the rule would drop whole; with at most one
        # segment per packet on the veth the kernel cuts batches before it, and each datagram
        # is dropped on its own, as on a real link.
        ip -n "$NS_A" link set veth-a gso_max_segs 1
        ip -n "$NS_B" link set veth-b gso_max_segs 1
        ip netns exec "$NS_B" nft -f - <<EOF
table inet ordo_bench_loss {
    chain in { type filter hook input priority 0; udp dport $PORT_B numgen random mod 1000 < $LOSS_PERMILLE drop; }
    chain out { type filter hook output priority 0; udp sport $PORT_B numgen random mod 1000 < $LOSS_PERMILLE drop; }
}
EOF
    fi
}

# The python client of rr and connect: prints "count seconds".
CLIENT='
import socket, struct, sys, time
kind, host, seconds = sys.argv[1], sys.argv[2], float(sys.argv[3])
n, end = 0, time.monotonic() + seconds
start = time.monotonic()
if kind == "rr":
    s = socket.create_connection((host, 7007))
    s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    start = time.monotonic()
    while time.monotonic() < end:
        s.sendall(b"x")
        if s.recv(1) != b"x":
            sys.exit("the echo server answered wrong")
        n += 1
else:
    # Closed with a reset (linger 0): the kernel keeps no TIME_WAIT socket, whose thousands
    # would exhaust the client ports within a run and measure that instead.
    linger = struct.pack("ii", 1, 0)
    while time.monotonic() < end:
        c = socket.create_connection((host, 7007))
        c.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, linger)
        c.close()
        n += 1
print(n, time.monotonic() - start)
'

# run_python PATH KIND: "per_second a_cores machine_cores" of the rr or connect client.
run_python() {
    local path=$1 kind=$2 cmd d0 d1 m0 m1
    cmd=(python3 -c "$CLIENT" "$kind" "$IN_B" "$DURATION")
    [[ $path == stack ]] && cmd=("$ORDO" run -c "$CONF" -- "${cmd[@]}")
    d0=$(daemon_ticks)
    read -r m0 _ < <(machine_ticks)
    local perf=
    if [[ -n ${PERF_DIR:-} ]]; then
        perf record -q --call-graph "${PERF_CALL_GRAPH:-fp}" -C "${CPUS_A:?PERF_DIR needs CPUS_A}" \
            -o "$PERF_DIR/$path-$kind.data" -- sleep "$DURATION" >/dev/null 2>&1 &
        perf=$!
    fi
    ip netns exec "$NS_A" "${PIN_A[@]}" bash -c '"${@:2}" >"$1"; times >"$1.times"' _ "$OUT" "${cmd[@]}"
    [[ -n $perf ]] && wait "$perf"
    read -r m1 _ < <(machine_ticks)
    d1=$(daemon_ticks)
    python3 - "$OUT" "$d0" "$d1" "$m0" "$m1" "$(getconf CLK_TCK)" <<'EOF'
import re, sys
out, d0, d1, m0, m1, tick = sys.argv[1:]
tick = int(tick)
count, secs = open(out).read().split()
secs = float(secs)
children = open(out + ".times").read().split("\n")[1]
cpu = sum(float(m) * 60 + float(s) for m, s in re.findall(r"(\d+)m([\d.]+)s", children))
a = cpu + (int(d1) - int(d0)) / tick
print(f"{int(count) / secs:.1f} {a / secs:.3f} {(int(m1) - int(m0)) / tick / secs:.3f}")
EOF
}

# run_fairness PATH: 100 iperf3 flows B to A at once; "gbits jain slowest_share flows".
run_fairness() {
    local path=$1 cmd
    cmd=(iperf3 -c "$IN_B" -p 5201 -t "$DURATION" -P 100 -R -J)
    [[ $path == stack ]] && cmd=("$ORDO" run -c "$CONF" -- "${cmd[@]}")
    ip netns exec "$NS_A" "${PIN_A[@]}" "${cmd[@]}" >"$OUT"
    python3 - "$OUT" "$DURATION" <<'EOF'
import json, sys
r = json.load(open(sys.argv[1]))
flows = [s["receiver"]["bytes"] for s in r["end"]["streams"]]
total = sum(flows)
jain = total * total / (len(flows) * sum(x * x for x in flows)) if total else 0
slowest = min(flows) * len(flows) / total if total else 0
print(f"{total * 8 / float(sys.argv[2]) / 1e9:.3f} {jain:.3f} {slowest:.3f} {len(flows)}")
EOF
}

# run PATH DIR: one iperf3 flow; prints "gbits a_cores machine_cores" (cores: CPU seconds
# per second of the flow). A's processes: what the shell that ran the command reports for
# its children (`ordo run` and iperf3, or iperf3 alone), plus the TUN daemon's own time.
run() {
    local path=$1 dir=$2 cmd out d0 d1 m0 m1 t0 t1
    cmd=(iperf3 -c "$IN_B" -p 5201 -t "$DURATION" -J $dir)
    # -C sets the client's algorithm before it connects. (With -R it would switch the
    # server's after, and a socket that began on BBR keeps BBR's pacing: neither algorithm.)
    [[ $path == tun-cubic ]] && cmd=(iperf3 -c "$IN_B" -p 5202 -t "$DURATION" -J $dir -C cubic)
    [[ $path == stack ]] && cmd=("$ORDO" run -c "$CONF" -- "${cmd[@]}")
    d0=$(daemon_ticks)
    read -r m0 t0 < <(machine_ticks)
    local perf=
    if [[ -n ${PERF_DIR:-} ]]; then
        perf record -q --call-graph "${PERF_CALL_GRAPH:-fp}" -C "${CPUS_A:?PERF_DIR needs CPUS_A}" -o "$PERF_DIR/$path$dir.data" \
            -- sleep "$DURATION" >/dev/null 2>&1 &
        perf=$!
    fi
    ip netns exec "$NS_A" "${PIN_A[@]}" bash -c '"${@:2}" >"$1"; times >"$1.times"' _ "$OUT" "${cmd[@]}"
    [[ -n $perf ]] && wait "$perf"
    read -r m1 t1 < <(machine_ticks)
    d1=$(daemon_ticks)
    python3 - "$OUT" "$DURATION" "$d0" "$d1" "$m0" "$m1" "$(getconf CLK_TCK)" <<'EOF'
import json, re, sys
out, d, d0, d1, m0, m1, tick = sys.argv[1:]
d, tick = float(d), int(tick)
gbits = json.load(open(out))["end"]["sum_received"]["bytes"] * 8 / d / 1e9
# `times`: the shell's own user and system time, then its children's.
children = open(out + ".times").read().split("\n")[1]
secs = sum(float(m) * 60 + float(s) for m, s in re.findall(r"(\d+)m([\d.]+)s", children))
a = secs + (int(d1) - int(d0)) / tick
print(f"{gbits:.3f} {a / d:.3f} {(int(m1) - int(m0)) / tick / d:.3f}")
EOF
}

# The TUN daemon's CPU ticks so far (user + system), 0 for none.
daemon_ticks() {
    local pid
    pid=$(pgrep -f -- "--foreground .*$IF_A\$" | sed -n 1p)
    [[ -n $pid ]] && awk '{print $14 + $15}' "/proc/$pid/stat" || echo 0
}

case $KIND in
stream | loss | rr | connect | fairness) ;;
*)
    echo "bench-stack: KIND is stream, loss, rr, connect or fairness" >&2
    exit 2
    ;;
esac
setup
if [[ -n ${CC_B:-} ]]; then
    # A namespace may choose only among the host's allowed algorithms: CC_B is allowed for the
    # moment of the choice, then the host's list is put back.
    allowed=$(sysctl -n net.ipv4.tcp_allowed_congestion_control)
    sysctl -q net.ipv4.tcp_allowed_congestion_control="$allowed $CC_B"
    status=0
    ip netns exec "$NS_B" sysctl -q net.ipv4.tcp_congestion_control="$CC_B" || status=$?
    sysctl -q net.ipv4.tcp_allowed_congestion_control="$allowed"
    ((status == 0)) || exit "$status"
fi
OUT="$WORK/iperf.json"
if [[ $KIND == rr || $KIND == connect ]]; then
    unit=$([[ $KIND == rr ]] && echo "transactions/s" || echo "connections/s")
    echo "| path | $unit (median of $RUNS) | A's processes, cores per 1,000 | machine, cores per 1,000 | runs |"
    echo "|---|---|---|---|---|"
    declare -A ROWS
    for r in $(seq "$RUNS"); do
        for path in stack tun; do
            ROWS[$path]+="$(run_python "$path" "$KIND");"
        done
    done
    for path in stack tun; do
        python3 - "$path" "${ROWS[$path]}" <<'EOF'
import statistics, sys
path, runs = sys.argv[1], [r.split() for r in sys.argv[2].split(";") if r]
rate = [float(r[0]) for r in runs]
a = [float(r[1]) / float(r[0]) * 1000 for r in runs if float(r[0]) > 0]
m = [float(r[2]) / float(r[0]) * 1000 for r in runs if float(r[0]) > 0]
print(f"| {path} | {statistics.median(rate):,.0f} | {statistics.median(a):.3f} | {statistics.median(m):.3f} | "
      + ", ".join(f"{x:,.0f}" for x in rate) + " |")
EOF
    done
    exit 0
fi
if [[ $KIND == fairness ]]; then
    echo "| path | Gbit/s, 100 flows B to A (median of $RUNS) | Jain's index | slowest flow / fair share | runs (Gbit/s, index) |"
    echo "|---|---|---|---|---|"
    declare -A ROWS
    for r in $(seq "$RUNS"); do
        for path in stack tun; do
            ROWS[$path]+="$(run_fairness "$path");"
        done
    done
    for path in stack tun; do
        python3 - "$path" "${ROWS[$path]}" <<'EOF'
import statistics, sys
path, runs = sys.argv[1], [r.split() for r in sys.argv[2].split(";") if r]
assert all(int(r[3]) == 100 for r in runs), "not 100 flows"
g, j, low = ([float(r[i]) for r in runs] for i in range(3))
print(f"| {path} | {statistics.median(g):.2f} | {statistics.median(j):.3f} | {statistics.median(low):.2f} | "
      + ", ".join(f"{a:.2f} ({b:.3f})" for a, b in zip(g, j)) + " |")
EOF
    done
    exit 0
fi
if [[ $KIND == loss ]]; then
    echo "With $LOSS_PERMILLE per mille of the tunnel's datagrams dropped each way:"
fi
# The stack's TCP runs CUBIC; the kernel's, on the TUN path, its default (tun) and CUBIC
# (tun-cubic): under random loss a loss-based algorithm and one that is not (BBR) differ more
# than any two implementations of one.
echo "The kernel's default congestion control: $(sysctl -n net.ipv4.tcp_congestion_control) (B to A: $(ip netns exec "$NS_B" sysctl -n net.ipv4.tcp_congestion_control)); the stack's: cubic."
# paths DIR: the paths run that way.
paths() { [[ -z $1 ]] && echo "stack tun tun-cubic" || echo "stack tun"; }
echo "| path | direction | Gbit/s (median of $RUNS) | A's processes, cores per Gbit/s | machine, cores per Gbit/s | runs (Gbit/s) |"
echo "|---|---|---|---|---|---|"
declare -A RESULTS
for dir in "" -R; do
    for r in $(seq "$RUNS"); do
        for path in $(paths "$dir"); do
            line=$(run "$path" "$dir")
            RESULTS["$path$dir"]+="$line;"
        done
    done
done
for dir in "" -R; do
    for path in $(paths "$dir"); do
        python3 - "$path" "${dir:-(A to B)}" "${RESULTS[$path$dir]}" <<'EOF'
import statistics, sys
path, direction, runs = sys.argv[1], sys.argv[2], [r.split() for r in sys.argv[3].split(";") if r]
g = [float(r[0]) for r in runs]
a = [float(r[1]) / float(r[0]) for r in runs if float(r[0]) > 0]
m = [float(r[2]) / float(r[0]) for r in runs if float(r[0]) > 0]
direction = "A to B" if direction == "(A to B)" else "B to A"
print(f"| {path} | {direction} | {statistics.median(g):.2f} | {statistics.median(a):.3f} | "
      f"{statistics.median(m):.3f} | " + ", ".join(f"{x:.2f}" for x in g) + " |")
EOF
    done
done
