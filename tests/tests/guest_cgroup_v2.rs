//! Warren on cgroup v2 nodes and the kernels of real clusters: a Debian guest
//! with only cgroup2 (`cgroup_no_v1=all`), booted by qemu under emulation (no
//! network device), runs this build's agent and gateway in each placement an
//! operator uses (root cgroup, a service's group, a privileged container with
//! a private cgroup namespace, a non-privileged pod with the chart's
//! capabilities) and a `kill -9` of the agent mid-execution. The guest prints
//! one `WARREN-RESULT {json}` line per check on its serial console
//! (tests/guest/run.sh, tests/guest/scenarios.py); every line must be ok and
//! every expected check present.
//!
//! The guest image comes from scripts/guest-image.sh (Debian packages, cached
//! per machine; scripts/test.sh builds it and passes WARREN_GUEST_IMAGE);
//! `WARREN_GUEST_ONLY=<placement>` runs one placement.

use std::collections::BTreeSet;

use serde_json::Value;
use warren_e2e::{guest, skip_unless_root};

/// The checks every configuration must report, per placement. Kernels before
/// 5.19 have neither `memory.peak` nor overlay on id-mapped layers.
fn expected(kernel_5_19: bool) -> BTreeSet<(String, String)> {
    let peak = if kernel_5_19 { "peak_memory_bytes" } else { "peak_memory_bytes_null_without_memory_peak" };
    let thread_home = if kernel_5_19 { "thread_home" } else { "thread_home_refused_without_idmapped_overlay" };
    let scenario = [
        "agent_started",
        "sandboxes_under_the_agents_group",
        "python",
        "node",
        "bash",
        "timeout_keeps_partial_output",
        "oom",
        "pids_limit",
        "cpu_quota",
        "cpu_ms",
        peak,
        thread_home,
        "storage_mount",
        "storage_mount_closed_at_exit",
        "agent_exit",
        "no_groups_left",
        "no_mounts_left",
        "no_processes_left",
    ];
    let mut out = BTreeSet::new();
    for placement in ["root", "service", "privileged_container"] {
        for check in scenario {
            out.insert((placement.to_string(), check.to_string()));
        }
    }
    for placement in ["service", "privileged_container"] {
        out.insert((placement.to_string(), "group_given_back".to_string()));
    }
    if !kernel_5_19 {
        for placement in ["root", "service", "privileged_container"] {
            out.insert((placement.to_string(), "thread_homes_reported_at_start".to_string()));
        }
    }
    for check in ["refused_at_start", "no_groups_left", "no_mounts_left", "no_processes_left", "group_given_back"] {
        out.insert(("restricted_pod".to_string(), check.to_string()));
    }
    for check in ["caller_gets_node_lost", "restart_removes_what_the_killed_agent_left", "next_call_works", "agent_exit", "no_groups_left", "no_mounts_left", "no_processes_left"] {
        out.insert(("killed".to_string(), check.to_string()));
    }
    out
}

fn run_guest(test: &str, version: &str, kernel_5_19: bool) {
    if skip_unless_root(test) {
        return;
    }
    let image = guest::image();
    let dir = tempfile::tempdir().unwrap();
    let payload = guest::payload(dir.path(), &[]);
    let console = dir.path().join("console.log");
    let started = std::time::Instant::now();
    let only = std::env::var("WARREN_GUEST_ONLY").unwrap_or_default();
    let text = guest::boot(&image, version, &payload, &console, &format!("warren.only={only}"));
    eprintln!("{test}: guest ran {:.0} s", started.elapsed().as_secs_f64());
    let mut seen = BTreeSet::new();
    let mut failed = Vec::new();
    for line in text.lines() {
        if let Some(json) = line.trim_end_matches('\r').strip_prefix("WARREN-RESULT ") {
            let v: Value = serde_json::from_str(json).unwrap_or_else(|e| panic!("bad result line {json:?}: {e}"));
            let key = (v["placement"].as_str().unwrap().to_string(), v["check"].as_str().unwrap().to_string());
            if v["ok"] != Value::Bool(true) {
                failed.push(format!("{}/{}: {}", key.0, key.1, v["detail"].as_str().unwrap_or("")));
            }
            seen.insert(key);
        } else if line.starts_with("WARREN-GUEST") || line.starts_with("WARREN-LOG") {
            eprintln!("{line}");
        }
    }
    let missing: Vec<_> = expected(kernel_5_19).difference(&seen).filter(|(p, _)| only.is_empty() || *p == only).cloned().collect();
    assert!(text.contains("WARREN-GUEST-DONE"), "the guest stopped before its end; console:\n{text}");
    assert!(failed.is_empty() && missing.is_empty(), "failed checks:\n{}\nmissing checks: {missing:?}\nconsole:\n{text}", failed.join("\n"));
}

#[test]
fn cgroup_v2_guest_on_kernel_6_1() {
    run_guest("cgroup_v2_guest_on_kernel_6_1", "6.1", true);
}

#[test]
fn cgroup_v2_guest_on_kernel_5_10() {
    run_guest("cgroup_v2_guest_on_kernel_5_10", "5.10", false);
}
