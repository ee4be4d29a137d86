//! A fully visible procfs for sandboxes when the agent runs in a container.
//!
//! The kernel lets a process inside a user namespace mount a new proc only
//! when its mount namespace already holds a proc mount that hides nothing
//! (`mount_too_revealing`). Container runtimes mask parts of `/proc` (kcore,
//! keys, sysrq-trigger, …) with over-mounts, so in a non-privileged pod every
//! sandbox's proc mount would fail with EPERM. The agent, root of the initial
//! user namespace where that rule does not apply, mounts one clean proc
//! below its state directory; each sandbox's mount namespace starts as a copy
//! that includes it, which satisfies the rule, and then pivots away from it:
//! no sandbox can reach it, and each sandbox's own `/proc` is masked by
//! Warren (see `sandbox::rootfs`). On a host with an unmasked `/proc` nothing
//! is mounted.

use std::io;
use std::path::Path;

use nix::mount::{mount, MsFlags};

/// Whether anything is mounted below `/proc` (a container runtime's masks).
pub fn proc_is_masked() -> io::Result<bool> {
    Ok(crate::home::mounts_below(Path::new("/proc"))?.iter().any(|m| m != Path::new("/proc")))
}

/// Mounts a fresh proc at `dir` (created 0500), after clearing what an
/// earlier run left there. Returns whether it mounted one.
pub fn ensure_visible_proc(dir: &Path) -> io::Result<bool> {
    crate::home::unmount_below(dir)?;
    if !proc_is_masked()? {
        return Ok(false);
    }
    std::fs::create_dir_all(dir)?;
    std::fs::set_permissions(dir, std::os::unix::fs::PermissionsExt::from_mode(0o500))?;
    let flags = MsFlags::MS_NOSUID | MsFlags::MS_NODEV | MsFlags::MS_NOEXEC;
    mount(Some("proc"), dir, Some("proc"), flags, None::<&str>).map_err(io::Error::from)?;
    Ok(true)
}
