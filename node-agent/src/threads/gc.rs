//! Deleting threads, and collecting what nothing names any more.
//!
//! Layers are shared — a later version names its predecessor's, a fork its
//! source's — so a layer is garbage only when no manifest of its ApiKey
//! names it (as a current layer or in the pool of kept versions). Only this
//! collector removes layers, one key at a time:
//! 1. it lists the key's objects, then reads every manifest of the key (a
//!    failed read or an unreadable manifest: nothing of the key goes this
//!    pass);
//! 2. then it lists the key's fork leases: while one younger than the grace
//!    exists nothing goes, because a fork copies names from one manifest to
//!    another and the scan may have read the target before the copy and
//!    the source after the source moved on;
//! 3. it removes the listed objects no manifest names that are older than
//!    the grace at the scan's start (a save publishes the layer it uploaded
//!    well within that), and — for a thread just deleted — its own unnamed
//!    objects at once (and an expired one's, when this pass buried it).
//!
//! Why no named layer is lost: a save or restore re-publishes names over
//! exactly the manifest it read (compare-and-swap), so those names were in
//! that manifest all along and the scan reads them. A fork writes its lease
//! before reading its source and publishes within [`FORK_DEADLINE`]; leases
//! live for the grace; a scan longer than [`SCAN_MAX`] removes nothing; and
//! the grace is longer than both together. So a fork that copies while a
//! scan runs has a lease the scan sees in step 2.

use std::collections::{BTreeMap, HashSet};
use std::time::{Instant, SystemTime};

use super::*;
pub(super) use super::versions::FORK_DEADLINE;

/// A key's pass that takes longer than this removes nothing.
pub(super) const SCAN_MAX: Duration = Duration::from_secs(600);
/// A deleted thread's objects go at once only when its key has at most
/// this many objects (the pass reads every manifest of the key); else the
/// collector removes them.
const PROMPT_SWEEP_MAX: usize = 20_000;

const _: () = assert!(ORPHAN_GRACE.as_secs() > FORK_DEADLINE.as_secs() + SCAN_MAX.as_secs());

impl Threads {
    /// Deletes a thread. Its manifest is first replaced by a tombstone
    /// (compare-and-swap, so a save racing on another node fails instead of
    /// being half-deleted); then what only it named goes.
    pub async fn delete(&self, key: &ThreadKey) -> Result<(), ThreadError> {
        let _lock = self.lock(key).await?;
        let _ = std::fs::remove_dir_all(self.dir(key));
        let (manifest, version) = self.manifest(key).await?;
        if manifest.is_none() {
            return Err(ThreadError::NotFound);
        }
        if !self.bury(key, version).await? {
            return Err(ThreadError::Busy);
        }
        info!(thread = %key.rel(), "thread deleted");
        // A failure here leaves the objects to the collector.
        if let Ok(objects) = self.store.list(&key.key_prefix()).await {
            if objects.len() <= PROMPT_SWEEP_MAX {
                self.collect_key(&key.namespace, &key.key_name, objects, Some(&key.thread_id), &mut CollectReport::default()).await;
            }
        }
        Ok(())
    }

    /// Replaces the manifest at `version` by a tombstone. `Ok(false)`: the
    /// thread changed meanwhile; nothing happened.
    pub(super) async fn bury(&self, key: &ThreadKey, version: Option<store::Version>) -> Result<bool, ThreadError> {
        let tomb = encode(&Manifest::tombstone(unix_now()))?;
        self.store.put_if(&key.manifest_key(), tomb, version).await.map_err(io_err("replacing the thread manifest"))
    }

    /// One collector pass: deletes threads past their retention, objects no
    /// manifest names, stale fork leases, and warm copies idle longer than
    /// `warm_idle`.
    pub async fn collect(&self, warm_idle: Duration) -> Result<CollectReport, ThreadError> {
        let now = unix_now();
        let objects = self.store.list("threads/").await.map_err(io_err("listing threads"))?;
        let mut by_key: BTreeMap<(String, String), Vec<store::Listed>> = BTreeMap::new();
        for o in objects {
            if let [_, ns, name, _] = o.key.splitn(4, '/').collect::<Vec<_>>()[..] {
                by_key.entry((ns.to_string(), name.to_string())).or_default().push(o);
            }
        }
        let mut report = CollectReport::default();
        for ((ns, name), objects) in by_key {
            self.collect_key(&ns, &name, objects, None, &mut report).await;
        }
        if let Ok(leases) = self.store.list("leases/").await {
            for l in leases.iter().filter(|l| Self::older_than_grace(l, SystemTime::now())) {
                let _ = self.store.delete(&l.key).await;
            }
        }
        report.warm_removed = self.collect_warm(warm_idle, now);
        Ok(report)
    }

