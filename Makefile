# crust — build, run and test.
#
#   make run    installs what the daemon needs, builds release, runs it in the
#               foreground with the default config (/etc/crust/config.toml)
#   make test   installs what the tests need and runs the whole suite on
#               this host, then VM_TEST_SUITES in the VM test bed (hack/vm:
#               cgroup v2, systemd, AppArmor; once per cgroup driver)
#   make test-host  the host part alone
#   make test-vm  every suite of VM_SUITES in the VM test bed
#   make vm-shell   a shell in a fresh VM of the test bed (gone on exit)
#   make install  builds release, installs crust and crust-shim, the systemd
#               unit and (if absent) /etc/crust/config.toml (PREFIX, DESTDIR)
#   make bench  builds release and benchmarks a freshly started crust
#               (hack/bench.sh; extra crust-bench flags in BENCH_ARGS)
#   make bench-vs-containerd
#               the same, side by side with a freshly started containerd
#               (Debian's, installed if missing; hack/bench-vs-containerd.sh)
#   make bench-metrics
#               what the metrics endpoint costs: crust with and without it
#               side by side, and /metrics scraped with 100 pods running
#               (hack/bench-metrics.sh)
#   make bench-tracing
#               what OpenTelemetry tracing costs: crust exporting every
#               call's spans to a local OTLP receiver beside crust without
#               tracing (hack/bench-tracing.sh)
#
# All are meant for a fresh Debian 12 machine, as root.

SHELL := /bin/bash
CARGO ?= cargo
RUN_ARGS ?=

# Debian packages: what the daemon uses at run time, and what tests add.
RUN_PACKAGES := runc crun containernetworking-plugins iptables iproute2 libseccomp2
BUILD_PACKAGES := build-essential pkg-config libseccomp-dev
TEST_PACKAGES := $(RUN_PACKAGES) $(BUILD_PACKAGES) docker-registry busybox-static python3-venv criu
# PyPI packages of the tests' independent peers (a grpc-core client, the
# Prometheus project's own text parser), in a venv under target/.
TEST_VENV := target/test-venv
TEST_PY_PACKAGES := grpcio grpcio-tools prometheus-client
BENCH_PACKAGES := $(RUN_PACKAGES) $(BUILD_PACKAGES) docker-registry busybox-static
BENCH_ARGS ?=

# Integration suites for the VM test bed (hack/vm), as PACKAGE:TEST; a
# suffix @cgroupfs runs one only in that driver's pass (the driver does not
# reach it). make test runs VM_TEST_SUITES, those whose results in the VM
# are known (failures for a known reason are listed in
# hack/vm/known-failing); make test-vm runs them all (VM_SUITES).
# hack/vm/README.md says what each costs.
VM_TEST_SUITES ?= crust-cgroups:host crust-tests:cgroups crust-tests:foundation@cgroupfs \
	crust-tests:pods crust-tests:apparmor@cgroupfs
VM_SUITES ?= crust-cgroups:host crust-tests:cgroups crust-tests:foundation crust-tests:pods \
	crust-tests:containers \
	crust-tests:streaming crust-shim:e2e@cgroupfs crust-linux:pod_sandbox@cgroupfs \
	crust-network:cni_plugins@cgroupfs crust-tests:apparmor@cgroupfs crust-tests:systemd_unit \
	crust-tests:checkpoint@cgroupfs
TEST_LOG_DIR := $(or $(CARGO_TARGET_DIR),target)

.PHONY: install install-files run build release test test-host test-vm vm-shell bench bench-vs-containerd bench-ab bench-metrics bench-tracing deps-run deps-test deps-vm deps-bench fmt lint docs critest clean

run: deps-run release
	./target/release/crust daemon --install-default-conflist $(RUN_ARGS)

release: deps-build
	$(CARGO) build --release --bins

build: deps-build
	$(CARGO) build --bins

# Both parts run even when the first fails; the status is either's.
test: deps-test deps-vm
	$(CARGO) build --bins
	@status=0; t=$$SECONDS; $(RUN_HOST_TESTS) || status=1; \
	$(RELEASE_MEMORY_TEST) || status=1; host=$$((SECONDS - t)); \
	t=$$SECONDS; hack/vm/test.sh $(VM_TEST_SUITES) || status=1; \
	echo "make test: host part $$host s, VM part $$((SECONDS - t)) s"; exit $$status

# The monitor's memory budget (idle, and with an exec) holds for release
# builds only: its test asserts it in a release run of its own.
test-host: deps-test
	$(CARGO) build --bins
	@status=0; $(RUN_HOST_TESTS) || status=1; $(RELEASE_MEMORY_TEST) || status=1; exit $$status

test-vm: deps-test deps-vm
	hack/vm/test.sh $(VM_SUITES)

vm-shell: deps-vm
	hack/vm/shell.sh

