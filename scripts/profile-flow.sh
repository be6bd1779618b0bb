#!/usr/bin/env bash
# Where one TCP flow's CPU goes, per implementation, in one run: the same tunnel as
# `make bench` (two namespaces over veth, the same implementation at both ends, one iperf3
# flow A->B), sampled machine-wide by `perf record -a` for the middle of the flow. Each
# sample of a daemon is put in one bin: the AEAD; the kernel's TUN read or write, UDP send
# or receive (each with what the kernel does inside that call, e.g. the receiving TCP stack
# inside a TUN write); other kernel time (interrupts, timers, poll, scheduling); the rest of
# user space. Figures are cores per Gbit/s of the flow, so implementations compare directly;
# AEAD + TUN + outer (UDP, or AF_XDP for Ordo with Outer = xdp) is what any implementation
# over a TUN device and that outer path pays
# (see BENCHMARKS.md); the ceiling is the rate at which the cores would carry the flow doing
# only that and iperf3's work, never idle, so "share of ceiling" compares implementations
# against what this machine allows in the same run, whatever its speed that day.
#
#   scripts/profile-flow.sh [IMPL...]      default: ordo-inline wireguard-go
#   IMPL: ordo-MODEL (pool, inline, threaded, auto), ordo-MODEL+xdp (Outer = xdp at both
#   ends), ordo-MODEL+nogso (kernel UDP without GSO and GRO: a datagram per packet, as
#   AF_XDP sends them), wireguard-go, boringtun
# PROFILE_BIN_DETAIL=BIN (e.g. "xsk send") also lists the innermost functions of that bin.
# Needs perf (Debian: apt-get install --no-install-recommends linux-perf).
set -euo pipefail
source "$(dirname "$0")/../tests/interop/lib.sh"
IMPLS=("$@")
((${#IMPLS[@]})) || IMPLS=(ordo-inline wireguard-go)
SECS=14   # the flow
SAMPLE=8  # the sampled middle of it
command -v perf >/dev/null || { echo "profile-flow: perf not found (apt-get install --no-install-recommends linux-perf)" >&2; exit 1; }
work=$(mktemp -d)
trap 'teardown; rm -rf "$work"' EXIT

rows=()
n=0
for name in "${IMPLS[@]}"; do
    n=$((n + 1))
    f="$work/$n"  # the same implementation may be listed twice
    impl=$name model="" outer=udp offloads=on
    [[ $impl == *+xdp ]] && { impl=${impl%+xdp}; outer=xdp; }
    [[ $impl == *+nogso ]] && { impl=${impl%+nogso}; offloads=off; }
    [[ $impl == ordo-* ]] && { model=${impl#ordo-}; impl=ordo; }
    ORDO_MODEL=$model ORDO_OUTER=$outer ORDO_UDP_OFFLOADS=$offloads tunnel "$impl" "$impl" >/dev/null
    ip netns exec "$NS_A" ping -q -c 2 -i 0.2 -w 10 "$IN_B" >/dev/null
    daemons=$( (ip netns pids "$NS_A"; ip netns pids "$NS_B") | tr '\n' ,)
    ip netns exec "$NS_B" iperf3 -s -1 >/dev/null 2>&1 &
    for _ in $(seq 50); do ip netns exec "$NS_B" ss -ltn | grep ':5201 ' >/dev/null && break; sleep 0.1; done
    ip netns exec "$NS_A" iperf3 -c "$IN_B" -t "$SECS" -J >"$f.json" &
    flow=$!
    sleep $(((SECS - SAMPLE) / 2))
    perf record -a -g -F 999 -o "$f.data" -- sleep "$SAMPLE" >/dev/null 2>&1
    wait "$flow"
    perf script -i "$f.data" -F pid,comm,ip,sym,dso >"$f.txt" 2>/dev/null
    rows+=("$name" "$f.json" "$f.txt" "$daemons")
    teardown
done
python3 "$(dirname "$0")/profile-classify.py" "$(nproc)" "${rows[@]}"
