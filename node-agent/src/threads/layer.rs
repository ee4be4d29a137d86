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

#[cfg(test)]
mod tests {
    use super::*;

    fn root_or_skip(test: &str) -> bool {
        if nix::unistd::geteuid().is_root() {
            return true;
        }
        // CI runs as root and sets this: there a skip would be a silent pass.
        assert!(std::env::var("WARREN_REQUIRE_ROOT").as_deref() != Ok("1"), "{test} needs root and WARREN_REQUIRE_ROOT=1 forbids skipping it");
        eprintln!("SKIPPED {test}: needs root (sets owners, creates whiteout devices)");
        false
    }

    fn layer_of(f: impl FnOnce(&mut Vec<u8>) -> io::Result<Delta>) -> (Vec<u8>, Delta) {
        let mut buf = Vec::new();
        let d = f(&mut buf).unwrap();
        (buf, d)
    }

    fn listing(dir: &Path) -> Vec<String> {
        let mut out = Vec::new();
        let mut stack = vec![dir.to_path_buf()];
        while let Some(d) = stack.pop() {
            for e in fs::read_dir(&d).unwrap() {
                let p = e.unwrap().path();
                let m = fs::symlink_metadata(&p).unwrap();
                let rel = p.strip_prefix(dir).unwrap().display().to_string();
                let what = if m.file_type().is_symlink() {
                    format!("-> {}", fs::read_link(&p).unwrap().display())
                } else if m.is_dir() {
                    stack.push(p.clone());
                    "dir".into()
                } else {
                    fs::read_to_string(&p).unwrap()
                };
                out.push(format!("{rel} {:o} {}:{} {what}", m.mode() & 0o7777, m.uid(), m.gid()));
            }
        }
        out.sort();
        out
    }

    #[test]
    fn a_full_state_round_trips_with_owners_modes_links_and_times() {
        if !root_or_skip("a_full_state_round_trips_with_owners_modes_links_and_times") {
            return;
        }
        let (src, dst) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
        let s = src.path();
        fs::create_dir_all(s.join(".local/lib")).unwrap();
        fs::write(s.join(".local/lib/m.py"), "x = 1").unwrap();
        fs::write(s.join("secret"), "s").unwrap();
        fs::set_permissions(s.join("secret"), fs::Permissions::from_mode(0o4600)).unwrap();
        symlink(".local/lib/m.py", s.join("link")).unwrap();
        fs::hard_link(s.join("secret"), s.join("hard")).unwrap();
        let old = std::time::UNIX_EPOCH + std::time::Duration::from_secs(1_600_000_000);
        fs::File::options().write(true).open(s.join(".local/lib/m.py")).unwrap().set_modified(old).unwrap();
        for p in [".local", ".local/lib", ".local/lib/m.py", "secret"] {
            lchown(s.join(p), Some(1000), Some(1000)).unwrap();
        }
        let (tar, delta) = layer_of(|b| write_full(s, b));
        assert_eq!(delta.skipped, 0);
        apply(&tar[..], dst.path()).unwrap();
        let got = listing(dst.path());
        assert!(got.contains(&".local/lib/m.py 644 1000:1000 x = 1".to_string()), "{got:?}");
        assert!(got.contains(&"secret 600 1000:1000 s".to_string()), "set-id bits are dropped: {got:?}");
        assert!(got.iter().any(|l| l.starts_with("link ") && l.ends_with("-> .local/lib/m.py")), "{got:?}");
        let (a, b) = (fs::metadata(dst.path().join("secret")).unwrap(), fs::metadata(dst.path().join("hard")).unwrap());
        assert_eq!(a.ino(), b.ino(), "hard links stay hard links");
        assert_eq!(fs::metadata(dst.path().join(".local/lib/m.py")).unwrap().modified().unwrap(), old, "mtimes survive (Python's caches use them)");
    }

