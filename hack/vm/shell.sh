#!/usr/bin/env bash
# Boots a VM of the test bed, runs a command in it (or an interactive shell),
# tears the VM down again and exits with the command's status:
#   hack/vm/shell.sh                          # interactive bash as root
#   hack/vm/shell.sh 'cat /sys/kernel/security/lsm; systemctl is-system-running'
#   hack/vm/shell.sh -- target/debug/deps/containers-0123abcd --exact some_test
# (one argument: a shell command line; after --: a command and its
# arguments, quoted as given). It runs in the caller's working directory:
# the host's / is the VM's (read-only, writes land in RAM; /tmp is the
# scratch disk), so the repository and its target/ are at the same paths.
set -euo pipefail
source "$(dirname "$0")/lib.sh"
source "$VM_SRC/vm.sh"
"$VM_SRC"/deps.sh
assets=$("$VM_SRC"/assets.sh)
cd_here="cd $(printf '%q' "$PWD")"
if [ "${1:-}" = -- ]; then
  shift
  [ $# -gt 0 ] || vm_die "usage: hack/vm/shell.sh [-- COMMAND ARG... | 'COMMAND LINE']"
  cmd="$cd_here && $(printf '%q ' "$@")"
elif [ $# -gt 1 ]; then
  vm_die "one argument (a command line) or -- COMMAND ARG...; got $#"
elif [ $# -eq 1 ]; then
  cmd="$cd_here && $1"
fi
vm_boot "$assets"
if [ $# -eq 0 ]; then
  vm_exec -tt "$cd_here && exec bash -l"
else
  vm_exec_bg "$cmd"
fi
