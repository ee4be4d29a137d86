//! Threads: persistent homes across calls.
//!
//! A thread's truth is its manifest and layers in the [`store::BlobStore`].
//! Each node keeps the threads it ran unpacked ("warm") under its cache
//! directory, tagged with the manifest id they reflect; a call whose warm copy
//! matches the published manifest mounts it directly, anything else is
//! rebuilt from the store first. A save writes the call's diff as a new layer,
//! then replaces the manifest — the one atomic step — so a crash at any point
//! leaves the previous or the new state, and the in-memory lock dies with the
//! process.
//!
//! ```text
//! <cache>/<ns>/<key>/<thread>/state/      the home, canonical owners (lower layer of the next call)
//! <cache>/<ns>/<key>/<thread>/warm.json   {manifestId, bootId, usedAt}; absent = rebuild
//! ```

pub mod disk;
pub mod files;
mod gc;
pub mod history;
pub mod layer;
mod lock;
pub mod manifest;
pub mod store;
pub mod versions;

use std::io;
use std::os::unix::fs::DirBuilderExt;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use serde::{Deserialize, Serialize};
use tracing::{info, warn};

pub use history::{Kind, Produced};
pub use manifest::{Manifest, ThreadKey, ThreadOptions};
pub use lock::ThreadLock;
use lock::Locks;
use manifest::{new_id, unix_now, LayerRef, MAX_LAYERS};
use store::BlobStore;

/// Objects no manifest names (of a crashed save, a compaction, a deleted
/// thread) younger than this are left alone: a save may be uploading them
/// right now. It is also how long a fork's lease holds the collector off
/// (see [`gc`]).
const ORPHAN_GRACE: Duration = Duration::from_secs(3600);
/// How long a deleted thread's tombstone stays: longer than any call runs,
/// so no save that restored the thread before its deletion can still land.
const TOMBSTONE_KEEP: Duration = Duration::from_secs(86_400);

/// Why a thread operation failed.
#[derive(Debug, thiserror::Error)]
pub enum ThreadError {
    /// Another call holds the thread.
    #[error("thread is busy: another execution is using it")]
    Busy,
    /// The thread does not exist (for this key).
    #[error("thread not found")]
    NotFound,
    /// Another execution (on another node) saved the thread since this call
    /// restored it; this call's changes were not saved.
    #[error("the thread was changed by another execution meanwhile; this call's changes were not saved")]
    Conflict,
    /// Saving would make the home larger than allowed; nothing was saved.
    #[error("the thread's home would be {bytes} bytes, over its limit of {limit}")]
    TooLarge {
        /// Size the save would have produced.
        bytes: u64,
        /// The limit.
        limit: u64,
    },
    /// A fork's new thread already exists.
    #[error("a thread by that id already exists")]
    Exists,
    /// The thread keeps no version by that trace id.
    #[error("the thread keeps no version produced by that execution")]
    VersionNotFound,
    /// Creating this thread would give its key more than `max` threads.
    #[error("the key keeps its maximum of {max} threads; delete one before creating another")]
    Limit {
        /// The key's limit.
        max: u32,
    },
    /// The state disk would drop below its reserve even without idle warm
    /// copies; nothing was written.
    #[error("the node's state disk is low: {needed} bytes needed, {free} free, {reserve} reserved")]
    DiskLow {
        /// Bytes the step would write.
        needed: u64,
        /// Bytes free now.
        free: u64,
        /// The reserve.
        reserve: u64,
    },
    /// The store or the local disk failed.
    #[error("{step}: {source}")]
    Io {
        /// What was being done.
        step: &'static str,
        /// Cause.
        #[source]
        source: io::Error,
    },
}

fn io_err(step: &'static str) -> impl FnOnce(io::Error) -> ThreadError {
    move |source| ThreadError::Io { step, source }
}

