#!/usr/bin/env bash
# `make bench-vs-containerd`: crust-bench against a fresh crust (A) and a
# fresh containerd (B) side by side (`--vs`), on the same machine, image,
# registry and CNI network.
#
# Installs Debian's containerd and runc when missing (with service start-up
# suppressed: no system containerd is started). Then, in a temp dir:
#   - a docker-registry on 127.0.0.1 (free port) with the bench's images and
#     a locally built pause image (a static C binary; no internet needed);
#   - one bridge CNI conflist both runtimes read (own bridge, own subnet);
#   - crust with its own socket, root and run dir;
#   - containerd with its own config.toml: private root, state, gRPC/ttrpc
#     socket, opt dir, runc root and netns dir; cgroupfs (SystemdCgroup =
#     false); the same CNI conf dir and plugins; registry hosts.toml
#     (config_path) mapping the local registry to plain http; the pause
#     image as sandbox_image.
# Runs crust-bench with --vs (extra flags: BENCH_ARGS or "$@"), and on exit,
# also after a failure or Ctrl-C, stops both daemons and the registry by
# PID, kills and deletes containers and shims of this containerd, unmounts
# and removes its root and state, the bridge, veths, iptables rules and the
# pods' cgroup parent.
#
# The JSON report is left at target/bench-vs-containerd.json.
set -euo pipefail

cd "$(dirname "$0")/.."

# Packages first (before any temp state exists).
if ! command -v containerd >/dev/null || ! command -v containerd-shim-runc-v2 >/dev/null ||
	! command -v runc >/dev/null; then
	# Debian starts a package's service on install unless policy-rc.d says
	# no: this bench must not leave a system containerd running.
	made_policy=""
	if [[ ! -e /usr/sbin/policy-rc.d ]]; then
		printf '#!/bin/sh\nexit 101\n' >/usr/sbin/policy-rc.d
		chmod 755 /usr/sbin/policy-rc.d
		made_policy=1
	fi
	rc=0
	hack/apt-install.sh containerd runc || rc=$?
	[[ -n $made_policy ]] && rm -f /usr/sbin/policy-rc.d
	[[ $rc -eq 0 ]] || exit "$rc"
fi

# shellcheck source=hack/bench-common.sh
. hack/bench-common.sh

ctd="$work/containerd"
ctd_sock="$ctd/containerd.sock"
ctd_pid=""
runc_bin=$(command -v runc)
# containerd 1.6 puts shim sockets under /run/containerd/s whatever its
# state dir; remove that tree at the end only if this run created it.
run_containerd_existed=""
[[ -e /run/containerd ]] && run_containerd_existed=1

# PIDs of containerd shims serving this containerd (their command line
# names its socket, which lives in this run's temp dir).
our_shims() {
	local p
	for p in /proc/[0-9]*; do
		{ tr '\0' ' ' <"$p/cmdline"; } 2>/dev/null | grep -qF -- "$ctd_sock" && echo "${p#/proc/}"
	done
	return 0
}

