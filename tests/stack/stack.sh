#!/usr/bin/env bash
# Applications through Ordo's own TCP/IP stack (`ordo run`), in network namespaces:
# host A runs the program under `ordo run` as an unprivileged user with no capability (no TUN,
# no root); host B runs a peer with a TUN device and the servers. Run as root after
# `cargo build --release`:
#
#   [STACK_TESTS="curl_download nc ..."] tests/stack/stack.sh [PEER=wireguard-go]
#
# Prints one line per test and ends with "stack: N passed, N failed".
set -uo pipefail
source "$(dirname "$0")/../interop/lib.sh"

PEER=${1:-wireguard-go}
TESTS_DIR=$(cd "$(dirname "$0")" && pwd)
PASSED=0
FAILED=0
WORK=$(mktemp -d /tmp/ordo-stack.XXXXXX)
chmod 755 "$WORK"
trap 'teardown; rm -rf "$WORK"' EXIT
fail() { log "    FAIL: $*"; return 1; }

# The unprivileged user the program and its interface run as.
RUN_USER=nobody
# Python for the unprivileged user (a pyenv shim under /root is out of its reach).
PY=/usr/bin/python3

# Host B: the peer with a TUN device, its tunnel addresses, and A as its peer. A's wg-quick
# file for `ordo run`, readable only by RUN_USER.
setup() {
    make_hosts
    KEY_A=$(genkey); KEY_B=$(genkey)
    PUB_A=$(pubkey "$KEY_A"); PUB_B=$(pubkey "$KEY_B")
    start_impl "$PEER" "$NS_B" "$IF_B"
    configure "$NS_B" "$IF_B" "$KEY_B" "$PORT_B" "$PUB_A" "$OUT_A:$PORT_A" "$IN_A/32,$IN6_A/128"
    inner_addresses "$NS_B" "$IF_B" "$IN_B" "$IN6_B"
    CONF="$WORK/a.conf"
    cat >"$CONF" <<EOF
[Interface]
PrivateKey = $KEY_A
ListenPort = $PORT_A
Address = $IN_A/24, $IN6_A/64

[Peer]
PublicKey = $PUB_B
Endpoint = $OUT_B:$PORT_B
AllowedIPs = $IN_B/32, $IN6_B/128
EOF
    chown "$RUN_USER" "$CONF"
    chmod 600 "$CONF"
    OUT="$WORK/out"
    mkdir -p "$OUT"
    chown "$RUN_USER" "$OUT"
}

# as_user CMD...: CMD in host A as RUN_USER with no capability at all.
as_user() {
    ip netns exec "$NS_A" setpriv --reuid="$RUN_USER" --regid=nogroup --clear-groups \
        --inh-caps=-all --bounding-set=-all -- "$@"
}

# as_guest USER CMD...: CMD in host A as USER, with no capability at all.
as_guest() {
    local user=$1
    shift
    ip netns exec "$NS_A" setpriv --reuid="$user" --regid="$(id -g "$user")" --clear-groups \
        --inh-caps=-all --bounding-set=-all -- "$@"
}

# ordo_run CMD...: CMD under `ordo run` in host A, unprivileged.
ordo_run() { as_user "$ORDO" run -c "$CONF" -- "$@"; }

# http_server NS ADDR PORT DIR: python's http.server, returns once it listens.
http_server() {
    ip netns exec "$1" "$PY" -m http.server "$3" --bind "$2" --directory "$4" >"$LOGDIR/http-$3.log" 2>&1 &
    for _ in $(seq 50); do
        ip netns exec "$1" ss -ltn | grep ":$3 " >/dev/null && return 0
        sleep 0.1
    done
    fail "http.server on $2:$3 did not start"
}

run_test() {
    local name=$1
    shift
    if [[ -n ${STACK_TESTS:-} ]] && ! [[ " $STACK_TESTS " == *" ${name%%[*} "* ]]; then
        return
    fi
    local start=$SECONDS rc
    ( set -e; "$@" )
    rc=$?
    if ((rc == 0)); then
        PASSED=$((PASSED + 1))
        printf 'ok    %-40s %3ds\n' "$name" $((SECONDS - start))
    else
        FAILED=$((FAILED + 1))
        printf 'FAIL  %-40s %3ds   (logs: %s)\n' "$name" $((SECONDS - start)) "$LOGDIR"
    fi
    teardown
}

# The tests by topic, each file sourced here.
for topic in clients servers datagrams dns shared leaks; do
    source "$TESTS_DIR/$topic.sh"
done

run_test "curl_download[$PEER]" t_curl_download
run_test "servers[$PEER]" t_servers
run_test "wildcard_server[$PEER]" t_wildcard_server
run_test "udp[$PEER]" t_udp
run_test "udp_unconnected[$PEER]" t_udp_unconnected
run_test "dns[$PEER]" t_dns
run_test "dns_leaks[$PEER]" t_dns_leaks
run_test "ssh[$PEER]" t_ssh
run_test "shared[$PEER]" t_shared
run_test "root_stack[$PEER]" t_root_stack
run_test "stack_xdp[$PEER]" t_stack_xdp
run_test "python_clients[$PEER]" t_python_clients
run_test "iperf3[$PEER]" t_iperf3
run_test "nc[$PEER]" t_nc
run_test "tunnel_and_kernel[$PEER]" t_tunnel_and_kernel
run_test "refused[$PEER]" t_refused
run_test "lossy[$PEER]" t_lossy
run_test "static_go[$PEER]" t_static_go
run_test "leaks[$PEER]" t_leaks

echo "stack: $PASSED passed, $FAILED failed"
((FAILED == 0))
