//! Warm pool: sandboxes prepared ahead of demand, per [`Shape`].
//!
//! Preparing costs an exec, seven namespaces, ~30 mounts and — the big one on
//! cgroup v1 — moving init into its cgroups (an RCU grace period, ~10 ms).
//! All of that happens here, off the request path; a request only claims a
//! ready sandbox. One filler task per shape refills sequentially, so a burst
//! does not starve running programs of CPU.

use std::collections::{HashMap, VecDeque};
use std::sync::{Arc, Mutex};

use tracing::{info_span, warn, Instrument};

use crate::sandbox::{prepare, Prepared, SandboxEnv, SandboxError, Shape};

/// Shapes kept warm at most; requests of further shapes are prepared on demand.
const MAX_SHAPES: usize = 8;
/// How long a shutdown waits for fillers that are preparing a sandbox.
const FILLER_WAIT: std::time::Duration = std::time::Duration::from_secs(5);

/// The pool.
#[derive(Clone)]
pub struct Pool {
    env: Arc<SandboxEnv>,
    target: usize,
    inner: Arc<Mutex<Inner>>,
}

#[derive(Default)]
struct Inner {
    ready: HashMap<Shape, VecDeque<Prepared>>,
    filling: HashMap<Shape, bool>,
    closed: bool,
}

impl Pool {
    /// A pool keeping `target` sandboxes ready per shape (0 disables pooling).
    pub fn new(env: Arc<SandboxEnv>, target: usize) -> Pool {
        Pool { env, target, inner: Arc::default() }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Inner> {
        self.inner.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Sandboxes ready for a call, over every shape, and the memory they
    /// hold together (read from their cgroups after the lock is released,
    /// so a status call never delays a claim).
    pub fn ready(&self) -> (usize, u64) {
        let files: Vec<std::path::PathBuf> = self.lock().ready.values().flatten().map(Prepared::memory_file).collect();
        let read = |f: &std::path::PathBuf| std::fs::read_to_string(f).ok().and_then(|s| s.trim().parse::<u64>().ok()).unwrap_or(0);
        (files.len(), files.iter().map(read).sum())
    }

    /// Starts filling the pool for `shape`.
    pub fn warm(&self, shape: Shape) {
        let mut inner = self.lock();
        self.start_filler(&mut inner, shape);
    }

    /// A ready sandbox of `shape`, or a freshly prepared one when none is.
    pub async fn claim(&self, shape: Shape) -> Result<Prepared, SandboxError> {
        let mut stale = Vec::new();
        let found = {
            let mut inner = self.lock();
            let mut found = None;
            if let Some(queue) = inner.ready.get_mut(&shape) {
                while let Some(mut p) = queue.pop_front() {
                    if p.is_alive() {
                        found = Some(p);
                        break;
                    }
                    stale.push(p);
                }
            }
            self.start_filler(&mut inner, shape.clone());
            found
        };
        for p in stale {
            warn!(sandbox = %p.id(), "pooled sandbox died while idle; discarding");
            tokio::spawn(p.discard());
        }
        match found {
            Some(p) => Ok(p),
            // A miss starts cold: an interpreter started now would cost the
            // call what a cold start costs, and more.
            None => prepare(&self.env, Shape { warm: None, ..shape }).await,
        }
    }

    fn start_filler(&self, inner: &mut Inner, shape: Shape) {
        if self.target == 0 || inner.closed || inner.filling.get(&shape) == Some(&true) {
            return;
        }
        if !inner.ready.contains_key(&shape) && inner.ready.len() >= MAX_SHAPES {
            return;
        }
        inner.ready.entry(shape.clone()).or_default();
        inner.filling.insert(shape.clone(), true);
        let pool = self.clone();
        tokio::spawn(async move { pool.fill(shape).await }.instrument(info_span!("pool_fill")));
    }

    async fn fill(&self, shape: Shape) {
        loop {
            {
                let mut inner = self.lock();
                let have = inner.ready.get(&shape).map_or(0, VecDeque::len);
                if inner.closed || have >= self.target {
                    inner.filling.insert(shape.clone(), false);
                    return;
                }
            }
            match prepare(&self.env, shape.clone()).await {
                Ok(p) => {
                    let leftover = {
                        let mut inner = self.lock();
                        if inner.closed { Some(p) } else {
                            inner.ready.entry(shape.clone()).or_default().push_back(p);
                            None
                        }
                    };
                    if let Some(p) = leftover {
                        p.discard().await;
                    }
                }
                Err(e) => {
                    warn!(error = %e, "preparing a pooled sandbox failed");
                    self.lock().filling.insert(shape.clone(), false);
                    return;
                }
            }
        }
    }

    /// Stops keeping sandboxes of the image `digest` and tears down those
    /// ready, so the image is no longer in use (before it is collected).
    pub async fn forget(&self, digest: &str) {
        let dropped: Vec<Prepared> = {
            let mut inner = self.lock();
            let shapes: Vec<Shape> = inner.ready.keys().filter(|s| s.rootfs.digest() == Some(digest)).cloned().collect();
            shapes
                .iter()
                .flat_map(|s| {
                    inner.filling.remove(s);
                    inner.ready.remove(s).unwrap_or_default()
                })
                .collect()
        };
        for p in dropped {
            p.discard().await;
        }
    }

    /// Stops refilling and tears down every ready sandbox.
    pub async fn shutdown(&self) {
        let all: Vec<Prepared> = {
            let mut inner = self.lock();
            inner.closed = true;
            inner.ready.drain().flat_map(|(_, q)| q).collect()
        };
        for p in all {
            p.discard().await;
        }
        // A filler preparing a sandbox right now discards it once it sees
        // the pool closed; wait for that (bounded), or the agent's parent
        // cgroups are not yet empty when it removes them at exit.
        let deadline = tokio::time::Instant::now() + FILLER_WAIT;
        while self.lock().filling.values().any(|f| *f) && tokio::time::Instant::now() < deadline {
            tokio::time::sleep(std::time::Duration::from_millis(20)).await;
        }
    }
}
