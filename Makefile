# Ordo: the two commands of the README, and the pieces they are made of.
SHELL := /bin/bash
CARGO ?= cargo

.PHONY: all build demo test lint unit smoltcp-test interop interop-quick stack loadgen lab-short lab bench fuzz fuzz-campaign fuzz-rate clean

all: build

build:
	tests/install-deps.sh --build
	$(CARGO) build --release --locked

## make demo: two namespaces, an Ordo tunnel, ping and a 10-second iperf3, figures, cleanup.
demo: build
	tests/install-deps.sh --no-peers
	scripts/demo.sh

## make test: formatting, lints, unit tests, the interop suite against real peers (in every
## execution model), programs through Ordo's own TCP/IP stack (`ordo run`, unprivileged), the
## load generator against each implementation, and a short run of each lab scenario (report
## and figures built end to end).
test: lint unit interop stack loadgen lab-short

lint:
	tests/install-deps.sh --build
	$(CARGO) fmt --all -- --check
	$(CARGO) clippy --all-targets --locked -- -D warnings
	@test -z "$$(gofmt -l grafana/schema-check)" || { gofmt -l grafana/schema-check; echo 'lint: gofmt'; exit 1; }
	@# Under pipefail, `cmd | grep -q` fails at random: grep quits at the first match and a
	@# writer that flushes per line (ip, ss) dies of SIGPIPE. Pipes end in `grep ... >/dev/null`.
	@! grep -nE '\| *(grep -[a-zA-Z]*q|head)' tests/*.sh tests/interop/*.sh tests/stack/*.sh lab/*.sh scripts/*.sh .ci/run \
		|| { echo 'lint: a pipe into grep -q or head (see the Makefile comment)'; exit 1; }

unit: smoltcp-test
	tests/install-deps.sh --build
	$(CARGO) test --workspace --locked
	@# The binary users run is the release one, where moves and stack reuse differ: keys are
	@# looked for in freed memory there too.
	$(CARGO) test --release --locked -p ordo --test secrets
	@# The protocol as the fuzz campaign builds it (cfg fuzzing: its curve and hash results
	@# remembered, crates/ordo-proto/src/memo.rs): the same test vectors and handshakes pass.
	RUSTFLAGS="--cfg fuzzing" $(CARGO) test --locked -p ordo-proto --target-dir target/cfg-fuzzing
	python3 scripts/profile-classify-test.py

# The vendored smoltcp that carries Ordo's TCP patches (third_party/README.md), with its own
# tests and those of the patches.
smoltcp-test:
	cd third_party/smoltcp && $(CARGO) test --lib --locked --features socket-tcp-cubic,socket-tcp-reno
	@# With segmentation offload, as Ordo builds it; upstream's own test of it fails on the
	@# pristine 0.14.0 too (third_party/README.md), so it is skipped.
	cd third_party/smoltcp && $(CARGO) test --lib --locked --features socket-tcp-cubic,socket-tcp-reno,segmentation-offload \
		-- --skip socket::tcp::test::test_segmentation_offload

interop: build
	tests/install-deps.sh
	tests/interop/interop.sh

# Unmodified programs through `ordo run` (no root, no TUN) against a peer with TUN.
stack: build
	tests/install-deps.sh
	tests/stack/stack.sh wireguard-go

# The load generator: 24 clients against Ordo, wireguard-go and boringtun, then 8 clients
# rekeying on their own timers (130 s).
loadgen: build
	tests/install-deps.sh
	tests/loadgen.sh

# The papers' experiments (lab/lab.sh): short versions in make test, full ones on demand.
lab-short: build
	tests/install-deps.sh
	lab/lab.sh many-clients --short
	test -s lab/out/many-clients/report.md && test -s lab/out/many-clients/throughput-up.svg
	lab/lab.sh inversion --short
	test -s lab/out/inversion/report.md && test -s lab/out/inversion/cores.svg
	lab/lab.sh many-tunnels --short
	test -s lab/out/many-tunnels/report.md && test -s lab/out/many-tunnels/tunnels.svg
	lab/lab.sh soak --short
	test -s lab/out/soak/report.md && test -s lab/out/soak/rss.svg

lab: build
	tests/install-deps.sh
	lab/lab.sh many-clients
	lab/lab.sh inversion
	lab/lab.sh many-tunnels
	lab/lab.sh soak

# The suite without the ~130 s rekey test.
interop-quick: build
	tests/install-deps.sh
	tests/interop/interop.sh --quick

## make bench: end-to-end throughput against wireguard-go and boringtun, same run.
bench: build
	tests/install-deps.sh
	scripts/bench-e2e.sh

## make fuzz: each fuzz target under libFuzzer for FUZZ_SECONDS (nightly toolchain; cargo-fuzz
## is installed if missing); make fuzz-campaign: the recorded campaign, an hour each by default.
## Both keep the minimised corpus in fuzz/corpus and append their figures to fuzz/campaign.tsv.
## make test runs every target's short version (its corpus, then mutations) on stable.
FUZZ_SECONDS ?= 60
fuzz:
	scripts/fuzz-campaign.sh $(FUZZ_SECONDS)

fuzz-campaign:
	scripts/fuzz-campaign.sh $(or $(CAMPAIGN_SECONDS),3600)

## make fuzz-rate: a target's executions a second without libFuzzer's instrumentation, over its
## kept corpus (FUZZ_TARGET, session by default): the ceiling of what a campaign reaches here.
FUZZ_TARGET ?= session
fuzz-rate:
	RUSTFLAGS="--cfg fuzzing" $(CARGO) run -q --release --locked --target-dir target/cfg-fuzzing \
		-p ordo-fuzz-targets --bin fuzz-rate -- $(FUZZ_TARGET) 20

clean:
	$(CARGO) clean
