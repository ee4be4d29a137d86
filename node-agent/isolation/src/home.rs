//! A thread's home, mounted by the agent on the host side just before the
//! program starts. It reaches the sandbox through mount propagation: the
//! sandbox's `/home` is a slave bind of `<home_dir>`, so an overlay the agent
//! mounts on `<home_dir>/sandbox` appears at `/home/sandbox` inside.
//!
//! ```text
//! <work>/            tmpfs, size = the home's limit (holds this call's diff)
//! ├── upper/         overlay upper layer: what the program wrote, deleted (whiteouts), replaced (opaque dirs)
//! ├── work/          overlay work dir
//! └── lower/         id-mapped bind of the thread's saved state
//! <home_dir>/sandbox overlay(lower, upper)  → the program's /home/sandbox
//! ```
//!
//! The saved state is owned by the canonical ids (0 and 1000). The id-mapped
//! bind shows it through the sandbox's own user namespace, so files appear
//! owned by the sandbox's uid 1000 whatever host uid slot this call got,
//! without touching a single inode. Files the program writes land in the
//! upper layer owned by the slot's host ids; the agent maps them back to the
//! canonical ids when it saves the diff.

use std::ffi::CString;
use std::fs;
use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::{DirBuilderExt, PermissionsExt};
use std::path::{Path, PathBuf};

use nix::mount::{mount, umount2, MntFlags, MsFlags};

/// What to mount.
#[derive(Debug, Clone)]
pub struct ThreadHomeSpec<'a> {
    /// The thread's saved state (canonical owners), read-only lower layer.
    pub state: &'a Path,
    /// Empty scratch directory for this call (upper layer, work dir).
    pub work: &'a Path,
    /// Mount point: `<home_dir>/sandbox` of the sandbox that will run.
    pub target: &'a Path,
    /// The sandbox's user namespace (`/proc/<init>/ns/user`), which maps the ids.
    pub userns: &'a OwnedFd,
    /// Host uid (and gid) of the sandbox's uid 1000.
    pub owner: u32,
    /// Largest diff one call may write.
    pub bytes: u64,
}

/// A mounted thread home; unmounted (lazily, best effort) on drop.
#[derive(Debug)]
pub struct ThreadHome {
    work: PathBuf,
    target: PathBuf,
    view_mounted: bool,
    work_mounted: bool,
}

fn cstr(p: &Path) -> io::Result<CString> {
    CString::new(p.as_os_str().as_bytes()).map_err(|_| io::Error::new(io::ErrorKind::InvalidInput, "path holds NUL"))
}

fn check(ret: libc::c_long) -> io::Result<libc::c_long> {
    if ret < 0 { Err(io::Error::last_os_error()) } else { Ok(ret) }
}

fn step<'a>(what: &'static str, path: &'a Path) -> impl FnOnce(io::Error) -> io::Error + 'a {
    move |e| io::Error::new(e.kind(), format!("{what} {}: {e}", path.display()))
}

/// `struct mount_attr` of `mount_setattr(2)`.
#[repr(C)]
struct MountAttr {
    attr_set: u64,
    attr_clr: u64,
    propagation: u64,
    userns_fd: u64,
}

const MOUNT_ATTR_IDMAP: u64 = 0x0010_0000;
const MOVE_MOUNT_F_EMPTY_PATH: libc::c_uint = 0x0000_0004;

