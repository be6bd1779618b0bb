# shellcheck shell=bash
# Placement: steering by receiver index, peers moved off a busy core, queue threads released
# when no core has room, the auto model's regimes.
# Sourced by interop.sh, whose helpers (run_test, fail, ping_ok) and lib.sh's it uses.

# ordo_show: `ordo show --json` of A's interface.
ordo_show() { "$ORDO" show "$IF_A" --json; }

# The inline model on two queues: the peer's datagrams are steered (a BPF program on the
# SO_REUSEPORT group reads our receiver index) to the socket of the peer's queue, so that
# queue's thread receives every data message and the other queue none.
t_inline_steering() {
    [[ $(nproc) -ge 2 ]] || { log "    (needs 2 CPUs: skipped)"; return 0; }
    # Placement fixed: the peer must stay where it was put, whatever else the machine runs.
    ORDO_MODEL=inline ORDO_CORES=0-1 ORDO_PLACEMENT=fixed tunnel ordo "$1"
    # Peers are placed round robin (from a random queue): B, re-added, is the second peer
    # and goes to the queue after its first one, which the kernel's own hash does not pick.
    local first
    first=$(ordo_show | python3 -c 'import json, sys; print(json.load(sys.stdin)[0]["peers"][0]["placement"]["queue"])')
    wg set "$IF_A" peer "$PUB_B" remove
    wg set "$IF_A" peer "$PUB_B" endpoint "$OUT_B:$PORT_B" allowed-ips "$IN_B/32,$IN6_B/128"
    ping_ok "$NS_A" "$IN_B" || fail "ping"
    iperf3_bytes "$NS_A" "$IN_B" -R >/dev/null || fail "iperf3 B->A"
    ordo_show | FIRST=$first python3 -c '
import json, os, sys
s = json.load(sys.stdin)[0]
p = s["peers"][0]["placement"]
want = (int(os.environ["FIRST"]) + 1) % 2
assert s["model"] == "inline" and p["regime"] == "inline" and p["queue"] == want, (s["model"], p, want)
got = {}
for t in s["thread_totals"]:
    if t["name"].startswith("queue"):
        q = int(t["name"][len("queue"):])
        got[q] = got.get(q, 0) + sum(st["packets"] for st in t["stages"] if st["stage"] == "receive")
own = got.get(p["queue"], 0)
other = sum(v for q, v in got.items() if q != p["queue"])
print("    queue", p["queue"], "received", own, "datagrams, the other queue", other)
# The other queue may take an initiation (it carries only the peer index), nothing more.
assert own > 10000 and other <= 3, got
' || fail "steering"
}

# Placement sees the whole machine (device/cpuload.rs): a peer whose queue's CPU another
# process keeps busy (here a loop pinned there) moves to the other queue; the handshake that
# follows steers the peer's datagrams to the new queue, and traffic goes on.
t_busy_core() {
    [[ $(nproc) -ge 2 ]] || { log "    (needs 2 CPUs: skipped)"; return 0; }
    ORDO_MODEL=inline ORDO_CORES=0-1 tunnel ordo "$1"
    ping_ok "$NS_A" "$IN_B" || fail "ping"
    placed() { ordo_show | python3 -c 'import json,sys; p=json.load(sys.stdin)[0]["peers"][0]["placement"]; print(p["queue"], p["cpu"])'; }
    # Datagrams received by queue Q's thread (its receive stage's packets).
    received() { ordo_show | Q=$1 python3 -c 'import json,os,sys; ts=json.load(sys.stdin)[0]["thread_totals"]; print(sum(st["packets"] for t in ts if t["name"] == "queue" + os.environ["Q"] for st in t["stages"] if st["stage"] == "receive"))'; }
    local queue cpu now=""
    read -r queue cpu < <(placed)
    # In A's namespace, so that teardown ends it whatever happens.
    ip netns exec "$NS_A" taskset -c "$cpu" sh -c 'while :; do :; done' &
    # A little traffic, so that the peer has a load to move (the placement moves none idle).
    ip netns exec "$NS_A" ping -q -i 0.01 -w 30 "$IN_B" >/dev/null &
    local _i
    for _i in $(seq 150); do
        read -r now _ < <(placed)
        [[ $now != "$queue" ]] && break
        sleep 0.1
    done
    [[ $now != "$queue" ]] || fail "the peer stayed on queue $queue, whose CPU $cpu another process keeps busy"
    log "    moved from queue $queue (CPU $cpu, busy) to queue $now"
    # The move's handshake (as soon as the rate limit allows: within REKEY_TIMEOUT).
    for _i in $(seq 100); do
        (($(ordo_counter "$IF_A" handshakes_completed) >= 2)) && break
        sleep 0.1
    done
    (($(ordo_counter "$IF_A" handshakes_completed) >= 2)) || fail "no handshake after the move"
    # Once the peer has received data on the new session it sends on it too (until then it
    # may still use the old one): a few pings first, then count.
    ping_ok "$NS_A" "$IN_B" || fail "ping after the handshake"
    local old0 new0
    old0=$(received "$queue"); new0=$(received "$now")
    ping_ok "$NS_A" "$IN_B" 20 || fail "ping after the move"
    local old=$(($(received "$queue") - old0)) new=$(($(received "$now") - new0))
    log "    then: $new datagrams on the new queue, $old on the old one"
    ((new >= 20 && old == 0)) || fail "datagrams not steered to the new queue (new $new, old $old)"
}

