#!/usr/bin/env bash
# Builds Warren's two OCI images from Debian packages, without a container
# daemon (mmdebstrap makes the root filesystem, umoci the OCI image):
#
#   warren          the four binaries (gateway, operator, node-agent, sandbox
#                   supervisor) on a minimal Debian bookworm
#   warren-runtime  the default sandbox image: python3 with pip, node with
#                   npm, bash, and the tools agents expect (jq, curl, git,
#                   sqlite3, psql, mysql, redis-cli, zip, ...)
#
#   scripts/build-images.sh [warren|warren-runtime ...]   (default: both)
#
# Writes target/images/<name>.oci.tar (an OCI image layout, tag `latest`,
# named `<name>:<chart appVersion>` for containerd: `kube-envtest load-image`
# imports it as the chart's default; `skopeo copy oci-archive:` takes it) and
# prints each image's manifest digest. Reproducible: file times are clamped
# to SOURCE_DATE_EPOCH (default: the last commit's time), so the same
# package versions give the same digest. Downloaded .debs are kept in
# ~/.cache/warren-tools/debs for the next build. Needs root (mmdebstrap's
# root mode, umoci unpack).
set -euo pipefail
cd "$(dirname "$0")/.."
. scripts/deps.sh
ensure_deps
ensure_image_tools

OUT=${WARREN_IMAGES_DIR:-target/images}
# Tag the images carry (the chart's appVersion: its default image tag).
TAG=${WARREN_IMAGE_TAG:-$(sed -n 's/^appVersion: *"\{0,1\}\([^"]*\)"\{0,1\}$/\1/p' charts/warren/Chart.yaml)}
SUITE=bookworm
MIRROR=${WARREN_DEBIAN_MIRROR:-http://deb.debian.org/debian}
SECURITY=${WARREN_DEBIAN_SECURITY:-http://deb.debian.org/debian-security}
export SOURCE_DATE_EPOCH=${SOURCE_DATE_EPOCH:-$(git log -1 --format=%ct 2>/dev/null || echo 1700000000)}
CACHE=${WARREN_DEB_CACHE:-$HOME/.cache/warren-tools/debs}
mkdir -p "$OUT" "$CACHE"

RUNTIME_PACKAGES=(
  bash coreutils ca-certificates tzdata locales-all
  python3 python3-pip python3-venv
  nodejs npm
  jq curl git sqlite3 postgresql-client mariadb-client redis-tools
  zip unzip xz-utils procps less file
)
# nftables: the agent's node table at start (sandboxes are set up over netlink);
# iproute2 for whoever debugs a node.
WARREN_PACKAGES=(libseccomp2 ca-certificates nftables iproute2)

# rootfs NAME DIR PACKAGE... : a Debian root filesystem in DIR.
rootfs() {
  local name=$1 dir=$2
  shift 2
  local include
  include=$(IFS=,; echo "$*")
  echo "==> $name: Debian $SUITE root filesystem ($# packages and their dependencies)"
  mmdebstrap --quiet --mode=root --variant=essential --include="$include" \
    --aptopt='APT::Install-Recommends "false"' \
    --setup-hook='mkdir -p "$1/var/cache/apt/archives"' \
    --setup-hook="sync-in $CACHE /var/cache/apt/archives" \
    --customize-hook="sync-out /var/cache/apt/archives $CACHE" \
    --customize-hook='rm -rf "$1"/var/cache/apt/archives/*.deb "$1"/var/lib/apt/lists/* "$1"/var/log/* "$1"/var/cache/ldconfig/aux-cache' \
    "$SUITE" "$dir" "deb $MIRROR $SUITE main" "deb $MIRROR $SUITE-updates main" "deb $SECURITY $SUITE-security main"
}

# package NAME ROOTFS CONFIG-ARGS... : the OCI image of ROOTFS (one layer).
package() {
  local name=$1 root=$2
  shift 2
  local work layout created
  work=$(mktemp -d "$OUT/.build-$name.XXXX")
  layout="$work/layout"
  created=$(date -u -d "@$SOURCE_DATE_EPOCH" +%Y-%m-%dT%H:%M:%SZ)
  umoci init --layout "$layout"
  umoci new --image "$layout:latest"
  umoci unpack --image "$layout:latest" "$work/bundle" >/dev/null
  rmdir "$work/bundle/rootfs" 2>/dev/null || rm -rf "$work/bundle/rootfs"
  mv "$root" "$work/bundle/rootfs"
  # Reproducible layer: every time clamped, then one layer with no history.
  find "$work/bundle/rootfs" -newermt "@$SOURCE_DATE_EPOCH" -exec touch --no-dereference --date="@$SOURCE_DATE_EPOCH" {} +
  umoci repack --image "$layout:latest" --history.created "$created" --history.created_by "scripts/build-images.sh" "$work/bundle"
  umoci config --no-history --image "$layout:latest" --created "$created" --author warren \
    --architecture amd64 --os linux "$@"
  umoci gc --layout "$layout"
  # The name containerd gives it on import (`kube-envtest load-image`, `ctr images import`).
  python3 - "$layout/index.json" "docker.io/library/$name:$TAG" <<'PY'
import json, sys
path, name = sys.argv[1], sys.argv[2]
index = json.load(open(path))
index["manifests"][0].setdefault("annotations", {})["io.containerd.image.name"] = name
json.dump(index, open(path, "w"), separators=(",", ":"))
PY
  rm -f "$OUT/$name.oci.tar"
  tar --sort=name --mtime="@$SOURCE_DATE_EPOCH" --owner=0 --group=0 --numeric-owner -C "$layout" -cf "$OUT/$name.oci.tar" .
  local digest
  digest=$(python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))["manifests"][0]["digest"])' "$layout/index.json")
  rm -rf "$work"
  echo "==> $name: $OUT/$name.oci.tar ($(du -h "$OUT/$name.oci.tar" | cut -f1), manifest $digest)"
}

