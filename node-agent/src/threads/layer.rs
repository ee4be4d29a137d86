//! The saved form of a thread's home: tar layers with OCI whiteout markers.
//!
//! A call's diff is the overlay upper layer it produced. [`write_diff`] turns
//! it into a layer: new and changed files, directories, symlinks and hard
//! links as tar entries with canonical owners (the sandbox's root → 0, its
//! user → 1000), deletions as `.wh.<name>`, replaced directories as
//! `<dir>/.wh..wh..opq`. [`apply`] replays a layer onto a state directory;
//! replaying every layer of a thread in order onto an empty directory gives
//! its home. [`write_full`] writes a whole state as one layer (compaction).
//!
//! Layers are read back by the agent as root, so [`apply`] trusts nothing in
//! them: paths must be plain relative paths, no entry is written through a
//! symlink, set-id bits and special files never come out.

use std::collections::{HashMap, HashSet};
use std::ffi::{OsStr, OsString};
use std::fs;
use std::io::{self, Read, Write};
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::{lchown, symlink, DirBuilderExt, FileTypeExt, MetadataExt, OpenOptionsExt, PermissionsExt};
use std::path::{Component, Path, PathBuf};

/// Charged per entry on top of its size: keeps a thread of millions of empty
/// files from being "free".
pub const ENTRY_CHARGE: u64 = 512;
const WHITEOUT: &str = ".wh.";
const OPAQUE: &str = ".wh..wh..opq";
const OPAQUE_XATTR: &str = "trusted.overlay.opaque";
/// Permission bits kept (no set-uid/set-gid).
const MODE_MASK: u32 = 0o1777;

/// Host ids of the sandbox that produced an upper layer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct IdMap {
    /// Host id of root inside.
    pub root: u32,
    /// Host id of uid 1000 inside.
    pub user: u32,
}

impl IdMap {
    /// Ids already canonical (a saved state).
    pub const CANONICAL: IdMap = IdMap { root: 0, user: 1000 };

    fn canonical(self, id: u32) -> u64 {
        match id {
            i if i == self.root => 0,
            i if i == self.user => 1000,
            _ => 65534,
        }
    }
}

/// What a written layer changes.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Delta {
    /// Change of the state's charged size (sizes + [`ENTRY_CHARGE`] per entry).
    pub bytes: i64,
    /// Tar entries written (0: the call changed nothing).
    pub entries: u64,
    /// Entries that cannot be saved (names starting `.wh.`, fifos, sockets, devices).
    pub skipped: u64,
}

/// Charged size of whatever is at `path` (0 when nothing is).
pub fn charge(path: &Path) -> io::Result<u64> {
    let meta = match fs::symlink_metadata(path) {
        Ok(m) => m,
        // Absent, or a parent is not a directory: nothing there to charge.
        Err(e) if matches!(e.kind(), io::ErrorKind::NotFound | io::ErrorKind::NotADirectory) => return Ok(0),
        Err(e) => return Err(e),
    };
    let mut total = ENTRY_CHARGE + if meta.is_dir() { 0 } else { meta.len() };
    if meta.is_dir() {
        for entry in fs::read_dir(path)? {
            total += charge(&entry?.path())?;
        }
    }
    Ok(total)
}

struct Writer<'a, W: Write> {
    tar: tar::Builder<W>,
    ids: IdMap,
    /// The state the diff applies to (`None` when writing a full state).
    lower: Option<&'a Path>,
    links: HashMap<(u64, u64), PathBuf>,
    delta: Delta,
}

/// Writes the diff in `upper` (against `lower`, the state it was mounted over) as a layer.
pub fn write_diff<W: Write>(upper: &Path, lower: &Path, ids: IdMap, out: W) -> io::Result<Delta> {
    write(upper, Some(lower), ids, out)
}

/// Writes a whole state (canonical owners) as one layer.
pub fn write_full<W: Write>(state: &Path, out: W) -> io::Result<Delta> {
    write(state, None, IdMap::CANONICAL, out)
}

fn write<W: Write>(root: &Path, lower: Option<&Path>, ids: IdMap, out: W) -> io::Result<Delta> {
    let mut tar = tar::Builder::new(out);
    tar.mode(tar::HeaderMode::Complete);
    let mut w = Writer { tar, ids, lower, links: HashMap::new(), delta: Delta::default() };
    w.dir(root, Path::new(""))?;
    w.tar.into_inner()?.flush()?;
    Ok(w.delta)
}

