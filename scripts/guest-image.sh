#!/usr/bin/env bash
# Builds the Debian guest the cgroup-v2 node tests boot under qemu, once per
# machine (cached by this script's content, like kube-envtest's binaries):
#
#   rootfs.ext4         Debian 12 userland: python3, node, bash and what the
#                       agent runs (nft, ip, tc); no network device is used
#   vmlinuz-6.1  initrd-6.1    bookworm's kernel (Debian 12, Ubuntu 22.04+ class)
#   vmlinuz-5.10 initrd-5.10   bullseye's kernel (Debian 11, Amazon Linux 2 class)
#
# Both kernels' modules are in the one root filesystem; the guest boots with
# `cgroup_no_v1=all`, so cgroup2 is the only hierarchy it has. The image's
# /sbin/warren-guest-init mounts the basics, unpacks the tar on the second
# disk (the binaries under test and the scenario scripts) to /opt/warren and
# runs its run.sh: what runs changes with every build, the image does not.
#
#   scripts/guest-image.sh      prints the cache directory (builds it if absent)
#
# Needs root (mmdebstrap's root mode). About 3 minutes and 400 MB of downloads
# the first time; .debs are shared with scripts/build-images.sh's cache.
set -euo pipefail
cd "$(dirname "$0")/.."
. scripts/deps.sh
ensure_image_tools
command -v mkfs.ext4 >/dev/null 2>&1 || apt_install e2fsprogs

MIRROR=${WARREN_DEBIAN_MIRROR:-http://deb.debian.org/debian}
SECURITY=${WARREN_DEBIAN_SECURITY:-http://deb.debian.org/debian-security}
DEBS=${WARREN_DEB_CACHE:-$HOME/.cache/warren-tools/debs}
KEY=$(sha256sum "$0" | cut -c1-16)
OUT=${WARREN_GUEST_DIR:-$HOME/.cache/warren-tools/guest}/$KEY
mkdir -p "$(dirname "$OUT")"
# One build at a time per machine; a second caller waits and finds it done.
exec 9>"$(dirname "$OUT")/.lock"
flock 9
if [ -s "$OUT/rootfs.ext4" ] && [ -s "$OUT/vmlinuz-5.10" ]; then
  echo "$OUT"
  exit 0
fi
mkdir -p "$DEBS" "$(dirname "$OUT")"
WORK=$(mktemp -d "$(dirname "$OUT")/.build.XXXX")
trap 'rm -rf "$WORK"' EXIT

GUEST_PACKAGES=(
  linux-image-amd64 initramfs-tools kmod udev util-linux mount findutils procps
  python3 nodejs bash coreutils
  libseccomp2 ca-certificates nftables iproute2
)

# debian SUITE DIR PACKAGE... : a Debian root filesystem in DIR (root mode).
debian() {
  local suite=$1 dir=$2 security
  shift 2
  security="$suite-security"
  echo "==> guest: Debian $suite ($# packages and their dependencies)" >&2
  mmdebstrap --quiet --mode=root --variant=essential --include="$(IFS=,; echo "$*")" \
    --aptopt='APT::Install-Recommends "false"' \
    --setup-hook='mkdir -p "$1/var/cache/apt/archives"' \
    --setup-hook="sync-in $DEBS /var/cache/apt/archives" \
    --customize-hook="sync-out /var/cache/apt/archives $DEBS" \
    --customize-hook='rm -rf "$1"/var/cache/apt/archives/*.deb "$1"/var/lib/apt/lists/* "$1"/usr/share/doc "$1"/usr/share/man "$1"/usr/share/locale' \
    "$suite" "$dir" "deb $MIRROR $suite main" "deb $SECURITY $security main" >&2
}

# The guest never sees hardware beyond virtio: drop the big driver trees so
# the image stays small (the initrds were made before, with what boot needs).
prune_modules() {
  local root=$1 dir
  for dir in "$root"/lib/modules/*/; do
    (cd "$dir/kernel" && rm -rf sound drivers/gpu drivers/media drivers/net/wireless drivers/net/ethernet \
      drivers/infiniband drivers/staging drivers/scsi drivers/usb drivers/hid drivers/input drivers/iio \
      drivers/bluetooth drivers/isdn drivers/mtd drivers/md drivers/target drivers/video drivers/hwmon \
      drivers/platform drivers/power drivers/leds drivers/thunderbolt drivers/misc net/wireless net/bluetooth net/mac80211)
    chroot "$root" depmod -a "$(basename "$dir")"
  done
}

ROOT=$WORK/bookworm
debian bookworm "$ROOT" "${GUEST_PACKAGES[@]}"
OLD=$WORK/bullseye
debian bullseye "$OLD" linux-image-amd64 initramfs-tools kmod
mkdir -p "$WORK/out"
for tree in "$ROOT" "$OLD"; do
  vmlinuz=$(ls "$tree"/boot/vmlinuz-*)
  version=$(basename "$vmlinuz" | sed 's/^vmlinuz-//')
  short=$(echo "$version" | cut -d. -f1,2)
  cp "$vmlinuz" "$WORK/out/vmlinuz-$short"
  cp "$tree/boot/initrd.img-$version" "$WORK/out/initrd-$short"
  [ "$tree" = "$ROOT" ] || cp -a "$tree/lib/modules/$version" "$ROOT/lib/modules/"
done
prune_modules "$ROOT"
rm -rf "$ROOT"/boot/*
cat >"$ROOT/sbin/warren-guest-init" <<'INIT'
#!/bin/sh
# PID 1 of the test guest: the basics, then the run.sh of the tar on /dev/vdb.
mountpoint -q /proc || mount -t proc proc /proc
mountpoint -q /sys || mount -t sysfs sysfs /sys
mountpoint -q /dev || mount -t devtmpfs devtmpfs /dev
mountpoint -q /run || mount -t tmpfs -o mode=0755 tmpfs /run
mount -t tmpfs -o mode=1777 tmpfs /tmp
mountpoint -q /sys/fs/cgroup || mount -t cgroup2 cgroup2 /sys/fs/cgroup
mkdir -p /opt/warren
tar -xf /dev/vdb -C /opt/warren
exec /opt/warren/run.sh
INIT
chmod 0755 "$ROOT/sbin/warren-guest-init"
echo warren-guest >"$ROOT/etc/hostname"
size=$(( $(du -sm "$ROOT" | cut -f1) + 512 ))
# mke2fs says "Creating regular file" on stdout even with -q: stdout is the path.
mkfs.ext4 -q -L warren-guest -d "$ROOT" "$WORK/out/rootfs.ext4" "${size}M" >&2
rm -rf "$OUT"
mv "$WORK/out" "$OUT"
# Images of earlier versions of this script are no longer used.
find "$(dirname "$OUT")" -mindepth 1 -maxdepth 1 -type d ! -name "$KEY" ! -name '.build.*' -exec rm -rf {} +
echo "==> guest image: $OUT ($(du -sh "$OUT" | cut -f1))" >&2
echo "$OUT"
