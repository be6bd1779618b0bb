# shellcheck shell=bash
# Names with `DNS =`: resolved through the tunnel's servers, and no query leaving outside it.
# Sourced by stack.sh, whose helpers (setup, as_user, ordo_run, run_test) and lib.sh's it uses.

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
