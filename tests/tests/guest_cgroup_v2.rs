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
//! per machine; scripts/test.sh builds it and passes WARREN_GUEST_IMAGE).

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Duration;

use serde_json::Value;
use warren_e2e::{bin, skip_unless_root};

/// A whole scenario set takes ~5–6 min on 2 emulated cores; more on a
/// loaded machine. Past this the guest is killed and the test fails.
const GUEST_LIMIT: Duration = Duration::from_secs(40 * 60);

fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).parent().unwrap().to_path_buf()
}

fn guest_image() -> PathBuf {
    if let Ok(dir) = std::env::var("WARREN_GUEST_IMAGE") {
        return dir.into();
    }
    let out = Command::new(repo().join("scripts/guest-image.sh")).stderr(Stdio::inherit()).output().expect("running scripts/guest-image.sh");
    assert!(out.status.success(), "scripts/guest-image.sh failed");
    PathBuf::from(String::from_utf8(out.stdout).unwrap().trim())
}

/// The tar the guest unpacks to /opt/warren: stripped binaries and scripts.
fn payload(dir: &Path) -> PathBuf {
    let stage = dir.join("payload");
    std::fs::create_dir_all(stage.join("bin")).unwrap();
    for name in ["warren-node-agent", "warren-sandbox", "warren-gateway"] {
        let status = Command::new("strip").arg("--strip-debug").arg("-o").arg(stage.join("bin").join(name)).arg(bin(name)).status().expect("strip");
        assert!(status.success(), "strip {name}");
    }
    for file in ["run.sh", "scenarios.py"] {
        std::fs::copy(repo().join("tests/guest").join(file), stage.join(file)).unwrap();
    }
    let tar = dir.join("payload.tar");
    let status = Command::new("tar").arg("-cf").arg(&tar).arg("-C").arg(&stage).arg(".").status().unwrap();
    assert!(status.success());
    tar
}

/// Boots the guest with kernel `version` and returns its console text.
fn boot(image: &Path, version: &str, payload: &Path, console: &Path) -> String {
    let mut qemu = Command::new("qemu-system-x86_64")
        .args(["-accel", "tcg", "-smp", "2", "-m", "3072", "-display", "none", "-no-reboot", "-nic", "none", "-monitor", "none"])
        .arg("-kernel")
        .arg(image.join(format!("vmlinuz-{version}")))
        .arg("-initrd")
        .arg(image.join(format!("initrd-{version}")))
        .arg("-append")
        .arg(format!(
            "root=/dev/vda rw console=ttyS0 quiet loglevel=3 cgroup_no_v1=all systemd.unified_cgroup_hierarchy=1 init=/sbin/warren-guest-init panic=-1 warren.only={}",
            std::env::var("WARREN_GUEST_ONLY").unwrap_or_default()
        ))
        .arg("-drive")
        .arg(format!("file={},format=raw,if=virtio,snapshot=on", image.join("rootfs.ext4").display()))
        .arg("-drive")
        .arg(format!("file={},format=raw,if=virtio,readonly=on", payload.display()))
        .arg("-serial")
        .arg(format!("file:{}", console.display()))
        .stdin(Stdio::null())
        .spawn()
        .expect("qemu-system-x86_64 (scripts/deps.sh installs qemu-system-x86)");
    let deadline = std::time::Instant::now() + GUEST_LIMIT;
    let finished = loop {
        if let Some(status) = qemu.try_wait().unwrap() {
            break Some(status);
        }
        if std::time::Instant::now() > deadline {
            let _ = qemu.kill();
            let _ = qemu.wait();
            break None;
        }
        std::thread::sleep(Duration::from_millis(500));
    };
    let text = std::fs::read_to_string(console).unwrap_or_default();
    let status = finished.unwrap_or_else(|| panic!("the guest did not power off within {GUEST_LIMIT:?}; console:\n{text}"));
    assert!(status.success(), "qemu failed ({status}); console:\n{text}");
    text
}

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
    let image = guest_image();
    let dir = tempfile::tempdir().unwrap();
    let payload = payload(dir.path());
    let console = dir.path().join("console.log");
    let started = std::time::Instant::now();
    let text = boot(&image, version, &payload, &console);
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
    let only = std::env::var("WARREN_GUEST_ONLY").unwrap_or_default();
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
