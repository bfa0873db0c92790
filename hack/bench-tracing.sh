#!/usr/bin/env bash
# `make bench-tracing`: what OpenTelemetry tracing costs the daemon. Two
# fresh crust daemons side by side (crust-bench --vs, alternating rounds):
# A exports every call's spans ([tracing] endpoint, sampling_rate_per_million
# = 1000000: crust-bench sends no trace context, so every call is a sampled
# root) to crust-bench's OTLP receiver; B has no endpoint (tracing off, the
# default). Compares their pod and container lifecycles and RSS, and prints
# each daemon's CPU time over the run (utime+stime from /proc). Otherwise as
# hack/bench-metrics.sh.
#
# The JSON report is left at target/bench-tracing.json.
set -euo pipefail

cd "$(dirname "$0")/.."
# shellcheck source=hack/bench-common.sh
. hack/bench-common.sh
off_pid=""
receiver_pid=""
bench_cleanup_extra() {
	stop_pid "$off_pid"
	stop_pid "$receiver_pid"
}
trap bench_cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

# The receiver runs until SIGTERM, then says how many spans it received.
"$BIN/crust-bench" otlp-receiver >"$work/receiver.out" &
receiver_pid=$!
wait_for "OTLP receiver" "[[ -s $work/receiver.out ]]"
endpoint=$(head -n 1 "$work/receiver.out")

cpu_seconds() {
	awk '{ print ($14 + $15) / 100 }' "/proc/$1/stat"
}

start_registry
write_cni_config
# start_crust writes the config (NRI dirs of the run's own) and starts a
# daemon; A is that config with [tracing], B without, each with its NRI dirs.
start_crust
stop_pid "$daemon_pid"
cp -r "$work/nri" "$work/off-nri"
sed "s|$work/nri/|$work/off-nri/|" "$work/crust.toml" >"$work/off.toml"
cp "$work/crust.toml" "$work/on.toml"
cat >>"$work/on.toml" <<EOT
[tracing]
endpoint = "$endpoint"
sampling_rate_per_million = 1000000
EOT
start_daemon() { # name config
	"$BIN/crust" daemon --config "$2" --socket "$work/$1.sock" \
		--root "$work/$1-root" --run-dir "$work/$1-run" --cni-conf-dir "$work/cni" \
		--log-level warn >/dev/null 2>"$work/daemon-$1.log" &
}
start_daemon on "$work/on.toml"
daemon_pid=$!
start_daemon off "$work/off.toml"
off_pid=$!
wait_for "crust daemons" "[[ -S $work/on.sock && -S $work/off.sock ]]"

image=$("$BIN/crust-bench" push-test-image --registry "127.0.0.1:$port")
on_cpu=$(cpu_seconds "$daemon_pid")
off_cpu=$(cpu_seconds "$off_pid")
# shellcheck disable=SC2086 # BENCH_ARGS is a list of flags
"$BIN/crust-bench" --endpoint "unix://$work/on.sock" --label "tracing on" \
	--daemon-pid "$daemon_pid" \
	--vs "unix://$work/off.sock" --vs-label "tracing off" --vs-daemon-pid "$off_pid" \
	--scenario ${BENCH_TRACING_SCENARIOS:-version,pod-host,pod-cni,container,footprint} \
	--handler embedded \
	--image "$image" --registry "127.0.0.1:$port" --cgroup-parent "$cgroup_parent" \
	--json "$work/bench.json" ${BENCH_ARGS:-} "$@"
echo "daemon cpu over the run: tracing on $(echo "$(cpu_seconds "$daemon_pid") - $on_cpu" | bc) s," \
	"tracing off $(echo "$(cpu_seconds "$off_pid") - $off_cpu" | bc) s"
# The last spans arrive within the export interval (5 s).
sleep 6
kill -TERM "$receiver_pid"
wait "$receiver_pid" || true
receiver_pid=""
tail -n 1 "$work/receiver.out"
cp "$work/bench.json" target/bench-tracing.json
echo "JSON report: target/bench-tracing.json"
