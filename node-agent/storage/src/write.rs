//! The write side of a mount: files are staged on the agent's disk while the
//! program writes them and uploaded when closed (`flush`) and, for anything
//! still dirty, by [`ObjectTree::sync`] before the call answers. Deletes and
//! renames reach the store at once. Directories exist in the store only as
//! prefixes: an empty one made by `mkdir` lasts for the call.
//!
//! Consistency: per object, the last upload wins; another sandbox reading
//! the same object sees the old or the new version whole (a read is pinned
//! to the version it looked up), never a mix.

use std::os::unix::fs::FileExt;
use std::path::{Path as FsPath, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};

use bytes::Bytes;
use futures_util::StreamExt;
use object_store::path::{Path, PathPart};
use object_store::{PutPayload, WriteMultipart};

use crate::tree::{Kind, Node};
use crate::{name, Attr, FsError, ObjectTree};

/// Uploads up to this size are one PUT; larger ones are multipart with
/// parts of this size.
pub const PART: usize = 8 << 20;
/// Most objects a directory rename moves (each is a copy and a delete);
/// beyond it the rename fails with EXDEV, and `mv` copies instead.
pub const MAX_DIR_RENAME: usize = 10_000;

/// A file whose changes could not be stored.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SyncFailure {
    /// Its path below the mount.
    pub path: String,
    /// Why (for the agent's log; the caller gets the path).
    pub error: FsError,
}

static STAGE_ID: AtomicU64 = AtomicU64::new(0);

fn io(e: std::io::Error) -> FsError {
    FsError::Io(format!("staging: {}", e.kind()))
}

/// Files one mount may stage in one call (each is a file on the agent's disk
/// and an upload before the answer): past it, creating or opening another
/// for writing fails with ENFILE.
pub const MAX_STAGES: usize = 10_000;

/// Whether the disk of `spool` keeps `reserve` free after `more` bytes.
fn spool_has_room(spool: &FsPath, more: u64, reserve: u64) -> bool {
    match nix::sys::statvfs::statvfs(spool) {
        Ok(s) => (s.blocks_available() as u64).saturating_mul(s.fragment_size() as u64) >= reserve.saturating_add(more),
        // Unknown: the write limit still bounds it.
        Err(_) => true,
    }
}

/// `offset..end` of a staged file.
pub(crate) fn read_staged(file: &FsPath, offset: u64, end: u64) -> Result<Bytes, FsError> {
    let f = std::fs::File::open(file).map_err(io)?;
    let mut buf = vec![0u8; usize::try_from(end - offset).map_err(|_| FsError::NoSpace)?];
    let mut done = 0;
    while done < buf.len() {
        match f.read_at(&mut buf[done..], offset + done as u64).map_err(io)? {
            0 => break,
            n => done += n,
        }
    }
    buf.truncate(done);
    Ok(buf.into())
}

impl ObjectTree {
    fn writable(&self) -> Result<(), FsError> {
        if self.options.read_only {
            return Err(FsError::ReadOnly);
        }
        Ok(())
    }

    fn new_stage(&self) -> Result<PathBuf, FsError> {
        {
            let mut t = self.table();
            if t.stages >= MAX_STAGES {
                return Err(FsError::TooMany);
            }
            t.stages += 1;
        }
        let path = self.options.spool.join(format!("w{}", STAGE_ID.fetch_add(1, Ordering::Relaxed)));
        std::fs::OpenOptions::new().write(true).create_new(true).open(&path).map_err(io)?;
        Ok(path)
    }

    /// Grows the staged total by `more` bytes, or ENOSPC: past the mount's
    /// write limit, or where the spool's disk would keep less than the
    /// agent's reserve (every mount of every sandbox spools there).
    fn charge(&self, more: u64) -> Result<(), FsError> {
        if more > 0 && self.options.disk_reserve > 0 && !spool_has_room(&self.options.spool, more, self.options.disk_reserve) {
            return Err(FsError::NoSpace);
        }
        let mut t = self.table();
        let total = t.staged_bytes.saturating_add(more);
        if total > self.options.write_limit {
            return Err(FsError::NoSpace);
        }
        t.staged_bytes = total;
        Ok(())
    }

    fn refund(&self, bytes: u64) {
        let mut t = self.table();
        t.staged_bytes = t.staged_bytes.saturating_sub(bytes);
    }

