#!/usr/bin/env bash
# `make bench`: runs crust-bench against a freshly started crust daemon.
#
# Starts, in a temp dir: a local docker-registry on 127.0.0.1 (free port),
# a crust daemon with its own socket, root, run dir and a bridge CNI network
# of its own; pushes the bench's busybox-static image; runs crust-bench with
# any extra arguments given (BENCH_ARGS or "$@"); then stops what it started
# (by PID) and removes the temp dir, the bridge and its iptables rules.
#
# The JSON report is left at target/bench.json.
set -euo pipefail

cd "$(dirname "$0")/.."
BIN=${BIN:-target/release}
work=$(mktemp -d /tmp/crust-bench.XXXXXX)
bridge="crbench$((RANDOM % 1000))"
net="crust-bench-$$"
forward_before=$(cat /proc/sys/net/ipv4/ip_forward)
registry_pid=""
daemon_pid=""

stop_pid() {
	local pid=$1
	[[ -n $pid ]] && kill -0 "$pid" 2>/dev/null || return 0
	kill -TERM "$pid" 2>/dev/null || true
	for _ in $(seq 100); do
		kill -0 "$pid" 2>/dev/null || return 0
		sleep 0.1
	done
	kill -KILL "$pid" 2>/dev/null || true
}

cleanup() {
	local rc=$?
	trap - EXIT INT TERM
	set +e
	stop_pid "$daemon_pid"
	stop_pid "$registry_pid"
	# Mounts the daemon may have left under the temp dir (none when the
	# bench removed its pods).
	grep -o " $work[^ ]*" /proc/self/mounts | sort -r | xargs -r umount -l 2>/dev/null || true
	ip link del "$bridge" 2>/dev/null || true
	iptables-save -t nat 2>/dev/null | grep -F -- "$net" | grep '^-A' | sed 's/^-A/-D/' |
		while read -r rule; do eval "iptables -t nat $rule" 2>/dev/null || true; done
	echo "$forward_before" >/proc/sys/net/ipv4/ip_forward 2>/dev/null || true
	if [[ $rc -ne 0 && -f $work/daemon.log ]]; then
		echo "--- daemon log (last 30 lines) ---" >&2
		tail -n 30 "$work/daemon.log" >&2
	fi
	rm -rf "$work"
	exit "$rc"
}
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

free_port() {
	local p
	while :; do
		p=$((20000 + RANDOM % 40000))
		(exec 3<>"/dev/tcp/127.0.0.1/$p") 2>/dev/null || break
	done
	echo "$p"
}

wait_for() {
	local what=$1 check=$2
	for _ in $(seq 150); do
		if eval "$check"; then return 0; fi
		sleep 0.1
	done
	echo "$what did not come up" >&2
	return 1
}

# Registry.
port=$(free_port)
mkdir -p "$work/registry"
cat >"$work/registry.yml" <<EOF
version: 0.1
log:
  level: warn
  accesslog:
    disabled: true
storage:
  filesystem:
    rootdirectory: $work/registry
  delete:
    enabled: true
http:
  addr: 127.0.0.1:$port
  secret: crust-bench
EOF
docker-registry serve "$work/registry.yml" >"$work/registry.log" 2>&1 &
registry_pid=$!
wait_for registry "(exec 3<>/dev/tcp/127.0.0.1/$port) 2>/dev/null"

# Daemon, with a bridge network of its own.
mkdir -p "$work/cni" "$work/ipam"
cat >"$work/cni/50-bench.conflist" <<EOF
{"cniVersion": "1.0.0", "name": "$net", "plugins": [
  {"type": "bridge", "bridge": "$bridge", "isGateway": true, "ipMasq": true,
   "ipam": {"type": "host-local", "dataDir": "$work/ipam",
            "ranges": [[{"subnet": "10.199.$((RANDOM % 250)).0/24"}]],
            "routes": [{"dst": "0.0.0.0/0"}]}},
  {"type": "portmap", "capabilities": {"portMappings": true}}
]}
EOF
: >"$work/config.toml"
"$BIN/crust" daemon --config "$work/config.toml" --socket "$work/crust.sock" \
	--root "$work/root" --run-dir "$work/run" --cni-conf-dir "$work/cni" \
	--log-level warn >/dev/null 2>"$work/daemon.log" &
daemon_pid=$!
wait_for "crust daemon" "[[ -S $work/crust.sock ]]"

image=$("$BIN/crust-bench" push-test-image --registry "127.0.0.1:$port")

# shellcheck disable=SC2086 # BENCH_ARGS is a list of flags
"$BIN/crust-bench" --endpoint "unix://$work/crust.sock" --label crust --daemon-pid "$daemon_pid" \
	--image "$image" --registry "127.0.0.1:$port" --json "$work/bench.json" \
	${BENCH_ARGS:-} "$@"
cp "$work/bench.json" target/bench.json
echo "JSON report: target/bench.json"
