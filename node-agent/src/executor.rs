//! The execution service behind the gRPC adapter: validates a request against
//! the node, admits it, claims a warm sandbox and runs it.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Instant;

use tokio::sync::{mpsc, OwnedSemaphorePermit, Semaphore};
use tracing::{debug, warn};
use warren_isolation::features::Features;
use warren_isolation::home::{ThreadHome, ThreadHomeSpec};
use warren_isolation::spec::{ExecRequest, ExecSpec, Language, LanguageExt, NodePolicy, SpecError};
use warren_isolation::wire::{Go, Home};

use crate::pool::Pool;
use crate::sandbox::{Event, Failure, Outcome, Prepared, SandboxEnv, SandboxError, Shape};
use crate::threads::layer::IdMap;
use crate::threads::{Restored, ThreadError, ThreadLock, ThreadOptions, Threads};

/// Longest wait for a free slot before RESOURCE_EXHAUSTED.
const ADMIT_WAIT: std::time::Duration = std::time::Duration::from_millis(250);
const PATH: &str = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin";

/// Why an execution was refused or could not start. Mapped to a gRPC status
/// in exactly one place (`convert::to_status`).
#[derive(Debug, thiserror::Error)]
pub enum ExecError {
    /// Malformed request.
    #[error(transparent)]
    Invalid(#[from] SpecError),
    /// The language is not in the image.
    #[error("language {0} is not available in this sandbox image")]
    LanguageUnavailable(&'static str),
    /// The node lacks a required isolation feature.
    #[error("this node cannot isolate code: {0}")]
    MissingFeature(String),
    /// The node is at its concurrency limit.
    #[error("node is at its limit of {0} concurrent executions")]
    Busy(u32),
    /// The sandbox could not be set up.
    #[error(transparent)]
    Sandbox(#[from] SandboxError),
    /// Another execution holds the thread.
    #[error("thread is busy: another execution is using it")]
    ThreadBusy,
}

/// Admission for one execution: holding it counts as running.
pub struct Admission {
    spec: ExecSpec,
    thread: Option<(ThreadOptions, ThreadLock)>,
    _permit: OwnedSemaphorePermit,
}

/// Runs executions on this node.
pub struct Executor {
    env: Arc<SandboxEnv>,
    pool: Pool,
    policy: NodePolicy,
    interpreters: BTreeMap<Language, String>,
    features: Features,
    permits: Arc<Semaphore>,
    max_executions: u32,
    node_name: String,
    threads: Arc<Threads>,
}

/// Static settings of an executor.
pub struct ExecutorConfig {
    /// Limits and maxima.
    pub policy: NodePolicy,
    /// Concurrent executions accepted.
    pub max_executions: u32,
    /// Sandboxes kept ready per shape.
    pub pool_size: usize,
    /// Name reported in `Status` and `Started`.
    pub node_name: String,
}

/// Interpreters of the `host` image: the first candidate present per language.
pub fn host_interpreters() -> BTreeMap<Language, String> {
    Language::ALL
        .iter()
        .filter_map(|l| {
            let path = l.interpreter_candidates().iter().find(|p| std::path::Path::new(p).exists())?;
            Some((*l, path.to_string()))
        })
        .collect()
}

impl Executor {
    /// Builds the executor and starts warming the pool for the default shape.
    pub fn new(env: Arc<SandboxEnv>, features: Features, threads: Arc<Threads>, config: ExecutorConfig) -> Executor {
        let pool = Pool::new(env.clone(), config.pool_size);
        if features.can_run_sandboxes() {
            pool.warm(Shape::of(&config.policy.defaults));
        }
        Executor {
            env,
            pool,
            interpreters: host_interpreters(),
            features,
            permits: Arc::new(Semaphore::new(config.max_executions as usize)),
            max_executions: config.max_executions,
            node_name: config.node_name,
            policy: config.policy,
            threads,
        }
    }

    /// The node's thread service.
    pub fn threads(&self) -> &Arc<Threads> {
        &self.threads
    }

    /// How long a caller may take none of an execution's output.
    pub fn output_stall(&self) -> std::time::Duration {
        self.env.output_stall
    }

    /// Node name.
    pub fn node_name(&self) -> &str {
        &self.node_name
    }

    /// Detected features.
    pub fn features(&self) -> &Features {
        &self.features
    }

    /// Languages the image provides.
    pub fn languages(&self) -> Vec<Language> {
        self.interpreters.keys().copied().collect()
    }

    /// Executions running now.
    pub fn running(&self) -> u32 {
        self.max_executions - self.permits.available_permits() as u32
    }

    /// Concurrency limit.
    pub fn max_executions(&self) -> u32 {
        self.max_executions
    }

    /// Validates and admits a request; nothing runs yet. A full node waits
    /// briefly for a slot: the previous execution's teardown (after its
    /// answer was sent) usually frees one within milliseconds.
    pub async fn admit(&self, req: ExecRequest, thread: Option<ThreadOptions>) -> Result<Admission, ExecError> {
        let spec = req.validate(&self.policy)?;
        if !self.features.can_run_sandboxes() {
            return Err(ExecError::MissingFeature(self.features.missing.join("; ")));
        }
        if !self.interpreters.contains_key(&spec.language) {
            return Err(ExecError::LanguageUnavailable(spec.language.as_str()));
        }
        let busy = || ExecError::Busy(self.max_executions);
        let permit = tokio::time::timeout(ADMIT_WAIT, self.permits.clone().acquire_owned())
            .await
            .map_err(|_| busy())?
            .map_err(|_| busy())?;
        // Last, so a refusal above never holds the thread.
        let thread = match thread {
            Some(options) => {
                let lock = self.threads.lock(&options.key).await.map_err(|_| ExecError::ThreadBusy)?;
                Some((options, lock))
            }
            None => None,
        };
        Ok(Admission { spec, thread, _permit: permit })
    }

    /// Runs an admitted execution. Errors are returned only when nothing ran.
    ///
    /// The outcome is returned once every process of the sandbox is gone; the
    /// sandbox's teardown (cgroup removal, ~0.3 ms, occasionally 10 ms on v1)
    /// then finishes in the background while the admission stays held, so
    /// `running()` counts an execution until nothing of it is left.
    ///
    /// With a thread, its home is restored before and saved after the
    /// program; the outcome is returned only once the save is durable.
    pub async fn execute(&self, mut admission: Admission, received: Instant, events: mpsc::Sender<Event>) -> Result<Outcome, ExecError> {
        let t0 = Instant::now();
        let restored = match admission.thread.take() {
            Some((options, lock)) => match self.threads.restore(options, lock).await {
                Ok(r) => Some(r),
                Err(e) => {
                    warn!(execution_id = %admission.spec.id, error = %e, "restoring the thread failed; nothing ran");
                    return Ok(Outcome::never_ran(Failure::ThreadMount));
                }
            },
            None => None,
        };
        let spec = &admission.spec;
        let sandbox = self.pool.claim(Shape::of(&spec.limits)).await?;
        let ids = IdMap { root: sandbox.host_id(), user: sandbox.host_id() + 1 };
        let mut home = match &restored {
            Some(r) => match self.mount_home(&sandbox, r, spec) {
                Ok(home) => Some(home),
                Err(e) => {
                    warn!(execution_id = %spec.id, error = %e, "mounting the thread home failed; nothing ran");
                    tokio::spawn(sandbox.discard());
                    return Ok(Outcome::never_ran(Failure::ThreadMount));
                }
            },
            None => None,
        };
        let prepared = t0.elapsed();
        let go = self.go_for(spec, home.is_some());
        let (mut outcome, teardown) = sandbox.run(spec, go, received, &events).await;
        if let (Some(r), Some(h)) = (&restored, &mut home) {
            let t = Instant::now();
            self.save_home(r, &mut h.0, ids, &mut outcome).await;
            debug!(execution_id = %spec.id, restore_mount_us = prepared.as_micros() as u64, save_us = t.elapsed().as_micros() as u64, "thread home");
        }
        // The thread is free for its next call now. Its old home is unmounted
        // after the answer (that costs an RCU grace period or two); nothing
        // uses it any more, so a next call changing the warm copy under it
        // meanwhile is harmless.
        drop(restored);
        tokio::spawn(async move {
            if let Some((h, work)) = home {
                if let Err(e) = h.release() {
                    warn!(error = %e, "unmounting a thread home failed");
                }
                let _ = std::fs::remove_dir(&work);
            }
            teardown.run().await;
            drop(admission);
        });
        Ok(outcome)
    }

    fn mount_home(&self, sandbox: &Prepared, r: &Restored, spec: &ExecSpec) -> std::io::Result<(ThreadHome, std::path::PathBuf)> {
        let userns = sandbox.userns().ok_or_else(|| std::io::Error::other("the sandbox's user namespace is unknown"))?;
        let work = self.env.work_dir.join(sandbox.id());
        std::fs::create_dir(&work)?;
        let target = sandbox.home_target();
        let mounted = ThreadHome::mount(&ThreadHomeSpec {
            state: &r.state,
            work: &work,
            target: &target,
            userns,
            owner: sandbox.host_id() + 1,
            bytes: spec.limits.home_bytes,
        });
        match mounted {
            Ok(home) => Ok((home, work)),
            Err(e) => {
                let _ = std::fs::remove_dir(&work);
                Err(e)
            }
        }
    }

    /// Saves what the program left in its home (if it ran at all). A
    /// failed save fails the call and keeps the previous state. The home
    /// stays mounted (released after the answer) unless the diff has to be
    /// applied to the warm copy under it.
    async fn save_home(&self, r: &Restored, home: &mut ThreadHome, ids: IdMap, outcome: &mut Outcome) {
        if outcome.exit_code == -1 && outcome.failure.is_some() {
            return; // the program never ran
        }
        let upper = home.upper();
        let changed = std::fs::read_dir(&upper).map_or(true, |mut d| d.next().is_some());
        let unmounted = if changed { home.unmount_view() } else { Ok(()) };
        let saved = match unmounted {
            Ok(()) => self.threads.save(r, &upper, ids).await,
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

    fn go_for(&self, spec: &ExecSpec, home_mounted: bool) -> Go {
        let mut env: Vec<(String, String)> = vec![
            ("PATH".into(), PATH.into()),
            ("HOME".into(), warren_isolation::sandbox::rootfs::HOME.into()),
            ("LANG".into(), "C.UTF-8".into()),
        ];
        env.extend(spec.language.interpreter_env().iter().map(|(k, v)| (k.to_string(), v.to_string())));
        env.extend(spec.env.iter().cloned());
        Go {
            interpreter: self.interpreters.get(&spec.language).cloned().unwrap_or_default(),
            script_name: spec.language.script_name().into(),
            code: spec.code.clone(),
            env,
            open_files: spec.limits.open_files.into(),
            file_size_bytes: spec.limits.file_size_bytes,
            max_processes: spec.limits.pids.into(),
            home: if home_mounted { Home::Mounted } else { Home::Tmpfs { bytes: spec.limits.home_bytes } },
        }
    }

    /// Id of an admitted execution.
    pub fn admission_id(admission: &Admission) -> &str {
        &admission.spec.id
    }

    /// Tears down the pool and removes the agent's (now empty) cgroup parents.
    pub async fn shutdown(&self) {
        self.pool.shutdown().await;
        self.env.layout.remove_parents();
    }
}
