//! File operations confined to a directory tree: every path is resolved by
//! the kernel with `RESOLVE_BENEATH | RESOLVE_NO_SYMLINKS`, and every final
//! component is created with `O_EXCL`/`O_NOFOLLOW`, so nothing a hostile
//! layer planted earlier (a symlink, a hard link) redirects a write.

use std::fs::File;
use std::io::{self, Read};
use std::os::fd::{AsFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::path::Path;

use rustix::fs::{self as rfs, AtFlags, FileType, Mode, OFlags, ResolveFlags, Timespec, Timestamps};
use rustix::io::Errno;

use crate::path::RelPath;

const CONFINED: ResolveFlags = ResolveFlags::BENEATH
    .union(ResolveFlags::NO_SYMLINKS)
    .union(ResolveFlags::NO_MAGICLINKS)
    .union(ResolveFlags::NO_XDEV);
const DIR_FLAGS: OFlags = OFlags::RDONLY.union(OFlags::DIRECTORY).union(OFlags::NOFOLLOW).union(OFlags::CLOEXEC);

/// An open directory that operations stay beneath.
pub struct Dir {
    fd: OwnedFd,
}

fn errno(e: Errno) -> io::Error {
    io::Error::from(e)
}

fn times(mtime: u64) -> Timestamps {
    let t = Timespec { tv_sec: mtime.min(i64::MAX as u64) as i64, tv_nsec: 0 };
    Timestamps { last_access: t, last_modification: t }
}

fn ids(uid: u32, gid: u32) -> (Option<rfs::Uid>, Option<rfs::Gid>) {
    (Some(rfs::Uid::from_raw(uid)), Some(rfs::Gid::from_raw(gid)))
}

impl Dir {
    /// Opens `path` (trusted: the store's own directory).
    pub fn open(path: &Path) -> io::Result<Dir> {
        let fd = rfs::open(path, DIR_FLAGS, Mode::empty()).map_err(errno)?;
        Ok(Dir { fd })
    }

    /// The directory at `rel` below this one, created (0755, root) where
    /// missing when `create`. A symlink or file on the way is an error
    /// (`ELOOP`, `ENOTDIR`), never followed.
    pub fn dir(&self, rel: &RelPath, create: bool) -> io::Result<Dir> {
        let joined = rel.joined();
        match rfs::openat2(&self.fd, joined.as_slice(), DIR_FLAGS, Mode::empty(), CONFINED) {
            Ok(fd) => return Ok(Dir { fd }),
            Err(Errno::NOENT) if create => {}
            Err(e) => return Err(errno(e)),
        }
        let mut cur = Dir { fd: rfs::openat2(&self.fd, ".", DIR_FLAGS, Mode::empty(), CONFINED).map_err(errno)? };
        for part in rel.components() {
            match rfs::mkdirat(&cur.fd, part, Mode::from_raw_mode(0o755)) {
                Ok(()) | Err(Errno::EXIST) => {}
                Err(e) => return Err(errno(e)),
            }
            let fd = rfs::openat2(&cur.fd, part, DIR_FLAGS, Mode::empty(), CONFINED).map_err(errno)?;
            cur = Dir { fd };
        }
        Ok(cur)
    }

    /// Removes `name` (a file, link, or empty directory) if present.
    fn remove(&self, name: &std::ffi::OsStr) -> io::Result<()> {
        let st = match rfs::statat(&self.fd, name, AtFlags::SYMLINK_NOFOLLOW) {
            Ok(st) => st,
            Err(Errno::NOENT) => return Ok(()),
            Err(e) => return Err(errno(e)),
        };
        let flags = match FileType::from_raw_mode(st.st_mode) {
            FileType::Directory => AtFlags::REMOVEDIR,
            _ => AtFlags::empty(),
        };
        rfs::unlinkat(&self.fd, name, flags).map_err(errno)
    }

    /// Creates (or keeps) directory `name` with these attributes.
    pub fn make_dir(&self, name: &std::ffi::OsStr, perm: Mode, uid: u32, gid: u32) -> io::Result<()> {
        match rfs::mkdirat(&self.fd, name, Mode::from_raw_mode(0o700)) {
            Ok(()) => {}
            Err(Errno::EXIST) => {
                let st = rfs::statat(&self.fd, name, AtFlags::SYMLINK_NOFOLLOW).map_err(errno)?;
                if FileType::from_raw_mode(st.st_mode) != FileType::Directory {
                    self.remove(name)?;
                    rfs::mkdirat(&self.fd, name, Mode::from_raw_mode(0o700)).map_err(errno)?;
                }
            }
            Err(e) => return Err(errno(e)),
        }
        let fd = rfs::openat(&self.fd, name, DIR_FLAGS, Mode::empty()).map_err(errno)?;
        let (u, g) = ids(uid, gid);
        rfs::fchown(&fd, u, g).map_err(errno)?;
        rfs::fchmod(&fd, perm).map_err(errno)
    }

    /// Writes regular file `name` from `data`, replacing what was there.
    pub fn write_file(&self, name: &std::ffi::OsStr, data: &mut impl Read, perm: Mode, uid: u32, gid: u32, mtime: u64) -> io::Result<()> {
        let flags = OFlags::WRONLY | OFlags::CREATE | OFlags::EXCL | OFlags::NOFOLLOW | OFlags::CLOEXEC;
        let fd = match rfs::openat(&self.fd, name, flags, Mode::from_raw_mode(0o600)) {
            Err(Errno::EXIST) => {
                self.remove(name)?;
                rfs::openat(&self.fd, name, flags, Mode::from_raw_mode(0o600))
            }
            other => other,
        }
        .map_err(errno)?;
        let mut file = File::from(fd);
        io::copy(data, &mut file)?;
        let (u, g) = ids(uid, gid);
        // chown before chmod: chown clears set-id bits (none are set anyway).
        rfs::fchown(&file, u, g).map_err(errno)?;
        rfs::fchmod(&file, perm).map_err(errno)?;
        rfs::futimens(&file, &times(mtime)).map_err(errno)
    }

    /// Creates symlink `name` → `target` (stored, never followed here).
    pub fn symlink(&self, name: &std::ffi::OsStr, target: &[u8], uid: u32, gid: u32, mtime: u64) -> io::Result<()> {
        self.remove(name)?;
        rfs::symlinkat(std::ffi::OsStr::from_bytes(target), &self.fd, name).map_err(errno)?;
        let (u, g) = ids(uid, gid);
        rfs::chownat(&self.fd, name, u, g, AtFlags::SYMLINK_NOFOLLOW).map_err(errno)?;
        rfs::utimensat(&self.fd, name, &times(mtime), AtFlags::SYMLINK_NOFOLLOW).map_err(errno)
    }

    /// Hides `name` of lower layers: an overlayfs whiteout (0/0 char device).
    pub fn whiteout(&self, name: &std::ffi::OsStr) -> io::Result<()> {
        self.remove(name)?;
        let (kind, dev) = crate::layer::WHITEOUT;
        rfs::mknodat(&self.fd, name, kind, Mode::empty(), dev).map_err(errno)
    }

    /// Hides everything lower layers have in this directory.
    pub fn set_opaque(&self) -> io::Result<()> {
        rfs::fsetxattr(&self.fd, "trusted.overlay.opaque", b"y", rfs::XattrFlags::empty()).map_err(errno)
    }

    /// Hard-links the regular file at `target` (below this directory) as
    /// `name` in `dir`. A target that is missing here — a file of another
    /// layer or outside the store — is `NotFound`; one that is not a regular
    /// file is `InvalidInput`.
    pub fn hard_link(&self, target: &RelPath, dir: &Dir, name: &std::ffi::OsStr) -> io::Result<()> {
        let flags = OFlags::PATH | OFlags::NOFOLLOW | OFlags::CLOEXEC;
        let fd = rfs::openat2(&self.fd, target.joined().as_slice(), flags, Mode::empty(), CONFINED).map_err(errno)?;
        let st = rfs::fstat(&fd).map_err(errno)?;
        if FileType::from_raw_mode(st.st_mode) != FileType::RegularFile {
            return Err(io::Error::new(io::ErrorKind::InvalidInput, "hard link target is not a regular file"));
        }
        dir.remove(name)?;
        rfs::linkat(&fd, "", &dir.fd, name, AtFlags::EMPTY_PATH).map_err(errno)
    }
}

impl AsFd for Dir {
    fn as_fd(&self) -> std::os::fd::BorrowedFd<'_> {
        self.fd.as_fd()
    }
}
