//! A small filesystem of its own (a tmpfs of a fixed size), for tests that
//! fill a disk without touching the machine's.

use std::path::{Path, PathBuf};
use std::process::Command;

use anyhow::{bail, Context};

/// A mounted tmpfs; unmounted (with everything mounted below it) on drop.
pub struct SmallDisk {
    dir: Option<tempfile::TempDir>,
    path: PathBuf,
}

impl SmallDisk {
    /// Mounts a tmpfs of `bytes` (needs root).
    pub fn mount(bytes: u64) -> anyhow::Result<SmallDisk> {
        let dir = tempfile::Builder::new().prefix("warren-disk-").tempdir()?;
        let path = dir.path().join("fs");
        std::fs::create_dir(&path)?;
        let status = Command::new("mount").args(["-t", "tmpfs", "-o", &format!("size={bytes},mode=0755"), "tmpfs"]).arg(&path).status().context("running mount")?;
        if !status.success() {
            bail!("mounting a tmpfs at {} failed: {status}", path.display());
        }
        Ok(SmallDisk { dir: Some(dir), path })
    }

    /// Its root.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Bytes free on it.
    pub fn free(&self) -> u64 {
        let out = Command::new("df").args(["--output=avail", "-B1"]).arg(&self.path).output().expect("df runs");
        String::from_utf8_lossy(&out.stdout).lines().nth(1).and_then(|l| l.trim().parse().ok()).expect("df prints the free bytes")
    }
}

impl Drop for SmallDisk {
    fn drop(&mut self) {
        // Lazy and recursive: whatever a killed agent left mounted below
        // goes with it.
        let _ = Command::new("umount").arg("-l").arg(&self.path).status();
        drop(self.dir.take());
    }
}
