//! Emptied sandbox groups kept for the next sandbox (cgroup v1).
//!
//! Making a v1 sandbox group is a `mkdir` in four hierarchies (each
//! allocating the controller's state and creating its files) and removing
//! it an `rmdir` in four, whose state the kernel then frees on its
//! workers: ~0.25 ms of CPU per sandbox at saturation, 4–5% of a bash call.
//! A group whose sandbox is gone holds nothing of it but counters, so an
//! emptied group is renamed `idle-<n>` and the next sandbox's group is that
//! one, renamed `sbx-<id>` (a rename is a kernfs rehash):
//!
//! - only a group with no task left (the pids hierarchy sees every task of
//!   a sandbox: the supervisor joins all four before it forks) and at most
//!   [`LEFTOVER_MAX`] of memory still charged is kept; any other is
//!   removed, as before. What a group still holds when its sandbox is gone
//!   is kernel memory being freed (its namespaces' teardown: 0.3–0.8 MiB
//!   measured) and what its sandbox left in the page cache; the next
//!   sandbox starts with that charged (reclaimable, and in its peak), so
//!   more than a little is not handed on;
//! - its limits are rewritten for the next sandbox (only the agent writes
//!   them: a sandbox has no cgroupfs), its CPU and peak counters reset and
//!   its OOM count taken as a base ([`Cgroup::reset_usage`]);
//! - at most [`MAX_IDLE`] are kept; at shutdown they are removed, and an
//!   agent that did not shut down cleanly leaves them to the next one's
//!   [`CgroupLayout::collect_garbage`].
//!
//! v2 forbids renaming a group, and its `memory.peak` cannot be reset
//! before 6.12, so on v2 every group is made and removed as before.

use std::fs;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;

use super::{Cgroup, CgroupLayout, Controller, Result, GROUP_PREFIX};
use crate::spec::Limits;

/// Prefix of a kept, empty group's directory name.
pub const IDLE_PREFIX: &str = "idle-";
/// Most empty groups kept.
pub const MAX_IDLE: usize = 64;
/// Most memory (bytes) an emptied group may still have charged to be kept.
pub const LEFTOVER_MAX: u64 = 4 << 20;

/// The kept groups of one layout.
#[derive(Debug)]
pub struct Recycler {
    layout: CgroupLayout,
    idle: Mutex<Idle>,
    next: AtomicU64,
}

#[derive(Debug, Default)]
struct Idle {
    groups: Vec<Cgroup>,
    closed: bool,
}

impl Recycler {
    /// Keeps groups of `layout` where its cgroup version allows it.
    pub fn new(layout: CgroupLayout) -> Recycler {
        let closed = !matches!(layout, CgroupLayout::V1 { .. });
        Recycler { layout, idle: Mutex::new(Idle { groups: Vec::new(), closed }), next: AtomicU64::new(0) }
    }

    /// The layout groups are made in.
    pub fn layout(&self) -> &CgroupLayout {
        &self.layout
    }

    fn idle(&self) -> std::sync::MutexGuard<'_, Idle> {
        self.idle.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// How many empty groups are kept now.
    pub fn kept(&self) -> usize {
        self.idle().groups.len()
    }

    /// The group for sandbox `id` with `limits` applied: a kept one renamed
    /// `sbx-<id>`, else a new one.
    pub fn take(&self, id: &str, limits: &Limits) -> Result<Cgroup> {
        loop {
            let Some(mut group) = self.idle().groups.pop() else { break };
            match group.rename(&format!("{GROUP_PREFIX}{id}")) {
                Ok(()) => {
                    group.set_limits(limits)?;
                    return Ok(group);
                }
                Err(_) => {
                    let _ = group.remove();
                }
            }
        }
        self.layout.create(id, limits)
    }

    /// Ends `group`'s use: its tasks are killed, then it is kept when it
    /// may be (see the module's text), else removed.
    pub fn give_back(&self, mut group: Cgroup) -> Result<()> {
        let emptied = group.kill_all_until_empty();
        if emptied && self.keepable(&group) {
            let name = format!("{IDLE_PREFIX}{}", self.next.fetch_add(1, Ordering::Relaxed));
            if group.rename(&name).is_ok() {
                let mut idle = self.idle();
                if !idle.closed && idle.groups.len() < MAX_IDLE {
                    idle.groups.push(group);
                    return Ok(());
                }
            }
        }
        group.remove()
    }

    /// Whether an emptied group may be kept: room, and little still charged.
    fn keepable(&self, group: &Cgroup) -> bool {
        {
            let idle = self.idle();
            if idle.closed || idle.groups.len() >= MAX_IDLE {
                return false;
            }
        }
        let charged = group.read(Controller::Memory, "memory.usage_in_bytes").ok().and_then(|t| t.trim().parse::<u64>().ok());
        charged.is_some_and(|bytes| bytes <= LEFTOVER_MAX)
    }

    /// Removes every kept group; groups given back from now on are removed.
    pub fn close(&self) {
        let groups = {
            let mut idle = self.idle();
            idle.closed = true;
            std::mem::take(&mut idle.groups)
        };
        for group in groups {
            let _ = group.remove();
        }
    }
}

