# The fleet's control plane: peers from etcd (Debian's etcd-server, in host A's namespace),
# applied to a running Ordo gateway and followed as they change, with a real client
# (wireguard-go in host B) handshaking through them.

ETCD_URL=http://127.0.0.1:2379

# etcd_start NS DIR: one etcd member on NS's loopback, its data in DIR; returns once it
# answers.
etcd_start() {
    ip netns exec "$1" etcd --name fleet-test --data-dir "$2" \
        --listen-client-urls "$ETCD_URL" --advertise-client-urls "$ETCD_URL" \
        --listen-peer-urls http://127.0.0.1:2380 --initial-advertise-peer-urls http://127.0.0.1:2380 \
        --initial-cluster fleet-test=http://127.0.0.1:2380 >>"$LOGDIR/etcd.log" 2>&1 &
    ETCD_PID=$!
    local _
    for _ in $(seq 100); do
        ip netns exec "$1" env ETCDCTL_API=3 etcdctl --endpoints "$ETCD_URL" endpoint health >/dev/null 2>&1 && return 0
        sleep 0.1
    done
    fail "etcd did not come up (see $LOGDIR/etcd.log)"
}

# etcd_stop: stops the member etcd_start started last (`ip netns exec` became etcd: its pid).
etcd_stop() {
    [[ -n ${ETCD_PID:-} ]] || return 0
    kill "$ETCD_PID" 2>/dev/null || true
    local _
    for _ in $(seq 50); do
        kill -0 "$ETCD_PID" 2>/dev/null || { ETCD_PID=; return 0; }
        sleep 0.1
    done
    kill -9 "$ETCD_PID"
    ETCD_PID=
}

# wait_for SECONDS COMMAND...: COMMAND succeeds within SECONDS; prints how long it took (ms).
wait_for() {
    local limit=$1 start
    shift
    start=$(date +%s%N)
    while ! "$@" >/dev/null 2>&1; do
        (( ($(date +%s%N) - start) / 1000000000 < limit )) || return 1
        sleep 0.05
    done
    echo $(( ($(date +%s%N) - start) / 1000000 ))
}

# figure_of IFNAME NAME: one of an interface's figures by its name in `ordo show --json`: its
# counters, or its parts' (the fleet agent's).
figure_of() {
    "$ORDO" show "$1" --json | python3 -c "
import json, sys
r = json.load(sys.stdin)[0]
figures = dict(r['counters'])
for p in r['parts']:
    figures.update({f['name']: f['value'] for f in p['figures']})
print(figures['$2'])"
}

# fleet_figure NAME: one of the fleet agent's figures on host A's gateway.
fleet_figure() { figure_of "$IF_A" "$1"; }

peer_listed() { wg show "$IF_A" peers | grep -x "$1" >/dev/null; }
peer_absent() { ! peer_listed "$1"; }
# return_route FAMILY ADDRESS: the gateway routes ADDRESS through its interface in the fleet's
# table (100 here), with Ordo's protocol number (79), as its BGP daemon takes it.
return_route() { ip "-$1" -n "$NS_A" route show table 100 proto 79 2>/dev/null | grep -E "^$2 dev $IF_A( |$)" >/dev/null; }
no_return_route() { ! return_route "$@"; }

# fleet_gateway_and_client: etcd and an Ordo gateway of fleet `itest` (return routes in table
# 100) in host A, its key and port set as always and its peers left to the fleet; a
# wireguard-go client in host B that knows the gateway. Sets KEY_A KEY_B PUB_A PUB_B.
fleet_gateway_and_client() {
    make_hosts
    etcd_start "$NS_A" "$LOGDIR/etcd-data"
    KEY_A=$(genkey); KEY_B=$(genkey)
    PUB_A=$(pubkey "$KEY_A"); PUB_B=$(pubkey "$KEY_B")
    ORDO_FLEET=itest ORDO_FLEET_ETCD=$ETCD_URL ORDO_FLEET_ROUTE_TABLE=100 start_impl ordo "$NS_A" "$IF_A"
    (umask 077 && echo "$KEY_A" >"$LOGDIR/a.key")
    ip netns exec "$NS_A" wg set "$IF_A" private-key "$LOGDIR/a.key" listen-port "$PORT_A"
    start_impl wireguard-go "$NS_B" "$IF_B"
    configure "$NS_B" "$IF_B" "$KEY_B" "$PORT_B" "$PUB_A" "$OUT_A:$PORT_A" "$IN_A/32"
    inner_addresses "$NS_A" "$IF_A" "$IN_A" "$IN6_A"
    inner_addresses "$NS_B" "$IF_B" "$IN_B" "$IN6_B"
}

