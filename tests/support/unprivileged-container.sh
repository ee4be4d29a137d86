#!/bin/bash
# Runs a command as a Kubernetes container without `privileged` would run
# it: in its own mount namespace with /proc masked like containerd's
# defaults (masked and read-only paths), and with only the capabilities in
# $WARREN_CAPS (comma-separated, e.g. sys_admin,setuid) in its bounding set.
# The e2e harness uses it (WARREN_E2E_AGENT_WRAPPER) to prove the chart's
# capability list is enough. Everything it sets up dies with the namespace.
set -euo pipefail
: "${WARREN_CAPS:?comma-separated capability names}"
bounding="-all"
IFS=, read -ra caps <<< "$WARREN_CAPS"
for c in "${caps[@]}"; do bounding="$bounding,+$c"; done
export bounding
exec unshare --mount --propagation private -- bash -c '
  set -e
  for p in /proc/kcore /proc/keys /proc/latency_stats /proc/timer_list /proc/timer_stats /proc/sched_debug; do
    [ -e "$p" ] && mount --bind /dev/null "$p"
  done
  for d in /proc/acpi /proc/asound /proc/scsi /sys/firmware; do
    [ -d "$d" ] && mount -t tmpfs -o ro,size=0 tmpfs "$d"
  done
  for p in /proc/bus /proc/fs /proc/irq /proc/sys /proc/sysrq-trigger; do
    [ -e "$p" ] && mount --bind "$p" "$p" && mount -o remount,bind,ro "$p"
  done
  exec setpriv --bounding-set "$bounding" --inh-caps -all -- "$@"
' wrapper "$@"