impl<W: Write> Writer<'_, W> {
    fn lower_charge(&self, rel: &Path) -> io::Result<u64> {
        match self.lower {
            Some(l) => charge(&l.join(rel)),
            None => Ok(0),
        }
    }

    fn header(&self, meta: &fs::Metadata, kind: tar::EntryType) -> tar::Header {
        let mut h = tar::Header::new_gnu();
        h.set_entry_type(kind);
        h.set_mode(meta.mode() & MODE_MASK);
        h.set_uid(self.ids.canonical(meta.uid()));
        h.set_gid(self.ids.canonical(meta.gid()));
        h.set_mtime(meta.mtime().max(0) as u64);
        h.set_size(0);
        h
    }

    /// Children of the directory `abs` (relative path `rel`), sorted.
    fn dir(&mut self, abs: &Path, rel: &Path) -> io::Result<()> {
        let mut names: Vec<OsString> = fs::read_dir(abs)?.map(|e| e.map(|e| e.file_name())).collect::<io::Result<_>>()?;
        names.sort();
        for name in names {
            self.entry(&abs.join(&name), &rel.join(&name), &name)?;
        }
        Ok(())
    }

    fn entry(&mut self, abs: &Path, rel: &Path, name: &OsStr) -> io::Result<()> {
        let meta = fs::symlink_metadata(abs)?;
        let ft = meta.file_type();
        if ft.is_char_device() && meta.rdev() == 0 {
            // Overlay whiteout: the name was deleted.
            self.delta.bytes -= self.lower_charge(rel)? as i64;
            let mut marker = OsString::from(WHITEOUT);
            marker.push(name);
            return self.marker(&rel.with_file_name(marker));
        }
        if name.as_bytes().starts_with(WHITEOUT.as_bytes()) {
            self.delta.skipped += 1;
            return Ok(());
        }
        if ft.is_dir() {
            let lower_is_dir = self.lower.is_some_and(|l| fs::symlink_metadata(l.join(rel)).is_ok_and(|m| m.is_dir()));
            let opaque = xattr::get(abs, OPAQUE_XATTR).ok().flatten().is_some_and(|v| v == b"y");
            if !lower_is_dir || opaque {
                self.delta.bytes += ENTRY_CHARGE as i64 - self.lower_charge(rel)? as i64;
            }
            let mut h = self.header(&meta, tar::EntryType::Directory);
            self.tar.append_data(&mut h, rel, io::empty())?;
            self.delta.entries += 1;
            if opaque && lower_is_dir {
                self.marker(&rel.join(OPAQUE))?;
            }
            return self.dir(abs, rel);
        }
        if !(ft.is_file() || ft.is_symlink()) {
            self.delta.skipped += 1;
            return Ok(());
        }
        self.delta.bytes += (ENTRY_CHARGE + meta.len()) as i64 - self.lower_charge(rel)? as i64;
        self.delta.entries += 1;
        if ft.is_symlink() {
            let mut h = self.header(&meta, tar::EntryType::Symlink);
            return self.tar.append_link(&mut h, rel, fs::read_link(abs)?);
        }
        if meta.nlink() > 1 {
            if let Some(first) = self.links.get(&(meta.dev(), meta.ino())) {
                let mut h = self.header(&meta, tar::EntryType::Link);
                let first = first.clone();
                return self.tar.append_link(&mut h, rel, first);
            }
            self.links.insert((meta.dev(), meta.ino()), rel.to_path_buf());
        }
        let mut h = self.header(&meta, tar::EntryType::Regular);
        h.set_size(meta.len());
        let file = fs::File::open(abs)?;
        // A file that changed size since stat would corrupt the archive; the
        // sandbox is gone, so nothing writes here any more.
        self.tar.append_data(&mut h, rel, file.take(meta.len()))
    }

    fn marker(&mut self, rel: &Path) -> io::Result<()> {
        let mut h = tar::Header::new_gnu();
        h.set_entry_type(tar::EntryType::Regular);
        h.set_mode(0o600);
        h.set_size(0);
        self.delta.entries += 1;
        self.tar.append_data(&mut h, rel, io::empty())
    }
}

fn bad(msg: String) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidData, msg)
}

/// A layer path as a list of plain components (no root, `.`, `..`, empty).
fn clean(path: &Path) -> io::Result<PathBuf> {
    let mut out = PathBuf::new();
    for c in path.components() {
        match c {
            Component::Normal(n) => out.push(n),
            Component::CurDir => {}
            _ => return Err(bad(format!("layer path {} is not a plain relative path", path.display()))),
        }
    }
    if out.as_os_str().is_empty() {
        return Err(bad("empty layer path".into()));
    }
    Ok(out)
}

/// Removes whatever is at `path` (recursively), if anything.
fn remove(path: &Path) -> io::Result<()> {
    match fs::symlink_metadata(path) {
        Ok(m) if m.is_dir() => fs::remove_dir_all(path),
        Ok(_) => fs::remove_file(path),
        Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(()),
        Err(e) => Err(e),
    }
}