t_fleet_peers() {
    fleet_gateway_and_client
    local fleet=(ip netns exec "$NS_A" env ORDO_FLEET_ETCD="$ETCD_URL" "$ORDO" fleet itest)
    ! ping_ok "$NS_B" "$IN_A" 1 2 || fail "a client the fleet does not know got through"

    "${fleet[@]}" add "$PUB_B" --allowed-ips "$IN_B/32,$IN6_B/128"
    local ms
    ms=$(wait_for 5 peer_listed "$PUB_B") || fail "the peer put in etcd never reached the gateway"
    log "    a peer put in etcd was on the gateway after ${ms} ms"
    [[ $(wg show "$IF_A" allowed-ips | grep "$PUB_B" | cut -f2) == "$IN_B/32 $IN6_B/128" ]] \
        || fail "allowed IPs: $(wg show "$IF_A" allowed-ips)"
    no_return_route 4 "$IN_B" || fail "a return route before any session"
    ping_ok "$NS_B" "$IN_A" 3 || fail "the client does not get through the fleet's peer"
    # Its session held here: its addresses are routed here (within a pass: a handshake is
    # looked for ten times a second).
    ms=$(wait_for 1 return_route 4 "$IN_B") || fail "no return route: $(ip -n "$NS_A" route show table 100)"
    return_route 6 "$IN6_B" || fail "no IPv6 return route: $(ip -6 -n "$NS_A" route show table 100)"
    local figures
    figures=$("$ORDO" show "$IF_A" | grep "^  fleet: ") || fail "ordo show has no fleet line"
    [[ $figures == *"etcd_up=1 "*"records=1 peers=1 return_routes=2 records_refused=0 etcd_lost=0 "* ]] \
        || fail "ordo show: $figures"
    "${fleet[@]}" list | grep -x "peer: $PUB_B" >/dev/null || fail "ordo fleet list: $("${fleet[@]}" list)"

    # Removed behind the fleet's back (as `wg syncconf` of a file without it would): put back.
    ip netns exec "$NS_A" wg set "$IF_A" peer "$PUB_B" remove
    ms=$(wait_for 5 peer_listed "$PUB_B") || fail "a peer removed with wg set did not come back"
    log "    removed with wg set, back after ${ms} ms"

    # A record with a secret in it is refused, and its peer goes (fail closed).
    ip netns exec "$NS_A" env ETCDCTL_API=3 etcdctl --endpoints "$ETCD_URL" put "/ordo/fleet/itest/peers/$PUB_B" \
        "{\"allowed_ips\": [\"$IN_B/32\"], \"preshared_key\": \"$KEY_B\"}" >/dev/null
    wait_for 5 peer_absent "$PUB_B" >/dev/null || fail "a refused record left its peer in place"
    wait_for 2 no_return_route 4 "$IN_B" >/dev/null || fail "the refused peer's return route stayed"
    grep "record /ordo/fleet/itest/peers/$PUB_B refused: a preshared key does not go into etcd" "$LOGDIR/$IF_A.log" >/dev/null \
        || fail "the refusal is not in the log: $(grep fleet "$LOGDIR/$IF_A.log")"
    ! grep -F "$KEY_B" "$LOGDIR/$IF_A.log" >/dev/null || fail "the key in the refused record reached the log"
    [[ $(fleet_figure records_refused) == 1 ]] || fail "records_refused: $(fleet_figure records_refused)"
    # Corrected, with an endpoint: the gateway, which lost the session with the peer, can
    # reach the client first (a client whose session a gateway dropped would otherwise wait
    # for WireGuard's own timers, 15 s, before it handshakes again).
    "${fleet[@]}" add "$PUB_B" --allowed-ips "$IN_B/32" --endpoint "$OUT_B:$PORT_B"
    wait_for 5 peer_listed "$PUB_B" >/dev/null || fail "the corrected record was not taken"
    [[ $(dump_field "$IF_A" endpoint) == "$OUT_B:$PORT_B" ]] || fail "endpoint: $(dump_field "$IF_A" endpoint)"
    ping_ok "$NS_A" "$IN_B" 3 || fail "no traffic after the record was corrected"

    # etcd gone: the gateway keeps forwarding with what it has.
    etcd_stop
    ping_ok "$NS_A" "$IN_B" 10 || fail "traffic stopped with etcd"
    peer_listed "$PUB_B" || fail "the peer went with etcd"
    [[ $(fleet_figure etcd_up) == 0 && $(fleet_figure etcd_lost) == 1 ]] \
        || fail "etcd_up $(fleet_figure etcd_up), etcd_lost $(fleet_figure etcd_lost) with etcd down"
    grep "fleet: etcd at $ETCD_URL: .*keeping the 1 fleet peers" "$LOGDIR/$IF_A.log" >/dev/null \
        || fail "the outage is not in the log: $(grep fleet "$LOGDIR/$IF_A.log")"
    # Back, with a change made meanwhile by another member (here: written straight into the
    # same data once it is up): the gateway catches up.
    etcd_start "$NS_A" "$LOGDIR/etcd-data"
    "${fleet[@]}" remove "$PUB_B"
    ms=$(wait_for 15 peer_absent "$PUB_B") || fail "a peer deleted after etcd came back stayed"
    log "    after etcd came back, a deletion reached the gateway in ${ms} ms"
    ! ping_ok "$NS_A" "$IN_B" 1 2 || fail "the deleted peer still gets through"
    no_return_route 4 "$IN_B" || fail "the deleted peer's return route stayed"
    grep "caught up" "$LOGDIR/$IF_A.log" >/dev/null || fail "no catch-up in the log"
    [[ $(fleet_figure etcd_up) == 1 ]] || fail "etcd_up stayed 0 after etcd came back"
}

