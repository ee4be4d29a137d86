//! The node's cache of object bodies, shared by every mount of the agent.
//!
//! A read fetches a file in chunks (see [`crate::tree`]); each chunk of an
//! object whose lookup returned an ETag is kept here on the agent's state
//! disk, named by a digest of the store's identity (its credentials
//! included, so two tenants' clients never share an entry), the key, the
//! ETag and the chunk's place. A later call that finds the same ETag at
//! lookup — the object is unchanged — reads the chunk from here and
//! downloads no body; a changed object has another ETag and so other names.
//!
//! Bounded in bytes: past the bound the least recently used chunks go. The
//! index lives in memory and the directory is emptied when the agent
//! starts (a restart costs one download per chunk, never a stale read).

use std::collections::{BTreeMap, HashMap};
use std::io::Write;
use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt};
use std::path::PathBuf;
use std::sync::Mutex;

use bytes::Bytes;
use sha2::Digest;

/// Names one chunk of one version of one object.
pub type ChunkId = [u8; 32];

/// The chunk `idx` (of `len` bytes) of `key` at `etag`, read through the
/// store client identified by `store`.
pub fn chunk_id(store: &[u8; 32], key: &str, etag: &str, idx: u64, len: u64) -> ChunkId {
    let mut h = sha2::Sha256::new();
    h.update(store);
    for part in [key.as_bytes(), etag.as_bytes()] {
        h.update((part.len() as u64).to_le_bytes());
        h.update(part);
    }
    h.update(idx.to_le_bytes());
    h.update(len.to_le_bytes());
    h.finalize().into()
}

#[derive(Default)]
struct Index {
    /// Size and last use of each chunk kept.
    entries: HashMap<ChunkId, (u64, u64)>,
    /// Last use → chunk (oldest first).
    by_use: BTreeMap<u64, ChunkId>,
    clock: u64,
    bytes: u64,
}

impl Index {
    fn touch(&mut self, id: &ChunkId) -> bool {
        let Some(e) = self.entries.get_mut(id) else { return false };
        self.by_use.remove(&e.1);
        self.clock += 1;
        e.1 = self.clock;
        self.by_use.insert(self.clock, *id);
        true
    }

    fn remove(&mut self, id: &ChunkId) {
        if let Some((size, used)) = self.entries.remove(id) {
            self.by_use.remove(&used);
            self.bytes -= size;
        }
    }
}

/// Chunks kept on disk, least recently used dropped first.
pub struct BodyCache {
    dir: PathBuf,
    capacity: u64,
    index: Mutex<Index>,
}

impl std::fmt::Debug for BodyCache {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("BodyCache").field("dir", &self.dir).field("capacity", &self.capacity).finish()
    }
}

fn hex(id: &ChunkId) -> String {
    id.iter().map(|b| format!("{b:02x}")).collect()
}

impl BodyCache {
    /// A cache of at most `capacity` bytes in `dir` (created owner-only;
    /// whatever it held is removed).
    pub fn open(dir: PathBuf, capacity: u64) -> std::io::Result<BodyCache> {
        match std::fs::remove_dir_all(&dir) {
            Err(e) if e.kind() != std::io::ErrorKind::NotFound => return Err(e),
            _ => {}
        }
        std::fs::DirBuilder::new().recursive(true).mode(0o700).create(&dir)?;
        Ok(BodyCache { dir, capacity, index: Mutex::default() })
    }

    fn index(&self) -> std::sync::MutexGuard<'_, Index> {
        // Each update is a few map operations that cannot panic midway.
        self.index.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Bytes kept now.
    pub fn bytes(&self) -> u64 {
        self.index().bytes
    }

    /// The chunk, when kept (blocking: reads a file).
    pub fn get(&self, id: &ChunkId) -> Option<Bytes> {
        let size = {
            let mut ix = self.index();
            if !ix.touch(id) {
                return None;
            }
            ix.entries[id].0
        };
        match std::fs::read(self.dir.join(hex(id))) {
            Ok(data) if data.len() as u64 == size => Some(Bytes::from(data)),
            // Evicted between the lookup and the read, or damaged: a miss.
            _ => {
                self.index().remove(id);
                None
            }
        }
    }

