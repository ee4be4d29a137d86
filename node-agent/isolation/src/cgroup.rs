//! Per-execution cgroups on v1 (per-controller hierarchies) and v2 (unified).
//!
//! Sandbox groups live under the agent's own group in every hierarchy Warren
//! uses, so the limit of the pod, container or service the agent runs in
//! covers every sandbox, and the node's own accounting (kubelet pod cgroup,
//! systemd slice) keeps covering them:
//!
//! - v1: `<agent's group>/warren/sbx-<id>` in each controller's hierarchy;
//! - v2: the agent's group is delegated to it. A v2 group with processes may
//!   not enable controllers for children, so the agent first moves the
//!   group's processes (itself included) into the leaf `warren-agent`, then
//!   places sandboxes in `<agent's group>/warren/sbx-<id>` (see [`delegate`]).
//!   In the hierarchy's root (no leaf needed) that is `/warren/sbx-<id>`.
//!
//! Only the controllers Warren needs are touched: memory, pids, cpu (+
//! cpuacct on v1).
//!
//! Limits are translated by pure functions ([`v1_limit_writes`],
//! [`v2_limit_writes`]) so both versions are unit-tested on any machine.

pub mod delegate;
pub mod parse;
pub mod recycle;

use std::fs;
use std::io::{self, ErrorKind};
use std::path::{Path, PathBuf};

use crate::spec::Limits;

/// Default name of the directory holding all sandbox groups under the agent's cgroup.
pub const PARENT_NAME: &str = "warren";
/// Prefix of each sandbox group's directory name.
pub const GROUP_PREFIX: &str = "sbx-";
/// CPU quota period (100 ms), the kernel's default.
pub const CPU_PERIOD_US: u64 = 100_000;

/// A cgroup error with the file it concerns.
#[derive(Debug, thiserror::Error)]
pub enum CgroupError {
    /// No usable hierarchy for a controller Warren requires.
    #[error("cgroup controller {0} is not available")]
    MissingController(&'static str),
    /// A cgroup file could not be read or written.
    #[error("cgroup {path}: {source}")]
    Io {
        /// The file or directory.
        path: PathBuf,
        /// The cause.
        #[source]
        source: io::Error,
    },
    /// The agent's group was not handed the controllers sandboxes need.
    #[error("cgroup {} was not given the {missing} controller(s): enable them in its parent's cgroup.subtree_control (systemd: Delegate=yes; a container: run it privileged or with the host's cgroup namespace)", .group.display())]
    NotDelegated {
        /// The agent's group.
        group: PathBuf,
        /// Space-separated controller names.
        missing: String,
    },
    /// cgroupfs is not writable here.
    #[error("cgroup {} is not writable: the agent needs a writable cgroup filesystem (a container: run it privileged, chart nodeAgent.privileged=true, or mount /sys/fs/cgroup read-write with CAP_SYS_ADMIN)", .0.display())]
    ReadOnly(PathBuf),
    /// Another live agent holds the parent groups.
    #[error("cgroup parent {} is in use by another running agent on this host: give each agent on one host its own --cgroup-name", .0.display())]
    InUse(PathBuf),
}

type Result<T> = std::result::Result<T, CgroupError>;

fn io_err(path: &Path) -> impl FnOnce(io::Error) -> CgroupError + '_ {
    move |source| CgroupError::Io { path: path.to_path_buf(), source }
}

/// Controller a cgroup file belongs to (selects the v1 hierarchy).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Controller {
    /// memory
    Memory,
    /// pids
    Pids,
    /// cpu
    Cpu,
    /// cpuacct (v1 only; v2 accounts CPU in `cpu.stat`)
    CpuAcct,
}

impl Controller {
    fn name(self) -> &'static str {
        match self {
            Controller::Memory => "memory",
            Controller::Pids => "pids",
            Controller::Cpu => "cpu",
            Controller::CpuAcct => "cpuacct",
        }
    }
}

/// One write of a value into a cgroup control file.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CgroupWrite {
    /// Which hierarchy (v1) the file lives in.
    pub controller: Controller,
    /// File name inside the group.
    pub file: &'static str,
    /// Value to write.
    pub value: String,
}

fn w(controller: Controller, file: &'static str, value: impl ToString) -> CgroupWrite {
    CgroupWrite { controller, file, value: value.to_string() }
}

