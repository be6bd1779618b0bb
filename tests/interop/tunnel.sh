# shellcheck shell=bash
# The tunnel with each peer: handshakes both ways, bulk data byte for byte, preshared keys,
# roaming, keepalives, rekeying, cookies under load, bad input and the kernel's own drops.
# Sourced by interop.sh, whose helpers (run_test, fail, ping_ok) and lib.sh's it uses.

# Ordo starts the handshake; IPv4 and IPv6 cross in both directions.
t_ordo_initiates() {
    tunnel ordo "$1"
    ping_ok "$NS_A" "$IN_B" || fail "IPv4 ping A->B"
    ping_ok "$NS_A" "$IN6_B" || fail "IPv6 ping A->B"
    ping_ok "$NS_B" "$IN_A" || fail "IPv4 ping B->A"
    ping_ok "$NS_B" "$IN6_A" || fail "IPv6 ping B->A"
    [[ $(ordo_counter "$IF_A" handshakes_initiated) -ge 1 ]] || fail "Ordo did not initiate"
    [[ $(dump_field "$IF_A" handshake) -gt 0 ]] || fail "no handshake time in wg show"
}

# The peer starts the handshake; Ordo only responds.
t_peer_initiates() {
    tunnel ordo "$1"
    ping_ok "$NS_B" "$IN_A" || fail "IPv4 ping B->A"
    ping_ok "$NS_B" "$IN6_A" || fail "IPv6 ping B->A"
    ping_ok "$NS_A" "$IN_B" || fail "IPv4 ping A->B"
    [[ $(ordo_counter "$IF_A" handshakes_initiated) -eq 0 ]] || fail "Ordo initiated although the peer did"
    [[ $(ordo_counter "$IF_A" handshakes_completed) -ge 1 ]] || fail "no completed handshake"
}

# iperf3_bytes NS_CLIENT SERVER_ADDR [-R]: a 5-second TCP transfer; prints the bytes the
# receiving side got.
iperf3_bytes() {
    local out
    ip netns exec "$NS_B" iperf3 -s -1 -p 5201 >/dev/null 2>&1 &
    local srv=$!
    for _ in $(seq 50); do
        ip netns exec "$NS_B" ss -ltn | grep ':5201 ' >/dev/null && break
        sleep 0.1
    done
    out=$(ip netns exec "$1" iperf3 -c "$2" -p 5201 -t 5 -J "${@:3}") || { kill $srv 2>/dev/null; return 1; }
    wait $srv 2>/dev/null
    echo "$out" | python3 -c "import json,sys; print(int(json.load(sys.stdin)['end']['sum_received']['bytes']))"
}

# check_counted PEER WHAT PAYLOAD SENDER_DELTA RECEIVER_DELTA: each end counted at least the
# payload and at most payload plus overhead and retransmissions; ends that count the same
# thing (UDP payloads: Ordo, wireguard-go) agree within 2%. boringtun counts decrypted inner
# packets instead, and loses packets above its ~0.5 Gbit/s, so only the bounds apply to it.
check_counted() {
    python3 - "$@" <<'EOF'
import sys
peer, what = sys.argv[1:3]
payload, sent, received = map(int, sys.argv[3:])
bounded = all(payload <= c <= payload * 1.4 + 2_000_000 for c in (sent, received))
agree = peer == "boringtun" or abs(sent - received) <= 0.02 * sent
ok = bounded and agree
print(f"    {what}: payload {payload} B, sender counted {sent} B, receiver counted {received} B", file=sys.stderr)
sys.exit(0 if ok else 1)
EOF
}

