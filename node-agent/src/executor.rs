//! The execution service behind the gRPC adapter: validates a request against
//! the node, admits it, claims a warm sandbox and runs it.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Instant;

use tracing::debug;
use tokio::sync::{mpsc, OwnedSemaphorePermit, Semaphore};
use warren_isolation::features::Features;
use warren_isolation::spec::{ExecRequest, ExecSpec, Language, LanguageExt, NodePolicy, SpecError};
use warren_isolation::wire::{Go, Home};

use crate::lifecycle::storage::StorageResource;
use crate::lifecycle::thread_home::ThreadHomeResource;
use crate::lifecycle::{Resources, SandboxView};
use crate::pool::Pool;
use crate::sandbox::{Event, Outcome, SandboxEnv, SandboxError, Shape};
use crate::threads::{ThreadLock, ThreadOptions, Threads};

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
    mounts: Vec<warren_storage::MountSpec>,
    _permit: OwnedSemaphorePermit,
}

/// What a request carries besides the program, validated.
#[derive(Debug, Default)]
pub struct Extras {
    /// The thread whose home the program gets.
    pub thread: Option<ThreadOptions>,
    /// Storage mounted under `/data`.
    pub mounts: Vec<warren_storage::MountSpec>,
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
    stores: Arc<warren_storage::stores::Stores>,
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
    /// Store clients for storage mounts, kept across calls.
    pub stores: Arc<warren_storage::stores::Stores>,
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
            stores: config.stores,
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
    pub async fn admit(&self, req: ExecRequest, extras: Extras) -> Result<Admission, ExecError> {
        let Extras { thread, mounts } = extras;
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
        Ok(Admission { spec, thread, mounts, _permit: permit })
    }

    /// Runs an admitted execution. Errors are returned only when nothing ran.
    ///
    /// The outcome is returned once every process of the sandbox is gone and
    /// every resource finished (a thread's save is durable); then the
    /// resources are released and the sandbox torn down (cgroup removal,
    /// ~0.3 ms, occasionally 10 ms on v1) in the background while the
    /// admission stays held, so `running()` counts an execution until
    /// nothing of it is left.
    pub async fn execute(&self, mut admission: Admission, received: Instant, events: mpsc::Sender<Event>) -> Result<Outcome, ExecError> {
        let mut resources = Resources::default();
        if let Some((options, lock)) = admission.thread.take() {
            resources.push(Box::new(ThreadHomeResource::new(self.threads.clone(), self.env.work_dir.clone(), options, lock)));
        }
        let mounts = std::mem::take(&mut admission.mounts);
        if !mounts.is_empty() {
            // Write spools live beside the overlay work dirs: cleared at start.
            resources.push(Box::new(StorageResource::new(mounts, self.stores.clone(), self.env.work_dir.clone())));
        }
        let t0 = Instant::now();
        if let Err(failure) = resources.acquire().await {
            tokio::spawn(async move {
                resources.release().await;
                drop(admission);
            });
            return Ok(Outcome::never_ran(failure));
        }
        let spec = &admission.spec;
        let t_acquired = t0.elapsed();
        let sandbox = self.pool.claim(Shape::of(&spec.limits)).await?;
        let t_claimed = t0.elapsed();
        let prepared = match resources.is_empty() {
            true => Ok(()),
            false => {
                let view = SandboxView { id: sandbox.id(), userns: sandbox.userns(), host_id: sandbox.host_id(), home_target: sandbox.home_target(), data_dir: sandbox.data_dir(), spec };
                resources.prepare(&view).await
            }
        };
        if let Err(failure) = prepared {
            tokio::spawn(async move {
                resources.release().await;
                sandbox.discard().await;
                drop(admission);
            });
            return Ok(Outcome::never_ran(failure));
        }
        let t_prepared = t0.elapsed();
        let mut go = self.go_for(spec);
        resources.shape(&mut go);
        let (mut outcome, teardown) = sandbox.run(spec, go, received, &events).await;
        let t_ran = t0.elapsed();
        resources.finish(&mut outcome).await;
        let us = |d: std::time::Duration| d.as_micros() as u64;
        debug!(
            resources = !resources.is_empty(), acquire_us = us(t_acquired), claim_us = us(t_claimed - t_acquired), prepare_us = us(t_prepared - t_claimed),
            run_us = us(t_ran - t_prepared), finish_us = us(t0.elapsed() - t_ran), "execution phases"
        );
        tokio::spawn(async move {
            resources.release().await;
            teardown.run().await;
            drop(admission);
        });
        Ok(outcome)
    }

    fn go_for(&self, spec: &ExecSpec) -> Go {
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
            home: Home::Tmpfs { bytes: spec.limits.home_bytes },
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