/// v1 writes that move a group from memory limit `previous_memory` to `limits`.
///
/// `memory.memsw.limit_in_bytes` (memory + swap) must stay >= the memory limit,
/// so it is raised first when the limit grows and lowered last when it shrinks;
/// setting both equal turns swap off for the group.
pub fn v1_limit_writes(previous_memory: Option<u64>, limits: &Limits, has_memsw: bool) -> Vec<CgroupWrite> {
    let mem = limits.memory_bytes;
    let mut out = Vec::with_capacity(4);
    let memsw = has_memsw.then(|| w(Controller::Memory, "memory.memsw.limit_in_bytes", mem));
    // A fresh group starts unlimited, so its first limit is a decrease.
    let growing = previous_memory.is_some_and(|prev| mem > prev);
    if growing {
        out.extend(memsw.clone());
        out.push(w(Controller::Memory, "memory.limit_in_bytes", mem));
    } else {
        out.push(w(Controller::Memory, "memory.limit_in_bytes", mem));
        out.extend(memsw.clone());
    }
    out.push(w(Controller::Pids, "pids.max", limits.pids));
    out.push(w(Controller::Cpu, "cpu.cfs_quota_us", cpu_quota_us(limits.cpu_millis)));
    out
}

/// v2 writes for `limits`: memory.max with swap off, pids.max, cpu.max.
pub fn v2_limit_writes(limits: &Limits) -> Vec<CgroupWrite> {
    vec![
        w(Controller::Memory, "memory.max", limits.memory_bytes),
        w(Controller::Memory, "memory.swap.max", 0),
        w(Controller::Pids, "pids.max", limits.pids),
        w(Controller::Cpu, "cpu.max", format!("{} {CPU_PERIOD_US}", cpu_quota_us(limits.cpu_millis))),
    ]
}

fn cpu_quota_us(cpu_millis: u32) -> u64 {
    u64::from(cpu_millis) * CPU_PERIOD_US / 1000
}

/// What an execution used, read back from its group.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Usage {
    /// CPU time, user + system, in microseconds.
    pub cpu_micros: u64,
    /// Peak memory in bytes; `None` where the kernel keeps no peak for a v2
    /// group (`memory.peak` is 5.19+): never a guess.
    pub peak_memory_bytes: Option<u64>,
    /// Number of OOM kills in the group.
    pub oom_kills: u64,
}

/// Reads `key value` from a flat-keyed cgroup file (memory.events, cpu.stat, memory.oom_control).
pub fn keyed_value(text: &str, key: &str) -> Option<u64> {
    text.lines().find_map(|l| {
        let (k, v) = l.split_once(' ')?;
        (k == key).then(|| v.trim().parse().ok()).flatten()
    })
}

/// Where sandbox groups are created on this node.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum CgroupLayout {
    /// Per-controller hierarchies; `cpuacct` may be the same directory as `cpu`.
    V1 {
        /// `<memory hierarchy>/<agent cgroup>/warren`
        memory: PathBuf,
        /// `<pids hierarchy>/<agent cgroup>/warren`
        pids: PathBuf,
        /// `<cpu hierarchy>/<agent cgroup>/warren`
        cpu: PathBuf,
        /// `<cpuacct hierarchy>/<agent cgroup>/warren`
        cpuacct: PathBuf,
        /// Whether swap accounting (`memory.memsw.*`) exists.
        has_memsw: bool,
        /// Whether the parent's `memory.swappiness` is 0, which a new group
        /// inherits (so sandboxes need no write of their own).
        swap_off_inherited: bool,
    },
    /// One unified hierarchy.
    V2 {
        /// `<agent's group>/warren`: the sandbox groups' parent.
        base: PathBuf,
        /// `<agent's group>/warren-agent`: the leaf holding the agent's
        /// processes; `None` when the agent's group is the hierarchy's root
        /// (which may enable controllers with processes in it).
        leaf: Option<PathBuf>,
        /// Whether groups report `memory.peak` (kernel 5.19+).
        has_peak: bool,
    },
}

