//! Warm pool: sandboxes prepared ahead of demand, per [`Shape`].
//!
//! Preparing costs two forks, seven namespaces, ~45 mounts and — the big one on
//! cgroup v1 — moving init into its cgroups (an RCU grace period, ~10 ms);
//! a warm interpreter adds its own start. All of that happens here, off the
//! request path; a request only claims a ready sandbox. One filler task per
//! shape refills sequentially, so a burst does not starve running programs
//! of CPU.
//!
//! Sized by demand: a shape's target starts at one sandbox, doubles (up to
//! `--pool-size`) each time a claim finds none ready, and halves when the
//! shape goes unclaimed for [`COOL_DOWN`]; a shape unclaimed for [`FORGET`]
//! is dropped, as is the least recently claimed one when a new shape needs
//! its place. The ready sandboxes' memory (their cgroups' charge, warm
//! interpreters included) stays under `--warm-pool-memory`: a filler over it
//! first takes an idle sandbox of the least recently claimed other shape,
//! else stops. A miss never waits for the pool: it prepares a cold sandbox.
//!
//! Idle means idle: a pooled sandbox runs image code before any call (its
//! warm interpreter's imports, within the sandbox's setup time limit),
//! charged to no key. What pooled sandboxes use before their calls is
//! counted as the pool's (and left out of the call's accounting); a ready
//! sandbox that uses more than [`IDLE_CPU_PER_CHECK`] between two sweeps
//! ([`SWEEP`] apart) is discarded and counted, and its shape is not kept
//! warm for [`QUIET`]: its calls start cold, where whatever the image's
//! modules do is the call's own.
//!
//! [`IDLE_CPU_PER_CHECK`]: crate::sandbox::IDLE_CPU_PER_CHECK

use std::collections::{HashMap, VecDeque};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use tracing::{debug, info_span, warn, Instrument};

use warren_isolation::spec::Limits;

use crate::sandbox::{prepare, Prepared, SandboxEnv, SandboxError, Shape};

/// Shapes kept warm at most; the least recently claimed gives way.
const MAX_SHAPES: usize = 8;
/// How long a shape may go unclaimed before its target halves.
const COOL_DOWN: Duration = Duration::from_secs(60);
/// How long a shape may go unclaimed before it is dropped (the shapes
/// warmed at start are kept at one sandbox instead).
const FORGET: Duration = Duration::from_secs(600);
/// How long a shutdown waits for fillers that are preparing a sandbox.
const FILLER_WAIT: Duration = Duration::from_secs(5);
/// How often ready sandboxes are checked for staying idle.
pub const SWEEP: Duration = Duration::from_secs(5);
/// How long a shape whose sandbox did not stay idle is not kept warm.
const QUIET: Duration = Duration::from_secs(600);

/// The pool.
#[derive(Clone)]
pub struct Pool {
    env: Arc<SandboxEnv>,
    /// Most sandboxes ready per shape (`--pool-size`; 0 disables pooling).
    max_per_shape: usize,
    /// Most memory the ready sandboxes hold together (`--warm-pool-memory`).
    memory_budget: u64,
    inner: Arc<Mutex<Inner>>,
}

#[derive(Default)]
struct Inner {
    shapes: HashMap<Shape, ShapeState>,
    closed: bool,
}

struct ShapeState {
    ready: VecDeque<Prepared>,
    filling: bool,
    target: usize,
    last_claim: Instant,
    /// When the target last halved.
    cooled: Instant,
    /// Warmed at start: never forgotten, never below one.
    pinned: bool,
    /// Not refilled before this: one of its sandboxes did not stay idle.
    quiet_until: Option<Instant>,
    /// The limits of its last call: what its next sandboxes wait under.
    limits: Option<Limits>,
}

impl ShapeState {
    fn quiet(&self) -> bool {
        self.quiet_until.is_some_and(|t| Instant::now() < t)
    }
}

