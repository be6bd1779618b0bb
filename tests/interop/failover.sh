# A fleet of two Ordo gateways behind one anycast address, sharing sessions: a router (FRR,
# ECMP on the L4 hash) in front of them, etcd and a LAN address (10.200.0.1) on the router, a
# wireguard-go client behind it pinging the LAN every 10 ms through the tunnel. Uses
# fleet.sh's etcd, FRR and wait_for helpers.
#
#   client (ordo-b) -- router (ordo-r: FRR, etcd, LAN) -- gateway 1 (ordo-a, wg-ordo-a)
#                                                     \-- gateway 2 (ordo-g2, wg-ordo-c)

FLEET_ANYCAST=198.51.100.1
LAN=10.200.0.1
CLIENT_OUT=10.9.0.2
CLIENT_IN=10.7.0.2
CLIENT_PORT=40000

# The gateways by number: namespace, interface, uplink address.
gw_ns() { [[ $1 == 1 ]] && echo "$NS_A" || echo "$NS_G2"; }
gw_if() { [[ $1 == 1 ]] && echo "$IF_A" || echo "$IF_C"; }
gw_addr() { echo "10.0.$1.2"; }

# gw_figure N NAME: a figure of gateway N (fleet.sh's figure_of).
gw_figure() { figure_of "$(gw_if "$1")" "$2"; }

# The router, the client's and the gateways' links, etcd, and FRR on the router and the
# gateways (each gateway's announcing its fleet table).
failover_network() {
    teardown
    local ns
    for ns in "$NS_R" "$NS_B" "$NS_A" "$NS_G2"; do
        ip netns add "$ns"
        ip -n "$ns" link set lo up
    done
    ip link add r-c netns "$NS_R" type veth peer name veth-b netns "$NS_B"
    ip -n "$NS_R" addr add 10.9.0.1/24 dev r-c
    ip -n "$NS_B" addr add "$CLIENT_OUT/24" dev veth-b
    ip -n "$NS_R" link set r-c up
    ip -n "$NS_B" link set veth-b up
    ip -n "$NS_B" route add default via 10.9.0.1
    local g
    for g in 1 2; do
        ns=$(gw_ns "$g")
        ip link add "r-g$g" netns "$NS_R" type veth peer name up0 netns "$ns"
        ip -n "$NS_R" addr add "10.0.$g.1/24" dev "r-g$g"
        ip -n "$ns" addr add "$(gw_addr "$g")/24" dev up0
        ip -n "$NS_R" link set "r-g$g" up
        ip -n "$ns" link set up0 up
        # The fleet's address on every gateway, and what they send leaves from it, so that a
        # client hears every gateway at the one address it knows. A local route rather than
        # an address: zebra would take an address for a connected route, which wins over the
        # watch's announcement in the imported table and so would keep it from BGP.
        ip -n "$ns" route add local "$FLEET_ANYCAST/32" dev lo table local
        ip -n "$ns" route add default via "10.0.$g.1" src "$FLEET_ANYCAST"
        # ... but what goes to the other gateway leaves from this one's own address: a
        # datagram from an address of its own would be dropped there as a martian.
        ip -n "$ns" route add "$(gw_addr $((3 - g)))/32" via "10.0.$g.1" src "$(gw_addr "$g")"
        ip netns exec "$ns" sysctl -qw net.ipv4.ip_forward=1
    done
    for g in 1 2; do
        # The fleet's address from the watch's table; the return routes from the main
        # table, those through the gateway's interface only.
        frr_start "$(gw_ns "$g")" "g$g" "ip import-table 100" "route-map RETURN permit 10
 match interface $(gw_if "$g")
router bgp 65001
 bgp router-id $(gw_addr "$g")
 no bgp ebgp-requires-policy
 neighbor 10.0.$g.1 remote-as 65000
 neighbor 10.0.$g.1 timers connect 1
 address-family ipv4 unicast
  redistribute table 100
  redistribute kernel route-map RETURN
 exit-address-family"
    done
    ip -n "$NS_R" addr add "$LAN/32" dev lo
    ip netns exec "$NS_R" sysctl -qw net.ipv4.ip_forward=1 net.ipv4.fib_multipath_hash_policy=1 \
        net.ipv4.conf.all.rp_filter=0 net.ipv4.conf.default.rp_filter=0
    ip netns exec "$NS_R" etcd --name fleet-failover --data-dir "$LOGDIR/etcd-failover" \
        --listen-client-urls http://0.0.0.0:2379 --advertise-client-urls http://10.0.1.1:2379 \
        --listen-peer-urls http://127.0.0.1:2380 --initial-advertise-peer-urls http://127.0.0.1:2380 \
        --initial-cluster fleet-failover=http://127.0.0.1:2380 >>"$LOGDIR/etcd.log" 2>&1 &
    wait_for 10 ip netns exec "$NS_R" env ETCDCTL_API=3 etcdctl --endpoints http://127.0.0.1:2379 endpoint health \
        >/dev/null || fail "etcd did not come up"
    frr_start "$NS_R" r "" "router bgp 65000
 bgp router-id 10.9.0.1
 no bgp ebgp-requires-policy
 neighbor 10.0.1.2 remote-as 65001
 neighbor 10.0.1.2 timers connect 1
 neighbor 10.0.2.2 remote-as 65001
 neighbor 10.0.2.2 timers connect 1
 address-family ipv4 unicast
  maximum-paths 4
 exit-address-family"
}

