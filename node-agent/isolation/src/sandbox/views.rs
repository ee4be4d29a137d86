//! What a program reads to size itself tells it the sandbox's size, not
//! the node's: thread pools, `multiprocessing` pools, BLAS threads, Node's
//! and the JVM's heaps are sized from these, and sized from the node they
//! oversubscribe the CPU quota and meet a memory limit they were never told.
//!
//! - the CPU count: the program runs on `ceil(cpu limit)` CPUs of the
//!   node (its affinity: `nproc`, `sched_getaffinity`, Node's
//!   `availableParallelism`, the JVM, Go), and `/sys/devices/system/cpu/
//!   {online,possible,present}` (glibc's `get_nprocs`: Python's
//!   `os.cpu_count()`), `/proc/cpuinfo` and `/proc/stat` (Node's
//!   `os.cpus()`) list those CPUs only;
//! - `/proc/meminfo`: `MemTotal` is the sandbox's memory limit, all of it
//!   free and available when the program starts; no swap (the sandbox has
//!   none).
//!
//! Mechanism, chosen for the execute path: the files are built while the
//! sandbox sits in the pool (a small tmpfs whose files are bound over
//! `/proc/meminfo`, `/proc/cpuinfo`, `/proc/stat`, and a `/sys` of its
//! own) and written for the pool's limits, with init's affinity set, so a
//! call with those limits costs nothing more; only a call whose limits
//! differ has init rewrite them (a few small writes) and move the program's
//! affinity. The figures are the sandbox's own: nothing of another sandbox
//! or of the node's use is shown. They describe the program's start (not a
//! live view, as LXCFS's FUSE files are): `MemFree` does not follow the
//! program's use, and `/proc/stat`'s counters stay at zero.

use std::fs;
use std::io;
use std::os::unix::fs::{DirBuilderExt, PermissionsExt};
use std::path::Path;

use nix::mount::{mount, MsFlags};
use serde::{Deserialize, Serialize};

/// The sandbox's size as the agent decided it: for the pool's limits when
/// it is built, and again at the call when the call's differ.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct View {
    /// The node's CPUs the program runs on (at least one).
    pub cpus: Vec<u32>,
    /// The memory limit, bytes.
    pub memory_bytes: u64,
}

/// What the node says of itself, read once while the sandbox is built
/// (before the views hide it): each CPU's `/proc/cpuinfo` block, and the
/// boot time.
#[derive(Debug, Clone, Default)]
pub struct NodeFacts {
    /// (processor number, its block of lines without the trailing blank).
    cpuinfo: Vec<(u32, String)>,
    btime: u64,
    /// The node's memory, bytes (told when no limit is known).
    memory_bytes: u64,
}

/// Files bound over procfs.
const PROC_VIEWS: [&str; 3] = ["meminfo", "cpuinfo", "stat"];
/// Files of `/sys/devices/system/cpu` listing the program's CPUs.
const CPU_LISTS: [&str; 3] = ["online", "possible", "present"];

/// The facts the spawner read at its start, inherited by every supervisor
/// it forks (and their inits): reading `/proc/cpuinfo` costs the kernel a
/// frequency query per CPU (an interrupt to each), which a sandbox's build
/// then skips.
static READ_AT_START: std::sync::OnceLock<NodeFacts> = std::sync::OnceLock::new();

impl NodeFacts {
    /// Reads the facts once for the processes this one forks from now on
    /// (the spawner, single-threaded, before it forks). A failed read leaves
    /// each sandbox to read them itself.
    pub fn read_once(proc: &Path) {
        if let Ok(facts) = NodeFacts::read(proc) {
            let _ = READ_AT_START.set(facts);
        }
    }

    /// The facts read at the spawner's start, else read now under `proc`.
    pub fn get(proc: &Path) -> io::Result<NodeFacts> {
        match READ_AT_START.get() {
            Some(facts) => Ok(facts.clone()),
            None => NodeFacts::read(proc),
        }
    }

    /// Reads the node's `/proc/cpuinfo` and `/proc/stat` under `proc`.
    pub fn read(proc: &Path) -> io::Result<NodeFacts> {
        let cpuinfo = parse_cpuinfo(&fs::read_to_string(proc.join("cpuinfo"))?);
        let btime = fs::read_to_string(proc.join("stat"))?.lines().find_map(|l| l.strip_prefix("btime ")?.trim().parse().ok()).unwrap_or(0);
        let kb: u64 = fs::read_to_string(proc.join("meminfo"))?.lines().find_map(|l| l.strip_prefix("MemTotal:")?.trim().strip_suffix("kB")?.trim().parse().ok()).unwrap_or(0);
        Ok(NodeFacts { cpuinfo, btime, memory_bytes: kb * 1024 })
    }
}

