#!/usr/bin/env bash
# Installs what the interop suite and the demo need, on a fresh Debian 12 machine as root.
# Peers are pinned: wireguard-go by Go pseudo-version, boringtun-cli 0.7.1.
set -euo pipefail

WIREGUARD_GO_VERSION="v0.0.0-20260522210424-ecfc5a8d5446"
BORINGTUN_VERSION="0.7.1"

# --build: only what building Ordo needs (make build and lint run it first); --no-peers:
# everything but the peers built from source.
need_apt=()
# The etcd client's build compiles etcd's protocol with protoc, which needs the well-known
# types (google/protobuf/*.proto).
command -v protoc >/dev/null 2>&1 || need_apt+=(protobuf-compiler)
dpkg -s libprotobuf-dev >/dev/null 2>&1 || need_apt+=(libprotobuf-dev)
[[ "${1:-}" == --build ]] || for pair in wg:wireguard-tools iperf3:iperf3 ping:iputils-ping tcpdump:tcpdump ip:iproute2 python3:python3 nft:nftables \
    curl:curl nc:netcat-openbsd setpriv:util-linux dnsmasq:dnsmasq-base ssh:openssh-client sshd:openssh-server tmux:tmux \
    ethtool:ethtool conntrack:conntrack gcc:gcc \
    promtool:prometheus etcd:etcd-server etcdctl:etcd-client vtysh:frr openssl:openssl; do
    command -v "${pair%%:*}" >/dev/null 2>&1 || need_apt+=("${pair#*:}")
done
# The leak suite's probe is built static too (tests/stack/leak-probe.c): the C library's
# archive, which gcc does not pull in without its recommendations.
[[ "${1:-}" == --build ]] || dpkg -s libc6-dev >/dev/null 2>&1 || need_apt+=(libc6-dev)
if ((${#need_apt[@]})); then
    echo "install-deps: apt-get install ${need_apt[*]}"
    apt-get update -qq
    # No package's service is started (openssh-server's sshd would listen on the host): the
    # tests run their own servers in namespaces. Debian's policy-rc.d says so to the
    # maintainer scripts, for the install only.
    policy=/usr/sbin/policy-rc.d
    own_policy=0
    if ! [[ -e $policy ]]; then
        printf '#!/bin/sh\nexit 101\n' >"$policy"
        chmod 755 "$policy"
        own_policy=1
    fi
    # --no-install-recommends: wireguard-tools would otherwise pull in a kernel image.
    status=0
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${need_apt[@]}" >/dev/null || status=$?
    if ((own_policy)); then rm -f "$policy"; fi
    ((status == 0)) || exit "$status"
fi

GOBIN_DIR="$(go env GOPATH 2>/dev/null || echo "$HOME/go")/bin"
if [[ "${1:-}" != --no-peers && "${1:-}" != --build ]]; then
    if ! [[ -x "$GOBIN_DIR/wireguard" ]] || ! grep -q "$WIREGUARD_GO_VERSION" <(go version -m "$GOBIN_DIR/wireguard" 2>/dev/null); then
        echo "install-deps: go install golang.zx2c4.com/wireguard@$WIREGUARD_GO_VERSION"
        go install "golang.zx2c4.com/wireguard@$WIREGUARD_GO_VERSION"
    fi
    if ! boringtun-cli --version 2>/dev/null | grep "$BORINGTUN_VERSION" >/dev/null; then
        echo "install-deps: cargo install boringtun-cli $BORINGTUN_VERSION"
        cargo install -q boringtun-cli --version "$BORINGTUN_VERSION" --locked
    fi
fi
