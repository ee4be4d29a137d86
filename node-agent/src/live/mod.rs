//! Live sandboxes: a sandbox that stays up between calls, running the
//! processes its callers start (several at once, in the background, with
//! input, signals and terminals) until it is ended, its lifetime runs out
//! or its init dies. Built like an execution's sandbox — the same pool,
//! isolation, limits, network, mounts, connectors and thread home — and
//! counted with the node's executions for as long as it lives. Its home
//! (a thread) is saved when it ends; memory is not kept.
//!
//! ```text
//! LiveCreate ─► admit (a node slot) ─► resources ─► claim ─► go live ─► registry
//!                                                              │
//! LiveStart/Connect/Input/Signal/List ─► LiveSandbox ─► Driver ┘ (init spawns, reaps, reports)
//! LiveEnd / lifetime / init gone ─► kill all ─► save the home ─► release ─► teardown
//! ```

pub mod output;
pub mod process;

use std::collections::HashMap;
use std::collections::VecDeque;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::sync::{oneshot, watch, OwnedSemaphorePermit};
use tracing::{info, warn};
use warren_isolation::sandbox::rootfs::HOME;
use warren_isolation::wire::Spawn;

use crate::lifecycle::Resources;
use crate::sandbox::{Driver, Failure, Gone, Outcome, Teardown};
pub use process::{Process, Size, Start};

/// How long a write to a process's stdin may wait for it to read.
pub const INPUT_WAIT: Duration = Duration::from_secs(10);
/// Processes one live sandbox tracks at once (its pids limit bounds what
/// they start).
pub const MAX_PROCESSES: usize = 256;
/// How long connecting to a sandbox's port may take.
const DIAL_TIMEOUT: Duration = Duration::from_secs(5);
/// Longest argument list plus environment of one process, bytes.
const MAX_START_BYTES: usize = 1 << 20;

/// Why a live-sandbox call was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum LiveError {
    /// No live sandbox by that name runs on this node.
    #[error("no live sandbox by that name runs on this node")]
    NotFound,
    /// One by that name runs already.
    #[error("a live sandbox by that name runs already")]
    Exists,
    /// No process by that pid runs in it.
    #[error("no process {0} runs in this sandbox")]
    NoProcess(i32),
    /// Nothing listens on that port of the sandbox's loopback.
    #[error("nothing listens on port {0} in the sandbox")]
    NoListener(u16),
    /// It tracks [`MAX_PROCESSES`] already.
    #[error("the sandbox runs {MAX_PROCESSES} processes already")]
    TooManyProcesses,
    /// The request is malformed.
    #[error("{field}: {why}")]
    Invalid {
        /// The field.
        field: &'static str,
        /// What is wrong.
        why: String,
    },
    /// The process could not start (nothing of it ran).
    #[error("{0}")]
    StartFailed(String),
    /// The process takes no input (started without stdin, or stdin closed).
    #[error("the process's stdin is closed (start it with stdin)")]
    NoStdin,
    /// The process read none of its input for [`INPUT_WAIT`].
    #[error("the process does not read its stdin")]
    InputStalled,
    /// A resize of a process without a terminal.
    #[error("the process has no terminal")]
    NotATerminal,
    /// The sandbox ended meanwhile.
    #[error("the live sandbox has ended")]
    Gone,
    /// An OS call on the agent's side failed.
    #[error("{0}")]
    Io(String),
}

impl From<Gone> for LiveError {
    fn from(_: Gone) -> LiveError {
        LiveError::Gone
    }
}

/// How a live sandbox ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EndReport {
    /// Why it ended.
    pub reason: EndReason,
    /// Its home's save failed (the thread keeps its previous state).
    pub save_failed: Option<Failure>,
    /// CPU it used, µs.
    pub cpu_micros: u64,
}

/// Why a live sandbox ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum EndReason {
    /// Its caller ended it.
    Ended,
    /// Its lifetime ran out.
    Lifetime,
    /// Its init (or supervisor) died: the node killed it, or it was OOM-killed.
    Died,
}

impl EndReason {
    /// As the node's status names it.
    pub fn as_str(self) -> &'static str {
        match self {
            EndReason::Ended => "ended",
            EndReason::Lifetime => "lifetime",
            EndReason::Died => "died",
        }
    }
}

/// How long an ended sandbox stays in [`LiveSandboxes::ended`].
const ENDED_KEPT: Duration = Duration::from_secs(600);
/// Most ended sandboxes kept there.
const ENDED_MAX: usize = 256;
/// Process tags of Warren's own helpers (code contexts, file watchers),
/// which do not make a sandbox busy.
pub const HELPER_TAG: &str = "warren-";