bench_cleanup_extra() {
	local id pid
	stop_pid "$ctd_pid"
	# Containers left behind (only after a failure: the bench removes its
	# pods): kill and delete them through runc, then their shims.
	if [[ -d $ctd/runc ]]; then
		for root in "$ctd"/runc/*/; do
			for id in $("$runc_bin" --root "$root" list -q 2>/dev/null); do
				"$runc_bin" --root "$root" kill --all "$id" KILL 2>/dev/null
				"$runc_bin" --root "$root" delete --force "$id" 2>/dev/null
			done
		done
	fi
	for pid in $(our_shims); do stop_pid "$pid"; done
	if [[ -z $run_containerd_existed ]]; then
		rm -rf /run/containerd 2>/dev/null
	fi
}
trap bench_cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

start_registry
registry="127.0.0.1:$port"
write_cni_config

# The pause image: kubernetes' pause, reduced to what a sandbox needs
# (sleep until a signal ends it; reap orphans), built static.
cat >"$work/pause.c" <<'EOF'
#include <signal.h>
#include <stdlib.h>
#include <sys/wait.h>
#include <unistd.h>
static void die(int s) { (void)s; _exit(0); }
static void reap(int s) { (void)s; while (waitpid(-1, NULL, WNOHANG) > 0) {} }
int main(void) {
	struct sigaction a = {.sa_handler = die}, r = {.sa_handler = reap, .sa_flags = SA_NOCLDSTOP};
	sigaction(SIGINT, &a, NULL);
	sigaction(SIGTERM, &a, NULL);
	sigaction(SIGCHLD, &r, NULL);
	for (;;) pause();
}
EOF
cc -static -Os -s -o "$work/pause" "$work/pause.c"
pause_image=$("$BIN/crust-bench" push-pause-image --registry "$registry" --binary "$work/pause")
image=$("$BIN/crust-bench" push-test-image --registry "$registry")

# containerd.
mkdir -p "$ctd/certs.d/$registry"
cat >"$ctd/certs.d/$registry/hosts.toml" <<EOF
server = "http://$registry"

[host."http://$registry"]
  capabilities = ["pull", "resolve"]
EOF
cat >"$ctd/config.toml" <<EOF
version = 2
root = "$ctd/root"
state = "$ctd/state"
disabled_plugins = [
  "io.containerd.snapshotter.v1.aufs",
  "io.containerd.snapshotter.v1.btrfs",
  "io.containerd.snapshotter.v1.devmapper",
  "io.containerd.snapshotter.v1.zfs",
  "io.containerd.tracing.processor.v1.otlp",
  "io.containerd.internal.v1.tracing",
]

[grpc]
  address = "$ctd_sock"

[ttrpc]
  address = "$ctd_sock.ttrpc"

[debug]
  address = ""
  level = "warn"

[metrics]
  address = ""

[plugins."io.containerd.internal.v1.opt"]
  path = "$ctd/opt"

[plugins."io.containerd.grpc.v1.cri"]
  sandbox_image = "$pause_image"
  stream_server_address = "127.0.0.1"
  stream_server_port = "0"
  netns_mounts_under_state_dir = true
  disable_apparmor = true
  # The sandbox container asks for oom_score_adj -998, which needs
  # CAP_SYS_RESOURCE in the init user namespace; cap it at containerd's own
  # (as on hosts that deny lowering it, e.g. inside a container).
  restrict_oom_score_adj = true
  enable_selinux = false

  [plugins."io.containerd.grpc.v1.cri".containerd]
    snapshotter = "overlayfs"
    default_runtime_name = "runc"

    [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc]
      runtime_type = "io.containerd.runc.v2"

      [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc.options]
        BinaryName = "$runc_bin"
        Root = "$ctd/runc"
        SystemdCgroup = false

  [plugins."io.containerd.grpc.v1.cri".cni]
    bin_dir = "/usr/lib/cni"
    conf_dir = "$work/cni"
    max_conf_num = 1

  [plugins."io.containerd.grpc.v1.cri".registry]
    config_path = "$ctd/certs.d"
EOF
containerd --config "$ctd/config.toml" >/dev/null 2>"$work/containerd.log" &
ctd_pid=$!
wait_for containerd "[[ -S $ctd_sock ]]"

start_crust

# shellcheck disable=SC2086 # BENCH_ARGS is a list of flags
"$BIN/crust-bench" --endpoint "unix://$work/crust.sock" --label crust --daemon-pid "$daemon_pid" \
	--vs "unix://$ctd_sock" --vs-label containerd --vs-daemon-pid "$ctd_pid" \
	--image "$image" --prepull "$pause_image" --registry "$registry" \
	--cgroup-parent "$cgroup_parent" --signature-policy-dir "$work/policies" --json "$work/bench.json" ${BENCH_ARGS:-} "$@"
cp "$work/bench.json" target/bench-vs-containerd.json
echo "JSON report: target/bench-vs-containerd.json"