build_runtime() {
  local root
  root=$(mktemp -d "$OUT/.rootfs-runtime.XXXX")
  rmdir "$root"
  rootfs warren-runtime "$root" "${RUNTIME_PACKAGES[@]}"
  # Byte-code compiled now, so every sandbox start finds it (the root is read-only).
  chroot "$root" python3 -m compileall -q /usr/lib/python3 /usr/lib/python3.11 >/dev/null 2>&1 || true
  package warren-runtime "$root" --config.env LANG=C.UTF-8 --config.env PYTHONDONTWRITEBYTECODE=1 \
    --config.cmd /bin/bash --config.label org.opencontainers.image.title=warren-runtime
}

build_warren() {
  # WARREN_IMAGE_PROFILE=dev reuses the test build (scripts/test.sh: the
  # tests check behaviour; published images and benchmarks use release).
  local profile=${WARREN_IMAGE_PROFILE:-release} bindir
  case $profile in release) bindir=target/release ;; dev) bindir=target/debug ;; *) echo "WARREN_IMAGE_PROFILE: release or dev" >&2; exit 2 ;; esac
  echo "==> warren: $profile build of the binaries"
  cargo build --profile "$profile" --locked --bins -p warren-api-gateway -p warren-operator -p warren-node-agent -p warren-isolation
  local root
  root=$(mktemp -d "$OUT/.rootfs-warren.XXXX")
  rmdir "$root"
  rootfs warren "$root" "${WARREN_PACKAGES[@]}"
  for bin in warren-gateway warren-operator warren-node-agent warren-sandbox warren-agentctl; do
    # Stripped: the release profile keeps line tables for local profiling.
    install -s -m 0755 "$bindir/$bin" "$root/usr/local/bin/$bin"
  done
  package warren "$root" --config.cmd warren-gateway --config.label org.opencontainers.image.title=warren
}

targets=("$@")
[ ${#targets[@]} -gt 0 ] || targets=(warren warren-runtime)
for t in "${targets[@]}"; do
  case $t in
    warren) build_warren ;;
    warren-runtime) build_runtime ;;
    *) echo "unknown image $t (warren, warren-runtime)" >&2; exit 2 ;;
  esac
done