# frr_start NS NAME ZEBRA_CONF BGPD_CONF: FRR's zebra and bgpd in NS (one instance per
# namespace, its sockets, pid files and logs in /tmp/ordo-frr-NAME, which FRR's own user
# must reach); returns once bgpd's vty answers.
frr_start() {
    local ns=$1 dir=/tmp/ordo-frr-$2
    rm -rf "$dir"
    mkdir -p "$dir"
    printf '%s\n' "$3" >"$dir/zebra.conf"
    printf '%s\n' "$4" >"$dir/bgpd.conf"
    chown -R frr:frr "$dir"
    chmod 755 "$dir"
    local common=(-u frr -g frr --vty_socket "$dir" -z "$dir/zserv.api" -d -A 127.0.0.1)
    ip netns exec "$ns" /usr/lib/frr/zebra "${common[@]}" -i "$dir/zebra.pid" -f "$dir/zebra.conf" \
        --log "file:$dir/zebra.log" >>"$dir/start.log" 2>&1
    ip netns exec "$ns" /usr/lib/frr/bgpd "${common[@]}" -i "$dir/bgpd.pid" -f "$dir/bgpd.conf" \
        --log "file:$dir/bgpd.log" >>"$dir/start.log" 2>&1
    local _
    for _ in $(seq 50); do
        [[ -S $dir/bgpd.vty ]] && return 0
        sleep 0.1
    done
    fail "FRR did not start in $ns (see $dir)"
}

# vtysh_in NAME COMMAND: a vtysh command to the FRR instance frr_start named NAME.
vtysh_in() { vtysh --vty_socket "/tmp/ordo-frr-$1" -c "$2"; }

# bgp_route NS PREFIX: the kernel in NS has PREFIX from BGP, through host A.
bgp_route() { ip -n "$1" route show "$2" proto bgp 2>/dev/null | grep "via $OUT_A" >/dev/null; }
no_bgp_route() { ! bgp_route "$@"; }

