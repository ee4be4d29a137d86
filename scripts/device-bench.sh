#!/usr/bin/env bash
# The throughput-against-the-floor benchmark (#48) on another machine: a
# real node, or the 16-core device machine some sessions are lent (root, no
# package registries, no build there).
#
#   scripts/device-bench.sh pack   here: release binaries and the benchmark,
#                                  stripped, with libseccomp, in
#                                  .device/warren-bench.tgz (ignored by git;
#                                  ~25 MB), and the command to run there
#   scripts/device-bench.sh run    there, from the checkout's root (the tar
#                                  beside it): checks what the run needs,
#                                  unpacks, runs the benchmark once (floor and
#                                  Warren alternated, WARREN_BENCH_SECONDS
#                                  each, 15 s by default; ~2 min on 2 cores),
#                                  and writes its report to $OUT when set
#
# With the device tool: `run` with carry [".device"] and the command
# `bash scripts/device-bench.sh run`, timeout_s 600.
set -euo pipefail
cd "$(dirname "$0")/.."
TAR=.device/warren-bench.tgz

pack() {
  . scripts/deps.sh
  ensure_run_deps
  cargo build --release --locked --bins -p warren-node-agent -p warren-isolation -p warren-api-gateway
  local bench
  bench=$(cargo bench --locked -p warren-e2e --bench throughput_floor --no-run --message-format=json 2>/dev/null |
    python3 -c 'import json, sys
for line in sys.stdin:
    m = json.loads(line)
    if m.get("reason") == "compiler-artifact" and m["target"]["name"] == "throughput_floor" and m.get("executable"):
        print(m["executable"])')
  [ -x "$bench" ] || { echo "the throughput_floor benchmark did not build" >&2; exit 1; }
  local stage
  stage=$(mktemp -d)
  trap 'rm -rf "$stage"' RETURN
  for b in warren-node-agent warren-gateway warren-sandbox; do strip -o "$stage/$b" "target/release/$b"; done
  strip -o "$stage/throughput_floor" "$bench"
  cp "$(ldconfig -p | awk '/libseccomp\.so\.2 .*x86-64/ {print $NF; exit}')" "$stage/libseccomp.so.2"
  mkdir -p .device
  tar -C "$stage" -czf "$TAR" .
  echo "packed $TAR ($(du -h "$TAR" | cut -f1)); on the other machine, from this checkout with .device carried:"
  echo "  bash scripts/device-bench.sh run"
}

# What the run needs from the machine: missing pieces are named, not guessed.
check() {
  local missing=()
  [ "$(id -u)" = 0 ] || missing+=("root")
  command -v python3 >/dev/null || missing+=("python3 (the floor's drivers)")
  [ -x /bin/bash ] || missing+=("/bin/bash (the calls' program)")
  [ -f "$TAR" ] || missing+=("$TAR (scripts/device-bench.sh pack, then carry .device)")
  if [ "$(cat /proc/sys/user/max_user_namespaces 2>/dev/null || echo 0)" = 0 ]; then missing+=("user namespaces"); fi
  if [ ${#missing[@]} -gt 0 ]; then
    printf 'cannot run here; missing: %s\n' "${missing[@]}" >&2
    exit 2
  fi
}

run() {
  check
  BIN=$(mktemp -d)
  trap 'rm -rf "$BIN"' EXIT
  tar -C "$BIN" -xzf "$TAR"
  local report=${OUT:-$BIN}/throughput_floor.txt cgroup=v1
  [ "$(stat -fc %T /sys/fs/cgroup)" = cgroup2fs ] && cgroup=v2
  {
    echo "machine: $(nproc) CPUs, $(awk '/MemTotal/ {print int($2/1048576)" GiB"}' /proc/meminfo), kernel $(uname -r), cgroup $cgroup"
    LD_LIBRARY_PATH=$BIN WARREN_BIN_DIR=$BIN WARREN_FLOORS_PY=$PWD/tests/benches/floors.py \
      WARREN_BENCH_SECONDS=${WARREN_BENCH_SECONDS:-15} timeout 540 "$BIN/throughput_floor" --bench
  } 2>&1 | tee "$report"
}

case "${1:-}" in
  pack) pack ;;
  run) run ;;
  *) sed -n '2,18p' "$0" >&2; exit 2 ;;
esac
