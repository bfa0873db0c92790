#!/usr/bin/env bash
# Runs integration test binaries inside one VM of the test bed (cgroup v2
# alone, systemd as PID 1, AppArmor on): once per cgroup driver ("pass"),
# then prints a summary per pass and exits non-zero if anything failed.
#
#   hack/vm/test.sh SUITE... [-- LIBTEST-ARG...]
#
# SUITE is PACKAGE:TEST (a cargo integration test target, e.g.
# crust-tests:pods), optionally with @PASS to run it in that pass only
# (e.g. crust-shim:e2e@cgroupfs for a suite the driver does not affect).
# The binaries are the ones cargo builds on the host; the VM sees the host's
# / read-only at the same paths, so they run in place, from their package's
# directory as under cargo test, with a fresh environment:
#   PATH, HOME, USER, CRUST_TEST_CGROUP_DRIVER=<pass>,
#   CRUST_TEST_SLOWDOWN=$CRUST_VM_SLOWDOWN (default 10: deadlines scale by it),
#   and whatever CRUST_VM_TEST_ENV adds ("VAR=value ...").
# LIBTEST-ARGs (a filter, --exact, --nocapture ...) go to every binary,
# after --test-threads=$CRUST_VM_TEST_THREADS (default 2).
# Knobs: CRUST_VM_PASSES (default "cgroupfs systemd"), CRUST_VM_TEST_TIMEOUT
# (seconds per binary, default 1800), CRUST_VM_LOG_DIR (default
# target/vm-test: one log per pass), and vm.sh's CRUST_VM_MEM/CPUS.
set -euo pipefail
source "$(dirname "$0")/lib.sh"
source "$VM_SRC/vm.sh"
cd "$REPO"

