# shellcheck shell=bash
# Outer = xdp: AF_XDP beside the kernel, its MTU, a SIGKILL, and every fallback to kernel UDP.
# Sourced by interop.sh, whose helpers (run_test, fail, ping_ok) and lib.sh's it uses.

# same_digests RESULT WHAT: tcp_sha256's two digests are one.
same_digests() { [[ -n "${1%% *}" && "${1%% *}" == "${1##* }" ]] || fail "$2: sent and received digests differ: $1"; }

# settled_field IFNAME FIELD: the field once it stopped changing (at most 5 s).
settled_field() {
    local last=-1 now
    for _ in $(seq 50); do
        now=$(dump_field "$1" "$2")
        [[ $now == "$last" ]] && break
        last=$now
        sleep 0.1
    done
    echo "$now"
}

# ordo_pid NS: the Ordo daemon of namespace NS.
# (Not its UAPI janitor, a process of its own that holds nothing of the data plane.)
ordo_pid() { ip netns pids "$1" | xargs -r ps -o pid=,comm=,args= -p | awk '$2 == "ordo" && !/uapi-janitor/ {print $1}'; }

# t_xdp PEER FAMILY MODE: Ordo's end runs Outer = xdp (in MODE: native or generic) over IPv4
# or IPv6 outer addresses. Both ways carry the bytes sent, by AF_XDP (the program's and the
# port's counters), with nothing lost: every byte the peer sent Ordo counted as received.
# While the tunnel carries a transfer, the host's own traffic is unharmed: it answers ping
# on its outer addresses, serves a TCP connection on another port and resolves neighbours.
t_xdp() {
    local peer=$1 family=$2 mode=$3
    export ORDO_OUTER=xdp ORDO_XDP_MODE=$mode
    OUTER_FAMILY=$family tunnel ordo "$peer"
    local shown
    shown=$("$ORDO" show "$IF_A" | grep "outer path") || true
    [[ $shown == *"xdp on veth-a ($mode, copy"* ]] || fail "not on AF_XDP in $mode mode: $shown"
    ping_ok "$NS_A" "$IN_B" || fail "IPv4 ping A->B"
    ping_ok "$NS_B" "$IN6_A" || fail "IPv6 ping B->A"
    local r rx0 tx0
    rx0=$(dump_field "$IF_A" rx); tx0=$(dump_field "$IF_B" tx)
    r=$(tcp_sha256 "$NS_A" "$IN_A" "$NS_B"); same_digests "$r" "into Ordo"
    r=$(tcp_sha256 "$NS_B" "$IN_B" "$NS_A"); same_digests "$r" "out of Ordo"
    local rx tx
    rx=$(( $(settled_field "$IF_A" rx) - rx0 )); tx=$(( $(dump_field "$IF_B" tx) - tx0 ))
    log "    the peer sent $tx B, Ordo received $rx B"
    [[ $peer == boringtun || $rx -eq $tx ]] || fail "datagrams lost: the peer sent $tx B, Ordo received $rx B"
    local taken sent
    taken=$(ordo_counter "$IF_A" xdp_to_socket); sent=$(ordo_counter "$IF_A" xdp_sent)
    log "    by AF_XDP: $taken frames received, $sent datagrams sent; passed as too long: $(ordo_counter "$IF_A" xdp_passed_too_long)"
    ((taken > 1000 && sent > 1000)) || fail "not by AF_XDP: $taken received, $sent sent"
    [[ $(ordo_counter "$IF_A" drop_xdp_malformed) -eq 0 ]] || fail "frames dropped as malformed"
    # The host's own traffic, during a transfer through the tunnel.
    ip netns exec "$NS_A" iperf3 -s -1 -p 5201 >/dev/null 2>&1 &
    for _ in $(seq 50); do ip netns exec "$NS_A" ss -ltn | grep ':5201 ' >/dev/null && break; sleep 0.1; done
    ip netns exec "$NS_B" iperf3 -c "$IN_A" -p 5201 -t 4 >/dev/null 2>&1 &
    local load=$!
    ip -n "$NS_A" neigh flush dev veth-a
    ping_ok "$NS_B" "$OUT_A" || fail "the host's IPv4 address did not answer ping"
    ping_ok "$NS_B" "$OUT6_A" || fail "the host's IPv6 address did not answer ping"
    ping_ok "$NS_A" "$OUT_B" || fail "the host did not resolve its IPv4 neighbour"
    ping_ok "$NS_A" "$OUT6_B" || fail "the host did not resolve its IPv6 neighbour"
    r=$(tcp_sha256 "$NS_A" "$OUT_A" "$NS_B"); same_digests "$r" "a TCP connection to the host"
    wait "$load" || fail "the transfer through the tunnel failed"
    [[ $(ordo_counter "$IF_A" xdp_passed_not_udp) -gt 0 ]] || fail "the program saw none of the host's own traffic"
    # Every thread, the one that follows the kernel's routes included, started after the
    # privileges were dropped.
    local pid
    pid=$(pgrep -o -f -- "--foreground .*$IF_A\$")
    grep -x ordo-paths /proc/"$pid"/task/*/comm >/dev/null || fail "no ordo-paths thread"
    threads_dropped "$pid" >"$LOGDIR/threads.txt" || fail "threads that kept privileges: $(cat "$LOGDIR/threads.txt")"
}

# A datagram longer than the outer link's MTU (the inner MTU set too high) goes through the
# kernel, which fragments it, instead of a frame the link would drop.
t_xdp_mtu() {
    export ORDO_OUTER=xdp
    tunnel ordo wireguard-go
    ping_ok "$NS_A" "$IN_B" || fail "ping"
    ip -n "$NS_A" link set "$IF_A" mtu 1600
    local before
    before=$(ordo_counter "$IF_A" xdp_sent_by_kernel)
    ip netns exec "$NS_A" ping -q -c 3 -i 0.2 -w 10 -s 1550 -M dont "$IN_B" >/dev/null \
        || fail "1578-byte packets through a 1500-byte outer link were lost"
    (($(ordo_counter "$IF_A" xdp_sent_by_kernel) >= before + 3)) || fail "not sent through the kernel"
}

# The daemon killed with SIGKILL leaves no XDP program on the interface: the next datagrams
# reach the kernel, and a new Ordo attaches again.
t_xdp_sigkill() {
    export ORDO_OUTER=xdp
    tunnel ordo wireguard-go
    ping_ok "$NS_A" "$IN_B" || fail "ping"
    ip -n "$NS_A" link show dev veth-a | grep "prog/xdp" >/dev/null || fail "no program on veth-a"
    local pid
    pid=$(ordo_pid "$NS_A")
    [[ -n $pid ]] || fail "no Ordo daemon in $NS_A"
    kill -KILL "$pid"
    local gone=0
    for _ in $(seq 50); do
        ip -n "$NS_A" link show dev veth-a | grep "xdp" >/dev/null || { gone=1; break; }
        sleep 0.1
    done
    ((gone)) || fail "a program stayed on veth-a after SIGKILL: $(ip -n "$NS_A" link show dev veth-a)"
    ping_ok "$NS_B" "$OUT_A" || fail "the host unreachable after the kill"
}

# Where XDP cannot run, Ordo runs on udp and says why: an interface that does not exist, and
# one that already has an XDP program (the first tunnel's), which it must leave alone.
t_xdp_fallback() {
    export ORDO_OUTER=xdp ORDO_XDP_INTERFACES=nosuch0
    tunnel ordo wireguard-go
    ping_ok "$NS_A" "$IN_B" || fail "ping on the fallback"
    grep "Outer = xdp unavailable, running on udp: no interface nosuch0" "$LOGDIR/$IF_A.log" >/dev/null \
        || fail "no message naming the missing interface: $(cat "$LOGDIR/$IF_A.log")"
    "$ORDO" show "$IF_A" | grep "outer path: udp" >/dev/null || fail "ordo show does not say udp"
    teardown
    # A driver without native XDP (a bridge has none) when native mode is asked for.
    add_bridge() {
        ip -n "$NS_A" link add ordo-br0 type bridge
        ip -n "$NS_A" addr add 198.18.0.1/24 dev ordo-br0
        ip -n "$NS_A" link set ordo-br0 up
    }
    HOSTS_EXTRA=add_bridge ORDO_XDP_INTERFACES=ordo-br0 ORDO_XDP_MODE=native tunnel ordo wireguard-go
    ping_ok "$NS_A" "$IN_B" || fail "ping on the fallback from a driver without XDP"
    grep "Outer = xdp unavailable, running on udp: ordo-br0: the kernel or the interface has no XDP" \
        "$LOGDIR/$IF_A.log" >/dev/null || fail "no message naming the driver: $(cat "$LOGDIR/$IF_A.log")"
    "$ORDO" show "$IF_A" | grep "outer path: udp" >/dev/null || fail "ordo show does not say udp (bridge)"
    teardown
    # Without the privileges XDP needs: CAP_BPF and CAP_SYS_ADMIN out of the bounding set.
    unset ORDO_XDP_INTERFACES
    ORDO_WRAP="setpriv --bounding-set -bpf,-sys_admin,-perfmon" tunnel ordo wireguard-go
    ping_ok "$NS_A" "$IN_B" || fail "ping on the fallback without CAP_BPF"
    grep "Outer = xdp unavailable, running on udp: veth-a: not permitted" "$LOGDIR/$IF_A.log" >/dev/null \
        || fail "no message naming the privileges: $(cat "$LOGDIR/$IF_A.log")"
    "$ORDO" show "$IF_A" | grep "outer path: udp" >/dev/null || fail "ordo show does not say udp (privileges)"
    teardown
    tunnel ordo wireguard-go
    ping_ok "$NS_A" "$IN_B" || fail "ping on xdp"
    local second=$IF_C
    start_impl ordo "$NS_A" "$second"
    grep "running on udp: veth-a: another XDP program is attached" "$LOGDIR/$second.log" >/dev/null \
        || fail "the second daemon did not say why: $(cat "$LOGDIR/$second.log")"
    "$ORDO" show "$second" | grep "outer path: udp" >/dev/null || fail "the second daemon is not on udp"
    "$ORDO" show "$IF_A" | grep "outer path: xdp on veth-a" >/dev/null || fail "the first lost its program"
    ping_ok "$NS_A" "$IN_B" || fail "the first tunnel broke"
}
