//! Builds the sandbox's filesystem inside its private mount namespace:
//!
//! ```text
//! /               read-only bind of the agent's prepared host root (mount points, links, /etc)
//! ├── usr         host /usr, read-only, nosuid, nodev (bin, lib, sbin, lib64 are symlinks or ro binds)
//! ├── etc         the prepared /etc (generated passwd/group/hosts + copies of a safe subset of host /etc)
//! ├── proc        fresh procfs of the sandbox's pid namespace, sensitive files masked
//! ├── dev         null zero full random urandom, fd links, /dev/shm tmpfs; read-only (on an image: a tmpfs)
//! ├── tmp         ┐ one tmpfs of the sandbox's tmp size, bound at each: /tmp,
//! ├── var/tmp     │ /var/tmp, /run/lock (1777), and /var/cache, lib, log,
//! ├── var/…       ┘ spool, mail, opt, local (the sandbox user's) — on an image only where it has none
//! ├── sys         a tmpfs with devices/system/cpu/{online,possible,present}: the sandbox's CPUs
//! ├── home        read-only bind of the agent's per-sandbox home dir, a mount-propagation slave
//! │   └── sandbox tmpfs mounted by init at Go (size-limited, 0700, uid 1000),
//! │               or a thread's overlay the agent mounted on the host side
//! ├── data        read-only bind of the agent's per-sandbox data dir, a mount-propagation slave
//! │   └── <name>  a storage mount the agent served on the host side
//! └── run/warren  a small tmpfs: the program text, read-only once written
//! ```
//!
//! With an OCI image, `/` is instead a read-only bind of the image's root
//! (an overlay the agent mounted once, whose top layer holds the mount
//! points below and the identity files in `/etc`), without the `/usr`
//! bind; `/run/warren`, `/proc`, `/dev`, `/tmp`, `/var/tmp`, `/sys`,
//! `/home` and `/data` are the same, and `/var/cache` and the other FHS
//! places programs write to are mounted where the image has none (an
//! empty directory), never over the image's own. `/proc/meminfo`,
//! `/proc/cpuinfo` and `/proc/stat` tell the sandbox's size ([`super::views`]).
//!
//! Nothing is created on the host per sandbox: the host root is prepared
//! once by the agent ([`prepare_host_root`]), and every mount lives and
//! dies with the sandbox's mount namespace. The links back are `/home` and `/data`, which
//! receive (never send) mounts the agent makes under the sandbox's dirs.

use std::ffi::CString;
use std::fs;
use std::io;
use std::os::unix::fs::{symlink, DirBuilderExt, PermissionsExt};
use std::path::{Path, PathBuf};

use nix::mount::{mount, umount2, MntFlags, MsFlags};

use warren_core::layout::{Writable, WORKSPACE, WRITABLE};

use super::sys;
use crate::wire::SupervisorConfig;

/// uid/gid of the program inside the sandbox.
pub const SANDBOX_UID: u32 = 1000;
/// Home directory of the program.
pub const HOME: &str = "/home/sandbox";
/// Directory holding the program text.
pub const SCRIPT_DIR: &str = "/run/warren";
/// The tmpfs holding it on an image root (code is at most 1 MiB).
const SCRIPT_TMPFS: &str = "size=2m,nr_inodes=64,mode=0755";

/// Top-level entries that are symlinks into /usr on merged-/usr systems, or
/// directories to bind read-only otherwise.
const USR_ALIASES: &[&str] = &["bin", "sbin", "lib", "lib32", "lib64", "libx32"];

/// Host /etc entries safe to show (copied into the prepared /etc): loader config, certificates, alternatives
/// links, locale/timezone data. No secrets (shadow, ssh keys, machine-id...).
const ETC_BINDS: &[&str] = &[
    "ld.so.cache", "ld.so.conf", "ld.so.conf.d", "alternatives", "ssl/certs", "ssl/openssl.cnf",
    "ca-certificates", "ca-certificates.conf", "python3", "python3.11", "protocols", "services",
    "mime.types", "gai.conf", "host.conf", "localtime", "timezone", "bash.bashrc", "inputrc", "magic",
    "os-release", "debian_version", "shells",
];