impl CgroupLayout {
    /// Finds the hierarchies from the given mountinfo and /proc/self/cgroup texts
    /// (pure: creates nothing). v1 is used when it has all controllers Warren needs.
    /// `parent` names the directory holding the sandbox groups.
    pub fn from_proc(mountinfo: &str, self_cgroup: &str, parent: &str) -> Result<CgroupLayout> {
        let mounts = parse::cgroup_mounts(mountinfo);
        let procs = parse::proc_cgroups(self_cgroup);
        match Self::v1_from(&mounts, &procs, parent) {
            Ok(layout) => Ok(layout),
            Err(v1_err) => Self::v2_from(&mounts, &procs, parent).ok_or(v1_err),
        }
    }

    fn v1_from(mounts: &[parse::CgroupMount], procs: &[parse::ProcCgroup], parent: &str) -> Result<CgroupLayout> {
        let dir = |c: Controller| -> Result<PathBuf> {
            let name = c.name();
            let mount = mounts
                .iter()
                .find(|m| !m.v2 && m.controllers.iter().any(|x| x == name))
                .ok_or(CgroupError::MissingController(name))?;
            let own = procs
                .iter()
                .find(|p| p.controllers.iter().any(|x| x == name))
                .ok_or(CgroupError::MissingController(name))?;
            let dir = parse::host_dir(mount, &own.path).ok_or(CgroupError::MissingController(name))?;
            Ok(dir.join(parent))
        };
        Ok(CgroupLayout::V1 {
            memory: dir(Controller::Memory)?,
            pids: dir(Controller::Pids)?,
            cpu: dir(Controller::Cpu)?,
            cpuacct: dir(Controller::CpuAcct)?,
            has_memsw: false,
            swap_off_inherited: false,
        })
    }

    fn v2_from(mounts: &[parse::CgroupMount], procs: &[parse::ProcCgroup], parent_name: &str) -> Option<CgroupLayout> {
        let mount = mounts.iter().find(|m| m.v2)?;
        let own = procs.iter().find(|p| p.hierarchy == 0)?;
        let own_dir = parse::host_dir(mount, &own.path)?;
        // An agent restarted where its predecessor left it (in the leaf)
        // delegates the leaf's parent, as the first start did.
        let leaf_name = delegate::leaf_name(parent_name);
        let delegated = match own_dir.parent() {
            Some(parent) if own_dir.file_name().is_some_and(|n| *n == *leaf_name) => parent.to_path_buf(),
            _ => own_dir,
        };
        Some(CgroupLayout::V2 { base: delegated.join(parent_name), leaf: Some(delegated.join(leaf_name)), has_peak: false })
    }

    /// Reads the live layout of this process and prepares the parent groups
    /// (named `parent`, e.g. [`PARENT_NAME`]).
    pub fn detect(parent: &str) -> Result<CgroupLayout> {
        if parent.is_empty() || parent.contains('/') || parent.starts_with('.') {
            return Err(CgroupError::Io { path: parent.into(), source: io::Error::from(ErrorKind::InvalidInput) });
        }
        let mountinfo = read(Path::new("/proc/self/mountinfo"))?;
        let own = read(Path::new("/proc/self/cgroup"))?;
        let mut layout = Self::from_proc(&mountinfo, &own, parent)?;
        layout.prepare_parents()?;
        Ok(layout)
    }

    fn prepare_parents(&mut self) -> Result<()> {
        match self {
            CgroupLayout::V1 { memory, pids, cpu, cpuacct, has_memsw, swap_off_inherited } => {
                for dir in [&*memory, &*pids, &*cpu, &*cpuacct] {
                    fs::create_dir_all(dir).map_err(io_err(dir))?;
                }
                *has_memsw = memory.join("memory.memsw.limit_in_bytes").exists();
                // Without memsw, swap is kept off by swappiness 0: set once
                // here, every sandbox group inherits it when made.
                *swap_off_inherited = !*has_memsw && fs::write(memory.join("memory.swappiness"), "0").is_ok();
                Ok(())
            }
            CgroupLayout::V2 { base, leaf, has_peak } => {
                let delegated = base.parent().unwrap_or(base).to_path_buf();
                if delegate::is_root(&delegated) {
                    *leaf = None;
                }
                if let Some(leaf) = leaf {
                    delegate::move_into_leaf(&delegated, leaf)?;
                }
                delegate::enable_controllers(&delegated)?;
                fs::create_dir_all(&*base).map_err(|e| delegate::refused(base, e))?;
                delegate::enable_controllers(base)?;
                *has_peak = base.join("memory.peak").exists();
                Ok(())
            }
        }
    }

