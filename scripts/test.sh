#!/usr/bin/env bash
# Runs every Warren test: unit tests, generated-code drift checks, and the
# end-to-end tests that start the real node-agent and real sandboxes
# (root-only tests print a SKIPPED line when not run as root; CI runs as root).
set -euo pipefail
cd "$(dirname "$0")/.."
. scripts/deps.sh
ensure_deps
# The S3 thread-store tests run against a real S3 server built from crates.io
# (~2 min once; newer s3s-fs releases need a newer rustc than 1.95).
S3S_VERSION=0.14.1
if ! s3s-fs --version 2>/dev/null | grep -q "$S3S_VERSION"; then
  echo "==> installing s3s-fs $S3S_VERSION (S3 server for the thread-store tests)"
  cargo install --quiet --locked "s3s-fs@$S3S_VERSION" --features binary
fi
# npm_tool PACKAGE VERSION WHAT: installs an npm package into
# ~/.cache/warren-tools/PACKAGE unless that version is there already.
npm_tool() {
  local dir="$HOME/.cache/warren-tools/$1"
  if ! grep -qs "\"version\": \"$2\"" "$dir/node_modules/$1/package.json"; then
    echo "==> installing $1 $2 ($3)"
    mkdir -p "$dir"
    npm install --silent --no-audit --no-fund --prefix "$dir" "$1@$2" >/dev/null
  fi
}
# Azure Blob mounts are tested against Azurite, Microsoft's official
# emulator, from npm (~15 s once).
npm_tool azurite 3.35.0 "Azure Blob emulator for the storage tests"
# The console's sign-in is tested against node-oidc-provider, an OpenID
# Certified provider, from npm (~10 s once).
npm_tool oidc-provider 9.5.2 "identity provider for the console tests"
# The E2B JS SDK, unmodified, in the E2B conformance suite (~10 s once; the
# Python SDKs come from PyPI into a virtualenv the test makes).
npm_tool e2b 2.51.0 "E2B JS SDK for the E2B conformance suite"
# The documentation book (docs/) is built by mdBook from crates.io (~2 min once).
MDBOOK_VERSION=0.5.4
MDBOOK_DIR="$HOME/.cache/warren-tools/mdbook-$MDBOOK_VERSION"
if [ ! -x "$MDBOOK_DIR/bin/mdbook" ]; then
  echo "==> installing mdbook $MDBOOK_VERSION (builds the documentation book)"
  cargo install --quiet --locked "mdbook@$MDBOOK_VERSION" --no-default-features --features search --root "$MDBOOK_DIR"
fi
export WARREN_MDBOOK="$MDBOOK_DIR/bin/mdbook"
# The e2e tests start the workspace's binaries; build them first.
cargo build --workspace --bins --locked
# The benchmarks run by hand (docs/src/benchmarks.md); they must still compile.
cargo check -p warren-e2e --benches --locked
# The real-node test installs Warren's images on a kube-envtest node: build
# them (the `warren` image from the build above; ~2 min) and the node's
# Kubernetes binaries (cached per machine; ~4 min once).
WARREN_IMAGE_PROFILE=dev scripts/build-images.sh
KUBE_ENVTEST=${WARREN_KUBE_ENVTEST:-$(cd .. && pwd)/shared/tools/kube-envtest}
[ -x "$KUBE_ENVTEST" ] || KUBE_ENVTEST=/work/shared/tools/kube-envtest
"$KUBE_ENVTEST" install-node
# The cgroup-v2 node tests boot Debian guests (kernels 6.1 and 5.10) made
# from Debian's packages, cached per machine (~3 min once).
export WARREN_GUEST_IMAGE
WARREN_GUEST_IMAGE=$(scripts/guest-image.sh)
if cargo nextest --version >/dev/null 2>&1; then
  cargo nextest run --workspace --locked --no-fail-fast
else
  cargo test --workspace --locked --no-fail-fast
fi
