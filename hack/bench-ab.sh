#!/usr/bin/env bash
# `make bench-ab BASE_BIN=DIR`: crust-bench against two crust builds side
# by side (`--vs`): A is this tree's release build (target/release), B the
# binaries in BASE_BIN (crust and crust-shim of another commit, e.g. a
# worktree's target/release). Same machine, image, registry and CNI network,
# alternating rounds, so a change's effect shows as A/B ratios even on a
# busy machine. Cleanup as in hack/bench.sh (both daemons by PID).
#
# The JSON report is left at target/bench-ab.json.
set -euo pipefail

cd "$(dirname "$0")/.."
base=${BASE_BIN:?set BASE_BIN to the directory holding the baseline crust and crust-shim}
base=$(cd "$base" && pwd)
[[ -x $base/crust && -x $base/crust-shim ]] || {
	echo "BASE_BIN=$base has no crust and crust-shim" >&2
	exit 2
}

# shellcheck source=hack/bench-common.sh
. hack/bench-common.sh
base_pid=""
bench_cleanup_extra() { stop_pid "$base_pid"; }
trap bench_cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

start_registry
write_cni_config
start_crust
mkdir -p "$work/base"
start_crust_from "$base" "$work/base"
base_pid=$crust_pid

image=$("$BIN/crust-bench" push-test-image --registry "127.0.0.1:$port")

# shellcheck disable=SC2086 # BENCH_ARGS is a list of flags
"$BIN/crust-bench" --endpoint "unix://$work/crust.sock" --label this --daemon-pid "$daemon_pid" \
	--vs "unix://$work/base/crust.sock" --vs-label base --vs-daemon-pid "$base_pid" \
	--image "$image" --registry "127.0.0.1:$port" --cgroup-parent "$cgroup_parent" --signature-policy-dir "$work/policies" \
	--json "$work/bench.json" ${BENCH_ARGS:-} "$@"
cp "$work/bench.json" target/bench-ab.json
echo "JSON report: target/bench-ab.json"
