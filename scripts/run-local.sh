#!/usr/bin/env bash
# Runs Warren on this machine: builds the binaries, starts one node-agent and
# the API gateway configured from examples/local/, prints the URL and a
# working API key, runs one request to show it works, and serves until
# Ctrl-C. Needs root (namespaces, cgroups, id maps); re-runs itself with sudo.
set -euo pipefail
cd "$(dirname "$0")/.."
if [ "$(id -u)" != 0 ]; then exec sudo -E "$0" "$@"; fi
. scripts/deps.sh
# Only what the gateway and the agent need (the test suite's servers and
# browsers are scripts/test.sh's business).
ensure_run_deps
cargo build --release --locked --bins -p warren-node-agent -p warren-isolation -p warren-api-gateway
BIN=$PWD/target/release
STATE=${WARREN_STATE_DIR:-/var/lib/warren}
SOCK=${WARREN_AGENT_SOCKET:-/run/warren/agent.sock}
LISTEN=${WARREN_LISTEN:-127.0.0.1:8080}
CONSOLE=${WARREN_CONSOLE_LISTEN:-127.0.0.1:8081}
SECRETS=$PWD/.warren-local           # generated Secrets: never committed

# The demo key lives in a Secret manifest outside Git, made once, with the
# secret its webhooks are signed with (what the operator generates in a cluster).
mkdir -p "$SECRETS" && chmod 700 "$SECRETS"
random() { python3 -c 'import secrets, string, sys; a = string.ascii_letters + string.digits; print(sys.argv[1] + "".join(secrets.choice(a) for _ in range(int(sys.argv[2]))))' "$@"; }
if [ ! -s "$SECRETS/demo-key.yaml" ] || ! grep -q webhook-secret "$SECRETS/demo-key.yaml"; then
  KEY=$(sed -n 's/^  key: //p' "$SECRETS/demo-key.yaml" 2>/dev/null || true)
  KEY=${KEY:-$(random sk-wrn- 40)}
  (umask 077; printf 'apiVersion: v1\nkind: Secret\nmetadata:\n  name: demo-key\nstringData:\n  key: %s\n  webhook-secret: %s\n' "$KEY" "$(random whsec_ 43)" >"$SECRETS/demo-key.yaml")
fi
KEY=$(sed -n 's/^  key: //p' "$SECRETS/demo-key.yaml")
WEBHOOK_SECRET=$(sed -n 's/^  webhook-secret: //p' "$SECRETS/demo-key.yaml")
# A second key, for the storage example (examples/local/storage.yaml).
if [ ! -s "$SECRETS/files-key.yaml" ]; then
  FKEY=$(random sk-wrn- 40)
  (umask 077; printf 'apiVersion: v1\nkind: Secret\nmetadata:\n  name: files-key\nstringData:\n  key: %s\n' "$FKEY" >"$SECRETS/files-key.yaml")
fi
FILES_KEY=$(sed -n 's/^  key: //p' "$SECRETS/files-key.yaml")
E2B_KEY=$("$BIN/warren-gateway" e2b-key <<<"$KEY")
DATA=/var/lib/warren-demo-data
mkdir -p "$DATA"
[ -e "$DATA/customers.csv" ] || printf 'id,name\n1,ada\n2,bob\n' >"$DATA/customers.csv"

"$BIN/warren-gateway" check --manifests examples/local,"$SECRETS" >/dev/null
# The gateway's records (every output) and the file-URL signing key (a file
# of its own, outside the records): its user only.
mkdir -p "$STATE/gateway" && chmod 700 "$STATE/gateway"
# Local storage is an admin's grant: the demo directory is the one root allowed.
"$BIN/warren-node-agent" --listen-unix "$SOCK" --state-dir "$STATE" --local-storage-root "$DATA" --log-format plain &
AGENT=$!
for _ in $(seq 1 200); do [ -S "$SOCK" ] && break; sleep 0.05; done
"$BIN/warren-gateway" --listen "$LISTEN" --manifests examples/local,"$SECRETS" --agent "unix:$SOCK" --log-format plain \
  --records "sqlite://$STATE/gateway/records.db" --files-signing-key-file "$STATE/gateway/files-signing.key" \
  --console-listen "$CONSOLE" --console-link-file "$STATE/gateway/console-link" &
GATEWAY=$!
trap 'kill -TERM $GATEWAY $AGENT 2>/dev/null; wait $GATEWAY $AGENT 2>/dev/null' EXIT INT TERM
URL="http://$LISTEN"
for _ in $(seq 1 200); do curl -fsS "$URL/readyz" >/dev/null 2>&1 && break; sleep 0.05; done
curl -fsS "$URL/readyz" >/dev/null || { echo "gateway did not become ready" >&2; exit 1; }

