# shellcheck shell=bash
# Client programs through the stack: curl, a program using the tunnel and the host's network at
# once, refused connections, iperf3, nc, a lossy path, Python's clients, ssh.
# Sourced by stack.sh, whose helpers (setup, as_user, ordo_run, run_test) and lib.sh's it uses.

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