# start_gateway N: gateway N's Ordo (the fleet's key, gateway id N) and its watch.
start_gateway() {
    local g=$1 ns ifname
    ns=$(gw_ns "$g") ifname=$(gw_if "$g")
    ORDO_FLEET=itest ORDO_FLEET_ETCD=http://10.0.$g.1:2379 ORDO_FLEET_ROUTE_TABLE=main ORDO_FLEET_GATEWAY=$g \
        ORDO_FLEET_ADDRESS=$(gw_addr "$g") start_impl ordo "$ns" "$ifname"
    ip netns exec "$ns" wg set "$ifname" private-key "$LOGDIR/fleet.key" listen-port 51820
    ip -n "$ns" addr add 10.7.0.1/24 dev "$ifname"
    ip -n "$ns" link set "$ifname" mtu 1420 up
    # One watch per gateway: one that outlived its daemon registers its probe again with the
    # next.
    pgrep -f "watch $ifname " >/dev/null && return 0
    ip netns exec "$ns" "$ORDO" fleet itest --etcd "http://10.0.$g.1:2379" watch "$ifname" \
        --announce "$FLEET_ANYCAST/32" --table 100 --probe-from 10.7.0.253 --probe-to 10.7.0.1 \
        >>"$LOGDIR/watch-$g.log" 2>&1 &
}

# gateway_pid N: the daemon of gateway N (the process on its UAPI socket).
gateway_pid() {
    ip netns exec "$(gw_ns "$1")" ss -xlpn | grep "/var/run/wireguard/$(gw_if "$1").sock " \
        | grep -o 'pid=[0-9]*' | cut -d= -f2
}

# anycast_paths: how many gateways the router sends the fleet's address to.
anycast_paths() {
    ip -n "$NS_R" route show "$FLEET_ANYCAST" | grep -c "via 10.0" || true
}
both_paths() { [[ $(anycast_paths) == 2 ]]; }
has_holder() { [[ $(holder) == [12] ]]; }
sees_other_up() { [[ $(gw_figure "$1" gateways_up) == 1 ]]; }

# fleet_state: what the gateways and the router say, for a failure's message.
fleet_state() {
    local g f
    for g in 1 2; do
        printf 'gateway %s:' "$g"
        for f in fleet_forwarded fleet_envelopes_opened fleet_takeovers drop_unknown_receiver handshakes_completed \
            gateways_up sessions_held return_routes; do
            printf ' %s=%s' "$f" "$(gw_figure "$g" "$f" 2>/dev/null)"
        done
        echo
    done
    ip -n "$NS_R" route | grep -v "proto kernel"
    echo "holder: $(holder)"
}

# holder: the gateway the client's session record names (etcd's word, which the gateways
# follow).
holder() {
    ip netns exec "$NS_R" env ETCDCTL_API=3 etcdctl --endpoints http://127.0.0.1:2379 get --print-value-only \
        "/ordo/fleet/itest/sessions/$FLEET_CLIENT" | python3 -c 'import json, sys; print(json.load(sys.stdin)["gateway"])' \
        2>/dev/null || echo none
}

# gap_during SECONDS COMMAND...: pings the LAN from the client every 10 ms for SECONDS, runs
# COMMAND after the first second, and prints the longest time without a reply (ms) and the
# replies missed, as "GAP LOST".
gap_during() {
    local secs=$1 out=$LOGDIR/ping-$RANDOM.txt
    shift
    local start end
    start=$(date +%s.%N)
    ip netns exec "$NS_B" ping -D -n -i 0.01 -W 1 -c $((secs * 100)) "$LAN" >"$out" 2>&1 &
    local ping=$!
    sleep 1
    "$@"
    wait "$ping" || true
    end=$(date +%s.%N)
    # The run's start and end count as replies: a gap that never closed is the rest of it.
    python3 - "$out" "$start" "$end" <<'EOF'
import re, sys
text = open(sys.argv[1]).read()
times = [float(sys.argv[2])] + [float(m.group(1)) for m in re.finditer(r"^\[(\d+\.\d+)\].*bytes from", text, re.M)]
times.append(float(sys.argv[3]))
sent = re.search(r"(\d+) packets transmitted, (\d+) received", text)
gap = max(b - a for a, b in zip(times, times[1:])) * 1000
print(int(gap), int(sent.group(1)) - int(sent.group(2)) if sent else -1)
EOF
}

