//! An image's root: a read-only overlayfs of its layers under a small Warren
//! layer ("top") that holds the mount points of Warren's zones and the
//! sandbox's identity files. Mounted once per image on the node; each
//! sandbox binds it as `/`.

use std::ffi::CString;
use std::fs;
use std::io::{self, Read};
use std::os::unix::fs::{DirBuilderExt, PermissionsExt};
use std::path::{Path, PathBuf};

use rustix::fs::{Mode, OFlags, ResolveFlags};
use rustix::mount::{MountFlags, UnmountFlags};

/// Page-sized limit of mount options; each layer costs its path length.
const MAX_MOUNT_OPTIONS: usize = 4000;
/// Largest `/etc/passwd` or `/etc/group` read from an image.
const MAX_ID_FILE: u64 = 256 << 10;
/// The sandbox user (see `warren_isolation::sandbox::rootfs::SANDBOX_UID`).
const SANDBOX_ID: u32 = 1000;

/// Directories Warren mounts its zones on, with their modes.
const ZONES: &[(&str, u32)] = &[("proc", 0o555), ("dev", 0o755), ("tmp", 0o1777), ("home", 0o755), ("data", 0o755), ("run", 0o755), ("run/warren", 0o755), ("etc", 0o755), ("sys", 0o555)];

/// Mounts the read-only overlay of `lowers` (topmost first) on `target`.
pub fn mount_overlay(lowers: &[PathBuf], target: &Path) -> io::Result<()> {
    let mut opts = String::from("lowerdir=");
    for (i, dir) in lowers.iter().enumerate() {
        let s = dir.to_str().ok_or_else(|| io::Error::other("non-UTF-8 layer path"))?;
        if s.contains([':', ',', '\\']) {
            return Err(io::Error::other(format!("layer path {s} has a character overlayfs options cannot carry")));
        }
        if i > 0 {
            opts.push(':');
        }
        opts.push_str(s);
    }
    if opts.len() > MAX_MOUNT_OPTIONS {
        return Err(io::Error::other(format!("{} layers are more than one overlay mount can stack here", lowers.len() - 1)));
    }
    let data = CString::new(opts).map_err(io::Error::other)?;
    let flags = MountFlags::RDONLY | MountFlags::NOSUID | MountFlags::NODEV;
    rustix::mount::mount("overlay", target, "overlay", flags, data.as_c_str()).map_err(io::Error::from)
}

/// Detaches whatever is mounted on `target` (nothing mounted is fine).
pub fn unmount(target: &Path) -> io::Result<()> {
    match rustix::mount::unmount(target, UnmountFlags::DETACH) {
        Ok(()) | Err(rustix::io::Errno::INVAL) | Err(rustix::io::Errno::NOENT) => Ok(()),
        Err(e) => Err(e.into()),
    }
}

/// Reads `rel` inside the image mounted at `root`, resolving symlinks as
/// the sandbox would (within the root), at most `limit` bytes; `None` if
/// missing.
pub fn read_in_root(root: &Path, rel: &str, limit: u64) -> io::Result<Option<Vec<u8>>> {
    let dir = rustix::fs::open(root, OFlags::RDONLY | OFlags::DIRECTORY | OFlags::CLOEXEC, Mode::empty())?;
    let how = ResolveFlags::IN_ROOT | ResolveFlags::NO_MAGICLINKS | ResolveFlags::NO_XDEV;
    let fd = match rustix::fs::openat2(&dir, rel, OFlags::RDONLY | OFlags::CLOEXEC | OFlags::NONBLOCK, Mode::empty(), how) {
        Ok(fd) => fd,
        Err(rustix::io::Errno::NOENT) | Err(rustix::io::Errno::NOTDIR) | Err(rustix::io::Errno::LOOP) => return Ok(None),
        Err(e) => return Err(e.into()),
    };
    let file = fs::File::from(fd);
    if !file.metadata()?.is_file() {
        return Ok(None);
    }
    let mut out = Vec::new();
    file.take(limit).read_to_end(&mut out)?;
    Ok(Some(out))
}

/// Whether `rel` inside the image at `root` is an executable regular file
/// (symlinks resolved within the root).
pub fn is_executable_in_root(root: &Path, rel: &str) -> bool {
    let Ok(dir) = rustix::fs::open(root, OFlags::PATH | OFlags::DIRECTORY | OFlags::CLOEXEC, Mode::empty()) else { return false };
    let how = ResolveFlags::IN_ROOT | ResolveFlags::NO_MAGICLINKS | ResolveFlags::NO_XDEV;
    let Ok(fd) = rustix::fs::openat2(&dir, rel, OFlags::PATH | OFlags::CLOEXEC, Mode::empty(), how) else { return false };
    rustix::fs::fstat(&fd).is_ok_and(|st| rustix::fs::FileType::from_raw_mode(st.st_mode).is_file() && st.st_mode & 0o111 != 0)
}

