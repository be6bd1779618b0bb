# shellcheck shell=bash
# Configuration and privileges: an atomic `wg set`, wg-quick files through `ordo up`, a default
# route with its fwmark rules, the privilege drop and its flags.
# Sourced by interop.sh, whose helpers (run_test, fail, ping_ok) and lib.sh's it uses.

# A `wg set` that cannot be carried out changes nothing: a new listen port that is
# in use, asked for with a new fwmark and a new peer, fails with the protocol's errno and
# leaves the port, the mark and the peers as they were; the same port with a new mark changes
# the mark alone; the tunnel works throughout.
t_set_atomic() {
    tunnel ordo wireguard-go
    ping_ok "$NS_A" "$IN_B" || fail "ping"
    ip netns exec "$NS_A" python3 -c "
import socket, time
s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM); s.bind(('0.0.0.0', 5999)); time.sleep(30)" &
    local holder=$!
    for _ in $(seq 50); do ip netns exec "$NS_A" ss -lun | grep ':5999 ' >/dev/null && break; sleep 0.1; done
    local other
    other=$(genkey | "$ORDO" pubkey)
    ip netns exec "$NS_A" wg set "$IF_A" listen-port 5999 fwmark 0x77 peer "$other" allowed-ips 10.55.0.0/24 \
        2>"$LOGDIR/set.err" && fail "a listen port in use was taken"
    grep -i "address already in use" "$LOGDIR/set.err" >/dev/null || fail "not EADDRINUSE: $(cat "$LOGDIR/set.err")"
    [[ $(wg show "$IF_A" fwmark) == off ]] || fail "the fwmark changed: $(wg show "$IF_A" fwmark)"
    [[ $(wg show "$IF_A" listen-port) == "$PORT_A" ]] || fail "the port changed: $(wg show "$IF_A" listen-port)"
    [[ $(wg show "$IF_A" peers | wc -l) == 1 ]] || fail "the new peer was added: $(wg show "$IF_A" peers)"
    ping_ok "$NS_A" "$IN_B" || fail "ping after the refused set"
    ip netns exec "$NS_A" wg set "$IF_A" listen-port "$PORT_A" fwmark 0x78 || fail "the same port with a new mark"
    [[ $(wg show "$IF_A" fwmark) == 0x78 ]] || fail "the mark: $(wg show "$IF_A" fwmark)"
    ping_ok "$NS_A" "$IN_B" || fail "ping after the new mark"
    kill "$holder" 2>/dev/null || true
}