# The return routes as FRR takes them: the gateway's zebra imports its fleet table, its bgpd
# announces it to a router (here in host B, beside the client), which installs the client's
# network through the gateway while the gateway holds the client's session.
t_fleet_bgp() {
    fleet_gateway_and_client
    local lan=10.55.0.0/24
    frr_start "$NS_A" gw "ip import-table 100" "router bgp 65001
 bgp router-id $OUT_A
 no bgp ebgp-requires-policy
 neighbor $OUT_B remote-as 65000
 neighbor $OUT_B timers connect 1
 address-family ipv4 unicast
  redistribute table 100
 exit-address-family"
    frr_start "$NS_B" router "" "router bgp 65000
 bgp router-id $OUT_B
 no bgp ebgp-requires-policy
 neighbor $OUT_A remote-as 65001
 neighbor $OUT_A timers connect 1"
    local ms
    ms=$(wait_for 30 sh -c "vtysh --vty_socket /tmp/ordo-frr-router -c 'show bgp summary' | grep -E '^$OUT_A .* [0-9]+ +[0-9]+ +N/A'") \
        || fail "no BGP session: $(vtysh_in router 'show bgp summary')"
    log "    BGP session up after ${ms} ms"
    no_bgp_route "$NS_B" "$lan" || fail "announced before the client has a session"

    ip netns exec "$NS_A" env ORDO_FLEET_ETCD="$ETCD_URL" "$ORDO" fleet itest add "$PUB_B" --allowed-ips "$IN_B/32,$lan"
    wait_for 5 peer_listed "$PUB_B" >/dev/null || fail "the peer never reached the gateway"
    ping_ok "$NS_B" "$IN_A" 3 || fail "the client does not get through"
    ms=$(wait_for 10 bgp_route "$NS_B" "$lan") || fail "the router never learned $lan: $(vtysh_in router 'show ip bgp')"
    log "    the router learned the client's network through the gateway ${ms} ms after the handshake"

    ip netns exec "$NS_A" env ORDO_FLEET_ETCD="$ETCD_URL" "$ORDO" fleet itest remove "$PUB_B"
    ms=$(wait_for 10 no_bgp_route "$NS_B" "$lan") || fail "the route stayed on the router after the peer went"
    log "    withdrawn from the router ${ms} ms after the peer was removed"
}

# announced NS: the fleet's address is in the fleet's table (what the gateway's BGP daemon
# announces).
ANYCAST=198.51.100.1
announced() { ip -n "$NS_A" route show table 100 2>/dev/null | grep -E "^$ANYCAST dev lo( |$)" >/dev/null; }
withdrawn() { ! announced; }

# The watch: the fleet's address announced while the gateway's data path answers probes
# through its own tunnel, withdrawn when the daemon is frozen (alive but not forwarding) or its
# inner device is down (control plane up, data path broken), and when the watch stops.
t_fleet_health() {
    make_hosts
    KEY_A=$(genkey)
    start_impl ordo "$NS_A" "$IF_A"
    (umask 077 && echo "$KEY_A" >"$LOGDIR/a.key")
    ip netns exec "$NS_A" wg set "$IF_A" private-key "$LOGDIR/a.key" listen-port "$PORT_A"
    inner_addresses "$NS_A" "$IF_A" "$IN_A" "$IN6_A"
    ip netns exec "$NS_A" "$ORDO" fleet itest watch "$IF_A" --announce "$ANYCAST/32" --table 100 \
        --probe-from 10.99.0.254 --probe-to "$IN_A" >"$LOGDIR/watch.log" 2>&1 &
    local watch=$! ms daemon
    # The daemon: the process listening on the interface's UAPI socket.
    daemon=$(ip netns exec "$NS_A" ss -xlpn | grep "/var/run/wireguard/$IF_A.sock " | grep -o 'pid=[0-9]*' | cut -d= -f2)
    [[ $daemon =~ ^[0-9]+$ ]] || fail "not one daemon: $daemon"
    ms=$(wait_for 5 announced) || fail "never announced: $(cat "$LOGDIR/watch.log")"
    log "    announced ${ms} ms after the watch started"

    kill -STOP "$daemon"
    ms=$(wait_for 3 withdrawn) || { kill -CONT "$daemon"; fail "a frozen gateway stayed announced"; }
    log "    frozen daemon: withdrawn after ${ms} ms"
    kill -CONT "$daemon"
    ms=$(wait_for 5 announced) || fail "not announced again after the daemon thawed: $(cat "$LOGDIR/watch.log")"
    log "    thawed: announced again after ${ms} ms"

    # The control plane up (the UAPI answers), the data path broken.
    ip -n "$NS_A" link set "$IF_A" down
    ms=$(wait_for 3 withdrawn) || fail "a gateway whose inner device is down stayed announced"
    wg show "$IF_A" >/dev/null || fail "the UAPI stopped answering"
    log "    inner device down: withdrawn after ${ms} ms"
    ip -n "$NS_A" link set "$IF_A" up
    ms=$(wait_for 5 announced) || fail "not announced again after the inner device came back"

    kill "$watch"
    wait "$watch" 2>/dev/null || true
    withdrawn || fail "still announced after the watch stopped"
    [[ -z $(wg show "$IF_A" peers) ]] || fail "the probe's peer stayed: $(wg show "$IF_A" peers)"
    grep "withdrawing $ANYCAST/32" "$LOGDIR/watch.log" >/dev/null || fail "no withdrawal in the log: $(cat "$LOGDIR/watch.log")"
}