# A 5-second TCP transfer each way; the bytes match the transfer counters on both sides.
t_iperf3() {
    tunnel ordo "$1"
    ping_ok "$NS_A" "$IN_B" || fail "ping"
    local tx0 rx0 ptx0 prx0 n
    tx0=$(dump_field "$IF_A" tx); prx0=$(dump_field "$IF_B" rx)
    n=$(iperf3_bytes "$NS_A" "$IN_B") || fail "iperf3 A->B"
    check_counted "$1" "A->B" "$n" $(($(dump_field "$IF_A" tx) - tx0)) $(($(dump_field "$IF_B" rx) - prx0)) || fail "A->B counters"
    rx0=$(dump_field "$IF_A" rx); ptx0=$(dump_field "$IF_B" tx)
    n=$(iperf3_bytes "$NS_A" "$IN_B" -R) || fail "iperf3 B->A"
    check_counted "$1" "B->A" "$n" $(($(dump_field "$IF_B" tx) - ptx0)) $(($(dump_field "$IF_A" rx) - rx0)) || fail "B->A counters"
}

# tcp_sha256 NS_SERVER ADDR NS_CLIENT: 64 MB of pseudo-random bytes over one TCP connection;
# prints "sent-digest received-digest".
tcp_sha256() {
    local out=$LOGDIR/received.sha
    ip netns exec "$1" python3 - "$2" >"$out" <<'EOF2' &
import hashlib, socket, sys
s = socket.socket(socket.AF_INET6 if ":" in sys.argv[1] else socket.AF_INET)
s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
s.bind((sys.argv[1], 5555)); s.listen(1); s.settimeout(30)
c, _ = s.accept(); c.settimeout(30); h = hashlib.sha256()
while (b := c.recv(1 << 16)):
    h.update(b)
print(h.hexdigest())
EOF2
    local srv=$!
    for _ in $(seq 50); do ip netns exec "$1" ss -ltn | grep ':5555 ' >/dev/null && break; sleep 0.1; done
    local sent
    sent=$(ip netns exec "$3" python3 - "$2" <<'EOF2'
import hashlib, random, socket, sys
s = socket.create_connection((sys.argv[1], 5555), timeout=30); h = hashlib.sha256(); r = random.Random(7)
for _ in range(1024):
    chunk = r.randbytes(1 << 16); h.update(chunk); s.sendall(chunk)
s.close(); print(h.hexdigest())
EOF2
)
    wait $srv
    echo "$sent $(cat "$out")"
}

# Bulk TCP arrives byte for byte in both directions. Coalesced writes to the TUN device are
# marked checksum-partial, so the kernel would not catch a coalescing mistake: this does.
t_integrity() {
    tunnel ordo "$1"
    ping_ok "$NS_A" "$IN_B" || fail "ping"
    local r
    r=$(tcp_sha256 "$NS_A" "$IN_A" "$NS_B")
    [[ -n "${r%% *}" && "${r%% *}" == "${r##* }" ]] || fail "into Ordo: sent and received digests differ: $r"
    r=$(tcp_sha256 "$NS_B" "$IN_B" "$NS_A")
    [[ -n "${r%% *}" && "${r%% *}" == "${r##* }" ]] || fail "out of Ordo: sent and received digests differ: $r"
    r=$(tcp_sha256 "$NS_A" "$IN6_A" "$NS_B")
    [[ -n "${r%% *}" && "${r%% *}" == "${r##* }" ]] || fail "into Ordo over IPv6: digests differ: $r"
    [[ $(ordo_counter "$IF_A" tun_coalesced_packets) -gt 0 ]] || fail "nothing was coalesced"
}

# A shared pre-shared key works; a mismatched one never completes a handshake.
t_psk() {
    local psk=$LOGDIR/psk other=$LOGDIR/psk-other
    (umask 077; "$ORDO" genkey >"$psk"; "$ORDO" genkey >"$other")
    tunnel ordo "$1" preshared-key "$psk"
    ping_ok "$NS_A" "$IN_B" || fail "ping with a shared psk"
    wg show "$IF_A" preshared-keys | grep "$(cat "$psk")" >/dev/null || fail "psk not shown by wg"
    # Each test runs in a subshell, so these do not leak into the next one.
    EXTRA_A=(preshared-key "$psk")
    EXTRA_B=(preshared-key "$other")
    tunnel ordo "$1"
    ! ip netns exec "$NS_A" ping -q -c 1 -w 3 "$IN_B" >/dev/null || fail "ping crossed with mismatched psks"
    [[ $(ordo_counter "$IF_A" handshakes_completed) -eq 0 ]] || fail "a handshake completed with mismatched psks"
}

