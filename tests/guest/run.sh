#!/bin/bash
# PID 1's work in the cgroup-v2 test guest (scripts/guest-image.sh; booted by
# tests/tests/guest_cgroup_v2.rs). The node has only cgroup2 (cgroup_no_v1=all).
# For each placement an operator would use, it starts this build's agent and
# gateway, runs tests/guest/scenarios.py against the gateway, stops them and
# checks that nothing is left (groups, mounts, processes). Every check prints
# one line `WARREN-RESULT {json}` on the console; the host asserts them.
# Ends by powering the guest off.
set -u
W=/opt/warren
export PATH=$W/bin:/usr/sbin:/usr/bin:/sbin:/bin
export LANG=C.UTF-8 NO_COLOR=1
CG=/sys/fs/cgroup
SOCK=/run/warren/agent.sock
STATE=/var/lib/warren
DATA=/var/lib/warren-data
PORT=8080

result() { # placement check ok detail
  python3 -c 'import json,sys; print("WARREN-RESULT " + json.dumps({"placement": sys.argv[1], "check": sys.argv[2], "ok": sys.argv[3] == "1", "detail": sys.argv[4]}))' "$@"
}

finish() {
  echo "WARREN-GUEST-DONE"
  sync
  echo o >/proc/sysrq-trigger
  sleep 10
}
trap finish EXIT

echo "WARREN-GUEST kernel $(uname -r) cgroup $(stat -fc %T $CG) controllers: $(cat $CG/cgroup.controllers)"
# The state directory lives on the root disk (ext4), as on a node: thread
# homes are id-mapped binds, which tmpfs supports only from Linux 6.3.
mountpoint -q /var/lib && umount /var/lib
for m in overlay fuse veth nf_tables; do modprobe -q "$m" 2>/dev/null || true; done
ip link set lo up
# `warren.bench=NAME warren.runs=N`: run the benchmark binary bin/NAME
# (tests/benches/guest_overhead.rs packs it) instead of the scenarios.
BENCH=$(sed -n 's/.*warren\.bench=\([a-z_]*\).*/\1/p' /proc/cmdline)
if [ -n "$BENCH" ]; then
  RUNS=$(sed -n 's/.*warren\.runs=\([0-9]*\).*/\1/p' /proc/cmdline)
  WARREN_BIN_DIR=$W/bin WARREN_BENCH_RUNS=${RUNS:-50} "$W/bin/$BENCH" 2>&1 | sed 's/^/WARREN-BENCH /'
  exit 0
fi
mkdir -p "$DATA" /run/warren "$W/manifests"
printf 'id,name\n1,ada\n' >"$DATA/in.csv"
KEY=sk-wrn-guest$(head -c 24 /dev/urandom | od -An -tx1 | tr -d ' \n')
cat >"$W/manifests/guest.yaml" <<YAML
apiVersion: v1
kind: Secret
metadata: {name: guest-key}
stringData: {key: $KEY}
---
apiVersion: warren.dev/v1alpha1
kind: StorageConnection
metadata: {name: data}
spec: {provider: Local, bucket: $DATA}
---
apiVersion: warren.dev/v1alpha1
kind: Sandbox
metadata: {name: guest}
spec:
  image: host
  languages: [python, node, bash]
  resources: {cpu: 500m, memory: 256Mi, pids: 64, tmpSize: 64Mi, homeSize: 64Mi}
  maxTimeoutSeconds: 120
  network: Blocked
  threadRetention: 24h
  threadMaxSize: 64Mi
  storage:
    - {name: files, connectionRef: {name: data}, mode: ReadWrite}
---
apiVersion: warren.dev/v1alpha1
kind: ApiKey
metadata: {name: guest}
spec:
  sandboxRef: {name: guest}
  secretRef: {name: guest-key}
YAML

