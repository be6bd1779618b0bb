#!/usr/bin/env bash
# What `ordo run`'s supervisor costs a program's datagrams outside the tunnel. Every program
# under `ordo run` runs under its seccomp filter (crates/ordo/src/run/supervise.rs), which
# stops each sendto with a destination, sendmsg and sendmmsg for the supervisor to read where
# it goes, unless the preload library marked it as checked (ordo_attach::CHECKED_SEND): a
# program that bypasses the library pays one round trip to the supervisor per unconnected
# datagram, even to the host's own networks. Connected sockets' send and write are not
# stopped. python3 sends 100-byte datagrams to a socket of its own on loopback, unconnected
# (sendto) and connected (send), plain and under `ordo run`, interleaved, RUNS times.
#
#   scripts/bench-supervisor.sh [RUNS=3] [DATAGRAMS=100000]
#
# Prints microseconds per datagram, the median of the runs, and the ratio under `ordo run`.
set -euo pipefail
cd "$(dirname "$0")/.."
RUNS=${1:-3}
DATAGRAMS=${2:-100000}
ORDO=${ORDO:-target/release/ordo}
WORK=$(mktemp -d /tmp/ordo-bench-supervisor.XXXXXX)
trap 'rm -rf "$WORK"' EXIT
[[ -x $ORDO ]] || cargo build --release --locked -q

# A private interface with a peer that is never reached: the datagrams go to loopback.
cat >"$WORK/a.conf" <<EOF
[Interface]
PrivateKey = $("$ORDO" genkey)
Address = 10.250.0.1/24

[Peer]
PublicKey = $("$ORDO" genkey | "$ORDO" pubkey)
AllowedIPs = 10.250.0.2/32
EOF
chmod 600 "$WORK/a.conf"
cat >"$WORK/send.py" <<EOF
import socket, sys, time
n = $DATAGRAMS
r = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
r.bind(('127.0.0.1', 0))
dest = r.getsockname()
def drain():
    while True:
        try:
            r.recv(200, socket.MSG_DONTWAIT)
        except BlockingIOError:
            return
def timed(send):
    t = time.perf_counter()
    for i in range(n):
        send()
        if i % 64 == 63:
            drain()
    return (time.perf_counter() - t) / n * 1e6
u = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
c = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
c.connect(dest)
payload = b'x' * 100
print(timed(lambda: u.sendto(payload, dest)), timed(lambda: c.send(payload)))
EOF

for ((i = 0; i < RUNS; i++)); do
    echo "plain $(python3 "$WORK/send.py")" >>"$WORK/results"
    echo "ordo-run $("$ORDO" run -c "$WORK/a.conf" -- python3 "$WORK/send.py")" >>"$WORK/results"
done
python3 - "$WORK/results" <<'EOF'
import statistics, sys
rows = {}
for line in open(sys.argv[1]):
    how, unconnected, connected = line.split()
    rows.setdefault(how, []).append((float(unconnected), float(connected)))
med = {h: [statistics.median(v[k] for v in r) for k in (0, 1)] for h, r in rows.items()}
print('| datagram | plain, us | under ordo run, us | ratio |')
print('|---|---|---|---|')
for k, name in enumerate(['unconnected (sendto)', 'connected (send)']):
    p, o = med['plain'][k], med['ordo-run'][k]
    print(f'| {name} | {p:.2f} | {o:.2f} | {o / p:.2f}x |')
EOF
