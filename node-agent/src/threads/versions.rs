//! Forks, restores and the history of a thread (see [`super::history`]).
//!
//! A fork writes one manifest per new thread naming the source's layers:
//! no layer bytes move. It reads the source without its lock, so it sees the
//! source's last saved state while a call may be running there. A restore
//! publishes an earlier version as a new one, over exactly the manifest it
//! read.

use std::time::Instant;

use super::history::{self, Version};
use super::*;

/// A fork publishes within this of writing its lease, or gives up (the
/// collector's safety rests on it; see [`super::gc`]).
pub const FORK_DEADLINE: Duration = Duration::from_secs(60);
/// Most threads one fork makes.
pub const MAX_FORKS: usize = 32;

/// The steps of a fork, where a test may stop it (a crash) or act.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Step {
    /// The lease is durable; nothing read yet.
    LeaseWritten,
    /// The source's manifest was read; nothing published yet.
    SourceRead,
    /// The fork with this index was published.
    Published(usize),
}

/// What a test runs at each [`Step`]; an error stops the fork there.
#[cfg(test)]
pub type Hook = Arc<dyn Fn(Step) -> futures_util::future::BoxFuture<'static, io::Result<()>> + Send + Sync>;

/// One version of a thread, as its history lists it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Listed {
    /// The version.
    pub version: Version,
    /// How many layers make it.
    pub layers: usize,
    /// It is the thread's current state.
    pub current: bool,
}

impl Threads {
    /// Runs the test hook at `step`, then the process-level pause point.
    async fn step(&self, step: Step) -> Result<(), ThreadError> {
        #[cfg(test)]
        if let Some(hook) = &self.hook {
            hook(step).await.map_err(io_err("a test's fork step"))?;
        }
        match step {
            Step::LeaseWritten => maybe_pause("fork-lease-written").await,
            Step::SourceRead => maybe_pause("fork-source-read").await,
            Step::Published(0) => maybe_pause("fork-first-published").await,
            Step::Published(_) => {}
        }
        Ok(())
    }

    /// Sets the test hook.
    #[cfg(test)]
    pub(super) fn with_hook(mut self, hook: Hook) -> Threads {
        self.hook = Some(hook);
        self
    }

    /// Makes each of `targets` (threads of the same key as `source.key`,
    /// none of them live) a copy of the source's version produced by `at`
    /// (a trace id; `None`: its current state). The targets get the
    /// source's options (retention, size, history). Should one fail, those
    /// made before it are deleted again; a crash may leave some of them,
    /// each whole.
    pub async fn fork(&self, source: &ThreadOptions, targets: &[ThreadKey], at: Option<&str>) -> Result<(), ThreadError> {
        let started = Instant::now();
        let lease = format!("{}{}", source.key.lease_prefix(), new_id());
        self.store.put_if(&lease, Bytes::from_static(b"{}"), None).await.map_err(io_err("writing the fork's lease"))?;
        self.step(Step::LeaseWritten).await?;
        let (m, _) = self.manifest(&source.key).await?;
        let m = m.ok_or(ThreadError::NotFound)?;
        let at = match at {
            Some(trace) => Some(m.history.iter().rposition(|v| !v.trace_id.is_empty() && v.trace_id == trace).ok_or(ThreadError::VersionNotFound)?),
            None => None,
        };
        self.step(Step::SourceRead).await?;
        self.publish_forks(source, &m, at, targets, started).await?;
        info!(source = %source.key.rel(), forks = targets.len(), layers = m.layers.len(), fork_us = started.elapsed().as_micros() as u64, "thread forked");
        Ok(())
    }

    /// Publishes a fork of `m` as each of `targets`; should one fail, those
    /// published before it are deleted again.
    async fn publish_forks(&self, source: &ThreadOptions, m: &Manifest, at: Option<usize>, targets: &[ThreadKey], started: Instant) -> Result<(), ThreadError> {
        let mut made: Vec<(&ThreadKey, store::Version)> = Vec::new();
        for (i, target) in targets.iter().enumerate() {
            match self.fork_one(source, m, at, target, started).await {
                Ok(v) => made.push((target, v)),
                Err(e) => {
                    for (t, v) in made {
                        let _ = self.bury(t, Some(v)).await;
                    }
                    return Err(e);
                }
            }
            self.step(Step::Published(i)).await?;
        }
        Ok(())
    }

    /// Forks a live sandbox's home as it is now: the thread it was
    /// restored from plus what changed since, as one new layer (stored
    /// under the first new thread), as a version by `produced`. The live
    /// sandbox and its thread are untouched. Like copying a running
    /// program's files, a file being written meanwhile may be caught
    /// midway.
    pub async fn fork_live(&self, home: &LiveHome, targets: &[ThreadKey], produced: Produced) -> Result<(), ThreadError> {
        let started = Instant::now();
        let source = &home.base.options;
        let first = targets.first().ok_or(ThreadError::Io { step: "forking the thread", source: io::Error::other("no new thread") })?;
        let lease = format!("{}{}", source.key.lease_prefix(), new_id());
        self.store.put_if(&lease, Bytes::from_static(b"{}"), None).await.map_err(io_err("writing the fork's lease"))?;
        self.step(Step::LeaseWritten).await?;
        let spool = self.spool.join(new_id());
        let m = self.live_version(home, first, &spool, produced).await;
        let _ = std::fs::remove_file(&spool);
        let m = m?;
        self.step(Step::SourceRead).await?;
        self.publish_forks(source, &m, None, targets, started).await?;
        info!(source = %source.key.rel(), forks = targets.len(), fork_us = started.elapsed().as_micros() as u64, "live sandbox's home forked");
        Ok(())
    }

