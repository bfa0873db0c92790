#!/usr/bin/env bash
# Builds the VM's boot files from Debian packages and prints the directory
# holding them: $CRUST_VM_CACHE/<key>, where <key> hashes this script, the
# initramfs init and guest/ (so editing them rebuilds; otherwise re-runs
# reuse the directory). Contents:
#   vmlinux       bookworm-backports' kernel, decompressed (PVH entry: QEMU
#                 starts it directly, no decompressor run under TCG)
#   initrd.img    static busybox, the modules needed to mount the root, init
#   extra/        a layer put over the host's / in the VM: the kernel's
#                 modules, kmod, openssh-server, guest/ (units, sshd config),
#                 the ssh keys
#   scratch.img   an empty sparse ext4 image; each VM writes to its own
#                 copy-on-write overlay of it
#   id_ed25519    the key the runner logs in with; ssh_host_ed25519_key.pub
#                 what it expects from the VM
# Knobs: CRUST_VM_CACHE (default /var/tmp/crust-vm), CRUST_VM_KERNEL (a
# linux-image-* package of bookworm-backports; default: the one
# linux-image-amd64 depends on there).
set -euo pipefail
source "$(dirname "$0")/lib.sh"

key=$( {
  cd "$VM_SRC"
  find assets.sh init guest -type f | LC_ALL=C sort | xargs sha256sum
  echo "kernel=${CRUST_VM_KERNEL:-}"
} | sha256sum | cut -c1-16)
out=$CRUST_VM_CACHE/$key
if [ -f "$out/ready" ]; then
  touch "$out/ready"
  echo "$out"
  exit 0
fi

[ "$(id -u)" -eq 0 ] || vm_die "building the VM assets needs root"
mkdir -p "$CRUST_VM_CACHE"
chmod 700 "$CRUST_VM_CACHE" # holds the VM's root login key
exec 9>"$CRUST_VM_CACHE/build.lock"
flock 9
if [ -f "$out/ready" ]; then
  echo "$out"
  exit 0