/// Binds `src` on `dst` with every id shown through `userns`.
fn bind_idmapped(src: &Path, dst: &Path, userns: &OwnedFd) -> io::Result<()> {
    let src_c = cstr(src)?;
    let flags = (libc::OPEN_TREE_CLONE | libc::OPEN_TREE_CLOEXEC) as libc::c_uint;
    // SAFETY: open_tree with a valid NUL-terminated path returns a new
    // descriptor (a detached copy of the mount) that we own from here on.
    let tree = unsafe { OwnedFd::from_raw_fd(check(libc::syscall(libc::SYS_open_tree, libc::AT_FDCWD, src_c.as_ptr(), flags))? as i32) };
    let attr = MountAttr { attr_set: MOUNT_ATTR_IDMAP, attr_clr: 0, propagation: 0, userns_fd: userns.as_raw_fd() as u64 };
    let empty = c"";
    // SAFETY: `attr` is a properly laid out struct mount_attr that outlives
    // the call, `tree` is a valid mount descriptor and the path is empty.
    check(unsafe {
        libc::syscall(
            libc::SYS_mount_setattr,
            tree.as_raw_fd(),
            empty.as_ptr(),
            libc::AT_EMPTY_PATH as libc::c_uint,
            &attr as *const MountAttr,
            std::mem::size_of::<MountAttr>(),
        )
    })?;
    let dst_c = cstr(dst)?;
    // SAFETY: attaches the detached mount `tree` at `dst`; both strings are
    // valid and outlive the call.
    check(unsafe { libc::syscall(libc::SYS_move_mount, tree.as_raw_fd(), empty.as_ptr(), libc::AT_FDCWD, dst_c.as_ptr(), MOVE_MOUNT_F_EMPTY_PATH) })?;
    Ok(())
}

fn mkdir(path: &Path, mode: u32) -> io::Result<()> {
    fs::DirBuilder::new().mode(mode).create(path).map_err(step("mkdir", path))?;
    fs::set_permissions(path, fs::Permissions::from_mode(mode))
}

impl ThreadHome {
    /// Mounts the thread's home for one call.
    pub fn mount(spec: &ThreadHomeSpec<'_>) -> io::Result<ThreadHome> {
        let mut home = ThreadHome { work: spec.work.to_path_buf(), target: spec.target.to_path_buf(), view_mounted: false, work_mounted: false };
        let opts = format!("size={},nr_inodes=262144,mode=0700", spec.bytes);
        let nosuid = MsFlags::MS_NOSUID | MsFlags::MS_NODEV;
        mount(Some("tmpfs"), spec.work, Some("tmpfs"), nosuid, Some(opts.as_str())).map_err(io::Error::from).map_err(step("mount tmpfs", spec.work))?;
        home.work_mounted = true;
        let (upper, work, lower) = (spec.work.join("upper"), spec.work.join("work"), spec.work.join("lower"));
        mkdir(&upper, 0o700)?;
        std::os::unix::fs::chown(&upper, Some(spec.owner), Some(spec.owner))?;
        mkdir(&work, 0o700)?;
        mkdir(&lower, 0o700)?;
        bind_idmapped(spec.state, &lower, spec.userns).map_err(step("id-mapped bind of", spec.state))?;
        // redirect_dir/metacopy/index off: the upper layer then holds only
        // plain files, whiteouts and opaque markers, which is what the saved
        // diff format can express (a renamed lower directory is copied).
        let ovl = format!(
            "lowerdir={},upperdir={},workdir={},redirect_dir=off,metacopy=off,index=off,xino=off",
            lower.display(),
            upper.display(),
            work.display()
        );
        let mounted = mount(Some("overlay"), spec.target, Some("overlay"), nosuid, Some(ovl.as_str()));
        // The overlay holds its own reference to the lower layer.
        let _ = umount2(&lower, MntFlags::MNT_DETACH);
        mounted.map_err(io::Error::from).map_err(step("mount overlay", spec.target))?;
        home.view_mounted = true;
        Ok(home)
    }

    /// The call's diff (valid until [`ThreadHome::release`]).
    pub fn upper(&self) -> PathBuf {
        self.work.join("upper")
    }

    /// Unmounts the overlay (every process of the sandbox is gone); the
    /// upper layer stays readable.
    pub fn unmount_view(&mut self) -> io::Result<()> {
        if std::mem::take(&mut self.view_mounted) {
            umount2(&self.target, MntFlags::MNT_DETACH).map_err(io::Error::from).map_err(step("umount", &self.target))?;
        }
        Ok(())
    }