    /// The manifest of `home` as it is now, its diff stored as a layer of `owner`.
    async fn live_version(&self, home: &LiveHome, owner: &ThreadKey, spool: &Path, produced: Produced) -> Result<Manifest, ThreadError> {
        let source = &home.base.options;
        let prev = home.base.manifest.as_ref();
        let used = disk::used_bytes(&home.upper).map_err(io_err("measuring the live home's diff"))?;
        self.make_room(disk::save_needs(used))?;
        let (up, st, sp, ids) = (home.upper.clone(), home.base.state.clone(), spool.to_path_buf(), home.ids);
        let delta = blocking("writing the live home's diff", move || layer::write_diff(&up, &st, ids, std::io::BufWriter::new(std::fs::File::create(&sp)?))).await?;
        let old_bytes = prev.map_or(0, |m| m.bytes);
        let bytes = u64::try_from(old_bytes as i64 + delta.bytes).map_err(|_| ThreadError::Io { step: "accounting the fork's size", source: io::Error::other("a negative size") })?;
        if bytes > source.max_bytes {
            return Err(ThreadError::TooLarge { bytes, limit: source.max_bytes });
        }
        let mut layers = prev.map(|m| m.layers.clone()).unwrap_or_default();
        if delta.entries > 0 {
            let key = owner.layer_key(&new_id());
            let size = std::fs::metadata(spool).map_err(io_err("sizing the layer"))?.len();
            self.store.put_file(&key, spool).await.map_err(io_err("uploading the fork's layer"))?;
            layers.push(LayerRef { key, size });
        }
        let now = unix_now();
        let next = Manifest { layers, bytes, updated_at: now, retention_secs: source.retention.map(|d| d.as_secs()), ..Manifest::empty(now) };
        Ok(history::advance(prev, next, Some(produced), source.keep()))
    }

    /// Publishes one fork of `m`; its stored version.
    async fn fork_one(&self, source: &ThreadOptions, m: &Manifest, at: Option<usize>, target: &ThreadKey, started: Instant) -> Result<store::Version, ThreadError> {
        let (existing, version) = self.manifest(target).await?;
        if existing.is_some() {
            return Err(ThreadError::Exists);
        }
        if let Some(max) = source.max_threads {
            self.check_room(target, max).await?;
        }
        let now = unix_now();
        let base = Manifest { updated_at: now, retention_secs: source.retention.map(|d| d.as_secs()), ..Manifest::empty(now) };
        let forked = history::fork(m, at, base, source.keep());
        if forked.bytes > source.max_bytes {
            return Err(ThreadError::TooLarge { bytes: forked.bytes, limit: source.max_bytes });
        }
        if started.elapsed() > FORK_DEADLINE {
            return Err(ThreadError::Io { step: "forking the thread", source: io::Error::other("the fork took longer than its deadline; retry") });
        }
        let body = encode(&forked)?;
        let key = target.manifest_key();
        if !self.store.put_if(&key, body, version).await.map_err(io_err("publishing the fork's manifest"))? {
            return Err(ThreadError::Exists);
        }
        // The version just written, for a rollback's compare-and-swap.
        let (_, written) = self.store.get_versioned(&key).await.map_err(io_err("reading the fork's manifest"))?.ok_or(ThreadError::Exists)?;
        Ok(written)
    }

    /// Sets the thread back to the version `at` (a trace id) produced, as a
    /// new version by `produced`: over exactly the manifest read, so a save
    /// racing it on another node fails instead of being undone.
    pub async fn restore_version(&self, options: &ThreadOptions, at: &str, produced: Produced) -> Result<Version, ThreadError> {
        let key = &options.key;
        let _lock = self.lock(key).await?;
        let (m, published) = self.manifest(key).await?;
        let m = m.ok_or(ThreadError::NotFound)?;
        let v = history::find(&m, at).ok_or(ThreadError::VersionNotFound)?.clone();
        let now = unix_now();
        let next = Manifest { layers: history::layers_of(&m, &v), bytes: v.bytes, updated_at: now, retention_secs: options.retention.map(|d| d.as_secs()), ..Manifest::empty(now) };
        let manifest = history::advance(Some(&m), next, Some(produced), options.keep());
        let body = encode(&manifest)?;
        if !self.store.put_if(&key.manifest_key(), body, published).await.map_err(io_err("publishing the thread manifest"))? {
            return Err(ThreadError::Conflict);
        }
        // The copy here is of the version before; the next call rebuilds it.
        let _ = self.forget_warm(key);
        info!(thread = %key.rel(), at, "thread restored to an earlier version");
        manifest.history.last().cloned().ok_or(ThreadError::NotFound)
    }

    /// The thread's versions, newest first.
    pub async fn history(&self, key: &ThreadKey) -> Result<Vec<Listed>, ThreadError> {
        let (m, _) = self.manifest(key).await?;
        let m = m.ok_or(ThreadError::NotFound)?;
        // A manifest from before histories: its state as the one version.
        let m = if m.history.is_empty() { history::advance(None, m.clone(), Some(Produced { trace_id: String::new(), kind: history::Kind::Execution, exit: None }), history::Keep { count: 1, max_age: None }) } else { m };
        let last = m.history.len().saturating_sub(1);
        Ok(m.history.iter().enumerate().rev().map(|(i, v)| Listed { version: v.clone(), layers: v.layers.len(), current: i == last }).collect())
    }
}

#[cfg(test)]
mod tests;