/// Test-only pause points (`WARREN_TEST_PAUSE_AT`), so a crash test can
/// kill the agent at an exact step of a save instead of guessing a moment.
fn pause_point(name: &str) -> Option<PathBuf> {
    let at = std::env::var("WARREN_TEST_PAUSE_AT").ok()?;
    (at == name).then(|| std::env::var_os("WARREN_TEST_PAUSE_MARKER").map(PathBuf::from)).flatten()
}

async fn maybe_pause(name: &str) {
    if let Some(marker) = pause_point(name) {
        warn!(point = name, "test pause point reached; waiting to be killed");
        let _ = std::fs::write(marker, name);
        std::future::pending::<()>().await;
    }
}

#[derive(Debug, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
struct Warm {
    manifest_id: String,
    boot_id: String,
    used_at: u64,
}

/// Whether this save should replace the thread's layers with one full
/// layer: too many layers, or layers holding much more than the home does
/// (files rewritten call after call). Keeps a cold restore proportional to
/// the home's size.
fn compaction_due(layers_before: usize, stored_bytes: u64, home_bytes: u64) -> bool {
    layers_before + 1 > MAX_LAYERS || stored_bytes > 2 * home_bytes + (4 << 20)
}

/// Whether an unchanged call must still re-publish the manifest: a thread's
/// last use is recorded with a granularity of 1/24 of its retention (one
/// hour for `24h`), so most repeat calls write nothing to the store.
fn touch_due(prev: &Manifest, retention_secs: Option<u64>, now: u64) -> bool {
    if prev.retention_secs != retention_secs {
        return true;
    }
    retention_secs.is_some_and(|r| now.saturating_sub(prev.updated_at) >= (r / 24).max(60))
}

/// The node's thread service.
pub struct Threads {
    store: Arc<dyn BlobStore>,
    cache: PathBuf,
    spool: PathBuf,
    locks: Locks,
    boot_id: String,
    /// Bytes of the state disk thread data never uses (0: no floor).
    reserve: u64,
    /// Test-only steps of a fork (see [`versions::Step`]).
    #[cfg(test)]
    hook: Option<versions::Hook>,
}

/// A thread ready to be mounted: its warm state matches the published manifest.
pub struct Restored {
    /// The call's options.
    pub options: ThreadOptions,
    /// Warm state directory (the lower layer).
    pub state: PathBuf,
    manifest: Option<Manifest>,
    published: Option<store::Version>,
    warm_used_at: u64,
    _lock: ThreadLock,
}

/// What a restored thread is: its options, warm copy and manifest (without
/// the lock).
#[derive(Debug, Clone)]
pub struct Base {
    /// The call's options.
    pub options: ThreadOptions,
    /// Warm state directory (the lower layer).
    pub state: PathBuf,
    /// The manifest it was restored from (`None`: a new thread).
    pub manifest: Option<Manifest>,
}

impl Restored {
    /// What it is, for a fork of the live sandbox mounting it.
    pub fn base(&self) -> Base {
        Base { options: self.options.clone(), state: self.state.clone(), manifest: self.manifest.clone() }
    }
}

/// A live sandbox's mounted home: what it was restored from, and the
/// overlay's upper layer holding what changed since.
#[derive(Debug)]
pub struct LiveHome {
    /// The thread it was restored from.
    pub base: Base,
    /// The overlay's upper directory.
    pub upper: PathBuf,
    /// The sandbox's host ids (the diff maps them back).
    pub ids: layer::IdMap,
}

/// What a save did.
#[derive(Debug, Clone, Copy, Default)]
pub struct Saved {
    /// Size of the uploaded layer (0: nothing changed).
    pub layer_bytes: u64,
    /// Charged size of the home now.
    pub home_bytes: u64,
    /// Entries the layer format cannot hold (dropped).
    pub skipped: u64,
}

fn mkdir_private(path: &Path) -> io::Result<()> {
    std::fs::DirBuilder::new().recursive(true).mode(0o700).create(path)
}

/// Creates an empty state directory owned by the sandbox user.
fn fresh_state(state: &Path) -> io::Result<()> {
    if state.exists() {
        std::fs::remove_dir_all(state)?;
    }
    mkdir_private(state)?;
    std::os::unix::fs::chown(state, Some(1000), Some(1000))
}