fi
t0=$(vm_now)
vm_log "building VM assets in $out"
# Under the lock, any partial build is a failed one.
rm -rf "$CRUST_VM_CACHE"/*.partial
tmp=$CRUST_VM_CACHE/$key.partial
mkdir -p "$tmp"
cd "$tmp"

vm_apt_update

# Downloads PACKAGE's candidate (from RELEASE when given, e.g.
# bookworm-backports) into the shared deb dir unless there already, and
# prints the file's path.
fetch_deb() {
  local pkg=$1 rel=${2:-} t=() ver dir f
  [ -n "$rel" ] && t=(-t "$rel")
  ver=$(vm_apt_cache "${t[@]}" policy "$pkg" | awk '/Candidate:/ { print $2 }')
  [ -n "$ver" ] && [ "$ver" != "(none)" ] || vm_die "no Debian package $pkg${rel:+ in $rel}"
  dir=$CRUST_VM_CACHE/debs/$pkg
  f=$(ls "$dir/${pkg}_${ver//:/%3a}_"*.deb 2>/dev/null | head -1 || true)
  if [ -z "$f" ]; then
    rm -rf "$dir"
    mkdir -p "$dir"
    (cd "$dir" && vm_apt_get "${t[@]}" download -qq "$pkg=$ver" >&2) ||
      vm_die "downloading $pkg=$ver failed"
    f=$(ls "$dir/${pkg}_${ver//:/%3a}_"*.deb | head -1)
  fi
  echo "$f"
}

# Unpacks a .deb into DIR with Debian's merged /usr layout (the layer sits
# over a host whose /bin, /sbin and /lib are symlinks into /usr).
unpack_merged() {
  local deb=$1 dir=$2 d
  dpkg-deb -x "$deb" "$dir"
  for d in bin sbin lib lib64; do
    if [ -d "$dir/$d" ] && [ ! -L "$dir/$d" ]; then
      mkdir -p "$dir/usr/$d"
      cp -a "$dir/$d/." "$dir/usr/$d/"
      rm -rf "${dir:?}/$d"
    fi
  done
}

# --- kernel ---------------------------------------------------------------
kpkg=${CRUST_VM_KERNEL:-$(vm_apt_cache -t bookworm-backports depends linux-image-amd64 |
  awk '/Depends: linux-image-[0-9]/ { print $2; exit }')}
[[ "$kpkg" == linux-image-6.12.* ]] || [ -n "${CRUST_VM_KERNEL:-}" ] ||
  vm_die "bookworm-backports' linux-image-amd64 is no longer 6.12 ($kpkg): check the VM still boots, then update assets.sh"
kdeb=$(fetch_deb "$kpkg" bookworm-backports)
mkdir kernel
dpkg-deb -x "$kdeb" kernel
kmods=kernel/lib/modules
[ -d "$kmods" ] || kmods=kernel/usr/lib/modules
kver=$(ls "$kmods")
kmods=$kmods/$kver
echo "$kpkg" > kernel-package
echo "$kver" > kernel-version
# The bzImage holds a zstd-compressed ELF vmlinux; QEMU boots that directly
# through its PVH note. Fall back to the bzImage if that ever changes.
vmlinuz=kernel/boot/vmlinuz-$kver
off=$(grep -abo $'\x28\xb5\x2f\xfd' "$vmlinuz" | head -1 | cut -d: -f1 || true)
if [ -n "$off" ] && { tail -c +$((off + 1)) "$vmlinuz" | zstd -dcq > vmlinux 2>/dev/null || true; } &&
   [ "$(head -c 4 vmlinux | od -An -tx1 | tr -d ' ')" = 7f454c46 ] &&
   grep -qa Xen vmlinux; then
  :
else
  vm_log "no PVH vmlinux inside $vmlinuz: booting the bzImage"
  cp "$vmlinuz" vmlinux
fi

# --- extra layer ----------------------------------------------------------
mkdir extra
unpack_merged "$(fetch_deb kmod)" extra
unpack_merged "$(fetch_deb openssh-server)" extra
# The shared libraries sshd needs that the host lacks (libwrap0 on ours).
for lib in $(vm_apt_cache depends openssh-server | awk '$1 == "Depends:" && $2 ~ /^lib/ { print $2 }'); do
  dpkg-query -W -f='${Status}' "$lib" 2>/dev/null | grep -q "install ok installed" ||
    unpack_merged "$(fetch_deb "$lib")" extra
done
missing=$(LD_LIBRARY_PATH=extra/usr/lib/x86_64-linux-gnu ldd extra/usr/sbin/sshd | grep "not found" || true)
[ -z "$missing" ] || vm_die "sshd would not start in the VM, missing: $missing"
rm -rf extra/usr/share/doc extra/usr/share/man extra/etc/init.d extra/etc/default extra/etc/pam.d \
  extra/etc/ufw extra/etc/ssh/sshd_config.d extra/usr/share/lintian
mkdir -p extra/usr/lib/modules
cp -a "$kmods" extra/usr/lib/modules/
(exec -a depmod extra/usr/bin/kmod -b extra/usr "$kver")

cp -a "$VM_SRC"/guest/. extra/
chown -R root:root extra
# The layer's directories are the merged root's: their modes must not depend
# on the umask of whoever checked the repository out.
find extra -type d -exec chmod 755 {} +
chmod 700 extra/root
# Units of a usual host that have no business in a throwaway VM; the VM
# boots crust-vm.target, so multi-user.target's wants stay off anyway.
for u in timers.target systemd-timesyncd.service getty@.service serial-getty@.service \
  systemd-tmpfiles-clean.service e2scrub_reap.service; do
  ln -sf /dev/null "extra/etc/systemd/system/$u"
done

ssh-keygen -q -t ed25519 -N '' -C crust-vm-host -f ssh_host_ed25519_key
ssh-keygen -q -t ed25519 -N '' -C crust-vm-runner -f id_ed25519
install -m 600 ssh_host_ed25519_key extra/etc/ssh/ssh_host_ed25519_key
install -m 644 ssh_host_ed25519_key.pub extra/etc/ssh/ssh_host_ed25519_key.pub
install -m 600 id_ed25519.pub extra/etc/ssh/crust-vm-authorized-keys
rm ssh_host_ed25519_key

# --- initramfs ------------------------------------------------------------
# Busybox, the modules that mounting the root needs (with what they depend
# on, in load order), and init.
mkdir -p initrd/bin initrd/mod initrd/proc initrd/sys initrd/dev
cp /bin/busybox initrd/bin/busybox
ldd /bin/busybox >/dev/null 2>&1 && vm_die "/bin/busybox is not static (install busybox-static)"
install -m 755 "$VM_SRC/init" initrd/init
M=extra/usr/lib/modules/$kver
declare -A loaded=()
load_order=()
want_module() {
  local name=$1 line path dep
  [ -n "${loaded[$name]:-}" ] && return
  loaded[$name]=1
  line=$(grep -E "(^|/)${name}\.ko(\.xz)?:" "$M/modules.dep" || true)
  if [ -z "$line" ]; then
    grep -qE "(^|/)${name}\.ko$" "$M/modules.builtin" || vm_die "kernel $kver has no module $name"
    return
  fi
  path=${line%%:*}
  # modules.dep lists every dependency, deepest last
  for dep in $(echo "${line#*:}" | tr ' ' '\n' | tac); do
    dep=$(basename "$dep")
    want_module "${dep%%.ko*}"
  done
  load_order+=("$path")
}
for m in virtio_net 9pnet_virtio 9p overlay virtio_blk ext4 crc32c_generic; do
  want_module "$m"
done
for p in "${load_order[@]}"; do
  n=$(basename "$p")
  n=${n%%.ko*}
  case "$p" in
    *.xz) xz -dc "$M/$p" > "initrd/mod/$n.ko" ;;
    *) cp "$M/$p" "initrd/mod/$n.ko" ;;
  esac
  echo "$n" >> initrd/mod/order
done
(cd initrd && find . | busybox cpio -o -H newc 2>/dev/null | gzip -1) > initrd.img
rm -rf initrd kernel

# --- scratch disk ---------------------------------------------------------
# No journal (nothing on it outlives the VM); inode tables are left to be
# initialised lazily, and the VM mounts it with noinit_itable so no kernel
# thread zeroes them in the background.
truncate -s 16G scratch.img
mkfs.ext4 -q -F -L crust-scratch -O ^has_journal -E lazy_itable_init=1 scratch.img

echo "$key" > key
touch ready
cd /
rm -rf "$out"
mv "$tmp" "$out"
# Older versions of the assets no run has used for a day.
find "$CRUST_VM_CACHE" -mindepth 2 -maxdepth 2 -name ready -mmin +1440 -printf '%h\n' |
  while read -r old; do [ "$old" != "$out" ] && rm -rf "$old"; done
vm_log "VM assets built in $(vm_since "$t0") s (kernel $kver)"
echo "$out"