/// procfs files that leak host information or accept dangerous writes
/// (runc's default masked paths, and more).
const PROC_MASKED_FILES: &[&str] = &[
    "kcore", "keys", "key-users", "timer_list", "timer_stats", "sched_debug", "sysrq-trigger", "latency_stats", "kpagecount",
    "kpageflags", "kpagecgroup", "config.gz", "kallsyms", "modules", "interrupts", "softirqs", "vmallocinfo", "slabinfo",
    "pagetypeinfo", "buddyinfo", "zoneinfo", "iomem", "ioports", "dma", "mtrr", "partitions", "diskstats", "swaps",
];
/// procfs directories hidden behind an empty read-only tmpfs (runc masks these too).
const PROC_MASKED_DIRS: &[&str] = &["acpi", "asound", "scsi", "driver", "tty"];
/// procfs directories made read-only.
const PROC_READONLY_DIRS: &[&str] = &["sys", "irq", "bus", "fs"];

const DEVICES: &[&str] = &["null", "zero", "full", "random", "urandom"];
/// The host root's links in `/var`, as a Debian system has them.
const HOST_VAR_LINKS: [(&str, &str); 2] = [("run", "/run"), ("lock", "/run/lock")];

/// A setup step that failed, with its path.
#[derive(Debug, thiserror::Error)]
#[error("{step} {path}: {source}")]
pub struct RootfsError {
    step: &'static str,
    path: PathBuf,
    #[source]
    source: io::Error,
}

type Result<T> = std::result::Result<T, RootfsError>;

fn ctx<'a, E: Into<io::Error>>(step: &'static str, path: &'a Path) -> impl FnOnce(E) -> RootfsError + 'a {
    move |e| RootfsError { step, path: path.to_path_buf(), source: e.into() }
}

fn nix_io(e: nix::Error) -> io::Error {
    io::Error::from(e)
}

/// Builds the tree on `cfg.mount_dir` and makes it the root; returns
/// what the node says of its CPUs (read before the views hide it).
///
/// The mount dir gets the writable places' tmpfs, staged ([`stage_writable`]):
/// the root is bound on its `root/` and the views' tmpfs is mounted on its
/// `views/`, so nothing staged is inside the root, and all of it leaves with
/// the old root at the pivot, in one detach (a detach of its own per
/// staging tmpfs waited for an expedited RCU grace period, all CPUs'
/// work, each).
pub fn build(cfg: &SupervisorConfig) -> Result<super::views::NodeFacts> {
    let base = cfg.mount_dir.as_path();
    // Slave, not private: the home bind below must keep receiving the
    // agent's mounts. Every other host bind is made private right away.
    mount(None::<&str>, "/", None::<&str>, MsFlags::MS_REC | MsFlags::MS_SLAVE, None::<&str>)
        .map_err(nix_io)
        .map_err(ctx("make-slave", Path::new("/")))?;
    // nosuid,nodev (and a bind copies its source's flags): each writable
    // place is bound once, with no remount.
    tmpfs(base, &format!("size={},nr_inodes=262144,mode=0755", cfg.tmp_bytes), MsFlags::empty())?;
    let (root, views) = (base.join("root"), base.join("views"));
    mkdir(&root, 0o755)?;
    mkdir(&views, 0o755)?;
    let root = root.as_path();
    match &cfg.image_root {
        None => {
            bind_readonly(&cfg.host_root, root, MsFlags::MS_NODEV)?;
            mirror_usr(root)?;
        }
        Some(image) => bind_readonly(image, root, MsFlags::MS_NODEV)?,
    }
    mount_proc(root)?;
    let facts = super::views::NodeFacts::get(&root.join("proc")).map_err(ctx("read", Path::new("/proc/cpuinfo")))?;
    populate_dev(root, cfg.image_root.is_none())?;
    mkdir(&root.join("run"), 0o755)?;
    mkdir(&root.join("run/warren"), 0o755)?;
    stage_writable(root, base, cfg.image_root.is_none())?;
    super::views::mount_views(root, &views, &facts, &cfg.view).map_err(ctx("views", root))?;
    bind_receiving(&cfg.home_dir, &root.join("home"))?;
    bind_receiving(&cfg.data_dir, &root.join("data"))?;
    // The root is read-only: the program text gets its own tmpfs.
    tmpfs(&root.join("run/warren"), SCRIPT_TMPFS, MsFlags::MS_NOEXEC)?;
    bind_receiving(&cfg.conn_dir, &root.join("run/warren/connectors"))?;
    pivot(root)?;
    Ok(facts)
}

