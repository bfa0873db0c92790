# shellcheck shell=bash
# One VM of the test bed: boot, run commands over ssh, tear down (sourced by
# shell.sh and test.sh after lib.sh).
#
# vm_boot ASSETS_DIR starts QEMU (TCG) with the assets, a per-run directory
# (/tmp/crust-vm-run.XXXXXX: console log, copy-on-write overlay of the
# scratch disk, known_hosts) and a free loopback port forwarded to the VM's
# sshd, and returns once sshd answers. An EXIT trap (with INT, TERM and HUP
# turned into exits) kills that QEMU, by its PID, and removes the per-run
# directory, whatever way the caller ends; QEMU also gets SIGKILL if the
# calling shell dies without running the trap (setpriv --pdeathsig).
#
# Knobs: CRUST_VM_MEM (MiB, default 2048), CRUST_VM_CPUS (default: the
# host's CPU count, at most 4), CRUST_VM_BOOT_TIMEOUT (s, default 300),
# CRUST_VM_APPEND (extra kernel arguments).

VM_PID=
VM_PORT=
VM_RUN=
VM_ASSETS=

vm_cleanup() {
  if [ -n "$VM_PID" ]; then
    if kill -0 "$VM_PID" 2>/dev/null; then
      kill -TERM "$VM_PID" 2>/dev/null || true
      for _ in $(seq 50); do kill -0 "$VM_PID" 2>/dev/null || break; sleep 0.1; done
      kill -KILL "$VM_PID" 2>/dev/null || true
    fi
    wait "$VM_PID" 2>/dev/null || true
    VM_PID=
  fi
  if [ -n "$VM_RUN" ]; then
    rm -rf "$VM_RUN"
    VM_RUN=
  fi
}

vm_trap() {
  trap vm_cleanup EXIT
  trap 'exit 130' INT
  trap 'exit 143' TERM
  trap 'exit 129' HUP
}

# Whether nothing listens on TCP port $1 of any local address.
vm_port_free() {
  local hex
  hex=$(printf '%04X' "$1")
  ! awk -v p=":$hex" 'NR > 1 && $4 == "0A" && substr($2, length($2) - 4) == p { found = 1 } END { exit !found }' \
    /proc/net/tcp /proc/net/tcp6 2>/dev/null
}

vm_pick_port() {
  local port
  for _ in $(seq 100); do
    port=$((20000 + RANDOM % 40000))
    if vm_port_free "$port"; then
      echo "$port"
      return
    fi
  done
  vm_die "no free TCP port found"
}

# Starts QEMU once on port $VM_PORT; returns 0 once the VM is ready, 2 if the
# port was taken meanwhile, 1 on any other failure.
vm_start_once() {
  local cpus=${CRUST_VM_CPUS:-$(nproc)}
  [ "$cpus" -gt 4 ] && cpus=4
  local append="console=ttyS0 panic=-1 loglevel=4 mitigations=off"
  append+=" systemd.unified_cgroup_hierarchy=1 cgroup_no_v1=all apparmor=1"
  append+=" systemd.unit=crust-vm.target systemd.show_status=0"
  append+=" ${CRUST_VM_APPEND:-}"
  : > "$VM_RUN/console.log"
  # Background jobs of a script ignore SIGINT; the trap ends QEMU instead.
  setpriv --pdeathsig KILL -- qemu-system-x86_64 \
    -nodefaults -no-user-config -display none -no-reboot \
    -accel tcg,thread=multi -cpu max -M pc \
    -m "${CRUST_VM_MEM:-2048}" -smp "$cpus" \
    -kernel "$VM_ASSETS/vmlinux" -initrd "$VM_ASSETS/initrd.img" -append "$append" \
    -serial "file:$VM_RUN/console.log" \
    -fsdev local,id=hostroot,path=/,security_model=none,readonly=on,multidevs=remap \
    -device virtio-9p-pci,fsdev=hostroot,mount_tag=hostroot \
    -fsdev "local,id=extra,path=$VM_ASSETS/extra,security_model=none,readonly=on,multidevs=remap" \
    -device virtio-9p-pci,fsdev=extra,mount_tag=crustvmextra \
    -drive "file=$VM_RUN/scratch.qcow2,if=virtio,format=qcow2,cache=unsafe,discard=unmap" \
    -netdev "user,id=n0,restrict=on,hostfwd=tcp:127.0.0.1:$VM_PORT-:22" \
    -device virtio-net-pci,netdev=n0 \
    > "$VM_RUN/qemu.log" 2>&1 &
  VM_PID=$!
  echo "$VM_PID" > "$VM_RUN/qemu.pid"
  local deadline=$((SECONDS + ${CRUST_VM_BOOT_TIMEOUT:-300}))
  while [ $SECONDS -lt $deadline ]; do
    if ! kill -0 "$VM_PID" 2>/dev/null; then
      wait "$VM_PID" 2>/dev/null || true
      VM_PID=
      grep -q "host forwarding" "$VM_RUN/qemu.log" && return 2
      vm_log "QEMU exited during boot: $(cat "$VM_RUN/qemu.log")"
      vm_log "console (tail):"
      tail -n 40 "$VM_RUN/console.log" >&2
      return 1
    fi
    if grep -q CRUST-VM-READY "$VM_RUN/console.log"; then
      return 0
    fi
    sleep 0.2
  done
  vm_log "no ready mark after ${CRUST_VM_BOOT_TIMEOUT:-300} s; console (tail):"
  tail -n 40 "$VM_RUN/console.log" >&2
  return 1
}

