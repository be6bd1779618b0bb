#!/usr/bin/env bash
# The interop suite: Ordo against wireguard-go, boringtun and itself, in network namespaces,
# with real traffic. Run as root after `cargo build --release`:
#
#   tests/interop/interop.sh [--quick] [TEST...]
#
# --quick skips the ~30 s rekey test. Prints one line per test and ends with
# "interop: N passed, N failed".
set -uo pipefail
source "$(dirname "$0")/lib.sh"

QUICK=0
SELECTED=()
for a in "$@"; do
    case "$a" in
        --quick) QUICK=1 ;;
        *) SELECTED+=("$a") ;;
    esac
done

PASSED=0
FAILED=0
FAILED_NAMES=()
trap teardown EXIT

fail() { log "    FAIL: $*"; return 1; }

# ping_ok NS ADDR [COUNT] [DEADLINE]: every one of COUNT echo requests answered in time.
ping_ok() { ip netns exec "$1" ping -q -c "${3:-3}" -i 0.2 -w "${4:-10}" "$2" >/dev/null; }

run_test() {
    local name=$1
    shift
    if ((${#SELECTED[@]})) && ! printf '%s\n' "${SELECTED[@]}" | grep -x "${name%%[*}" >/dev/null; then
        return
    fi
    local start=$SECONDS rc
    # Not inside `if`: bash ignores `set -e` in a subshell that is an if condition.
    ( set -e; "$@" )
    rc=$?
    if ((rc == 0)); then
        PASSED=$((PASSED + 1))
        printf 'ok    %-40s %3ds\n' "$name" $((SECONDS - start))
    else
        FAILED=$((FAILED + 1))
        FAILED_NAMES+=("$name")
        printf 'FAIL  %-40s %3ds   (logs: %s)\n' "$name" $((SECONDS - start)) "$LOGDIR"
    fi
    teardown
}

# The tests by topic, host A running Ordo and host B the peer under test. Each file is
# sourced here; a helper one file defines, a later one may use.
for topic in tunnel control offloads placement faults floods xdp observability fleet failover; do
    source "$(dirname "$0")/$topic.sh"
done

# The data-plane tests run in every execution model (ORDO_MODEL reaches every Ordo started);
# INTEROP_MODELS narrows the list.
PEERS=(wireguard-go boringtun ordo)
read -ra MODELS <<<"${INTEROP_MODELS:-pool inline threaded auto}"
for model in "${MODELS[@]}"; do
    export ORDO_MODEL=$model
    for p in "${PEERS[@]}"; do
        run_test "ordo_initiates[$p,$model]" t_ordo_initiates "$p"
        run_test "peer_initiates[$p,$model]" t_peer_initiates "$p"
        run_test "iperf3[$p,$model]" t_iperf3 "$p"
        run_test "integrity[$p,$model]" t_integrity "$p"
        run_test "psk[$p,$model]" t_psk "$p"
        run_test "roaming[$p,$model]" t_roaming "$p"
        run_test "keepalive[$p,$model]" t_keepalive "$p"
        # boringtun sends a datagram per system call, so Ordo's batches would merge by chance.
        [[ $p == boringtun ]] || run_test "udp_gro[$p,$model]" t_udp_gro "$p"
    done
done
unset ORDO_MODEL
run_test "uso[wireguard-go]" t_uso wireguard-go
run_test "inline_steering[wireguard-go]" t_inline_steering wireguard-go
run_test "auto_regime[wireguard-go]" t_auto_regime wireguard-go
run_test "busy_core[wireguard-go]" t_busy_core wireguard-go
run_test "starved_queues[wireguard-go]" t_starved_queues wireguard-go
run_test "cookie[wireguard-go]" t_cookie wireguard-go
run_test "bad_input" t_bad_input
run_test "os_drops" t_os_drops
run_test "config" t_config
run_test "set_atomic" t_set_atomic
run_test "default_route[wireguard-go]" t_default_route wireguard-go
run_test "privileges" t_privileges
run_test "privileges_flags" t_privileges_flags
run_test "sigterm_under_load" t_sigterm_under_load
run_test "tun_deleted_under_load" t_tun_deleted_under_load
run_test "outer_address_removed" t_outer_address_removed
run_test "syncconf_churn" t_syncconf_churn
run_test "peer_gone_and_back" t_peer_gone_and_back
run_test "memory_limit" t_memory_limit
run_test "flood_handshake" t_flood_handshake
run_test "flood_random" t_flood_random
run_test "flood_replay" t_flood_replay
for p in "${PEERS[@]}"; do
    for family in 4 6; do
        run_test "xdp[$p,ipv$family]" t_xdp "$p" "$family" native
    done
done
run_test "xdp_generic[wireguard-go]" t_xdp wireguard-go 4 generic
run_test "xdp_mtu" t_xdp_mtu
run_test "xdp_sigkill" t_xdp_sigkill
run_test "xdp_fallback" t_xdp_fallback
run_test "metrics" t_metrics
run_test "local_flood" t_local_flood
run_test "logs" t_logs
run_test "detectors" t_detectors
run_test "top" t_top
run_test "doctor" t_doctor
run_test "fleet_peers" t_fleet_peers
run_test "fleet_bgp" t_fleet_bgp
run_test "fleet_health" t_fleet_health
run_test "fleet_tls" t_fleet_tls
run_test "fleet_failover" t_fleet_failover
if ((QUICK == 0)); then
    run_test "rekey[wireguard-go]" t_rekey wireguard-go
fi

echo "interop: $PASSED passed, $FAILED failed"
((FAILED == 0)) || { printf 'failed: %s\n' "${FAILED_NAMES[*]}"; exit 1; }
