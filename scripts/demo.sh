#!/usr/bin/env bash
# make demo: two hosts (network namespaces) joined by veth, an Ordo tunnel between them
# brought up from ordinary wg-quick files, a ping and a 10-second iperf3 through it, the
# figures, `ordo show`, and a cleanup that also runs on Ctrl-C.
set -euo pipefail
source "$(dirname "$0")/../tests/interop/lib.sh"

[[ $EUID -eq 0 ]] || { echo "make demo needs root (namespaces, TUN)"; exit 1; }
trap 'teardown; rm -rf "$LOGDIR"' EXIT
trap 'echo; echo "interrupted: cleaning up"; exit 130' INT TERM

step() { printf '\n\033[1m== %s\033[0m\n' "$*"; }

step "two hosts: $NS_A ($OUT_A) and $NS_B ($OUT_B), joined by veth"
make_hosts
KEY_A=$(genkey); KEY_B=$(genkey); PUB_A=$(pubkey "$KEY_A"); PUB_B=$(pubkey "$KEY_B")
for side in A B; do
    if [[ $side == A ]]; then key=$KEY_A port=$PORT_A addr="$IN_A/24, $IN6_A/64" peer=$PUB_B ep="$OUT_B:$PORT_B" allowed="$IN_B/32, $IN6_B/128" ifname=$IF_A
    else key=$KEY_B port=$PORT_B addr="$IN_B/24, $IN6_B/64" peer=$PUB_A ep="$OUT_A:$PORT_A" allowed="$IN_A/32, $IN6_A/128" ifname=$IF_B; fi
    (umask 077; cat >"$LOGDIR/$ifname.conf" <<CONF
[Interface]
PrivateKey = $key
ListenPort = $port
Address = $addr

[Peer]
PublicKey = $peer
Endpoint = $ep
AllowedIPs = $allowed
CONF
)
done

step "ordo up (wg-quick files, one per host)"
sed 's/^PrivateKey = .*/PrivateKey = (hidden)/' "$LOGDIR/$IF_A.conf"
ORDO_LOG=$LOGDIR/a.log ip netns exec "$NS_A" "$ORDO" up "$LOGDIR/$IF_A.conf"
ORDO_LOG=$LOGDIR/b.log ip netns exec "$NS_B" "$ORDO" up "$LOGDIR/$IF_B.conf"

step "ping through the tunnel (IPv4 and IPv6)"
ip netns exec "$NS_A" ping -c 3 -i 0.2 "$IN_B"
ip netns exec "$NS_A" ping -c 3 -i 0.2 "$IN6_B"

step "iperf3, 10 seconds, $NS_A -> $NS_B through the tunnel"
ip netns exec "$NS_B" iperf3 -s -1 >/dev/null 2>&1 &
for _ in $(seq 50); do ip netns exec "$NS_B" ss -ltn | grep ':5201 ' >/dev/null && break; sleep 0.1; done
ip netns exec "$NS_A" iperf3 -c "$IN_B" -t 10 -J >"$LOGDIR/iperf.json"
python3 - "$LOGDIR/iperf.json" <<'PY'
import json, sys
r = json.load(open(sys.argv[1]))["end"]
s, c = r["sum_received"], r["cpu_utilization_percent"]
print(f"  received {s['bytes'] / 1e9:.2f} GB in {s['seconds']:.1f} s = {s['bits_per_second'] / 1e9:.2f} Gbit/s"
      f"  (retransmits: {r['sum_sent'].get('retransmits', 0)}; iperf3 CPU: sender {c['host_total']:.0f}%, receiver {c['remote_total']:.0f}%)")
PY

step "ordo show ($NS_A)"
"$ORDO" show "$IF_A"

step "ordo down"
ip netns exec "$NS_A" "$ORDO" down "$LOGDIR/$IF_A.conf"
ip netns exec "$NS_B" "$ORDO" down "$LOGDIR/$IF_B.conf"
echo "done: namespaces and interfaces are removed on exit"