# The guest's disk is small: a smaller floor of free space for thread data.
AGENT_ARGS=(--listen-unix "$SOCK" --state-dir "$STATE" --state-reserve 64Mi --local-storage-root "$DATA" --sandbox-network off --image-disk 0 --log-format plain)
# `warren.only=PLACEMENT` on the kernel command line (WARREN_GUEST_ONLY on
# the host) runs that placement alone: for investigating one failure.
ONLY=$(sed -n 's/.*warren\.only=\([a-z_]*\).*/\1/p' /proc/cmdline)
wanted() { [ -z "$ONLY" ] || [ "$ONLY" = "$1" ]; }

# start_agent PLACEMENT LAUNCHER... : the agent in the background, its log in /tmp.
start_agent() {
  local placement=$1
  shift
  rm -f "$SOCK"
  "$@" "$W/bin/warren-node-agent" "${AGENT_ARGS[@]}" >"/tmp/agent-$placement.log" 2>&1 &
  AGENT=$!
  for _ in $(seq 1 600); do
    [ -S "$SOCK" ] && return 0
    kill -0 "$AGENT" 2>/dev/null || return 1
    sleep 0.1
  done
  return 1
}

start_gateway() {
  "$W/bin/warren-gateway" --listen "127.0.0.1:$PORT" --manifests "$W/manifests" --agent "unix:$SOCK" \
    --records "sqlite:///tmp/records-$1.db" --log-format plain >"/tmp/gateway-$1.log" 2>&1 &
  GATEWAY=$!
  python3 "$W/scenarios.py" wait "http://127.0.0.1:$PORT"
}

# stop PLACEMENT: SIGTERM both, then the agent must have left nothing.
stop() {
  kill -TERM "$GATEWAY" 2>/dev/null; wait "$GATEWAY" 2>/dev/null
  kill -TERM "$AGENT" 2>/dev/null; wait "$AGENT"
  result "$1" agent_exit "$([ $? = 0 ] && echo 1 || echo 0)" "agent exit status after SIGTERM"
}

# leftovers PLACEMENT GROUP: nothing of Warren under GROUP, no mounts below the
# state directory, no sandbox process.
leftovers() {
  local placement=$1 group=$2 groups mounts procs
  groups=$(find "$group" -mindepth 1 -type d -name 'warren*' -o -mindepth 1 -type d -name 'sbx-*' 2>/dev/null | tr '\n' ' ')
  result "$placement" no_groups_left "$([ -z "$groups" ] && echo 1 || echo 0)" "left: $groups"
  mounts=$(grep -c " $STATE" /proc/self/mountinfo)
  result "$placement" no_mounts_left "$([ "$mounts" = 0 ] && echo 1 || echo 0)" "$mounts mounts below $STATE"
  procs=$(pgrep -c -f 'warren-sandbox|warren-node-agent' || true)
  result "$placement" no_processes_left "$([ "$procs" = 0 ] && echo 1 || echo 0)" "$procs processes"
  if [ "$group" != "$CG" ]; then
    local procs_in
    procs_in=$(cat "$group/cgroup.procs" 2>/dev/null | wc -l)
    result "$placement" group_given_back "$(grep -qw memory "$group/cgroup.subtree_control" 2>/dev/null && echo 0 || echo 1)" "subtree_control: $(cat "$group/cgroup.subtree_control" 2>/dev/null), $procs_in processes"
  fi
}

# scenarios PLACEMENT DELEGATED_GROUP
scenarios() {
  python3 "$W/scenarios.py" run "http://127.0.0.1:$PORT" "$KEY" "$1" "$2" "$DATA" || result "$1" scenarios_ran 0 "scenarios.py failed"
}

# placement NAME GROUP LAUNCHER...: one placement from start to leftovers.
placement() {
  local name=$1 group=$2
  shift 2
  if ! start_agent "$name" "$@"; then
    result "$name" agent_started 0 "$(tail -c 1500 /tmp/agent-$name.log)"
    return
  fi
  result "$name" agent_started 1 ""
  start_gateway "$name"
  # Before 5.19 (no overlay on id-mapped layers) the agent says so at start.
  if python3 "$W/scenarios.py" kernel_below 5.19; then
    grep -q "thread homes are unavailable on this node" "/tmp/agent-$name.log"
    result "$name" thread_homes_reported_at_start "$([ $? = 0 ] && echo 1 || echo 0)" "the agent's start-time warning"
  fi
  scenarios "$name" "$group"
  stop "$name"
  leftovers "$name" "$group"
}