/// Fills the Warren layer `top` (an empty directory): zone mount points and
/// `/etc` identity files. `base` is the image mounted without it, read for
/// its users and groups (kept, minus anything claiming the sandbox's id).
pub fn build_top(top: &Path, base: &Path) -> io::Result<()> {
    for (dir, mode) in ZONES {
        let path = top.join(dir);
        fs::DirBuilder::new().recursive(true).mode(*mode).create(&path)?;
        fs::set_permissions(&path, fs::Permissions::from_mode(*mode))?;
    }
    writable_mount_points(top, base)?;
    let (workspace, home) = warren_core::layout::WORKSPACE;
    if fs::symlink_metadata(base.join(workspace)).is_err() {
        std::os::unix::fs::symlink(home, top.join(workspace))?;
    }
    let passwd = read_in_root(base, "etc/passwd", MAX_ID_FILE)?.unwrap_or_default();
    let group = read_in_root(base, "etc/group", MAX_ID_FILE)?.unwrap_or_default();
    let files = [
        ("passwd", merge_ids(&passwd, 7, "sandbox:x:1000:1000:sandbox:/home/sandbox:/bin/bash")),
        ("group", merge_ids(&group, 4, "sandbox:x:1000:")),
        ("hostname", "sandbox\n".to_string()),
        ("hosts", warren_core::network::SANDBOX_HOSTS.to_string()),
        ("resolv.conf", warren_core::network::SANDBOX_RESOLV_CONF.to_string()),
    ];
    for (name, content) in files {
        let path = top.join("etc").join(name);
        fs::write(&path, content)?;
        fs::set_permissions(&path, fs::Permissions::from_mode(0o644))?;
    }
    Ok(())
}

/// Mount points for the places a program may write (`/var/tmp`,
/// `/var/cache`, …; see [`warren_core::layout`]) that the image lacks. A
/// path whose parent the image has as anything but a directory (a
/// symlinked `/var`) is left as the image has it: a directory in the top
/// layer would hide it.
fn writable_mount_points(top: &Path, base: &Path) -> io::Result<()> {
    for w in warren_core::layout::WRITABLE {
        let mut at = base.to_path_buf();
        let mut missing = false;
        let clear = w.path.split('/').all(|part| {
            at.push(part);
            match fs::symlink_metadata(&at) {
                Ok(m) => m.is_dir() && !missing,
                Err(_) => {
                    missing = true;
                    true
                }
            }
        });
        if clear && missing {
            let path = top.join(w.path);
            fs::DirBuilder::new().recursive(true).mode(0o755).create(&path)?;
            fs::set_permissions(&path, fs::Permissions::from_mode(w.mode))?;
        }
    }
    Ok(())
}

/// The image's `passwd`/`group` lines that are well-formed (`fields`
/// colon-separated fields in all) and do not claim the sandbox's name or id, then
/// the sandbox's own line.
fn merge_ids(existing: &[u8], fields: usize, own: &str) -> String {
    let text = String::from_utf8_lossy(existing);
    let mut out = String::new();
    for line in text.lines() {
        let parts: Vec<&str> = line.split(':').collect();
        if parts.len() != fields {
            continue;
        }
        if parts[0] == "sandbox" || parts[2].parse::<u32>().map_or(true, |id| id == SANDBOX_ID) || line.chars().any(char::is_control) {
            continue;
        }
        out.push_str(line);
        out.push('\n');
    }
    out.push_str(own);
    out.push('\n');
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ids_merge_keeps_image_users_and_claims_1000() {
        let passwd = b"root:x:0:0:root:/root:/bin/bash\nnode:x:1000:1000::/home/node:/bin/sh\nbroken line\nsandbox:x:5:5::/:/bin/sh\napp:x:999:999::/app:/bin/sh\n";
        assert_eq!(
            merge_ids(passwd, 7, "sandbox:x:1000:1000:sandbox:/home/sandbox:/bin/bash"),
            "root:x:0:0:root:/root:/bin/bash\napp:x:999:999::/app:/bin/sh\nsandbox:x:1000:1000:sandbox:/home/sandbox:/bin/bash\n"
        );
        assert_eq!(merge_ids(b"root:x:0:\nnode:x:1000:\nstaff:x:50:a,b\n", 4, "sandbox:x:1000:"), "root:x:0:\nstaff:x:50:a,b\nsandbox:x:1000:\n");
    }
}
