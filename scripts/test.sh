#!/usr/bin/env bash
# Runs every Warren test: unit tests, generated-code drift checks, and the
# end-to-end tests that start the real node-agent and real sandboxes
# (root-only tests print a SKIPPED line when not run as root; CI runs as root).
set -euo pipefail
cd "$(dirname "$0")/.."
. scripts/deps.sh
ensure_deps
# The e2e tests start the workspace's binaries; build them first.
cargo build --workspace --bins --locked
if cargo nextest --version >/dev/null 2>&1; then
  cargo nextest run --workspace --locked --no-fail-fast
else
  cargo test --workspace --locked --no-fail-fast
fi
