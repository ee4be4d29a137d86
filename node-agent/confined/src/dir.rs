//! A directory held by a descriptor, and operations that stay beneath it.
//!
//! A path below the directory is resolved by the kernel with
//! `RESOLVE_BENEATH | RESOLVE_NO_SYMLINKS | RESOLVE_NO_MAGICLINKS |
//! RESOLVE_NO_XDEV`: a `..`, an absolute path, a symlink anywhere on the way
//! or another file system is an error, also when the tree changes while it
//! is resolved (a directory renamed or replaced by a symlink meanwhile). An
//! operation on a final name never follows it (`O_NOFOLLOW`,
//! `AT_SYMLINK_NOFOLLOW`) and creates with `O_EXCL`, so nothing planted
//! earlier (a symlink, a hard link) redirects a write.

use std::ffi::{OsStr, OsString};
use std::fs::File;
use std::io::{self, Read};
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::path::Path;

use rustix::fs::{self as rfs, AtFlags, FileType, Mode, OFlags, ResolveFlags, Timespec, Timestamps};
use rustix::io::Errno;

use crate::path::{is_plain_name, is_plain_relative, RelPath};

const CONFINED: ResolveFlags = ResolveFlags::BENEATH.union(ResolveFlags::NO_SYMLINKS).union(ResolveFlags::NO_MAGICLINKS).union(ResolveFlags::NO_XDEV);
const DIR_FLAGS: OFlags = OFlags::RDONLY.union(OFlags::DIRECTORY).union(OFlags::NOFOLLOW).union(OFlags::CLOEXEC);

/// An open directory that operations stay beneath.
#[derive(Debug)]
pub struct Dir {
    fd: OwnedFd,
}

/// What is at a name, without following it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    /// A directory.
    Dir,
    /// A regular file.
    File,
    /// A symlink.
    Symlink,
    /// Devices, fifos, sockets.
    Other,
}

/// An entry's metadata, read without following it.
#[derive(Debug, Clone, Copy)]
pub struct Stat {
    /// Its kind.
    pub kind: Kind,
    /// Bytes (a symlink: its target's length).
    pub size: u64,
    /// Modification time, Unix seconds.
    pub mtime: i64,
}

fn errno(e: Errno) -> io::Error {
    io::Error::from(e)
}

fn invalid(msg: String) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidInput, msg)
}

fn times(mtime: u64) -> Timestamps {
    let t = Timespec { tv_sec: mtime.min(i64::MAX as u64) as i64, tv_nsec: 0 };
    Timestamps { last_access: t, last_modification: t }
}

fn ids(uid: u32, gid: u32) -> (Option<rfs::Uid>, Option<rfs::Gid>) {
    (Some(rfs::Uid::from_raw(uid)), Some(rfs::Gid::from_raw(gid)))
}

/// Errors meaning "there is no real directory of the tree at this path".
pub fn not_a_dir(e: &io::Error) -> bool {
    matches!(Errno::from_io_error(e), Some(Errno::NOENT | Errno::NOTDIR | Errno::LOOP | Errno::XDEV))
}

impl Stat {
    fn of(st: &rfs::Stat) -> Stat {
        let kind = match FileType::from_raw_mode(st.st_mode) {
            FileType::Directory => Kind::Dir,
            FileType::RegularFile => Kind::File,
            FileType::Symlink => Kind::Symlink,
            _ => Kind::Other,
        };
        Stat { kind, size: st.st_size.max(0) as u64, mtime: st.st_mtime }
    }
}

impl Dir {
    /// Opens `path` (trusted: a directory of the agent's own).
    pub fn open(path: &Path) -> io::Result<Dir> {
        Ok(Dir { fd: rfs::open(path, DIR_FLAGS, Mode::empty()).map_err(errno)? })
    }

    /// Another descriptor of the same directory.
    pub fn try_clone(&self) -> io::Result<Dir> {
        Ok(Dir { fd: self.fd.try_clone()? })
    }

