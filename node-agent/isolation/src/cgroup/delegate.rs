//! cgroup v2 delegation: the agent's own group becomes the parent of its
//! sandboxes.
//!
//! v2's "no internal processes" rule forbids enabling controllers for the
//! children of a (non-root) group that has processes. So, like a container
//! runtime inside a container or a systemd `Delegate=yes` service, the agent
//! moves every process of its group (itself included) into a leaf child
//! (`<name>-agent`), enables memory, pids and cpu for the children, and puts
//! the sandbox parent (`<name>`) beside the leaf. The pod's, container's or
//! service's limits on that group then cover every sandbox. At a clean stop
//! the group is given back as it was found ([`leave_leaf`]).

use std::fs;
use std::io::{self, ErrorKind};
use std::path::{Path, PathBuf};

use super::{io_err, CgroupError, Result};

/// Controllers enabled for sandbox groups.
const CONTROLLERS: [&str; 3] = ["memory", "pids", "cpu"];

/// How many passes move a group's processes: a process forking while it is
/// moved adds a pid the next pass picks up.
const MOVE_PASSES: usize = 50;

/// Name of the leaf holding the agent's processes for sandbox parent `parent`.
pub fn leaf_name(parent: &str) -> String {
    format!("{parent}-agent")
}

/// Whether `dir` is the root of its hierarchy (which has no `cgroup.type`
/// and may hold processes and enable controllers at once). The root of a
/// private cgroup namespace is not: it is an ordinary group.
pub fn is_root(dir: &Path) -> bool {
    !dir.join("cgroup.type").exists()
}

/// Moves every process of `group` into `leaf` (created if absent).
pub fn move_into_leaf(group: &Path, leaf: &Path) -> Result<()> {
    match fs::create_dir(leaf) {
        Ok(()) => {}
        Err(e) if e.kind() == ErrorKind::AlreadyExists => {}
        Err(e) => return Err(refused(leaf, e)),
    }
    move_all(group, leaf)
}

/// Moves every process of `from` into `to`, until `from` is empty.
fn move_all(from: &Path, to: &Path) -> Result<()> {
    let target = to.join("cgroup.procs");
    for _ in 0..MOVE_PASSES {
        let pids = procs(from)?;
        if pids.is_empty() {
            return Ok(());
        }
        for pid in pids {
            match fs::write(&target, pid.to_string()) {
                Ok(()) => {}
                // Exited between the read and the write.
                Err(e) if e.raw_os_error() == Some(libc::ESRCH) => {}
                Err(e) => return Err(refused(&target, e)),
            }
        }
    }
    Err(CgroupError::Io { path: from.join("cgroup.procs"), source: io::Error::other("processes keep appearing in the group") })
}

fn procs(group: &Path) -> Result<Vec<u32>> {
    let file = group.join("cgroup.procs");
    let text = fs::read_to_string(&file).map_err(io_err(&file))?;
    Ok(text.lines().filter_map(|l| l.trim().parse().ok()).collect())
}

/// Enables the sandbox controllers for the children of `group`, naming the
/// controllers its parent did not hand down.
pub fn enable_controllers(group: &Path) -> Result<()> {
    let available_file = group.join("cgroup.controllers");
    let available = fs::read_to_string(&available_file).map_err(io_err(&available_file))?;
    let missing: Vec<&str> = CONTROLLERS.iter().copied().filter(|c| !available.split_whitespace().any(|a| a == *c)).collect();
    if !missing.is_empty() {
        return Err(CgroupError::NotDelegated { group: group.to_path_buf(), missing: missing.join(" ") });
    }
    let file = group.join("cgroup.subtree_control");
    let wanted = CONTROLLERS.map(|c| format!("+{c}")).join(" ");
    fs::write(&file, wanted).map_err(|e| refused(&file, e))
}

/// Gives `group` back as the agent found it: controllers off for its
/// children, the leaf's processes back in it, the leaf removed. Left alone
/// when the group has children other than the leaf (the sandbox parent must
/// already be gone).
pub fn leave_leaf(group: &Path, leaf: &Path) -> Result<()> {
    let others: Vec<PathBuf> = fs::read_dir(group)
        .map_err(io_err(group))?
        .flatten()
        .filter(|e| e.file_type().is_ok_and(|t| t.is_dir()) && e.path() != leaf)
        .map(|e| e.path())
        .collect();
    if let Some(other) = others.first() {
        return Err(CgroupError::Io { path: other.clone(), source: io::Error::other("the agent's group has other children") });
    }
    let file = group.join("cgroup.subtree_control");
    let off = CONTROLLERS.map(|c| format!("-{c}")).join(" ");
    fs::write(&file, off).map_err(io_err(&file))?;
    move_all(leaf, group)?;
    fs::remove_dir(leaf).map_err(io_err(leaf))
}

/// An error writing a cgroup file, with the fix when it is about privilege.
pub(super) fn refused(path: &Path, source: io::Error) -> CgroupError {
    match source.raw_os_error() {
        Some(libc::EROFS | libc::EACCES | libc::EPERM) => CgroupError::ReadOnly(path.to_path_buf()),
        _ => CgroupError::Io { path: path.to_path_buf(), source },
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn leaf_is_named_after_the_parent() {
        assert_eq!(leaf_name("warren"), "warren-agent");
    }

    #[test]
    fn missing_controllers_are_named() {
        let dir = tempfile::tempdir().unwrap();
        fs::write(dir.path().join("cgroup.controllers"), "cpuset cpu io\n").unwrap();
        let err = enable_controllers(dir.path()).unwrap_err();
        assert!(matches!(&err, CgroupError::NotDelegated { missing, .. } if missing == "memory pids"), "{err}");
        assert!(err.to_string().contains("Delegate=yes"), "{err}");
        assert!(!dir.path().join("cgroup.subtree_control").exists(), "nothing written when refused");
    }

    #[test]
    fn a_directory_without_cgroup_type_is_a_root() {
        let dir = tempfile::tempdir().unwrap();
        assert!(is_root(dir.path()));
        fs::write(dir.path().join("cgroup.type"), "domain\n").unwrap();
        assert!(!is_root(dir.path()));
    }
}
