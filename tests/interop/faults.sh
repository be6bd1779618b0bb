# shellcheck shell=bash
# Faults: signals and a deleted TUN device under load, the outer address removed, configuration
# churn, a peer gone and back, a memory limit.
# Sourced by interop.sh, whose helpers (run_test, fail, ping_ok) and lib.sh's it uses.

# gone_within PID SECONDS: true once the process has exited, false if it is still there.
gone_within() {
    local i
    for i in $(seq $(($2 * 10))); do
        kill -0 "$1" 2>/dev/null || return 0
        sleep 0.1
    done
    return 1
}

# stopped_cleanly IFNAME: the daemon's log names no panic and its UAPI socket is gone (the
# janitor removes it as the daemon's last descriptor closes: allow it a moment).
stopped_cleanly() {
    ! grep -i "panic" "$LOGDIR/$1.log" >/dev/null || fail "the log names a panic: $(cat "$LOGDIR/$1.log")"
    local i
    for i in $(seq 10); do
        [[ ! -e /var/run/wireguard/$1.sock ]] && return 0
        sleep 0.1
    done
    fail "the UAPI socket is still there"
}

# A TCP flow through the tunnel, from A to B, for SECONDS in the background; sets FLOW.
flow_in_background() {
    ip netns exec "$NS_B" iperf3 -s -1 >/dev/null 2>&1 &
    for _ in $(seq 50); do ip netns exec "$NS_B" ss -ltn | grep ':5201 ' >/dev/null && break; sleep 0.1; done
    ip netns exec "$NS_A" iperf3 -c "$IN_B" -t "$1" >/dev/null 2>&1 &
    FLOW=$!
    sleep 1
}

# SIGTERM while a flow runs: the daemon exits at once, cleanly, its socket removed.
t_sigterm_under_load() {
    tunnel ordo ordo
    ping_ok "$NS_A" "$IN_B" || fail "ping"
    local pid
    pid=$(ip netns pids "$NS_A" | sed -n 1p)
    flow_in_background 10
    kill -TERM "$pid"
    gone_within "$pid" 3 || fail "still running 3 s after SIGTERM"
    stopped_cleanly "$IF_A"
    kill "$FLOW" 2>/dev/null || true
}

# The TUN device deleted while a flow runs: the daemon stops, cleanly.
t_tun_deleted_under_load() {
    tunnel ordo ordo
    ping_ok "$NS_A" "$IN_B" || fail "ping"
    local pid
    pid=$(ip netns pids "$NS_A" | sed -n 1p)
    flow_in_background 10
    ip -n "$NS_A" link del "$IF_A"
    gone_within "$pid" 3 || fail "still running 3 s after its interface was deleted"
    stopped_cleanly "$IF_A"
    kill "$FLOW" 2>/dev/null || true
}

# The outer address removed under traffic, then added back: sends fail meanwhile (counted,
# no panic), and the tunnel carries traffic again once it is back.
t_outer_address_removed() {
    tunnel ordo ordo
    ping_ok "$NS_A" "$IN_B" || fail "ping"
    ip netns exec "$NS_A" ping -q -i 0.05 -w 4 "$IN_B" >/dev/null 2>&1 &
    local pinger=$!
    sleep 0.5
    ip -n "$NS_A" addr del "$OUT_A/24" dev veth-a
    sleep 1
    local failed
    failed=$(ordo_counter "$IF_A" drop_udp_send_error)
    ip -n "$NS_A" addr add "$OUT_A/24" dev veth-a
    wait $pinger || true
    ((failed > 0)) || fail "no send error counted while the address was gone"
    ping_ok "$NS_A" "$IN_B" 3 10 || fail "no traffic once the address is back"
    ping_ok "$NS_B" "$IN_A" 3 10 || fail "no traffic from B once the address is back"
    ! grep -i "panic" "$LOGDIR/$IF_A.log" >/dev/null || fail "a panic: $(cat "$LOGDIR/$IF_A.log")"
}

# `wg syncconf` adding 1,000 peers and removing them again while A pings B every 10 ms: no
# ping is lost (the peer that stays keeps its session), no panic.
t_syncconf_churn() {
    tunnel ordo ordo
    ping_ok "$NS_A" "$IN_B" || fail "ping"
    local base="$LOGDIR/base.conf" many="$LOGDIR/many.conf"
    printf '[Interface]\nPrivateKey = %s\nListenPort = %s\n\n[Peer]\nPublicKey = %s\nEndpoint = %s\nAllowedIPs = %s\n' \
        "$KEY_A" "$PORT_A" "$PUB_B" "$OUT_B:$PORT_B" "$IN_B/32, $IN6_B/128" >"$base"
    { cat "$base"; "$ORDO" loadgen setup --clients 1000 | sed '1,/^$/d'; } >"$many"
    ip netns exec "$NS_A" ping -q -i 0.01 -c 400 -w 15 "$IN_B" >"$LOGDIR/ping.txt" 2>&1 &
    local pinger=$!
    sleep 0.5
    ip netns exec "$NS_A" wg syncconf "$IF_A" "$many" || fail "syncconf to 1,001 peers"
    [[ $(ip netns exec "$NS_A" wg show "$IF_A" peers | wc -l) == 1001 ]] || fail "not 1,001 peers"
    ip netns exec "$NS_A" wg syncconf "$IF_A" "$base" || fail "syncconf back to one peer"
    ip netns exec "$NS_A" wg syncconf "$IF_A" "$many" || fail "syncconf to 1,001 peers again"
    ip netns exec "$NS_A" wg syncconf "$IF_A" "$base" || fail "syncconf back to one peer again"
    [[ $(ip netns exec "$NS_A" wg show "$IF_A" peers) == "$PUB_B" ]] || fail "the staying peer is not alone"
    wait $pinger || true
    grep " 0% packet loss" "$LOGDIR/ping.txt" >/dev/null || fail "pings lost: $(cat "$LOGDIR/ping.txt")"
    ! grep -i "panic" "$LOGDIR/$IF_A.log" >/dev/null || fail "a panic: $(cat "$LOGDIR/$IF_A.log")"
}