# wg setconf / showconf / syncconf, and wg-quick with WG_QUICK_USERSPACE_IMPLEMENTATION=ordo
# on one side against `ordo up` on the other.
t_config() {
    make_hosts
    KEY_A=$(genkey); KEY_B=$(genkey); PUB_A=$(pubkey "$KEY_A"); PUB_B=$(pubkey "$KEY_B")
    local extra
    extra=$(genkey | "$ORDO" pubkey)
    local dir=$LOGDIR/conf
    mkdir -p "$dir" && chmod 700 "$dir"
    (umask 077
    cat >"$dir/$IF_A.conf" <<EOF
[Interface]
PrivateKey = $KEY_A
ListenPort = $PORT_A
Address = $IN_A/24, $IN6_A/64
PostUp = touch $dir/postup-%i

[Peer]
PublicKey = $PUB_B
Endpoint = $OUT_B:$PORT_B
AllowedIPs = $IN_B/32, $IN6_B/128
EOF
    cat >"$dir/$IF_B.conf" <<EOF
[Interface]
PrivateKey = $KEY_B
ListenPort = $PORT_B
Address = $IN_B/24, $IN6_B/64

[Peer]
PublicKey = $PUB_A
Endpoint = $OUT_A:$PORT_A
AllowedIPs = $IN_A/32, $IN6_A/128

[Peer]
PublicKey = $extra
AllowedIPs = 10.99.0.50/32
EOF
    )
    ORDO_LOG=$LOGDIR/up.log ip netns exec "$NS_A" "$ORDO" up "$dir/$IF_A.conf" || fail "ordo up"
    [[ -e "$dir/postup-$IF_A" ]] || fail "PostUp did not run with %i expanded"
    ip netns exec "$NS_B" env WG_QUICK_USERSPACE_IMPLEMENTATION="$ORDO" ORDO_LOG="$LOGDIR/wgquick.log" \
        wg-quick up "$dir/$IF_B.conf" >"$LOGDIR/wg-quick-up.txt" 2>&1 || fail "wg-quick up: $(cat "$LOGDIR/wg-quick-up.txt")"
    ping_ok "$NS_A" "$IN_B" || fail "ping over ordo up / wg-quick"
    ping_ok "$NS_B" "$IN6_A" || fail "IPv6 ping over ordo up / wg-quick"
    # showconf returns what setconf was given.
    wg showconf "$IF_B" >"$dir/shown.conf"
    grep -q "PublicKey = $extra" "$dir/shown.conf" || fail "showconf lacks the second peer"
    # syncconf with the second peer removed drops it and keeps the first (and its session).
    printf '[Interface]\nPrivateKey = %s\nListenPort = %s\n\n[Peer]\nPublicKey = %s\nEndpoint = %s\nAllowedIPs = %s\n' \
        "$KEY_B" "$PORT_B" "$PUB_A" "$OUT_A:$PORT_A" "$IN_A/32, $IN6_A/128" >"$dir/sync.conf"
    wg syncconf "$IF_B" "$dir/sync.conf" || fail "wg syncconf"
    [[ $(wg show "$IF_B" peers | wc -l) -eq 1 ]] || fail "syncconf left $(wg show "$IF_B" peers | wc -l) peers"
    ping_ok "$NS_B" "$IN_A" || fail "ping after syncconf"
    # A bad request is refused with the protocol's errno and changes nothing.
    ! wg set "$IF_B" listen-port 1 peer "$PUB_A" allowed-ips 300.1.1.1/32 2>/dev/null || fail "bad allowed-ip accepted"
    [[ $(wg show "$IF_B" listen-port) == "$PORT_B" ]] || fail "a refused request changed the port"
    ip netns exec "$NS_B" wg-quick down "$dir/$IF_B.conf" >/dev/null 2>&1 || fail "wg-quick down"
    ip netns exec "$NS_A" "$ORDO" down "$dir/$IF_A.conf" || fail "ordo down"
    ! ip -n "$NS_A" link show "$IF_A" >/dev/null 2>&1 || fail "interface still there after ordo down"
    [[ ! -e /var/run/wireguard/$IF_A.sock && ! -e /var/run/wireguard/$IF_B.sock ]] || fail "UAPI sockets left behind"
    # A config error names the file, the line and the reason.
    printf '[Interface]\nPrivateKey = %s\nListenPort = 70000\n' "$KEY_A" >"$dir/bad.conf"
    chmod 600 "$dir/bad.conf"
    local msg
    msg=$("$ORDO" up "$dir/bad.conf" 2>&1) && fail "a bad config was accepted"
    [[ "$msg" == *"$dir/bad.conf:3: ListenPort"* ]] || fail "unclear config error: $msg"
}

# `ordo up` with AllowedIPs = 0.0.0.0/0: wg-quick's fwmark and policy rules send everything
# but the tunnel's own packets into the tunnel; `ordo down` removes the rules.
t_default_route() {
    make_hosts
    KEY_A=$(genkey); KEY_B=$(genkey); PUB_A=$(pubkey "$KEY_A"); PUB_B=$(pubkey "$KEY_B")
    start_impl "$1" "$NS_B" "$IF_B"
    configure "$NS_B" "$IF_B" "$KEY_B" "$PORT_B" "$PUB_A" "" "$IN_A/32"
    inner_addresses "$NS_B" "$IF_B" "$IN_B" "$IN6_B"
    # Only reachable through the tunnel: A has no route to it but the default one.
    ip -n "$NS_B" addr add 10.200.0.1/32 dev lo
    local conf=$LOGDIR/$IF_A.conf
    (umask 077; printf '[Interface]\nPrivateKey = %s\nAddress = %s/24\n\n[Peer]\nPublicKey = %s\nEndpoint = %s:%s\nAllowedIPs = 0.0.0.0/0\n' \
        "$KEY_A" "$IN_A" "$PUB_B" "$OUT_B" "$PORT_B" >"$conf")
    ORDO_LOG=$LOGDIR/up.log ip netns exec "$NS_A" "$ORDO" up "$conf" || fail "ordo up"
    ip netns exec "$NS_A" ip rule | grep "not from all fwmark 0xca6c lookup 51820" >/dev/null || fail "no fwmark rule: $(ip netns exec "$NS_A" ip rule)"
    [[ $(wg show "$IF_A" fwmark) == 0xca6c ]] || fail "the tunnel's packets are not marked"
    ping_ok "$NS_A" 10.200.0.1 || fail "ping through the default route"
    # CVE-2019-14899: B, on A's outer network, sends to A's tunnel address over the veth
    # (not through the tunnel): wg-quick's nftables rule drops it.
    ip netns exec "$NS_A" nft list table ip "wg-quick-$IF_A" | grep "fib saddr type != local drop" >/dev/null \
        || fail "no nftables guard: $(ip netns exec "$NS_A" nft list ruleset)"
    ip -n "$NS_B" route add "$IN_A/32" via "$OUT_A" dev veth-b
    ip netns exec "$NS_B" ping -q -c 2 -W 1 "$IN_A" >/dev/null && fail "A's tunnel address answered from the outside"
    ip netns exec "$NS_A" "$ORDO" down "$conf" || fail "ordo down"
    ! ip netns exec "$NS_A" ip rule | grep 51820 >/dev/null || fail "rules left behind"
    ! ip netns exec "$NS_A" nft list tables | grep "wg-quick-$IF_A" >/dev/null || fail "nftables table left behind"
}