impl Threads {
    /// A thread service over `store`, keeping warm copies under `cache`.
    pub fn new(store: Arc<dyn BlobStore>, cache: &Path) -> io::Result<Threads> {
        mkdir_private(cache)?;
        let spool = match store.spool_dir() {
            Some(dir) => dir,
            None => cache.join(".spool"),
        };
        mkdir_private(&spool)?;
        for entry in std::fs::read_dir(&spool)? {
            let _ = std::fs::remove_file(entry?.path());
        }
        let boot_id = std::fs::read_to_string("/proc/sys/kernel/random/boot_id").unwrap_or_default().trim().to_string();
        info!(store = %store.describe(), cache = %cache.display(), "thread store ready");
        Ok(Threads {
            store,
            cache: cache.to_path_buf(),
            spool,
            locks: Locks::default(),
            boot_id,
            reserve: 0,
            #[cfg(test)]
            hook: None,
        })
    }

    /// Keeps `bytes` of the state disk free (see [`disk`]).
    pub fn with_reserve(mut self, bytes: u64) -> Threads {
        self.reserve = bytes;
        self
    }

    /// Makes sure `needed` bytes can be written under the cache without
    /// going below the reserve, dropping idle warm copies (never one in
    /// use: those are locked) when that is what it takes.
    fn make_room(&self, needed: u64) -> Result<(), ThreadError> {
        if self.reserve == 0 {
            return Ok(());
        }
        let free = || disk::free_bytes(&self.cache).map_err(io_err("reading the state disk's free space"));
        if disk::fits(free()?, needed, self.reserve) {
            return Ok(());
        }
        let removed = self.collect_warm(Duration::ZERO, unix_now());
        let free = free()?;
        if disk::fits(free, needed, self.reserve) {
            info!(removed, needed, free, "dropped idle warm thread copies to keep the state disk's reserve");
            return Ok(());
        }
        warn!(removed, needed, free, reserve = self.reserve, "the state disk is low: refusing to write thread data");
        Err(ThreadError::DiskLow { needed, free, reserve: self.reserve })
    }

    /// Takes the thread for one call. Fails at once if another call holds
    /// it; waits briefly while the collector does (housekeeping must never
    /// show as "busy").
    pub async fn lock(&self, key: &ThreadKey) -> Result<ThreadLock, ThreadError> {
        self.locks.for_call(key, lock::COLLECTOR_WAIT).await.ok_or(ThreadError::Busy)
    }

    fn dir(&self, key: &ThreadKey) -> PathBuf {
        self.cache.join(key.rel())
    }

    /// The live manifest (`None` when absent or past retention) and the
    /// stored object's version (set whenever the object exists: the next
    /// publish must replace exactly that).
    async fn manifest(&self, key: &ThreadKey) -> Result<(Option<Manifest>, Option<store::Version>), ThreadError> {
        let Some((bytes, version)) = self.store.get_versioned(&key.manifest_key()).await.map_err(io_err("reading the thread manifest"))? else {
            return Ok((None, None));
        };
        let m = Manifest::parse(&bytes, key).map_err(|e| ThreadError::Io { step: "parsing the thread manifest", source: io::Error::other(e) })?;
        // Past its retention the thread is gone, whether or not the collector ran.
        Ok(((!m.expired(unix_now())).then_some(m), Some(version)))
    }

    /// Refuses to create `key` when its ApiKey keeps `max` live threads.
    /// Listing the key's thread folders is enough below the limit; at it,
    /// deleted (tombstoned) and expired threads are told apart by reading
    /// manifests, stopping as soon as `max` live ones are found.
    async fn check_room(&self, key: &ThreadKey, max: u32) -> Result<(), ThreadError> {
        let folders = self.store.list_folders(&key.key_prefix()).await.map_err(io_err("listing the key's threads"))?;
        let others: Vec<&String> = folders.iter().filter(|f| **f != key.thread_id).collect();
        if others.len() < max as usize {
            return Ok(());
        }
        let mut live = 0u32;
        for id in others {
            let Ok(other) = ThreadKey::new(&key.namespace, &key.key_name, id) else { continue };
            if self.manifest(&other).await?.0.is_some() {
                live += 1;
                if live >= max {
                    return Err(ThreadError::Limit { max });
                }
            }
        }
        Ok(())
    }