# cargo's own report, then the counts with self-reported skips (crust-test-support
# require!) told apart from passes.
# The crash test kills the daemon at every named crash point and at
# CRUST_KILL_TRIALS (default 2) random moments into each RPC; the seed it
# prints replays the delays (CRUST_KILL_SEED).
RUN_HOST_TESTS = (mkdir -p $(TEST_LOG_DIR); \
	$(CARGO) test --workspace --no-fail-fast -- --test-threads=2 2>&1 | tee $(TEST_LOG_DIR)/test-host.log; \
	r=$${PIPESTATUS[0]}; hack/test-summary.sh host $(TEST_LOG_DIR)/test-host.log; exit $$r)

RELEASE_MEMORY_TEST = $(CARGO) test --release -p crust-shim --test e2e idle_memory -- --test-threads=1

bench: deps-bench
	$(CARGO) build --release -p crust-runtime -p crust-shim -p crust-bench -p crust-nri
	BENCH_ARGS='$(BENCH_ARGS)' hack/bench.sh

bench-vs-containerd: deps-bench
	$(CARGO) build --release -p crust-runtime -p crust-shim -p crust-bench
	BENCH_ARGS='$(BENCH_ARGS)' hack/bench-vs-containerd.sh

bench-ab: deps-bench
	$(CARGO) build --release -p crust-runtime -p crust-shim -p crust-bench
	BASE_BIN='$(BASE_BIN)' BENCH_ARGS='$(BENCH_ARGS)' hack/bench-ab.sh

bench-metrics: deps-bench
	$(CARGO) build --release -p crust-runtime -p crust-shim -p crust-bench
	BENCH_ARGS='$(BENCH_ARGS)' hack/bench-metrics.sh

bench-tracing: deps-bench
	$(CARGO) build --release -p crust-runtime -p crust-shim -p crust-bench
	BENCH_ARGS='$(BENCH_ARGS)' hack/bench-tracing.sh

deps-run:
	@hack/apt-install.sh $(RUN_PACKAGES) $(BUILD_PACKAGES)

deps-build:
	@hack/apt-install.sh $(BUILD_PACKAGES)

deps-test:
	@hack/apt-install.sh $(TEST_PACKAGES)
	@test -x $(TEST_VENV)/bin/python3 || /usr/bin/python3 -m venv $(TEST_VENV)
	@$(TEST_VENV)/bin/python3 -c 'import grpc, grpc_tools, prometheus_client' 2>/dev/null || \
		$(TEST_VENV)/bin/pip install -q --disable-pip-version-check $(TEST_PY_PACKAGES)

deps-vm:
	@hack/vm/deps.sh

deps-bench:
	@hack/apt-install.sh $(BENCH_PACKAGES)

# Installs what `make release` built. The config is written only if there
# is none; the unit is not enabled or started (systemctl enable --now crust).
# install-files installs the binaries in BIN_DIR without building them (the
# systemd unit test installs the binaries under test into a DESTDIR).
PREFIX ?= /usr/local
DESTDIR ?=
BIN_DIR ?= target/release
install: release
	@$(MAKE) --no-print-directory install-files BIN_DIR=target/release

install-files:
	install -D -m 0755 $(BIN_DIR)/crust $(DESTDIR)$(PREFIX)/bin/crust
	install -D -m 0755 $(BIN_DIR)/crust-shim $(DESTDIR)$(PREFIX)/bin/crust-shim
	install -D -m 0644 README.md $(DESTDIR)$(PREFIX)/share/doc/crust/README.md
	for f in docs/*.md; do install -D -m 0644 $$f $(DESTDIR)$(PREFIX)/share/doc/crust/$$f; done
	install -d -m 0755 $(DESTDIR)/etc/systemd/system
	sed -e 's|/usr/local/bin/crust |$(PREFIX)/bin/crust |' \
		-e 's|/usr/local/share/doc/crust/|$(PREFIX)/share/doc/crust/|' \
		contrib/systemd/crust.service > $(DESTDIR)/etc/systemd/system/crust.service
	chmod 0644 $(DESTDIR)/etc/systemd/system/crust.service
	@if [ -e $(DESTDIR)/etc/crust/config.toml ]; then \
		echo "kept the existing $(DESTDIR)/etc/crust/config.toml"; \
	else \
		install -d -m 0755 $(DESTDIR)/etc/crust; \
		$(BIN_DIR)/crust config default > $(DESTDIR)/etc/crust/config.toml; \
		echo "wrote the default $(DESTDIR)/etc/crust/config.toml"; \
	fi
	@echo
	@echo "next: systemctl daemon-reload && systemctl enable --now crust"
	@echo "crictl: put this in /etc/crictl.yaml:"
	@echo "  runtime-endpoint: unix:///run/crust/crust.sock"
	@echo "  image-endpoint: unix:///run/crust/crust.sock"

fmt:
	$(CARGO) fmt --all

# docs/configuration.md's defaults block, from `crust config default` (a unit
# test fails when it is stale).
docs: build
	hack/gen-config-doc.sh

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
