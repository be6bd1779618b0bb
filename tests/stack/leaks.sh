# shellcheck shell=bash
# What the preload library cannot see (static programs, Go, raw system calls), kept from the
# host's route by the supervisor: nothing leaves in cleartext.
# Sourced by stack.sh, whose helpers (setup, as_user, ordo_run, run_test) and lib.sh's it uses.

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

# The leak suite. A probe (tests/stack/leak-probe.c, built dynamic and static)
# tries every way a program can reach the far end's tunnel addresses: the C library's calls
# and their raw system calls; every address form the kernel accepts (family 0, an IPv4
# address in a longer buffer, IPv6 of 24 and 28 bytes, a scope id, IPv4-mapped, too short);
# sendmsg with a name on a connected socket, sendmmsg whose second message is the tunnel's,
# TCP fast open, UDP-Lite (not UDP: not carried), SCTP's connect by socket option, io_uring;
# children made by vfork and clone3; a process that asks not to be dumpable, one the kernel
# makes undumpable (an executable it may not read), a grandchild reparented by a double fork,
# and one that outlives `ordo run`. A has cleartext routes to
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
        udp_v6_family0_raw udp_sendmsg_named_on_connected udp_sendmmsg_second udplite_libc udplite_raw sctp_connectx sctp_connectx3 io_uring
        vfork clone3 undumpable
        reparented exec=$dir/probe-unreadable tcp_raw udp_raw udp_family0_raw"
    local kind got want why
    for kind in dynamic static; do
        # shellcheck disable=SC2086
        got=$(ordo_run "$dir/probe-$kind" "$IN_B" "$IN6_B" $cases 2>"$dir/$kind.err") \
            || fail "$kind probe: $(cat "$dir/$kind.err")"
        log "    $kind: $(tr '\n' ' ' <<<"$got")"
        (($(cleartext) == 0)) || fail "$kind probe: $(cleartext) packets reached B in cleartext"
        # What must be so, whatever else is carried or refused.
        for want in "tcp_raw ok" "io_uring ENOSYS" "undumpable_prctl EPERM" "udp_short ENETUNREACH" \
            "sctp_connectx EOPNOTSUPP" "sctp_connectx3 EOPNOTSUPP" "udplite_libc ENETUNREACH" \
            "udplite_raw ENETUNREACH"; do
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
        ! grep -vE ' (ok|ENETUNREACH|ENOSYS|EPERM|EINPROGRESS|EOPNOTSUPP)$' <<<"$got" >/dev/null \
            || fail "$kind: unexpected results: $(grep -vE ' (ok|ENETUNREACH|ENOSYS|EPERM|EINPROGRESS|EOPNOTSUPP)$' <<<"$got")"
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
