# shellcheck shell=bash
# Servers under `ordo run`: bound to the tunnel address, and bound to every address.
# Sourced by stack.sh, whose helpers (setup, as_user, ordo_run, run_test) and lib.sh's it uses.

# A server under `ordo run`: python's http.server bound to the tunnel address, reached from
# the far end by curl (twice, and by two clients at once); nc listening, fed from the far end.
t_servers() {
    setup
    # A keepalive: A's interface makes the handshake as soon as it is up, so that the far
    # end's first connection does not wait out a handshake lost to an interface not up yet.
    sed -i '/^AllowedIPs/a PersistentKeepalive = 25' "$CONF"
    mkdir -p "$WORK/www"
    head -c 5M /dev/urandom >"$WORK/www/blob"
    chmod -R a+rX "$WORK/www"
    as_user "$ORDO" run -c "$CONF" -- "$PY" -m http.server 8080 --bind "$IN_A" --directory "$WORK/www" \
        >"$LOGDIR/served.log" 2>&1 &
    local server=$! want got
    want=$(sha256sum <"$WORK/www/blob" | cut -d' ' -f1)
    for _ in $(seq 50); do
        ip netns exec "$NS_B" curl -s -o /dev/null --max-time 1 "http://$IN_A:8080/" && break
        sleep 0.2
    done
    for i in 1 2; do
        got=$(ip netns exec "$NS_B" curl -sS --max-time 30 "http://$IN_A:8080/blob" | sha256sum | cut -d' ' -f1)
        [[ $got == "$want" ]] || fail "download $i from the server under ordo run differs"
    done
    ip netns exec "$NS_B" curl -sS --max-time 30 -o "$WORK/c1" "http://$IN_A:8080/blob" &
    ip netns exec "$NS_B" curl -sS --max-time 30 -o "$WORK/c2" "http://$IN_A:8080/blob"
    wait %2 2>/dev/null || true
    for c in c1 c2; do
        [[ $(sha256sum <"$WORK/$c" | cut -d' ' -f1) == "$want" ]] || fail "concurrent download $c differs"
    done
    grep "^$IN_B " "$LOGDIR/served.log" >/dev/null || fail "the server did not see the far end's address"
    # One interface per listen port: the next `ordo run` takes it over.
    pkill -f -- "-m http.server 8080" || true
    wait $server 2>/dev/null || true
    # nc listening on the tunnel address under ordo run, a file sent from the far end.
    head -c 1M /dev/urandom >"$WORK/nc.in"
    as_user "$ORDO" run -c "$CONF" -- nc -l -N "$IN_A" 7001 >"$WORK/nc.out" &
    local srv=$!
    # No probe first (nc -l takes one connection): the sender tries until the listener is up.
    for _ in $(seq 50); do
        ip netns exec "$NS_B" nc -N -w 10 "$IN_A" 7001 <"$WORK/nc.in" 2>/dev/null && break
        sleep 0.2
    done
    wait $srv || true
    cmp "$WORK/nc.in" "$WORK/nc.out" || fail "nc listening: bytes differ"
}

# Servers bound to every address under `ordo run` listen on the tunnel's addresses and the
# host's at once, as they would with a kernel tunnel device. python's http.server binds
# 0.0.0.0 by default, and with `--bind ::` an IPv6 socket taking IPv4 too. The far end
# reaches each through the tunnel (IPv4, and IPv6 for ::) and, in the same run, through the
# veth (B to A's veth address); A's loopback reaches them; each server sees each client's
# own address. nc listening on every address takes a connection through the tunnel.
t_wildcard_server() {
    setup
    # A keepalive: A's interface makes the handshake as soon as it is up, so that the far
    # end's first connection does not wait out a handshake lost to an interface not up yet.
    sed -i '/^AllowedIPs/a PersistentKeepalive = 25' "$CONF"
    mkdir -p "$WORK/www"
    head -c 2M /dev/urandom >"$WORK/www/blob"
    chmod -R a+rX "$WORK/www"
    local want
    want=$(sha256sum <"$WORK/www/blob" | cut -d' ' -f1)
    (cd "$WORK/www" && as_user "$ORDO" run -c "$CONF" -- sh -c "
        $PY -m http.server 8090 >$OUT/any4.log 2>&1 & $PY -m http.server 8091 --bind :: >$OUT/any6.log 2>&1; wait") &
    local server=$!
    local port
    for port in 8090 8091; do
        for _ in $(seq 50); do
            ip netns exec "$NS_B" curl -s -o /dev/null --max-time 1 "http://$IN_A:$port/" && break
            sleep 0.2
        done
    done
    local url got
    for url in "$NS_B http://$IN_A:8090/blob" "$NS_B http://$OUT_A:8090/blob" "$NS_A http://127.0.0.1:8090/blob" \
        "$NS_B http://$IN_A:8091/blob" "$NS_B http://[$IN6_A]:8091/blob" "$NS_B http://$OUT_A:8091/blob" \
        "$NS_A http://[::1]:8091/blob"; do
        got=$(ip netns exec ${url%% *} curl -sS --max-time 30 "${url#* }" | sha256sum | cut -d' ' -f1)
        [[ $got == "$want" ]] || fail "download from ${url#* } in ${url%% *} differs"
    done
    ! ip netns exec "$NS_B" curl -s -o /dev/null --max-time 5 "http://[$IN6_A]:8090/" ||
        fail "the IPv4 server answered over IPv6"
    local client
    for client in "any4 $IN_B" "any4 $OUT_B" "any4 127.0.0.1" \
        "any6 $IN_B" "any6 $OUT_B" "any6 $IN6_B" "any6 ::1"; do
        grep -E "^(::ffff:)?${client#* } - .*GET /blob" "$OUT/${client%% *}.log" >/dev/null ||
            fail "the server on ${client%% *} did not see ${client#* }"
    done
    pkill -f -- "-m http.server 809" || true
    wait $server 2>/dev/null || true
    # nc listening on every address (a blocking accept), fed from the far end through the
    # tunnel.
    head -c 1M /dev/urandom >"$WORK/nc.in"
    as_user "$ORDO" run -c "$CONF" -- nc -l -N 7003 >"$WORK/nc.out" &
    local srv=$!
    for _ in $(seq 50); do
        ip netns exec "$NS_B" nc -N -w 10 "$IN_A" 7003 <"$WORK/nc.in" 2>/dev/null && break
        sleep 0.2
    done
    wait $srv || true
    cmp "$WORK/nc.in" "$WORK/nc.out" || fail "nc listening on every address: bytes differ"
}