    /// The directory at `rel` ("" is this one), reached without a symlink
    /// anywhere and without leaving the tree: an error when any component
    /// is not a real directory of the tree.
    pub fn dir(&self, rel: &Path) -> io::Result<Dir> {
        if rel.as_os_str().is_empty() {
            return self.try_clone();
        }
        if !is_plain_relative(rel) {
            return Err(invalid(format!("{} is not a plain relative path", rel.display())));
        }
        Ok(Dir { fd: rfs::openat2(&self.fd, rel, DIR_FLAGS, Mode::empty(), CONFINED).map_err(errno)? })
    }

    /// The directory at `rel`, made (0755, the creator's) where missing. A
    /// symlink or file on the way is an error (`ELOOP`, `ENOTDIR`), never
    /// followed.
    pub fn make_dirs(&self, rel: &RelPath) -> io::Result<Dir> {
        match rfs::openat2(&self.fd, rel.joined().as_slice(), DIR_FLAGS, Mode::empty(), CONFINED) {
            Ok(fd) => return Ok(Dir { fd }),
            Err(Errno::NOENT) => {}
            Err(e) => return Err(errno(e)),
        }
        let mut cur = self.try_clone()?;
        for part in rel.components() {
            match rfs::mkdirat(&cur.fd, part, Mode::from_raw_mode(0o755)) {
                Ok(()) | Err(Errno::EXIST) => {}
                Err(e) => return Err(errno(e)),
            }
            cur = Dir { fd: rfs::openat2(&cur.fd, part, DIR_FLAGS, Mode::empty(), CONFINED).map_err(errno)? };
        }
        Ok(cur)
    }