/// Builds the `host` root once, on the host, in the agent's state dir: the
/// mount points, the links into `/usr`, `/var/run`, `/var/lock` as a Debian
/// system has them, and the prepared `/etc` ([`prepare_etc`]). Each sandbox
/// binds it read-only as `/` (as it does an image's root) and binds `/usr`
/// on it, instead of making a tmpfs and some fifty entries in it.
pub fn prepare_host_root(dir: &Path) -> io::Result<()> {
    if fs::symlink_metadata(dir).is_ok() {
        fs::remove_dir_all(dir)?;
    }
    let dirs = ["", "usr", "var", "run", "run/warren", "sys", "dev", "home", "data"].map(|d| (d, 0o755));
    let writable = WRITABLE.map(|w| (w.path, w.mode));
    for (rel, mode) in dirs.into_iter().chain([("proc", 0o555)]).chain(writable) {
        make_dir(&dir.join(rel), mode)?;
    }
    for name in USR_ALIASES {
        let host = Path::new("/").join(name);
        match fs::symlink_metadata(&host) {
            Ok(meta) if meta.file_type().is_symlink() => symlink(fs::read_link(&host)?, dir.join(name))?,
            Ok(meta) if meta.is_dir() => make_dir(&dir.join(name), 0o755)?,
            _ => {}
        }
    }
    for (link, to) in HOST_VAR_LINKS.map(|(l, to)| (format!("var/{l}"), to)).into_iter().chain([(WORKSPACE.0.to_string(), WORKSPACE.1)]) {
        symlink(to, dir.join(link))?;
    }
    dev_entries(&dir.join("dev"))?;
    prepare_etc(&dir.join("etc"))
}

/// A new directory with exactly `mode` (whatever the umask), on the host.
fn make_dir(path: &Path, mode: u32) -> io::Result<()> {
    fs::DirBuilder::new().mode(mode).create(path)?;
    fs::set_permissions(path, fs::Permissions::from_mode(mode))
}

/// `rel` below `root` is a directory reached through directories only (an
/// image's symlink never leads a mount out of the sandbox's root).
fn real_dir(root: &Path, rel: &str) -> bool {
    let mut path = root.to_path_buf();
    rel.split('/').all(|part| {
        path.push(part);
        fs::symlink_metadata(&path).is_ok_and(|m| m.is_dir())
    })
}

fn is_empty_dir(path: &Path) -> bool {
    fs::read_dir(path).is_ok_and(|mut d| d.next().is_none())
}

/// Binds one tmpfs (`staging`, outside the root) at every writable place the
/// root has a mount point for. On the prepared host root, `/var` holds
/// nothing but its writable places and two links, so one staged `/var`
/// holding all of them is bound there (three binds in all, not ten: a mount
/// is ~5 µs of CPU with its teardown).
fn stage_writable(root: &Path, staging: &Path, host_root: bool) -> Result<()> {
    if host_root {
        stage_host_var(root, staging)
    } else {
        bind_places(root, staging, WRITABLE.iter().enumerate().collect())
    }
}

/// Makes writable place `w`'s directory `src` in the staging tmpfs (its mode, its owner).
fn stage_place(src: &Path, w: &Writable) -> Result<()> {
    mkdir(src, w.mode)?;
    if w.owned {
        nix::unistd::chown(src, Some(SANDBOX_UID.into()), Some(SANDBOX_UID.into())).map_err(nix_io).map_err(ctx("chown", src))?;
    }
    Ok(())
}