/// The node's live sandboxes, by name (`<namespace>/<key>/<id>`).
#[derive(Default)]
pub struct LiveSandboxes {
    map: Mutex<HashMap<String, Arc<LiveSandbox>>>,
    /// Those that ended lately, oldest first: (name, why, when).
    ended: Mutex<VecDeque<(String, EndReason, std::time::Instant)>>,
}

/// A live sandbox as the node's status reports it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Summary {
    /// Its name.
    pub name: String,
    /// Since a call last reached it (zero while a stream of it is open).
    pub idle: Duration,
    /// Processes running that a caller started (not Warren's helpers).
    pub busy: u32,
}

impl LiveSandboxes {
    /// The live sandbox `name`, for a call: it is touched (not idle).
    pub fn get(&self, name: &str) -> Result<Arc<LiveSandbox>, LiveError> {
        let s = self.lock().get(name).cloned().ok_or(LiveError::NotFound)?;
        s.touch();
        Ok(s)
    }

    /// Every live sandbox, as the node's status reports them.
    pub fn summaries(&self) -> Vec<Summary> {
        let all: Vec<_> = self.lock().values().cloned().collect();
        all.iter().map(|s| Summary { name: s.name.clone(), idle: s.idle(), busy: s.busy() }).collect()
    }

    /// Those that ended in the last ten minutes, oldest first, and why.
    pub fn ended(&self) -> Vec<(String, EndReason)> {
        let mut ended = self.ended.lock().unwrap_or_else(|p| p.into_inner());
        while ended.front().is_some_and(|(_, _, at)| at.elapsed() > ENDED_KEPT) {
            ended.pop_front();
        }
        ended.iter().map(|(n, r, _)| (n.clone(), *r)).collect()
    }

    fn remember_end(&self, name: &str, reason: EndReason) {
        let mut ended = self.ended.lock().unwrap_or_else(|p| p.into_inner());
        if ended.len() >= ENDED_MAX {
            ended.pop_front();
        }
        ended.push_back((name.to_string(), reason, std::time::Instant::now()));
    }