# 1. The root cgroup (an agent started by the node's init).
wanted root && placement root "$CG"

# 2. A service's group (systemd: a unit with Delegate=yes), with a memory
#    limit of its own that must cover the sandboxes.
SVC=$CG/warren.service
if wanted service; then
mkdir "$SVC"
echo 2G >"$SVC/memory.max"
placement service "$SVC" bash -c 'echo $$ >'"$SVC"'/cgroup.procs; exec "$@"' in-service
rmdir "$SVC" 2>/dev/null || result service group_removable 0 "$(ls "$SVC")"
fi

# 3. A privileged container with a private cgroup namespace (docker/podman
#    --privileged on a v2 host): its group is the namespace's root and the
#    mounted cgroupfs shows only that group.
CTR=$CG/ctr-privileged
if wanted privileged_container; then
mkdir "$CTR"
placement privileged_container "$CTR" bash -c 'echo $$ >'"$CTR"'/cgroup.procs; exec unshare --cgroup --mount --propagation private sh -c "umount -l /sys/fs/cgroup; mount -t cgroup2 cgroup2 /sys/fs/cgroup && exec \"\$@\"" sh "$@"' in-ctr
rmdir "$CTR" 2>/dev/null || result privileged_container group_removable 0 "$(ls "$CTR")"
fi

# 4. A pod with the chart's defaults (not privileged): private cgroup
#    namespace, masked /proc, the chart's capabilities only, the host's
#    cgroupfs mounted. Must refuse at start, naming what is missing.
POD=$CG/pod-restricted
if wanted restricted_pod; then
mkdir "$POD"
rm -f "$SOCK"
bash -c 'echo $$ >'"$POD"'/cgroup.procs; exec unshare --cgroup --mount --propagation private sh -c "mount --bind /dev/null /proc/kcore && exec setpriv --inh-caps=-all --bounding-set=-all,+sys_admin,+setuid,+setgid,+dac_override,+chown,+fowner,+sys_ptrace,+net_admin \"\$@\"" sh "$@"' in-pod \
  "$W/bin/warren-node-agent" "${AGENT_ARGS[@]}" >/tmp/agent-pod.log 2>&1 &
POD_AGENT=$!
wait $POD_AGENT
status=$?
refusal=$(grep -o 'cgroup namespace[^"]*' /tmp/agent-pod.log | head -1)
result restricted_pod refused_at_start "$([ $status != 0 ] && [ -n "$refusal" ] && [ ! -S "$SOCK" ] && echo 1 || echo 0)" "exit $status: $(tail -c 600 /tmp/agent-pod.log)"
leftovers restricted_pod "$POD"
rmdir "$POD" 2>/dev/null
fi

# 5. kill -9 of the agent mid-execution (root placement): the caller gets
#    node_lost, a restarted agent removes what the killed one left, the next
#    call works, and after a clean stop nothing is left.
if ! wanted killed; then
  :
elif start_agent killed; then
  start_gateway killed
  python3 "$W/scenarios.py" killed "http://127.0.0.1:$PORT" "$KEY" "$AGENT" "$CG"
  if start_agent killed-restart; then
    python3 "$W/scenarios.py" after_restart "http://127.0.0.1:$PORT" "$KEY" "$CG"
  else
    result killed restarted 0 "$(tail -c 1500 /tmp/agent-killed-restart.log)"
  fi
  stop killed
  leftovers killed "$CG"
else
  result killed agent_started 0 "$(tail -c 1500 /tmp/agent-killed.log)"
fi

# Warnings and errors of every run, for the host's failure message.
for f in /tmp/agent-*.log /tmp/gateway-*.log; do
  grep -E 'WARN|ERROR|panic' "$f" | head -20 | sed "s|^|WARREN-LOG $(basename "$f"): |"
done