/// Binds each of `places` (by their index in [`WRITABLE`]) from `staging`.
fn bind_places(root: &Path, staging: &Path, places: Vec<(usize, &Writable)>) -> Result<()> {
    places.into_iter().try_for_each(|(i, w)| {
        let target = root.join(w.path);
        if !real_dir(root, w.path) || (w.only_where_missing && !is_empty_dir(&target)) {
            return Ok(());
        }
        let src = staging.join(i.to_string());
        stage_place(&src, w)?;
        mount(Some(&src), &target, None::<&str>, MsFlags::MS_BIND, None::<&str>).map_err(nix_io).map_err(ctx("bind", &target))
    })
}

/// The host root's `/var`: staged whole (its places, `run` and `lock` as
/// [`prepare_host_root`] links them) and bound once; the places elsewhere
/// (`/tmp`, `/run/lock`) are bound one by one.
fn stage_host_var(root: &Path, staging: &Path) -> Result<()> {
    let var = staging.join("var");
    mkdir(&var, 0o755)?;
    let (below, elsewhere): (Vec<_>, Vec<_>) = WRITABLE.iter().enumerate().partition(|(_, w)| w.path.starts_with("var/"));
    for (_, w) in below {
        stage_place(&staging.join(w.path), w)?;
    }
    for (link, to) in HOST_VAR_LINKS {
        symlink(to, var.join(link)).map_err(ctx("symlink", &var.join(link)))?;
    }
    bind_places(root, staging, elsewhere)?;
    let target = root.join("var");
    mount(Some(&var), &target, None::<&str>, MsFlags::MS_BIND, None::<&str>).map_err(nix_io).map_err(ctx("bind", &target))
}

/// Binds the agent's `src` on `dst` read-only, staying a propagation slave
/// so mounts the agent makes below `src` later appear below `dst`.
fn bind_receiving(src: &Path, dst: &Path) -> Result<()> {
    mkdir(dst, 0o755)?;
    mount(Some(src), dst, None::<&str>, MsFlags::MS_BIND, None::<&str>).map_err(nix_io).map_err(ctx("bind", dst))?;
    let flags = MsFlags::MS_BIND | MsFlags::MS_REMOUNT | MsFlags::MS_RDONLY | MsFlags::MS_NOSUID | MsFlags::MS_NODEV | MsFlags::MS_NOEXEC;
    mount(None::<&str>, dst, None::<&str>, flags | locked_flags(dst)?, None::<&str>).map_err(nix_io).map_err(ctx("remount ro", dst))
}

/// Mounts the program's fresh home (a call without a thread).
pub fn mount_home_tmpfs(bytes: u64) -> io::Result<()> {
    let opts = format!("size={bytes},nr_inodes=262144,mode=0700,uid={SANDBOX_UID},gid={SANDBOX_UID}");
    tmpfs(Path::new(HOME), &opts, MsFlags::empty()).map_err(|e| io::Error::other(e.to_string()))
}

/// Writes the program text and makes the `/run/warren` tmpfs that holds it
/// read-only (called at Go time).
pub fn install_script(name: &str, code: &str) -> io::Result<()> {
    let path = Path::new(SCRIPT_DIR).join(name);
    fs::write(&path, code)?;
    fs::set_permissions(&path, fs::Permissions::from_mode(0o444))?;
    let flags = MsFlags::MS_REMOUNT | MsFlags::MS_RDONLY | MsFlags::MS_NOSUID | MsFlags::MS_NODEV | MsFlags::MS_NOEXEC;
    mount(None::<&str>, SCRIPT_DIR, None::<&str>, flags, Some(SCRIPT_TMPFS)).map_err(nix_io)
}

/// Creates a mount point with `mode`; one that exists (the prepared host
/// root's, an image's, both read-only) is used as it is.
fn mkdir(path: &Path, mode: u32) -> Result<()> {
    match fs::DirBuilder::new().mode(mode).create(path) {
        Ok(()) => {}
        Err(e) if e.kind() == io::ErrorKind::AlreadyExists => return Ok(()),
        Err(e) => return Err(ctx("mkdir", path)(e)),
    }
    // Only where the umask cut bits of `mode` (1777 places).
    if mode & umask() == 0 {
        return Ok(());
    }
    fs::set_permissions(path, fs::Permissions::from_mode(mode)).map_err(ctx("chmod", path))
}

