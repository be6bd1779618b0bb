#!/usr/bin/env bash
# A program through Ordo's own TCP/IP stack (`ordo run -- iperf3`, Inner = stack) against the
# same program through Ordo's TUN path, in one run (issue 20's benchmark). Host B runs Ordo
# with TUN and the iperf3 server, with two peers: A's TUN interface (10.99.0.1) and A's
# `ordo run` stack (10.99.0.3), so that both paths exist at once and the runs interleave:
# stack, tun, stack, tun... one TCP flow each way.
#
# Each row: Gbit/s (the receiver's count) and CPU per Gbit/s, in cores: "A's processes" is
# the daemon or `ordo run`, and iperf3; "machine" is the whole machine's busy time
# from /proc/stat (both hosts, both stacks, softirq included: on the TUN path part of A's
# work is the kernel's and is charged to no process).
#
#   scripts/bench-stack.sh [DURATION=5] [RUNS=3]
set -euo pipefail
source "$(dirname "$0")/../tests/interop/lib.sh"
DURATION=${1:-5}
RUNS=${2:-3}
IN_STACK=10.99.0.3
WORK=$(mktemp -d /tmp/ordo-bench-stack.XXXXXX)
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
    ip netns exec "$NS_B" iperf3 -s -B "$IN_B" -p 5201 >/dev/null 2>&1 &
    for _ in $(seq 50); do
        ip netns exec "$NS_B" ss -ltn | grep ':5201 ' >/dev/null && break
        sleep 0.1
    done
}

# run PATH DIR: one iperf3 flow; prints "gbits a_cores machine_cores" (cores: CPU seconds
# per second of the flow). A's processes: what the shell that ran the command reports for
# its children (`ordo run` and iperf3, or iperf3 alone), plus the TUN daemon's own time.
run() {
    local path=$1 dir=$2 cmd out d0 d1 m0 m1 t0 t1
    cmd=(iperf3 -c "$IN_B" -p 5201 -t "$DURATION" -J $dir)
    [[ $path == stack ]] && cmd=("$ORDO" run -c "$CONF" -- "${cmd[@]}")
    d0=$(daemon_ticks)
    read -r m0 t0 < <(machine_ticks)
    ip netns exec "$NS_A" bash -c '"${@:2}" >"$1"; times >"$1.times"' _ "$OUT" "${cmd[@]}"
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

setup
OUT="$WORK/iperf.json"
echo "| path | direction | Gbit/s (median of $RUNS) | A's processes, cores per Gbit/s | machine, cores per Gbit/s | runs (Gbit/s) |"
echo "|---|---|---|---|---|---|"
declare -A RESULTS
for dir in "" -R; do
    for r in $(seq "$RUNS"); do
        for path in stack tun; do
            line=$(run "$path" "$dir")
            RESULTS["$path$dir"]+="$line;"
        done
    done
done
for dir in "" -R; do
    for path in stack tun; do
        python3 - "$path" "${dir:-(A to B)}" "${RESULTS[$path$dir]}" <<'EOF'
import statistics, sys
path, direction, runs = sys.argv[1], sys.argv[2], [r.split() for r in sys.argv[3].split(";") if r]
g = [float(r[0]) for r in runs]
a = [float(r[1]) / float(r[0]) for r in runs if float(r[0]) > 0]
m = [float(r[2]) / float(r[0]) for r in runs if float(r[0]) > 0]
direction = "A to B" if direction == "(A to B)" else "B to A"
print(f"| {path} | {direction} | {statistics.median(g):.2f} | {statistics.median(a):.2f} | "
      f"{statistics.median(m):.2f} | " + ", ".join(f"{x:.2f}" for x in g) + " |")
EOF
    done
done
