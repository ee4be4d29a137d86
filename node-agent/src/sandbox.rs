//! One sandbox from the agent's side: prepared ahead of demand (supervisor
//! spawned, namespaces and mounts built, init waiting), then run once.

use std::os::fd::OwnedFd;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

use tokio::io::AsyncReadExt;
use tokio::net::unix::pipe;
use tokio::sync::mpsc;
use tracing::{debug, warn};
use warren_isolation::cgroup::recycle::Recycler;
use warren_isolation::cgroup::Cgroup;
use warren_isolation::launch::{Spawner, Supervisor, SupervisorFds};
use warren_isolation::spec::{ExecSpec, Limits};
use warren_isolation::wire::{Go, InitEvent, SupervisorCommand, SupervisorConfig, SupervisorEvent, View, WarmStart};

use warren_network::{NetPolicy, SandboxNet};

mod live;

pub use live::{Driver, Ended, Gone};

use crate::frames::Channel;
pub use crate::output::Event;
use crate::output::Queue;
use crate::slots::{Slot, Slots};

/// How long preparing a sandbox may take before it is abandoned.
/// Bounds a sandbox's setup, its warm interpreter's start and warm imports
/// included (image code the pool runs, charged to no key).
const PREPARE_TIMEOUT: Duration = Duration::from_secs(20);
/// Most CPU an idle sandbox may use between two of the pool's checks
/// before it is discarded as not idle.
pub const IDLE_CPU_PER_CHECK: Duration = Duration::from_millis(50);
/// Most bytes of one output read.
const CHUNK: usize = 64 * 1024;
/// Bytes of an execution's first output read: most programs print little,
/// and two zeroed 64 KiB buffers per call were a tenth of the agent's CPU
/// per call in its allocator and page faults; a read that fills its buffer
/// grows it (up to [`CHUNK`]).
const FIRST_CHUNK: usize = 4 * 1024;