    /// Keeps `data` as chunk `id`, dropping the least recently used chunks
    /// to stay within the capacity (blocking: writes a file). A chunk
    /// larger than a quarter of the cache is not kept: one huge file must
    /// not flush everything else.
    pub fn put(&self, id: &ChunkId, data: &[u8]) {
        let size = data.len() as u64;
        if size > self.capacity / 4 || self.index().entries.contains_key(id) {
            return;
        }
        let name = hex(id);
        let tmp = self.dir.join(format!("{name}.part"));
        let written = std::fs::OpenOptions::new().write(true).create_new(true).mode(0o600).open(&tmp).and_then(|mut f| f.write_all(data));
        if written.and_then(|()| std::fs::rename(&tmp, self.dir.join(&name))).is_err() {
            // A full disk or a concurrent put of the same chunk: not kept.
            let _ = std::fs::remove_file(&tmp);
            return;
        }
        let mut evicted = Vec::new();
        {
            let mut ix = self.index();
            if ix.entries.contains_key(id) {
                return;
            }
            while ix.bytes + size > self.capacity {
                let Some((_, old)) = ix.by_use.pop_first() else { break };
                if let Some((s, _)) = ix.entries.remove(&old) {
                    ix.bytes -= s;
                }
                evicted.push(old);
            }
            ix.clock += 1;
            let now = ix.clock;
            ix.entries.insert(*id, (size, now));
            ix.by_use.insert(now, *id);
            ix.bytes += size;
        }
        for old in evicted {
            let _ = std::fs::remove_file(self.dir.join(hex(&old)));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn id(n: u8) -> ChunkId {
        chunk_id(&[n; 32], "k", "e", 0, 1)
    }

    #[test]
    fn ids_differ_by_store_key_version_and_place() {
        let base = chunk_id(&[0; 32], "a/b", "\"v1\"", 0, 10);
        assert_ne!(base, chunk_id(&[1; 32], "a/b", "\"v1\"", 0, 10), "another client (credentials)");
        assert_ne!(base, chunk_id(&[0; 32], "a/c", "\"v1\"", 0, 10));
        assert_ne!(base, chunk_id(&[0; 32], "a/b", "\"v2\"", 0, 10), "another version");
        assert_ne!(base, chunk_id(&[0; 32], "a/b", "\"v1\"", 1, 10));
        assert_ne!(chunk_id(&[0; 32], "ab", "c", 0, 1), chunk_id(&[0; 32], "a", "bc", 0, 1), "parts are length-prefixed");
    }

    #[test]
    fn bounded_in_bytes_least_recently_used_first() {
        let dir = tempfile::tempdir().unwrap();
        let stale = dir.path().join("c/leftover");
        std::fs::create_dir_all(dir.path().join("c")).unwrap();
        std::fs::write(&stale, b"old").unwrap();
        let cache = BodyCache::open(dir.path().join("c"), 400).unwrap();
        assert!(!stale.exists(), "emptied at start");
        for n in 0..4 {
            cache.put(&id(n), &[n; 100]);
        }
        assert_eq!(cache.bytes(), 400);
        assert_eq!(cache.get(&id(0)).unwrap().as_ref(), &[0u8; 100], "kept and now recently used");
        cache.put(&id(9), &[9; 100]);
        assert_eq!(cache.bytes(), 400, "one chunk went");
        assert!(cache.get(&id(1)).is_none(), "the least recently used");
        assert!(cache.get(&id(0)).is_some() && cache.get(&id(9)).is_some());
        assert_eq!(std::fs::read_dir(dir.path().join("c")).unwrap().count(), 4, "evicted files are removed");
        cache.put(&id(7), &[7; 101]);
        assert!(cache.get(&id(7)).is_none(), "over a quarter of the cache: not kept");
    }

    #[test]
    fn a_vanished_file_is_a_miss() {
        let dir = tempfile::tempdir().unwrap();
        let cache = BodyCache::open(dir.path().to_path_buf(), 1000).unwrap();
        cache.put(&id(1), b"abc");
        std::fs::remove_file(dir.path().join(hex(&id(1)))).unwrap();
        assert!(cache.get(&id(1)).is_none());
        assert_eq!(cache.bytes(), 0);
    }
}
