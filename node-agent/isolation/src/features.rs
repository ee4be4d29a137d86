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
    /// Kernel release (`uname -r`).
    pub kernel: String,
    /// Required features that are missing, with the reason.
    pub missing: Vec<String>,
}

/// Oldest kernel Warren runs on (Debian 11, Amazon Linux 2): pidfd, openat2
/// and cgroup v2's `memory.events` are older; what 5.11+ adds
/// (`close_range(CLOSE_RANGE_CLOEXEC)`, `cgroup.kill`, `memory.peak`) has a
/// fallback or is reported as unknown.
pub const MIN_KERNEL: (u32, u32) = (5, 10);

/// `(major, minor)` of a kernel release such as `5.10.0-30-amd64`.
pub fn kernel_version(release: &str) -> Option<(u32, u32)> {
    let mut parts = release.trim().split(|c: char| !c.is_ascii_digit());
    Some((parts.next()?.parse().ok()?, parts.next()?.parse().ok()?))
}

impl Features {
    /// Reads the live system.
    pub fn detect(cgroups: Result<&CgroupLayout, String>) -> Features {
        let read = |p: &str| std::fs::read_to_string(p).unwrap_or_default();
        Features::from_sources(
            &read("/proc/sys/user/max_user_namespaces"),
            &read("/proc/self/status"),
            &read("/proc/filesystems"),
            &read("/proc/sys/kernel/osrelease"),
            cgroups,
        )
    }

    /// Pure detection from the texts of the relevant /proc files.
    pub fn from_sources(max_userns: &str, status: &str, filesystems: &str, osrelease: &str, cgroups: Result<&CgroupLayout, String>) -> Features {
        let user_namespaces = max_userns.trim().parse::<u64>().is_ok_and(|n| n > 0);
        let seccomp = status.lines().any(|l| l.starts_with("Seccomp:"));
        let overlayfs = filesystems.lines().any(|l| l.split_whitespace().last() == Some("overlay"));
        let mut missing = Vec::new();
        let kernel = osrelease.trim().to_string();
        if kernel_version(&kernel).is_some_and(|v| v < MIN_KERNEL) {
            missing.push(format!("kernel: Linux {}.{} or later is required, this node runs {kernel}", MIN_KERNEL.0, MIN_KERNEL.1));
        }
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
        Features { cgroup_version, cgroup_controllers, user_namespaces, seccomp, overlayfs, kernel, missing }
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
        let layout = CgroupLayout::V2 { base: "/sys/fs/cgroup/warren".into(), leaf: None, has_peak: true };
        let f = Features::from_sources("1000\n", "Name: x\nSeccomp:\t0\n", "nodev\tproc\nnodev\toverlay\n", "5.10.0-30-amd64\n", Ok(&layout));
        assert!(f.can_run_sandboxes(), "{:?}", f.missing);
        assert!(f.overlayfs && f.user_namespaces && f.seccomp);
        assert_eq!(f.cgroup_version, 2);
    }

    #[test]
    fn missing_features_are_named() {
        let f = Features::from_sources("0\n", "Name: x\n", "", "4.19.0-27-amd64\n", Err("no memory controller".into()));
        assert_eq!(f.missing.len(), 4);
        assert_eq!(f.missing[0], "kernel: Linux 5.10 or later is required, this node runs 4.19.0-27-amd64");
        assert!(f.missing[1].contains("no memory controller"));
        assert!(f.missing[2].starts_with("user namespaces"));
        assert!(f.missing[3].starts_with("seccomp"));
        assert!(!f.overlayfs);
    }

    #[test]
    fn kernel_versions_are_read_from_the_release() {
        assert_eq!(kernel_version("5.10.0-30-amd64"), Some((5, 10)));
        assert_eq!(kernel_version("6.1.0-56-amd64\n"), Some((6, 1)));
        assert_eq!(kernel_version("5.15.0-1057-aws"), Some((5, 15)));
        assert_eq!(kernel_version("6.18"), Some((6, 18)));
        assert_eq!(kernel_version("weird"), None);
        assert!(kernel_version("5.4.0-xx").unwrap() < MIN_KERNEL);
    }
}