    /// Publishes `manifest` over exactly the version the call started from.
    async fn publish(&self, restored: &Restored, manifest: &Manifest) -> Result<(), ThreadError> {
        let body = encode(manifest)?;
        let key = restored.options.key.manifest_key();
        match self.store.put_if(&key, body, restored.published.clone()).await.map_err(io_err("publishing the thread manifest"))? {
            true => Ok(()),
            false => Err(ThreadError::Conflict),
        }
    }

    /// Refreshes the warm copy's `usedAt` (minute granularity: it only
    /// drives the idle-copy collector, so most calls write nothing).
    fn touch_warm(&self, restored: &Restored) {
        if unix_now().saturating_sub(restored.warm_used_at) >= 60 {
            let id = restored.manifest.as_ref().map_or("", |m| m.id.as_str());
            // A failure only makes the copy look older than it is.
            let _ = self.write_warm(&restored.options.key, id);
        }
    }

    fn read_warm(&self, key: &ThreadKey) -> Option<Warm> {
        let text = std::fs::read(self.dir(key).join("warm.json")).ok()?;
        serde_json::from_slice(&text).ok()
    }

    fn write_warm(&self, key: &ThreadKey, manifest_id: &str) -> io::Result<()> {
        let warm = Warm { manifest_id: manifest_id.into(), boot_id: self.boot_id.clone(), used_at: unix_now() };
        std::fs::write(self.dir(key).join("warm.json"), serde_json::to_vec(&warm).map_err(io::Error::other)?)
    }

    fn forget_warm(&self, key: &ThreadKey) -> io::Result<()> {
        match std::fs::remove_file(self.dir(key).join("warm.json")) {
            Err(e) if e.kind() != io::ErrorKind::NotFound => Err(e),
            _ => Ok(()),
        }
    }

    /// Makes the warm copy match the published state (fast when it already does).
    pub async fn restore(&self, options: ThreadOptions, lock: ThreadLock) -> Result<Restored, ThreadError> {
        let key = &options.key;
        let (manifest, published) = self.manifest(key).await?;
        if let (None, Some(max)) = (&manifest, options.max_threads) {
            self.check_room(key, max).await?;
        }
        let dir = self.dir(key);
        let state = dir.join("state");
        let want = manifest.as_ref().map_or("", |m| m.id.as_str());
        let warm = self.read_warm(key);
        let fresh = warm.as_ref().is_some_and(|w| w.manifest_id == want && w.boot_id == self.boot_id) && state.is_dir();
        let mut warm_used_at = warm.map_or(0, |w| w.used_at);
        if !fresh {
            self.rebuild(key, manifest.as_ref(), &state).await?;
            warm_used_at = unix_now();
        }
        Ok(Restored { options, state, manifest, published, warm_used_at, _lock: lock })
    }