    /// cgroup version number (1 or 2).
    pub fn version(&self) -> u32 {
        match self {
            CgroupLayout::V1 { .. } => 1,
            CgroupLayout::V2 { .. } => 2,
        }
    }

    /// Parent directories holding sandbox groups (one per hierarchy, deduplicated).
    pub fn parents(&self) -> Vec<PathBuf> {
        let mut out = match self {
            CgroupLayout::V1 { memory, pids, cpu, cpuacct, .. } => vec![memory.clone(), pids.clone(), cpu.clone(), cpuacct.clone()],
            CgroupLayout::V2 { base, .. } => vec![base.clone()],
        };
        out.dedup();
        out
    }

    fn dir_for(&self, controller: Controller, name: &str) -> PathBuf {
        match self {
            CgroupLayout::V1 { memory, pids, cpu, cpuacct, .. } => match controller {
                Controller::Memory => memory.join(name),
                Controller::Pids => pids.join(name),
                Controller::Cpu => cpu.join(name),
                Controller::CpuAcct => cpuacct.join(name),
            },
            CgroupLayout::V2 { base, .. } => base.join(name),
        }
    }

    /// Creates the group for sandbox `id` with `limits` applied.
    pub fn create(&self, id: &str, limits: &Limits) -> Result<Cgroup> {
        let name = format!("{GROUP_PREFIX}{id}");
        let group = Cgroup { layout: self.clone(), name, applied: None, cpu_base: 0, usage_files: None, oom_base: 0 };
        for dir in group.dirs() {
            match fs::create_dir(&dir) {
                Ok(()) => {}
                Err(e) if e.kind() == ErrorKind::AlreadyExists => {}
                Err(e) => return Err(CgroupError::Io { path: dir, source: e }),
            }
        }
        let mut group = group;
        // cpu.cfs_period_us starts at the kernel's fixed default, which is
        // CPU_PERIOD_US, so it is not written (every cgroup file write costs).
        if let CgroupLayout::V1 { has_memsw: false, swap_off_inherited: false, .. } = self {
            // Without memsw the memory limit alone does not keep the group
            // out of swap. Best effort: not every kernel lets a child set it.
            let _ = group.write(Controller::Memory, "memory.swappiness", "0");
        }
        group.set_limits(limits)?;
        Ok(group)
    }

    /// Claims the parent groups for this agent for as long as the returned
    /// lock lives (an exclusive `flock` on the first parent directory), so
    /// that a second agent given the same name refuses to start rather than
    /// kill this one's sandboxes as leftovers. A crashed agent's claim ends
    /// with its process.
    pub fn claim(&self) -> Result<nix::fcntl::Flock<fs::File>> {
        let dir = self.parents().into_iter().next().ok_or(CgroupError::MissingController("memory"))?;
        let file = fs::File::open(&dir).map_err(io_err(&dir))?;
        nix::fcntl::Flock::lock(file, nix::fcntl::FlockArg::LockExclusiveNonblock).map_err(|(_, e)| match e {
            nix::errno::Errno::EWOULDBLOCK => CgroupError::InUse(dir.clone()),
            e => CgroupError::Io { path: dir.clone(), source: e.into() },
        })
    }

    /// Removes the (empty) parent groups and, on v2, gives the agent's group
    /// back as it was found (processes out of the leaf, controllers off); used
    /// at clean shutdown. A group something else also uses is left alone.
    pub fn remove_parents(&self) -> Result<()> {
        for dir in self.parents() {
            let _ = fs::remove_dir(dir);
        }
        match self {
            CgroupLayout::V2 { base, leaf: Some(leaf), .. } => delegate::leave_leaf(base.parent().unwrap_or(base), leaf),
            _ => Ok(()),
        }
    }

    /// Kills and removes every sandbox group left by an earlier agent run.
    /// Returns how many groups were removed.
    pub fn collect_garbage(&self) -> usize {
        let mut names: Vec<String> = Vec::new();
        for parent in self.parents() {
            let Ok(entries) = fs::read_dir(&parent) else { continue };
            for e in entries.flatten() {
                let name = e.file_name().to_string_lossy().into_owned();
                let ours = name.starts_with(GROUP_PREFIX) || name.starts_with(recycle::IDLE_PREFIX);
                if ours && !names.contains(&name) {
                    names.push(name);
                }
            }
        }
        let mut removed = 0;
        for name in names {
            let group = Cgroup { layout: self.clone(), name, applied: None, cpu_base: 0, usage_files: None, oom_base: 0 };
            group.kill_all();
            if group.remove().is_ok() {
                removed += 1;
            }
        }
        removed
    }
}