    /// The directory holding `rel` and `rel`'s last name.
    pub fn parent<'p>(&self, rel: &'p Path) -> io::Result<(Dir, &'p OsStr)> {
        let name = rel.file_name().filter(|n| is_plain_name(n)).ok_or_else(|| invalid(format!("{} has no plain last name", rel.display())))?;
        Ok((self.dir(rel.parent().unwrap_or(Path::new("")))?, name))
    }

    /// Whether something exists at `rel` reached as [`Dir::dir`] would (a
    /// final symlink counts as a refusal, `ELOOP`, not as followed).
    pub fn lookup(&self, rel: &Path) -> io::Result<()> {
        if !is_plain_relative(rel) {
            return Err(invalid(format!("{} is not a plain relative path", rel.display())));
        }
        // No O_NOFOLLOW: with it a final symlink would open as itself;
        // without it RESOLVE_NO_SYMLINKS refuses it (ELOOP).
        rfs::openat2(&self.fd, rel, OFlags::PATH | OFlags::CLOEXEC, Mode::empty(), CONFINED).map(drop).map_err(errno)
    }

    /// What is at `rel`; `None` when nothing is, or when a parent is not a
    /// real directory (so nothing the tree owns is there).
    pub fn stat_path(&self, rel: &Path) -> io::Result<Option<Stat>> {
        match self.parent(rel) {
            Ok((dir, name)) => dir.stat(name),
            Err(e) if not_a_dir(&e) => Ok(None),
            Err(e) => Err(e),
        }
    }

    /// Charged size of what is at `rel` (0 when nothing is, or when a
    /// parent is not a real directory): see [`Dir::charge`].
    pub fn charge_path(&self, rel: &Path, per_entry: u64) -> io::Result<u64> {
        match self.parent(rel) {
            Ok((dir, name)) => dir.charge(name, per_entry),
            Err(e) if not_a_dir(&e) => Ok(0),
            Err(e) => Err(e),
        }
    }

    /// Metadata of `name`, not following it; `None` when absent.
    pub fn stat(&self, name: &OsStr) -> io::Result<Option<Stat>> {
        match rfs::statat(&self.fd, name, AtFlags::SYMLINK_NOFOLLOW) {
            Ok(st) => Ok(Some(Stat::of(&st))),
            Err(Errno::NOENT) => Ok(None),
            Err(e) => Err(errno(e)),
        }
    }

    /// The directory `name` (not a symlink to one).
    pub fn open_dir(&self, name: &OsStr) -> io::Result<Dir> {
        Ok(Dir { fd: rfs::openat(&self.fd, name, DIR_FLAGS, Mode::empty()).map_err(errno)? })
    }

    /// The regular file `name`, for reading (not a symlink to one, and
    /// `O_NONBLOCK` keeps a fifo from hanging the open).
    pub fn open_file(&self, name: &OsStr) -> io::Result<File> {
        let flags = OFlags::RDONLY | OFlags::NOFOLLOW | OFlags::CLOEXEC | OFlags::NONBLOCK;
        let f = File::from(rfs::openat(&self.fd, name, flags, Mode::empty()).map_err(errno)?);
        if !f.metadata()?.is_file() {
            return Err(invalid("not a regular file".into()));
        }
        Ok(f)
    }

    /// A new regular file `name` (0600), for writing; anything there is an error.
    pub fn create_file(&self, name: &OsStr) -> io::Result<File> {
        let flags = OFlags::WRONLY | OFlags::CREATE | OFlags::EXCL | OFlags::NOFOLLOW | OFlags::CLOEXEC;
        Ok(File::from(rfs::openat(&self.fd, name, flags, Mode::from_raw_mode(0o600)).map_err(errno)?))
    }

    /// Names in this directory (not `.` and `..`).
    pub fn names(&self) -> io::Result<Vec<OsString>> {
        let mut out = Vec::new();
        for e in rfs::Dir::read_from(&self.fd).map_err(errno)? {
            let e = e.map_err(errno)?;
            let name = e.file_name().to_bytes();
            if name != b"." && name != b".." {
                out.push(OsStr::from_bytes(name).to_os_string());
            }
        }
        Ok(out)
    }

    /// Removes `name` if present: a file, link, or empty directory (a
    /// non-empty one is `ENOTEMPTY`).
    pub fn remove(&self, name: &OsStr) -> io::Result<()> {
        let flags = match self.stat(name)? {
            None => return Ok(()),
            Some(st) if st.kind == Kind::Dir => AtFlags::REMOVEDIR,
            Some(_) => AtFlags::empty(),
        };
        rfs::unlinkat(&self.fd, name, flags).map_err(errno)
    }

    /// Removes whatever is at `name`, recursively, never following a
    /// symlink; nothing there is fine.
    pub fn remove_all(&self, name: &OsStr) -> io::Result<()> {
        if let Some(Stat { kind: Kind::Dir, .. }) = self.stat(name)? {
            let child = self.open_dir(name)?;
            for n in child.names()? {
                child.remove_all(&n)?;
            }
        }
        self.remove(name)
    }

    /// Charged size of `name` (0 when absent): `per_entry` per entry plus
    /// file and symlink sizes, symlinks never followed.
    pub fn charge(&self, name: &OsStr, per_entry: u64) -> io::Result<u64> {
        match self.stat(name)? {
            None => Ok(0),
            Some(st) if st.kind != Kind::Dir => Ok(per_entry + st.size),
            Some(_) => {
                let child = self.open_dir(name)?;
                child.names()?.iter().try_fold(per_entry, |total, n| Ok(total + child.charge(n, per_entry)?))
            }
        }
    }

    /// Creates (or keeps) directory `name` with these attributes; a file or
    /// link there is replaced.
    pub fn make_dir(&self, name: &OsStr, perm: Mode, uid: u32, gid: u32) -> io::Result<()> {
        match rfs::mkdirat(&self.fd, name, Mode::from_raw_mode(0o700)) {
            Ok(()) => {}
            Err(Errno::EXIST) if self.stat(name)?.is_some_and(|s| s.kind == Kind::Dir) => {}
            Err(Errno::EXIST) => {
                self.remove(name)?;
                rfs::mkdirat(&self.fd, name, Mode::from_raw_mode(0o700)).map_err(errno)?;
            }
            Err(e) => return Err(errno(e)),
        }
        let dir = self.open_dir(name)?;
        let (u, g) = ids(uid, gid);
        rfs::fchown(&dir.fd, u, g).map_err(errno)?;
        rfs::fchmod(&dir.fd, perm).map_err(errno)
    }

    /// Writes regular file `name` from `data`, replacing what was there (a
    /// non-empty directory stays: `ENOTEMPTY`).
    pub fn write_file(&self, name: &OsStr, data: &mut impl Read, perm: Mode, owner: (u32, u32), mtime: u64) -> io::Result<()> {
        let file = match self.create_file(name) {
            Err(e) if e.kind() == io::ErrorKind::AlreadyExists => {
                self.remove(name)?;
                self.create_file(name)
            }
            other => other,
        };
        let mut file = file?;
        io::copy(data, &mut file)?;
        let (u, g) = ids(owner.0, owner.1);
        // chown before chmod: chown clears set-id bits.
        rfs::fchown(&file, u, g).map_err(errno)?;
        rfs::fchmod(&file, perm).map_err(errno)?;
        rfs::futimens(&file, &times(mtime)).map_err(errno)
    }

    /// Creates symlink `name` → `target` (stored, never followed here).
    pub fn symlink(&self, name: &OsStr, target: &[u8], owner: (u32, u32), mtime: u64) -> io::Result<()> {
        self.remove(name)?;
        rfs::symlinkat(OsStr::from_bytes(target), &self.fd, name).map_err(errno)?;
        let (u, g) = ids(owner.0, owner.1);
        rfs::chownat(&self.fd, name, u, g, AtFlags::SYMLINK_NOFOLLOW).map_err(errno)?;
        rfs::utimensat(&self.fd, name, &times(mtime), AtFlags::SYMLINK_NOFOLLOW).map_err(errno)
    }

    /// Hides `name` of lower layers: an overlayfs whiteout (a 0/0 character
    /// device).
    pub fn whiteout(&self, name: &OsStr) -> io::Result<()> {
        self.remove(name)?;
        rfs::mknodat(&self.fd, name, FileType::CharacterDevice, Mode::empty(), 0).map_err(errno)
    }

    /// Hides everything lower overlayfs layers have in this directory.
    pub fn set_opaque(&self) -> io::Result<()> {
        rfs::fsetxattr(&self.fd, "trusted.overlay.opaque", b"y", rfs::XattrFlags::empty()).map_err(errno)
    }

    /// Hard-links the regular file at `target` (below this directory) as
    /// `name` in `dir`. A target missing here — a file elsewhere, or
    /// outside the tree — is `NotFound`; one that is not a regular file is
    /// `InvalidInput`.
    pub fn hard_link(&self, target: &RelPath, dir: &Dir, name: &OsStr) -> io::Result<()> {
        let flags = OFlags::PATH | OFlags::NOFOLLOW | OFlags::CLOEXEC;
        let fd = rfs::openat2(&self.fd, target.joined().as_slice(), flags, Mode::empty(), CONFINED).map_err(errno)?;
        if FileType::from_raw_mode(rfs::fstat(&fd).map_err(errno)?.st_mode) != FileType::RegularFile {
            return Err(invalid("hard link target is not a regular file".into()));
        }
        dir.remove(name)?;
        rfs::linkat(&fd, "", &dir.fd, name, AtFlags::EMPTY_PATH).map_err(errno)
    }

    /// Sets this directory's times.
    pub fn set_mtime(&self, mtime: u64) -> io::Result<()> {
        rfs::futimens(&self.fd, &times(mtime)).map_err(errno)
    }
}

impl AsFd for Dir {
    fn as_fd(&self) -> BorrowedFd<'_> {
        self.fd.as_fd()
    }
}

#[cfg(test)]
#[path = "dir_tests.rs"]
mod tests;
