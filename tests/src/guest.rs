//! The cgroup-v2 test guest: a Debian root filesystem and kernels 6.1 and
//! 5.10 (scripts/guest-image.sh, cached per machine), booted by qemu under
//! emulation with no network device. The guest's init unpacks a tar from its
//! second disk to /opt/warren and runs its `run.sh` (tests/guest/run.sh);
//! what it reports comes back on the serial console.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use crate::bin;

/// A whole scenario set takes ~5–6 min on 2 emulated cores; more on a
/// loaded machine. Past this the guest is killed.
pub const LIMIT: Duration = Duration::from_secs(40 * 60);

fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).parent().unwrap().to_path_buf()
}

/// The guest image directory: `WARREN_GUEST_IMAGE` (scripts/test.sh builds
/// it first), else built or found by scripts/guest-image.sh.
pub fn image() -> PathBuf {
    if let Ok(dir) = std::env::var("WARREN_GUEST_IMAGE") {
        return dir.into();
    }
    let out = Command::new(repo().join("scripts/guest-image.sh")).stderr(Stdio::inherit()).output().expect("running scripts/guest-image.sh");
    assert!(out.status.success(), "scripts/guest-image.sh failed");
    PathBuf::from(String::from_utf8(out.stdout).unwrap().trim())
}

/// The tar the guest unpacks to /opt/warren: this build's agent, supervisor
/// and gateway (debug info stripped), the scenario scripts, and `extra`
/// binaries (path, name under bin/).
pub fn payload(dir: &Path, extra: &[(PathBuf, &str)]) -> PathBuf {
    let stage = dir.join("payload");
    std::fs::create_dir_all(stage.join("bin")).unwrap();
    let ours = ["warren-node-agent", "warren-sandbox", "warren-gateway"].map(|name| (bin(name), name));
    for (path, name) in ours.iter().map(|(p, n)| (p.clone(), *n)).chain(extra.iter().cloned()) {
        let status = Command::new("strip").arg("--strip-debug").arg("-o").arg(stage.join("bin").join(name)).arg(&path).status().expect("strip");
        assert!(status.success(), "strip {}", path.display());
    }
    for file in ["run.sh", "scenarios.py"] {
        std::fs::copy(repo().join("tests/guest").join(file), stage.join(file)).unwrap();
    }
    let tar = dir.join("payload.tar");
    let status = Command::new("tar").arg("-cf").arg(&tar).arg("-C").arg(&stage).arg(".").status().unwrap();
    assert!(status.success());
    tar
}

/// A guest whose console is still empty this long after qemu started never
/// reached its init's first line (`run.sh` prints one before anything of
/// Warren's runs): the emulated kernel hung in its boot, seen once under TCG
/// on a loaded machine. It is booted once more, saying so.
const SILENT_BOOT: Duration = Duration::from_secs(10 * 60);

/// Boots kernel `version` of `image` with `payload`, `append` added to the
/// kernel command line (`warren.only=…`, `warren.bench=…`), and returns the
/// console text once the guest powered off.
pub fn boot(image: &Path, version: &str, payload: &Path, console: &Path, append: &str) -> String {
    let deadline = Instant::now() + LIMIT;
    let mut finished = run_qemu(image, version, payload, console, append, deadline, true);
    if finished.is_err() {
        eprintln!("the {version} guest printed nothing on its console in {SILENT_BOOT:?} (its kernel never reached the guest's init): booting it once more");
        finished = run_qemu(image, version, payload, console, append, Instant::now() + LIMIT, false);
    }
    let text = std::fs::read_to_string(console).unwrap_or_default();
    let status = finished.ok().flatten().unwrap_or_else(|| panic!("the guest did not power off within {LIMIT:?}; console:\n{text}"));
    assert!(status.success(), "qemu failed ({status}); console:\n{text}");
    text
}

/// Runs one qemu until it exits (`Ok(Some)`) or `deadline` (`Ok(None)`);
/// with `retry_silent`, `Err(())` when its console stayed empty for
/// [`SILENT_BOOT`]. qemu has exited or been killed, and is reaped, when it returns.
fn run_qemu(image: &Path, version: &str, payload: &Path, console: &Path, append: &str, deadline: Instant, retry_silent: bool) -> Result<Option<std::process::ExitStatus>, ()> {
    let _ = std::fs::remove_file(console);
    let mut qemu = Command::new("qemu-system-x86_64")
        .args(["-accel", "tcg", "-smp", "2", "-m", "3072", "-display", "none", "-no-reboot", "-nic", "none", "-monitor", "none"])
        .arg("-kernel")
        .arg(image.join(format!("vmlinuz-{version}")))
        .arg("-initrd")
        .arg(image.join(format!("initrd-{version}")))
        .arg("-append")
        .arg(format!("root=/dev/vda rw console=ttyS0 quiet loglevel=3 cgroup_no_v1=all init=/sbin/warren-guest-init panic=-1 {append}"))
        .arg("-drive")
        .arg(format!("file={},format=raw,if=virtio,snapshot=on", image.join("rootfs.ext4").display()))
        .arg("-drive")
        .arg(format!("file={},format=raw,if=virtio,readonly=on", payload.display()))
        .arg("-serial")
        .arg(format!("file:{}", console.display()))
        .stdin(Stdio::null())
        .spawn()
        .expect("qemu-system-x86_64 (scripts/deps.sh installs qemu-system-x86)");
    let silent_until = Instant::now() + SILENT_BOOT;
    loop {
        if let Some(status) = qemu.try_wait().unwrap() {
            return Ok(Some(status));
        }
        let silent = retry_silent && Instant::now() > silent_until && std::fs::metadata(console).map(|m| m.len() == 0).unwrap_or(true);
        if silent || Instant::now() > deadline {
            let _ = qemu.kill();
            let _ = qemu.wait();
            return if silent { Err(()) } else { Ok(None) };
        }
        std::thread::sleep(Duration::from_millis(500));
    }
}