/// This process's umask, read once (reading it means setting it).
pub(super) fn umask() -> u32 {
    static UMASK: std::sync::OnceLock<u32> = std::sync::OnceLock::new();
    *UMASK.get_or_init(|| {
        let old = nix::sys::stat::umask(nix::sys::stat::Mode::empty());
        nix::sys::stat::umask(old);
        old.bits()
    })
}

/// `/dev`'s entries in `dev`: the devices' mount points, the fd links,
/// `pts` (where a live sandbox mounts its own terminals, `live::PTS_DIR`)
/// with the `ptmx` link, and `shm`'s mount point.
fn dev_entries(dev: &Path) -> io::Result<()> {
    for name in DEVICES {
        fs::OpenOptions::new().create(true).truncate(false).write(true).open(dev.join(name))?;
    }
    for (name, to) in [("fd", "/proc/self/fd"), ("stdin", "/proc/self/fd/0"), ("stdout", "/proc/self/fd/1"), ("stderr", "/proc/self/fd/2"), ("ptmx", "pts/ptmx")] {
        symlink(to, dev.join(name))?;
    }
    make_dir(&dev.join("pts"), 0o755)?;
    make_dir(&dev.join("shm"), 0o1777)
}

fn tmpfs(target: &Path, opts: &str, extra: MsFlags) -> Result<()> {
    let flags = MsFlags::MS_NOSUID | MsFlags::MS_NODEV | extra;
    mount(Some("tmpfs"), target, Some("tmpfs"), flags, Some(opts)).map_err(nix_io).map_err(ctx("mount tmpfs", target))
}

/// Bind-mounts `src` on `dst` and remounts it read-only, keeping the flags the
/// kernel locks for mounts inherited into a user namespace (atime, noexec...).
fn bind_readonly(src: &Path, dst: &Path, extra: MsFlags) -> Result<()> {
    mount(Some(src), dst, None::<&str>, MsFlags::MS_BIND, None::<&str>).map_err(nix_io).map_err(ctx("bind", dst))?;
    // A bind of a slave is a slave; only /home and /data may receive host mounts.
    mount(None::<&str>, dst, None::<&str>, MsFlags::MS_PRIVATE, None::<&str>).map_err(nix_io).map_err(ctx("make-private", dst))?;
    let locked = locked_flags(dst)?;
    let flags = MsFlags::MS_BIND | MsFlags::MS_REMOUNT | MsFlags::MS_RDONLY | MsFlags::MS_NOSUID | extra | locked;
    mount(None::<&str>, dst, None::<&str>, flags, None::<&str>).map_err(nix_io).map_err(ctx("remount ro", dst))
}

fn locked_flags(path: &Path) -> Result<MsFlags> {
    use nix::sys::statvfs::{statvfs, FsFlags};
    let st = statvfs(path).map_err(nix_io).map_err(ctx("statvfs", path))?;
    let f = st.flags();
    let mut out = MsFlags::empty();
    for (fs_flag, ms_flag) in [
        (FsFlags::ST_NODEV, MsFlags::MS_NODEV),
        (FsFlags::ST_NOEXEC, MsFlags::MS_NOEXEC),
        (FsFlags::ST_NOATIME, MsFlags::MS_NOATIME),
        (FsFlags::ST_NODIRATIME, MsFlags::MS_NODIRATIME),
        (FsFlags::ST_RELATIME, MsFlags::MS_RELATIME),
    ] {
        if f.contains(fs_flag) {
            out |= ms_flag;
        }
    }
    Ok(out)
}

/// Binds the host's `/usr`, and each top-level alias that is a directory
/// rather than a link into it, on the prepared root's mount points.
fn mirror_usr(root: &Path) -> Result<()> {
    bind_readonly(Path::new("/usr"), &root.join("usr"), MsFlags::MS_NODEV)?;
    for name in USR_ALIASES {
        let target = root.join(name);
        if fs::symlink_metadata(&target).is_ok_and(|m| m.is_dir()) {
            bind_readonly(&Path::new("/").join(name), &target, MsFlags::MS_NODEV)?;
        }
    }
    Ok(())
}

