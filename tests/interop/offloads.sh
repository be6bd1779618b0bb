# shellcheck shell=bash
# Offloads at the TUN boundary: UDP segmentation (USO) out, UDP coalescing (user-space GRO) in.
# Sourced by interop.sh, whose helpers (run_test, fail, ping_ok) and lib.sh's it uses.

# USO on the TUN side: a sender using UDP GSO (UDP_SEGMENT) hands the TUN device one large
# datagram; Ordo splits it and every datagram arrives intact at the peer (the receiving
# kernel drops any with a wrong checksum), in order.
t_uso() {
    tunnel ordo "$1"
    ping_ok "$NS_A" "$IN_B" || fail "ping"
    [[ $(ordo_counter "$IF_A" tun_uso) == 1 ]] || fail "the kernel refused USO on the TUN device"
    local out=$LOGDIR/uso.txt
    ip netns exec "$NS_B" python3 -c '
import socket, sys
s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
s.bind((sys.argv[1], 6000)); s.settimeout(5)
got = []
try:
    while len(got) < 100:
        got.append(s.recv(2000))
except socket.timeout:
    pass
ok = all(d == bytes([i % 251]) * 1200 for i, d in enumerate(got))
print(len(got), ok)
' "$IN_B" >"$out" &
    local rcv=$!
    for _ in $(seq 50); do ip netns exec "$NS_B" ss -lun | grep ':6000 ' >/dev/null && break; sleep 0.1; done
    ip netns exec "$NS_A" python3 -c '
import socket, sys, time
s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
s.setsockopt(socket.IPPROTO_UDP, 103, 1200)  # UDP_SEGMENT
for k in range(10):
    s.sendto(b"".join(bytes([(10 * k + i) % 251]) * 1200 for i in range(10)), (sys.argv[1], 6000))
    time.sleep(0.01)
' "$IN_B" || fail "UDP_SEGMENT send"
    wait $rcv
    log "    received: $(cat "$out") (100 datagrams of 1200 bytes expected, in order)"
    [[ $(cat "$out") == "100 True" ]] || fail "USO datagrams lost or damaged"
}

# UDP coalescing on the TUN side: the peer's host sends bursts with UDP GSO (UDP_SEGMENT: ten
# datagrams, the last shorter), so Ordo receives them as a batch and writes each burst to its
# TUN device as one USO packet with a partial checksum. Every datagram must reach a plain
# socket (the kernel splits the packet) over IPv4 and a UDP_GRO socket (the packet arrives
# whole, cut by the application at the segment size the kernel reports) over IPv6, intact
# and in order. The kernel would not catch a bad merge (the checksum is partial): this does.
t_udp_gro() {
    tunnel ordo "$1"
    ping_ok "$NS_A" "$IN_B" || fail "ping"
    [[ $(ordo_counter "$IF_A" tun_uso) == 1 ]] || fail "the kernel refused USO on the TUN device"
    local before out=$LOGDIR/udp_gro.txt
    before=$(ordo_counter "$IF_A" tun_coalesced_packets)
    ip netns exec "$NS_A" python3 -c '
import socket, struct, sys
v4 = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
v4.bind((sys.argv[1], 6000))
v6 = socket.socket(socket.AF_INET6, socket.SOCK_DGRAM)
v6.setsockopt(socket.IPPROTO_UDP, 104, 1)  # UDP_GRO
v6.bind((sys.argv[2], 6000))
sizes = ([1200] * 9 + [700]) * 10
def expect(got):
    return len(got) == 100 and all(d == bytes([i % 251]) * n for i, (d, n) in enumerate(zip(got, sizes)))
v4.settimeout(5)
got = []
try:
    while len(got) < 100:
        got.append(v4.recv(2000))
except socket.timeout:
    pass
ok4 = expect(got)
v6.settimeout(5)
got, merged = [], 0
try:
    while len(got) < 100:
        data, anc, _, _ = v6.recvmsg(65536, socket.CMSG_SPACE(4))
        size = next((struct.unpack("=H", d[:2])[0] for l, t, d in anc if l == socket.IPPROTO_UDP and t == 104), len(data))
        merged += size < len(data)
        got += [data[k:k + size] for k in range(0, len(data), size)]
except socket.timeout:
    pass
print(len(got), ok4, expect(got), merged > 0)
' "$IN_A" "$IN6_A" >"$out" &
    local rcv=$!
    for _ in $(seq 50); do [[ $(ip netns exec "$NS_A" ss -lun | grep -c ':6000 ') == 2 ]] && break; sleep 0.1; done
    ip netns exec "$NS_B" python3 -c '
import socket, sys, time
for family, addr in ((socket.AF_INET, sys.argv[1]), (socket.AF_INET6, sys.argv[2])):
    s = socket.socket(family, socket.SOCK_DGRAM)
    s.setsockopt(socket.IPPROTO_UDP, 103, 1200)  # UDP_SEGMENT
    for k in range(10):
        s.sendto(b"".join(bytes([(10 * k + i) % 251]) * (700 if i == 9 else 1200) for i in range(10)), (addr, 6000))
        time.sleep(0.01)
' "$IN_A" "$IN6_A" || fail "UDP_SEGMENT send"
    wait $rcv
    log "    received over IPv6: $(cat "$out") (100 datagrams; IPv4 intact; IPv6 intact; some arrived merged)"
    [[ $(cat "$out") == "100 True True True" ]] || fail "datagrams lost, damaged or never merged"
    local merged=$(( $(ordo_counter "$IF_A" tun_coalesced_packets) - before ))
    log "    datagrams Ordo merged into USO writes: $merged"
    ((merged >= 20)) || fail "Ordo merged $merged datagrams"
}
