# shellcheck shell=bash
# Floods (short versions of scripts/flood.sh): handshakes, random datagrams, replays.
# Sourced by interop.sh, whose helpers (run_test, fail, ping_ok) and lib.sh's it uses.

# Ordo in A as a server for FLOOD_CLIENTS + 1 load-generator clients (the last one is the
# session the replay flood replays); the flood's four source addresses on B.
FLOOD_CLIENTS=4
FLOOD_SOURCES=10.77.0.10,10.77.0.11,10.77.0.12,10.77.0.13
flood_server() {
    make_hosts
    start_impl ordo "$NS_A" "$IF_A"
    "$ORDO" loadgen setup --clients "$((FLOOD_CLIENTS + 1))" --listen-port "$PORT_A" >"$LOGDIR/server.conf"
    ip netns exec "$NS_A" wg setconf "$IF_A" "$LOGDIR/server.conf"
    ip -n "$NS_A" addr add 10.200.0.1/16 dev "$IF_A"
    ip -n "$NS_A" link set "$IF_A" mtu 1420 up
    local a
    for a in ${FLOOD_SOURCES//,/ }; do ip -n "$NS_B" addr add "$a/24" dev veth-b; done
}

# flood ARGS...: `ordo loadgen flood` from B at the server, as JSON.
flood() {
    ip netns exec "$NS_B" "$ORDO" loadgen flood --server "$OUT_A:$PORT_A" --bind "$FLOOD_SOURCES" --json "$@"
}

# rss: the server's resident memory in kB.
rss() { awk '/^VmRSS/ {print $2}' "/proc/$(ip netns pids "$NS_A" | sed -n 1p)/status"; }

# Initiations with a valid mac1 from four sources: cookie replies at the sources' rate and no
# more, new clients through in one cookie round, memory flat.
t_flood_handshake() {
    flood_server
    local rss0 rss1 cookies0
    rss0=$(rss)
    cookies0=$(ordo_counter "$IF_A" cookie_replies_sent)
    flood --kind initiation --rate 20000 --duration 8 >"$LOGDIR/flood.json" &
    local flooder=$!
    sleep 1
    ip netns exec "$NS_B" "$ORDO" loadgen run --clients "$FLOOD_CLIENTS" --server "$OUT_A:$PORT_A" \
        --sink-netns "$NS_A" --json --duration 1 --rate 10 --handshake-timeout 6.5 >"$LOGDIR/new.json" ||
        fail "the new clients' run failed"
    wait $flooder || fail "the flood failed"
    rss1=$(rss)
    python3 - "$LOGDIR" "$(( $(ordo_counter "$IF_A" cookie_replies_sent) - cookies0 ))" \
        "$(ordo_counter "$IF_A" drop_rate_limited)" "$rss0" "$rss1" <<'EOF' || fail "see above"
import json, sys
d, cookies, limited, rss0, rss1 = sys.argv[1], *map(int, sys.argv[2:])
flood, new = json.load(open(f"{d}/flood.json")), json.load(open(f"{d}/new.json"))
print(f"    sent {flood['sent']}, cookie replies {cookies}, rate limited {limited}, "
      f"new clients up {new['clients_up']} in {new['handshake_seconds']:.1f} s, RSS {rss0} -> {rss1} kB", file=sys.stderr)
# Four sources: a burst of 64 and 100 a second each, over the flood's 8 s (and the new
# clients' own, one per client and retry).
assert 0 < cookies <= 4 * (64 + 100 * 9) + 16, cookies
assert limited >= flood["sent"] - cookies - 300, "the rest was refused"
assert new["clients_up"] == new["clients"], "every new client completed its handshake"
assert rss1 < rss0 + 20_000, "memory flat"
EOF
}

# Random datagrams of every type and length: every one dropped and counted once by reason
# (the kernel's own drops included), the tunnel's clients unharmed.
t_flood_random() {
    flood_server
    flood --kind random --rate 20000 --duration 3 >"$LOGDIR/flood.json" || fail "the flood failed"
    local counters
    # Counted once the last datagram was read: wait (bounded) for the total to settle.
    for _ in $(seq 20); do
        counters=$("$ORDO" show "$IF_A" --json)
        sleep 0.2
        [[ $counters == "$("$ORDO" show "$IF_A" --json)" ]] && break
    done
    echo "$counters" >"$LOGDIR/counters.json"
    python3 - "$LOGDIR/flood.json" "$LOGDIR/counters.json" <<'EOF' || fail "see above"
import json, sys
c = json.load(open(sys.argv[2]))[0]["counters"]
sent = json.load(open(sys.argv[1]))["sent"]
drops = {k: v for k, v in c.items() if k.startswith("drop_") and v and k != "drop_no_route"}
print(f"    sent {sent}, dropped {sum(drops.values())}: {drops}", file=sys.stderr)
assert sum(drops.values()) == sent, "each datagram dropped once"
assert {"drop_malformed", "drop_bad_mac1", "drop_unknown_receiver", "drop_unexpected_handshake"} <= drops.keys()
EOF
    ip netns exec "$NS_B" "$ORDO" loadgen run --clients "$FLOOD_CLIENTS" --server "$OUT_A:$PORT_A" \
        --sink-netns "$NS_A" --json --duration 1 --rate 10 --handshake-timeout 10 | python3 -c "
import json, sys; r = json.load(sys.stdin); sys.exit(r['clients_up'] != r['clients'])" || fail "clients after the flood"
}

# Replays of a real session's data messages: each refused as a replay, none delivered.
t_flood_replay() {
    flood_server
    local key rx0 rx1
    key=$(awk '/^PublicKey/ {k = $3} END {print k}' "$LOGDIR/server.conf")
    flood --kind replay --as-client "$FLOOD_CLIENTS" --rate 20000 --duration 3 >"$LOGDIR/flood.json" ||
        fail "the flood failed"
    sleep 0.5
    rx1=$(ip netns exec "$NS_A" wg show "$IF_A" dump | awk -v k="$key" '$1 == k {print $6}')
    python3 - "$LOGDIR/flood.json" "$rx1" "$(ordo_counter "$IF_A" drop_replay)" <<'EOF' || fail "see above"
import json, sys
f = json.load(open(sys.argv[1]))
rx, replays = int(sys.argv[2]), int(sys.argv[3])
print(f"    captured {f['captured']}, replayed {f['sent']}, refused as replays {replays}, "
      f"accepted from the client {rx} B (initiation 148 + captured {f['captured_bytes']})", file=sys.stderr)
assert f["captured"] > 0
assert rx == 148 + f["captured_bytes"], "no replay accepted"
assert replays == f["sent"], "each replay refused as one"
EOF
}
