#!/usr/bin/env bash
# `make bench-metrics`: what the metrics endpoint costs. Two fresh crust
# daemons side by side (crust-bench --vs, alternating rounds): A serves
# /metrics and /healthz ([metrics] address), B has no endpoint. Compares
# their pod and container lifecycles (both count and time every CRI call;
# only A serves the figures), and scrapes A's /metrics while the density
# scenario's pods (100 by default) run: scrape latency, response size,
# daemon CPU per scrape. Otherwise as hack/bench.sh (temp dir, registry, bridge network,
# everything stopped by PID and removed at exit).
#
# Each round runs A first. BENCH_METRICS_FIRST=off makes the daemon
# without the endpoint A, to tell the endpoint's cost from an order bias.
#
# The JSON report is left at target/bench-metrics.json.
set -euo pipefail

cd "$(dirname "$0")/.."
# shellcheck source=hack/bench-common.sh
. hack/bench-common.sh
off_pid=""
bench_cleanup_extra() {
	stop_pid "$off_pid"
}
trap bench_cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

start_registry
write_cni_config
metrics_port=$(free_port)
start_crust --metrics-address "127.0.0.1:$metrics_port"
# B: the same config, but its own NRI socket and plugin dirs.
cp -r "$work/nri" "$work/off-nri"
sed "s|$work/nri/|$work/off-nri/|" "$work/crust.toml" >"$work/off.toml"
"$BIN/crust" daemon --config "$work/off.toml" --socket "$work/off.sock" \
	--root "$work/off-root" --run-dir "$work/off-run" --cni-conf-dir "$work/cni" \
	--log-level warn >/dev/null 2>"$work/daemon-off.log" &
off_pid=$!
wait_for "crust daemon without metrics" "[[ -S $work/off.sock ]]"

image=$("$BIN/crust-bench" push-test-image --registry "127.0.0.1:$port")

on=(--endpoint "unix://$work/crust.sock" --label "metrics on" --daemon-pid "$daemon_pid"
	--metrics-url "http://127.0.0.1:$metrics_port/metrics")
off=(--vs "unix://$work/off.sock" --vs-label "metrics off" --vs-daemon-pid "$off_pid")
if [[ ${BENCH_METRICS_FIRST:-on} == off ]]; then
	on=(--vs "unix://$work/crust.sock" --vs-label "metrics on" --vs-daemon-pid "$daemon_pid"
		--vs-metrics-url "http://127.0.0.1:$metrics_port/metrics")
	off=(--endpoint "unix://$work/off.sock" --label "metrics off" --daemon-pid "$off_pid")
fi
# shellcheck disable=SC2086 # BENCH_ARGS is a list of flags
"$BIN/crust-bench" "${on[@]}" "${off[@]}" \
	--scenario version,pod-host,container,density --handler embedded \
	--image "$image" --registry "127.0.0.1:$port" --cgroup-parent "$cgroup_parent" \
	--json "$work/bench.json" ${BENCH_ARGS:-} "$@"
cp "$work/bench.json" target/bench-metrics.json
echo "JSON report: target/bench-metrics.json"
