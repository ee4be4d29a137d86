//! The state disk's floor. Thread warm copies, spooled layers and (with a
//! `dir:` store) the threads themselves live under the agent's state
//! directory; a program's home can grow them by up to its size limit per
//! call. The agent never writes thread data that would leave less than the
//! reserve free: idle warm copies (the store keeps the thread) are dropped
//! first, and a call that still does not fit fails cleanly instead of
//! filling the disk under the node.

use std::io;
use std::path::Path;

/// Extra room a save needs beyond twice its diff: tar headers, the
/// manifest, directory entries.
pub const SAVE_SLACK: u64 = 1 << 20;

/// Bytes an unprivileged writer may still use on the filesystem of `path`.
pub fn free_bytes(path: &Path) -> io::Result<u64> {
    let s = nix::sys::statvfs::statvfs(path).map_err(io::Error::from)?;
    Ok(s.blocks_available().saturating_mul(s.fragment_size()))
}

/// Bytes in use on the filesystem of `path` (a call's diff tmpfs: the most
/// its save can add).
pub fn used_bytes(path: &Path) -> io::Result<u64> {
    let s = nix::sys::statvfs::statvfs(path).map_err(io::Error::from)?;
    Ok(s.blocks().saturating_sub(s.blocks_free()).saturating_mul(s.fragment_size()))
}

/// Whether writing `needed` bytes keeps `reserve` free out of `free`.
pub fn fits(free: u64, needed: u64, reserve: u64) -> bool {
    free.checked_sub(reserve).is_some_and(|room| room >= needed)
}

/// Room a save of a diff holding `diff` bytes needs: the spooled layer and
/// its copy applied to the warm state.
pub fn save_needs(diff: u64) -> u64 {
    diff.saturating_mul(2).saturating_add(SAVE_SLACK)
}

/// True when `path` is on the same filesystem as `/`: filling it would
/// starve the node itself (kubelet, container runtime, logs).
pub fn shares_root(path: &Path) -> io::Result<bool> {
    use std::os::unix::fs::MetadataExt;
    Ok(std::fs::metadata(path)?.dev() == std::fs::metadata("/")?.dev())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_reserve_is_never_written_into() {
        assert!(fits(100, 50, 50));
        assert!(!fits(100, 51, 50));
        assert!(!fits(40, 0, 50), "already below the reserve: nothing more is written");
        assert!(fits(u64::MAX, u64::MAX - 1, 1));
        assert_eq!(save_needs(10 << 20), (20 << 20) + SAVE_SLACK);
        assert_eq!(save_needs(u64::MAX), u64::MAX, "saturates instead of wrapping");
    }

    #[test]
    fn statvfs_reads_a_real_filesystem() {
        let dir = tempfile::tempdir().unwrap();
        assert!(free_bytes(dir.path()).unwrap() > 0);
        assert!(used_bytes(dir.path()).unwrap() > 0);
        assert!(shares_root(Path::new("/")).unwrap());
    }
}
