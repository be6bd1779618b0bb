# Shared helpers of the interop suite: two hosts (network namespaces) joined by veth, a
# WireGuard implementation on each, configured through `wg` over the UAPI socket exactly as
# a user would. Sourced by interop.sh and by the demo.

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
ORDO="${ORDO:-$ROOT/target/release/ordo}"
WIREGUARD_GO="${WIREGUARD_GO:-$(go env GOPATH 2>/dev/null || echo "$HOME/go")/bin/wireguard}"
BORINGTUN="${BORINGTUN:-$(command -v boringtun-cli || echo "$HOME/.cargo/bin/boringtun-cli")}"
LOGDIR="${LOGDIR:-$(mktemp -d /tmp/ordo-interop.XXXXXX)}"

# Host A and host B. Outer addresses on the veth; inner addresses on the tunnel.
NS_A=ordo-a
NS_B=ordo-b
IF_A=wg-ordo-a
IF_B=wg-ordo-b
# A second interface in A, for the tests that need one.
IF_C=wg-ordo-c
# The fleet's failover tests: a second gateway and a router (see failover.sh).
NS_G2=ordo-g2
NS_R=ordo-r
OUT_A=10.77.0.1
OUT_B=10.77.0.2
OUT6_A=fd77::1
OUT6_B=fd77::2
IN_A=10.99.0.1
IN_B=10.99.0.2
IN6_A=fd99::1
IN6_B=fd99::2
PORT_A=51820
PORT_B=51821

log() { printf '%s\n' "$*" >&2; }

# Pipes end in `grep PATTERN >/dev/null`, never `grep -q`: grep -q quits at the first match,
# `ip` writes one line per write(2) and dies of SIGPIPE, and pipefail fails the test
# (CI failed that way once, on `ip rule` piped into a quiet grep). `make lint` refuses the
# pattern.

# Removes everything a test made: processes, namespaces, sockets.
teardown() {
    for ns in "$NS_A" "$NS_B" "$NS_G2" "$NS_R"; do
        if ip netns list | grep -w "$ns" >/dev/null; then
            ip netns pids "$ns" 2>/dev/null | xargs -r kill 2>/dev/null || true
        fi
    done
    for ns in "$NS_A" "$NS_B" "$NS_G2" "$NS_R"; do
        # Wait (bounded) for the daemons to exit before their namespace goes.
        for _ in $(seq 50); do
            [[ -z "$(ip netns pids "$ns" 2>/dev/null)" ]] && break
            sleep 0.1
        done
        ip netns del "$ns" 2>/dev/null || true
    done
    rm -f "/var/run/wireguard/$IF_A.sock" "/var/run/wireguard/$IF_B.sock" "/var/run/wireguard/$IF_C.sock"
}

# ns_cpu NS: CPU time (user + system, in clock ticks) of every process in a namespace.
ns_cpu() {
    local total=0 t pid
    for pid in $(ip netns pids "$1"); do
        t=$(awk '{print $14 + $15}' "/proc/$pid/stat" 2>/dev/null || echo 0)
        total=$((total + t))
    done
    echo "$total"
}

# Two namespaces joined by a veth pair with IPv4 and IPv6 outer addresses.
make_hosts() {
    teardown
    ip netns add "$NS_A"
    ip netns add "$NS_B"
    ip link add veth-a netns "$NS_A" type veth peer name veth-b netns "$NS_B"
    ip -n "$NS_A" addr add "$OUT_A/24" dev veth-a
    ip -n "$NS_B" addr add "$OUT_B/24" dev veth-b
    ip -n "$NS_A" addr add "$OUT6_A/64" dev veth-a nodad
    ip -n "$NS_B" addr add "$OUT6_B/64" dev veth-b nodad
    for ns in "$NS_A" "$NS_B"; do
        ip -n "$ns" link set lo up
    done
    ip -n "$NS_A" link set veth-a up
    ip -n "$NS_B" link set veth-b up
    # HOSTS_EXTRA: a command that adds to the hosts before the daemons start.
    [[ -z ${HOSTS_EXTRA:-} ]] || $HOSTS_EXTRA
}

# start_impl IMPL NS IFNAME: starts a userspace WireGuard implementation; returns once its
# UAPI socket answers (each implementation daemonizes only when ready).
# CPUS_A / CPUS_B (taskset lists), when set, confine that side's daemon to those CPUs.
start_impl() {
    local impl=$1 ns=$2 ifname=$3 cpus
    [[ $ns == "$NS_A" ]] && cpus=${CPUS_A:-} || cpus=${CPUS_B:-}
    local pin=() wrap=()
    [[ -n $cpus ]] && pin=(taskset -c "$cpus")
    # ORDO_WRAP: words run before Ordo's command (e.g. setpriv taking capabilities away).
    read -ra wrap <<<"${ORDO_WRAP:-}"
    case "$impl" in
        ordo) ORDO_LOG="$LOGDIR/$ifname.log" ip netns exec "$ns" "${pin[@]}" "${wrap[@]}" "$ORDO" "$ifname" ;;
        ordo-underload) ORDO_TEST_UNDER_LOAD=1 ORDO_LOG="$LOGDIR/$ifname.log" ip netns exec "$ns" "$ORDO" "$ifname" ;;
        wireguard-go) LOG_LEVEL=error ip netns exec "$ns" "${pin[@]}" "$WIREGUARD_GO" "$ifname" >"$LOGDIR/$ifname.log" 2>&1 ;;
        # Connected UDP sockets stay bound to the old source address, so boringtun could not
        # roam; unconnected sockets are what the other implementations use.
        boringtun) WG_SUDO=1 ip netns exec "$ns" "${pin[@]}" "$BORINGTUN" --disable-drop-privileges --disable-connected-udp \
            -l "$LOGDIR/$ifname.log" "$ifname" >/dev/null ;;
        *) log "unknown implementation $impl"; return 1 ;;
    esac
    wg show "$ifname" >/dev/null
}