/// `/proc/cpuinfo` as (processor, block) pairs.
fn parse_cpuinfo(text: &str) -> Vec<(u32, String)> {
    text.split("\n\n")
        .filter_map(|block| {
            let block = block.trim_matches('\n');
            let id = block.lines().next()?.strip_prefix("processor")?.split(':').nth(1)?.trim().parse().ok()?;
            Some((id, block.to_string()))
        })
        .collect()
}

/// The kernel's list format: `0-3,6`.
pub fn cpu_list(cpus: &[u32]) -> String {
    let mut sorted = cpus.to_vec();
    sorted.sort_unstable();
    sorted.dedup();
    let mut out: Vec<String> = Vec::new();
    let mut i = 0;
    while i < sorted.len() {
        let start = sorted[i];
        while i + 1 < sorted.len() && sorted[i + 1] == sorted[i] + 1 {
            i += 1;
        }
        out.push(if sorted[i] == start { start.to_string() } else { format!("{start}-{}", sorted[i]) });
        i += 1;
    }
    out.join(",") + "\n"
}

/// `/proc/meminfo` for `view`, in kB as the kernel writes it.
pub fn meminfo(view: &View) -> String {
    let kb = |b: u64| b / 1024;
    let total = kb(view.memory_bytes);
    let free = total;
    let fields: [(&str, u64); 20] = [
        ("MemTotal", total),
        ("MemFree", free),
        ("MemAvailable", free),
        ("Buffers", 0),
        ("Cached", 0),
        ("SwapCached", 0),
        ("Active", 0),
        ("Inactive", 0),
        ("SwapTotal", 0),
        ("SwapFree", 0),
        ("Dirty", 0),
        ("Writeback", 0),
        ("AnonPages", 0),
        ("Mapped", 0),
        ("Shmem", 0),
        ("Slab", 0),
        ("SReclaimable", 0),
        ("SUnreclaim", 0),
        ("CommitLimit", total),
        ("Committed_AS", 0),
    ];
    fields.iter().map(|(k, v)| format!("{:<16}{v:>8} kB\n", format!("{k}:"))).collect()
}

/// `/proc/cpuinfo` listing `cpus` only (a CPU the node does not describe
/// borrows the first block, renumbered).
pub fn cpuinfo(facts: &NodeFacts, cpus: &[u32]) -> String {
    let mut out = String::new();
    for cpu in cpus {
        let block = facts.cpuinfo.iter().find(|(id, _)| id == cpu).or(facts.cpuinfo.first()).map(|(_, b)| b.as_str()).unwrap_or("");
        let mut lines = block.lines();
        lines.next();
        out.push_str(&format!("processor\t: {cpu}\n"));
        for line in lines {
            out.push_str(line);
            out.push('\n');
        }
        out.push('\n');
    }
    out
}

/// `/proc/stat` listing `cpus` only, every counter starting at zero (the
/// program's sandbox has used nothing yet), with the node's boot time.
pub fn stat(facts: &NodeFacts, cpus: &[u32]) -> String {
    let zeros = "0 0 0 0 0 0 0 0 0 0";
    let mut out = format!("cpu  {zeros}\n");
    for cpu in cpus {
        out.push_str(&format!("cpu{cpu} {zeros}\n"));
    }
    out.push_str(&format!("intr 0\nctxt 0\nbtime {}\nprocesses 0\nprocs_running 1\nprocs_blocked 0\nsoftirq 0\n", facts.btime));
    out
}

fn err<'a>(step: &'static str, path: &'a Path) -> impl FnOnce(nix::Error) -> io::Error + 'a {
    move |e| io::Error::other(format!("{step} {}: {e}", path.display()))
}

/// Writes `text` to `path`, created read-only (`0444`) where it is new: its
/// owner (init, root of the sandbox's user namespace) rewrites it when a
/// call's size differs; the program cannot.
fn put(path: &Path, text: &str) -> io::Result<()> {
    use std::io::Write;
    use std::os::unix::fs::OpenOptionsExt;
    let mut f = fs::OpenOptions::new().write(true).create(true).truncate(true).mode(0o444).open(path)?;
    if super::rootfs::umask() & 0o444 != 0 {
        f.set_permissions(fs::Permissions::from_mode(0o444))?;
    }
    f.write_all(text.as_bytes())
}

