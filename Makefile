# crust — build, run and test.
#
#   make run    installs what the daemon needs, builds release, runs it in the
#               foreground with the default config (/etc/crust/config.toml)
#   make test   installs what the tests need and runs the whole suite
#   make bench  builds release and benchmarks a freshly started crust
#               (hack/bench.sh; extra crust-bench flags in BENCH_ARGS)
#   make bench-vs-containerd
#               the same, side by side with a freshly started containerd
#               (Debian's, installed if missing; hack/bench-vs-containerd.sh)
#
# All are meant for a fresh Debian 12 machine, as root.

SHELL := /bin/bash
CARGO ?= cargo
RUN_ARGS ?=

# Debian packages: what the daemon uses at run time, and what tests add.
RUN_PACKAGES := runc crun containernetworking-plugins iptables iproute2 libseccomp2
BUILD_PACKAGES := build-essential pkg-config libseccomp-dev
TEST_PACKAGES := $(RUN_PACKAGES) $(BUILD_PACKAGES) docker-registry busybox-static
BENCH_PACKAGES := $(RUN_PACKAGES) $(BUILD_PACKAGES) docker-registry busybox-static
BENCH_ARGS ?=

.PHONY: run build release test bench bench-vs-containerd deps-run deps-test deps-bench fmt lint critest clean

run: deps-run release
	./target/release/crust daemon --install-default-conflist $(RUN_ARGS)

release: deps-build
	$(CARGO) build --release --bins

build: deps-build
	$(CARGO) build --bins

# The monitor's memory budget (idle, and with an exec) holds for release
# builds only: its test asserts it in a release run of its own.
test: deps-test
	$(CARGO) build --bins
	$(CARGO) test --workspace --no-fail-fast -- --test-threads=2
	$(CARGO) test --release -p crust-shim --test e2e idle_memory -- --test-threads=1

bench: deps-bench
	$(CARGO) build --release -p crust-runtime -p crust-shim -p crust-bench
	BENCH_ARGS='$(BENCH_ARGS)' hack/bench.sh

bench-vs-containerd: deps-bench
	$(CARGO) build --release -p crust-runtime -p crust-shim -p crust-bench
	BENCH_ARGS='$(BENCH_ARGS)' hack/bench-vs-containerd.sh

deps-run:
	@hack/apt-install.sh $(RUN_PACKAGES) $(BUILD_PACKAGES)

deps-build:
	@hack/apt-install.sh $(BUILD_PACKAGES)

deps-test:
	@hack/apt-install.sh $(TEST_PACKAGES)

deps-bench:
	@hack/apt-install.sh $(BENCH_PACKAGES)

fmt:
	$(CARGO) fmt --all

lint:
	$(CARGO) fmt --all -- --check
	$(CARGO) clippy --workspace --all-targets -- -D warnings

# Conformance against a running daemon (see README: needs crictl/critest and
# the images critest pulls, served by a local registry).
CRITEST_FOCUS ?=
critest:
	critest --runtime-endpoint unix:///run/crust/crust.sock \
		--image-endpoint unix:///run/crust/crust.sock \
		$(if $(CRITEST_FOCUS),--ginkgo.focus='$(CRITEST_FOCUS)')

clean:
	$(CARGO) clean