    /// The directory `parent` and the key segment of a new entry `name`
    /// in it: EROFS on a read-only mount, EEXIST when the name is taken.
    async fn new_entry<'n>(&self, parent: u64, name: &'n [u8]) -> Result<(Node, PathPart<'n>), FsError> {
        self.writable()?;
        match self.lookup(parent, name).await {
            Ok(_) => return Err(FsError::Exists),
            Err(FsError::NotFound) => {}
            Err(e) => return Err(e),
        }
        Ok((self.dir(parent)?, name::segment(name)?))
    }

    /// Creates an empty file `name` in `parent` (EEXIST when it exists).
    pub async fn create(&self, parent: u64, name: &[u8]) -> Result<Attr, FsError> {
        let (dir, part) = self.new_entry(parent, name).await?;
        let staged = self.new_stage()?;
        let node = Node { key: dir.key.child(part.clone()), kind: Kind::File, size: 0, mtime: std::time::SystemTime::now(), etag: None, listed: false, stored: false, staged: Some(staged), dirty: true };
        self.insert(parent, part.as_ref(), node)
    }

    /// Readies file `ino` for writing: an existing object is copied to the
    /// stage first, unless `truncate` empties it.
    pub async fn open_write(&self, ino: u64, truncate: bool) -> Result<(), FsError> {
        self.writable()?;
        let n = self.node(ino)?;
        if n.kind != Kind::File {
            return Err(FsError::IsDir);
        }
        if n.staged.is_some() {
            return if truncate { self.truncate(ino, 0).map(|_| ()) } else { Ok(()) };
        }
        // From now on the stage is the content.
        self.drop_window(ino);
        let size = if truncate { 0 } else { n.size };
        self.charge(size)?;
        let staged = match self.fill_stage(&n, truncate).await {
            Ok(p) => p,
            Err(e) => {
                self.refund(size);
                return Err(e);
            }
        };
        let mut t = self.table();
        match t.nodes.get_mut(&ino) {
            Some(node) if node.staged.is_none() => {
                node.staged = Some(staged);
                node.size = size;
                node.dirty |= truncate;
            }
            // Another open staged it meanwhile: keep that one.
            _ => {
                drop(t);
                let _ = std::fs::remove_file(&staged);
                self.refund(size);
            }
        }
        Ok(())
    }

    async fn fill_stage(&self, n: &Node, empty: bool) -> Result<PathBuf, FsError> {
        let path = self.new_stage()?;
        if empty || n.size == 0 {
            return Ok(path);
        }
        let opts = object_store::GetOptions { if_match: n.etag.clone(), ..Default::default() };
        let mut body = self.store.get_opts(&n.key, opts).await?.into_stream();
        let file = std::fs::OpenOptions::new().write(true).open(&path).map_err(io)?;
        let mut at = 0u64;
        while let Some(chunk) = body.next().await {
            let chunk = chunk?;
            file.write_all_at(&chunk, at).map_err(io)?;
            at += chunk.len() as u64;
        }
        Ok(path)
    }

    /// Writes `data` at `offset` of file `ino` (opened for writing).
    pub fn write(&self, ino: u64, offset: u64, data: &[u8]) -> Result<u32, FsError> {
        self.writable()?;
        let n = self.node(ino)?;
        let staged = n.staged.ok_or(FsError::Io("write to a file not opened for writing".into()))?;
        let end = offset.checked_add(data.len() as u64).ok_or(FsError::NoSpace)?;
        let grow = end.saturating_sub(n.size);
        self.charge(grow)?;
        let file = std::fs::OpenOptions::new().write(true).open(&staged).map_err(io)?;
        if let Err(e) = file.write_all_at(data, offset) {
            self.refund(grow);
            return Err(io(e));
        }
        let mut t = self.table();
        if let Some(node) = t.nodes.get_mut(&ino) {
            node.size = node.size.max(end);
            node.dirty = true;
            node.mtime = std::time::SystemTime::now();
        }
        Ok(data.len() as u32)
    }

    /// Sets the size of file `ino` (opened for writing).
    pub fn truncate(&self, ino: u64, size: u64) -> Result<Attr, FsError> {
        self.writable()?;
        let n = self.node(ino)?;
        let staged = n.staged.clone().ok_or(FsError::Io("truncate of a file not opened for writing".into()))?;
        if size > n.size {
            self.charge(size - n.size)?;
        } else {
            self.refund(n.size - size);
        }
        std::fs::OpenOptions::new().write(true).open(&staged).and_then(|f| f.set_len(size)).map_err(io)?;
        let mut t = self.table();
        let node = t.nodes.get_mut(&ino).ok_or(FsError::NotFound)?;
        node.size = size;
        node.dirty = true;
        node.mtime = std::time::SystemTime::now();
        Ok(Attr { ino, kind: node.kind, size, mtime: node.mtime })
    }

    /// Uploads file `ino` if it changed since its last upload.
    pub async fn flush(&self, ino: u64) -> Result<(), FsError> {
        let n = self.node(ino)?;
        let (true, Some(staged)) = (n.dirty, n.staged.clone()) else { return Ok(()) };
        // Cleared first: a write during the upload marks it dirty again.
        if let Some(node) = self.table().nodes.get_mut(&ino) {
            node.dirty = false;
        }
        // Until the upload succeeds the file stays dirty — also when this
        // future is dropped half-way (a deadline cut it off).
        let mut pending = StillDirty { tree: self, ino, stored: false };
        self.upload(&n.key, &staged, n.size).await?;
        pending.stored = true;
        Ok(())
    }

    async fn upload(&self, key: &Path, staged: &FsPath, size: u64) -> Result<(), FsError> {
        if size <= PART as u64 {
            let body = read_staged(staged, 0, size)?;
            self.store.put(key, PutPayload::from(body)).await?;
            return Ok(());
        }
        let mut upload = WriteMultipart::new_with_chunk_size(self.store.put_multipart(key).await?, PART);
        let mut at = 0;
        while at < size {
            let end = (at + PART as u64).min(size);
            upload.wait_for_capacity(4).await?;
            upload.put(read_staged(staged, at, end)?);
            at = end;
        }
        upload.finish().await?;
        Ok(())
    }

    /// Uploads every file still dirty; the paths that could not be stored.
    pub async fn sync(&self) -> Vec<SyncFailure> {
        let dirty: Vec<u64> = self.table().nodes.iter().filter(|(_, n)| n.dirty).map(|(i, _)| *i).collect();
        let mut failed = Vec::new();
        for ino in dirty {
            if let Err(error) = crate::error::by_deadline(self.deadline(), self.flush(ino)).await {
                failed.push(SyncFailure { path: self.path_of(ino), error });
            }
        }
        failed
    }

    /// The path of `ino` below the mount (for reports).
    fn path_of(&self, ino: u64) -> String {
        let t = self.table();
        let root = t.nodes.get(&crate::ROOT).map(|n| n.key.as_ref().len()).unwrap_or(0);
        t.nodes.get(&ino).map(|n| n.key.as_ref().get(root..).unwrap_or("").trim_start_matches('/').to_string()).unwrap_or_default()
    }

    /// Removes file `name` from `parent`, from the store too.
    pub async fn unlink(&self, parent: u64, name: &[u8]) -> Result<(), FsError> {
        self.writable()?;
        let a = self.lookup(parent, name).await?;
        if a.kind == Kind::Dir {
            return Err(FsError::IsDir);
        }
        let n = self.node(a.ino)?;
        if n.stored {
            self.store.delete(&n.key).await?;
        }
        self.forget(parent, name, a.ino);
        Ok(())
    }

    fn forget(&self, parent: u64, name: &[u8], ino: u64) {
        self.drop_window(ino);
        let mut t = self.table();
        if let Some(c) = t.children.get_mut(&parent) {
            c.remove(std::str::from_utf8(name).unwrap_or_default());
        }
        if let Some(n) = t.nodes.remove(&ino) {
            t.bytes = t.bytes.saturating_sub(crate::tree::entry_cost(&n));
            if let Some(staged) = n.staged {
                let _ = std::fs::remove_file(staged);
                t.staged_bytes = t.staged_bytes.saturating_sub(n.size);
            }
        }
    }

    /// Makes directory `name` in `parent` (it lasts for the call unless
    /// something is written below it).
    pub async fn mkdir(&self, parent: u64, name: &[u8]) -> Result<Attr, FsError> {
        let (dir, part) = self.new_entry(parent, name).await?;
        let mut node = self.dir_node(dir.key.child(part.clone()));
        node.listed = true;
        self.insert(parent, part.as_ref(), node)
    }

    /// Removes the empty directory `name` from `parent`.
    pub async fn rmdir(&self, parent: u64, name: &[u8]) -> Result<(), FsError> {
        self.writable()?;
        let a = self.lookup(parent, name).await?;
        if a.kind != Kind::Dir {
            return Err(FsError::NotDir);
        }
        if !self.readdir(a.ino).await?.is_empty() {
            return Err(FsError::NotEmpty);
        }
        self.forget(parent, name, a.ino);
        Ok(())
    }

    /// Renames `name` in `parent` to `new_name` in `new_parent`, replacing
    /// a file there.
    pub async fn rename(&self, parent: u64, name: &[u8], new_parent: u64, new_name: &[u8]) -> Result<(), FsError> {
        self.writable()?;
        let a = self.lookup(parent, name).await?;
        let target_dir = self.dir(new_parent)?;
        let part = name::segment(new_name)?;
        let to = target_dir.key.child(part.clone());
        match self.lookup(new_parent, new_name).await {
            Ok(existing) if existing.ino == a.ino => return Ok(()),
            Ok(existing) if existing.kind == Kind::Dir => return Err(FsError::IsDir),
            Ok(_) => {
                if a.kind == Kind::Dir {
                    return Err(FsError::NotDir);
                }
                self.unlink(new_parent, new_name).await?;
            }
            Err(FsError::NotFound) => {}
            Err(e) => return Err(e),
        }
        let n = self.node(a.ino)?;
        match n.kind {
            Kind::File if n.dirty || !n.stored => {
                // Not (or not fully) in the store yet: upload under the new name.
                if n.stored {
                    self.store.delete(&n.key).await?;
                }
                let mut t = self.table();
                if let Some(node) = t.nodes.get_mut(&a.ino) {
                    node.key = to;
                    node.stored = false;
                    node.dirty = true;
                }
            }
            Kind::File => {
                self.store.rename(&n.key, &to).await?;
                if let Some(node) = self.table().nodes.get_mut(&a.ino) {
                    node.key = to;
                }
            }
            Kind::Dir => self.rename_dir(a.ino, &n.key, &to).await?,
        }
        let mut t = self.table();
        if let Some(c) = t.children.get_mut(&parent) {
            c.remove(std::str::from_utf8(name).unwrap_or_default());
        }
        t.children.entry(new_parent).or_default().insert(part.as_ref().to_string(), a.ino);
        Ok(())
    }

    /// Moves every object below `from` to `to`. Files below it that were
    /// written in this call are uploaded first; the directory's subtree is
    /// then rediscovered under its new name.
    async fn rename_dir(&self, ino: u64, from: &Path, to: &Path) -> Result<(), FsError> {
        let below: Vec<u64> = {
            let t = self.table();
            t.nodes.iter().filter(|(_, n)| n.dirty && n.key.prefix_matches(from)).map(|(i, _)| *i).collect()
        };
        for i in below {
            self.flush(i).await?;
        }
        let mut keys = Vec::new();
        let mut listing = self.store.list(Some(from));
        while let Some(meta) = listing.next().await {
            keys.push(meta?.location);
            if keys.len() > MAX_DIR_RENAME {
                return Err(FsError::Unsupported("renaming a directory of more than 10000 objects"));
            }
        }
        let from_parts = from.parts().count();
        for key in keys {
            let dest = Path::from_iter(to.parts().chain(key.parts().skip(from_parts)));
            self.store.rename(&key, &dest).await?;
        }
        let mut t = self.table();
        let stale: Vec<u64> = t.nodes.iter().filter(|(i, n)| **i != ino && n.key.prefix_matches(from)).map(|(i, _)| *i).collect();
        for i in stale {
            if let Some(n) = t.nodes.remove(&i) {
                t.bytes = t.bytes.saturating_sub(crate::tree::entry_cost(&n));
                if let Some(s) = n.staged {
                    let _ = std::fs::remove_file(s);
                    t.staged_bytes = t.staged_bytes.saturating_sub(n.size);
                }
            }
            t.children.remove(&i);
        }
        t.children.remove(&ino);
        if let Some(node) = t.nodes.get_mut(&ino) {
            node.key = to.clone();
            node.listed = false;
        }
        Ok(())
    }
}

/// Marks a file dirty again unless its upload finished (see `flush`).
struct StillDirty<'a> {
    tree: &'a ObjectTree,
    ino: u64,
    stored: bool,
}

impl Drop for StillDirty<'_> {
    fn drop(&mut self) {
        if let Some(node) = self.tree.table().nodes.get_mut(&self.ino) {
            if self.stored {
                node.stored = true;
            } else {
                node.dirty = true;
            }
        }
    }
}

#[cfg(test)]
mod tests;

