# shellcheck shell=bash
# Shared stack interfaces (`ordo up` of an `Inner = stack` file): attached programs, guests,
# root's, and one on AF_XDP.
# Sourced by stack.sh, whose helpers (setup, as_user, ordo_run, run_test) and lib.sh's it uses.

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
