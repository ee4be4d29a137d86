//! Parsers for `/proc/self/mountinfo` and `/proc/self/cgroup` (pure).

use std::path::{Path, PathBuf};

/// One cgroup filesystem mount.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CgroupMount {
    /// Where it is mounted.
    pub mount_point: PathBuf,
    /// The path inside the hierarchy that the mount shows as its root.
    pub root: String,
    /// `true` for cgroup2.
    pub v2: bool,
    /// v1 controllers bound to this hierarchy (e.g. `["cpu", "cpuacct"]`).
    pub controllers: Vec<String>,
}

/// Cgroup mounts listed in a mountinfo text.
pub fn cgroup_mounts(mountinfo: &str) -> Vec<CgroupMount> {
    mountinfo.lines().filter_map(parse_mountinfo_line).collect()
}

fn parse_mountinfo_line(line: &str) -> Option<CgroupMount> {
    // id parent maj:min root mount_point opts [optional...] - fstype source super_opts
    let (left, right) = line.split_once(" - ")?;
    let left: Vec<&str> = left.split(' ').collect();
    let right: Vec<&str> = right.split(' ').collect();
    let (root, mount_point) = (*left.get(3)?, *left.get(4)?);
    let fstype = *right.first()?;
    let super_opts = right.get(2).copied().unwrap_or("");
    let v2 = match fstype {
        "cgroup2" => true,
        "cgroup" => false,
        _ => return None,
    };
    let controllers = if v2 {
        Vec::new()
    } else {
        super_opts
            .split(',')
            .filter(|o| matches!(*o, "memory" | "pids" | "cpu" | "cpuacct" | "cpuset" | "freezer" | "devices" | "blkio"))
            .map(str::to_string)
            .collect()
    };
    Some(CgroupMount { mount_point: PathBuf::from(unescape(mount_point)), root: unescape(root), v2, controllers })
}

/// mountinfo escapes space, tab, newline and backslash as octal.
fn unescape(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    let bytes = s.as_bytes();
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] == b'\\' && i + 4 <= bytes.len() {
            if let Ok(v) = u8::from_str_radix(&s[i + 1..i + 4], 8) {
                out.push(v as char);
                i += 4;
                continue;
            }
        }
        out.push(bytes[i] as char);
        i += 1;
    }
    out
}

/// One line of `/proc/self/cgroup`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ProcCgroup {
    /// Hierarchy id; 0 for the unified hierarchy.
    pub hierarchy: u32,
    /// Controllers (v1) or empty (v2).
    pub controllers: Vec<String>,
    /// Path of the process's cgroup inside the hierarchy.
    pub path: String,
}

/// Parses `/proc/self/cgroup`.
pub fn proc_cgroups(text: &str) -> Vec<ProcCgroup> {
    text.lines()
        .filter_map(|line| {
            let mut parts = line.splitn(3, ':');
            let hierarchy = parts.next()?.parse().ok()?;
            let controllers = parts.next()?;
            let path = parts.next()?.to_string();
            let controllers = controllers.split(',').filter(|c| !c.is_empty()).map(str::to_string).collect();
            Some(ProcCgroup { hierarchy, controllers, path })
        })
        .collect()
}

/// Directory on the host of the cgroup `path` in the hierarchy shown at `mount`.
/// `None` when the mount does not show that part of the hierarchy.
pub fn host_dir(mount: &CgroupMount, path: &str) -> Option<PathBuf> {
    let rel = if mount.root == "/" {
        path.trim_start_matches('/')
    } else {
        path.strip_prefix(mount.root.as_str())?.trim_start_matches('/')
    };
    if rel.split('/').any(|seg| seg == "..") {
        return None;
    }
    Some(if rel.is_empty() { mount.mount_point.clone() } else { Path::new(&mount.mount_point).join(rel) })
}

#[cfg(test)]
mod tests {
    use super::*;

    const MOUNTINFO: &str = "\
25 20 0:22 / /sys/fs/cgroup rw,relatime - tmpfs tmpfs rw,mode=755
26 25 0:23 / /sys/fs/cgroup/cpu rw,relatime - cgroup cgroup rw,cpu
27 25 0:24 / /sys/fs/cgroup/cpuacct rw,relatime - cgroup cgroup rw,cpuacct
28 25 0:25 / /sys/fs/cgroup/memory rw,relatime shared:9 - cgroup cgroup rw,memory
29 25 0:26 / /sys/fs/cgroup/pids rw,relatime - cgroup cgroup rw,pids
30 25 0:27 / /sys/fs/cgroup/unified rw,relatime - cgroup2 cgroup2 rw
31 20 0:28 /kubepods /sys/fs/cgroup/x\\040y rw - cgroup cgroup rw,cpu,cpuacct
";

    #[test]
    fn finds_v1_and_v2_mounts() {
        let m = cgroup_mounts(MOUNTINFO);
        assert_eq!(m.len(), 6);
        assert_eq!(m[2].controllers, vec!["memory"]);
        assert!(m[4].v2 && m[4].controllers.is_empty());
        assert_eq!(m[5].mount_point, PathBuf::from("/sys/fs/cgroup/x y"));
        assert_eq!(m[5].root, "/kubepods");
        assert_eq!(m[5].controllers, vec!["cpu", "cpuacct"]);
    }

    #[test]
    fn parses_proc_cgroup() {
        let c = proc_cgroups("4:memory:/process_api/abc\n1:cpu,cpuacct:/\n0::/user.slice\n");
        assert_eq!(c[0], ProcCgroup { hierarchy: 4, controllers: vec!["memory".into()], path: "/process_api/abc".into() });
        assert_eq!(c[1].controllers, vec!["cpu", "cpuacct"]);
        assert_eq!(c[2].hierarchy, 0);
        assert!(c[2].controllers.is_empty());
    }

    #[test]
    fn host_dir_respects_mount_root() {
        let m = &cgroup_mounts(MOUNTINFO)[5];
        assert_eq!(host_dir(m, "/kubepods/pod1"), Some(PathBuf::from("/sys/fs/cgroup/x y/pod1")));
        assert_eq!(host_dir(m, "/other"), None);
        let root = &cgroup_mounts(MOUNTINFO)[2];
        assert_eq!(host_dir(root, "/"), Some(PathBuf::from("/sys/fs/cgroup/memory")));
        assert_eq!(host_dir(root, "/a/../b"), None);
    }
}