    /// Unmounts everything.
    pub fn release(mut self) -> io::Result<()> {
        self.release_inner()
    }

    fn release_inner(&mut self) -> io::Result<()> {
        self.unmount_view()?;
        if std::mem::take(&mut self.work_mounted) {
            umount2(&self.work, MntFlags::MNT_DETACH).map_err(io::Error::from).map_err(step("umount", &self.work))?;
        }
        Ok(())
    }
}

impl Drop for ThreadHome {
    fn drop(&mut self) {
        let _ = self.release_inner();
    }
}

/// Mount points at or below `dir` (from `/proc/self/mountinfo`), deepest first.
pub(crate) fn mounts_below(dir: &Path) -> io::Result<Vec<PathBuf>> {
    let info = fs::read_to_string("/proc/self/mountinfo")?;
    let mut found: Vec<PathBuf> = info
        .lines()
        .filter_map(|l| l.split(' ').nth(4))
        .map(unescape_mountinfo)
        .filter(|p| p.starts_with(dir))
        .collect();
    found.sort_by_key(|p| std::cmp::Reverse(p.components().count()));
    found.dedup();
    Ok(found)
}

/// mountinfo escapes space, tab, newline and backslash as `\ooo`.
fn unescape_mountinfo(s: &str) -> PathBuf {
    let b = s.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        if b[i] == b'\\' && i + 3 < b.len() && b[i + 1..i + 4].iter().all(|c| (b'0'..=b'7').contains(c)) {
            out.push((b[i + 1] - b'0') * 64 + (b[i + 2] - b'0') * 8 + (b[i + 3] - b'0'));
            i += 4;
        } else {
            out.push(b[i]);
            i += 1;
        }
    }
    PathBuf::from(<std::ffi::OsString as std::os::unix::ffi::OsStringExt>::from_vec(out))
}

/// Lazily unmounts everything at or below `dir` (left by an agent that was
/// killed mid-call).
pub fn unmount_below(dir: &Path) -> io::Result<usize> {
    let mounts = mounts_below(dir)?;
    for m in &mounts {
        let _ = umount2(m, MntFlags::MNT_DETACH);
    }
    Ok(mounts.len())
}

/// Bytes and inodes of the sandboxes' homes directory: only mount points
/// and connectors' credential files live there.
const HOMES_TMPFS: &str = "mode=0711,size=64m,nr_inodes=262144";

/// Mounts a tmpfs of its own on `dir` and makes it shared, so mounts the
/// agent makes below it propagate to the sandboxes' slave copies. A tmpfs:
/// each sandbox makes and removes four directories there, which on the
/// state directory's disk filesystem cost more CPU than anything else the
/// agent does per call (ext4's inode allocator); credential files also
/// never touch a disk.
pub fn make_shared_tmpfs(dir: &Path) -> io::Result<()> {
    unmount_below(dir)?;
    let flags = MsFlags::MS_NOSUID | MsFlags::MS_NODEV;
    mount(Some("tmpfs"), dir, Some("tmpfs"), flags, Some(HOMES_TMPFS)).map_err(io::Error::from).map_err(step("mount tmpfs", dir))?;
    mount(None::<&str>, dir, None::<&str>, MsFlags::MS_SHARED, None::<&str>).map_err(io::Error::from).map_err(step("make-shared", dir))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn mountinfo_paths_are_unescaped() {
        assert_eq!(unescape_mountinfo(r"/var/lib/a\040b"), PathBuf::from("/var/lib/a b"));
        assert_eq!(unescape_mountinfo(r"/x\134y"), PathBuf::from(r"/x\y"));
        assert_eq!(unescape_mountinfo(r"/tail\04"), PathBuf::from(r"/tail\04"));
    }
}
