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

# curl downloads 64 MB over HTTP from a server behind the far end, over IPv4 and IPv6, as
# an unprivileged user; the bytes are checked.
t_curl_download() {
    setup
    mkdir -p "$WORK/www"
    head -c 64M /dev/urandom >"$WORK/www/blob"
    local want
    want=$(sha256sum <"$WORK/www/blob" | cut -d' ' -f1)
    http_server "$NS_B" "$IN_B" 8000 "$WORK/www"
    http_server "$NS_B" "$IN6_B" 8006 "$WORK/www"
    ordo_run curl -sS --max-time 60 -o "$OUT/v4" "http://$IN_B:8000/blob" || fail "curl over IPv4"
    [[ $(sha256sum <"$OUT/v4" | cut -d' ' -f1) == "$want" ]] || fail "IPv4 download differs"
    ordo_run curl -sS --max-time 60 -o "$OUT/v6" "http://[$IN6_B]:8006/blob" || fail "curl over IPv6"
    [[ $(sha256sum <"$OUT/v6" | cut -d' ' -f1) == "$want" ]] || fail "IPv6 download differs"
}

# The same program reaches the tunnel and, in the same run, a server outside it (B's veth
# address) and loopback through the kernel.
t_tunnel_and_kernel() {
    setup
    mkdir -p "$WORK/www"
    echo tunnel >"$WORK/www/where"
    http_server "$NS_B" "$IN_B" 8000 "$WORK/www"
    http_server "$NS_B" "$OUT_B" 8001 "$WORK/www"
    http_server "$NS_A" 127.0.0.1 8002 "$WORK/www"
    local got
    got=$(ordo_run "$PY" -c "
import urllib.request as u
for url in ['http://$IN_B:8000/where', 'http://$OUT_B:8001/where', 'http://127.0.0.1:8002/where']:
    print(u.urlopen(url, timeout=20).read().decode().strip())
") || fail "the program failed"
    [[ $got == $'tunnel\ntunnel\ntunnel' ]] || fail "got: $got"
    # The tunnel carried the first request only: B's server on its tunnel address saw A's
    # tunnel address; the one on the veth saw A's veth address.
    grep "^$IN_A " "$LOGDIR/http-8000.log" >/dev/null || fail "the tunnel request did not come from $IN_A"
    grep "^$OUT_A " "$LOGDIR/http-8001.log" >/dev/null || fail "the outside request did not come from $OUT_A"
}

# A connection refused at the far end is refused for the program too: ECONNREFUSED from a
# blocking connect, and from a non-blocking one EINPROGRESS, then writable, then
# ECONNREFUSED in SO_ERROR; and a non-blocking connect that succeeds says EINPROGRESS, then
# becomes writable and SO_ERROR is 0. The program goes on after each. Then signals.
t_refused() {
    setup
    mkdir -p "$WORK/www"
    http_server "$NS_B" "$IN_B" 8000 "$WORK/www"
    local got
    got=$(ordo_run "$PY" -c "
import errno, select, socket
s = socket.socket()
try:
    s.connect(('$IN_B', 9))
    print('connected')
except ConnectionRefusedError:
    print('refused')
for port, want in [(9, errno.ECONNREFUSED), (8000, 0)]:
    s = socket.socket()
    s.setblocking(False)
    e = s.connect_ex(('$IN_B', port))
    assert e == errno.EINPROGRESS, f'connect_ex gave {e}'
    _, w, _ = select.select([], [s], [], 10)
    assert w, 'never writable'
    print(port, s.getsockopt(socket.SOL_SOCKET, socket.SO_ERROR) == want)
") || fail "the program failed: $got"
    [[ $got == $'refused\n9 True\n8000 True' ]] || fail "got: $got"
    # A blocking connect that gets no answer (B drops the SYNs) is interrupted by a signal
    # as the kernel's is (EINTR: python runs the handler, which raises), at once, not after
    # the stack's connect timeout; a refused one leaves the socket to be connected again.
    ip netns exec "$NS_B" nft add table inet ordo_test_silent
    ip netns exec "$NS_B" nft add chain inet ordo_test_silent in '{ type filter hook input priority 0; }'
    ip netns exec "$NS_B" nft add rule inet ordo_test_silent in tcp dport 9998 drop
    got=$(ordo_run "$PY" -c "
import signal, socket, time
class Alarm(Exception):
    pass
def on_alarm(*_):
    raise Alarm()
signal.signal(signal.SIGALRM, on_alarm)
s = socket.socket()
signal.setitimer(signal.ITIMER_REAL, 0.5)
t = time.monotonic()
try:
    s.connect(('$IN_B', 9998))
    print('connected')
except Alarm:
    print('interrupted', round(time.monotonic() - t, 1))
s = socket.socket()
try:
    s.connect(('$IN_B', 9))
except ConnectionRefusedError:
    s.connect(('$IN_B', 8000))
    print('connected again')
") || fail "the program failed: $got"
    log "    $got"
    [[ $got == $'interrupted 0.5\nconnected again' ]] || fail "got: $got"
    # A destination the library does not read (an IPv6 address of the older 24-byte size,
    # which the kernel takes) is not marked as checked (ordo_attach::CHECKED_SEND): the
    # supervisor refuses it, rather than the kernel sending it by its own route (to port 0,
    # where the kernel would answer EINVAL).
    got=$(ordo_run "$PY" -c "
import ctypes, errno, socket, struct
libc = ctypes.CDLL(None, use_errno=True)
s = socket.socket(socket.AF_INET6, socket.SOCK_DGRAM)
addr = struct.pack('=HHI16s', socket.AF_INET6, 0, 0, socket.inet_pton(socket.AF_INET6, '$IN6_B'))
r = libc.sendto(s.fileno(), b'x', 1, 0, addr, len(addr))
print(r, errno.errorcode.get(ctypes.get_errno()))
") || fail "the program failed: $got"
    [[ $got == "-1 ENETUNREACH" ]] || fail "a 24-byte IPv6 destination: $got"
}

# iperf3_server: a one-shot iperf3 server on B's tunnel address; returns once it listens.
iperf3_server() {
    ip netns exec "$NS_B" iperf3 -s -1 -B "$IN_B" -p 5201 >/dev/null 2>&1 &
    for _ in $(seq 50); do
        ip netns exec "$NS_B" ss -ltn | grep ':5201 ' >/dev/null && return 0
        sleep 0.1
    done
    fail "iperf3 server did not start"
}

# iperf3 (select-driven, non-blocking sockets) through the stack, each way: the bytes the
# receiving side counted, at least 10 MB in 3 s; then UDP each way.
t_iperf3() {
    setup
    local dir json bytes
    for dir in "" -R; do
        iperf3_server
        json=$(ordo_run iperf3 -c "$IN_B" -p 5201 -t 3 -J $dir) || fail "iperf3 $dir: $json"
        bytes=$(echo "$json" | "$PY" -c "import json,sys; print(int(json.load(sys.stdin)['end']['sum_received']['bytes']))")
        log "    iperf3 $dir: $((bytes * 8 / 3 / 1000000)) Mbit/s"
        ((bytes > 10000000)) || fail "iperf3 $dir: only $bytes bytes"
    done
    # UDP, each way, at a rate the tunnel carries on any machine: the receiver counted the
    # datagrams, and lost few.
    local packets lost
    for dir in "" -R; do
        iperf3_server
        json=$(ordo_run iperf3 -c "$IN_B" -p 5201 -u -b 100M -l 1200 -t 3 -J $dir) || fail "iperf3 -u $dir: $json"
        read -r packets lost < <(echo "$json" | "$PY" -c "
import json, sys
s = json.load(sys.stdin)['end']['sum']
print(s['packets'], s['lost_packets'])")
        log "    iperf3 -u $dir: $packets datagrams, $lost lost"
        ((packets > 10000)) || fail "iperf3 -u $dir: only $packets datagrams"
        ((lost * 20 < packets)) || fail "iperf3 -u $dir: $lost of $packets lost"
    done
}

# nc (netcat-openbsd) sends a file to a listener behind the far end and closes; the listener
# gets every byte (the half-close reaches the peer as a FIN).
t_nc() {
    setup
    head -c 3M /dev/urandom >"$WORK/nc.in"
    chmod 644 "$WORK/nc.in"
    ip netns exec "$NS_B" nc -l -s "$IN_B" -p 7000 -N >"$WORK/nc.out" &
    local srv=$!
    for _ in $(seq 50); do
        ip netns exec "$NS_B" ss -ltn | grep ':7000 ' >/dev/null && break
        sleep 0.1
    done
    ordo_run nc -N -w 10 "$IN_B" 7000 <"$WORK/nc.in" || fail "nc client"
    wait $srv
    cmp "$WORK/nc.in" "$WORK/nc.out" || fail "nc: bytes differ"
}

# The stack's TCP under loss: 2% of the tunnel's datagrams dropped each way (an nftables rule
# in B; this kernel has no netem), nc sends 32 MB to B and curl fetches 32 MB from B, the
# stack as sender and as receiver; every byte arrives, and the transfers do not stall: the
# bound is many times what they take (a sender that stalls at every loss, as smoltcp's did
# before third_party/smoltcp's patches, ran at under 1 MB/s here and fails it).
t_lossy() {
    setup
    ip -n "$NS_A" link set veth-a gso_max_segs 1
    ip -n "$NS_B" link set veth-b gso_max_segs 1
    ip netns exec "$NS_B" nft -f - <<EOF
table inet ordo_stack_loss {
    chain in { type filter hook input priority 0; udp dport $PORT_B numgen random mod 100 < 2 counter drop; }
    chain out { type filter hook output priority 0; udp sport $PORT_B numgen random mod 100 < 2 counter drop; }
}
EOF
    head -c 32M /dev/urandom >"$WORK/lossy.in"
    chmod 644 "$WORK/lossy.in"
    ip netns exec "$NS_B" nc -l -s "$IN_B" -p 7000 -N >"$WORK/lossy.out" &
    local srv=$! start
    for _ in $(seq 50); do
        ip netns exec "$NS_B" ss -ltn | grep ':7000 ' >/dev/null && break
        sleep 0.1
    done
    start=$SECONDS
    timeout 40 ip netns exec "$NS_A" setpriv --reuid="$RUN_USER" --regid=nogroup --clear-groups \
        --inh-caps=-all --bounding-set=-all -- "$ORDO" run -c "$CONF" -- nc -N -w 10 "$IN_B" 7000 \
        <"$WORK/lossy.in" || fail "nc through a lossy tunnel did not finish in 40 s"
    wait $srv
    cmp "$WORK/lossy.in" "$WORK/lossy.out" || fail "nc: bytes differ"
    log "    32 MB sent in $((SECONDS - start)) s"
    mkdir -p "$WORK/www"
    mv "$WORK/lossy.in" "$WORK/www/blob"
    http_server "$NS_B" "$IN_B" 8000 "$WORK/www"
    start=$SECONDS
    ordo_run curl -sS --max-time 40 -o "$OUT/lossy" "http://$IN_B:8000/blob" || fail "curl through a lossy tunnel"
    cmp "$WORK/www/blob" "$OUT/lossy" || fail "curl: bytes differ"
    log "    32 MB received in $((SECONDS - start)) s"
    # The rule did drop: the test ran under loss.
    local dropped
    dropped=$(ip netns exec "$NS_B" nft list table inet ordo_stack_loss | grep -o 'packets [0-9]*' | awk '{s += $2} END {print s + 0}')
    log "    $dropped datagrams dropped"
    ((dropped > 100)) || fail "only $dropped datagrams dropped"
}

# A static Go binary (built here; Go makes raw system calls, never the C library's) under
# `ordo run`, as the unprivileged user. A has a route to B's tunnel address outside the
# tunnel (through the veth) and B's server answers there too, telling each client its source
# address (a root process in A reaches it that way, from A's veth address). The program's
# TCP connection to it goes through the tunnel all the same (the server sees A's tunnel
# address, and the program names its ends as the tunnel's addresses): the supervisor made it
# through the stack from outside (and a closed port is refused, as Go learns from SO_ERROR
# after its non-blocking connect), as it does a connected
# UDP socket's (B's UDP server answers a datagram with its source, the tunnel address too). Unconnected UDP to the tunnel,
# not carried yet, fails closed (ENETUNREACH, and the supervisor says why) instead of
# leaving by that route; its connection to B's veth address, outside the tunnel, goes
# through the kernel as without `ordo run`.
t_static_go() {
    setup
    local go=go
    command -v go >/dev/null || go=/usr/local/go/bin/go
    mkdir -p "$WORK/gostatic"
    cat >"$WORK/gostatic/main.go" <<'EOF'
package main

import (
	"fmt"
	"io"
	"net"
	"os"
	"strings"
	"time"
)

// Each argument: tcp:HOST:PORT (connect, print what the server says), udp:HOST:PORT
// (connect, send a datagram, print the answer) or udpto:HOST:PORT (send from an unconnected
// socket).
func main() {
	for _, a := range os.Args[1:] {
		kind, addr, _ := strings.Cut(a, ":")
		if kind == "udpto" {
			p, _ := net.ListenPacket("udp", ":0")
			to, _ := net.ResolveUDPAddr("udp", addr)
			_, err := p.WriteTo([]byte("x"), to)
			fmt.Println(a, "error:", err)
			continue
		}
		c, err := net.DialTimeout(kind, addr, 5*time.Second)
		if err != nil {
			fmt.Println(a, "error:", err)
			continue
		}
		if kind == "udp" {
			c.SetDeadline(time.Now().Add(5 * time.Second))
			c.Write([]byte("where from?"))
			b := make([]byte, 100)
			n, err := c.Read(b)
			fmt.Println(a, "said:", string(b[:n]), err, "local", c.LocalAddr(), "remote", c.RemoteAddr())
		} else {
			c.SetDeadline(time.Now().Add(5 * time.Second))
			b, err := io.ReadAll(c)
			fmt.Println(a, "said:", strings.TrimSpace(string(b)), err, "local", c.LocalAddr(), "remote", c.RemoteAddr())
		}
		c.Close()
	}
}
EOF
    (cd "$WORK/gostatic" && CGO_ENABLED=0 "$go" build -o static main.go) || fail "go build"
    chmod 755 "$WORK/gostatic/static"
    ip -n "$NS_A" route add "$IN_B/32" via "$OUT_B"
    ip netns exec "$NS_B" "$PY" -c "
import socket
s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
s.bind(('$IN_B', 9999))
while True:
    _, peer = s.recvfrom(100)
    s.sendto(peer[0].encode(), peer)
" >/dev/null 2>&1 &
    local addr
    for addr in "$IN_B" "$OUT_B"; do
        ip netns exec "$NS_B" "$PY" -c "
import socket
s = socket.socket()
s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
s.bind(('$addr', 7100))
s.listen()
while True:
    c, peer = s.accept()
    c.sendall(peer[0].encode() + b'\n')
    c.close()
" >/dev/null 2>&1 &
    done
    for _ in $(seq 50); do
        [[ $(ip netns exec "$NS_B" ss -ltn | grep -c ':7100 ') == 2 ]] && break
        sleep 0.1
    done
    local outside
    outside=$(ip netns exec "$NS_A" nc -w 3 "$IN_B" 7100) || fail "the route outside the tunnel does not reach B (the test needs it)"
    [[ $outside == "$OUT_A" ]] || fail "outside the tunnel B saw $outside"
    local got
    got=$(ordo_run "$WORK/gostatic/static" "tcp:$IN_B:7100" "tcp:$IN_B:7199" "udp:$IN_B:9999" \
        "udpto:$IN_B:9999" "tcp:$OUT_B:7100" 2>"$WORK/static.err")
    log "$(echo "$got" | sed 's/^/    /')"
    grep "^tcp:$IN_B:7100 said: $IN_A <nil> local $IN_A:[0-9]* remote $IN_B:7100$" <<<"$got" >/dev/null ||
        fail "TCP to the tunnel: $got"
    grep "^tcp:$IN_B:7199 error: .*connection refused" <<<"$got" >/dev/null || fail "a closed port in the tunnel: $got"
    grep "^udp:$IN_B:9999 said: $IN_A <nil> local $IN_A:[0-9]* remote $IN_B:9999$" <<<"$got" >/dev/null ||
        fail "connected UDP to the tunnel: $got"
    grep "^udpto:$IN_B:9999 error: .*network is unreachable" <<<"$got" >/dev/null || fail "unconnected UDP to the tunnel: $got"
    grep "^tcp:$OUT_B:7100 said: $OUT_A <nil> local $OUT_A:[0-9]* remote $OUT_B:7100$" <<<"$got" >/dev/null ||
        fail "outside the tunnel: $got"
    grep "refused (ENETUNREACH)" "$WORK/static.err" >/dev/null || fail "no word from the supervisor: $(cat "$WORK/static.err")"
}

# Python clients: a blocking socket, selectors (epoll) with a non-blocking one, asyncio; one
# that registers its socket with epoll before connecting (the registration must survive the
# swap of its descriptor); one that forks a child which uses the inherited socket; two whose
# child execs (execv) or is spawned (posix_spawn) as a new program that uses the socket and
# names its peer; and one that sends with the peer's address (sendto, sendmsg), which TCP
# ignores.
t_python_clients() {
    setup
    mkdir -p "$WORK/www"
    echo through >"$WORK/www/where"
    http_server "$NS_B" "$IN_B" 8000 "$WORK/www"
    sed "s/@B@/$IN_B/" "$(dirname "$0")/clients.py" >"$WORK/clients.py"
    local got
    got=$(ordo_run "$PY" "$WORK/clients.py") || fail "the clients failed: $got"
    log "$(echo "$got" | sed 's/^/    /')"
    [[ $(grep -c ' through$' <<<"$got") == 8 ]] || fail "not every client got through"
}

# udp_echo NS ADDR PORT: a UDP echo server (each datagram back to its sender) in NS, in the
# background until the test's teardown; returns once it is bound.
udp_echo() {
    ip netns exec "$1" "$PY" -c "
import socket, sys
s = socket.socket(socket.AF_INET6 if ':' in '$2' else socket.AF_INET, socket.SOCK_DGRAM)
s.bind(('$2', $3))
print('bound', flush=True)
while True:
    data, peer = s.recvfrom(65535)
    s.sendto(data, peer)
" >"$WORK/echo-$3.out" 2>&1 &
    for _ in $(seq 50); do
        grep bound "$WORK/echo-$3.out" >/dev/null 2>&1 && return 0
        sleep 0.1
    done
    fail "the UDP echo server on $2:$3 did not start"
}

# A connected UDP socket through the stack, IPv4 and IPv6: datagrams of every size up to
# the tunnel's limit come back from an echo server behind the far end byte for byte, with
# the server's address as their source (recvfrom, recvmsg, recv_into after select); the
# socket says it is a UDP socket with a tunnel address; sendto its own remote works.
t_udp() {
    setup
    udp_echo "$NS_B" "$IN_B" 9999
    udp_echo "$NS_B" "$IN6_B" 9996
    local got
    got=$(ordo_run "$PY" -c "
import os, select, socket
for family, server in [(socket.AF_INET, ('$IN_B', 9999)), (socket.AF_INET6, ('$IN6_B', 9996))]:
    s = socket.socket(family, socket.SOCK_DGRAM)
    s.settimeout(10)
    s.connect(server)
    assert s.getsockopt(socket.SOL_SOCKET, socket.SO_TYPE) == socket.SOCK_DGRAM
    assert s.getsockopt(socket.SOL_SOCKET, socket.SO_PROTOCOL) == socket.IPPROTO_UDP
    assert s.getsockname()[0] in ('$IN_A', '$IN6_A'), s.getsockname()
    limit = 1420 - (28 if family == socket.AF_INET else 48)
    ok = 0
    for i, size in enumerate([0, 1, 100, 1000, limit] + [17 * k for k in range(1, 60)]):
        data = os.urandom(size)
        if i % 3 == 0:
            s.send(data)
            back, source = s.recvfrom(65535)
        elif i % 3 == 1:
            s.sendto(data, server)
            back, _, _, source = s.recvmsg(65535)
        else:
            s.send(data)
            assert select.select([s], [], [], 10)[0], 'nothing to read'
            buf = bytearray(65535)
            back, source = buf[:s.recv_into(buf)], s.getpeername()
        assert back == data, f'datagram {i} of {size} bytes differs'
        assert source[:2] == server, f'from {source}'
        ok += 1
    print(family.name, ok)
") || fail "the program failed: $got"
    [[ $got == $'AF_INET 64\nAF_INET6 64' ]] || fail "got: $got"
}

# Unconnected UDP through the stack, IPv4 and IPv6: a socket bound to nothing sends to the
# far end's echo server with sendto and sendmsg and receives with recvfrom, recvmsg, recv and
# read (os.read), each reply's source being the server and its payload byte for byte, FIONREAD
# counting the payload, copies made by dup receiving as the original; its name is the
# stack's (a port, any address). A UDP server bound to the tunnel address under
# `ordo run` answers datagrams from the far end (recvfrom, sendto each back), which sees
# the replies come from that address; a socket bound to the tunnel address and then
# connected sends and receives with send and recv, and names its peer. A server bound to ::
# hears the tunnel and the host's networks alike and answers each. What cannot be carried
# fails closed: a datagram to the tunnel from a socket bound to a host address, and one
# outside the tunnel from an unconnected tunnel socket, get ENETUNREACH; a socket connected
# through the tunnel refuses another destination (EISCONN). UDP elsewhere is the kernel's.
t_udp_unconnected() {
    setup
    udp_echo "$NS_B" "$IN_B" 9999
    udp_echo "$NS_B" "$IN6_B" 9996
    ip netns exec "$NS_B" "$PY" -c "
import socket
s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
s.bind(('$OUT_B', 9999))
s.settimeout(20)
print(s.recv(100).decode())
" >"$WORK/outside.out" &
    local outside=$! got
    cat >"$WORK/server.py" <<EOF
import socket
s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
s.bind(('$IN_A', 7777))
w = socket.socket(socket.AF_INET6, socket.SOCK_DGRAM)
w.bind(('::', 7778))
print('bound', flush=True)
for _ in range(20):
    data, peer = s.recvfrom(65535)
    s.sendto(data[::-1], peer)
for _ in range(4):
    data, peer = w.recvfrom(65535)
    w.sendto(data + b' from ' + peer[0].encode(), peer)
EOF
    cat >"$WORK/client.py" <<EOF
import array, ctypes, errno, fcntl, os, select, socket, termios
for family, server in [(socket.AF_INET, ('$IN_B', 9999)), (socket.AF_INET6, ('$IN6_B', 9996))]:
    s = socket.socket(family, socket.SOCK_DGRAM)
    s.settimeout(10)
    ok = 0
    for i, size in enumerate([0, 1, 100, 1000] + [37 * k for k in range(1, 30)]):
        data = os.urandom(size)
        if i % 2 == 0:
            s.sendto(data, server)
        else:
            s.sendmsg([data[:size // 2], data[size // 2:]], [], 0, server)
        if i % 4 == 0:
            back, source = s.recvfrom(65535)
        elif i % 4 == 1:
            back, _, _, source = s.recvmsg(65535)
        elif i % 4 == 2:
            back, source = s.recv(65535), server
        else:
            # A socket with a timeout is non-blocking underneath: wait as python's calls do.
            assert select.select([s], [], [], 10)[0], 'nothing to read'
            back, source = os.read(s.fileno(), 65535), server
        assert back == data, f'datagram {i} of {size} bytes differs: {len(back)}'
        assert source[:2] == server, f'from {source}'
        ok += 1
    # FIONREAD counts the next datagram's payload, as the kernel's UDP does; a copy made by
    # dup (python's dup: fcntl F_DUPFD_CLOEXEC; and the C library's dup) receives as the
    # original, without the service's headers.
    s.sendto(b'0123456789', server)
    assert select.select([s], [], [], 10)[0], 'nothing to read'
    waiting = array.array('i', [0])
    fcntl.ioctl(s.fileno(), termios.FIONREAD, waiting)
    assert waiting[0] == 10, f'FIONREAD {waiting[0]}'
    copy = s.dup()
    back, source = copy.recvfrom(100)
    assert (back, source[:2]) == (b'0123456789', server), (back, source)
    copy.close()
    s.sendto(b'abc', server)
    assert select.select([s], [], [], 10)[0], 'nothing to read'
    copy = ctypes.CDLL(None, use_errno=True).dup(s.fileno())
    assert copy >= 0 and os.read(copy, 100) == b'abc'
    os.close(copy)
    name = s.getsockname()
    assert name[1] != 0 and name[0] in ('0.0.0.0', '::'), name
    try:
        s.sendmsg([b'nowhere'])
        print('sent nowhere')
    except OSError as e:
        assert e.errno == errno.EDESTADDRREQ, e
    try:
        s.sendto(b'x', ('$OUT_B' if family == socket.AF_INET else '::ffff:$OUT_B', 9999))
        print('outside sent')
    except OSError as e:
        assert e.errno == errno.ENETUNREACH, e
    print(family.name, ok)
# A server under ordo run, reached from the far end: checked there.
c = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
c.bind(('$IN_A', 0))
c.connect(('$IN_B', 9999))
c.settimeout(10)
c.send(b'connected')
assert c.recv(100) == b'connected'
assert c.getpeername() == ('$IN_B', 9999), c.getpeername()
assert c.getsockname()[0] == '$IN_A', c.getsockname()
# connect(AF_UNSPEC) dissolves the association: no peer, and datagrams with addresses again.
import ctypes
libc = ctypes.CDLL(None, use_errno=True)
assert libc.connect(c.fileno(), ctypes.create_string_buffer(16), 16) == 0, ctypes.get_errno()
try:
    c.getpeername()
    print('still a peer')
except OSError as e:
    assert e.errno == errno.ENOTCONN, e
c.sendto(b'unconnected', ('$IN_B', 9999))
assert c.recvfrom(100) == (b'unconnected', ('$IN_B', 9999))
print('connected ok')
k = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
k.bind(('$OUT_A', 0))
try:
    k.sendto(b'x', ('$IN_B', 9999))
    print('kernel-bound sent')
except OSError as e:
    print('kernel-bound', e.errno == errno.ENETUNREACH)
t = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
t.connect(('$IN_B', 53))
for dest in [('$IN_B', 54), ('$OUT_B', 9999)]:
    try:
        t.sendto(b'x', dest)
        print('connected', 'sent')
    except OSError as e:
        print('connected', e.errno == errno.EISCONN)
k.sendto(b'outside', ('$OUT_B', 9999))
EOF
    # The server and the client under one `ordo run` (one interface, one listen port).
    as_user "$ORDO" run -c "$CONF" -- sh -c \
        "$PY $WORK/server.py >$OUT/server.out 2>&1 & $PY $WORK/client.py >$OUT/client.out 2>&1; wait" &
    local run=$!
    for _ in $(seq 50); do
        grep bound "$OUT/server.out" >/dev/null 2>&1 && break
        sleep 0.1
    done
    got=$(ip netns exec "$NS_B" "$PY" -c "
import os, socket
s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
s.bind(('$IN_B', 0))
s.settimeout(10)
ok = 0
for i in range(20):
    data = os.urandom(1 + 50 * i)
    s.sendto(data, ('$IN_A', 7777))
    back, source = s.recvfrom(65535)
    assert back == data[::-1] and source == ('$IN_A', 7777), (len(back), source)
    ok += 1
print(ok)
") || fail "the server under ordo run did not answer: $got $(cat "$OUT/server.out")"
    [[ $got == 20 ]] || fail "server: $got $(cat "$OUT/server.out")"
    # The server bound to :: hears the tunnel (IPv4 and IPv6) and the host's networks (the
    # veth, loopback) in the same run, and answers each from the address it was reached at.
    local via
    for via in "$NS_B $IN_A $IN_B" "$NS_B $IN6_A $IN6_B" "$NS_B $OUT_A $OUT_B" "$NS_A 127.0.0.1 127.0.0.1"; do
        read -r ns to from <<<"$via"
        got=$(ip netns exec "$ns" "$PY" -c "
import socket
s = socket.socket(socket.AF_INET6 if ':' in '$to' else socket.AF_INET, socket.SOCK_DGRAM)
s.settimeout(10)
s.sendto(b'hello', ('$to', 7778))
back, source = s.recvfrom(100)
assert source[0] == '$to', source
print(back.decode())
") || fail "the server on :: did not answer through $to: $got"
        [[ $got == "hello from "*"$from" ]] || fail "through $to: $got"
    done
    wait $run || fail "the programs failed: $(cat "$OUT/server.out" "$OUT/client.out")"
    got=$(cat "$OUT/client.out")
    [[ $got == $'AF_INET 33\nAF_INET6 33\nconnected ok\nkernel-bound True\nconnected True\nconnected True' ]] ||
        fail "got: $got"
    wait $outside
    [[ $(cat "$WORK/outside.out") == outside ]] || fail "the datagram outside the tunnel did not arrive"
}

# Names resolve through the tunnel's name server (`DNS =`, with a search domain): dnsmasq
# on the far end's tunnel address answers, and sees the queries come from A's tunnel
# address. curl by full name and by short name (the search domain), python's getaddrinfo for
# IPv6 with the canonical name of an alias, a name nobody has (EAI_NONAME), and localhost
# from the hosts file, still the host's; getnameinfo of the server's addresses (their PTR
# records), and of one without a name (the number, or EAI_NONAME when a name is required);
# gethostbyname_r and gethostbyaddr_r (python's gethostbyname_ex and gethostbyaddr) alike.
t_dns() {
    setup
    sed -i "/^Address/a DNS = $IN_B, ordo.test" "$CONF"
    ip netns exec "$NS_B" dnsmasq --keep-in-foreground --conf-file=/dev/null --no-resolv --no-hosts \
        --user=nobody --listen-address="$IN_B" --bind-interfaces \
        --local=/ordo.test/ --local=/99.10.in-addr.arpa/ --host-record="web.ordo.test,$IN_B,$IN6_B" --cname=alias.ordo.test,web.ordo.test \
        --log-queries --log-facility=- 2>"$WORK/dnsmasq.log" &
    mkdir -p "$WORK/www"
    echo tunnel >"$WORK/www/where"
    http_server "$NS_B" "$IN_B" 8000 "$WORK/www"
    for _ in $(seq 50); do
        ip netns exec "$NS_B" ss -lun | grep "$IN_B:53 " >/dev/null && break
        sleep 0.1
    done
    local got
    got=$(ordo_run curl -sS --max-time 20 "http://web.ordo.test:8000/where") || fail "curl by name: $got"
    [[ $got == tunnel ]] || fail "curl by name got: $got"
    got=$(ordo_run curl -sS --max-time 20 "http://web:8000/where") || fail "curl by short name: $got"
    [[ $got == tunnel ]] || fail "curl by short name got: $got"
    got=$(ordo_run "$PY" -c "
import socket
info = socket.getaddrinfo('alias', 80, socket.AF_INET6, socket.SOCK_STREAM, 0, socket.AI_CANONNAME)
print(info[0][4][0], info[0][3])
try:
    socket.getaddrinfo('nosuch.ordo.test', 80)
    print('resolved')
except socket.gaierror as e:
    print(e.errno == socket.EAI_NONAME)
print(socket.getaddrinfo('localhost', 80, socket.AF_INET)[0][4][0])
print(socket.getnameinfo(('$IN_B', 80), socket.NI_NUMERICSERV), socket.getnameinfo(('$IN6_B', 80, 0, 0), socket.NI_NAMEREQD | socket.NI_NOFQDN)[0])
print(socket.getnameinfo(('10.99.0.77', 80), socket.NI_NUMERICSERV)[0])
try:
    socket.getnameinfo(('10.99.0.77', 80), socket.NI_NAMEREQD)
    print('named')
except socket.gaierror as e:
    print(e.errno == socket.EAI_NONAME)
# The older interface (python's gethostbyname_ex: gethostbyname_r; gethostbyaddr:
# gethostbyaddr_r): the same servers, the same answers.
print(socket.gethostbyname_ex('web'))
print(socket.gethostbyaddr('$IN_B'))
try:
    socket.gethostbyaddr('10.99.0.77')
    print('named')
except OSError as e:
    print(type(e).__name__)
") || fail "the program failed: $got"
    [[ $got == "$IN6_B web.ordo.test"$'\nTrue\n127.0.0.1\n'"('web.ordo.test', '80') web"$'\n10.99.0.77\nTrue\n'"('web.ordo.test', ['web'], ['$IN_B'])"$'\n'"('web.ordo.test', [], ['$IN_B'])"$'\nherror' ]] ||
        fail "got: $got"
    grep "query\[A\] web.ordo.test from $IN_A" "$WORK/dnsmasq.log" >/dev/null \
        || fail "dnsmasq did not see the query come through the tunnel: $(cat "$WORK/dnsmasq.log")"
    grep "query\[PTR\] 2.0.99.10.in-addr.arpa from $IN_A" "$WORK/dnsmasq.log" >/dev/null \
        || fail "dnsmasq did not see the reverse query: $(cat "$WORK/dnsmasq.log")"
}

# No name query leaves outside the tunnel with `DNS =` set. A's resolv.conf names
# a server outside the tunnel (B's veth address, where a second dnsmasq answers every name
# with 192.0.2.66 and logs what it is asked); the tunnel's server (B's tunnel address)
# answers web.ordo.test with B's tunnel address. Every way a program resolves: getaddrinfo,
# glibc's res_query, res_search, res_send and getaddrinfo_a (which use internal calls a
# preload cannot see), a resolver of the program's own on a connected UDP socket (as c-ares)
# that checks where the answer came from, the same from an unconnected socket (refused), and
# a static Go binary's pure resolver: each is answered by the tunnel's server, and the
# host's server is asked nothing.
t_dns_leaks() {
    setup
    sed -i "/^Address/a DNS = $IN_B, ordo.test" "$CONF"
    # ip netns exec mounts it over /etc/resolv.conf in A; gone when the test's subshell ends.
    trap 'rm -rf "/etc/netns/$NS_A"' EXIT
    mkdir -p "/etc/netns/$NS_A"
    echo "nameserver $OUT_B" >"/etc/netns/$NS_A/resolv.conf"
    ip netns exec "$NS_B" dnsmasq --keep-in-foreground --conf-file=/dev/null --no-resolv --no-hosts \
        --user=nobody --listen-address="$IN_B" --bind-interfaces --local=/ordo.test/ \
        --host-record="web.ordo.test,$IN_B" --log-queries --log-facility=- 2>"$WORK/tunnel-dns.log" &
    ip netns exec "$NS_B" dnsmasq --keep-in-foreground --conf-file=/dev/null --no-resolv --no-hosts \
        --user=nobody --listen-address="$OUT_B" --bind-interfaces --address=/#/192.0.2.66 \
        --log-queries --log-facility=- --pid-file="$WORK/host-dns.pid" 2>"$WORK/host-dns.log" &
    for addr in "$IN_B" "$OUT_B"; do
        for _ in $(seq 50); do
            ip netns exec "$NS_B" ss -lun | grep "$addr:53 " >/dev/null && break
            sleep 0.1
        done
    done
    # The host's server does answer (the test needs it): then its log starts afresh.
    [[ $(ip netns exec "$NS_A" "$PY" -c "import socket; print(socket.gethostbyname('web.ordo.test'))") == 192.0.2.66 ]] ||
        fail "the host's name server does not answer (the test needs it)"
    sleep 0.2
    : >"$WORK/host-dns.log"
    local go=go
    command -v go >/dev/null || go=/usr/local/go/bin/go
    mkdir -p "$WORK/golookup"
    cat >"$WORK/golookup/main.go" <<'GO'
package main

import (
	"context"
	"fmt"
	"net"
)

// Go's own resolver (no C library in a static binary): /etc/resolv.conf's servers.
func main() {
	r := &net.Resolver{PreferGo: true}
	addrs, err := r.LookupHost(context.Background(), "web.ordo.test")
	fmt.Println(addrs, err)
}
GO
    (cd "$WORK/golookup" && CGO_ENABLED=0 "$go" build -o lookup main.go) || fail "go build"
    chmod 755 "$WORK/golookup/lookup"
    local got
    got=$(ordo_run "$PY" -c "
import ctypes, ctypes.util, socket, struct
libc = ctypes.CDLL(None)
print('getaddrinfo', socket.getaddrinfo('web.ordo.test', 80, socket.AF_INET)[0][4][0])
def first_a(answer, n):
    # The answer's last 4 octets: the A record's address (one question, one answer).
    return socket.inet_ntoa(bytes(answer[n - 4:n]))
buf = (ctypes.c_ubyte * 512)()
n = libc.res_query(b'web.ordo.test', 1, 1, buf, 512)
print('res_query', first_a(buf, n) if n > 0 else n)
n = libc.res_search(b'web', 1, 1, buf, 512)
print('res_search', first_a(buf, n) if n > 0 else n)
q = (ctypes.c_ubyte * 512)()
qlen = libc.res_mkquery(0, b'web.ordo.test', 1, 1, None, 0, None, q, 512)
n = libc.res_send(q, qlen, buf, 512)
print('res_send', first_a(buf, n) if n > 0 else n)
class addrinfo(ctypes.Structure): pass
addrinfo._fields_ = [('flags', ctypes.c_int), ('family', ctypes.c_int), ('socktype', ctypes.c_int),
    ('protocol', ctypes.c_int), ('addrlen', ctypes.c_uint32), ('addr', ctypes.c_void_p),
    ('canonname', ctypes.c_char_p), ('next', ctypes.POINTER(addrinfo))]
class gaicb(ctypes.Structure):
    _fields_ = [('name', ctypes.c_char_p), ('service', ctypes.c_char_p), ('request', ctypes.c_void_p),
        ('result', ctypes.POINTER(addrinfo)), ('ret', ctypes.c_int), ('reserved', ctypes.c_int * 5)]
hints = addrinfo(family=socket.AF_INET, socktype=socket.SOCK_STREAM)
cb = gaicb(name=b'web.ordo.test', request=ctypes.cast(ctypes.pointer(hints), ctypes.c_void_p))
lst = (ctypes.POINTER(gaicb) * 1)(ctypes.pointer(cb))
r = libc.getaddrinfo_a(0, lst, 1, None)
err = libc.gai_error(ctypes.byref(cb))
sin = ctypes.string_at(cb.result.contents.addr, 8) if r == 0 and err == 0 else b''
print('getaddrinfo_a', socket.inet_ntoa(sin[4:8]) if sin else (r, err))
# A resolver of its own (as c-ares): a UDP socket connected to the server resolv.conf names.
query = bytes(q[:qlen])
s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
s.settimeout(10)
s.connect(('$OUT_B', 53))
s.send(query)
data, source = s.recvfrom(512)
print('own', socket.inet_ntoa(data[-4:]), source[0], s.getpeername()[0])
u = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
try:
    u.sendto(query, ('$OUT_B', 53)); print('unconnected sent')
except OSError as e: print('unconnected', e.strerror)
" 2>"$WORK/dns-leaks.err") || fail "the program failed: $got $(cat "$WORK/dns-leaks.err")"
    log "$(sed 's/^/    /' <<<"$got")"
    local want="getaddrinfo $IN_B
res_query $IN_B
res_search $IN_B
res_send $IN_B
getaddrinfo_a $IN_B
own $IN_B $OUT_B $OUT_B
unconnected Network is unreachable"
    [[ $got == "$want" ]] || fail "got: $got"
    got=$(ordo_run "$WORK/golookup/lookup" 2>>"$WORK/dns-leaks.err") || fail "Go's resolver: $got"
    [[ $got == "[$IN_B] <nil>" ]] || fail "Go's resolver got: $got $(cat "$WORK/dns-leaks.err")"
    ! grep "query\[" "$WORK/host-dns.log" >/dev/null || fail "the host's server was asked: $(grep 'query\[' "$WORK/host-dns.log")"
    grep "query\[A\] web.ordo.test from $IN_A" "$WORK/tunnel-dns.log" >/dev/null ||
        fail "the tunnel's server saw no query: $(cat "$WORK/tunnel-dns.log")"
}

# ssh (OpenSSH, key authentication) to an sshd behind the far end, as the unprivileged user:
# a command's output (4 MB, checked) comes back, and what ssh sends reaches the far end.
t_ssh() {
    setup
    local d="$WORK/ssh"
    mkdir -p "$d" /run/sshd
    ssh-keygen -q -t ed25519 -N '' -f "$d/host" >/dev/null
    ssh-keygen -q -t ed25519 -N '' -f "$d/client" >/dev/null
    cp "$d/client.pub" "$d/authorized_keys"
    chown "$RUN_USER" "$d/client"
    head -c 4M /dev/urandom >"$d/blob"
    local sshd=(/usr/sbin/sshd -D -e -f /dev/null -h "$d/host" -o ListenAddress="$IN_B"
        -o AuthorizedKeysFile="$d/authorized_keys" -o StrictModes=no -o PermitRootLogin=prohibit-password
        -o PidFile=none -o UsePAM=no)
    ip netns exec "$NS_B" "${sshd[@]}" 2>"$LOGDIR/sshd.log" &
    for _ in $(seq 50); do
        ip netns exec "$NS_B" ss -ltn | grep "$IN_B:22 " >/dev/null && break
        sleep 0.1
    done
    local ssh=(ssh -F /dev/null -i "$d/client" -o StrictHostKeyChecking=no -o UserKnownHostsFile=/dev/null
        -o BatchMode=yes -o ConnectTimeout=20 -o LogLevel=ERROR "root@$IN_B")
    local got want
    want=$(sha256sum <"$d/blob" | cut -d' ' -f1)
    got=$(ordo_run "${ssh[@]}" cat "$d/blob" | sha256sum | cut -d' ' -f1)
    [[ $got == "$want" ]] || fail "ssh: the command's output differs"
    echo "through ssh" | ordo_run "${ssh[@]}" "cat >$d/sent" || fail "ssh: sending failed"
    [[ $(cat "$d/sent") == "through ssh" ]] || fail "ssh: what was sent did not arrive"
    grep "Accepted publickey for root from $IN_A" "$LOGDIR/sshd.log" >/dev/null \
        || fail "sshd did not see A's tunnel address: $(cat "$LOGDIR/sshd.log")"
}

# A shared stack interface: `ordo up` of a file with `Inner = stack` by the unprivileged
# user, which `ordo show` reads over its UAPI socket and two programs join with `ordo run
# --attach`. One downloads while the other is killed in the middle of its own download: the
# first's bytes arrive whole. A port one program listens on cannot be taken by the other
# (EADDRINUSE). `ordo down` ends the interface and leaves none of its files.
t_shared() {
    setup
    local conf="$WORK/shared0.conf" show want
    sed '/^Address/a Inner = stack' "$CONF" >"$conf"
    chown "$RUN_USER" "$conf"
    chmod 600 "$conf"
    as_user "$ORDO" up "$conf" || fail "ordo up of an Inner = stack file as $RUN_USER"
    # The user's sockets are in a directory of its own (no XDG_RUNTIME_DIR of its here).
    local dir=/tmp/ordo-$(id -u "$RUN_USER")
    [[ -S $dir/shared0.sock && -S $dir/shared0.attach ]] || fail "no sockets in $dir: $(ls -la "$dir")"
    [[ $(stat -c '%U %a' "$dir") == "$RUN_USER 700" ]] || fail "$dir is not $RUN_USER's alone"
    show=$(as_user "$ORDO" show shared0) || fail "ordo show: $show"
    grep "peer: $PUB_B" <<<"$show" >/dev/null || fail "ordo show does not list the peer: $show"
    # wg itself looks in /var/run/wireguard only: in a user namespace of the user's own, the
    # user's directory is mounted there, and wg configures the interface.
    as_user unshare --user --map-root-user --mount sh -c \
        "mount -t tmpfs none /run && mkdir /run/wireguard && mount --bind $dir /run/wireguard &&
         wg set shared0 peer $PUB_B persistent-keepalive 17" || fail "wg set in a user namespace"
    show=$(as_user "$ORDO" show shared0) || fail "ordo show: $show"
    grep "every 17 seconds" <<<"$show" >/dev/null || fail "wg's setting is not in place: $show"
    mkdir -p "$WORK/www"
    head -c 16M /dev/urandom >"$WORK/www/blob"
    chmod -R a+rX "$WORK/www"
    want=$(sha256sum <"$WORK/www/blob" | cut -d' ' -f1)
    http_server "$NS_B" "$IN_B" 8000 "$WORK/www"
    as_user "$ORDO" run --attach shared0 -- curl -sS --max-time 60 --limit-rate 4M \
        -o "$OUT/survivor" "http://$IN_B:8000/blob" &
    local survivor=$!
    as_user "$ORDO" run --attach shared0 -- curl -sS --max-time 60 --limit-rate 1M \
        -o "$OUT/victim" "http://$IN_B:8000/blob" 2>/dev/null &
    local victim=$!
    sleep 1.5
    ip netns exec "$NS_A" pkill -KILL -f '^curl .*--limit-rate 1M' || fail "the second program was not running"
    wait $victim && fail "the killed program's ordo run succeeded"
    wait $survivor || fail "the surviving download failed"
    [[ $(sha256sum <"$OUT/survivor" | cut -d' ' -f1) == "$want" ]] || fail "the surviving download differs"
    (($(stat -c %s "$OUT/victim") < 16777216)) || fail "the killed download was not cut short"
    # One program's listening port is its own.
    as_user "$ORDO" run --attach shared0 -- "$PY" -c "
import socket, time
s = socket.socket()
s.bind(('$IN_A', 7100))
s.listen()
print('listening', flush=True)
time.sleep(20)
" >"$WORK/listener.out" &
    local listener=$!
    for _ in $(seq 50); do
        grep listening "$WORK/listener.out" >/dev/null 2>&1 && break
        sleep 0.1
    done
    local got
    got=$(as_user "$ORDO" run --attach shared0 -- "$PY" -c "
import errno, socket
s = socket.socket()
s.bind(('$IN_A', 7100))
try:
    s.listen()
    print('listening too')
except OSError as e:
    print(e.errno == errno.EADDRINUSE)
") || fail "the second program failed: $got"
    [[ $got == True ]] || fail "the second program got: $got"
    kill $listener 2>/dev/null
    as_user "$ORDO" down "$conf" || fail "ordo down"
    # Guests: with `AttachUsers = daemon, @sys`, the user daemon attaches (OWNER:NAME) and downloads
    # through it; bin, not named, is refused (permission denied), and nothing of its leaves.
    sed -i '/^Inner/a AttachUsers = daemon, @sys' "$conf"
    as_user "$ORDO" up "$conf" || fail "ordo up with AttachUsers"
    local shared=/tmp/ordo-attach-$(id -u "$RUN_USER")
    [[ $(stat -c '%U %a' "$shared") == "$RUN_USER 711" && $(stat -c %a "$shared/shared0.attach") == 666 ]] ||
        fail "$shared: $(ls -la "$shared")"
    as_user "$ORDO" run --attach shared0 -- curl -sS --max-time 30 -o /dev/null "http://$IN_B:8000/blob" ||
        fail "the owner no longer attaches"
    got=$(as_guest daemon "$ORDO" run --attach "$RUN_USER:shared0" -- curl -sS --max-time 30 \
        "http://$IN_B:8000/blob" | sha256sum | cut -d' ' -f1)
    [[ $got == "$want" ]] || fail "the guest's download failed or differs"
    got=$(as_guest bin "$ORDO" run --attach "$RUN_USER:shared0" -- "$PY" -c "
import socket
try:
    socket.create_connection(('$IN_B', 8000), timeout=10)
    print('connected')
except OSError as e:
    print(e.strerror)
" 2>&1) || fail "the refused guest's program failed: $got"
    [[ $got == 'Permission denied' ]] || fail "a user not named got: $got"
    # A member of a named group (`@sys`) is admitted: looked up off the plane's thread.
    got=$(as_guest sys "$ORDO" run --attach "$RUN_USER:shared0" -- curl -sS --max-time 30 \
        "http://$IN_B:8000/blob" | sha256sum | cut -d' ' -f1)
    [[ $got == "$want" ]] || fail "the group's member's download failed or differs"
    # A guest may not take a port below 1024 in the stack (the owner may), and has a share
    # of its connections (a quarter), not all of them: beyond, EMFILE.
    got=$(as_guest daemon "$ORDO" run --attach "$RUN_USER:shared0" -- "$PY" -c "
import errno, socket
s = socket.socket()
s.bind(('$IN_A', 80))
try:
    s.listen(); print('listening')
except OSError as e: print(errno.errorcode[e.errno])
held, result = [], 'all'
for i in range(300):
    c = socket.socket()
    try: c.connect(('$IN_B', 8000)); held.append(c)
    except OSError as e: result = '%d %s' % (len(held), errno.errorcode[e.errno]); break
print(result)
" 2>&1) || fail "the guest's program failed: $got"
    [[ $got == $'EACCES\n256 EMFILE' ]] || fail "a guest's low port and share: $got"
    got=$(as_user "$ORDO" run --attach shared0 -- "$PY" -c "
import socket
s = socket.socket(); s.bind(('$IN_A', 80)); s.listen(); print('listening')
" 2>&1) || fail "the owner's program failed: $got"
    [[ $got == listening ]] || fail "the owner may not listen on port 80: $got"
    as_user "$ORDO" down "$conf" || fail "ordo down"
    [[ -z $(find "$shared" -name 'shared0.*') ]] || fail "ordo down left files in $shared"
    as_user "$ORDO" show shared0 >/dev/null 2>&1 && fail "shared0 still answers after ordo down"
    local left
    left=$(find "$dir" -name 'shared0.*')
    [[ -z $left ]] || fail "ordo down left $left"
}

# A stack interface started by root gives root up once set up: its daemon runs as nobody
# with only CAP_NET_ADMIN and CAP_NET_BIND_SERVICE (what the TUN daemon keeps), yet stays
# root's: root's programs attach and reach the far end, nobody's cannot (its sockets are
# root's, and SO_PEERCRED says who asks), and `ordo down` leaves none of its files behind
# (root's directory, which its janitors clean).
t_root_stack() {
    setup
    local conf="$WORK/rootstack0.conf" pid status got
    sed '/^Address/a Inner = stack' "$CONF" >"$conf"
    chmod 600 "$conf"
    mkdir -p "$WORK/www"
    echo through >"$WORK/www/where"
    http_server "$NS_B" "$IN_B" 8000 "$WORK/www"
    ip netns exec "$NS_A" "$ORDO" up "$conf" || fail "ordo up of a stack interface as root"
    pid=$(pgrep -f -- "--foreground $conf") || fail "no daemon"
    status=$(cat "/proc/$pid/status")
    grep -E "^Uid:\s+$(id -u nobody)\s" <<<"$status" >/dev/null || fail "the daemon is not nobody: $status"
    grep -E "^CapEff:\s+0000000000001400$" <<<"$status" >/dev/null || fail "the daemon's capabilities: $status"
    got=$(ip netns exec "$NS_A" "$ORDO" run --attach rootstack0 -- curl -sS --max-time 20 "http://$IN_B:8000/where") ||
        fail "root's program through the interface: $got"
    [[ $got == through ]] || fail "root's program got: $got"
    as_user "$ORDO" run --attach root:rootstack0 -- true 2>/dev/null && fail "nobody attached to root's interface"
    got=$(as_user "$PY" -c "
import socket
s = socket.socket(socket.AF_UNIX)
try:
    s.connect('/var/run/wireguard/rootstack0.attach')
    print('connected')
except OSError as e:
    print(e.strerror)
")
    [[ $got == 'Permission denied' ]] || fail "nobody and root's attach socket: $got"
    ip netns exec "$NS_A" "$ORDO" down "$conf" || fail "ordo down"
    for _ in $(seq 50); do
        [[ -z $(find /var/run/wireguard -maxdepth 1 -name 'rootstack0.*') ]] && return 0
        sleep 0.1
    done
    fail "left behind: $(find /var/run/wireguard -maxdepth 1 -name 'rootstack0.*')"
}

# kernel_udp NS: the kernel's UDP datagrams received and sent in NS, IPv4 and IPv6 together.
kernel_udp() {
    ip netns exec "$1" awk '
        $1 == "Udp:" && $2 ~ /^[0-9]+$/ { rx += $2; tx += $5 }
        $1 == "Udp6InDatagrams" { rx += $2 } $1 == "Udp6OutDatagrams" { tx += $2 }
        END { print rx, tx }' /proc/net/snmp /proc/net/snmp6
}

# Inner = stack with Outer = xdp, brought up by root: a program's download crosses Ordo's
# stack and AF_XDP with no kernel network stack between the program and the wire. The bytes
# arrive whole; the XDP counters move and the kernel's UDP counters do not; and every thread
# of the daemon, the XDP port's among them, runs without the privileges it was started with.
t_stack_xdp() {
    setup
    local conf="$WORK/stackxdp0.conf" pid shown got want taken0 sent0 taken sent rx0 tx0 rx1 tx1
    sed '/^Address/a Inner = stack\nOuter = xdp\nXdpInterfaces = veth-a' "$CONF" >"$conf"
    chmod 600 "$conf"
    mkdir -p "$WORK/www"
    head -c 16M /dev/urandom >"$WORK/www/blob"
    want=$(sha256sum <"$WORK/www/blob")
    http_server "$NS_B" "$IN_B" 8000 "$WORK/www"
    ORDO_LOG="$LOGDIR/stackxdp0.log" ip netns exec "$NS_A" "$ORDO" up "$conf" || fail "ordo up of a stack interface on AF_XDP"
    grep "xdp unavailable" "$LOGDIR/stackxdp0.log" && fail "it fell back to kernel UDP"
    shown=$("$ORDO" show stackxdp0 | grep "outer path") || true
    [[ $shown == *"xdp on veth-a ("* ]] || fail "not on AF_XDP: $shown"
    # The handshake, and the peer's neighbour entry (until the kernel has one, Ordo sends
    # through the kernel's socket).
    ip netns exec "$NS_A" "$ORDO" run --attach stackxdp0 -- curl -sS --max-time 20 -o /dev/null -r 0-999 \
        "http://$IN_B:8000/blob" || fail "the first request"
    read -r rx0 tx0 < <(kernel_udp "$NS_A")
    taken0=$(ordo_counter stackxdp0 xdp_to_socket); sent0=$(ordo_counter stackxdp0 xdp_sent)
    got=$(ip netns exec "$NS_A" "$ORDO" run --attach stackxdp0 -- curl -sS --max-time 60 "http://$IN_B:8000/blob" | sha256sum)
    [[ $got == "$want" ]] || fail "the download arrived damaged or short"
    read -r rx1 tx1 < <(kernel_udp "$NS_A")
    taken=$(( $(ordo_counter stackxdp0 xdp_to_socket) - taken0 )); sent=$(( $(ordo_counter stackxdp0 xdp_sent) - sent0 ))
    log "    16 MB by AF_XDP: $taken frames received, $sent datagrams sent; by the kernel's UDP: $((rx1 - rx0)) received, $((tx1 - tx0)) sent"
    # What Ordo sends for a download is the stack's acknowledgements: few, but by AF_XDP too.
    ((taken > 10000 && sent > 0)) || fail "not by AF_XDP: $taken received, $sent sent"
    ((rx1 == rx0 && tx1 == tx0)) || fail "the kernel's UDP carried some of it"
    pid=$(pgrep -f -- "--foreground $conf") || fail "no daemon"
    grep -x ordo-paths /proc/"$pid"/task/*/comm >/dev/null || fail "no ordo-paths thread"
    threads_dropped "$pid" >"$LOGDIR/threads.txt" || fail "threads that kept privileges: $(cat "$LOGDIR/threads.txt")"
    ip netns exec "$NS_A" "$ORDO" down "$conf" || fail "ordo down"
}

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

# The leak suite. A probe (tests/stack/leak-probe.c, built dynamic and static)
# tries every way a program can reach the far end's tunnel addresses: the C library's calls
# and their raw system calls; every address form the kernel accepts (family 0, an IPv4
# address in a longer buffer, IPv6 of 24 and 28 bytes, a scope id, IPv4-mapped, too short);
# sendmsg with a name on a connected socket, sendmmsg whose second message is the tunnel's,
# TCP fast open, io_uring; children made by vfork and clone3; a process that asks not to be
# dumpable, one the kernel makes undumpable (an executable it may not read), a grandchild
# reparented by a double fork, and one that outlives `ordo run`. A has cleartext routes to
# B's tunnel addresses through the veth, where B's servers answer too, so that any leak
# would succeed silently: B counts every packet to those addresses that arrives on its veth,
# and there must be none. What is refused is explained on `ordo run`'s standard error. A
# panic of the supervisor ends `ordo run` (status 70) and its program with it.
t_leaks() {
    setup
    local dir="$WORK/leak"
    mkdir -p "$dir"
    gcc -O1 -Wall -o "$dir/probe-dynamic" "$TESTS_DIR/leak-probe.c" || fail "building the probe"
    gcc -O1 -Wall -static -o "$dir/probe-static" "$TESTS_DIR/leak-probe.c" || fail "building the static probe"
    # An executable nobody may read, only run: the kernel makes its process undumpable.
    cp "$dir/probe-static" "$dir/probe-unreadable"
    chmod 755 "$dir" "$dir/probe-dynamic" "$dir/probe-static"
    chmod 711 "$dir/probe-unreadable"
    ip -n "$NS_A" route add "$IN_B/32" via "$OUT_B"
    ip -n "$NS_A" -6 route add "$IN6_B/128" via "$OUT6_B"
    ip netns exec "$NS_B" nft -f - <<NFT
table inet ordo_leak {
    counter cleartext4 {}
    counter cleartext6 {}
    chain prerouting {
        type filter hook prerouting priority -300;
        iifname "veth-b" ip daddr $IN_B counter name cleartext4
        iifname "veth-b" ip6 daddr $IN6_B counter name cleartext6
    }
}
NFT
    ip netns exec "$NS_B" "$PY" -c "
import socket, threading
def tcp(family, addr):
    s = socket.socket(family)
    s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    s.bind((addr, 7200)); s.listen(64)
    while True: s.accept()[0].close()
def udp(family, addr):
    s = socket.socket(family, socket.SOCK_DGRAM); s.bind((addr, 7201))
    while True: s.recvfrom(100)
for f, a in ((socket.AF_INET, '$IN_B'), (socket.AF_INET6, '$IN6_B')):
    threading.Thread(target=tcp, args=(f, a), daemon=True).start()
    threading.Thread(target=udp, args=(f, a), daemon=True).start()
threading.Event().wait()
" >/dev/null 2>&1 &
    for _ in $(seq 50); do
        [[ $(ip netns exec "$NS_B" ss -ltn | grep -c ':7200 ') == 2 ]] && break
        sleep 0.1
    done
    cleartext() {
        ip netns exec "$NS_B" nft list counters table inet ordo_leak | grep -o 'packets [0-9]*' | awk '{s += $2} END {print s + 0}'
    }
    # The cleartext routes do reach B (the count sees them); then the count starts afresh.
    ip netns exec "$NS_A" nc -z -w 3 "$IN_B" 7200 || fail "the cleartext route does not reach B (the test needs it)"
    ip netns exec "$NS_A" nc -z -w 3 "$IN6_B" 7200 || fail "the cleartext IPv6 route does not reach B"
    (($(cleartext) >= 2)) || fail "B's count did not see the cleartext connections: $(cleartext)"
    ip netns exec "$NS_B" nft reset counters table inet ordo_leak >/dev/null
    local cases="tcp_libc tcp_raw tcp_raw_v6 tcp_raw_v6_24 tcp_raw_v6_scope tcp_raw_mapped tcp_raw_len110 tcp_raw_len128
        tcp_fastopen udp_libc udp_family0_libc udp_raw udp_family0_raw udp_short udp_raw_v6 udp_raw_mapped
        udp_v6_family0_raw udp_sendmsg_named_on_connected udp_sendmmsg_second io_uring vfork clone3 undumpable
        reparented exec=$dir/probe-unreadable tcp_raw udp_raw udp_family0_raw"
    local kind got want why
    for kind in dynamic static; do
        # shellcheck disable=SC2086
        got=$(ordo_run "$dir/probe-$kind" "$IN_B" "$IN6_B" $cases 2>"$dir/$kind.err") \
            || fail "$kind probe: $(cat "$dir/$kind.err")"
        log "    $kind: $(tr '\n' ' ' <<<"$got")"
        (($(cleartext) == 0)) || fail "$kind probe: $(cleartext) packets reached B in cleartext"
        # What must be so, whatever else is carried or refused.
        for want in "tcp_raw ok" "io_uring ENOSYS" "undumpable_prctl EPERM" "udp_short ENETUNREACH"; do
            grep -x "$want" <<<"$got" >/dev/null || fail "$kind probe: no '$want' in: $got"
        done
        if [[ $kind == dynamic ]]; then
            grep -x "tcp_libc ok" <<<"$got" >/dev/null || fail "dynamic: tcp_libc not carried"
            grep -x "udp_family0_libc ok" <<<"$got" >/dev/null \
                || fail "dynamic: a family-0 datagram not carried as the kernel would send it"
        fi
        # The unreadable process's calls are the last three lines: all refused.
        [[ $(tail -n 3 <<<"$got" | awk '{print $2}' | sort -u) == ENETUNREACH ]] \
            || fail "$kind: the undumpable process's calls: $(tail -n 3 <<<"$got")"
        # Nothing else fails: each call is carried or refused.
        ! grep -vE ' (ok|ENETUNREACH|ENOSYS|EPERM|EINPROGRESS)$' <<<"$got" >/dev/null \
            || fail "$kind: unexpected results: $(grep -vE ' (ok|ENETUNREACH|ENOSYS|EPERM|EINPROGRESS)$' <<<"$got")"
        for why in "asked not to be dumpable" "cannot be read" "too short to hold an IP address"; do
            grep -F "$why" "$dir/$kind.err" >/dev/null || fail "$kind: no '$why' on stderr: $(cat "$dir/$kind.err")"
        done
    done
    grep -F "refused (ENETUNREACH) rather than let it leave" "$dir/static.err" >/dev/null \
        || fail "static: a refused tunnel destination not explained: $(cat "$dir/static.err")"
    # A process that outlives `ordo run` (killed): every call the filter stops fails now.
    # Not through as_user: $! must be `ordo run` itself (ip and setpriv exec it), not a
    # subshell running a function.
    ip netns exec "$NS_A" setpriv --reuid="$RUN_USER" --regid=nogroup --clear-groups --inh-caps=-all \
        --bounding-set=-all -- "$ORDO" run -c "$CONF" -- "$dir/probe-static" "$IN_B" "$IN6_B" \
        "outlive=$OUT/outlived" >/dev/null 2>"$dir/outlive.err" &
    local run=$!
    for _ in $(seq 50); do
        grep "processes it left behind" "$dir/outlive.err" >/dev/null && break
        sleep 0.1
    done
    grep "processes it left behind" "$dir/outlive.err" >/dev/null || fail "ordo run did not wait for the grandchild"
    kill -KILL "$run"
    wait "$run" 2>/dev/null || true
    for _ in $(seq 50); do
        [[ -s $OUT/outlived ]] && break
        sleep 0.1
    done
    log "    after ordo run: $(tr '\n' ' ' <"$OUT/outlived")"
    [[ $(awk '{print $2}' "$OUT/outlived" | sort -u) == ENOSYS ]] || fail "after ordo run: $(cat "$OUT/outlived")"
    # A panic of the supervisor ends `ordo run` with status 70, and the program with it.
    local status=0
    got=$(as_user env ORDO_TEST_SUPERVISOR_PANIC=1 "$ORDO" run -c "$CONF" -- \
        "$dir/probe-static" "$IN_B" "$IN6_B" tcp_raw 2>"$dir/panic.err") || status=$?
    ((status == 70)) || fail "after the supervisor's panic ordo run exited $status: $(cat "$dir/panic.err")"
    [[ -z $got ]] || fail "the program went on after the supervisor's panic: $got"
    (($(cleartext) == 0)) || fail "$(cleartext) packets reached B in cleartext"
}

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