/// Files written into the sandbox's `/etc` (no host identity; the resolver
/// is the agent's per-sandbox DNS proxy).
const GENERATED_ETC: [(&str, &str); 6] = [
    ("passwd", "root:x:0:0:root:/root:/usr/sbin/nologin\nsandbox:x:1000:1000:sandbox:/home/sandbox:/bin/bash\nnobody:x:65534:65534:nobody:/nonexistent:/usr/sbin/nologin\n"),
    ("group", "root:x:0:\nsandbox:x:1000:\nnogroup:x:65534:\n"),
    ("hostname", "sandbox\n"),
    ("hosts", warren_core::network::SANDBOX_HOSTS),
    ("resolv.conf", warren_core::network::SANDBOX_RESOLV_CONF),
    ("nsswitch.conf", "passwd: files\ngroup: files\nshadow: files\nhosts: files dns\nnetworks: files\nprotocols: files\nservices: files\n"),
];

/// Builds the sandboxes' `/etc` once, on the host, in the prepared host
/// root: the generated files plus copies of the safe subset of the host's
/// `/etc` (none of it mounted per sandbox). Called by the agent at start;
/// host `/etc` changes (certificates) are picked up at the next start.
pub fn prepare_etc(dir: &Path) -> io::Result<()> {
    if dir.exists() {
        fs::remove_dir_all(dir)?;
    }
    make_dir(dir, 0o755)?;
    for (name, content) in GENERATED_ETC {
        let path = dir.join(name);
        fs::write(&path, content)?;
        fs::set_permissions(&path, fs::Permissions::from_mode(0o644))?;
    }
    for rel in ETC_BINDS {
        let host = Path::new("/etc").join(rel);
        if fs::symlink_metadata(&host).is_ok() {
            copy_tree(&host, &dir.join(rel))?;
        }
    }
    Ok(())
}

/// Copies `src` to `dst`: symlinks as symlinks, directories recursively,
/// files with at most 0755 permissions (no set-id bits). Missing parents of
/// `dst` are created 0755.
fn copy_tree(src: &Path, dst: &Path) -> io::Result<()> {
    if let Some(parent) = dst.parent() {
        fs::DirBuilder::new().recursive(true).mode(0o755).create(parent)?;
    }
    let meta = fs::symlink_metadata(src)?;
    if meta.file_type().is_symlink() {
        symlink(fs::read_link(src)?, dst)
    } else if meta.is_dir() {
        make_dir(dst, 0o755)?;
        for entry in fs::read_dir(src)? {
            let entry = entry?;
            copy_tree(&entry.path(), &dst.join(entry.file_name()))?;
        }
        Ok(())
    } else if meta.is_file() {
        fs::copy(src, dst)?;
        // Keep the source's mtime: Python validates its cached bytecode
        // (e.g. of /etc/python3.11/sitecustomize.py) by source mtime and
        // would otherwise recompile it at every start.
        let copy = fs::File::options().write(true).open(dst)?;
        copy.set_times(fs::FileTimes::new().set_modified(meta.modified()?).set_accessed(meta.accessed()?))?;
        fs::set_permissions(dst, fs::Permissions::from_mode(meta.permissions().mode() & 0o755))
    } else {
        Ok(()) // sockets, fifos, devices: never shown
    }
}

