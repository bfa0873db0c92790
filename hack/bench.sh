#!/usr/bin/env bash
# `make bench`: runs crust-bench against a freshly started crust daemon.
#
# Starts, in a temp dir: a local docker-registry on 127.0.0.1 (free port),
# a crust daemon with its own socket, root, run dir and a bridge CNI network
# of its own; pushes the bench's busybox-static image; runs crust-bench with
# any extra arguments given (BENCH_ARGS or "$@"); then stops what it started
# (by PID) and removes the temp dir, the bridge, its iptables rules and the
# pods' cgroup parent.
#
# The JSON report is left at target/bench.json.
set -euo pipefail

cd "$(dirname "$0")/.."
# shellcheck source=hack/bench-common.sh
. hack/bench-common.sh
trap bench_cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

start_registry
write_cni_config
start_crust

image=$("$BIN/crust-bench" push-test-image --registry "127.0.0.1:$port")

# shellcheck disable=SC2086 # BENCH_ARGS is a list of flags
"$BIN/crust-bench" --endpoint "unix://$work/crust.sock" --label crust --daemon-pid "$daemon_pid" \
	--image "$image" --registry "127.0.0.1:$port" --cgroup-parent "$cgroup_parent" --signature-policy-dir "$work/policies" \
	--json "$work/bench.json" ${BENCH_ARGS:-} "$@"
cp "$work/bench.json" target/bench.json
echo "JSON report: target/bench.json"
