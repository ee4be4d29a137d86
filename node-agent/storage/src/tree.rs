//! The read side of a mount: inodes discovered on demand over an object
//! store, below one root prefix.
//!
//! - `lookup` of a name asks at once for the object `<dir>/<name>` (HEAD) and
//!   for one key under `<dir>/<name>/` (a directory is a prefix holding
//!   something; with a paginated store, `max-keys=1`): one round trip. A
//!   directory already listed answers from memory.
//! - `readdir` lists one directory level (delimiter listing), never deeper.
//! - `read` is a ranged GET pinned to the ETag seen at lookup, so a file
//!   replaced mid-read fails instead of mixing two versions. A file is read
//!   in aligned chunks of [`CHUNK`] bytes (a small file in one GET of its
//!   size); concurrent reads of a chunk share its one GET, and a reader in
//!   the second half of a chunk has the next one fetched ahead. One mount
//!   holds at most [`MAX_CHUNKS`] chunks in memory; with a node cache
//!   ([`crate::cache`]) a chunk of an unchanged object (same ETag) is read
//!   from the node's disk instead of downloaded again.
//!
//! A key that is both an object and a prefix shows as the directory (the
//! object stays reachable through no name: the same choice as
//! mountpoint-s3), and a directory is known as soon as its probe answers,
//! whatever the HEAD does (some S3-compatible servers answer a HEAD of a
//! "directory" with a retried 500). Keys whose last segment is not a valid
//! name (see [`crate::name`]) are not shown.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::SystemTime;

use bytes::Bytes;
use futures_util::StreamExt;
use object_store::path::Path;
use object_store::list::{PaginatedListOptions, PaginatedListStore};
use object_store::{GetOptions, GetRange, ObjectMeta, ObjectStore};

use crate::cache::{self, BodyCache};
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
    /// Files staged so far in this call (bounded by [`crate::write::MAX_STAGES`]).
    pub(crate) stages: usize,
    /// Memory counted for the entries ([`MAX_TREE_BYTES`]).
    pub(crate) bytes: u64,
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
    /// When store requests give up (EIO for the program, a sync failure
    /// for the answer): a hung store must not hold a call past its timeout.
    /// A program blocked in a FUSE request cannot even be killed until the
    /// request is answered.
    pub deadline: Option<std::time::Instant>,
    /// Free bytes the spool's disk must keep (the agent's state reserve,
    /// shared with thread homes and images): a write that would dig into
    /// it fails with ENOSPC, however many mounts are writing.
    pub disk_reserve: u64,
}

/// Unit of reading and read-ahead.
pub const CHUNK: u64 = 8 << 20;
/// Chunks one mount keeps (64 MiB).
pub const MAX_CHUNKS: usize = 8;
/// Store reads one mount has in flight at once (each up to a chunk): more
/// wait their turn, so parallel readers and read-ahead cannot pile up
/// memory in the agent.
pub const MAX_READS: usize = 8;
/// Agent memory one mount's tree may hold (its entries, counted with their
/// keys): past it, new entries fail with ENFILE.
pub const MAX_TREE_BYTES: u64 = 64 << 20;
/// What one entry costs beyond its key and name (the node, two map slots).
const ENTRY_OVERHEAD: u64 = 512;

/// The memory one entry is counted for.
pub(crate) fn entry_cost(node: &Node) -> u64 {
    2 * node.key.as_ref().len() as u64 + ENTRY_OVERHEAD
}

type Fetch = futures_util::future::Shared<futures_util::future::BoxFuture<'static, Result<Bytes, FsError>>>;

/// Chunks fetched or being fetched, oldest first.
#[derive(Default)]
struct Chunks {
    by_key: HashMap<(u64, u64), Fetch>,
    order: std::collections::VecDeque<(u64, u64)>,
}

