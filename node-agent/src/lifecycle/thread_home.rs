//! A thread's home as a per-execution resource: restored and mounted before
//! the program, saved before the answer, unmounted after it.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Instant;

use tonic::async_trait;
use tracing::{debug, info, warn};
use warren_isolation::home::{ThreadHome, ThreadHomeSpec};
use warren_isolation::wire::{Go, Home};

use super::{Resource, SandboxView};
use crate::sandbox::{Failure, Outcome};
use crate::threads::layer::IdMap;
use crate::threads::{Kind, LiveHome, Produced, Restored, ThreadError, ThreadLock, ThreadOptions, Threads};

/// One call's use of a thread. Holds the thread's lock from admission until
/// the save is done.
pub struct ThreadHomeResource {
    threads: Arc<Threads>,
    work_root: PathBuf,
    claim: Option<(ThreadOptions, ThreadLock)>,
    restored: Option<Restored>,
    mounted: Option<Mounted>,
    /// The execution's trace id, recorded with the version it saves.
    trace_id: String,
}

struct Mounted {
    home: ThreadHome,
    work: PathBuf,
    ids: IdMap,
}

impl ThreadHomeResource {
    /// A resource for the thread `options` names, locked by `lock`; `work_root`
    /// holds the per-sandbox overlay work dirs.
    pub fn new(threads: Arc<Threads>, work_root: PathBuf, options: ThreadOptions, lock: ThreadLock) -> ThreadHomeResource {
        ThreadHomeResource { threads, work_root, claim: Some((options, lock)), restored: None, mounted: None, trace_id: String::new() }
    }

    fn mount(&self, sandbox: &SandboxView<'_>, r: &Restored) -> std::io::Result<Mounted> {
        let userns = sandbox.userns.ok_or_else(|| std::io::Error::other("the sandbox's user namespace is unknown"))?;
        let work = self.work_root.join(sandbox.id);
        std::fs::create_dir(&work)?;
        let mounted = ThreadHome::mount(&ThreadHomeSpec {
            state: &r.state,
            work: &work,
            target: &sandbox.home_target,
            userns,
            owner: sandbox.host_id + 1,
            bytes: sandbox.spec.limits.home_bytes,
        });
        match mounted {
            Ok(home) => Ok(Mounted { home, work, ids: IdMap { root: sandbox.host_id, user: sandbox.host_id + 1 } }),
            Err(e) => {
                let _ = std::fs::remove_dir(&work);
                Err(e)
            }
        }
    }

    /// Saves what the program left in its home. A failed save fails the call
    /// and keeps the previous state. The home stays mounted (released after
    /// the answer) unless the diff has to be applied to the warm copy under it.
    async fn save(threads: &Threads, r: &Restored, m: &mut Mounted, outcome: &mut Outcome, trace_id: String) {
        let upper = m.home.upper();
        let changed = std::fs::read_dir(&upper).map_or(true, |mut d| d.next().is_some());
        let unmounted = if changed { m.home.unmount_view() } else { Ok(()) };
        let saved = match unmounted {
            Ok(()) => threads.save(r, &upper, m.ids, Produced { trace_id, kind: Kind::Execution, exit: Some(outcome.exit_code) }).await,
            Err(e) => Err(ThreadError::Io { step: "unmounting the thread home", source: e }),
        };
        match saved {
            Ok(s) => debug!(thread = %r.options.key.rel(), layer_bytes = s.layer_bytes, home_bytes = s.home_bytes, skipped = s.skipped, "thread saved"),
            Err(e) => {
                warn!(thread = %r.options.key.rel(), error = %e, "saving the thread failed; its previous state is kept");
                outcome.failure = Some(match e {
                    ThreadError::TooLarge { .. } => Failure::ThreadTooLarge,
                    ThreadError::Conflict => Failure::ThreadConflict,
                    _ => Failure::ThreadSave,
                });
            }
        }
    }
}

#[async_trait]
impl Resource for ThreadHomeResource {
    /// Restores the thread into this node's warm copy (no sandbox needed).
    async fn acquire(&mut self) -> Result<(), Failure> {
        let Some((options, lock)) = self.claim.take() else { return Err(Failure::ThreadMount) };
        let thread = options.key.rel();
        let restored = self.threads.restore(options, lock).await.map_err(|e| match e {
            ThreadError::Limit { .. } => {
                info!(thread = %thread, error = %e, "a new thread over the key's limit; nothing ran");
                Failure::ThreadLimit
            }
            e => {
                warn!(thread = %thread, error = %e, "restoring the thread failed; nothing ran");
                Failure::ThreadMount
            }
        })?;
        self.restored = Some(restored);
        Ok(())
    }

    /// Mounts the warm copy as the sandbox's home.
    async fn prepare(&mut self, sandbox: &SandboxView<'_>) -> Result<(), Failure> {
        let Some(restored) = &self.restored else { return Err(Failure::ThreadMount) };
        let t = Instant::now();
        let mounted = self.mount(sandbox, restored).map_err(|e| {
            warn!(execution_id = %sandbox.spec.id, error = %e, "mounting the thread home failed; nothing ran");
            Failure::ThreadMount
        })?;
        debug!(execution_id = %sandbox.spec.id, mount_us = t.elapsed().as_micros() as u64, "thread home mounted");
        self.mounted = Some(mounted);
        self.trace_id = sandbox.spec.id.clone();
        Ok(())
    }

    fn shape(&self, go: &mut Go) {
        go.home = Home::Mounted;
    }

    async fn finish(&mut self, outcome: &mut Outcome) {
        let (Some(r), Some(m)) = (self.restored.take(), self.mounted.as_mut()) else { return };
        // A program that never started changed nothing worth a save.
        if !(outcome.exit_code == -1 && outcome.failure.is_some()) {
            Self::save(&self.threads, &r, m, outcome, std::mem::take(&mut self.trace_id)).await;
        }
        // Dropping `r` frees the thread for its next call now. Its old home
        // is unmounted after the answer (that costs an RCU grace period or
        // two); nothing uses it any more, so a next call changing the warm
        // copy under it meanwhile is harmless.
    }

    /// Made only when a sandbox goes live (a plain call never asks).
    fn live_home(&self) -> Option<Arc<LiveHome>> {
        let (r, m) = (self.restored.as_ref()?, self.mounted.as_ref()?);
        Some(Arc::new(LiveHome { base: r.base(), upper: m.home.upper(), ids: m.ids }))
    }

    async fn release(self: Box<Self>) {
        let this = *self;
        drop(this.restored);
        if let Some(m) = this.mounted {
            if let Err(e) = m.home.release() {
                warn!(error = %e, "unmounting a thread home failed");
            }
            let _ = std::fs::remove_dir(&m.work);
        }
    }
}