echo
curl -sS "$URL/v1/sandbox/execute" -H "Authorization: Bearer $KEY" -H 'Content-Type: application/json' \
  -d '{"code": "import os, platform; print(\"hello from\", platform.node(), \"as uid\", os.getuid())", "language": "python"}'
echo
cat <<MSG

Warren is running.
  URL:      $URL
  API key:  $KEY
  E2B key:  $E2B_KEY (its alias for the E2B SDKs: warren-gateway e2b-key <<< \$KEY)
  Storage key (examples/local/storage.yaml, /data/files): $FILES_KEY
  Console:  $(cat "$STATE/gateway/console-link")
            (one-time sign-in link for the local admin; the next one: sudo cat $STATE/gateway/console-link)

Try it:
  curl -sS $URL/v1/sandbox/execute -H 'Authorization: Bearer $KEY' \\
    -H 'Content-Type: application/json' -d '{"code": "print(sum(range(100)))"}'

  # streaming (NDJSON events as the program prints)
  curl -N -sS $URL/v1/sandbox/execute -H 'Authorization: Bearer $KEY' -H 'Accept: application/x-ndjson' \\
    -H 'Content-Type: application/json' -d '{"code": "for i in 1 2 3; do echo \$i; sleep 1; done", "language": "bash"}'

  # a persistent home: each call with this thread_id sees what the previous ones left in ~
  # (prints 1, 2, 3, ...; DELETE /v1/threads/demo with the same key resets it)
  curl -sS $URL/v1/sandbox/execute -H 'Authorization: Bearer $KEY' -H 'Content-Type: application/json' \\
    -d '{"code": "echo call >> ~/calls; wc -l < ~/calls", "language": "bash", "thread_id": "demo"}'

  # storage: $DATA is /data/files for the second key; the report lands in $DATA
  curl -sS $URL/v1/sandbox/execute -H 'Authorization: Bearer $FILES_KEY' -H 'Content-Type: application/json' \\
    -d '{"code": "rows = open(\\"/data/files/customers.csv\\").read().splitlines(); open(\\"/data/files/report.txt\\", \\"w\\").write(f\\"{len(rows)-1} customers\\")"}'
  cat $DATA/report.txt

  # a managed volume: /data/scratch keeps files across calls (prints 1, 2, 3, ...), no bucket needed
  curl -sS $URL/v1/sandbox/execute -H 'Authorization: Bearer $FILES_KEY' -H 'Content-Type: application/json' \\
    -d '{"code": "echo run >> /data/scratch/runs; wc -l < /data/scratch/runs", "language": "bash"}'

  # asynchronous: 202 now, then the status (and, with "webhook_url": "https://…", a signed
  # POST of it, Warren-Signature = v1=HMAC-SHA256("\$timestamp.\$body", webhook secret $WEBHOOK_SECRET))
  curl -sS $URL/v1/sandbox/execute -H 'Authorization: Bearer $KEY' -H 'Content-Type: application/json' \
    -H 'Prefer: respond-async' -d '{"code": "import time; time.sleep(2); print(\"done\")", "metadata": {"job": "demo"}}'
  curl -sS $URL/v1/executions/<trace_id> -H 'Authorization: Bearer $KEY'
  # the audit log: this key's executions, filtered
  curl -sS '$URL/v1/executions?metadata.job=demo&status=success' -H 'Authorization: Bearer $KEY'

  # MCP (Claude Code: claude mcp add --transport http warren $URL/mcp --header "Authorization: Bearer $KEY")
  #   tools: sandbox_execute, files_list, files_download, files_upload

  # the Baponi Python SDK (pip install baponi)
  python3 -c 'from baponi import Baponi; print(Baponi(api_key="$KEY", base_url="$URL").execute("print(6*7)").stdout)'

  # the E2B SDKs, unmodified (pip install e2b e2b-code-interpreter; docs/src/e2b.md)
  export E2B_API_URL=$URL E2B_SANDBOX_URL=$URL E2B_API_KEY=$E2B_KEY
  python3 -c 'from e2b import Sandbox; s = Sandbox.create(); print(s.commands.run("echo hi from e2b").stdout); s.kill()'

Edit examples/local/*.yaml and the gateway reloads them. API: $URL/openapi.json, metrics: $URL/metrics.
Press Ctrl-C to stop.
MSG
wait $GATEWAY
