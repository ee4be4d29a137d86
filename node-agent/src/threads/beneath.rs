//! File operations that cannot leave a directory tree.
//!
//! A thread's state and the layers replayed onto it were written by a
//! sandbox, and the agent works on them as root. Anything in them may be a
//! symlink to a host path, and a path that was a directory when one entry was
//! applied may be a symlink by the next. So nothing here resolves a path the
//! usual way: a directory is opened with `openat2(RESOLVE_BENEATH |
//! RESOLVE_NO_SYMLINKS | RESOLVE_NO_XDEV)` from the tree's root descriptor,
//! and every operation is then relative to that descriptor, on a single name,
//! never following a final symlink.

use std::ffi::{CString, OsStr, OsString};
use std::fs::File;
use std::io;
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::os::unix::ffi::{OsStrExt, OsStringExt};
use std::path::{Component, Path};

use nix::dir::Dir;
use nix::fcntl::{openat, openat2, OFlag, OpenHow, ResolveFlag};
use nix::sys::stat::{fstatat, FileStat, Mode, SFlag};
use nix::unistd::{unlinkat, UnlinkatFlags};

/// Flags of every directory opened here.
const DIR_FLAGS: OFlag = OFlag::O_RDONLY.union(OFlag::O_DIRECTORY).union(OFlag::O_NOFOLLOW).union(OFlag::O_CLOEXEC);

/// A directory tree, held by a descriptor of its root.
#[derive(Debug)]
pub struct Tree {
    root: OwnedFd,
}

/// What is at a name, without following it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    Dir,
    File,
    Symlink,
    /// Devices, fifos, sockets.
    Other,
}

/// An entry's metadata, read without following it.
#[derive(Debug, Clone, Copy)]
pub struct Stat {
    pub kind: Kind,
    pub size: u64,
    /// Modification time, Unix seconds.
    pub mtime: i64,
}

impl From<&FileStat> for Stat {
    fn from(st: &FileStat) -> Stat {
        let kind = match SFlag::from_bits_truncate(st.st_mode) & SFlag::S_IFMT {
            SFlag::S_IFDIR => Kind::Dir,
            SFlag::S_IFREG => Kind::File,
            SFlag::S_IFLNK => Kind::Symlink,
            _ => Kind::Other,
        };
        Stat { kind, size: st.st_size.max(0) as u64, mtime: st.st_mtime }
    }
}

fn cstr(name: &OsStr) -> io::Result<CString> {
    CString::new(name.as_bytes()).map_err(|_| io::Error::new(io::ErrorKind::InvalidInput, "a name contains a NUL byte"))
}

/// True for a name that is one plain path component.
pub fn is_plain_name(name: &OsStr) -> bool {
    let b = name.as_bytes();
    !b.is_empty() && b != b"." && b != b".." && !b.contains(&b'/') && !b.contains(&0)
}

/// Errors meaning "there is no real directory at this path".
fn not_a_dir(e: &io::Error) -> bool {
    matches!(e.raw_os_error(), Some(libc::ENOENT | libc::ENOTDIR | libc::ELOOP | libc::EXDEV))
}

impl Tree {
    /// The tree rooted at `path` (itself a real directory).
    pub fn open(path: &Path) -> io::Result<Tree> {
        let root = nix::fcntl::open(path, DIR_FLAGS, Mode::empty())?;
        Ok(Tree { root })
    }

    /// The directory at `rel` ("" is the root), opened without following a
    /// symlink anywhere or leaving the tree: an error when any component is
    /// not a real directory of the tree.
    pub fn dir(&self, rel: &Path) -> io::Result<OwnedFd> {
        if rel.as_os_str().is_empty() {
            return self.root.try_clone();
        }
        if rel.components().any(|c| !matches!(c, Component::Normal(_))) {
            return Err(io::Error::new(io::ErrorKind::InvalidInput, format!("{} is not a plain relative path", rel.display())));
        }
        let how = OpenHow::new().flags(DIR_FLAGS).resolve(ResolveFlag::RESOLVE_BENEATH | ResolveFlag::RESOLVE_NO_SYMLINKS | ResolveFlag::RESOLVE_NO_XDEV);
        Ok(openat2(self.root.as_fd(), rel, how)?)
    }

