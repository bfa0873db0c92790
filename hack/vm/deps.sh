#!/usr/bin/env bash
# Installs what the VM test bed needs on the host (a no-op when present):
# - QEMU 10 from bookworm-backports, through a private apt config (bookworm's
#   qemu-system-x86 7.2 conflicts with backports' qemu-utils, which machines
#   like ours already have; 10.x also has `-run-with exit-with-parent`);
# - what builds the VM's boot files (busybox-static, e2fsprogs, zstd, xz);
# - what the VM runs from the host's userspace, which it shares read-only:
#   systemd + dbus (PID 1 and the bus the systemd cgroup driver talks to),
#   apparmor + sudo (critest's AppArmor specs run `sudo apparmor_parser`);
# - ssh (the command channel) and python3 (reads cargo's JSON).
set -euo pipefail
source "$(dirname "$0")/lib.sh"

"$REPO"/hack/apt-install.sh systemd dbus apparmor sudo busybox-static e2fsprogs \
  zstd xz-utils openssh-client python3 iproute2

qemu_version=$(dpkg-query -W -f='${Version}' qemu-system-x86 2>/dev/null || true)
img_version=$(dpkg-query -W -f='${Version}' qemu-utils 2>/dev/null || true)
if [ -n "$qemu_version" ] && dpkg --compare-versions "$qemu_version" ge 1:10 &&
   [ -n "$img_version" ]; then
  exit 0
fi
[ "$(id -u)" -eq 0 ] || vm_die "need root to install qemu-system-x86 from bookworm-backports"
vm_apt_update
vm_log "installing qemu-system-x86 and qemu-utils from bookworm-backports"
DEBIAN_FRONTEND=noninteractive vm_apt_get install -y -qq --no-install-recommends \
  -t bookworm-backports qemu-system-x86 qemu-utils >/dev/null ||
  { vm_apt_update force &&
    DEBIAN_FRONTEND=noninteractive vm_apt_get install -y -qq --no-install-recommends \
      -t bookworm-backports qemu-system-x86 qemu-utils >/dev/null; }