fn mount_proc(root: &Path) -> Result<()> {
    let proc_dir = root.join("proc");
    mkdir(&proc_dir, 0o555)?;
    let flags = MsFlags::MS_NOSUID | MsFlags::MS_NODEV | MsFlags::MS_NOEXEC;
    mount(Some("proc"), &proc_dir, Some("proc"), flags, None::<&str>).map_err(nix_io).map_err(ctx("mount proc", &proc_dir))?;
    // What this kernel's procfs lacks is skipped: each mount fails on its
    // own when its target is missing (no probe of each path first).
    for name in PROC_MASKED_FILES {
        let path = proc_dir.join(name);
        match mount(Some("/dev/null"), &path, None::<&str>, MsFlags::MS_BIND, None::<&str>) {
            Ok(()) | Err(nix::errno::Errno::ENOENT) => {}
            Err(e) => return Err(ctx("mask", &path)(nix_io(e))),
        }
    }
    // One empty read-only tmpfs hides every masked directory: the first
    // present gets it, the others a bind of it (a superblock made and torn
    // down per directory cost more than the bind).
    let mut empty: Option<PathBuf> = None;
    for name in PROC_MASKED_DIRS {
        let path = proc_dir.join(name);
        let masked = match &empty {
            None => mount(Some("tmpfs"), &path, Some("tmpfs"), MsFlags::MS_NOSUID | MsFlags::MS_NODEV | MsFlags::MS_RDONLY, Some("size=0,mode=555")),
            Some(first) => mount(Some(first), &path, None::<&str>, MsFlags::MS_BIND, None::<&str>),
        };
        match masked {
            Ok(()) => {
                empty.get_or_insert(path);
            }
            Err(nix::errno::Errno::ENOENT | nix::errno::Errno::ENOTDIR) => {}
            Err(e) => return Err(ctx("mask", &path)(nix_io(e))),
        }
    }
    // The proc mount is new on a private root, so it and binds of it are
    // private already: each directory is a bind and a read-only remount.
    for name in PROC_READONLY_DIRS {
        let path = proc_dir.join(name);
        match mount(Some(&path), &path, None::<&str>, MsFlags::MS_BIND, None::<&str>) {
            Ok(()) => {}
            Err(nix::errno::Errno::ENOENT | nix::errno::Errno::ENOTDIR) => continue,
            Err(e) => return Err(ctx("bind", &path)(nix_io(e))),
        }
        let flags = MsFlags::MS_BIND | MsFlags::MS_REMOUNT | MsFlags::MS_RDONLY | MsFlags::MS_NOSUID | MsFlags::MS_NODEV | MsFlags::MS_NOEXEC;
        mount(None::<&str>, &path, None::<&str>, flags | locked_flags(&path)?, None::<&str>).map_err(nix_io).map_err(ctx("remount ro", &path))?;
    }
    Ok(())
}

/// `/dev`: on the prepared host root its entries are there already
/// ([`dev_entries`], read-only with the root); an image's gets a tmpfs of
/// them, read-only once made. The devices are bound on their entries.
fn populate_dev(root: &Path, prepared: bool) -> Result<()> {
    let dev = root.join("dev");
    if !prepared {
        mkdir(&dev, 0o755)?;
        tmpfs(&dev, "size=64k,nr_inodes=64,mode=0755", MsFlags::MS_NOEXEC)?;
        dev_entries(&dev).map_err(ctx("populate", &dev))?;
    }
    for name in DEVICES {
        let target = dev.join(name);
        let host = Path::new("/dev").join(name);
        // A bind of the node as the host's /dev has it, never remounted:
        // nodev would make the device unusable, and nosuid or noexec mean
        // nothing for a device node (only a regular file is executed), so a
        // remount per device (a fifth of /dev's mount work) bought nothing.
        mount(Some(&host), &target, None::<&str>, MsFlags::MS_BIND, None::<&str>).map_err(nix_io).map_err(ctx("bind", &target))?;
    }
    tmpfs(&dev.join("shm"), "size=64m,nr_inodes=4096,mode=1777", MsFlags::MS_NOEXEC)?;
    if prepared {
        return Ok(());
    }
    let flags = MsFlags::MS_REMOUNT | MsFlags::MS_RDONLY | MsFlags::MS_NOSUID | MsFlags::MS_NODEV | MsFlags::MS_NOEXEC;
    mount(None::<&str>, &dev, None::<&str>, flags, Some("size=64k,nr_inodes=64,mode=0755"))
        .map_err(nix_io)
        .map_err(ctx("remount ro", &dev))
}