impl Cgroup {
    /// Renames the group's directory in every hierarchy (v1 only). A rename
    /// that fails midway is undone, so the group keeps one name throughout.
    fn rename(&mut self, to: &str) -> Result<()> {
        let parents = self.layout.parents();
        for (done, parent) in parents.iter().enumerate() {
            if let Err(e) = fs::rename(parent.join(&self.name), parent.join(to)) {
                for back in &parents[..done] {
                    let _ = fs::rename(back.join(to), back.join(&self.name));
                }
                return Err(super::CgroupError::Io { path: parent.join(&self.name), source: e });
            }
        }
        self.name = to.to_string();
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::path::Path;

    fn limits(memory_bytes: u64) -> Limits {
        Limits { cpu_millis: 500, memory_bytes, pids: 32, tmp_bytes: 1, home_bytes: 1, max_output_bytes: 1, open_files: 1, file_size_bytes: 1 }
    }

    /// A v1 layout over plain directories: the bookkeeping without cgroupfs
    /// (the real groups are exercised by the agent's end-to-end tests).
    fn layout(root: &Path) -> CgroupLayout {
        let dir = |c: &str| {
            let d = root.join(c).join("warren");
            fs::create_dir_all(&d).unwrap();
            d
        };
        CgroupLayout::V1 { memory: dir("memory"), pids: dir("pids"), cpu: dir("cpu"), cpuacct: dir("cpuacct"), has_memsw: false, swap_off_inherited: true }
    }

    fn charge(root: &Path, group: &str, bytes: u64) {
        fs::write(root.join("memory/warren").join(group).join("memory.usage_in_bytes"), bytes.to_string()).unwrap();
    }

    fn names(root: &Path, hierarchy: &str) -> Vec<String> {
        let mut n: Vec<String> = fs::read_dir(root.join(hierarchy).join("warren")).unwrap().flatten().map(|e| e.file_name().to_string_lossy().into_owned()).collect();
        n.sort();
        n
    }

    #[test]
    fn an_emptied_group_is_kept_renamed_and_handed_to_the_next_sandbox_with_its_limits() {
        let root = tempfile::tempdir().unwrap();
        let groups = Recycler::new(layout(root.path()));
        let first = groups.take("a", &limits(64 << 20)).unwrap();
        charge(root.path(), "sbx-a", 8192);
        groups.give_back(first).unwrap();
        assert_eq!(groups.kept(), 1);
        for h in ["memory", "pids", "cpu", "cpuacct"] {
            assert_eq!(names(root.path(), h), vec!["idle-0".to_string()], "renamed in every hierarchy ({h})");
        }
        let second = groups.take("b", &limits(32 << 20)).unwrap();
        assert_eq!((second.name(), groups.kept()), ("sbx-b", 0));
        assert_eq!(names(root.path(), "pids"), vec!["sbx-b".to_string()], "the kept group, not a new one");
        let limit = fs::read_to_string(root.path().join("memory/warren/sbx-b/memory.limit_in_bytes")).unwrap();
        assert_eq!(limit, (32u64 << 20).to_string(), "the next sandbox's limits are written");
    }

    #[test]
    fn a_group_still_charged_or_past_the_bound_or_after_close_is_not_kept() {
        let root = tempfile::tempdir().unwrap();
        let groups = Recycler::new(layout(root.path()));
        let charged = groups.take("a", &limits(64 << 20)).unwrap();
        charge(root.path(), "sbx-a", LEFTOVER_MAX + 1);
        let _ = groups.give_back(charged);
        assert_eq!(groups.kept(), 0, "more than LEFTOVER_MAX still charged");
        let unknown = groups.take("b", &limits(64 << 20)).unwrap();
        let _ = groups.give_back(unknown);
        assert_eq!(groups.kept(), 0, "a charge that cannot be read");
        for i in 0..MAX_IDLE + 1 {
            let g = groups.take(&format!("m{i}"), &limits(64 << 20)).unwrap();
            charge(root.path(), &format!("sbx-m{i}"), 0);
            let _ = groups.give_back(g);
        }
        assert_eq!(groups.kept(), 1, "a kept group is taken before a new one is made");
        let held: Vec<Cgroup> = (0..MAX_IDLE + 1).map(|i| groups.take(&format!("n{i}"), &limits(64 << 20)).unwrap()).collect();
        for (i, g) in held.into_iter().enumerate() {
            charge(root.path(), &format!("sbx-n{i}"), 0);
            let _ = groups.give_back(g);
        }
        assert_eq!(groups.kept(), MAX_IDLE, "at most MAX_IDLE kept");
        groups.close();
        assert_eq!(groups.kept(), 0);
        let late = groups.take("z", &limits(64 << 20)).unwrap();
        charge(root.path(), "sbx-z", 0);
        let _ = groups.give_back(late);
        assert_eq!(groups.kept(), 0, "nothing is kept once closed");
    }

    #[test]
    fn cgroup_v2_keeps_nothing() {
        let root = tempfile::tempdir().unwrap();
        let base = root.path().join("warren");
        fs::create_dir_all(&base).unwrap();
        let groups = Recycler::new(CgroupLayout::V2 { base, leaf: None, has_peak: true });
        let g = groups.take("a", &limits(64 << 20)).unwrap();
        fs::write(root.path().join("warren/sbx-a/memory.usage_in_bytes"), "0").unwrap();
        let _ = groups.give_back(g);
        assert_eq!(groups.kept(), 0);
    }
}