# move_outer NS DEV OLD NEW: the host changes its outer IPv4 address.
move_outer() {
    # Without promote_secondaries, deleting the old (primary) address deletes the new one too.
    ip netns exec "$1" sysctl -qw "net.ipv4.conf.$2.promote_secondaries=1"
    ip -n "$1" addr add "$4/24" dev "$2"
    ip -n "$1" addr del "$3/24" dev "$2"
}

# Either side changes its outer address; the other follows it and traffic resumes.
t_roaming() {
    tunnel ordo "$1"
    ping_ok "$NS_A" "$IN_B" || fail "initial ping"
    move_outer "$NS_B" veth-b "$OUT_B" 10.77.0.3
    ping_ok "$NS_B" "$IN_A" || fail "ping from the peer's new address"
    [[ $(dump_field "$IF_A" endpoint) == "10.77.0.3:$PORT_B" ]] || fail "Ordo did not follow the peer: $(dump_field "$IF_A" endpoint)"
    ping_ok "$NS_A" "$IN_B" || fail "ping to the peer's new address"
    move_outer "$NS_A" veth-a "$OUT_A" 10.77.0.4
    ping_ok "$NS_A" "$IN_B" || fail "ping from Ordo's new address"
    [[ $(dump_field "$IF_B" endpoint) == "10.77.0.4:$PORT_A" ]] || fail "the peer did not follow Ordo: $(dump_field "$IF_B" endpoint)"
    ping_ok "$NS_B" "$IN_A" || fail "ping to Ordo's new address"
}

# Persistent keepalives (every second) appear on the wire: 32-byte UDP payloads from Ordo.
t_keepalive() {
    tunnel ordo "$1"
    ip netns exec "$NS_A" wg set "$IF_A" peer "$PUB_B" persistent-keepalive 1
    [[ $(dump_field "$IF_A" keepalive) == 1 ]] || fail "wg show does not report the interval"
    # udp[4:2] is the UDP length: 8 + 32 for a keepalive. Three of them, within 6 seconds.
    timeout 6 ip netns exec "$NS_B" tcpdump -i veth-b -n -c 3 "udp and src host $OUT_A and udp[4:2] = 40" \
        >"$LOGDIR/keepalive.pcap.txt" 2>&1 || fail "fewer than 3 keepalives in 6 s: $(cat "$LOGDIR/keepalive.pcap.txt")"
}

# With traffic flowing, the session is rekeyed after REKEY_AFTER_TIME and no packet is lost.
# Ordo initiated the session, so Ordo renews it: after 15 s here (ORDO_TEST_REKEY_AFTER)
# rather than 120, the same renewal with the real peer answering it.
t_rekey() {
    export ORDO_TEST_REKEY_AFTER=15
    tunnel ordo "$1"
    ping_ok "$NS_A" "$IN_B" || fail "initial ping"
    local first
    first=$(dump_field "$IF_A" handshake)
    ip netns exec "$NS_A" ping -q -i 0.5 -c 50 -W 2 "$IN_B" >"$LOGDIR/rekey-ping.txt" || fail "ping failed across the rekey: $(tail -2 "$LOGDIR/rekey-ping.txt")"
    grep " 0% packet loss" "$LOGDIR/rekey-ping.txt" >/dev/null || fail "packets lost across the rekey: $(tail -2 "$LOGDIR/rekey-ping.txt")"
    local second
    second=$(dump_field "$IF_A" handshake)
    ((second >= first + 13)) || fail "no rekey: handshake at $first, then $second"
    [[ $(ordo_counter "$IF_A" handshakes_completed) -ge 2 ]] || fail "fewer than 2 handshakes"
}