    async fn rebuild(&self, key: &ThreadKey, manifest: Option<&Manifest>, state: &Path) -> Result<(), ThreadError> {
        let t0 = std::time::Instant::now();
        let dir = self.dir(key);
        mkdir_private(&dir).map_err(io_err("creating the thread cache"))?;
        self.forget_warm(key).map_err(io_err("invalidating the warm copy"))?;
        fresh_state(state).map_err(io_err("clearing the warm copy"))?;
        self.make_room(manifest.map_or(0, |m| m.bytes))?;
        let (mut fetch, mut unpack) = (std::time::Duration::ZERO, std::time::Duration::ZERO);
        for layer in manifest.map_or(&[][..], |m| &m.layers) {
            let t = std::time::Instant::now();
            let spool = self.spool.join(new_id());
            let fetched = self.store.fetch(&layer.key, &spool).await;
            fetch += t.elapsed();
            let t = std::time::Instant::now();
            let applied = match fetched {
                Ok(Some(file)) => {
                    let st = state.to_path_buf();
                    blocking("applying a thread layer", move || layer::apply(std::io::BufReader::with_capacity(1 << 20, std::fs::File::open(file)?), &st)).await
                }
                Ok(None) => Err(ThreadError::Io { step: "reading a thread layer", source: io::Error::other(format!("{} is missing", layer.key)) }),
                Err(e) => Err(ThreadError::Io { step: "reading a thread layer", source: e }),
            };
            let _ = std::fs::remove_file(&spool);
            applied?;
            unpack += t.elapsed();
        }
        tracing::debug!(thread = %key.rel(), fetch_us = fetch.as_micros() as u64, unpack_us = unpack.as_micros() as u64, total_us = t0.elapsed().as_micros() as u64, "thread restored from the store");
        self.write_warm(key, manifest.map_or("", |m| m.id.as_str())).map_err(io_err("marking the warm copy"))
    }

    /// Saves the diff in `upper` (written by the sandbox whose host ids are
    /// `ids`) as the thread's new state, a new version of it by `produced`:
    /// durable when this returns `Ok`. On error the previous state stays
    /// published.
    pub async fn save(&self, restored: &Restored, upper: &Path, ids: layer::IdMap, produced: Produced) -> Result<Saved, ThreadError> {
        self.save_measured(restored, upper, ids, None, produced).await
    }

    /// [`Threads::save`] of an upper directory whose size is known
    /// (`diff_bytes`; `None`: the whole filesystem of `upper`, a call's own tmpfs).
    async fn save_measured(&self, restored: &Restored, upper: &Path, ids: layer::IdMap, diff_bytes: Option<u64>, produced: Produced) -> Result<Saved, ThreadError> {
        let key = &restored.options.key;
        let spool = self.spool.join(new_id());
        let result = self.save_inner(restored, upper, ids, &spool, diff_bytes, produced).await;
        let _ = std::fs::remove_file(&spool);
        if result.is_err() {
            // The warm copy may be ahead of what is published: rebuild next time.
            let _ = self.forget_warm(key);
        }
        result
    }

// Long: the save's steps in order (diff, room, charge, layer, publish, warm mark), each a call; timing spans them.
    async fn save_inner(&self, restored: &Restored, upper: &Path, ids: layer::IdMap, spool: &Path, diff_bytes: Option<u64>, produced: Produced) -> Result<Saved, ThreadError> {
        let (key, state) = (&restored.options.key, restored.state.clone());
        let prev = restored.manifest.as_ref();
        let t0 = std::time::Instant::now();
        let unchanged = std::fs::read_dir(upper).map_err(io_err("reading the thread diff"))?.next().is_none();
        let retention_secs = restored.options.retention.map(|d| d.as_secs());
        if unchanged {
            if let Some(prev) = prev.filter(|p| !touch_due(p, retention_secs, unix_now())) {
                self.touch_warm(restored);
                return Ok(Saved { layer_bytes: 0, home_bytes: prev.bytes, skipped: 0 });
            }
        }
        if !unchanged {
            // The diff lives on its own tmpfs: what it uses bounds the save.
            let used = match diff_bytes {
                Some(b) => b,
                None => disk::used_bytes(upper).map_err(io_err("measuring the thread diff"))?,
            };
            self.make_room(disk::save_needs(used))?;
        }
        let (up, st, sp) = (upper.to_path_buf(), state.clone(), spool.to_path_buf());
        let delta = if unchanged {
            layer::Delta::default()
        } else {
            blocking("writing the thread diff", move || layer::write_diff(&up, &st, ids, std::io::BufWriter::new(std::fs::File::create(&sp)?))).await?
        };
        let t_diff = t0.elapsed();
        let old_bytes = prev.map_or(0, |m| m.bytes);
        // The delta is measured against the state the manifest describes;
        // a home charged below zero means the two disagree, and guessing
        // (clamping to 0) would let the thread outgrow its limit.
        let bytes = u64::try_from(old_bytes as i64 + delta.bytes).map_err(|_| ThreadError::Io {
            step: "accounting the thread's size",
            source: io::Error::other(format!("a charge of {old_bytes} bytes changed by {} is negative", delta.bytes)),
        })?;
        if bytes > restored.options.max_bytes {
            return Err(ThreadError::TooLarge { bytes, limit: restored.options.max_bytes });
        }
        let id = new_id();
        let mut layers = prev.map(|m| m.layers.clone()).unwrap_or_default();
        let mut layer_bytes = 0;
        if delta.entries > 0 {
            layer_bytes = self.store_layer(restored, &id, &mut layers, bytes, spool).await?;
            maybe_pause("layer-uploaded").await;
        }
        let t_layer = t0.elapsed();
        // A call that changed nothing adds no version; one creating the thread does.
        let version = (!unchanged || prev.is_none()).then_some(produced);
        let next = Manifest { id, layers, bytes, updated_at: unix_now(), retention_secs, ..Manifest::empty(0) };
        let manifest = history::advance(prev, next, version, restored.options.keep());
        match self.publish(restored, &manifest).await {
            // Nothing of this call is lost when it changed nothing.
            Err(ThreadError::Conflict) if unchanged => return Ok(Saved { layer_bytes: 0, home_bytes: old_bytes, skipped: 0 }),
            other => other?,
        }
        maybe_pause("manifest-published").await;
        self.write_warm(key, &manifest.id).map_err(io_err("marking the warm copy"))?;
        tracing::debug!(
            diff_us = t_diff.as_micros() as u64,
            layer_us = (t_layer - t_diff).as_micros() as u64,
            publish_us = (t0.elapsed() - t_layer).as_micros() as u64,
            layer_bytes,
            "thread saved"
        );
        // Layers a compaction replaced may still be named by a kept version
        // or a fork: the collector removes them once nothing does.
        Ok(Saved { layer_bytes, home_bytes: bytes, skipped: delta.skipped })
    }