fn read(path: &Path) -> Result<String> {
    fs::read_to_string(path).map_err(io_err(path))
}

/// The cgroup of one sandbox.
#[derive(Debug)]
pub struct Cgroup {
    layout: CgroupLayout,
    name: String,
    /// Limits written last: rewriting the same values is skipped.
    applied: Option<Limits>,
    /// CPU microseconds used before the execution started (v2: since the
    /// group was made; both: what the idle sandbox used before its call).
    cpu_base: u64,
    /// The files [`Cgroup::usage`] reads, opened when accounting first
    /// starts (off the call's path) and read again from their start.
    usage_files: Option<UsageFiles>,
    /// OOM kills counted before accounting last started (a kept group's
    /// earlier sandboxes', see [`recycle`]).
    oom_base: u64,
}

/// Open usage files: CPU, peak memory (where the kernel keeps one), OOM kills.
#[derive(Debug)]
struct UsageFiles {
    cpu: fs::File,
    peak: Option<fs::File>,
    oom: fs::File,
}

/// A cgroup file's whole content, read from its start. The kernel makes
/// these files' text whole at each read from their start and hands over
/// all of it that fits, so a read that leaves room and ends a line is the
/// whole file: no second read to meet the end (one syscall per file per
/// call, not two).
fn reread(f: &fs::File) -> std::io::Result<String> {
    use std::os::unix::fs::FileExt;
    let mut buf = vec![0u8; 4096];
    let mut len = 0;
    loop {
        if len == buf.len() {
            buf.resize(2 * len, 0);
        }
        let n = f.read_at(&mut buf[len..], len as u64)?;
        len += n;
        if n == 0 || (len < buf.len() && buf[len - 1] == b'\n') {
            break;
        }
    }
    buf.truncate(len);
    String::from_utf8(buf).map_err(|e| std::io::Error::new(std::io::ErrorKind::InvalidData, e))
}

impl Cgroup {
    /// Directory name (`sbx-<id>`).
    pub fn name(&self) -> &str {
        &self.name
    }

    /// Every directory of this group (one per hierarchy).
    pub fn dirs(&self) -> Vec<PathBuf> {
        self.layout.parents().into_iter().map(|p| p.join(&self.name)).collect()
    }

    /// The `cgroup.procs` files a task must be written to, one per hierarchy.
    pub fn procs_files(&self) -> Vec<PathBuf> {
        self.dirs().into_iter().map(|d| d.join("cgroup.procs")).collect()
    }

    fn write(&self, controller: Controller, file: &str, value: &str) -> Result<()> {
        let path = self.layout.dir_for(controller, &self.name).join(file);
        fs::write(&path, value).map_err(io_err(&path))
    }

    fn read(&self, controller: Controller, file: &str) -> Result<String> {
        read(&self.layout.dir_for(controller, &self.name).join(file))
    }

    /// Applies `limits` (memory with swap off, pids, CPU quota).
    pub fn set_limits(&mut self, limits: &Limits) -> Result<()> {
        let same = |a: &Limits| (a.memory_bytes, a.pids, a.cpu_millis) == (limits.memory_bytes, limits.pids, limits.cpu_millis);
        if self.applied.as_ref().is_some_and(same) {
            return Ok(());
        }
        let previous_memory = self.applied.map(|a| a.memory_bytes);
        let writes = match &self.layout {
            CgroupLayout::V1 { has_memsw, .. } => v1_limit_writes(previous_memory, limits, *has_memsw),
            CgroupLayout::V2 { .. } => v2_limit_writes(limits),
        };
        for op in writes {
            self.write(op.controller, op.file, &op.value)?;
        }
        self.applied = Some(*limits);
        Ok(())
    }