t_fleet_failover() {
    failover_network
    local key_f key_c pub_f pub_c
    key_f=$(genkey); key_c=$(genkey)
    pub_f=$(pubkey "$key_f"); pub_c=$(pubkey "$key_c")
    FLEET_CLIENT=$pub_c
    (umask 077 && echo "$key_f" >"$LOGDIR/fleet.key")
    start_gateway 1
    start_gateway 2
    ip netns exec "$NS_R" env ORDO_FLEET_ETCD=http://127.0.0.1:2379 "$ORDO" fleet itest add "$pub_c" \
        --allowed-ips "$CLIENT_IN/32"
    start_impl wireguard-go "$NS_B" "$IF_B"
    (umask 077 && echo "$key_c" >"$LOGDIR/client.key")
    ip netns exec "$NS_B" wg set "$IF_B" private-key "$LOGDIR/client.key" listen-port "$CLIENT_PORT" \
        peer "$pub_f" endpoint "$FLEET_ANYCAST:51820" allowed-ips "$LAN/32"
    ip -n "$NS_B" addr add "$CLIENT_IN/32" dev "$IF_B"
    ip -n "$NS_B" link set "$IF_B" mtu 1420 up
    ip -n "$NS_B" route add "$LAN/32" dev "$IF_B"
    local ms
    ms=$(wait_for 30 both_paths) || fail "the router never had both gateways: $(ip -n "$NS_R" route)"
    log "    both gateways announced ${ms} ms after they started"
    wait_for 20 ping_ok "$NS_B" "$LAN" 1 2 >/dev/null || fail "the client never reached the LAN: $(ip -n "$NS_R" route)"
    local owner other
    wait_for 2 has_holder >/dev/null || true
    owner=$(holder)
    [[ $owner == [12] ]] || fail "no session record names a gateway: $owner"
    other=$((3 - owner))
    [[ $(gw_figure "$other" gateways_up) == 1 ]] || fail "gateway $other does not see gateway $owner up"
    log "    gateway $owner holds the client"

    # The client's NAT rebinds (a new source port) until ECMP takes it to the other gateway,
    # which passes its datagrams to the holder: no handshake, no loss.
    local handshake port forwarded=0
    handshake=$(dump_field "$IF_B" handshake)
    for port in $(seq 40001 40016); do
        ip netns exec "$NS_B" wg set "$IF_B" listen-port "$port"
        ping_ok "$NS_B" "$LAN" 3 || fail "no traffic after the client's port moved to $port"
        forwarded=$(gw_figure "$other" fleet_forwarded)
        ((forwarded > 0)) && break
    done
    ((forwarded > 0)) || fail "sixteen source ports and ECMP never chose gateway $other"
    local result
    result=$(gap_during 3 true)
    log "    rebound to gateway $other (port $port): passed on to gateway $owner, gap/lost: $result"
    [[ ${result#* } == 0 ]] || fail "packets lost while passed on: $result"
    ((${result% *} < 200)) || fail "a gap of ${result% *} ms while passed on"
    [[ $(dump_field "$IF_B" handshake) == "$handshake" ]] || fail "the client handshook again"
    (($(gw_figure "$owner" fleet_envelopes_opened) > 0)) || fail "gateway $owner opened no envelope"

    # The holder killed: the other gateway, which the client reaches already, takes it over
    # as soon as the holder's watch says it is down.
    result=$(gap_during 4 kill -KILL "$(gateway_pid "$owner")")
    log "    gateway $owner killed while the client reached gateway $other: longest gap/lost: $result"
    ((${result% *} < 1500)) || fail "failover took ${result% *} ms: $(fleet_state)"
    [[ $(holder) == "$other" ]] || fail "the session did not move to gateway $other"
    (($(gw_figure "$other" fleet_takeovers) == 1)) || fail "takeovers: $(gw_figure "$other" fleet_takeovers)"

    # The killed gateway back; then the holder frozen: its watch withdraws it, the router
    # sends the client to the returned gateway, which takes it over.
    start_gateway "$owner"
    wait_for 30 both_paths >/dev/null || fail "gateway $owner never announced again"
    wait_for 10 sees_other_up "$owner" >/dev/null || fail "the returned gateway does not see the other up"
    local frozen
    frozen=$(gateway_pid "$other")
    result=$(gap_during 4 kill -STOP "$frozen")
    kill -CONT "$frozen"
    log "    gateway $other frozen: longest gap/lost: $result"
    ((${result% *} < 1500)) || fail "failover from a frozen gateway took ${result% *} ms: $(fleet_state)"
    [[ $(holder) == "$owner" ]] || fail "the session did not move to gateway $owner"

    # Its data path broken while its control plane stays up (the inner device down).
    wait_for 30 both_paths >/dev/null || fail "the thawed gateway never announced again"
    result=$(gap_during 4 ip -n "$(gw_ns "$owner")" link set "$(gw_if "$owner")" down)
    log "    gateway $owner's inner device down: longest gap/lost: $result"
    ((${result% *} < 1500)) || fail "failover from a broken data path took ${result% *} ms: $(fleet_state)"
    [[ $(gw_figure "$other" sessions_held) == 1 ]] || fail "gateway $other does not hold the client"
}
