//! Which isolation features this node offers (reported by `Status`, checked
//! before every execution).

use crate::cgroup::CgroupLayout;

/// Detected isolation features.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Features {
    /// 1 or 2; 0 when unusable.
    pub cgroup_version: u32,
    /// Controllers available to sandboxes.
    pub cgroup_controllers: Vec<String>,
    /// User namespaces can be created.
    pub user_namespaces: bool,
    /// The kernel supports seccomp filters.
    pub seccomp: bool,
    /// overlayfs is available (needed for thread state).
    pub overlayfs: bool,
    /// Required features that are missing, with the reason.
    pub missing: Vec<String>,
}

impl Features {
    /// Reads the live system.
    pub fn detect(cgroups: Result<&CgroupLayout, String>) -> Features {
        let read = |p: &str| std::fs::read_to_string(p).unwrap_or_default();
        Features::from_sources(
            &read("/proc/sys/user/max_user_namespaces"),
            &read("/proc/self/status"),
            &read("/proc/filesystems"),
            cgroups,
        )
    }

    /// Pure detection from the texts of the relevant /proc files.
    pub fn from_sources(max_userns: &str, status: &str, filesystems: &str, cgroups: Result<&CgroupLayout, String>) -> Features {
        let user_namespaces = max_userns.trim().parse::<u64>().is_ok_and(|n| n > 0);
        let seccomp = status.lines().any(|l| l.starts_with("Seccomp:"));
        let overlayfs = filesystems.lines().any(|l| l.split_whitespace().last() == Some("overlay"));
        let mut missing = Vec::new();
        let (cgroup_version, cgroup_controllers) = match cgroups {
            Ok(layout) => {
                let names: &[&str] = if layout.version() == 1 { &["memory", "pids", "cpu", "cpuacct"] } else { &["memory", "pids", "cpu"] };
                (layout.version(), names.iter().map(|s| s.to_string()).collect())
            }
            Err(reason) => {
                missing.push(format!("cgroups: {reason}"));
                (0, Vec::new())
            }
        };
        if !user_namespaces {
            missing.push("user namespaces: /proc/sys/user/max_user_namespaces is 0".into());
        }
        if !seccomp {
            missing.push("seccomp: the kernel has no seccomp support".into());
        }
        Features { cgroup_version, cgroup_controllers, user_namespaces, seccomp, overlayfs, missing }
    }

    /// True when every feature a sandbox requires is present.
    pub fn can_run_sandboxes(&self) -> bool {
        self.missing.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn complete_node_has_nothing_missing() {
        let layout = CgroupLayout::V2 { base: "/sys/fs/cgroup/warren".into() };
        let f = Features::from_sources("1000\n", "Name: x\nSeccomp:\t0\n", "nodev\tproc\nnodev\toverlay\n", Ok(&layout));
        assert!(f.can_run_sandboxes(), "{:?}", f.missing);
        assert!(f.overlayfs && f.user_namespaces && f.seccomp);
        assert_eq!(f.cgroup_version, 2);
    }

    #[test]
    fn missing_features_are_named() {
        let f = Features::from_sources("0\n", "Name: x\n", "", Err("no memory controller".into()));
        assert_eq!(f.missing.len(), 3);
        assert!(f.missing[0].contains("no memory controller"));
        assert!(f.missing[1].starts_with("user namespaces"));
        assert!(f.missing[2].starts_with("seccomp"));
        assert!(!f.overlayfs);
    }
}
