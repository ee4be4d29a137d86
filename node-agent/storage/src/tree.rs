//! The read side of a mount: inodes discovered on demand over an object
//! store, below one root prefix.
//!
//! - `lookup` of a name is one HEAD of `<dir>/<name>`; only when there is no
//!   such object does it ask for the first key under `<dir>/<name>/` (a
//!   directory is a prefix holding something). A directory already listed
//!   answers from memory.
//! - `readdir` lists one directory level (delimiter listing), never deeper.
//! - `read` is a ranged GET pinned to the ETag seen at lookup, so a file
//!   replaced mid-read fails instead of mixing two versions.
//!
//! A key that is both an object and a prefix shows as the directory (the
//! object stays reachable through no name: the same choice as
//! mountpoint-s3). Keys whose last segment is not a valid name (see
//! [`crate::name`]) are not shown.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::SystemTime;

use bytes::Bytes;
use futures_util::StreamExt;
use object_store::path::Path;
use object_store::{GetOptions, GetRange, ObjectMeta, ObjectStore};

use crate::{name, FsError};

/// Inode of the mount's root.
pub const ROOT: u64 = 1;
/// Most entries one mount's tree holds (each listed or looked-up name is
/// one): a program walking a huge bucket gets ENFILE, not the agent's memory.
pub const MAX_ENTRIES: usize = 1 << 20;

/// File or directory.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    /// An object.
    File,
    /// A prefix.
    Dir,
}

/// What `stat` shows.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Attr {
    /// Inode number.
    pub ino: u64,
    /// File or directory.
    pub kind: Kind,
    /// Bytes (0 for directories).
    pub size: u64,
    /// Last modified (the mount's start for directories).
    pub mtime: SystemTime,
}

#[derive(Debug, Clone)]
pub(crate) struct Node {
    pub(crate) key: Path,
    pub(crate) kind: Kind,
    pub(crate) size: u64,
    pub(crate) mtime: SystemTime,
    pub(crate) etag: Option<String>,
    /// Directories: every child is in the table.
    pub(crate) listed: bool,
    /// Files: an object exists at `key` (deleting or renaming must touch it).
    pub(crate) stored: bool,
    /// Files being written: the local copy that is the content now.
    pub(crate) staged: Option<std::path::PathBuf>,
    /// The staged copy differs from the stored object.
    pub(crate) dirty: bool,
}

#[derive(Debug, Default)]
pub(crate) struct Table {
    pub(crate) nodes: HashMap<u64, Node>,
    pub(crate) children: HashMap<u64, HashMap<String, u64>>,
    pub(crate) next: u64,
    /// Bytes held by staged copies (bounded by the mount's write limit).
    pub(crate) staged_bytes: u64,
}

/// How a mount may be used.
#[derive(Debug, Clone, Default)]
pub struct MountOptions {
    /// Every change fails with EROFS.
    pub read_only: bool,
    /// Where written files are staged before upload (the agent's state
    /// disk; a directory of this mount's own).
    pub spool: std::path::PathBuf,
    /// Most bytes one call may stage (written files, and objects opened for
    /// writing without truncation); beyond it writes fail with ENOSPC.
    pub write_limit: u64,
}

/// One mount's tree.
pub struct ObjectTree {
    pub(crate) store: Arc<dyn ObjectStore>,
    pub(crate) table: Mutex<Table>,
    pub(crate) started: SystemTime,
    pub(crate) options: MountOptions,
}

impl std::fmt::Debug for ObjectTree {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ObjectTree").field("store", &self.store.to_string()).finish()
    }
}

impl ObjectTree {
    /// A read-only tree over `store` whose root is `root` (already
    /// validated and narrowed by the control plane; empty for the whole
    /// bucket).
    pub fn new(store: Arc<dyn ObjectStore>, root: Path) -> ObjectTree {
        ObjectTree::with_options(store, root, MountOptions { read_only: true, ..MountOptions::default() })
    }

    /// A tree with `options`.
    pub fn with_options(store: Arc<dyn ObjectStore>, root: Path, options: MountOptions) -> ObjectTree {
        let started = SystemTime::now();
        let mut table = Table { next: ROOT + 1, ..Table::default() };
        table.nodes.insert(ROOT, Node { key: root, kind: Kind::Dir, size: 0, mtime: started, etag: None, listed: false, stored: false, staged: None, dirty: false });
        ObjectTree { store, table: Mutex::new(table), started, options }
    }

    /// True for a read-only mount.
    pub fn read_only(&self) -> bool {
        self.options.read_only
    }