    /// Starts accounting afresh: the CPU used so far and the OOM kills
    /// counted so far become bases that are subtracted (v2 counts from the
    /// group's making, a kept v1 group from its first sandbox's); v1's peak
    /// is reset (v2 keeps none that can be).
    pub fn reset_usage(&mut self) -> Result<()> {
        if let CgroupLayout::V1 { .. } = self.layout {
            self.write(Controller::Memory, "memory.max_usage_in_bytes", "0")?;
        }
        let (cpu, peak, oom) = self.usage_paths();
        // Open files stay valid across a rename of the group: opened once.
        if self.usage_files.is_none() {
            let open = |p: &PathBuf| fs::File::open(p).map_err(io_err(p));
            self.usage_files = Some(UsageFiles { cpu: open(&cpu)?, peak: peak.as_ref().map(open).transpose()?, oom: open(&oom)? });
        }
        self.cpu_base = self.cpu_micros_in_all()?;
        let counted = self.usage_files.as_ref().map(|f| reread(&f.oom)).transpose().map_err(io_err(&oom))?;
        self.oom_base = counted.and_then(|t| keyed_value(&t, "oom_kill")).unwrap_or(0);
        Ok(())
    }

    /// CPU the group used since accounting started (one read of one file,
    /// opened at [`Cgroup::reset_usage`]).
    pub fn cpu_micros(&self) -> Result<u64> {
        Ok(self.cpu_micros_in_all()?.saturating_sub(self.cpu_base))
    }

    /// CPU the group's counter holds, whatever accounting subtracts.
    fn cpu_micros_in_all(&self) -> Result<u64> {
        let (path, _, _) = self.usage_paths();
        let text = match &self.usage_files {
            Some(f) => reread(&f.cpu).map_err(io_err(&path))?,
            None => read(&path)?,
        };
        Ok(match self.layout {
            CgroupLayout::V1 { .. } => text.trim().parse::<u64>().unwrap_or(0) / 1000,
            CgroupLayout::V2 { .. } => keyed_value(&text, "usage_usec").unwrap_or(0),
        })
    }

    /// Leaves `micros` of CPU already used out of what [`Cgroup::usage`]
    /// reports from now on (what an idle sandbox used before its call is
    /// not the call's).
    pub fn exclude_cpu(&mut self, micros: u64) {
        self.cpu_base = self.cpu_base.saturating_add(micros);
    }

    /// Where CPU use, peak memory and OOM kills are read.
    fn usage_paths(&self) -> (PathBuf, Option<PathBuf>, PathBuf) {
        let at = |c: Controller, f: &str| self.layout.dir_for(c, &self.name).join(f);
        match self.layout {
            CgroupLayout::V1 { .. } => (at(Controller::CpuAcct, "cpuacct.usage"), Some(at(Controller::Memory, "memory.max_usage_in_bytes")), at(Controller::Memory, "memory.oom_control")),
            CgroupLayout::V2 { has_peak, .. } => (at(Controller::Cpu, "cpu.stat"), has_peak.then(|| at(Controller::Memory, "memory.peak")), at(Controller::Memory, "memory.events")),
        }
    }

    /// The file that says how much memory the group holds now (its
    /// processes, page cache and kernel memory charged to it), in bytes.
    pub fn memory_now_file(&self) -> PathBuf {
        let file = match self.layout {
            CgroupLayout::V1 { .. } => "memory.usage_in_bytes",
            CgroupLayout::V2 { .. } => "memory.current",
        };
        self.layout.dir_for(Controller::Memory, &self.name).join(file)
    }

    /// Reads what the group used.
    pub fn usage(&self) -> Result<Usage> {
        let (cpu_path, peak_path, oom_path) = self.usage_paths();
        let (cpu, peak, oom) = match &self.usage_files {
            Some(f) => {
                let get = |file: &fs::File, path: &PathBuf| reread(file).map_err(io_err(path));
                (get(&f.cpu, &cpu_path)?, f.peak.as_ref().zip(peak_path.as_ref()).map(|(file, path)| get(file, path)).transpose()?, get(&f.oom, &oom_path)?)
            }
            None => (read(&cpu_path)?, peak_path.as_deref().map(read).transpose()?, read(&oom_path)?),
        };
        let peak_memory_bytes = peak.and_then(|p| p.trim().parse().ok());
        let oom_kills = |text: &str| keyed_value(text, "oom_kill").unwrap_or(0).saturating_sub(self.oom_base);
        Ok(match self.layout {
            CgroupLayout::V1 { .. } => {
                let ns: u64 = cpu.trim().parse().unwrap_or(0);
                Usage { cpu_micros: (ns / 1000).saturating_sub(self.cpu_base), peak_memory_bytes, oom_kills: oom_kills(&oom) }
            }
            // memory.current after the program exited is not its peak: no
            // memory.peak, no figure.
            CgroupLayout::V2 { .. } => Usage {
                cpu_micros: keyed_value(&cpu, "usage_usec").unwrap_or(0).saturating_sub(self.cpu_base),
                peak_memory_bytes,
                oom_kills: oom_kills(&oom),
            },
        })
    }