impl Pool {
    /// A pool keeping up to `max_per_shape` sandboxes ready per shape within
    /// `memory_budget` bytes (0 disables pooling).
    pub fn new(env: Arc<SandboxEnv>, max_per_shape: usize, memory_budget: u64) -> Pool {
        Pool { env, max_per_shape, memory_budget, inner: Arc::default() }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Inner> {
        self.inner.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Sandboxes ready for a call, over every shape, and the memory they
    /// hold together (read from their cgroups after the lock is released,
    /// so a status call never delays a claim).
    pub fn ready(&self) -> (usize, u64) {
        let files: Vec<std::path::PathBuf> = self.lock().shapes.values().flat_map(|s| s.ready.iter().map(Prepared::memory_file)).collect();
        (files.len(), memory_of(&files))
    }

    /// Keeps `shape` warm from now on at the full size (the shapes a node
    /// serves from its start).
    pub fn warm(&self, shape: Shape) {
        let mut inner = self.lock();
        let max = self.max_per_shape;
        if let Some(state) = self.state(&mut inner, &shape) {
            state.pinned = true;
            state.target = max;
        }
        self.start_filler(&mut inner, shape);
    }

    /// A ready sandbox of `shape` for a call of `limits`, or — at once — a
    /// cold one made to `limits` when none is. The shape's next sandboxes
    /// wait under `limits` (see [`Pool::waiting_limits`]).
    pub async fn claim(&self, shape: Shape, limits: &Limits) -> Result<Prepared, SandboxError> {
        let mut stale = Vec::new();
        let found = {
            let mut inner = self.lock();
            let max = self.max_per_shape;
            let mut found = None;
            if let Some(state) = self.state(&mut inner, &shape) {
                state.last_claim = Instant::now();
                state.limits = Some(*limits);
                while let Some(mut p) = state.ready.pop_front() {
                    if p.is_alive() {
                        p.claim();
                        found = Some(p);
                        break;
                    }
                    stale.push(p);
                }
                if found.is_none() {
                    // Demand outran the pool: keep more of this shape.
                    state.target = (state.target * 2).clamp(1, max);
                }
            }
            // A hit is refilled once its program ended (`refill`): the
            // refill would otherwise take CPU from the very call it serves.
            if found.is_none() {
                self.start_filler(&mut inner, shape.clone());
            }
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
            None => prepare(&self.env, Shape { warm: None, ..shape }, limits).await,
        }
    }

    /// The limits a sandbox of `shape` waits under: its last call's, so a
    /// call of the same size (the common case: a Sandbox's calls share its
    /// resources) finds its cgroup and views already sized and writes
    /// nothing. A warm interpreter imports before any call, so a warm
    /// shape never waits under less CPU, memory or pids than the node's
    /// defaults (a call that asks for less lowers them when it claims).
    fn waiting_limits(&self, shape: &Shape, last: Option<Limits>) -> Limits {
        let defaults = self.env.idle_limits;
        match last {
            None => defaults,
            Some(l) if shape.warm.is_none() => l,
            Some(l) => Limits {
                cpu_millis: l.cpu_millis.max(defaults.cpu_millis),
                memory_bytes: l.memory_bytes.max(defaults.memory_bytes),
                pids: l.pids.max(defaults.pids),
                ..l
            },
        }
    }

    /// Refills `shape` after a call that took one of its sandboxes ended.
    pub fn refill(&self, shape: Shape) {
        let mut inner = self.lock();
        self.start_filler(&mut inner, shape);
    }

    /// The state of `shape`, made room for when new (the least recently
    /// claimed unpinned shape gives way); `None` when pooling is off, the
    /// pool closed, or every shape is pinned or filling.
    fn state<'a>(&self, inner: &'a mut Inner, shape: &Shape) -> Option<&'a mut ShapeState> {
        if self.max_per_shape == 0 || inner.closed {
            return None;
        }
        if !inner.shapes.contains_key(shape) {
            if inner.shapes.len() >= MAX_SHAPES {
                let victim = inner.shapes.iter().filter(|(_, s)| !s.pinned && !s.filling).min_by_key(|(_, s)| s.last_claim).map(|(k, _)| k.clone())?;
                let dropped = inner.shapes.remove(&victim).map(|s| s.ready).unwrap_or_default();
                tokio::spawn(async move {
                    for p in dropped {
                        p.discard().await;
                    }
                });
            }
            let state = ShapeState { ready: VecDeque::new(), filling: false, target: 1, last_claim: Instant::now(), cooled: Instant::now(), pinned: false, quiet_until: None, limits: None };
            inner.shapes.insert(shape.clone(), state);
        }
        inner.shapes.get_mut(shape)
    }

    fn start_filler(&self, inner: &mut Inner, shape: Shape) {
        let Some(state) = inner.shapes.get_mut(&shape) else { return };
        if inner.closed || state.filling {
            return;
        }
        state.filling = true;
        let pool = self.clone();
        tokio::spawn(async move { pool.fill(shape).await }.instrument(info_span!("pool_fill")));
    }

    // Long: one refill loop; each turn cools the target, checks the budget (possibly taking another shape's idle sandbox), prepares, and files the result.
    async fn fill(&self, shape: Shape) {
        loop {
            let (files, victim, limits) = {
                let mut inner = self.lock();
                let closed = inner.closed;
                let Some(state) = inner.shapes.get_mut(&shape) else { return };
                cool_down(state);
                if closed || state.ready.len() >= state.target || state.quiet() {
                    state.filling = false;
                    return;
                }
                let (mine, limits) = (state.last_claim, self.waiting_limits(&shape, state.limits));
                let files: Vec<std::path::PathBuf> = inner.shapes.values().flat_map(|s| s.ready.iter().map(Prepared::memory_file)).collect();
                // Only a shape claimed less recently gives way (two shapes
                // never take turns taking each other's sandboxes).
                let victim = inner
                    .shapes
                    .iter()
                    .filter(|(k, s)| **k != shape && !s.ready.is_empty() && s.last_claim < mine)
                    .min_by_key(|(_, s)| s.last_claim)
                    .map(|(k, _)| k.clone());
                (files, victim, limits)
            };
            if memory_of(&files) >= self.memory_budget {
                // Over budget: another shape's least needed idle sandbox
                // gives way, or this shape stops growing.
                let taken = victim.and_then(|v| self.lock().shapes.get_mut(&v).and_then(|s| s.ready.pop_back()));
                match taken {
                    Some(p) => {
                        debug!("warm pool over its memory budget: an idle sandbox of a less used shape gives way");
                        p.discard().await;
                    }
                    None => {
                        debug!("warm pool at its memory budget; not growing");
                        self.stop_filling(&shape);
                        return;
                    }
                }
            }
            match prepare(&self.env, shape.clone(), &limits).await {
                Ok(p) => {
                    let leftover = {
                        let mut inner = self.lock();
                        let closed = inner.closed;
                        match inner.shapes.get_mut(&shape) {
                            // Quiet: made cold while this one was prepared.
                            Some(state) if !closed && !state.quiet() => {
                                state.ready.push_back(p);
                                None
                            }
                            _ => Some(p),
                        }
                    };
                    if let Some(p) = leftover {
                        p.discard().await;
                        self.stop_filling(&shape);
                        return;
                    }
                }
                Err(e) => {
                    warn!(error = %e, "preparing a pooled sandbox failed");
                    self.stop_filling(&shape);
                    return;
                }
            }
        }
    }