/// One mount's tree.
pub struct ObjectTree {
    pub(crate) store: Arc<dyn ObjectStore>,
    pager: Option<Arc<dyn PaginatedListStore>>,
    chunks: Mutex<Chunks>,
    /// The node's body cache and this store client's identity in it.
    cache: Option<(Arc<BodyCache>, [u8; 32])>,
    pub(crate) table: Mutex<Table>,
    /// Permits for store reads in flight ([`MAX_READS`]).
    reads: Arc<tokio::sync::Semaphore>,
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
        ObjectTree { store, pager: None, chunks: Mutex::default(), cache: None, table: Mutex::new(table), reads: Arc::new(tokio::sync::Semaphore::new(MAX_READS)), started, options }
    }

    /// Lets directory probes ask for one key instead of a page.
    pub fn with_pager(mut self, pager: Arc<dyn PaginatedListStore>) -> ObjectTree {
        self.pager = Some(pager);
        self
    }

    /// Keeps and finds chunks in the node's `cache`, where `store_id` names
    /// this tree's store client (see [`crate::stores`]).
    pub fn with_cache(mut self, cache: Arc<BodyCache>, store_id: [u8; 32]) -> ObjectTree {
        self.cache = Some((cache, store_id));
        self
    }

    /// True for a read-only mount.
    pub fn read_only(&self) -> bool {
        self.options.read_only
    }

    /// When store requests give up.
    pub fn deadline(&self) -> Option<std::time::Instant> {
        self.options.deadline
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
        let node = self.probe(key).await?;
        self.insert(parent, part.as_ref(), node)
    }

    /// What `key` is: a directory as soon as something is found below it,
    /// else the object (or its absence) the HEAD found.
    async fn probe(&self, key: Path) -> Result<Node, FsError> {
        let head = self.store.head(&key);
        let below = self.has_children(&key);
        tokio::pin!(head, below);
        let mut headed = None;
        loop {
            tokio::select! {
                found = &mut below => {
                    if found? {
                        return Ok(self.dir_node(key.clone()));
                    }
                    let h = match headed.take() {
                        Some(h) => h,
                        None => (&mut head).await,
                    };
                    return Ok(file_node(h?));
                }
                h = &mut head, if headed.is_none() => headed = Some(h),
            }
        }
    }

    /// True when some object lies below `key/`: one page of a listing,
    /// stopped at its first entry.
    pub(crate) async fn has_children(&self, key: &Path) -> Result<bool, FsError> {
        if let Some(pager) = &self.pager {
            let opts = PaginatedListOptions { delimiter: Some("/".into()), max_keys: Some(1), ..PaginatedListOptions::default() };
            let page = pager.list_paginated(Some(&format!("{key}/")), opts).await?;
            return Ok(!page.result.objects.is_empty() || !page.result.common_prefixes.is_empty());
        }
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
        let cost = entry_cost(&node);
        if t.nodes.len() >= MAX_ENTRIES || t.bytes.saturating_add(cost) > MAX_TREE_BYTES {
            return Err(FsError::TooMany);
        }
        t.bytes += cost;
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
        let first = offset / CHUNK;
        let last = (end - 1) / CHUNK;
        let mut out = bytes::BytesMut::with_capacity((end - offset) as usize);
        for idx in first..=last {
            let data = self.chunk_fetch(ino, &n, idx).await?;
            let base = idx * CHUNK;
            let (from, to) = (offset.max(base) - base, end.min(base + data.len() as u64) - base);
            if from >= to {
                break;
            }
            out.extend_from_slice(&data[from as usize..to as usize]);
        }
        // Past the middle of a chunk: fetch the next one while this is read.
        if end > last * CHUNK + CHUNK / 2 && (last + 1) * CHUNK < n.size {
            let ahead = self.chunk_fetch(ino, &n, last + 1);
            tokio::spawn(async move {
                let _ = ahead.await;
            });
        }
        Ok(out.freeze())
    }

    fn chunks(&self) -> std::sync::MutexGuard<'_, Chunks> {
        // Map and queue change together and cannot panic in between.
        self.chunks.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The (shared) fetch of chunk `idx` of `ino`, started if new.
    fn chunk_fetch(&self, ino: u64, n: &Node, idx: u64) -> Fetch {
        use futures_util::FutureExt;
        let mut c = self.chunks();
        if let Some(f) = c.by_key.get(&(ino, idx)) {
            return f.clone();
        }
        let (start, end) = (idx * CHUNK, ((idx + 1) * CHUNK).min(n.size));
        let (store, key, reads) = (self.store.clone(), n.key.clone(), self.reads.clone());
        let opts = GetOptions { range: Some(GetRange::Bounded(start..end)), if_match: n.etag.clone(), ..GetOptions::default() };
        // Only a versioned chunk can be kept: the ETag is what proves a
        // later call reads the same bytes.
        let kept = match (&self.cache, &n.etag) {
            (Some((cache, store_id)), Some(etag)) => Some((cache.clone(), cache::chunk_id(store_id, key.as_ref(), etag, idx, end - start))),
            _ => None,
        };
        let fetch: Fetch = async move {
            let _permit = reads.acquire_owned().await.map_err(|_| FsError::Io("the mount is closing".into()))?;
            let Some((cache, id)) = kept else { return Ok(store.get_opts(&key, opts).await?.bytes().await?) };
            let found = {
                let (cache, id) = (cache.clone(), id);
                tokio::task::spawn_blocking(move || cache.get(&id)).await.ok().flatten()
            };
            if let Some(data) = found {
                return Ok(data);
            }
            let data = store.get_opts(&key, opts).await?.bytes().await?;
            let copy = data.clone();
            // Written behind the read: the caller does not wait for the disk.
            tokio::task::spawn_blocking(move || cache.put(&id, &copy));
            Ok(data)
        }
        .boxed()
        .shared();
        c.by_key.insert((ino, idx), fetch.clone());
        c.order.push_back((ino, idx));
        while c.order.len() > MAX_CHUNKS {
            if let Some(old) = c.order.pop_front() {
                c.by_key.remove(&old);
            }
        }
        fetch
    }

    /// Forgets what was read of `ino` (its content changed).
    pub(crate) fn drop_window(&self, ino: u64) {
        let mut c = self.chunks();
        c.by_key.retain(|(i, _), _| *i != ino);
        c.order.retain(|(i, _)| *i != ino);
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