specs=()
while [ $# -gt 0 ] && [ "$1" != -- ]; do specs+=("$1"); shift; done
[ "${1:-}" = -- ] && shift
[ ${#specs[@]} -gt 0 ] || vm_die "usage: hack/vm/test.sh PACKAGE:TEST[@PASS]... [-- LIBTEST-ARG...]"
passes=(${CRUST_VM_PASSES:-cgroupfs systemd})
test_args="--test-threads=${CRUST_VM_TEST_THREADS:-2}"
[ $# -eq 0 ] || test_args+=" $(printf '%q ' "$@")"
timeout_s=${CRUST_VM_TEST_TIMEOUT:-1800}
# How many times slower than the host the emulated VM is, for the tests'
# deadlines (crates/test-support/src/run_env.rs: patience); TCG measured 5-10x on a loaded host.
slowdown=${CRUST_VM_SLOWDOWN:-10}
log_dir=${CRUST_VM_LOG_DIR:-${CARGO_TARGET_DIR:-$REPO/target}/vm-test}
cargo=${CARGO:-cargo}
mkdir -p "$log_dir"
# Two runs writing one log dir would mix their logs and summaries: refuse
# the second (each VM is isolated, its run dir, port and known_hosts its
# own; the logs are per checkout).
exec {log_lock_fd}>"$log_dir/.lock"
flock -n "$log_lock_fd" ||
  vm_die "another hack/vm/test.sh is running with the log dir $log_dir; wait for it, or set CRUST_VM_LOG_DIR to a dir of this run's own"

t_all=$(vm_now)
"$VM_SRC"/deps.sh
t0=$(vm_now)
assets=$("$VM_SRC"/assets.sh)
t_assets=$(vm_since "$t0")

# The test executables: cargo builds what is missing or stale and names
# them. One build of the whole workspace's tests, as make test's host part
# does (so it costs nothing after it): building one package alone would
# select other dependency features and rebuild those dependencies.
t0=$(vm_now)
$cargo build --bins -q
executables=$($cargo test --workspace --no-run -q --message-format=json | python3 -c '
import json, sys
for line in sys.stdin:
    m = json.loads(line)
    if m.get("reason") == "compiler-artifact" and m.get("executable") and m["target"]["kind"] == ["test"]:
        print("\t".join([m["manifest_path"], m["target"]["name"], m["executable"]]))
') || vm_die "cargo could not build the workspace's tests"
packages=$($cargo metadata -q --no-deps --format-version 1 | python3 -c '
import json, sys
for p in json.load(sys.stdin)["packages"]:
    print(p["manifest_path"] + "\t" + p["name"])
')
declare -a suite_names=() suite_exes=() suite_dirs=() suite_passes=()
for spec in "${specs[@]}"; do
  only=
  case "$spec" in *@*) only=${spec#*@}; spec=${spec%@*} ;; esac
  pkg=${spec%%:*}
  target=${spec#*:}
  [ -n "$pkg" ] && [ -n "$target" ] && [ "$pkg" != "$spec" ] || vm_die "bad suite $spec (want PACKAGE:TEST)"
  manifest=$(awk -F'\t' -v p="$pkg" '$2 == p { print $1 }' <<< "$packages")
  [ -n "$manifest" ] || vm_die "no package $pkg in the workspace"
  exe=$(awk -F'\t' -v m="$manifest" -v t="$target" '$1 == m && $2 == t { print $3 }' <<< "$executables")
  [ -n "$exe" ] || vm_die "cargo built no test executable $target of $pkg"
  [[ "$exe" != /tmp/* ]] || vm_die "$pkg:$target is built under /tmp, which the VM has its own of: use a CARGO_TARGET_DIR elsewhere"
  suite_names+=("$pkg:$target")
  suite_exes+=("$exe")
  suite_dirs+=("$(dirname "$manifest")")
  suite_passes+=("$only")
done
t_build=$(vm_since "$t0")

vm_boot "$assets"
t_boot=$VM_BOOT_SECONDS

# The VM must be what it is for: fail loudly rather than test the wrong thing.
env_line=$(vm_exec '
  fs=$(stat -fc %T /sys/fs/cgroup)
  aa=$(cat /sys/module/apparmor/parameters/enabled 2>/dev/null)
  sd=$(systemctl is-system-running 2>/dev/null)
  echo "kernel $(uname -r), /sys/fs/cgroup: $fs ($(cat /sys/fs/cgroup/cgroup.controllers)), systemd: $sd, AppArmor: $aa ($(ls /sys/kernel/security/apparmor/policy/profiles 2>/dev/null | wc -l) profiles)"
  [ "$fs" = cgroup2fs ] && [ "$aa" = Y ] && [ -d /sys/kernel/security/apparmor ] && [ "$sd" = running ]
') || vm_die "the VM is not as the tests need it: $env_line"
vm_log "VM: $env_line"

# Things a suite should not leave behind; printed into the log, reported in
# the summary. crust.slice, the parent of the systemd driver's per-pod
# slices, stays once made (as system.slice does): what is in it counts.
leftovers='
  ps -eo pid=,comm=,args= | awk '\''$2 ~ /^(crust|crust-shim|runc|crun|pause|docker-registry|registry)$/ { print "process " $0 }'\''
  find /sys/fs/cgroup -mindepth 1 -type d \( -name "*crust*" -o -name "kubepods*" \) ! -path /sys/fs/cgroup/crust.slice -prune -printf "cgroup %p\n"
  awk '\''$2 ~ /crust|\/run\/netns/ { print "mount " $2 }'\'' /proc/self/mounts
  ip -o link | awk -F": " '\''$2 !~ /^(lo|eth0)$/ { print "link " $2 }'\''
'

rm -f "$log_dir"/*.log
declare -A pass_seconds=()
status=0
for pass in "${passes[@]}"; do
  log=$log_dir/$pass.log
  : > "$log"
  t_pass=$(vm_now)
  for i in "${!suite_names[@]}"; do
    [ -z "${suite_passes[$i]}" ] || [ "${suite_passes[$i]}" = "$pass" ] || continue
    name=${suite_names[$i]}
    echo "     Running $name (${suite_exes[$i]}, $pass driver)" | tee -a "$log"
    t0=$(vm_now)
    rc=0
    # In a background job: a signal to this script is handled at once.
    { vm_exec "cd $(printf %q "${suite_dirs[$i]}") && exec env -i \
        PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin HOME=/root USER=root \
        CRUST_TEST_CGROUP_DRIVER=$pass CRUST_TEST_SLOWDOWN=$slowdown ${CRUST_VM_TEST_ENV:-} \
        timeout -k 30 $timeout_s $(printf %q "${suite_exes[$i]}") $test_args 2>&1" 2>&1 |
        tee -a "$log"; } &
    wait $! || rc=$?
        echo "     (exit $rc, $(vm_since "$t0") s)" | tee -a "$log"
    vm_exec "$leftovers" 2>&1 | sed "s|^|LEFTOVER after $name: |" | tee -a "$log" || true
  done
  pass_seconds[$pass]=$(vm_since "$t_pass")
done

echo
echo "VM test bed: $env_line"
echo "time: assets $t_assets s, build $t_build s, boot $t_boot s$(for p in "${passes[@]}"; do printf ', %s pass %s s' "$p" "${pass_seconds[$p]}"; done), total $(vm_since "$t_all") s"
for pass in "${passes[@]}"; do
  "$REPO"/hack/test-summary.sh --known "$VM_SRC/known-failing" --pass "$pass" \
    "vm/$pass" "$log_dir/$pass.log" || status=1
  n=$(grep -c '^LEFTOVER' "$log_dir/$pass.log" || true)
  [ "$n" -eq 0 ] || { echo "   $n leftovers:"; grep '^LEFTOVER' "$log_dir/$pass.log" | sed 's/^/   /'; }
done
echo "logs: $log_dir"
exit $status
