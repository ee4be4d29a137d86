#!/usr/bin/env bash
# Runs Warren on this machine: builds the node-agent, starts it on a Unix
# socket, runs one sandboxed program to show it works, and keeps serving until
# Ctrl-C. Needs root (namespaces, cgroups, id maps); re-runs itself with sudo.
set -euo pipefail
cd "$(dirname "$0")/.."
if [ "$(id -u)" != 0 ]; then exec sudo -E "$0" "$@"; fi
. scripts/deps.sh
ensure_deps
cargo build --release --locked -p warren-node-agent -p warren-isolation --bins
STATE=${WARREN_STATE_DIR:-/var/lib/warren}
SOCK=${WARREN_AGENT_SOCKET:-/run/warren/agent.sock}
BIN=$PWD/target/release
"$BIN/warren-node-agent" --listen-unix "$SOCK" --state-dir "$STATE" --log-format plain &
AGENT=$!
trap 'kill -TERM $AGENT 2>/dev/null; wait $AGENT 2>/dev/null' EXIT INT TERM
for _ in $(seq 1 200); do [ -S "$SOCK" ] && break; sleep 0.05; done
"$BIN/warren-agentctl" --socket "$SOCK" run python 'import platform, os; print("hello from", platform.node(), "as uid", os.getuid())'
cat <<MSG

Warren node-agent is running (pid $AGENT) on $SOCK.
Run code from another shell:

  sudo $BIN/warren-agentctl --socket $SOCK run bash 'echo hi; id'
  sudo $BIN/warren-agentctl --socket $SOCK run node 'console.log(process.version)'
  sudo $BIN/warren-agentctl --socket $SOCK status

The HTTP API (POST /v1/sandbox/execute with API keys) arrives with the api-gateway.
Press Ctrl-C to stop.
MSG
wait $AGENT