# A starved queue with no queue that has room: both CPUs kept busy by other processes, and
# more traffic than the queue thread's share of its CPU carries (a UDP flood from a sender
# favoured over everything else, as 1,000 clients' load generator was). The placement cannot
# move the peer anywhere better, so the queue's thread is released from its CPU to those of
# its node (device/affinity.rs), as `ordo show` and the thread's affinity say; once the load
# is gone it is pinned again after the hold (10 s), on trial, and stays pinned.
t_starved_queues() {
    [[ $(nproc) -ge 2 ]] || { log "    (needs 2 CPUs: skipped)"; return 0; }
    ORDO_MODEL=inline ORDO_CORES=0-1 tunnel ordo "$1"
    ping_ok "$NS_A" "$IN_B" || fail "ping"
    local pid
    pid=$(pgrep -o -f "ordo.* $IF_A" || true)
    [[ -n $pid ]] || fail "no daemon process for $IF_A"
    # queues: per queue "Q CPU RELEASED RELEASES TID", from ordo show; allowed TID: the
    # thread's CPUs as the kernel has them.
    queues() { ordo_show | python3 -c '
import json, sys
s = json.load(sys.stdin)[0]
tids = {t["name"]: t["tid"] for t in s["thread_totals"]}
for q in s["queues"]:
    print(q["queue"], q["cpu"], int(q["released"]), q["releases"], tids["queue%d" % q["queue"]])'; }
    allowed() { awk '/^Cpus_allowed_list/ {print $2}' "/proc/$pid/task/$1/status"; }
    local q cpu rel n tid
    while read -r q cpu rel n tid; do
        [[ $rel == 0 && $n == 0 && $(allowed "$tid") == "$cpu" ]] || fail "queue $q starts as: released $rel, releases $n, CPUs $(allowed "$tid") (pinned to $cpu expected)"
    done < <(queues)
    # On each CPU a real-time task busy 5 ms of every 10 (no CPU idle, and while it runs no
    # ordinary thread does: a queue thread with work waits about half the time), bounded to
    # 60 s. In A's namespace, so that teardown ends them whatever happens.
    local hogs=() c
    for c in 0 1; do
        ip netns exec "$NS_A" taskset -c "$c" chrt -f 1 python3 -c '
import time
end = time.monotonic() + 60
while time.monotonic() < end:
    t = time.monotonic() + 0.005
    while time.monotonic() < t:
        pass
    time.sleep(0.005)' &
        hogs+=($!)
    done
    ip netns exec "$NS_B" iperf3 -s -1 -p 5203 >/dev/null 2>&1 &
    for _ in $(seq 50); do ip netns exec "$NS_B" ss -lun | grep ':5203 ' >/dev/null && break; sleep 0.1; done
    # More than the queue thread's half of a CPU carries: its TUN queue never runs dry.
    ip netns exec "$NS_A" iperf3 -c "$IN_B" -p 5203 -u -b 2G -l 1392 -t 40 >/dev/null 2>&1 &
    local client=$! released="" _i
    for _i in $(seq 60); do
        released=$(queues | awk '$3 == 1 {print; exit}')
        [[ -n $released ]] && break
        sleep 0.5
    done
    [[ -n $released ]] || fail "no queue released while both CPUs were busy: $(queues | tr '\n' ';')"
    read -r q cpu rel n tid <<<"$released"
    [[ $n == 1 && $(allowed "$tid") == 0-1 ]] || fail "queue $q released ($n releases), but its thread may run on $(allowed "$tid")"
    log "    queue $q (CPU $cpu) released after about $((_i / 2)) s: its thread may run on 0-1"
    kill "${hogs[@]}" "$client" 2>/dev/null || true
    # Pinned again once the hold is over; nothing starved since, so no second release.
    local pinned=""
    for _i in $(seq 40); do
        pinned=$(queues | awk -v q="$q" '$1 == q && $3 == 0 {print}')
        [[ -n $pinned ]] && break
        sleep 0.5
    done
    [[ -n $pinned ]] || fail "queue $q not pinned again after the load ended: $(queues | tr '\n' ';')"
    read -r q cpu rel n tid <<<"$pinned"
    [[ $n == 1 && $(allowed "$tid") == "$cpu" ]] || fail "queue $q pinned again after $n releases, its thread on $(allowed "$tid") (expected $cpu)"
    ping_ok "$NS_A" "$IN_B" || fail "ping after the release and the trial"
}

# The auto model: a peer starts inline; under a heavy flow, with another core free, its
# crypto moves to the pool (shown in `ordo show`), and back once the flow stops and the
# hysteresis delay has passed.
t_auto_regime() {
    [[ $(nproc) -ge 2 ]] || { log "    (needs 2 CPUs: skipped)"; return 0; }
    # Placement fixed: the peer must not leave its queue (the test is about the regime).
    ORDO_MODEL=auto ORDO_CORES=0-1 ORDO_PLACEMENT=fixed tunnel ordo "$1"
    ping_ok "$NS_A" "$IN_B" || fail "ping"
    local regime cpu
    regime() { ordo_show | python3 -c 'import json,sys; print(json.load(sys.stdin)[0]["peers"][0]["placement"]["regime"])'; }
    [[ $(regime) == inline ]] || fail "a new peer starts inline, not $(regime)"
    # Spreading needs another core with room (peers.rs): everything but Ordo shares the
    # peer's queue CPU, so the other core is free for the pool.
    cpu=$(ordo_show | python3 -c 'import json,sys; print(json.load(sys.stdin)[0]["peers"][0]["placement"]["cpu"])')
    local pid
    for pid in $(ip netns pids "$NS_B"); do taskset -a -p -c "$cpu" "$pid" >/dev/null; done
    ip netns exec "$NS_A" taskset -c "$cpu" iperf3 -s -1 -p 5202 >/dev/null 2>&1 &
    for _ in $(seq 50); do ip netns exec "$NS_A" ss -ltn | grep ':5202 ' >/dev/null && break; sleep 0.1; done
    ip netns exec "$NS_B" taskset -c "$cpu" iperf3 -c "$IN_A" -p 5202 -t 10 >/dev/null 2>&1 &
    local client=$! seen=""
    for _ in $(seq 20); do
        sleep 0.5
        [[ $(regime) == pool ]] && { seen=pool; break; }
    done
    [[ $seen == pool ]] || { ordo_show | grep -A3 placement >&2; fail "the heavy peer was not spread over the pool"; }
    wait $client
    seen=""
    for _ in $(seq 30); do
        sleep 0.5
        [[ $(regime) == inline ]] && { seen=inline; break; }
    done
    [[ $seen == inline ]] || fail "the idle peer did not come back inline"
}