    /// Pids currently in the group (from the pids hierarchy, which sees every task).
    pub fn pids(&self) -> Vec<i32> {
        let procs = self.layout.dir_for(Controller::Pids, &self.name).join("cgroup.procs");
        fs::read_to_string(procs)
            .map(|t| t.lines().filter_map(|l| l.trim().parse().ok()).collect())
            .unwrap_or_default()
    }

    /// SIGKILLs every task in the group (v2: `cgroup.kill`; v1: by pid until empty).
    pub fn kill_all(&self) {
        let _ = self.kill_all_until_empty();
    }

    /// [`Cgroup::kill_all`]; whether the group was seen empty after it (v2:
    /// not looked at, false).
    fn kill_all_until_empty(&self) -> bool {
        if let CgroupLayout::V2 { .. } = self.layout {
            if self.write(Controller::Pids, "cgroup.kill", "1").is_ok() {
                return false;
            }
        }
        // A forking task can add pids while we kill; a bounded number of rounds
        // is enough because the pids limit caps how many can appear.
        for _ in 0..100 {
            let pids = self.pids();
            if pids.is_empty() {
                return true;
            }
            for pid in pids {
                let _ = nix::sys::signal::kill(nix::unistd::Pid::from_raw(pid), nix::sys::signal::Signal::SIGKILL);
            }
            std::thread::sleep(std::time::Duration::from_millis(1));
        }
        false
    }