fn dir(path: &Path) -> io::Result<()> {
    fs::DirBuilder::new().recursive(true).mode(0o555).create(path)?;
    if super::rootfs::umask() & 0o555 == 0 {
        return Ok(());
    }
    fs::set_permissions(path, fs::Permissions::from_mode(0o555))
}

/// Builds the views under `root` (the sandbox's root before pivot, with its
/// fresh procfs mounted), written for `view` as they are made: the procfs
/// files are bound from a tmpfs mounted on `staging` (an empty directory
/// outside the root, which leaves with the old root at the pivot), and
/// `/sys` becomes a tmpfs of its own holding `devices/system/cpu`. A root
/// without a `sys` mount point (an image unpacked by an older agent) gets
/// no `/sys`.
pub fn mount_views(root: &Path, staging: &Path, facts: &NodeFacts, view: &View) -> io::Result<()> {
    mount(Some("tmpfs"), staging, Some("tmpfs"), MsFlags::MS_NOSUID | MsFlags::MS_NODEV | MsFlags::MS_NOEXEC, Some("size=1m,nr_inodes=16,mode=0555")).map_err(err("mount views", staging))?;
    let cpus = cpus_of(facts, view);
    let texts = [meminfo_of(facts, view), cpuinfo(facts, &cpus), stat(facts, &cpus)];
    for (name, text) in PROC_VIEWS.iter().zip(texts) {
        let (src, dst) = (staging.join(name), root.join("proc").join(name));
        put(&src, &text)?;
        mount(Some(&src), &dst, None::<&str>, MsFlags::MS_BIND, None::<&str>).map_err(err("bind view", &dst))?;
    }
    let sys = root.join("sys");
    if !sys.is_dir() {
        return Ok(());
    }
    mount(Some("sysfs-view"), &sys, Some("tmpfs"), MsFlags::MS_NOSUID | MsFlags::MS_NODEV | MsFlags::MS_NOEXEC, Some("size=64k,nr_inodes=256,mode=0555")).map_err(err("mount /sys", &sys))?;
    let cpu = sys.join("devices/system/cpu");
    dir(&cpu)?;
    write_cpu_lists(&cpu, &cpus)
}

/// Rewrites what differs between the views of `built` and of `call` (the
/// call's size, where it is not the one the sandbox was built with): init,
/// inside the sandbox, after pivot.
pub fn rewrite_views(facts: &NodeFacts, built: &View, call: &View) -> io::Result<()> {
    let (memory, cpus) = changed(built, call);
    if memory {
        put(Path::new("/proc/meminfo"), &meminfo_of(facts, call))?;
    }
    if cpus {
        let cpus = cpus_of(facts, call);
        put(Path::new("/proc/cpuinfo"), &cpuinfo(facts, &cpus))?;
        put(Path::new("/proc/stat"), &stat(facts, &cpus))?;
        let cpu = Path::new("/sys/devices/system/cpu");
        if cpu.is_dir() {
            write_cpu_lists(cpu, &cpus)?;
        }
    }
    Ok(())
}

/// Whether (the memory view, the CPU views) differ between two sizes.
fn changed(built: &View, call: &View) -> (bool, bool) {
    (built.memory_bytes != call.memory_bytes, built.cpus != call.cpus)
}

/// `/proc/meminfo` for `view`; a view without figures (none given) tells
/// the node's own.
fn meminfo_of(facts: &NodeFacts, view: &View) -> String {
    let memory_bytes = if view.memory_bytes == 0 { facts.memory_bytes } else { view.memory_bytes };
    meminfo(&View { cpus: Vec::new(), memory_bytes })
}

/// The CPUs `view` lists: its own, else all the node describes, else CPU 0.
fn cpus_of(facts: &NodeFacts, view: &View) -> Vec<u32> {
    match (view.cpus.is_empty(), facts.cpuinfo.is_empty()) {
        (false, _) => view.cpus.clone(),
        (true, false) => facts.cpuinfo.iter().map(|(id, _)| *id).collect(),
        (true, true) => vec![0],
    }
}