    /// The directory holding `rel` and `rel`'s last name.
    pub fn parent<'p>(&self, rel: &'p Path) -> io::Result<(OwnedFd, &'p OsStr)> {
        let name = rel.file_name().filter(|n| is_plain_name(n)).ok_or_else(|| io::Error::new(io::ErrorKind::InvalidInput, format!("{} has no plain last name", rel.display())))?;
        Ok((self.dir(rel.parent().unwrap_or(Path::new("")))?, name))
    }

    /// What is at `rel`; `None` when nothing is, or when a parent is not a
    /// real directory (so nothing the tree owns is there).
    pub fn stat(&self, rel: &Path) -> io::Result<Option<Stat>> {
        let (dir, name) = match self.parent(rel) {
            Ok(p) => p,
            Err(e) if not_a_dir(&e) => return Ok(None),
            Err(e) => return Err(e),
        };
        stat_at(dir.as_fd(), name)
    }

    /// Charged size of what is at `rel` (0 when nothing is): `per_entry`
    /// per entry plus file and symlink sizes, symlinks never followed.
    pub fn charge(&self, rel: &Path, per_entry: u64) -> io::Result<u64> {
        let (dir, name) = match self.parent(rel) {
            Ok(p) => p,
            Err(e) if not_a_dir(&e) => return Ok(0),
            Err(e) => return Err(e),
        };
        match stat_at(dir.as_fd(), name)? {
            Some(st) => charge_at(dir.as_fd(), name, st, per_entry),
            None => Ok(0),
        }
    }
}

/// Metadata of `name` in `dir`, not following it; `None` when absent.
pub fn stat_at(dir: BorrowedFd<'_>, name: &OsStr) -> io::Result<Option<Stat>> {
    match fstatat(dir, cstr(name)?.as_c_str(), nix::fcntl::AtFlags::AT_SYMLINK_NOFOLLOW) {
        Ok(st) => Ok(Some(Stat::from(&st))),
        Err(nix::errno::Errno::ENOENT) => Ok(None),
        Err(e) => Err(e.into()),
    }
}

/// Opens the directory `name` in `dir` (not a symlink to one).
pub fn open_dir_at(dir: BorrowedFd<'_>, name: &OsStr) -> io::Result<OwnedFd> {
    Ok(openat(dir, cstr(name)?.as_c_str(), DIR_FLAGS, Mode::empty())?)
}

/// Opens the regular file `name` in `dir` for reading (not a symlink to one).
pub fn open_file_at(dir: BorrowedFd<'_>, name: &OsStr) -> io::Result<File> {
    let flags = OFlag::O_RDONLY | OFlag::O_NOFOLLOW | OFlag::O_CLOEXEC | OFlag::O_NONBLOCK;
    let f = File::from(openat(dir, cstr(name)?.as_c_str(), flags, Mode::empty())?);
    // O_NONBLOCK keeps a fifo from hanging the open; only regular files are served.
    if !f.metadata()?.is_file() {
        return Err(io::Error::new(io::ErrorKind::InvalidInput, "not a regular file"));
    }
    Ok(f)
}

/// Opens a new regular file `name` in `dir` for writing (fails if anything is there).
pub fn create_at(dir: BorrowedFd<'_>, name: &OsStr) -> io::Result<File> {
    let flags = OFlag::O_WRONLY | OFlag::O_CREAT | OFlag::O_EXCL | OFlag::O_NOFOLLOW | OFlag::O_CLOEXEC;
    Ok(File::from(openat(dir, cstr(name)?.as_c_str(), flags, Mode::from_bits_truncate(0o600))?))
}

