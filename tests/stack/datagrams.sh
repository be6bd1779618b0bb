# shellcheck shell=bash
# UDP through the stack: connected and unconnected sockets.
# Sourced by stack.sh, whose helpers (setup, as_user, ordo_run, run_test) and lib.sh's it uses.

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