# The peer's daemon gone (every datagram to it answered by ICMP port unreachable) while A
# keeps sending, then back with the same key and port: A runs on, counts nothing as
# delivered meanwhile, and the tunnel carries traffic again within a handshake.
t_peer_gone_and_back() {
    tunnel ordo ordo
    ping_ok "$NS_A" "$IN_B" || fail "ping"
    local pid_a pid_b
    pid_a=$(pgrep -o -f -- "--foreground .*$IF_A\$")
    pid_b=$(pgrep -o -f -- "--foreground .*$IF_B\$")
    kill "$pid_b"
    gone_within "$pid_b" 3 || fail "B did not stop"
    ip netns exec "$NS_A" ping -q -c 20 -i 0.1 -W 1 "$IN_B" >/dev/null 2>&1 && fail "pings answered with B gone"
    kill -0 "$pid_a" || fail "A exited while B was gone"
    start_impl ordo "$NS_B" "$IF_B"
    configure "$NS_B" "$IF_B" "$KEY_B" "$PORT_B" "$PUB_A" "$OUT_A:$PORT_A" "$IN_A/32,$IN6_A/128"
    inner_addresses "$NS_B" "$IF_B" "$IN_B" "$IN6_B"
    ping_ok "$NS_A" "$IN_B" 3 15 || fail "no traffic once B is back"
    ! grep -i "panic" "$LOGDIR/$IF_A.log" >/dev/null || fail "a panic: $(cat "$LOGDIR/$IF_A.log")"
}

# mem_cgroup NAME LIMIT_BYTES: a memory cgroup (v2, or v1's memory controller) with a hard
# limit; prints its folder.
mem_cgroup() {
    local dir
    if [[ -f /sys/fs/cgroup/cgroup.controllers ]]; then
        grep -w memory /sys/fs/cgroup/cgroup.subtree_control >/dev/null || echo +memory >/sys/fs/cgroup/cgroup.subtree_control
        dir=/sys/fs/cgroup/$1
        mkdir -p "$dir"
        echo "$2" >"$dir/memory.max"
        echo 0 >"$dir/memory.swap.max" 2>/dev/null || true
    else
        dir=/sys/fs/cgroup/memory/$1
        mkdir -p "$dir"
        echo "$2" >"$dir/memory.limit_in_bytes"
    fi
    echo "$dir"
}

# mem_cgroup_figure DIR oom_kills|peak: what the kernel counted in the cgroup.
mem_cgroup_figure() {
    case $2 in
        oom_kills) { cat "$1/memory.events" "$1/memory.oom_control" 2>/dev/null || true; } | awk '$1 == "oom_kill" {print $2}' ;;
        peak) { cat "$1/memory.peak" "$1/memory.max_usage_in_bytes" 2>/dev/null || true; } | sed -n 1p ;;
    esac
}

# A memory limit on A's daemon (its resident size at rest plus 48 MiB) while a flood of TCP
# both ways, UDP bursts and junk datagrams goes at it: its queues and tables are bounded, so
# the kernel never kills it, and it carries traffic after.
t_memory_limit() {
    tunnel ordo ordo
    ping_ok "$NS_A" "$IN_B" || fail "ping"
    local pid rss_kb cg
    pid=$(pgrep -o -f -- "--foreground .*$IF_A\$")
    rss_kb=$(awk '/^VmRSS/ {print $2}' "/proc/$pid/status")
    cg=$(mem_cgroup "ordo-interop-$$" $(((rss_kb + 48 * 1024) * 1024)))
    echo "$pid" >"$cg/cgroup.procs"
    ip netns exec "$NS_B" iperf3 -s -1 >/dev/null 2>&1 &
    for _ in $(seq 50); do ip netns exec "$NS_B" ss -ltn | grep ':5201 ' >/dev/null && break; sleep 0.1; done
    ip netns exec "$NS_A" iperf3 -c "$IN_B" -t 6 -P 8 --bidir >/dev/null 2>&1 &
    local flow=$!
    ip netns exec "$NS_A" iperf3 -s -p 5202 -1 >/dev/null 2>&1 &
    for _ in $(seq 50); do ip netns exec "$NS_A" ss -ltn | grep ':5202 ' >/dev/null && break; sleep 0.1; done
    ip netns exec "$NS_B" iperf3 -c "$IN_A" -p 5202 -u -b 2G -l 1400 -t 5 >/dev/null 2>&1 &
    local udp=$!
    ip netns exec "$NS_B" "$ORDO" loadgen flood --server "$OUT_A:$PORT_A" --kind random --rate 20000 \
        --duration 5 >/dev/null 2>&1 || true
    wait "$flow" "$udp" || true
    local kills peak
    kills=$(mem_cgroup_figure "$cg" oom_kills)
    peak=$(mem_cgroup_figure "$cg" peak)
    log "    resident at rest $((rss_kb / 1024)) MiB, limit +48 MiB, peak in the cgroup $((peak / 1048576)) MiB, OOM kills ${kills:-0}"
    kill -0 "$pid" 2>/dev/null || fail "the daemon was killed"
    [[ ${kills:-0} == 0 ]] || fail "$kills OOM kills"
    ping_ok "$NS_A" "$IN_B" || fail "no traffic after the flood"
    kill "$pid"
    gone_within "$pid" 3 || true
    rmdir "$cg" 2>/dev/null || true
}