fn pivot(root: &Path) -> Result<()> {
    std::env::set_current_dir(root).map_err(ctx("chdir", root))?;
    let dot = CString::new(".").expect("no NUL");
    // pivot_root(".", ".") stacks the old root on top of the new one; the lazy
    // unmount then drops every host mount from this namespace.
    sys::pivot_root(&dot, &dot).map_err(ctx("pivot_root", root))?;
    umount2(".", MntFlags::MNT_DETACH).map_err(nix_io).map_err(ctx("umount old root", root))?;
    std::env::set_current_dir("/").map_err(ctx("chdir", Path::new("/")))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_prepared_host_root_has_every_mount_point_and_link_and_is_rebuilt_from_scratch() {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path().join("hostroot");
        prepare_host_root(&root).unwrap();
        let mode = |rel: &str| fs::symlink_metadata(root.join(rel)).unwrap().permissions().mode() & 0o7777;
        for rel in ["usr", "run/warren", "sys", "home", "data", "dev/pts"] {
            assert_eq!(mode(rel), 0o755, "{rel}");
        }
        assert_eq!(mode("proc"), 0o555);
        assert_eq!(mode("dev/shm"), 0o1777);
        for w in WRITABLE {
            assert_eq!(mode(w.path), w.mode, "{}", w.path);
        }
        for name in DEVICES {
            assert!(root.join("dev").join(name).is_file(), "{name}: a mount point for the device");
        }
        assert_eq!(fs::read_link(root.join("dev/ptmx")).unwrap(), Path::new("pts/ptmx"));
        assert_eq!(fs::read_link(root.join("var/run")).unwrap(), Path::new("/run"));
        assert!(fs::read_to_string(root.join("etc/passwd")).unwrap().contains("sandbox:x:1000:1000"));
        for name in USR_ALIASES {
            let (host, here) = (fs::symlink_metadata(Path::new("/").join(name)), fs::symlink_metadata(root.join(name)));
            match host {
                Ok(h) if h.file_type().is_symlink() => assert_eq!(fs::read_link(root.join(name)).unwrap(), fs::read_link(Path::new("/").join(name)).unwrap()),
                Ok(h) if h.is_dir() => assert!(here.unwrap().is_dir(), "{name}: a mount point"),
                _ => assert!(here.is_err(), "{name}: absent on the host, absent here"),
            }
        }
        fs::write(root.join("stale"), "x").unwrap();
        prepare_host_root(&root).unwrap();
        assert!(!root.join("stale").exists());
    }

    #[test]
    fn prepared_etc_holds_generated_files_and_faithful_copies() {
        let dir = tempfile::tempdir().unwrap();
        let etc = dir.path().join("etc");
        prepare_etc(&etc).unwrap();
        assert!(fs::read_to_string(etc.join("passwd")).unwrap().contains("sandbox:x:1000:1000"));
        assert_eq!(fs::read_to_string(etc.join("resolv.conf")).unwrap(), warren_core::network::SANDBOX_RESOLV_CONF);
        assert!(!etc.join("shadow").exists() && !etc.join("machine-id").exists());
        for rel in ETC_BINDS {
            let host = Path::new("/etc").join(rel);
            let Ok(meta) = fs::symlink_metadata(&host) else { continue };
            let copy = fs::symlink_metadata(etc.join(rel)).unwrap();
            assert_eq!(copy.file_type().is_symlink(), meta.file_type().is_symlink(), "{rel}");
            if meta.is_file() {
                // Same mtime: interpreters validate caches by it (Python's .pyc).
                assert_eq!(copy.modified().unwrap(), meta.modified().unwrap(), "{rel}");
                assert_eq!(copy.permissions().mode() & 0o7000, 0, "{rel}: no set-id bits");
            }
        }
        let nested = Path::new("/etc/python3.11/sitecustomize.py");
        if let Ok(meta) = fs::metadata(nested) {
            let copy = fs::metadata(etc.join("python3.11/sitecustomize.py")).unwrap();
            assert_eq!(copy.modified().unwrap(), meta.modified().unwrap(), "nested files keep their mtime too");
        }
        // Rebuilt from scratch each time (a stale entry never survives).
        fs::write(etc.join("stale"), "x").unwrap();
        prepare_etc(&etc).unwrap();
        assert!(!etc.join("stale").exists());
    }
}