/// Names in the directory `fd` (not `.` and `..`).
pub fn names(fd: OwnedFd) -> io::Result<Vec<OsString>> {
    let mut d = Dir::from_fd(fd)?;
    let mut out = Vec::new();
    for e in d.iter() {
        let name = e?.file_name().to_bytes().to_vec();
        if name != b"." && name != b".." {
            out.push(OsString::from_vec(name));
        }
    }
    Ok(out)
}

fn charge_at(dir: BorrowedFd<'_>, name: &OsStr, st: Stat, per_entry: u64) -> io::Result<u64> {
    if st.kind != Kind::Dir {
        return Ok(per_entry + st.size);
    }
    let fd = open_dir_at(dir, name)?;
    let child_dir = fd.try_clone()?;
    let mut total = per_entry;
    for child in names(fd)? {
        if let Some(st) = stat_at(child_dir.as_fd(), &child)? {
            total += charge_at(child_dir.as_fd(), &child, st, per_entry)?;
        }
    }
    Ok(total)
}

/// Removes whatever is at `name` in `dir`, recursively, never following a
/// symlink; nothing there is fine.
pub fn remove_at(dir: BorrowedFd<'_>, name: &OsStr) -> io::Result<()> {
    let Some(st) = stat_at(dir, name)? else { return Ok(()) };
    let c = cstr(name)?;
    if st.kind == Kind::Dir {
        let fd = open_dir_at(dir, name)?;
        let child_dir = fd.try_clone()?;
        for child in names(fd)? {
            remove_at(child_dir.as_fd(), &child)?;
        }
        unlinkat(dir, c.as_c_str(), UnlinkatFlags::RemoveDir)?;
    } else {
        unlinkat(dir, c.as_c_str(), UnlinkatFlags::NoRemoveDir)?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::symlink;

    #[test]
    fn symlinked_parents_are_never_followed() {
        let host = tempfile::tempdir().unwrap();
        std::fs::create_dir(host.path().join("etc")).unwrap();
        std::fs::write(host.path().join("etc/big"), vec![0u8; 10_000]).unwrap();
        let state = tempfile::tempdir().unwrap();
        symlink(host.path(), state.path().join("x")).unwrap();
        std::fs::create_dir(state.path().join("d")).unwrap();
        std::fs::write(state.path().join("d/f"), b"12345").unwrap();
        let t = Tree::open(state.path()).unwrap();
        assert!(t.dir(Path::new("x")).is_err(), "a symlink is not a directory of the tree");
        assert!(t.dir(Path::new("x/etc")).is_err());
        assert!(t.stat(Path::new("x/etc/big")).unwrap().is_none(), "nothing of the tree is below a symlink");
        assert_eq!(t.charge(Path::new("x/etc"), 100).unwrap(), 0);
        assert_eq!(t.stat(Path::new("x")).unwrap().unwrap().kind, Kind::Symlink);
        // A symlink is charged for itself, not for its target.
        let link_len = host.path().as_os_str().len() as u64;
        assert_eq!(t.charge(Path::new("x"), 100).unwrap(), 100 + link_len);
        assert_eq!(t.charge(Path::new("d"), 100).unwrap(), 200 + 5);
        assert!(t.dir(Path::new("../")).is_err() && t.dir(Path::new("/etc")).is_err());
    }

    #[test]
    fn removal_stays_in_the_tree() {
        let host = tempfile::tempdir().unwrap();
        std::fs::write(host.path().join("keep"), b"host").unwrap();
        let state = tempfile::tempdir().unwrap();
        std::fs::create_dir(state.path().join("d")).unwrap();
        symlink(host.path(), state.path().join("d/link")).unwrap();
        std::fs::write(state.path().join("d/f"), b"x").unwrap();
        let t = Tree::open(state.path()).unwrap();
        remove_at(t.dir(Path::new("")).unwrap().as_fd(), OsStr::new("d")).unwrap();
        assert!(!state.path().join("d").exists());
        assert_eq!(std::fs::read(host.path().join("keep")).unwrap(), b"host", "the symlink went, not its target");
        remove_at(t.dir(Path::new("")).unwrap().as_fd(), OsStr::new("absent")).unwrap();
    }
}