# make_certs DIR: a CA, etcd's certificate for 127.0.0.1 (server and client use: etcd's own
# gateway dials itself with it) and a gateway's client certificate, P-256, for two days.
make_certs() {
    local d=$1
    mkdir -p "$d"
    openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:P-256 -nodes -keyout "$d/ca.key" -out "$d/ca.pem" \
        -days 2 -subj /CN=ordo-test-ca 2>/dev/null
    local who ext
    for who in server client; do
        [[ $who == server ]] && ext='subjectAltName=IP:127.0.0.1\nextendedKeyUsage=serverAuth,clientAuth' \
            || ext='extendedKeyUsage=clientAuth'
        openssl req -newkey ec -pkeyopt ec_paramgen_curve:P-256 -nodes -keyout "$d/$who.key" -out "$d/$who.csr" \
            -subj "/CN=$who" 2>/dev/null
        printf "$ext\n" >"$d/$who.ext"
        openssl x509 -req -in "$d/$who.csr" -CA "$d/ca.pem" -CAkey "$d/ca.key" -CAcreateserial -out "$d/$who.pem" \
            -days 2 -extfile "$d/$who.ext" 2>/dev/null
    done
    chmod 600 "$d"/*.key
}

# etcd over TLS with client certificates: the gateway (which drops to nobody after setup)
# reads its key, readable by root alone, before it drops, and takes its peers over TLS; a
# client without a certificate is refused.
t_fleet_tls() {
    make_hosts
    local certs=$LOGDIR/certs url=https://127.0.0.1:2379
    make_certs "$certs"
    ip netns exec "$NS_A" etcd --name fleet-tls --data-dir "$LOGDIR/etcd-tls" \
        --listen-client-urls "$url" --advertise-client-urls "$url" \
        --listen-peer-urls http://127.0.0.1:2380 --initial-advertise-peer-urls http://127.0.0.1:2380 \
        --initial-cluster fleet-tls=http://127.0.0.1:2380 --cert-file "$certs/server.pem" \
        --key-file "$certs/server.key" --trusted-ca-file "$certs/ca.pem" --client-cert-auth >>"$LOGDIR/etcd.log" 2>&1 &
    local tls=(--etcd "$url" --cacert "$certs/ca.pem" --cert "$certs/client.pem" --key "$certs/client.key")
    wait_for 10 ip netns exec "$NS_A" "$ORDO" fleet itest "${tls[@]}" list >/dev/null || fail "etcd over TLS did not answer"
    ! ip netns exec "$NS_A" "$ORDO" fleet itest --etcd "$url" --cacert "$certs/ca.pem" list 2>/dev/null \
        || fail "etcd took a client without a certificate"
    KEY_A=$(genkey); KEY_B=$(genkey)
    PUB_B=$(pubkey "$KEY_B")
    ORDO_FLEET=itest ORDO_FLEET_ETCD=$url ORDO_FLEET_ETCD_CA=$certs/ca.pem ORDO_FLEET_ETCD_CERT=$certs/client.pem \
        ORDO_FLEET_ETCD_KEY=$certs/client.key start_impl ordo "$NS_A" "$IF_A"
    (umask 077 && echo "$KEY_A" >"$LOGDIR/a.key")
    ip netns exec "$NS_A" wg set "$IF_A" private-key "$LOGDIR/a.key" listen-port "$PORT_A"
    ip netns exec "$NS_A" "$ORDO" fleet itest "${tls[@]}" add "$PUB_B" --allowed-ips "$IN_B/32"
    local ms
    ms=$(wait_for 5 peer_listed "$PUB_B") || fail "no peer over TLS: $(grep fleet "$LOGDIR/$IF_A.log")"
    log "    a peer put over TLS was on the gateway after ${ms} ms"
    [[ $(fleet_figure etcd_up) == 1 ]] || fail "etcd_up $(fleet_figure etcd_up)"
}