    /// Removes the group's directories. Tasks must be gone; an exiting task can
    /// keep a group busy for a moment, so EBUSY is retried briefly.
    pub fn remove(&self) -> Result<()> {
        for dir in self.dirs() {
            let mut attempt = 0;
            loop {
                match fs::remove_dir(&dir) {
                    Ok(()) => break,
                    Err(e) if e.kind() == ErrorKind::NotFound => break,
                    Err(e) if e.raw_os_error() == Some(libc::EBUSY) && attempt < 200 => {
                        attempt += 1;
                        std::thread::sleep(std::time::Duration::from_micros(500));
                    }
                    Err(e) => return Err(CgroupError::Io { path: dir, source: e }),
                }
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn limits(mem: u64) -> Limits {
        Limits {
            cpu_millis: 1500,
            memory_bytes: mem,
            pids: 64,
            tmp_bytes: 1,
            home_bytes: 1,
            max_output_bytes: 1,
            open_files: 1,
            file_size_bytes: 1,
        }
    }

    fn files(writes: &[CgroupWrite]) -> Vec<(&'static str, String)> {
        writes.iter().map(|w| (w.file, w.value.clone())).collect()
    }

    #[test]
    fn v2_translation_turns_swap_off_and_sets_quota() {
        let got = files(&v2_limit_writes(&limits(256 << 20)));
        assert_eq!(
            got,
            vec![
                ("memory.max", (256u64 << 20).to_string()),
                ("memory.swap.max", "0".into()),
                ("pids.max", "64".into()),
                ("cpu.max", "150000 100000".into()),
            ]
        );
    }

    #[test]
    fn v1_raises_memsw_before_memory_and_lowers_it_after() {
        let up = files(&v1_limit_writes(Some(100), &limits(200), true));
        assert_eq!(up[0].0, "memory.memsw.limit_in_bytes");
        assert_eq!(up[1].0, "memory.limit_in_bytes");
        let down = files(&v1_limit_writes(Some(300), &limits(200), true));
        assert_eq!(down[0].0, "memory.limit_in_bytes");
        assert_eq!(down[1].0, "memory.memsw.limit_in_bytes");
        let first = files(&v1_limit_writes(None, &limits(200), true));
        assert_eq!(first[0].0, "memory.limit_in_bytes", "a new group starts unlimited");
        let no_swap_acct = files(&v1_limit_writes(None, &limits(200), false));
        assert!(no_swap_acct.iter().all(|(f, _)| *f != "memory.memsw.limit_in_bytes"));
        assert!(no_swap_acct.contains(&("cpu.cfs_quota_us", "150000".into())));
        assert!(no_swap_acct.contains(&("pids.max", "64".into())));
    }

    const MOUNTINFO_V1: &str = "\
26 25 0:23 / /sys/fs/cgroup/cpu rw - cgroup cgroup rw,cpu
27 25 0:24 / /sys/fs/cgroup/cpuacct rw - cgroup cgroup rw,cpuacct
28 25 0:25 / /sys/fs/cgroup/memory rw - cgroup cgroup rw,memory
29 25 0:26 / /sys/fs/cgroup/pids rw - cgroup cgroup rw,pids
30 25 0:27 / /sys/fs/cgroup/unified rw - cgroup2 cgroup2 rw
";

    #[test]
    fn layout_prefers_v1_when_it_has_every_controller() {
        let own = "8:pids:/\n4:memory:/process_api/b7\n2:cpuacct:/\n1:cpu:/\n0::/\n";
        let layout = CgroupLayout::from_proc(MOUNTINFO_V1, own, PARENT_NAME).unwrap();
        assert_eq!(
            layout,
            CgroupLayout::V1 {
                memory: "/sys/fs/cgroup/memory/process_api/b7/warren".into(),
                pids: "/sys/fs/cgroup/pids/warren".into(),
                cpu: "/sys/fs/cgroup/cpu/warren".into(),
                cpuacct: "/sys/fs/cgroup/cpuacct/warren".into(),
                has_memsw: false,
                swap_off_inherited: false,
            }
        );
    }

    #[test]
    fn v2_sandboxes_go_under_the_agents_own_group() {
        let mountinfo = "30 25 0:27 / /sys/fs/cgroup rw - cgroup2 cgroup2 rw\n";
        let layout = CgroupLayout::from_proc(mountinfo, "0::/kubepods/pod1/agent\n", PARENT_NAME).unwrap();
        assert_eq!(
            layout,
            CgroupLayout::V2 {
                base: "/sys/fs/cgroup/kubepods/pod1/agent/warren".into(),
                leaf: Some("/sys/fs/cgroup/kubepods/pod1/agent/warren-agent".into()),
                has_peak: false,
            }
        );
        assert_eq!(layout.version(), 2);
    }

    #[test]
    fn v2_agent_restarted_in_its_leaf_delegates_the_same_group() {
        let mountinfo = "30 25 0:27 / /sys/fs/cgroup rw - cgroup2 cgroup2 rw\n";
        let layout = CgroupLayout::from_proc(mountinfo, "0::/system.slice/warren.service/warren-agent\n", PARENT_NAME).unwrap();
        let CgroupLayout::V2 { base, leaf, .. } = layout else { panic!("v2 expected") };
        assert_eq!(base, PathBuf::from("/sys/fs/cgroup/system.slice/warren.service/warren"));
        assert_eq!(leaf, Some("/sys/fs/cgroup/system.slice/warren.service/warren-agent".into()));
    }

    #[test]
    fn v2_in_a_private_cgroup_namespace_uses_the_mounted_group() {
        // A privileged container: its own group is the namespace's root and
        // the mount shows exactly that group.
        let mountinfo = "30 25 0:27 / /sys/fs/cgroup rw - cgroup2 cgroup2 rw\n";
        let layout = CgroupLayout::from_proc(mountinfo, "0::/\n", PARENT_NAME).unwrap();
        let CgroupLayout::V2 { base, .. } = layout else { panic!("v2 expected") };
        assert_eq!(base, PathBuf::from("/sys/fs/cgroup/warren"));
    }

    #[test]
    fn layout_without_controllers_is_an_error() {
        let err = CgroupLayout::from_proc("", "", PARENT_NAME).unwrap_err();
        assert!(matches!(err, CgroupError::MissingController("memory")));
    }

    #[test]
    fn keyed_values() {
        let oom = "oom_kill_disable 0\nunder_oom 0\noom_kill 3\n";
        assert_eq!(keyed_value(oom, "oom_kill"), Some(3));
        assert_eq!(keyed_value("usage_usec 1234\nuser_usec 1\n", "usage_usec"), Some(1234));
        assert_eq!(keyed_value("x 1", "y"), None);
    }
}