/// `online`, `possible` and `present` in `cpu` (`/sys/devices/system/cpu`),
/// and a `cpuN` directory for each of `cpus`.
fn write_cpu_lists(cpu: &Path, cpus: &[u32]) -> io::Result<()> {
    let list = cpu_list(cpus);
    for name in CPU_LISTS {
        put(&cpu.join(name), &list)?;
    }
    for c in cpus {
        // Some read the count from the cpuN directories.
        let d = cpu.join(format!("cpu{c}"));
        if !d.exists() {
            dir(&d)?;
        }
    }
    Ok(())
}

/// Runs `tasks` (0: the caller) on `cpus` (none: left as they are).
pub fn set_affinity(tasks: &[nix::unistd::Pid], cpus: &[u32]) -> io::Result<()> {
    if cpus.is_empty() {
        return Ok(());
    }
    let mut set = nix::sched::CpuSet::new();
    for c in cpus {
        set.set(*c as usize).map_err(io::Error::from)?;
    }
    for task in tasks {
        match nix::sched::sched_setaffinity(*task, &set) {
            // A thread that ended meanwhile.
            Ok(()) | Err(nix::errno::Errno::ESRCH) => {}
            Err(e) => return Err(e.into()),
        }
    }
    Ok(())
}

/// Every thread of process `pid`, from the sandbox's procfs.
pub fn threads_of(pid: nix::unistd::Pid) -> Vec<nix::unistd::Pid> {
    let dir = format!("/proc/{pid}/task");
    let found = fs::read_dir(dir).map(|d| d.filter_map(|e| e.ok()?.file_name().to_str()?.parse().ok().map(nix::unistd::Pid::from_raw)).collect::<Vec<_>>());
    found.ok().filter(|t| !t.is_empty()).unwrap_or_else(|| vec![pid])
}

#[cfg(test)]
mod tests {
    use super::*;

    const CPUINFO: &str = "processor\t: 0\nvendor_id\t: GenuineIntel\nmodel name\t: X\n\nprocessor\t: 1\nvendor_id\t: GenuineIntel\nmodel name\t: Y\n\n";

    #[test]
    fn a_call_rewrites_only_the_views_its_size_changes() {
        let built = View { cpus: vec![0], memory_bytes: 1 << 30 };
        assert_eq!(changed(&built, &View { cpus: vec![0], memory_bytes: 1 << 28 }), (true, false), "memory alone");
        assert_eq!(changed(&built, &View { cpus: vec![1], memory_bytes: 1 << 30 }), (false, true), "CPUs alone");
        assert_eq!(changed(&built, &View { cpus: vec![0, 1], memory_bytes: 1 << 28 }), (true, true));
        assert_eq!(changed(&built, &built.clone()), (false, false));
    }

    #[test]
    fn cpu_lists_are_written_as_the_kernel_writes_them() {
        assert_eq!(cpu_list(&[0]), "0\n");
        assert_eq!(cpu_list(&[3, 0, 1, 2, 6]), "0-3,6\n");
        assert_eq!(cpu_list(&[5, 7]), "5,7\n");
    }

    #[test]
    fn meminfo_is_the_sandboxs_limit_and_use() {
        let text = meminfo(&View { cpus: vec![0], memory_bytes: 1 << 30 });
        let field = |k: &str| text.lines().find(|l| l.starts_with(&format!("{k}:"))).and_then(|l| l.split_whitespace().nth(1)).and_then(|v| v.parse::<u64>().ok()).unwrap();
        assert_eq!((field("MemTotal"), field("MemFree"), field("MemAvailable")), (1 << 20, 1 << 20, 1 << 20));
        assert_eq!((field("SwapTotal"), field("SwapFree")), (0, 0));
        assert!(text.lines().all(|l| l.ends_with(" kB")), "{text}");
    }

    #[test]
    fn cpuinfo_and_stat_list_only_the_programs_cpus() {
        let facts = NodeFacts { cpuinfo: parse_cpuinfo(CPUINFO), btime: 1_700_000_000, memory_bytes: 1 << 34 };
        assert_eq!(cpuinfo(&facts, &[1]), "processor\t: 1\nvendor_id\t: GenuineIntel\nmodel name\t: Y\n\n");
        assert_eq!(cpuinfo(&facts, &[4]).lines().next(), Some("processor\t: 4"), "an undescribed CPU borrows a block");
        let s = stat(&facts, &[0, 1]);
        assert_eq!(s.lines().filter(|l| l.starts_with("cpu")).count(), 3, "{s}");
        assert!(s.contains("\nbtime 1700000000\n"));
    }
}