# configure NS IFNAME PRIVKEY PORT PEER_PUB PEER_ENDPOINT PEER_ALLOWED [extra wg set args...]
configure() {
    local ns=$1 ifname=$2 key=$3 port=$4 peer=$5 endpoint=$6 allowed=$7
    shift 7
    local keyfile="$LOGDIR/$ifname.key"
    (umask 077 && echo "$key" >"$keyfile")
    local ep=()
    [[ -n "$endpoint" ]] && ep=(endpoint "$endpoint")
    ip netns exec "$ns" wg set "$ifname" private-key "$keyfile" listen-port "$port" \
        peer "$peer" "${ep[@]}" allowed-ips "$allowed" "$@"
}

# inner_addresses NS IFNAME V4 V6
inner_addresses() {
    ip -n "$1" addr add "$3/24" dev "$2"
    ip -n "$1" addr add "$4/64" dev "$2" nodad
    ip -n "$1" link set "$2" mtu 1420 up
}

genkey() { "$ORDO" genkey; }
pubkey() { echo "$1" | "$ORDO" pubkey; }

# tunnel IMPL_A IMPL_B [extra wg set args for both sides...]: a full tunnel between A and B,
# over IPv4 outer addresses, or IPv6 ones with OUTER_FAMILY=6.
# EXTRA_A / EXTRA_B (arrays) add peer arguments for one side only. Sets KEY_A KEY_B PUB_A PUB_B.
EXTRA_A=()
EXTRA_B=()
tunnel() {
    local impl_a=$1 impl_b=$2
    shift 2
    make_hosts
    KEY_A=$(genkey); KEY_B=$(genkey)
    PUB_A=$(pubkey "$KEY_A"); PUB_B=$(pubkey "$KEY_B")
    start_impl "$impl_a" "$NS_A" "$IF_A"
    start_impl "$impl_b" "$NS_B" "$IF_B"
    local ep_a="$OUT_A:$PORT_A" ep_b="$OUT_B:$PORT_B"
    if [[ ${OUTER_FAMILY:-4} == 6 ]]; then
        ep_a="[$OUT6_A]:$PORT_A" ep_b="[$OUT6_B]:$PORT_B"
    fi
    configure "$NS_A" "$IF_A" "$KEY_A" "$PORT_A" "$PUB_B" "$ep_b" "$IN_B/32,$IN6_B/128" "$@" "${EXTRA_A[@]}"
    configure "$NS_B" "$IF_B" "$KEY_B" "$PORT_B" "$PUB_A" "$ep_a" "$IN_A/32,$IN6_A/128" "$@" "${EXTRA_B[@]}"
    inner_addresses "$NS_A" "$IF_A" "$IN_A" "$IN6_A"
    inner_addresses "$NS_B" "$IF_B" "$IN_B" "$IN6_B"
}

# threads_dropped PID: every thread of process PID has dropped its privileges as the daemon
# does (capabilities and no_new_privs are each thread's own): only CAP_NET_BIND_SERVICE and
# CAP_NET_ADMIN, in the effective, permitted and bounding sets, no_new_privs, nobody's uid.
# Prints the threads that have not.
threads_dropped() {
    local task bad=0 f
    for task in /proc/"$1"/task/*; do
        f=$(awk '$1 ~ /^(CapEff|CapPrm|CapBnd|NoNewPrivs|Uid):$/ {printf "%s%s ", $1, $2}' "$task/status")
        if [[ $f != "Uid:$(id -u nobody) CapPrm:0000000000001400 CapEff:0000000000001400 CapBnd:0000000000001400 NoNewPrivs:1 " ]]; then
            echo "$(cat "$task/comm"): $f"
            bad=1
        fi
    done
    return $bad
}

# dump_field IFNAME FIELD: a field of the single peer in `wg show IF dump`
# (endpoint, handshake, rx, tx, keepalive).
dump_field() {
    local col
    case "$2" in
        endpoint) col=3 ;; handshake) col=5 ;; rx) col=6 ;; tx) col=7 ;; keepalive) col=8 ;;
    esac
    wg show "$1" dump | sed -n 2p | cut -f"$col"
}

# ordo_counter IFNAME NAME: one of Ordo's own counters (see `ordo show`).
ordo_counter() {
    "$ORDO" show "$1" --json | python3 -c "import json,sys; print(json.load(sys.stdin)[0]['counters']['$2'])"
}