struct Applier<'a> {
    state: &'a Path,
    /// Directories (relative) known to be real directories, not symlinks.
    dirs: HashSet<PathBuf>,
    dir_times: Vec<(PathBuf, u64)>,
}

impl Applier<'_> {
    /// Refuses to write below anything that is not a real directory of the state.
    fn check_parents(&mut self, rel: &Path) -> io::Result<()> {
        let mut at = PathBuf::new();
        for c in rel.parent().into_iter().flat_map(Path::components) {
            at.push(c);
            if self.dirs.contains(&at) {
                continue;
            }
            match fs::symlink_metadata(self.state.join(&at)) {
                Ok(m) if m.is_dir() => {
                    self.dirs.insert(at.clone());
                }
                _ => return Err(bad(format!("layer writes below {}, which is not a directory", at.display()))),
            }
        }
        Ok(())
    }

    fn entry<R: Read>(&mut self, mut entry: tar::Entry<'_, R>) -> io::Result<()> {
        let rel = clean(&entry.path()?)?;
        self.check_parents(&rel)?;
        let abs = self.state.join(&rel);
        let name = rel.file_name().map(|n| n.as_bytes()).unwrap_or_default();
        if name == OPAQUE.as_bytes() {
            let dir = abs.parent().unwrap_or(self.state);
            for child in fs::read_dir(dir)? {
                remove(&child?.path())?;
            }
            return Ok(());
        }
        if let Some(hidden) = name.strip_prefix(WHITEOUT.as_bytes()) {
            let target = clean(&rel.with_file_name(OsStr::from_bytes(hidden)))?;
            self.dirs.retain(|d| !d.starts_with(&target));
            return remove(&self.state.join(target));
        }
        let h = entry.header();
        let (mode, uid, gid, mtime) = (h.mode()? & MODE_MASK, h.uid()? as u32, h.gid()? as u32, h.mtime()?);
        let kind = h.entry_type();
        if kind.is_dir() {
            if !fs::symlink_metadata(&abs).is_ok_and(|m| m.is_dir()) {
                remove(&abs)?;
                fs::DirBuilder::new().mode(0o700).create(&abs)?;
            }
            lchown(&abs, Some(uid), Some(gid))?;
            fs::set_permissions(&abs, fs::Permissions::from_mode(mode))?;
            self.dirs.insert(rel.clone());
            self.dir_times.push((abs, mtime));
            return Ok(());
        }
        self.dirs.retain(|d| !d.starts_with(&rel));
        remove(&abs)?;
        if kind.is_symlink() {
            let target = entry.link_name()?.ok_or_else(|| bad(format!("symlink {} has no target", rel.display())))?;
            symlink(&*target, &abs)?;
            return lchown(&abs, Some(uid), Some(gid));
        }
        if kind.is_hard_link() {
            let target = entry.link_name()?.ok_or_else(|| bad(format!("hard link {} has no target", rel.display())))?;
            let target = self.state.join(clean(&target)?);
            if !fs::symlink_metadata(&target).is_ok_and(|m| m.is_file()) {
                return Err(bad(format!("hard link {} points at no regular file", rel.display())));
            }
            return fs::hard_link(target, &abs);
        }
        if !kind.is_file() {
            return Ok(()); // never written by Warren; ignored if present
        }
        let mut file = fs::OpenOptions::new().write(true).create_new(true).mode(0o600).custom_flags(libc::O_NOFOLLOW).open(&abs)?;
        io::copy(&mut entry, &mut file)?;
        let t = std::time::UNIX_EPOCH + std::time::Duration::from_secs(mtime);
        file.set_times(fs::FileTimes::new().set_modified(t).set_accessed(t))?;
        drop(file);
        lchown(&abs, Some(uid), Some(gid))?;
        fs::set_permissions(&abs, fs::Permissions::from_mode(mode))
    }
}

/// Replays one layer onto `state` (an existing directory).
pub fn apply<R: Read>(layer: R, state: &Path) -> io::Result<()> {
    let mut archive = tar::Archive::new(layer);
    let mut applier = Applier { state, dirs: HashSet::new(), dir_times: Vec::new() };
    for entry in archive.entries()? {
        applier.entry(entry?)?;
    }
    // Directory times last: writing children changes them.
    for (dir, mtime) in applier.dir_times {
        let t = std::time::UNIX_EPOCH + std::time::Duration::from_secs(mtime);
        if let Ok(d) = fs::File::open(&dir) {
            let _ = d.set_times(fs::FileTimes::new().set_modified(t).set_accessed(t));
        }
    }
    Ok(())
}