    /// Applies the diff in `spool` to the warm copy and stores it as a new
    /// layer (or, when compaction is due, stores the whole state as the only
    /// layer). Appends to `layers`; returns the stored layer's size.
    async fn store_layer(&self, restored: &Restored, id: &str, layers: &mut Vec<LayerRef>, home_bytes: u64, spool: &Path) -> Result<u64, ThreadError> {
        let (key, state) = (&restored.options.key, restored.state.clone());
        // The warm copy moves first; until the new manifest is published and
        // the copy re-tagged, it is marked stale.
        self.forget_warm(key).map_err(io_err("invalidating the warm copy"))?;
        let layer_key = key.layer_key(id);
        let diff_bytes = std::fs::metadata(spool).map_err(io_err("sizing the layer"))?.len();
        let stored: u64 = layers.iter().map(|l| l.size).sum::<u64>() + diff_bytes;
        let reader = std::fs::File::open(spool).map_err(io_err("reading the thread diff"))?;
        let st = state.clone();
        let apply = blocking("applying the diff to the warm copy", move || layer::apply(std::io::BufReader::with_capacity(1 << 20, reader), &st));
        let size = if compaction_due(layers.len(), stored, home_bytes) {
            apply.await?;
            let sp = spool.to_path_buf();
            blocking("compacting the thread", move || layer::write_full(&state, std::io::BufWriter::new(std::fs::File::create(&sp)?))).await?;
            layers.clear();
            let size = std::fs::metadata(spool).map_err(io_err("sizing the layer"))?.len();
            self.store.put_file(&layer_key, spool).await.map_err(io_err("uploading the thread layer"))?;
            size
        } else {
            // The upload (fsync, or a network put) and the warm apply read
            // the same spool file; they overlap.
            let (applied, uploaded) = tokio::join!(apply, self.store.put_file(&layer_key, spool));
            applied?;
            uploaded.map_err(io_err("uploading the thread layer"))?;
            diff_bytes
        };
        layers.push(LayerRef { key: layer_key, size });
        Ok(size)
    }
}