# Per-run dirs of runs that ended without their trap (SIGKILL; their QEMU
# died with them). Each run holds a flock on its dir's "lock" file for as
# long as it lives (its QEMU inherits it), so a dir whose lock can be taken
# belongs to no live run. A PID check cannot tell that: a run in another PID
# namespace (make test runs under unshare -p) has PIDs this one cannot see,
# and removing its dir (known_hosts, scratch overlay) broke it mid-run. Dirs
# without a lock file are runs between mktemp and flock, or older harnesses:
# removed only when older than an hour.
vm_remove_stale_runs() {
  local dir
  for dir in /tmp/crust-vm-run.*; do
    [ -d "$dir" ] || continue
    if [ -f "$dir/lock" ]; then
      # A lock file younger than a minute may be one not yet flocked.
      [ -n "$(find "$dir/lock" -mmin +1)" ] || continue
      flock -n "$dir/lock" true 2>/dev/null || continue
    elif [ -z "$(find "$dir" -maxdepth 0 -mmin +60)" ]; then
      continue
    fi
    rm -rf "$dir"
  done
}

vm_boot() {
  VM_ASSETS=$1
  vm_remove_stale_runs
  vm_trap
  VM_RUN=$(mktemp -d /tmp/crust-vm-run.XXXXXX)
  # Held until this shell and its QEMU are gone (see vm_remove_stale_runs).
  exec {VM_LOCK_FD}>"$VM_RUN/lock"
  flock -n "$VM_LOCK_FD" || vm_die "cannot lock the new run dir $VM_RUN"
  qemu-img create -q -f qcow2 -F raw -b "$VM_ASSETS/scratch.img" "$VM_RUN/scratch.qcow2"
  local t0 rc
  t0=$(vm_now)
  for _ in 1 2 3 4 5; do
    VM_PORT=$(vm_pick_port)
    rc=0
    vm_start_once || rc=$?
    [ $rc -eq 2 ] && continue
    [ $rc -eq 0 ] || vm_die "the VM did not boot"
    echo "[127.0.0.1]:$VM_PORT $(cut -d' ' -f1,2 "$VM_ASSETS/ssh_host_ed25519_key.pub")" > "$VM_RUN/known_hosts"
    vm_exec true || vm_die "the VM is up but ssh into it failed"
    VM_BOOT_SECONDS=$(vm_since "$t0")
    vm_log "VM up in $VM_BOOT_SECONDS s (QEMU pid $VM_PID, ssh 127.0.0.1:$VM_PORT, run dir $VM_RUN)"
    return 0
  done
  vm_die "no free port for the VM's ssh after 5 tries"
}

# ssh into the VM as root. With one argument, a shell command line; with
# several, a command and its arguments (quoted for the remote shell).
# A first argument -tt asks for a terminal (interactive use). Use
# vm_exec_bg for long commands: a signal to the script then ends it (and
# the VM) at once instead of after ssh returns.
vm_exec() {
  local opts=()
  if [ "${1:-}" = -tt ]; then opts=(-tt); shift; fi
  local cmd
  if [ $# -gt 1 ]; then cmd=$(printf '%q ' "$@"); else cmd=${1:-}; fi
  ssh -F none "${opts[@]}" -i "$VM_ASSETS/id_ed25519" -p "$VM_PORT" \
    -o IdentitiesOnly=yes -o BatchMode=yes -o LogLevel=ERROR \
    -o StrictHostKeyChecking=yes -o UserKnownHostsFile="$VM_RUN/known_hosts" \
    -o GlobalKnownHostsFile=/dev/null -o ConnectTimeout=60 \
    -o ServerAliveInterval=15 -o ServerAliveCountMax=20 \
    root@127.0.0.1 "$cmd"
}

# vm_exec in a background job the script waits for (interruptibly).
vm_exec_bg() {
  vm_exec "$@" < /dev/null &
  local pid=$!
  local rc=0
  wait "$pid" || rc=$?
  return $rc
}