    #[test]
    fn a_diff_carries_deletions_replacements_and_its_size_change() {
        if !root_or_skip("a_diff_carries_deletions_replacements_and_its_size_change") {
            return;
        }
        let (lower, upper) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
        let (l, u) = (lower.path(), upper.path());
        fs::create_dir_all(l.join("keep/sub")).unwrap();
        fs::write(l.join("keep/sub/a"), "aaaa").unwrap();
        fs::write(l.join("gone"), "123456").unwrap();
        fs::create_dir_all(l.join("replaced")).unwrap();
        fs::write(l.join("replaced/old"), "o").unwrap();
        // The upper layer overlayfs would leave: a whiteout, an opaque dir, a new file
        // owned by the sandbox's host ids.
        nix::sys::stat::mknod(&u.join("gone"), nix::sys::stat::SFlag::S_IFCHR, nix::sys::stat::Mode::empty(), 0).unwrap();
        fs::create_dir(u.join("replaced")).unwrap();
        xattr::set(u.join("replaced"), OPAQUE_XATTR, b"y").unwrap();
        fs::write(u.join("replaced/new"), "nn").unwrap();
        fs::write(u.join("added"), "xyz").unwrap();
        let ids = IdMap { root: 4000, user: 4001 };
        lchown(u.join("added"), Some(4001), Some(4001)).unwrap();
        lchown(u.join("replaced/new"), Some(4000), Some(4000)).unwrap();
        lchown(u.join("replaced"), Some(4001), Some(4001)).unwrap();
        fs::write(u.join(".wh.sneaky"), "x").unwrap();
        let (tar, delta) = layer_of(|b| write_diff(u, l, ids, b));
        assert_eq!(delta.skipped, 1, "a name that looks like a whiteout cannot be saved");
        // +added(3) +replaced dir +new(2) -gone(6) -replaced/ (dir + old(1)), each entry + ENTRY_CHARGE.
        let e = ENTRY_CHARGE as i64;
        assert_eq!(delta.bytes, (3 + e) + e + (2 + e) - (6 + e) - (e + 1 + e));
        apply(&tar[..], l).unwrap();
        let got = listing(l);
        assert_eq!(
            got,
            vec![
                "added 644 1000:1000 xyz".to_string(),
                "keep 755 0:0 dir".into(),
                "keep/sub 755 0:0 dir".into(),
                "keep/sub/a 644 0:0 aaaa".into(),
                "replaced 755 1000:1000 dir".into(),
                "replaced/new 644 0:0 nn".into(),
            ]
        );
        assert_eq!(charge(l).unwrap() as i64, (4 + 3 * e) + (6 + e) + (e + 1 + e) + e + delta.bytes, "the delta matches the state's real change");
    }

    fn hostile(entries: &[(&str, tar::EntryType, Option<&str>)]) -> Vec<u8> {
        let mut b = tar::Builder::new(Vec::new());
        for (path, kind, link) in entries {
            let mut h = tar::Header::new_gnu();
            h.set_entry_type(*kind);
            h.set_mode(0o644);
            h.set_size(0);
            h.set_uid(0);
            h.set_gid(0);
            h.set_mtime(0);
            // Bypass the builder's own path checks: write the name bytes raw.
            h.as_old_mut().name[..path.len()].copy_from_slice(path.as_bytes());
            if let Some(l) = link {
                h.set_link_name(l).unwrap();
            }
            h.set_cksum();
            b.append(&h, io::empty()).unwrap();
        }
        b.into_inner().unwrap()
    }

    #[test]
    fn hostile_layers_cannot_reach_outside_the_state() {
        let outside = tempfile::tempdir().unwrap();
        let state = tempfile::tempdir().unwrap();
        let target = outside.path().display().to_string();
        let cases: Vec<Vec<u8>> = vec![
            hostile(&[("../escape", tar::EntryType::Regular, None)]),
            hostile(&[(&format!("{target}/abs"), tar::EntryType::Regular, None)]),
            // A symlink to outside, then a write through it.
            hostile(&[("ln", tar::EntryType::Symlink, Some(&target)), ("ln/through", tar::EntryType::Regular, None)]),
            // A hard link to a file outside.
            hostile(&[("h", tar::EntryType::Link, Some("../../etc/passwd"))]),
            // A whiteout aimed above the state.
            hostile(&[("a/.wh...", tar::EntryType::Regular, None)]),
        ];
        for (i, layer) in cases.iter().enumerate() {
            let err = apply(&layer[..], state.path()).expect_err(&format!("case {i} was accepted"));
            assert_eq!(err.kind(), io::ErrorKind::InvalidData, "case {i} refused for the wrong reason: {err}");
        }
        assert_eq!(fs::read_dir(outside.path()).unwrap().count(), 0, "nothing was written outside");
        // Device nodes and fifos in a layer are ignored, never created.
        let dev = hostile(&[("dev", tar::EntryType::Char, None), ("fifo", tar::EntryType::Fifo, None)]);
        apply(&dev[..], state.path()).unwrap();
        assert!(!state.path().join("dev").exists() && !state.path().join("fifo").exists());
    }
}