    /// How many live.
    pub fn count(&self) -> usize {
        self.lock().len()
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<String, Arc<LiveSandbox>>> {
        self.map.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Ends every live sandbox (the agent is shutting down); their homes are saved.
    pub async fn end_all(&self) {
        let all: Vec<_> = self.lock().values().cloned().collect();
        futures_util::future::join_all(all.iter().map(|s| s.end())).await;
    }
}

/// One live sandbox.
pub struct LiveSandbox {
    /// Its name.
    pub name: String,
    driver: Driver,
    init_pid: i32,
    /// Its network namespace (ports are dialled inside it).
    netns: std::os::fd::OwnedFd,
    /// What every process starts with (Warren's, the image's, the request's).
    env: Vec<(String, String)>,
    processes: Arc<Mutex<HashMap<i32, Arc<Process>>>>,
    next_id: AtomicU64,
    /// When its lifetime ends.
    deadline: watch::Sender<tokio::time::Instant>,
    /// Set once it ended (after its home was saved).
    ended: watch::Sender<Option<EndReport>>,
    /// Asked to end.
    ending: watch::Sender<bool>,
    /// When a call last reached it.
    touched: Mutex<std::time::Instant>,
    /// Streams of it open now (a caller following a process, a port connection).
    attached: AtomicUsize,
    /// Its thread home, for forks.
    home: Option<Arc<crate::threads::LiveHome>>,
}

/// An open stream of a live sandbox: while one is held, the sandbox is not idle.
pub struct Attached(Arc<LiveSandbox>);

impl Drop for Attached {
    fn drop(&mut self) {
        self.0.touch();
        self.0.attached.fetch_sub(1, Ordering::AcqRel);
    }
}

/// What a live sandbox holds until it has ended: its node slot, its
/// resources (thread home, mounts, connectors) and its sandbox's teardown.
pub struct Held {
    /// The node slot.
    pub permit: OwnedSemaphorePermit,
    /// Its resources, prepared.
    pub resources: Resources,
    /// Resolves to its sandbox's teardown once the sandbox ended.
    pub teardown: oneshot::Receiver<Teardown>,
}

/// Registers a sandbox that went live and starts its life: it ends at
/// `lifetime`, when ended, or when its init dies; then its home is saved
/// and everything it holds released.
pub fn register(all: &Arc<LiveSandboxes>, name: String, driver: Driver, init_pid: i32, env: Vec<(String, String)>, lifetime: Duration, held: Held) -> Result<Arc<LiveSandbox>, (LiveError, Held)> {
    // Opened while init surely lives (its pid cannot have been reused).
    let netns = match warren_network::link::open_netns(init_pid) {
        Ok(ns) => ns,
        Err(e) => return Err((LiveError::Io(format!("opening the sandbox's network namespace: {e}")), held)),
    };
    let sandbox = Arc::new(LiveSandbox {
        name: name.clone(),
        driver,
        init_pid,
        netns,
        env,
        processes: Arc::default(),
        next_id: AtomicU64::new(1),
        deadline: watch::Sender::new(tokio::time::Instant::now() + lifetime),
        ended: watch::Sender::new(None),
        ending: watch::Sender::new(false),
        touched: Mutex::new(std::time::Instant::now()),
        attached: AtomicUsize::new(0),
        home: held.resources.live_home(),
    });
    {
        let mut map = all.lock();
        if map.contains_key(&name) {
            return Err((LiveError::Exists, held));
        }
        map.insert(name, sandbox.clone());
    }
    tokio::spawn(life(all.clone(), sandbox.clone(), held));
    Ok(sandbox)
}

/// Waits for the sandbox's end, then saves, releases and tears down.
async fn life(all: Arc<LiveSandboxes>, s: Arc<LiveSandbox>, held: Held) {
    let Held { permit, mut resources, teardown } = held;
    let reason = s.until_end().await;
    all.lock().remove(&s.name);
    all.remember_end(&s.name, reason);
    s.driver.end().await;
    let teardown = teardown.await;
    let cpu_micros = teardown.as_ref().ok().and_then(|t| t.usage()).map_or(0, |u| u.cpu_micros);
    let mut outcome = Outcome::default();
    resources.finish(&mut outcome).await;
    let report = EndReport { reason, save_failed: outcome.failure.clone(), cpu_micros };
    info!(sandbox = %s.name, reason = ?reason, save_failed = ?report.save_failed, cpu_us = cpu_micros, "live sandbox ended");
    s.ended.send_replace(Some(report));
    resources.release().await;
    match teardown {
        Ok(t) => t.run().await,
        Err(_) => warn!(sandbox = %s.name, "a live sandbox's driver vanished before its teardown"),
    }
    drop(permit);
}

impl LiveSandbox {
    fn touch(&self) {
        *self.touched.lock().unwrap_or_else(|p| p.into_inner()) = std::time::Instant::now();
    }

    /// Holds it attached (not idle) until the guard drops.
    pub fn attach(self: &Arc<Self>) -> Attached {
        self.attached.fetch_add(1, Ordering::AcqRel);
        Attached(self.clone())
    }

    /// Since a call last reached it; zero while a stream of it is open.
    pub fn idle(&self) -> Duration {
        match self.attached.load(Ordering::Acquire) {
            0 => self.touched.lock().unwrap_or_else(|p| p.into_inner()).elapsed(),
            _ => Duration::ZERO,
        }
    }

    /// Processes running that a caller started (not Warren's helpers).
    pub fn busy(&self) -> u32 {
        let helper = |p: &Process| p.start.tag.as_deref().is_some_and(|t| t.starts_with(HELPER_TAG));
        self.procs().values().filter(|p| !helper(p)).count() as u32
    }

    async fn until_end(&self) -> EndReason {
        let (mut deadline, mut ending) = (self.deadline.subscribe(), self.ending.subscribe());
        loop {
            let at = *deadline.borrow_and_update();
            if *ending.borrow_and_update() {
                return EndReason::Ended;
            }
            tokio::select! {
                () = tokio::time::sleep_until(at) => return EndReason::Lifetime,
                () = self.driver.gone() => return EndReason::Died,
                _ = deadline.changed() => {}
                _ = ending.changed() => {}
            }
        }
    }

    /// Ends it and waits until its home is saved.
    pub async fn end(&self) -> EndReport {
        self.ending.send_replace(true);
        let mut ended = self.ended.subscribe();
        loop {
            if let Some(r) = ended.borrow_and_update().clone() {
                return r;
            }
            if ended.changed().await.is_err() {
                return EndReport { reason: EndReason::Ended, save_failed: None, cpu_micros: 0 };
            }
        }
    }

    /// Its thread home, when it has one.
    pub fn home(&self) -> Option<&Arc<crate::threads::LiveHome>> {
        self.home.as_ref()
    }

    /// Sets when its lifetime ends (from now).
    pub fn set_lifetime(&self, lifetime: Duration) {
        self.deadline.send_replace(tokio::time::Instant::now() + lifetime);
    }

    /// The process `pid`.
    pub fn process(&self, pid: i32) -> Result<Arc<Process>, LiveError> {
        self.procs().get(&pid).cloned().ok_or(LiveError::NoProcess(pid))
    }

    /// Its running processes, by pid.
    pub fn processes(&self) -> Vec<Arc<Process>> {
        let mut all: Vec<_> = self.procs().values().cloned().collect();
        all.sort_by_key(|p| p.pid);
        all
    }

    fn procs(&self) -> std::sync::MutexGuard<'_, HashMap<i32, Arc<Process>>> {
        self.processes.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Starts a process; it runs until it exits or the sandbox ends.
    pub async fn start(&self, start: Start) -> Result<Arc<Process>, LiveError> {
        check(&start)?;
        if self.procs().len() >= MAX_PROCESSES {
            return Err(LiveError::TooManyProcesses);
        }
        let stdio = match start.pty {
            Some(size) => process::Stdio::pty(self.init_pid, size)?,
            None => process::Stdio::pipes(start.stdin)?,
        };
        let id = self.next_id.fetch_add(1, Ordering::Relaxed);
        let mut env = self.env.clone();
        env.extend(start.env.iter().cloned());
        if start.pty.is_some() && !env.iter().any(|(k, _)| k == "TERM") {
            env.push(("TERM".into(), "xterm-256color".into()));
        }
        warren_isolation::spec::dedupe_env(&mut env);
        let spawn = Spawn { id, argv: start.argv.clone(), env, cwd: start.cwd.clone().unwrap_or_else(|| HOME.to_string()), tty: start.pty.is_some() };
        let (theirs, ours) = stdio.split();
        let (pid, ended) = self.driver.spawn(spawn, theirs).await?.map_err(LiveError::StartFailed)?;
        let p = ours.started(id, pid, start);
        self.procs().insert(pid, p.clone());
        let (table, process) = (self.processes.clone(), p.clone());
        tokio::spawn(async move {
            let e = ended.await.unwrap_or(crate::sandbox::Ended { code: 128 + libc::SIGKILL, signal: libc::SIGKILL });
            // Gone from the list as it exits; its readers still get the rest.
            table.lock().unwrap_or_else(|p| p.into_inner()).remove(&process.pid);
            process.output.exit(e);
        });
        Ok(p)
    }

    /// A connection to `port` on the sandbox's own loopback: the socket is
    /// made inside its network namespace and connects to 127.0.0.1 only, so
    /// no port number or name can lead to the node, the agent or another
    /// sandbox.
    pub async fn dial(&self, port: u16) -> Result<tokio::net::TcpStream, LiveError> {
        if port == 0 {
            return Err(LiveError::Invalid { field: "port", why: "from 1 to 65535".into() });
        }
        let to = std::net::SocketAddr::from(([127, 0, 0, 1], port));
        let dialled = warren_network::link::in_netns(&self.netns, move || {
            let s = std::net::TcpStream::connect_timeout(&to, DIAL_TIMEOUT)?;
            s.set_nonblocking(true)?;
            Ok(s)
        })
        .await;
        match dialled {
            Ok(s) => tokio::net::TcpStream::from_std(s).map_err(|e| LiveError::Io(e.to_string())),
            Err(_) if self.driver.is_gone() => Err(LiveError::Gone),
            Err(_) => Err(LiveError::NoListener(port)),
        }
    }

    /// Sends `signal` to process `pid` (and what it started).
    pub async fn signal(&self, pid: i32, signal: i32) -> Result<(), LiveError> {
        if !warren_isolation::wire::LIVE_SIGNALS.contains(&signal) {
            return Err(LiveError::Invalid { field: "signal", why: format!("{signal} is not a signal a process may be sent") });
        }
        let p = self.process(pid)?;
        Ok(self.driver.signal(p.id, signal).await?)
    }
}

/// Checks a start: a program, bounded arguments and environment, an
/// absolute working directory, a terminal of a sane size.
fn check(s: &Start) -> Result<(), LiveError> {
    let invalid = |field, why: &str| Err(LiveError::Invalid { field, why: why.into() });
    if s.argv.first().is_none_or(|p| p.is_empty()) {
        return invalid("cmd", "required");
    }
    let bytes: usize = s.argv.iter().map(String::len).sum::<usize>() + s.env.iter().map(|(k, v)| k.len() + v.len() + 2).sum::<usize>();
    if bytes > MAX_START_BYTES {
        return invalid("args", "arguments and environment exceed 1 MiB");
    }
    if s.argv.iter().chain(s.env.iter().flat_map(|(k, v)| [k, v])).any(|a| a.contains('\0')) {
        return invalid("args", "a NUL byte");
    }
    if let Some((k, _)) = s.env.iter().find(|(k, _)| k.is_empty() || k.contains('=')) {
        return invalid("envs", &format!("{k:?} is not a variable name"));
    }
    if s.cwd.as_deref().is_some_and(|c| !c.starts_with('/') || c.contains('\0')) {
        return invalid("cwd", "an absolute path");
    }
    if let Some(size) = s.pty {
        if size.rows == 0 || size.cols == 0 || size.rows > 1000 || size.cols > 1000 {
            return invalid("pty.size", "rows and cols from 1 to 1000");
        }
    }
    Ok(())
}