    pub(crate) fn table(&self) -> std::sync::MutexGuard<'_, Table> {
        // Every update below is a few map operations that cannot panic
        // half-way, so a poisoned lock is still consistent.
        self.table.lock().unwrap_or_else(|p| p.into_inner())
    }

    pub(crate) fn node(&self, ino: u64) -> Result<Node, FsError> {
        self.table().nodes.get(&ino).cloned().ok_or(FsError::NotFound)
    }

    pub(crate) fn dir(&self, ino: u64) -> Result<Node, FsError> {
        let n = self.node(ino)?;
        if n.kind != Kind::Dir {
            return Err(FsError::NotDir);
        }
        Ok(n)
    }

    /// The attributes of `ino`.
    pub fn getattr(&self, ino: u64) -> Result<Attr, FsError> {
        self.node(ino).map(|n| attr(ino, &n))
    }

    /// The entry `name` in directory `parent`.
    pub async fn lookup(&self, parent: u64, name: &[u8]) -> Result<Attr, FsError> {
        let dir = self.dir(parent)?;
        let part = name::segment(name)?;
        let known = {
            let t = self.table();
            t.children.get(&parent).and_then(|c| c.get(part.as_ref())).copied()
        };
        if let Some(ino) = known {
            return self.getattr(ino);
        }
        if dir.listed {
            return Err(FsError::NotFound);
        }
        let key = dir.key.child(part.clone());
        // Both questions at once (one round trip of latency): is there an
        // object, and is there anything below it? A directory wins.
        let (head, below) = tokio::join!(self.store.head(&key), self.has_children(&key));
        let node = match (head, below?) {
            (_, true) => self.dir_node(key),
            (Ok(meta), false) => file_node(meta),
            (Err(e), false) => return Err(e.into()),
        };
        self.insert(parent, part.as_ref(), node)
    }

    /// True when some object lies below `key/`: one page of a listing,
    /// stopped at its first entry.
    pub(crate) async fn has_children(&self, key: &Path) -> Result<bool, FsError> {
        match self.store.list(Some(key)).next().await {
            Some(Ok(_)) => Ok(true),
            Some(Err(e)) => Err(e.into()),
            None => Ok(false),
        }
    }

    pub(crate) fn dir_node(&self, key: Path) -> Node {
        Node { key, kind: Kind::Dir, size: 0, mtime: self.started, etag: None, listed: false, stored: false, staged: None, dirty: false }
    }

    /// Adds (or finds) `name` under `parent`.
    pub(crate) fn insert(&self, parent: u64, name: &str, node: Node) -> Result<Attr, FsError> {
        let mut t = self.table();
        if let Some(&ino) = t.children.get(&parent).and_then(|c| c.get(name)) {
            return Ok(attr(ino, &t.nodes[&ino]));
        }
        if t.nodes.len() >= MAX_ENTRIES {
            return Err(FsError::TooMany);
        }
        let ino = t.next;
        t.next += 1;
        let a = attr(ino, &node);
        t.nodes.insert(ino, node);
        t.children.entry(parent).or_default().insert(name.to_string(), ino);
        Ok(a)
    }

    /// Every entry of directory `ino`, by name.
    pub async fn readdir(&self, ino: u64) -> Result<Vec<(String, Attr)>, FsError> {
        let dir = self.dir(ino)?;
        if !dir.listed {
            let listing = self.store.list_with_delimiter(Some(&dir.key)).await?;
            let dirs = listing.common_prefixes.into_iter().filter_map(|p| Some((p.filename()?.to_string(), self.dir_node(p))));
            let mut entries: Vec<(String, Node)> = dirs.collect();
            let shadowed: std::collections::HashSet<String> = entries.iter().map(|(n, _)| n.clone()).collect();
            let files = listing.objects.into_iter().filter_map(|m| Some((m.location.filename()?.to_string(), file_node(m))));
            entries.extend(files.filter(|(n, _)| !shadowed.contains(n)));
            for (name, node) in entries {
                if name::segment(name.as_bytes()).is_ok() {
                    self.insert(ino, &name, node)?;
                }
            }
            if let Some(n) = self.table().nodes.get_mut(&ino) {
                n.listed = true;
            }
        }
        let t = self.table();
        let mut out: Vec<(String, Attr)> =
            t.children.get(&ino).map(|c| c.iter().map(|(name, i)| (name.clone(), attr(*i, &t.nodes[i]))).collect()).unwrap_or_default();
        out.sort_by(|a, b| a.0.cmp(&b.0));
        Ok(out)
    }

    /// Up to `len` bytes of file `ino` from `offset` (fewer at its end).
    pub async fn read(&self, ino: u64, offset: u64, len: u32) -> Result<Bytes, FsError> {
        let n = self.node(ino)?;
        if n.kind != Kind::File {
            return Err(FsError::IsDir);
        }
        let end = offset.saturating_add(u64::from(len)).min(n.size);
        if offset >= end {
            return Ok(Bytes::new());
        }
        if let Some(staged) = &n.staged {
            return crate::write::read_staged(staged, offset, end);
        }
        let opts = GetOptions { range: Some(GetRange::Bounded(offset..end)), if_match: n.etag.clone(), ..GetOptions::default() };
        Ok(self.store.get_opts(&n.key, opts).await?.bytes().await?)
    }
}

fn file_node(meta: ObjectMeta) -> Node {
    Node { key: meta.location, kind: Kind::File, size: meta.size, mtime: meta.last_modified.into(), etag: meta.e_tag, listed: false, stored: true, staged: None, dirty: false }
}

fn attr(ino: u64, n: &Node) -> Attr {
    Attr { ino, kind: n.kind, size: n.size, mtime: n.mtime }
}

#[cfg(test)]
mod tests;