/// What a collector pass removed.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct CollectReport {
    /// Threads past their retention.
    pub expired: u64,
    /// Leftover objects.
    pub orphans: u64,
    /// Idle warm copies on this node.
    pub warm_removed: u64,
}

/// A manifest as stored.
fn encode(m: &Manifest) -> Result<Bytes, ThreadError> {
    serde_json::to_vec(m).map(Bytes::from).map_err(|e| ThreadError::Io { step: "encoding the manifest", source: io::Error::other(e) })
}

async fn blocking<T: Send + 'static>(step: &'static str, f: impl FnOnce() -> io::Result<T> + Send + 'static) -> Result<T, ThreadError> {
    tokio::task::spawn_blocking(f).await.map_err(|e| ThreadError::Io { step, source: io::Error::other(e) })?.map_err(io_err(step))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn unchanged_calls_republish_only_when_the_last_use_record_is_stale() {
        let m = Manifest { updated_at: 10_000, retention_secs: Some(86_400), ..Manifest::empty(0) };
        assert!(!touch_due(&m, Some(86_400), 10_000 + 3_599), "within an hour of a 24h retention");
        assert!(touch_due(&m, Some(86_400), 10_000 + 3_600));
        assert!(touch_due(&m, Some(7 * 86_400), 10_001), "the Sandbox's retention changed");
        let forever = Manifest { retention_secs: None, ..m };
        assert!(!touch_due(&forever, None, u64::MAX), "a thread kept forever needs no last-use record");
    }

    async fn publish_raw(store: &dyn BlobStore, id: &str, m: &Manifest) {
        let key = ThreadKey::new("team", "agent", id).unwrap();
        assert!(store.put_if(&key.manifest_key(), serde_json::to_vec(m).unwrap().into(), None).await.unwrap());
    }

    #[tokio::test]
    async fn a_new_thread_is_refused_only_when_the_key_keeps_its_limit_of_live_threads() {
        let dir = tempfile::tempdir().unwrap();
        let store: Arc<dyn BlobStore> = Arc::new(store::DirStore::open(&dir.path().join("store")).unwrap());
        let threads = Threads::new(store.clone(), &dir.path().join("cache")).unwrap();
        let live = Manifest::empty(unix_now());
        publish_raw(&*store, "a", &live).await;
        publish_raw(&*store, "b", &live).await;
        publish_raw(&*store, "deleted", &Manifest::tombstone(unix_now())).await;
        publish_raw(&*store, "expired", &Manifest { updated_at: 0, retention_secs: Some(60), ..live.clone() }).await;
        let other_key = ThreadKey::new("team", "other", "x").unwrap();
        assert!(store.put_if(&other_key.manifest_key(), serde_json::to_vec(&live).unwrap().into(), None).await.unwrap());
        let new = ThreadKey::new("team", "agent", "new").unwrap();
        assert!(matches!(threads.check_room(&new, 2).await, Err(ThreadError::Limit { max: 2 })), "a and b are live");
        threads.check_room(&new, 3).await.expect("deleted, expired and another key's threads do not count");
        threads.check_room(&ThreadKey::new("team", "agent", "a").unwrap(), 2).await.expect("a thread never counts against itself");
        threads.check_room(&ThreadKey::new("team", "fresh", "t").unwrap(), 1).await.expect("a key without threads has room");
    }

    #[test]
    fn compaction_bounds_layers_and_rewritten_bytes() {
        assert!(!compaction_due(3, 30 << 20, 20 << 20));
        assert!(compaction_due(3, 50 << 20, 20 << 20), "rewrites doubled what a restore must read");
        assert!(compaction_due(MAX_LAYERS, 1, 1), "too many layers");
        assert!(!compaction_due(0, 3 << 20, 0), "small homes are never compacted for size alone");
    }
}