# The daemon keeps only CAP_NET_ADMIN and CAP_NET_BIND_SERVICE once running.
t_privileges() {
    tunnel ordo ordo
    local pid janitor
    pid=$(pgrep -o -f -- "--foreground .*$IF_A\$")
    janitor=$(pgrep -f "ordo uapi-janitor /var/run/wireguard/$IF_A.sock")
    status_field() { awk -v f="$2:" '$1 == f {print $2}' "/proc/$1/status"; }
    # CAP_NET_BIND_SERVICE (10) and CAP_NET_ADMIN (12), as nobody, no_new_privs.
    [[ $(status_field "$pid" CapEff) == 0000000000001400 ]] || fail "effective capabilities $(status_field "$pid" CapEff)"
    [[ $(status_field "$pid" CapBnd) == 0000000000001400 ]] || fail "bounding set $(status_field "$pid" CapBnd)"
    [[ $(status_field "$pid" Uid) == "$(id -u nobody)" ]] || fail "uid $(status_field "$pid" Uid), not nobody's"
    [[ $(status_field "$pid" Gid) == "$(id -g nobody)" ]] || fail "gid $(status_field "$pid" Gid), not nobody's group"
    [[ $(status_field "$pid" NoNewPrivs) == 1 ]] || fail "no_new_privs not set"
    threads_dropped "$pid" >"$LOGDIR/threads.txt" || fail "threads that kept privileges: $(cat "$LOGDIR/threads.txt")"
    # The janitor: root's uid for the socket's folder, and nothing else.
    [[ $(status_field "$janitor" CapBnd) == 0000000000000000 ]] || fail "janitor's bounding set $(status_field "$janitor" CapBnd)"
    [[ $(status_field "$janitor" CapPrm) == 0000000000000000 ]] || fail "janitor's capabilities $(status_field "$janitor" CapPrm)"
    [[ $(ls "/proc/$janitor/fd" | wc -l) == 3 ]] || fail "the janitor holds more than its pipe and stdio: $(ls -l "/proc/$janitor/fd")"
    ping_ok "$NS_A" "$IN_B" || fail "ping"
    # What the kept capabilities are for still works as nobody: a listen port below 1024
    # (the peer follows the new endpoint once A speaks) and a fwmark.
    ip netns exec "$NS_A" wg set "$IF_A" listen-port 500 fwmark 0x51 || fail "wg set listen-port 500 fwmark"
    [[ $(ip netns exec "$NS_A" wg show "$IF_A" listen-port) == 500 ]] || fail "listen port not 500"
    ip netns exec "$NS_A" ss -lun | grep ':500 ' >/dev/null || fail "nothing bound to port 500"
    ping_ok "$NS_A" "$IN_B" || fail "ping after the port change"
    # Its end: the socket (root's folder) is removed by the janitor, which then exits too.
    ip -n "$NS_A" link del "$IF_A"
    gone_within "$pid" 3 || fail "still running 3 s after its interface was deleted"
    stopped_cleanly "$IF_A"
    gone_within "$janitor" 1 || fail "the janitor outlived the daemon"
}

# --user root keeps uid 0 without the other capabilities; --keep-privileges keeps all.
t_privileges_flags() {
    make_hosts
    ORDO_LOG="$LOGDIR/$IF_A.log" ip netns exec "$NS_A" "$ORDO" --user root "$IF_A"
    local pid
    pid=$(pgrep -o -f -- "--foreground --user root .*$IF_A\$")
    [[ $(awk '/^Uid:/ {print $2}' "/proc/$pid/status") == 0 ]] || fail "--user root: not uid 0"
    [[ $(awk '/^CapEff:/ {print $2}' "/proc/$pid/status") == 0000000000001400 ]] || fail "--user root: capabilities"
    ip netns exec "$NS_A" "$ORDO" --user no-such-user-ordo "${IF_A}x" 2>"$LOGDIR/nouser.txt" && fail "an unknown user was accepted"
    grep "no user named no-such-user-ordo" "$LOGDIR/nouser.txt" >/dev/null || fail "unclear error: $(cat "$LOGDIR/nouser.txt")"
    [[ ! -e "/var/run/wireguard/${IF_A}x.sock" ]] || fail "a socket left by the refused start"
    ip -n "$NS_A" link show "${IF_A}x" >/dev/null 2>&1 && fail "an interface left by the refused start"
    true
}
