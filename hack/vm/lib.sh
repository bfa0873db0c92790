# shellcheck shell=bash
# Shared by the VM test bed's scripts (sourced, not run); see
# hack/vm/README.md.

VM_SRC=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
REPO=$(cd "$VM_SRC/../.." && pwd)
# Built assets, one directory per version of the harness inputs, plus the
# downloaded .debs and the private apt state they share.
CRUST_VM_CACHE=${CRUST_VM_CACHE:-/var/tmp/crust-vm}
CRUST_VM_DEBIAN_MIRROR=${CRUST_VM_DEBIAN_MIRROR:-http://deb.debian.org/debian}
CRUST_VM_SECURITY_MIRROR=${CRUST_VM_SECURITY_MIRROR:-http://deb.debian.org/debian-security}

vm_log() { echo "crust-vm: $*" >&2; }
vm_die() { vm_log "$*"; exit 1; }
vm_now() { date +%s.%N; }
# Seconds since a vm_now timestamp, one decimal.
vm_since() { awk -v a="$1" -v b="$(vm_now)" 'BEGIN { printf "%.1f", b - a }'; }

# apt-get / apt-cache with a sources list and package lists of our own, so
# bookworm-backports is available without touching /etc/apt (the machine's
# own apt keeps its sources; packages installed this way land in its dpkg
# database as usual).
VM_APT_DIR=$CRUST_VM_CACHE/apt
vm_apt_opts() {
  echo "-o Dir::Etc::sourcelist=$VM_APT_DIR/sources.list -o Dir::Etc::sourceparts=-" \
       "-o Dir::State::lists=$VM_APT_DIR/lists -o Dir::Cache::archives=$VM_APT_DIR/archives" \
       "-o APT::Sandbox::User=root -o Acquire::Languages=none"
}
vm_apt_get() { apt-get $(vm_apt_opts) "$@"; }
vm_apt_cache() { apt-cache $(vm_apt_opts) "$@"; }

# Refreshes the private package lists when missing or older than a day (or
# always with "force").
vm_apt_update() {
  mkdir -p "$VM_APT_DIR"/lists/partial "$VM_APT_DIR"/archives/partial
  local key=/usr/share/keyrings/debian-archive-keyring.gpg
  local want
  want=$(printf 'deb [signed-by=%s] %s %s main\n' \
    "$key" "$CRUST_VM_DEBIAN_MIRROR" bookworm \
    "$key" "$CRUST_VM_DEBIAN_MIRROR" bookworm-updates \
    "$key" "$CRUST_VM_DEBIAN_MIRROR" bookworm-backports \
    "$key" "$CRUST_VM_SECURITY_MIRROR" bookworm-security)
  if [ "$(cat "$VM_APT_DIR/sources.list" 2>/dev/null)" != "$want" ]; then
    echo "$want" > "$VM_APT_DIR/sources.list"
    rm -f "$VM_APT_DIR/updated"
  fi
  if [ "${1:-}" = force ] || [ -z "$(find "$VM_APT_DIR/updated" -mmin -1440 2>/dev/null)" ]; then
    vm_log "updating the private package lists (bookworm + bookworm-backports)"
    vm_apt_get update -qq || vm_die "apt-get update (private lists in $VM_APT_DIR) failed"
    touch "$VM_APT_DIR/updated"
  fi
}
