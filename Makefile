# crust — build, run and test.
#
#   make run    installs what the daemon needs, builds release, runs it in the
#               foreground with the default config (/etc/crust/config.toml)
#   make test   installs what the tests need and runs the whole suite
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
#
# All are meant for a fresh Debian 12 machine, as root.

SHELL := /bin/bash
CARGO ?= cargo
RUN_ARGS ?=

# Debian packages: what the daemon uses at run time, and what tests add.
RUN_PACKAGES := runc crun containernetworking-plugins iptables iproute2 libseccomp2
BUILD_PACKAGES := build-essential pkg-config libseccomp-dev
TEST_PACKAGES := $(RUN_PACKAGES) $(BUILD_PACKAGES) docker-registry busybox-static python3-venv
# PyPI packages of the tests' independent peers (a grpc-core client, the
# Prometheus project's own text parser), in a venv under target/.
TEST_VENV := target/test-venv
TEST_PY_PACKAGES := grpcio grpcio-tools prometheus-client
BENCH_PACKAGES := $(RUN_PACKAGES) $(BUILD_PACKAGES) docker-registry busybox-static
BENCH_ARGS ?=

.PHONY: install install-files run build release test bench bench-vs-containerd bench-metrics deps-run deps-test deps-bench fmt lint critest clean

run: deps-run release
	./target/release/crust daemon --install-default-conflist $(RUN_ARGS)

release: deps-build
	$(CARGO) build --release --bins

build: deps-build
	$(CARGO) build --bins

test: deps-test
	$(CARGO) build --bins
	$(CARGO) test --workspace --no-fail-fast -- --test-threads=2

bench: deps-bench
	$(CARGO) build --release -p crust-runtime -p crust-shim -p crust-bench
	BENCH_ARGS='$(BENCH_ARGS)' hack/bench.sh

bench-vs-containerd: deps-bench
	$(CARGO) build --release -p crust-runtime -p crust-shim -p crust-bench
	BENCH_ARGS='$(BENCH_ARGS)' hack/bench-vs-containerd.sh

bench-metrics: deps-bench
	$(CARGO) build --release -p crust-runtime -p crust-shim -p crust-bench
	BENCH_ARGS='$(BENCH_ARGS)' hack/bench-metrics.sh

deps-run:
	@hack/apt-install.sh $(RUN_PACKAGES) $(BUILD_PACKAGES)

deps-build:
	@hack/apt-install.sh $(BUILD_PACKAGES)

deps-test:
	@hack/apt-install.sh $(TEST_PACKAGES)
	@test -x $(TEST_VENV)/bin/python3 || /usr/bin/python3 -m venv $(TEST_VENV)
	@$(TEST_VENV)/bin/python3 -c 'import grpc, grpc_tools, prometheus_client' 2>/dev/null || \
		$(TEST_VENV)/bin/pip install -q --disable-pip-version-check $(TEST_PY_PACKAGES)

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
