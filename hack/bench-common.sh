# Shared by hack/bench.sh, bench-vs-containerd.sh, bench-ab.sh and bench-metrics.sh (sourced, not run).
#
# Everything lives under $work (a fresh temp dir); what is started is
# recorded by PID and stopped by PID; network state is named after this run.
# The caller sets `trap bench_cleanup EXIT` and may define
# `bench_cleanup_extra` (run first, with errors ignored).

BIN=${BIN:-target/release}
work=$(mktemp -d /tmp/crust-bench.XXXXXX)
bridge="crbench$((RANDOM % 1000))"
net="crust-bench-$$"
# The pods' cgroup parent (crust-bench's --cgroup-parent).
cgroup_parent="/crust-bench-$$"
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

# Removes a cgroup directory tree in every hierarchy, deepest first (rmdir
# only: a cgroup that still holds a process stays).
remove_cgroup_tree() {
	local rel=${1#/} h
	[[ -n $rel ]] || return 0
	for h in /sys/fs/cgroup/*/; do
		[[ -d $h$rel ]] || continue
		find "$h$rel" -depth -type d -exec rmdir {} + 2>/dev/null || true
	done
}

# The CNI bridge, the veths still attached to it, and the iptables rules
# and chains the bridge plugin made for this network.
remove_network() {
	local chains
	ip -o link show master "$bridge" 2>/dev/null | awk -F': ' '{print $2}' | cut -d@ -f1 |
		while read -r veth; do ip link del "$veth" 2>/dev/null || true; done
	ip link del "$bridge" 2>/dev/null || true
	chains=$(iptables-save -t nat 2>/dev/null | grep -F -- "$net" | grep -o -- '-j CNI-[A-Za-z0-9_-]*' |
		awk '{print $2}' | sort -u || true)
	iptables-save -t nat 2>/dev/null | grep -F -- "$net" | grep '^-A' | sed 's/^-A/-D/' |
		while read -r rule; do eval "iptables -t nat $rule" 2>/dev/null || true; done
	for c in $chains; do
		iptables -t nat -F "$c" 2>/dev/null && iptables -t nat -X "$c" 2>/dev/null || true
	done
}

bench_cleanup() {
	local rc=$?
	trap - EXIT INT TERM
	set +e
	if declare -F bench_cleanup_extra >/dev/null; then bench_cleanup_extra; fi
	stop_pid "$daemon_pid"
	stop_pid "$registry_pid"
	# Mounts left under the temp dir (none when the bench removed its pods).
	grep -o " $work[^ ]*" /proc/self/mounts | sort -r | xargs -r umount -l 2>/dev/null || true
	remove_network
	remove_cgroup_tree "$cgroup_parent"
	echo "$forward_before" >/proc/sys/net/ipv4/ip_forward 2>/dev/null || true
	if [[ $rc -ne 0 ]]; then
		for log in "$work"/*.log; do
			[[ -s $log ]] || continue
			echo "--- $log (last 30 lines) ---" >&2
			tail -n 30 "$log" >&2
		done
	fi
	rm -rf "$work"
	exit "$rc"
}

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

# A docker-registry on 127.0.0.1:$port (plain http), storage in $work.
start_registry() {
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
}

# The bench's pod network: $work/cni/50-bench.conflist, a bridge of its own.
write_cni_config() {
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
}

# A fresh crust daemon on $work/crust.sock; extra daemon flags in "$@".
# NRI is on by default: the daemon's NRI socket and plugin dirs are its own
# (never the host's /var/run/nri/nri.sock or /opt/nri/plugins). With
# BENCH_NRI_PLUGIN=1 one plugin is connected, crust-nri's nri-test-plugin
# as a pre-installed plugin subscribed to every event and adding an env
# variable to each container, to measure what NRI adds to the life cycle.
start_crust() {
	start_crust_from "$BIN" "$work" "$@"
	daemon_pid=$crust_pid
}

# start_crust_from BIN_DIR DIR [flags]: a crust daemon built in BIN_DIR, on
# DIR/crust.sock with its state under DIR; its PID in $crust_pid.
start_crust_from() {
	local bin=$1 dir=$2
	shift 2
	mkdir -p "$dir/nri/plugins" "$dir/nri/conf.d"
	# signature_policy_dir: the image-pull-signed scenario writes its
	# namespace's policy there; other pulls are not checked.
	cat >"$dir/crust.toml" <<-EOF
		[image]
		signature_policy_dir = "$dir/policies"

		[nri]
		socket_path = "$dir/nri/nri.sock"
		plugin_path = "$dir/nri/plugins"
		plugin_config_path = "$dir/nri/conf.d"
	EOF
	if [[ ${BENCH_NRI_PLUGIN:-0} == 1 ]]; then
		cp "$bin/nri-test-plugin" "$dir/nri/plugins/10-bench"
		echo '{"adjust_env": {"BENCH_NRI": "1"}}' >"$dir/nri/conf.d/10-bench.conf"
	fi
	"$bin/crust" daemon --config "$dir/crust.toml" --socket "$dir/crust.sock" \
		--root "$dir/root" --run-dir "$dir/run" --cni-conf-dir "$work/cni" \
		--log-level warn "$@" >/dev/null 2>"$dir/daemon.log" &
	crust_pid=$!
	wait_for "crust daemon ($bin)" "[[ -S $dir/crust.sock ]]"
}