/// Why a sandbox could not be prepared or run.
#[derive(Debug, thiserror::Error)]
pub enum SandboxError {
    /// No uid slot is free: the node is at capacity.
    #[error("no sandbox slot free")]
    NoSlot,
    /// cgroup setup failed.
    #[error(transparent)]
    Cgroup(#[from] warren_isolation::cgroup::CgroupError),
    /// An OS call on the agent side failed.
    #[error("{step}: {source}")]
    Io {
        /// What was being done.
        step: &'static str,
        /// Cause.
        #[source]
        source: std::io::Error,
    },
    /// The supervisor or init reported a failure.
    #[error("sandbox setup failed at {stage}: {message}")]
    Setup {
        /// Step that failed.
        stage: String,
        /// Cause.
        message: String,
    },
    /// Setup did not finish in time.
    #[error("sandbox setup timed out")]
    Timeout,
    /// The sandbox's network could not be set up.
    #[error(transparent)]
    Network(#[from] warren_network::node::NetError),
    /// An `Unrestricted` sandbox was asked of a node without networking.
    #[error("this node offers no sandbox networking")]
    NoNetwork,
}

fn io(step: &'static str) -> impl FnOnce(std::io::Error) -> SandboxError {
    move |source| SandboxError::Io { step, source }
}

/// Node-wide settings every sandbox shares.
pub struct SandboxEnv {
    /// Where sandbox cgroups go, and the emptied ones kept for reuse.
    pub groups: Arc<Recycler>,
    /// Starts supervisors (`warren-sandbox`).
    pub spawner: Spawner,
    /// Empty directory sandboxes mount their root on.
    pub mount_dir: PathBuf,
    /// The prepared `host` root every host sandbox binds read-only as `/`.
    pub host_root: PathBuf,
    /// Per-sandbox home dirs (`<id>/sandbox`), a shared mount so that what
    /// the agent mounts there propagates into the sandbox.
    pub homes_dir: PathBuf,
    /// Per-call scratch for thread homes (upper layers).
    pub work_dir: PathBuf,
    /// Host uid/gid slots.
    pub slots: Slots,
    /// Limits a prepared (not yet claimed) sandbox runs under.
    pub idle_limits: Limits,
    /// How long a caller may take none of an execution's output before the
    /// execution is killed (see [`crate::output`]).
    pub output_stall: Duration,
    /// Sandbox networking (`Unrestricted`); `None` when the node has none.
    pub net: Option<Arc<warren_network::NodeNet>>,
    /// Calls warm interpreters served, and whether they keep failing to.
    pub warm_starts: Arc<crate::warm_counts::WarmCounts>,
    /// Warm modules already logged as failing (once each per agent).
    pub warm_failures_logged: std::sync::Mutex<std::collections::HashSet<String>>,
    /// The node's CPUs, handed to sandboxes in turn (their size's CPU count).
    pub cpus: Arc<crate::cpus::Cpus>,
}

/// The root filesystem a sandbox is built on.
#[derive(Debug, Clone)]
pub enum Rootfs {
    /// The node's own `/usr`, read-only (development).
    Host,
    /// A warm OCI image. Holding it keeps the image in use: the store's
    /// collector never removes it while any sandbox (pooled or running) has it.
    Image {
        /// Manifest digest (compared and hashed instead of the image).
        digest: Arc<str>,
        /// The image.
        image: Arc<warren_image::Image>,
    },
}

impl Rootfs {
    /// The root of a warm image.
    pub fn image(image: Arc<warren_image::Image>) -> Rootfs {
        Rootfs::Image { digest: image.digest().into(), image }
    }

    /// The image's digest; `None` for `host`.
    pub fn digest(&self) -> Option<&str> {
        match self {
            Rootfs::Host => None,
            Rootfs::Image { digest, .. } => Some(digest),
        }
    }
}

impl PartialEq for Rootfs {
    fn eq(&self, other: &Rootfs) -> bool {
        self.digest() == other.digest()
    }
}

impl Eq for Rootfs {}

impl std::hash::Hash for Rootfs {
    fn hash<H: std::hash::Hasher>(&self, state: &mut H) {
        self.digest().hash(state)
    }
}

/// What must match between a prepared sandbox and a request: the root, the
/// mounts' sizes and the network fixed when the sandbox is built (the home
/// is mounted at Go).
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Shape {
    /// `/tmp` size.
    pub tmp_bytes: u64,
    /// The root filesystem.
    pub rootfs: Rootfs,
    /// `Unrestricted` network under this policy; `None`: `Blocked`.
    pub network: Option<Arc<NetPolicy>>,
    /// The interpreter started ahead of the call; `None`: a cold start.
    pub warm: Option<Arc<WarmStart>>,
}

impl Shape {
    /// The shape a spec needs on `rootfs` with `network` (cold).
    pub fn of(limits: &Limits, rootfs: Rootfs, network: Option<Arc<NetPolicy>>) -> Shape {
        Shape { tmp_bytes: limits.tmp_bytes, rootfs, network, warm: None }
    }

    /// The same shape with `warm` started ahead of the call.
    pub fn warmed(self, warm: Option<WarmStart>) -> Shape {
        Shape { warm: warm.map(Arc::new), ..self }
    }
}

/// A sandbox whose init waits for its program.
pub struct Prepared {
    id: String,
    /// The supervisor; dropping it kills the sandbox.
    child: Supervisor,
    supervisor: Channel,
    init: Channel,
    stdout: pipe::Receiver,
    stderr: pipe::Receiver,
    cgroup: Cgroup,
    /// Where its cgroup goes back to when the sandbox is gone.
    groups: Arc<Recycler>,
    home_dir: PathBuf,
    /// The sandbox's user namespace, opened as soon as init exists (off
    /// the request path, and before its pid could ever be reused).
    userns: Option<OwnedFd>,
    slot: Slot,
    output_stall: Duration,
    /// Init's pid (host view); 0 until the supervisor reports it.
    init_pid: i32,
    /// The network of an `Unrestricted` sandbox.
    net: Option<SandboxNet>,
    /// The interpreter waiting in the sandbox, once init reported it ready.
    warm: Option<Arc<WarmStart>>,
    /// Modules the warm interpreter could not load: (module, why).
    warm_failed: Vec<(String, String)>,
    /// Counts the calls a warm interpreter served (the node's status).
    warm_starts: Arc<crate::warm_counts::WarmCounts>,
    /// The call asked for the waiting interpreter (set at Go).
    warm_asked: bool,
    /// CPU (µs) it had used while idle at its last check, once checked.
    idle_checked: Option<u64>,
    /// The size it tells its program (for the limits it was built with).
    view: View,
    /// The node's CPUs (a call of another size takes others).
    cpus: Arc<crate::cpus::Cpus>,
    /// Keeps the image in use while the sandbox exists.
    _rootfs: Rootfs,
}

/// How an execution ended: the exit contract (`warren_core::exit`), which
/// `warren-proto`'s edge puts on the wire.
pub use warren_core::exit::{Exit as Outcome, Failure};

fn pipe_pair() -> Result<(pipe::Receiver, OwnedFd), SandboxError> {
    let (r, w) = nix::unistd::pipe2(nix::fcntl::OFlag::O_CLOEXEC).map_err(|e| SandboxError::Io { step: "pipe", source: e.into() })?;
    let r = pipe::Receiver::from_owned_fd(r).map_err(io("pipe receiver"))?;
    Ok((r, w))
}

fn socket_pair() -> Result<(Channel, OwnedFd), SandboxError> {
    let (ours, theirs) = std::os::unix::net::UnixStream::pair().map_err(io("socketpair"))?;
    ours.set_nonblocking(true).map_err(io("socketpair"))?;
    let ours = tokio::net::UnixStream::from_std(ours).map_err(io("socketpair"))?;
    Ok((Channel::new(ours), OwnedFd::from(theirs)))
}

/// What [`start`] made: the sandbox's slot, directories, cgroup, and its
/// supervisor running with its channels.
struct Started {
    slot: Slot,
    id: String,
    home_dir: PathBuf,
    cgroup: Cgroup,
    child: Supervisor,
    supervisor: Channel,
    init: Channel,
    stdout: pipe::Receiver,
    stderr: pipe::Receiver,
}

/// The blocking part of building a sandbox — directories, the cgroup's
/// mkdirs and writes, the round trip to the spawner that forks the supervisor —
/// on a blocking thread: never on a runtime worker, where it would hold
/// up the answers of calls in flight (a refill starts as a call ends).
async fn start(env: &Arc<SandboxEnv>, limits: Limits) -> Result<Started, SandboxError> {
    let env = env.clone();
    tokio::task::spawn_blocking(move || start_blocking(&env, &limits)).await.map_err(|e| SandboxError::Io { step: "start", source: std::io::Error::other(e) })?
}

fn start_blocking(env: &SandboxEnv, limits: &Limits) -> Result<Started, SandboxError> {
    let slot = env.slots.acquire().ok_or(SandboxError::NoSlot)?;
    let id = format!("{}-{}", slot.index(), &warren_isolation::spec::new_execution_id()[4..]);
    let home_dir = env.homes_dir.join(&id);
    std::fs::create_dir_all(home_dir.join("sandbox")).map_err(io("create home dir"))?;
    for (dir, step) in [(data_dir_of(&home_dir), "create data dir"), (conn_dir_of(&home_dir), "create connectors dir")] {
        if let Err(e) = std::fs::create_dir(dir) {
            remove_home_dir(&home_dir);
            return Err(SandboxError::Io { step, source: e });
        }
    }
    let cgroup = match env.groups.take(&id, limits) {
        Ok(c) => c,
        Err(e) => {
            remove_home_dir(&home_dir);
            return Err(e.into());
        }
    };
    let undo = |cgroup: Cgroup| {
        let _ = env.groups.give_back(cgroup);
        remove_home_dir(&home_dir);
    };
    let channels = (|| Ok::<_, SandboxError>((socket_pair()?, socket_pair()?, pipe_pair()?, pipe_pair()?)))();
    let ((supervisor, sup_fd), (init, init_fd), (stdout, out_w), (stderr, err_w)) = match channels {
        Ok(c) => c,
        Err(e) => {
            undo(cgroup);
            return Err(e);
        }
    };
    let fds = SupervisorFds { supervisor: sup_fd, init: init_fd, stdout: out_w, stderr: err_w };
    let spawned = env.spawner.spawn(&fds);
    // Our copies of the child's ends must close now, or EOF never comes.
    drop(fds);
    match spawned {
        Ok(child) => Ok(Started { slot, id, home_dir, cgroup, child, supervisor, init, stdout, stderr }),
        Err(e) => {
            undo(cgroup);
            Err(SandboxError::Io { step: "spawn warren-sandbox", source: e })
        }
    }
}

/// Builds a sandbox up to "init waits for Go", sized to `limits` while it
/// waits (its cgroup's limits and its `/proc` views): the call it is made
/// for, or the calls its shape last served, so that a call of that size
/// writes nothing when it claims it (any call may still claim it: the
/// call's own limits are written then).
pub async fn prepare(env: &Arc<SandboxEnv>, shape: Shape, limits: &Limits) -> Result<Prepared, SandboxError> {
    let Started { slot, id, home_dir, cgroup, child, supervisor, init, stdout, stderr } = start(env, *limits).await?;
    let config = SupervisorConfig {
        id: id.clone(),
        cgroup_procs: cgroup.procs_files(),
        host_uid: slot.host_id(),
        host_gid: slot.host_id(),
        mount_dir: env.mount_dir.clone(),
        host_root: env.host_root.clone(),
        image_root: match &shape.rootfs {
            Rootfs::Host => None,
            Rootfs::Image { image, .. } => Some(image.root().to_path_buf()),
        },
        tmp_bytes: shape.tmp_bytes,
        home_dir: home_dir.clone(),
        data_dir: data_dir_of(&home_dir),
        conn_dir: conn_dir_of(&home_dir),
        warm: shape.warm.as_deref().cloned(),
        view: View { cpus: env.cpus.take(limits.cpu_millis), memory_bytes: limits.memory_bytes },
    };
    let output_stall = env.output_stall;
    let network = shape.network;
    let (warm, warm_starts) = (shape.warm, env.warm_starts.clone());
    let mut prepared = Prepared {
        id, child, supervisor, init, stdout, stderr, cgroup, groups: env.groups.clone(), home_dir, userns: None, slot, output_stall, init_pid: 0, net: None, warm, warm_failed: Vec::new(), warm_starts, warm_asked: false, idle_checked: None, view: config.view.clone(), cpus: env.cpus.clone(), _rootfs: shape.rootfs,
    };
    let ready = async {
        prepared.supervisor.send(&config).await.map_err(io("send config"))?;
        prepared.wait_ready().await?;
        if let Some(policy) = network {
            let net = env.net.as_ref().ok_or(SandboxError::NoNetwork)?;
            prepared.net = Some(net.setup(prepared.init_pid, policy).await?);
        }
        // Accounting starts here, not at the call: from now on the sandbox
        // only waits (init and whatever waits for the call are blocked), so
        // what the call reports is its program's, and the reset is off the
        // call's path. What setup and warm imports cost is the pool's.
        prepared.warm_starts.add_idle_cpu(prepared.cgroup.cpu_micros().unwrap_or(0));
        prepared.cgroup.reset_usage()?;
        Ok(())
    };
    let ready = tokio::time::timeout(PREPARE_TIMEOUT, ready).await.unwrap_or(Err(SandboxError::Timeout));
    match ready {
        Ok(()) => {
            log_warm_failures(env, &prepared.warm_failed);
            Ok(prepared)
        }
        Err(e) => {
            prepared.discard().await;
            Err(e)
        }
    }
}

/// Warns once per module that a Sandbox's warm module does not load (the
/// operator reports it on the Sandbox's status; single-machine mode has only
/// this log).
fn log_warm_failures(env: &SandboxEnv, failed: &[(String, String)]) {
    if failed.is_empty() {
        return;
    }
    let mut logged = env.warm_failures_logged.lock().unwrap_or_else(|p| p.into_inner());
    for (module, why) in failed {
        if logged.len() < 1024 && logged.insert(module.clone()) {
            warn!(%module, error = %why, "a warm module does not load; calls import it themselves");
        }
    }
}

impl Prepared {
    /// Where to read the memory the idle sandbox holds (its cgroup's charge).
    pub fn memory_file(&self) -> PathBuf {
        self.cgroup.memory_now_file()
    }

    /// Whether a warm interpreter waits in it, and the modules it could not
    /// load: (module, what the interpreter said).
    pub fn warm_state(&self) -> (bool, &[(String, String)]) {
        (self.warm.is_some(), &self.warm_failed)
    }

    /// Sandbox id (`<slot>-<random>`), also its cgroup name suffix.
    pub fn id(&self) -> &str {
        &self.id
    }

    /// Whether it stayed idle since its last check: at most
    /// [`IDLE_CPU_PER_CHECK`] of CPU since then (a waiting interpreter is
    /// blocked on its control socket and uses none; one whose image's warm
    /// module left a thread running does). The first check only starts the
    /// count (an interpreter's runtime may still settle just after it said
    /// ready). What it used is counted as the pool's. One read of an open
    /// file.
    pub fn stayed_idle(&mut self) -> bool {
        let Ok(used) = self.cgroup.cpu_micros() else { return false };
        let since = used.saturating_sub(self.idle_checked.unwrap_or(0));
        let judged = self.idle_checked.replace(used).is_some();
        self.warm_starts.add_idle_cpu(since);
        !judged || since <= IDLE_CPU_PER_CHECK.as_micros() as u64
    }

    /// Claims it for a call: what it used while idle is counted as the
    /// pool's and left out of the call's accounting.
    pub fn claim(&mut self) {
        if let Ok(used) = self.cgroup.cpu_micros() {
            self.warm_starts.add_idle_cpu(used.saturating_sub(self.idle_checked.unwrap_or(0)));
            self.cgroup.exclude_cpu(used);
        }
    }

    /// The size to tell a call with `limits`, when it is not the one the
    /// sandbox was built with (its CPUs are kept if their count fits).
    fn view_for(&self, limits: &Limits) -> Option<View> {
        let cpus_fit = self.cpus.fits(&self.view.cpus, limits.cpu_millis);
        if cpus_fit && self.view.memory_bytes == limits.memory_bytes {
            return None;
        }
        let cpus = if cpus_fit { self.view.cpus.clone() } else { self.cpus.take(limits.cpu_millis) };
        Some(View { cpus, memory_bytes: limits.memory_bytes })
    }

    /// False when the supervisor has exited (the sandbox is unusable).
    pub fn is_alive(&mut self) -> bool {
        !self.child.has_exited()
    }

    /// Whether its warm interpreter (if any) charges at most half of
    /// `memory_limit`: a heavier one (warm imports under a small limit)
    /// would leave the program too little, or fail the limit's write.
    pub fn warm_fits(&self, memory_limit: u64) -> bool {
        if self.warm.is_none() {
            return true;
        }
        let used = std::fs::read_to_string(self.cgroup.memory_now_file()).ok().and_then(|s| s.trim().parse::<u64>().ok());
        used.is_none_or(|used| used <= memory_limit / 2)
    }

    /// Where a thread's home must be mounted (host side) to appear at
    /// `/home/sandbox` inside.
    pub fn home_target(&self) -> PathBuf {
        self.home_dir.join("sandbox")
    }

    /// Host directory the sandbox sees as `/data`: a storage mount served
    /// on `<data_dir>/<name>` appears at `/data/<name>` inside.
    pub fn data_dir(&self) -> PathBuf {
        data_dir_of(&self.home_dir)
    }

    /// Host directory the sandbox sees as `/run/warren/connectors`.
    pub fn conn_dir(&self) -> PathBuf {
        conn_dir_of(&self.home_dir)
    }

    /// Init's pid (host view), for entering the sandbox's namespaces.
    pub fn init_pid(&self) -> i32 {
        self.init_pid
    }

    /// The names the sandbox's resolver answers itself (`Unrestricted`).
    pub fn dns_statics(&self) -> Option<warren_network::dns::Statics> {
        self.net.as_ref().and_then(|n| n.dns_statics().cloned())
    }

    /// The sandbox's user namespace (it maps the sandbox's ids).
    pub fn userns(&self) -> Option<&OwnedFd> {
        self.userns.as_ref()
    }

    /// Host uid/gid of root inside; uid 1000 inside is this + 1.
    pub fn host_id(&self) -> u32 {
        self.slot.host_id()
    }

    /// Waits for init's `Ready` and the supervisor's `Created` (sent first,
    /// but on another socket, so they may be read in either order).
    async fn wait_ready(&mut self) -> Result<(), SandboxError> {
        let mut ready = false;
        while !(ready && self.userns.is_some()) {
            tokio::select! {
                ev = self.init.recv::<InitEvent>(), if !ready => match ev.map_err(io("read init"))? {
                    Some(InitEvent::Ready { warm, failed }) => {
                        ready = true;
                        if !warm {
                            self.warm = None;
                        }
                        self.warm_failed = failed;
                    }
                    Some(InitEvent::Failed { stage, message }) => return Err(SandboxError::Setup { stage, message }),
                    other => return Err(SandboxError::Setup { stage: "init".into(), message: format!("unexpected {other:?}") }),
                },
                ev = self.supervisor.recv::<SupervisorEvent>(), if self.userns.is_none() => match ev.map_err(io("read supervisor"))? {
                    Some(SupervisorEvent::Created { init_pid }) if init_pid > 0 => {
                        // init is the supervisor's unreaped child: its pid is its own.
                        let ns = std::fs::File::open(format!("/proc/{init_pid}/ns/user")).map_err(io("open the sandbox's user namespace"))?;
                        self.userns = Some(ns.into());
                        self.init_pid = init_pid;
                    }
                    Some(SupervisorEvent::Failed { stage, message }) => return Err(SandboxError::Setup { stage, message }),
                    other => return Err(SandboxError::Setup { stage: "supervisor".into(), message: format!("unexpected {other:?}") }),
                },
            }
        }
        Ok(())
    }

    /// Tears down a sandbox that will not run: closing init's socket makes it
    /// exit, the supervisor follows, then the cgroup is removed.
    pub async fn discard(mut self) {
        let _ = self.supervisor.send(&SupervisorCommand::Kill).await;
        if tokio::time::timeout(Duration::from_secs(5), exited(&mut self.supervisor)).await.is_err() {
            let _ = self.child.kill();
            exited(&mut self.supervisor).await;
        }
        if let Some(net) = self.net.take() {
            net.teardown().await;
        }
        remove_home_dir(&self.home_dir);
        give_back_cgroup(self.groups, self.cgroup).await;
    }

    /// Runs `spec` in this sandbox, streaming events to `events`. Dropping the
    /// receiver of `events` kills the execution. Returns as soon as every
    /// process of the program is gone (init alone is left, about to exit)
    /// and its usage is read; the returned [`Teardown`] (reaping init and
    /// the supervisor, removing the cgroup) can run
    /// after the caller has its answer.
    pub async fn run(mut self, spec: &ExecSpec, mut go: Go, received: Instant, events: &mpsc::Sender<Event>) -> (Outcome, Teardown) {
        let mut out = Outcome::default();
        warren_isolation::spec::dedupe_env(&mut go.env);
        // The call may have gained startup variables since its shape was
        // chosen (a connector's): the warm interpreter serves it only if
        // it started with exactly the call's.
        go.warm = self.warm.as_ref().is_some_and(|w| w.interpreter == go.interpreter && w.env == warren_isolation::spec::startup_env(w.kind, &go.env));

        go.view = self.view_for(&spec.limits);
        let applied = self.cgroup.set_limits(&spec.limits);
        let sent = match applied {
            Ok(()) => self.init.send(&go).await.map_err(|e| e.to_string()),
            Err(e) => Err(e.to_string()),
        };
        if let Err(e) = sent {
            warn!(sandbox = %self.id, error = %e, "handing the program to the sandbox failed");
            out.exit_code = -1;
            out.failure = Some(Failure::Sandbox("handing over the program".into()));
            let _ = self.supervisor.send(&SupervisorCommand::Kill).await;
            return (out, Teardown(self));
        }
        let go_warm = go.warm;
        self.warm_asked = go_warm;
        let started = Instant::now();
        let mut queue = Queue::new(self.output_stall);
        queue.push(events, Event::Started { setup: started - received });
        let (ended, reported) = self.drive(spec, events, &mut queue, &mut out, started).await;
        // The sandbox is gone; what it printed still goes out, unless the
        // caller takes nothing for the stall time.
        if !queue.flush(events).await {
            out.cancelled = true;
        }
        out.wall = ended.duration_since(started);
        if !reported && out.failure.is_none() {
            if out.timed_out || out.cancelled {
                // init was killed before it could report; so was the program.
                out.exit_code = 128 + libc::SIGKILL;
                out.signal = libc::SIGKILL;
            } else {
                out.exit_code = -1;
                out.failure = Some(Failure::Sandbox("supervisor lost".into()));
            }
        }
        self.account(&mut out);
        if let Some(net) = &self.net {
            out.blocked = net.blocked();
        }
        debug!(warm_asked = go_warm, exit_us = (ended - started).as_micros() as u64, drained_us = ended.elapsed().as_micros() as u64, "phases");
        (out, Teardown(self))
    }

    /// Pumps output and control messages until the sandbox is gone. Returns
    /// when the program ended and whether init reported its exit status.
    ///
    /// No branch awaits the caller: output goes through `queue`, so the
    /// deadline and the cancel branches are polled whatever the caller does.
    // Long: one select loop; its branches (both output pipes, the queue's sends, the deadline, cancel) must be polled together.
    async fn drive(&mut self, spec: &ExecSpec, events: &mpsc::Sender<Event>, queue: &mut Queue, out: &mut Outcome, started: Instant) -> (Instant, bool) {
        let cap = spec.limits.max_output_bytes;
        let deadline = tokio::time::Instant::from_std(started + spec.timeout);
        let (mut out_open, mut err_open, mut sandbox_alive, mut init_open) = (true, true, true, true);
        let (mut out_seen, mut err_seen) = (0u64, 0u64);
        let mut killed = false;
        let mut reported = false;
        let mut ended: Option<Instant> = None;
        let mut out_buf = vec![0u8; FIRST_CHUNK];
        let mut err_buf = vec![0u8; FIRST_CHUNK];
        // Read every source to its end: select! picks ready branches at random,
        // so init's final report can still be buffered when the supervisor has
        // already said init is gone (init's socket reaches EOF right after).
        // Init reports only once every other process of the sandbox is
        // reaped: with the report and both pipes at their end the execution
        // is over, and init's own exit (the namespaces' teardown) is left to
        // the teardown.
        while (out_open || err_open || sandbox_alive || init_open) && !(reported && !out_open && !err_open) {
            // Once the kill is sent the pipes are read to their end whatever
            // the caller does (what does not fit is dropped), so a caller
            // that reads nothing cannot keep this loop from ending.
            let read = queue.has_room() || killed;
            tokio::select! {
                n = self.stdout.read(&mut out_buf), if out_open && read => {
                    match forward(n, &mut out_buf, cap, &mut out_seen, &mut out.stdout_truncated) {
                        Some(chunk) if !chunk.is_empty() => queue.push_or_drop(events, Event::Stdout(chunk), &mut out.stdout_truncated),
                        Some(_) => {}
                        None => out_open = false,
                    }
                }
                n = self.stderr.read(&mut err_buf), if err_open && read => {
                    match forward(n, &mut err_buf, cap, &mut err_seen, &mut out.stderr_truncated) {
                        Some(chunk) if !chunk.is_empty() => queue.push_or_drop(events, Event::Stderr(chunk), &mut out.stderr_truncated),
                        Some(_) => {}
                        None => err_open = false,
                    }
                }
                permit = events.reserve(), if queue.is_waiting() => match permit {
                    Ok(permit) => queue.send_one(permit),
                    // The caller left; the `closed` branch kills (if nothing did yet).
                    Err(_) => queue.clear(),
                },
                // The caller took nothing for too long: it will not read the
                // rest either, so the execution stops holding its slot.
                _ = tokio::time::sleep_until(queue.stall_deadline()), if queue.is_waiting() && !killed => {
                    killed = true;
                    out.cancelled = true;
                    warn!(sandbox = %self.id, "the caller stopped reading the output; killing the execution");
                    let _ = self.supervisor.send(&SupervisorCommand::Kill).await;
                }
                ev = self.init.recv::<InitEvent>(), if init_open => {
                    match ev {
                        Ok(Some(InitEvent::Exited { code, signal, warm })) => {
                            if self.warm_starts.record(self.warm_asked, warm) {
                                warn!(
                                    "warm interpreters keep starting their calls cold: the calls are served, without the warm start; \
                                     does this node forbid a process to attach to its child (an AppArmor or SELinux ptrace rule)?"
                                );
                            }
                            out.exit_code = code;
                            out.signal = signal;
                            reported = true;
                            ended.get_or_insert_with(Instant::now);
                        }
                        Ok(Some(InitEvent::Failed { stage, message })) => {
                            debug!(sandbox = %self.id, %stage, %message, "program did not start");
                            out.exit_code = -1;
                            out.failure = Some(Failure::Start(stage));
                        }
                        _ => init_open = false,
                    }
                }
                ev = self.supervisor.recv::<SupervisorEvent>(), if sandbox_alive => {
                    if !matches!(ev, Ok(Some(SupervisorEvent::InitExited { .. }))) {
                        // Supervisor died: make sure nothing of the sandbox survives.
                        self.cgroup.kill_all();
                    }
                    sandbox_alive = false;
                    ended.get_or_insert_with(Instant::now);
                }
                // Once the program has exited only teardown remains: no timeout.
                _ = tokio::time::sleep_until(deadline), if !killed && !reported => {
                    killed = true;
                    out.timed_out = true;
                    ended.get_or_insert_with(Instant::now);
                    let _ = self.supervisor.send(&SupervisorCommand::Kill).await;
                }
                _ = events.closed(), if !killed => {
                    killed = true;
                    out.cancelled = true;
                    let _ = self.supervisor.send(&SupervisorCommand::Kill).await;
                }
            }
        }
        (ended.unwrap_or_else(Instant::now), reported)
    }

    fn account(&mut self, out: &mut Outcome) {
        match self.cgroup.usage() {
            Ok(u) => {
                out.cpu_micros = u.cpu_micros;
                out.peak_memory_bytes = u.peak_memory_bytes;
                out.oom_killed = u.oom_kills > 0;
            }
            Err(e) => warn!(sandbox = %self.id, error = %e, "reading usage failed"),
        }
    }
}

/// What is left to do after an execution: reap the supervisor and remove the
/// cgroup. Owning it keeps the sandbox's uid slot taken.
pub struct Teardown(Prepared);

impl Teardown {
    /// The sandbox's CPU and memory use (since its accounting was last reset).
    pub fn usage(&self) -> Option<warren_isolation::cgroup::Usage> {
        self.0.usage()
    }

    /// Reaps and removes everything of the sandbox.
    pub async fn run(mut self) {
        let p = &mut self.0;
        let _ = p.supervisor.send(&SupervisorCommand::Kill).await;
        if tokio::time::timeout(Duration::from_secs(10), exited(&mut p.supervisor)).await.is_err() {
            let _ = p.child.kill();
            exited(&mut p.supervisor).await;
        }
        if let Some(net) = p.net.take() {
            net.teardown().await;
        }
        remove_home_dir(&p.home_dir);
        give_back_cgroup(self.0.groups, self.0.cgroup).await;
    }
}

/// Returns once the supervisor has exited: its control socket ends (it
/// closes at its exit, after it reaped init; its spawner reaps it). What it
/// still says is of no interest.
async fn exited(supervisor: &mut Channel) {
    while let Ok(Some(_)) = supervisor.recv::<SupervisorEvent>().await {}
}

/// Applies the per-stream cap: returns the part of a read to forward, or
/// `None` at end of stream. Bytes past the cap are read (so the writer never
/// blocks) and dropped.
/// The chunk of a read into `buf` to forward; a read that filled `buf`
/// grows it for the next (up to [`CHUNK`]).
fn forward(read: std::io::Result<usize>, buf: &mut Vec<u8>, cap: u64, seen: &mut u64, truncated: &mut bool) -> Option<Vec<u8>> {
    let n = match read {
        Ok(0) | Err(_) => return None,
        Ok(n) => n,
    };
    let room = cap.saturating_sub(*seen).min(n as u64) as usize;
    *seen = seen.saturating_add(n as u64);
    if room < n {
        *truncated = true;
    }
    let chunk = buf[..room].to_vec();
    if n == buf.len() && buf.len() < CHUNK {
        buf.resize((buf.len() * 4).min(CHUNK), 0);
    }
    Some(chunk)
}

/// Removes a sandbox's (empty) home dir. Never recursive: if something is
/// still mounted there, deleting through it would be wrong.
/// The sandbox's `/data` on the host: a sibling of its home dir under the
/// shared `homes` mount, so storage mounts made there propagate inside.
fn data_dir_of(home_dir: &std::path::Path) -> PathBuf {
    let mut d = home_dir.as_os_str().to_owned();
    d.push(".data");
    PathBuf::from(d)
}

/// The sandbox's `/run/warren/connectors` on the host (see [`data_dir_of`]).
fn conn_dir_of(home_dir: &std::path::Path) -> PathBuf {
    let mut d = home_dir.as_os_str().to_owned();
    d.push(".conn");
    PathBuf::from(d)
}

fn remove_home_dir(dir: &std::path::Path) {
    let _ = std::fs::remove_dir(data_dir_of(dir));
    let _ = std::fs::remove_dir(conn_dir_of(dir));
    let _ = std::fs::remove_dir(dir.join("sandbox"));
    if let Err(e) = std::fs::remove_dir(dir) {
        warn!(dir = %dir.display(), error = %e, "removing a sandbox home dir failed");
    }
}

/// Kills what is left in the sandbox's cgroup, then keeps the group for the
/// next sandbox or removes it ([`Recycler::give_back`]).
async fn give_back_cgroup(groups: Arc<Recycler>, cgroup: Cgroup) {
    let name = cgroup.name().to_string();
    let result = tokio::task::spawn_blocking(move || groups.give_back(cgroup)).await;
    if !matches!(result, Ok(Ok(()))) {
        warn!(cgroup = %name, "removing sandbox cgroup failed; it will be collected at the next start");
    }
}

#[cfg(test)]
mod tests {
    use super::forward;

    #[test]
    fn output_cap_truncates_and_keeps_draining() {
        let mut buf = b"0123456789".to_vec();
        let (mut seen, mut trunc) = (0, false);
        assert_eq!(forward(Ok(4), &mut buf, 6, &mut seen, &mut trunc), Some(b"0123".to_vec()));
        assert!(!trunc);
        assert_eq!(forward(Ok(4), &mut buf, 6, &mut seen, &mut trunc), Some(b"01".to_vec()));
        assert!(trunc);
        assert_eq!(buf.len(), 10, "a read that did not fill the buffer leaves it as it is");
        assert_eq!(forward(Ok(10), &mut buf, 6, &mut seen, &mut trunc), Some(Vec::new()));
        assert_eq!(seen, 18);
        assert_eq!(forward(Ok(0), &mut buf, 6, &mut seen, &mut trunc), None);
    }

    #[test]
    fn a_read_that_fills_the_buffer_grows_it_up_to_a_chunk() {
        let mut buf = vec![7u8; super::FIRST_CHUNK];
        let (mut seen, mut trunc) = (0, false);
        let first = forward(Ok(super::FIRST_CHUNK), &mut buf, u64::MAX, &mut seen, &mut trunc).unwrap();
        assert_eq!(first.len(), super::FIRST_CHUNK, "the whole read is forwarded");
        assert_eq!(buf.len(), super::FIRST_CHUNK * 4);
        for _ in 0..8 {
            let n = buf.len();
            forward(Ok(n), &mut buf, u64::MAX, &mut seen, &mut trunc);
        }
        assert_eq!(buf.len(), super::CHUNK, "never past CHUNK");
    }
}