    fn stop_filling(&self, shape: &Shape) {
        if let Some(state) = self.lock().shapes.get_mut(shape) {
            state.filling = false;
        }
    }

    /// Halves the targets of shapes unclaimed for [`COOL_DOWN`], drops the
    /// shapes unclaimed for [`FORGET`] and tears down what no longer fits
    /// (the agent's collector calls this now and then).
    pub async fn cool(&self) {
        let dropped: Vec<Prepared> = {
            let mut inner = self.lock();
            let forgotten: Vec<Shape> = inner.shapes.iter().filter(|(_, s)| !s.pinned && !s.filling && s.last_claim.elapsed() >= FORGET).map(|(k, _)| k.clone()).collect();
            let mut dropped: Vec<Prepared> = forgotten.iter().flat_map(|k| inner.shapes.remove(k).map(|s| s.ready).unwrap_or_default()).collect();
            for state in inner.shapes.values_mut() {
                cool_down(state);
                while state.ready.len() > state.target {
                    dropped.extend(state.ready.pop_back());
                }
            }
            dropped
        };
        for p in dropped {
            p.discard().await;
        }
    }

    /// Discards the ready sandboxes of every shape one of whose sandboxes
    /// did not stay idle since the last sweep (counted as the pool's), and
    /// keeps those shapes cold for a while.
    pub async fn sweep(&self) {
        let busy: Vec<Prepared> = {
            let mut inner = self.lock();
            let mut busy = Vec::new();
            for state in inner.shapes.values_mut() {
                // Every sandbox is checked (each check is also its count).
                let idle: Vec<bool> = state.ready.iter_mut().map(Prepared::stayed_idle).collect();
                if idle.contains(&false) {
                    // Its siblings run the same warm modules: they go too.
                    state.quiet_until = Some(Instant::now() + QUIET);
                    busy.extend(state.ready.drain(..));
                }
            }
            busy
        };
        for p in busy {
            warn!(sandbox = %p.id(), "a pooled sandbox used CPU while idle (a warm module left work running?); discarding it, its shape starts cold for a while");
            self.env.warm_starts.add_idle_discard();
            p.discard().await;
        }
    }

    /// Stops keeping sandboxes of the image `digest` and tears down those
    /// ready, so the image is no longer in use (before it is collected).
    pub async fn forget(&self, digest: &str) {
        let dropped: Vec<Prepared> = {
            let mut inner = self.lock();
            let shapes: Vec<Shape> = inner.shapes.keys().filter(|s| s.rootfs.digest() == Some(digest)).cloned().collect();
            shapes.iter().flat_map(|s| inner.shapes.remove(s).map(|s| s.ready).unwrap_or_default()).collect()
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
            inner.shapes.values_mut().flat_map(|s| s.ready.drain(..)).collect()
        };
        for p in all {
            p.discard().await;
        }
        // A filler preparing a sandbox right now discards it once it sees
        // the pool closed; wait for that (bounded), or the agent's parent
        // cgroups are not yet empty when it removes them at exit.
        let deadline = tokio::time::Instant::now() + FILLER_WAIT;
        while self.lock().shapes.values().any(|s| s.filling) && tokio::time::Instant::now() < deadline {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }
}

/// Halves the target of a shape unclaimed for [`COOL_DOWN`], at most once
/// per cool-down, never below one.
fn cool_down(state: &mut ShapeState) {
    if state.last_claim.elapsed() >= COOL_DOWN && state.cooled.elapsed() >= COOL_DOWN && state.target > 1 {
        state.target /= 2;
        state.cooled = Instant::now();
    }
}

/// What the cgroups' memory files say, summed (unreadable counts 0).
fn memory_of(files: &[std::path::PathBuf]) -> u64 {
    files.iter().map(|f| std::fs::read_to_string(f).ok().and_then(|s| s.trim().parse::<u64>().ok()).unwrap_or(0)).sum()
}