    fn older_than_grace(o: &store::Listed, at: SystemTime) -> bool {
        at.duration_since(o.modified).is_ok_and(|age| age >= ORPHAN_GRACE)
    }

    /// What key `ns/name`'s manifests name, read one by one, and the ids of
    /// the threads it buried now (expired); `None` when a manifest could not
    /// be read (then nothing may go).
    async fn names_of_key(&self, ns: &str, name: &str, objects: &[store::Listed], report: &mut CollectReport) -> Option<(HashSet<String>, Vec<String>)> {
        let now = unix_now();
        let prefix = format!("threads/{ns}/{name}/");
        let ids: std::collections::BTreeSet<&str> = objects.iter().filter_map(|o| o.key.strip_prefix(&prefix)?.split('/').next()).collect();
        let (mut named, mut buried) = (HashSet::new(), Vec::new());
        for id in ids {
            // Not a folder Warren makes: left alone.
            let Ok(key) = ThreadKey::new(ns, name, id) else { continue };
            named.insert(key.manifest_key());
            let (m, version) = match self.store.get_versioned(&key.manifest_key()).await {
                Ok(Some((bytes, v))) => match Manifest::parse(&bytes, &key) {
                    Ok(m) => (m, v),
                    Err(e) => {
                        warn!(thread = %key.rel(), error = %e, "an unreadable thread manifest; nothing of its key is collected");
                        return None;
                    }
                },
                Ok(None) => continue,
                Err(_) => return None, // the store is unwell: try again next pass
            };
            if m.is_tombstone() {
                // No call restores for a day: nothing can still be about to
                // publish over this tombstone.
                if now.saturating_sub(m.updated_at) >= TOMBSTONE_KEEP.as_secs() {
                    let _ = self.store.delete(&key.manifest_key()).await;
                }
                continue;
            }
            if m.expired(now) {
                if let Some(_lock) = self.locks.for_collector(&key) {
                    if self.bury(&key, Some(version)).await.unwrap_or(false) {
                        report.expired += 1;
                        info!(thread = %key.rel(), "thread expired and was deleted");
                        buried.push(id.to_string());
                        continue;
                    }
                }
            }
            named.extend(m.all_layers().map(|l| l.key.clone()));
        }
        Some((named, buried))
    }

    /// The collector's pass over one key (see the module's steps). The
    /// unnamed objects of a thread deleted now (`deleted`, or buried by this
    /// pass at expiry) go whatever their age.
    pub(super) async fn collect_key(&self, ns: &str, name: &str, objects: Vec<store::Listed>, deleted: Option<&str>, report: &mut CollectReport) {
        let (started, scan_start) = (Instant::now(), SystemTime::now());
        let Some((named, mut gone)) = self.names_of_key(ns, name, &objects, report).await else { return };
        let Ok(leases) = self.store.list(&format!("leases/{ns}/{name}/")).await else { return };
        if leases.iter().any(|l| !Self::older_than_grace(l, SystemTime::now())) {
            tracing::debug!(key = %format!("{ns}/{name}"), "a fork is copying this key's names: nothing collected this pass");
            return;
        }
        if started.elapsed() > SCAN_MAX {
            warn!(key = %format!("{ns}/{name}"), "the key's collector pass took too long to trust: nothing collected");
            return;
        }
        gone.extend(deleted.map(str::to_string));
        let own: Vec<String> = gone.iter().map(|t| format!("threads/{ns}/{name}/{t}/")).collect();
        for o in objects.iter().filter(|o| !named.contains(&o.key)) {
            if own.iter().any(|p| o.key.starts_with(p)) || Self::older_than_grace(o, scan_start) {
                let _ = self.store.delete(&o.key).await;
                report.orphans += 1;
            }
        }
    }

    pub(super) fn collect_warm(&self, idle: Duration, now: u64) -> u64 {
        let mut removed = 0;
        let level = |p: &Path| std::fs::read_dir(p).into_iter().flatten().flatten().map(|e| e.path()).filter(|p| p.is_dir()).collect::<Vec<_>>();
        for ns in level(&self.cache).into_iter().filter(|p| !p.ends_with(".spool")) {
            for name in level(&ns) {
                for thread in level(&name) {
                    let (Some(n), Some(k), Some(t)) = (ns.file_name(), name.file_name(), thread.file_name()) else { continue };
                    let Ok(key) = ThreadKey::new(&n.to_string_lossy(), &k.to_string_lossy(), &t.to_string_lossy()) else { continue };
                    let Some(_lock) = self.locks.for_collector(&key) else { continue };
                    let used = self.read_warm(&key).map_or(0, |w| w.used_at);
                    if now.saturating_sub(used) >= idle.as_secs() {
                        let _ = std::fs::remove_dir_all(&thread);
                        removed += 1;
                    }
                }
            }
        }
        removed
    }
}