# Ordo under load answers with a cookie; the peer retries with mac2 and the handshake completes.
t_cookie() {
    make_hosts
    KEY_A=$(genkey); KEY_B=$(genkey); PUB_A=$(pubkey "$KEY_A"); PUB_B=$(pubkey "$KEY_B")
    start_impl ordo-underload "$NS_A" "$IF_A"
    start_impl "$1" "$NS_B" "$IF_B"
    configure "$NS_A" "$IF_A" "$KEY_A" "$PORT_A" "$PUB_B" "" "$IN_B/32,$IN6_B/128"
    configure "$NS_B" "$IF_B" "$KEY_B" "$PORT_B" "$PUB_A" "$OUT_A:$PORT_A" "$IN_A/32,$IN6_A/128"
    inner_addresses "$NS_A" "$IF_A" "$IN_A" "$IN6_A"
    inner_addresses "$NS_B" "$IF_B" "$IN_B" "$IN6_B"
    # The first initiation gets a cookie; the retry after REKEY_TIMEOUT (5 s) carries mac2.
    ping_ok "$NS_B" "$IN_A" 1 15 || fail "no connectivity after the cookie exchange"
    [[ $(ordo_counter "$IF_A" cookie_replies_sent) -ge 1 ]] || fail "Ordo sent no cookie reply"
    [[ $(ordo_counter "$IF_A" handshakes_completed) -ge 1 ]] || fail "no handshake completed"
}

# Malformed datagrams are dropped and counted by reason, one count each.
t_bad_input() {
    tunnel ordo ordo
    ping_ok "$NS_A" "$IN_B" || fail "ping"
    ip netns exec "$NS_B" python3 - "$OUT_A" "$PORT_A" <<'EOF'
import socket, sys, os
s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
dst = (sys.argv[1], int(sys.argv[2]))
for _ in range(5): s.sendto(b"\x09\x00\x00\x00garbage", dst)                  # unknown type
for _ in range(4): s.sendto(b"\x04\x00\x00\x00" + os.urandom(60), dst)         # unknown receiver
for _ in range(3): s.sendto(b"\x01\x00\x00\x00" + os.urandom(144), dst)        # bad mac1
EOF
    # The datagrams are on the wire once sendto returns; wait (bounded) until all are counted.
    local m r b
    for _ in $(seq 50); do
        m=$(ordo_counter "$IF_A" drop_malformed); r=$(ordo_counter "$IF_A" drop_unknown_receiver); b=$(ordo_counter "$IF_A" drop_bad_mac1)
        [[ "$m $r $b" == "5 4 3" ]] && break
        sleep 0.1
    done
    [[ "$m $r $b" == "5 4 3" ]] || fail "drops malformed/unknown_receiver/bad_mac1 = $m/$r/$b, want 5/4/3"
    ping_ok "$NS_A" "$IN_B" || fail "tunnel broken by bad input"
}

# Drops the kernel makes before Ordo sees a packet are counted as the kernel reports them:
# with the daemon stopped, a burst into the tunnel fills the TUN queue Ordo sized (2048; the
# kernel's default is 500) and the rest is dropped; `ordo show` names exactly that many.
t_os_drops() {
    tunnel ordo ordo
    ping_ok "$NS_A" "$IN_B" || fail "ping"
    ip -n "$NS_A" link show "$IF_A" | grep "qlen 2048" >/dev/null || fail "TUN queue length: $(ip -n "$NS_A" link show "$IF_A")"
    local before pids dropped
    before=$(ordo_counter "$IF_A" drop_os_tun_queue_full)
    pids=$(ip netns pids "$NS_A")
    kill -STOP $pids
    local sent=0
    ip netns exec "$NS_A" python3 - "$IN_B" <<'EOF' && sent=1
import socket, sys
s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
for _ in range(3000): s.sendto(b"x" * 100, (sys.argv[1], 9))
EOF
    kill -CONT $pids  # before any failure: a stopped daemon would not hear teardown's TERM
    ((sent)) || fail "the burst could not be sent"
    dropped=$(( $(ordo_counter "$IF_A" drop_os_tun_queue_full) - before ))
    # 3000 - 2048 = 952, and a few more if the kernel queued packets of its own meanwhile.
    ((dropped >= 952 && dropped <= 960)) || fail "drop_os_tun_queue_full rose by $dropped, want 952"
    ping_ok "$NS_A" "$IN_B" || fail "tunnel broken after the burst"
}
