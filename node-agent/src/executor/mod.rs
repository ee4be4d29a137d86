//! The execution service behind the gRPC adapter: validates a request against
//! the node, admits it, claims a warm sandbox and runs it ([`seam::run`]).

mod checked;
pub mod seam;
#[cfg(test)]
mod tests;

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Instant;

use tracing::debug;
use tokio::sync::{mpsc, OwnedSemaphorePermit, Semaphore};
use warren_isolation::features::Features;
use warren_core::contract::Spec;
use warren_core::warm::WarmModules;
use warren_isolation::spec::{warm_start, ExecSpec, Language, LanguageExt, NodePolicy, SpecError};
use warren_isolation::wire::{Go, Home};

use crate::lifecycle::storage::StorageResource;
use crate::lifecycle::thread_home::ThreadHomeResource;
use crate::lifecycle::Resources;
use crate::live::{LiveSandbox, LiveSandboxes};
use crate::pool::Pool;
use crate::images::Images;
use warren_network::NetPolicy;
use crate::sandbox::{Event, Outcome, Rootfs, SandboxEnv, SandboxError, Shape};
use crate::threads::{ThreadLock, ThreadOptions, Threads};
pub use checked::{pull_auth, thread_options, Checked};

/// Shortest wait for a free slot before RESOURCE_EXHAUSTED (what a caller
/// that sends no queue wait gets).
const ADMIT_WAIT: std::time::Duration = std::time::Duration::from_millis(250);
/// Longest wait a caller may ask for (as for a key's slot).
const MAX_ADMIT_WAIT: std::time::Duration = crate::keyslots::MAX_WAIT;
const PATH: &str = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin";

/// Why an execution was refused or could not start. Mapped to a gRPC status
/// in exactly one place (`crate::refusal`).
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
    /// The image reference (or digest) is malformed.
    #[error("image: {0}")]
    ImageReference(String),
    /// The image is still being pulled to this node.
    #[error("image {0} is being pulled to this node; retry shortly")]
    ImagePulling(String),
    /// The image could not be pulled or was refused.
    #[error("image: {0}")]
    Image(String),
    /// The image's registry (or its token realm, or a redirect) is an
    /// endpoint this node refuses: the node itself, unless an admin allowed it.
    #[error("image: {0}")]
    ImageRefused(String),
    /// This agent runs no OCI images (no image store).
    #[error("this node-agent runs only the host image")]
    ImagesDisabled,
    /// A mount of something no tenant may mount: a `Local` directory
    /// outside the roots the node's admin allowed, the platform's own store.
    #[error("{field}: {why}")]
    MountRefused { field: String, why: String },
    /// `Unrestricted` network asked of a node without sandbox networking.
    #[error("network: this node offers only Blocked sandboxes (no sandbox networking here)")]
    NetworkUnavailable,
    /// A live sandbox's resources (thread home, mounts, connectors) could
    /// not be set up; nothing runs.
    #[error("the sandbox's {0:?} could not be set up")]
    NotStarted(crate::sandbox::Failure),
    /// A live sandbox by that name runs already.
    #[error("a live sandbox by that name runs already on this node")]
    LiveExists,
}

/// Admission for one execution: holding it counts as running.
pub struct Admission {
    spec: ExecSpec,
    rootfs: Rootfs,
    interpreter: String,
    image_env: Vec<(String, String)>,
    thread: Option<(ThreadOptions, ThreadLock)>,
    mounts: Vec<warren_storage::MountSpec>,
    network: Option<Arc<NetPolicy>>,
    connectors: Vec<crate::connectors::Grant>,
    warm_modules: Vec<String>,
    trace: Option<warren_core::trace::Trace>,
    _permit: OwnedSemaphorePermit,
}

/// The network a request asks for.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub enum NetworkRequest {
    /// Loopback only.
    #[default]
    Blocked,
    /// Outbound through the node, limited to `allow` when set.
    Unrestricted {
        /// The egress allowlist.
        allow: Option<Vec<warren_core::egress::Rule>>,
    },
}

/// An image made warm on this node.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WarmedImage {
    /// Manifest digest.
    pub digest: String,
    /// Interpreters and their versions.
    pub languages: Vec<(Language, String)>,
    /// Uncompressed size.
    pub bytes: u64,
    /// Warm modules that did not load: (language, module, why).
    pub warm_failures: Vec<(Language, String, String)>,
}

/// Runs executions on this node.
pub struct Executor {
    env: Arc<SandboxEnv>,
    pool: Pool,
    policy: NodePolicy,
    warm_interpreters: bool,
    interpreters: BTreeMap<Language, String>,
    features: Features,
    permits: Arc<Semaphore>,
    max_executions: u32,
    node_name: String,
    threads: Arc<Threads>,
    stores: Arc<warren_storage::stores::Stores>,
    images: Option<Arc<Images>>,
    live: Arc<LiveSandboxes>,
    /// One interpreter discovery at a time (they are rare: once per image).
    discovering: tokio::sync::Mutex<()>,
}

/// Static settings of an executor.
pub struct ExecutorConfig {
    /// Limits and maxima.
    pub policy: NodePolicy,
    /// Concurrent executions accepted.
    pub max_executions: u32,
    /// Sandboxes kept ready per shape.
    pub pool_size: usize,
    /// Start Python's and Node's interpreter in pooled sandboxes ahead of the call.
    pub warm_interpreters: bool,
    /// Most memory the pool's idle sandboxes hold together, bytes.
    pub warm_pool_memory: u64,
    /// Name reported in `Status` and `Started`.
    pub node_name: String,
    /// Store clients for storage mounts, kept across calls.
    pub stores: Arc<warren_storage::stores::Stores>,
    /// OCI images; `None` runs only `host`.
    pub images: Option<Arc<Images>>,
}

/// How long an interpreter's version probe may run.
const PROBE_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(10);

/// What the sandbox's program starts with. Environment, later entries
/// winning: Warren's defaults, the image's (filtered), the interpreter's
/// settings, then the request's.
fn go_for(spec: &ExecSpec, interpreter: &str, image_env: &[(String, String)]) -> Go {
    let mut env = program_env(spec.language, image_env);
    env.extend(spec.env.iter().cloned());
    warren_isolation::spec::dedupe_env(&mut env);
    Go {
        interpreter: interpreter.to_string(),
        script_name: spec.language.script_name().into(),
        code: spec.code.clone(),
        env,
        open_files: spec.limits.open_files.into(),
        file_size_bytes: spec.limits.file_size_bytes,
        max_processes: spec.limits.pids.into(),
        home: Home::Tmpfs { bytes: spec.limits.home_bytes },
        warm: false,
        view: None,
        live: false,
    }
}

impl From<crate::images::ImageError> for ExecError {
    fn from(e: crate::images::ImageError) -> ExecError {
        use crate::images::ImageError as I;
        match e {
            I::Reference(s) => ExecError::ImageReference(s),
            I::Pulling(s) => ExecError::ImagePulling(s),
            I::Unavailable(s) => ExecError::Image(s),
            I::Refused(s) => ExecError::ImageRefused(s),
        }
    }
}

/// Checks that the pool's sandboxes stay idle, and cools its shapes now
/// and then (see [`Pool::sweep`], [`Pool::cool`]).
async fn cool_now_and_then(pool: Pool) {
    let mut sweeps = 0u32;
    loop {
        tokio::time::sleep(crate::pool::SWEEP).await;
        pool.sweep().await;
        sweeps = sweeps.wrapping_add(1);
        if sweeps % 6 == 0 {
            pool.cool().await;
        }
    }
}

/// Warren's defaults, the image's (filtered) and the interpreter's settings:
/// a program's environment before the request's.
fn program_env(language: Language, image_env: &[(String, String)]) -> Vec<(String, String)> {
    let mut env: Vec<(String, String)> = vec![
        ("PATH".into(), PATH.into()),
        ("HOME".into(), warren_isolation::sandbox::rootfs::HOME.into()),
        ("LANG".into(), "C.UTF-8".into()),
    ];
    env.extend(warren_core::layout::IDENTITY_ENV.iter().map(|(k, v)| (k.to_string(), v.to_string())));
    env.extend(image_env.iter().cloned());
    env.extend(language.interpreter_env().iter().map(|(k, v)| (k.to_string(), v.to_string())));
    env
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
        let pool = Pool::new(env.clone(), config.pool_size, config.warm_pool_memory);
        tokio::spawn(cool_now_and_then(pool.clone()));
        let interpreters = host_interpreters();
        if features.can_run_sandboxes() {
            let shape = Shape::of(&config.policy.defaults, Rootfs::Host, None);
            pool.warm(shape.clone());
            // The warm interpreter a Python call without env of its own takes.
            let python = interpreters.get(&Language::Python).filter(|_| config.warm_interpreters);
            if let Some(w) = python.and_then(|p| warm_start(Language::Python, p, &program_env(Language::Python, &[]), &[])) {
                pool.warm(shape.warmed(Some(w)));
            }
        }
        Executor {
            env,
            pool,
            warm_interpreters: config.warm_interpreters,
            interpreters,
            features,
            permits: Arc::new(Semaphore::new(config.max_executions as usize)),
            max_executions: config.max_executions,
            node_name: config.node_name,
            policy: config.policy,
            threads,
            stores: config.stores,
            images: config.images,
            live: Arc::default(),
            discovering: tokio::sync::Mutex::new(()),
        }
    }

    /// The node's images, when it runs OCI images.
    pub fn images(&self) -> Option<&Arc<Images>> {
        self.images.as_ref()
    }

    /// Pulls `reference` (unless warm), waiting as long as it takes, and
    /// finds its interpreters: what the operator asks before any call.
    pub async fn warm_image(&self, reference: &str, auth: &warren_image::PullAuth, warm: &WarmModules) -> Result<WarmedImage, ExecError> {
        if matches!(reference, "" | "host") {
            let languages = self.interpreters.keys().map(|l| (*l, String::new())).collect();
            let warm_failures = self.try_warm_modules(&Rootfs::Host, &self.interpreters, &[], warm).await;
            return Ok(WarmedImage { digest: String::new(), languages, bytes: 0, warm_failures });
        }
        let images = self.images.as_ref().ok_or(ExecError::ImagesDisabled)?;
        let image = images.pull(reference, auth, None).await?;
        let found = match image.interpreters() {
            Some(found) => found,
            None => self.discover(&image).await,
        };
        let paths = found.iter().filter_map(|i| Some((Language::parse(&i.language)?, i.path.clone()))).collect();
        let warm_failures = self.try_warm_modules(&Rootfs::image(image.clone()), &paths, &image.env(), warm).await;
        let languages = found.into_iter().filter_map(|i| Some((Language::parse(&i.language)?, i.version))).collect();
        Ok(WarmedImage { digest: image.digest(), languages, bytes: image.bytes(), warm_failures })
    }

    /// Loads `warm`'s modules in a warm interpreter of each language, as a
    /// call's would; returns those that failed: (language, module, why).
    async fn try_warm_modules(&self, rootfs: &Rootfs, interpreters: &BTreeMap<Language, String>, image_env: &[(String, String)], warm: &WarmModules) -> Vec<(Language, String, String)> {
        let mut failures = Vec::new();
        for (language, path) in interpreters {
            let modules = warm.of(*language);
            let Some(start) = (!modules.is_empty()).then(|| warm_start(*language, path, &program_env(*language, image_env), modules)).flatten() else {
                continue;
            };
            let shape = Shape::of(&self.policy.defaults, rootfs.clone(), None).warmed(Some(start));
            match crate::sandbox::prepare(&self.env, shape, &self.policy.defaults).await {
                Ok(sandbox) => {
                    let (started, failed) = sandbox.warm_state();
                    match started {
                        true => failures.extend(failed.iter().map(|(m, why)| (*language, m.clone(), why.clone()))),
                        false => failures.extend(modules.iter().map(|m| (*language, m.clone(), "the interpreter did not start with its warm modules".to_string()))),
                    }
                    sandbox.discard().await;
                }
                Err(e) => failures.extend(modules.iter().map(|m| (*language, m.clone(), format!("no sandbox to try it in: {e}")))),
            }
        }
        failures
    }

    /// Images warm here: (reference, digest).
    pub fn warm_images(&self) -> Vec<(String, String)> {
        self.images.as_ref().map(|i| i.store().images().iter().map(|im| (im.reference(), im.digest())).collect()).unwrap_or_default()
    }

    /// The pool (the image collector releases idle images' sandboxes).
    pub fn pool(&self) -> &Pool {
        &self.pool
    }

    /// The Files API over this node's threads and the platform store.
    pub fn files(&self) -> crate::files::Files {
        crate::files::Files::new(self.threads.clone(), self.stores.platform_store())
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

    /// Whether `Unrestricted` sandboxes are offered.
    pub fn has_network(&self) -> bool {
        self.env.net.is_some()
    }

    /// Languages the image provides.
    pub fn languages(&self) -> Vec<Language> {
        self.interpreters.keys().copied().collect()
    }

    /// Calls warm interpreters ran since the agent started.
    pub fn warm_starts(&self) -> u64 {
        self.env.warm_starts.served()
    }

    /// CPU (µs) pooled sandboxes used before their calls, and idle ones
    /// discarded for it.
    pub fn idle_cost(&self) -> (u64, u64) {
        self.env.warm_starts.idle()
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
    /// for a slot, in order, up to `wait` (the caller's queue wait) and at
    /// least briefly: the previous execution's teardown (after its answer
    /// was sent) usually frees one within milliseconds.
    pub async fn admit(&self, spec: Spec, wait: std::time::Duration) -> Result<Admission, ExecError> {
        let Checked { run: spec, image, image_digest, image_pull, thread, mounts, network, connectors, warm_modules, trace } = Checked::of(spec, &self.policy)?;
        for (i, m) in mounts.iter().enumerate() {
            if let Some((field, why)) = self.stores.refuses(m) {
                return Err(ExecError::MountRefused { field: format!("mounts[{i}].{field}"), why });
            }
        }
        if !self.features.can_run_sandboxes() {
            return Err(ExecError::MissingFeature(self.features.missing.join("; ")));
        }
        let network = match network {
            NetworkRequest::Blocked => None,
            NetworkRequest::Unrestricted { .. } if self.env.net.is_none() => return Err(ExecError::NetworkUnavailable),
            NetworkRequest::Unrestricted { allow } => Some(Arc::new(NetPolicy::new(allow, spec.limits.cpu_millis))),
        };
        let (rootfs, interpreter, image_env) = match image.as_str() {
            "" | "host" => {
                let interpreter = self.interpreters.get(&spec.language).ok_or(ExecError::LanguageUnavailable(spec.language.as_str()))?;
                (Rootfs::Host, interpreter.clone(), Vec::new())
            }
            reference => {
                let images = self.images.as_ref().ok_or(ExecError::ImagesDisabled)?;
                let image = images.for_call(reference, &image_digest, &image_pull).await?;
                let found = match image.interpreters() {
                    Some(found) => found,
                    None => self.discover(&image).await,
                };
                let interpreter = found.into_iter().find(|i| i.language == spec.language.as_str()).ok_or(ExecError::LanguageUnavailable(spec.language.as_str()))?;
                let env = image.env();
                (Rootfs::image(image), interpreter.path, env)
            }
        };
        let permit = seam::admit_slot(&self.permits, self.max_executions, wait.clamp(ADMIT_WAIT, MAX_ADMIT_WAIT)).await?;
        // Last, so a refusal above never holds the thread.
        let thread = match thread {
            Some(options) => {
                let lock = self.threads.lock(&options.key).await.map_err(|_| ExecError::ThreadBusy)?;
                Some((options, lock))
            }
            None => None,
        };
        Ok(Admission { spec, rootfs, interpreter, image_env, thread, mounts, network, connectors, warm_modules, trace, _permit: permit })
    }

    /// Runs an admitted execution (see [`seam::run`]). Errors are returned
    /// only when nothing ran.
    pub async fn execute(&self, admission: Admission, received: Instant, events: mpsc::Sender<Event>) -> Result<Outcome, ExecError> {
        let Admission { spec, rootfs, interpreter, image_env, thread, mounts, network, connectors, warm_modules, trace, _permit } = admission;
        let resources = self.resources(thread, mounts, connectors);
        let go = go_for(&spec, &interpreter, &image_env);
        let warm = self.warm_interpreters.then(|| warm_start(spec.language, &interpreter, &go.env, &warm_modules)).flatten();
        let shape = Shape::of(&spec.limits, rootfs, network).warmed(warm);
        seam::run(&self.pool, resources, seam::Planned { spec, shape, go, held: _permit, trace }, received, events).await
    }

    /// What an execution holds besides its sandbox, in order.
    fn resources(&self, thread: Option<(ThreadOptions, ThreadLock)>, mounts: Vec<warren_storage::MountSpec>, connectors: Vec<crate::connectors::Grant>) -> Resources {
        let mut resources = Resources::default();
        if let Some((options, lock)) = thread {
            resources.push(Box::new(ThreadHomeResource::new(self.threads.clone(), self.env.work_dir.clone(), options, lock)));
        }
        if !mounts.is_empty() {
            // Write spools live beside the overlay work dirs: cleared at start.
            resources.push(Box::new(StorageResource::new(mounts, self.stores.clone(), self.env.work_dir.clone())));
        }
        if !connectors.is_empty() {
            resources.push(Box::new(crate::connectors::resource::ConnectorResource::new(connectors, self.stores.endpoint_policy().clone())));
        }
        resources
    }

    /// The node's live sandboxes.
    pub fn live(&self) -> &Arc<LiveSandboxes> {
        &self.live
    }

    /// Makes an admitted request's sandbox live as `name` for at most
    /// `lifetime` (see [`crate::live`]): the request's code is not run; its
    /// language, image, limits, network, mounts, connectors, thread and
    /// environment are the sandbox's. It holds the admission's node slot
    /// until it has ended.
    pub async fn go_live(&self, admission: Admission, name: String, lifetime: std::time::Duration) -> Result<Arc<LiveSandbox>, ExecError> {
        let Admission { spec, rootfs, interpreter, image_env, thread, mounts, network, connectors, warm_modules: _, trace: _, _permit } = admission;
        let mut resources = self.resources(thread, mounts, connectors);
        let mut go = go_for(&spec, &interpreter, &image_env);
        let shape = Shape::of(&spec.limits, rootfs, network);
        let fail = |resources: Resources| async move {
            resources.release().await;
        };
        if let Err(failure) = resources.acquire().await {
            fail(resources).await;
            return Err(ExecError::NotStarted(failure));
        }
        let sandbox = match self.pool.claim(shape.clone(), &spec.limits).await {
            Ok(s) => s,
            Err(e) => {
                fail(resources).await;
                return Err(e.into());
            }
        };
        self.pool.refill(shape);
        if let Err(failure) = resources.prepare(&seam::ClaimedSandbox::view(&sandbox, &spec)).await {
            fail(resources).await;
            sandbox.discard().await;
            return Err(ExecError::NotStarted(failure));
        }
        resources.shape(&mut go);
        let init_pid = sandbox.init_pid();
        let (driver, teardown) = match sandbox.go_live(&spec, go.clone()).await {
            Ok(live) => live,
            Err((e, teardown)) => {
                fail(resources).await;
                teardown.run().await;
                return Err(e.into());
            }
        };
        let held = crate::live::Held { permit: _permit, resources, teardown };
        crate::live::register(&self.live, name, driver.clone(), init_pid, go.env, lifetime, held).map_err(|(e, held)| {
            // Another by that name won the race: this one ends at once.
            tokio::spawn(async move {
                driver.end().await;
                let crate::live::Held { permit, resources, teardown } = held;
                resources.release().await;
                if let Ok(t) = teardown.await {
                    t.run().await;
                }
                drop(permit);
            });
            match e {
                crate::live::LiveError::Exists => ExecError::LiveExists,
                other => ExecError::NotStarted(crate::sandbox::Failure::Sandbox(other.to_string())),
            }
        })
    }

    /// Finds the interpreters of a freshly pulled image by running each
    /// candidate in a real sandbox of that image (never on the host: the
    /// image's binaries are as untrusted as the code). Recorded with the
    /// image, so this runs once per image per node.
    async fn discover(&self, image: &Arc<warren_image::Image>) -> Vec<warren_image::Interpreter> {
        let _one = self.discovering.lock().await;
        if let Some(found) = image.interpreters() {
            return found;
        }
        let rootfs = Rootfs::image(image.clone());
        let mut found = Vec::new();
        for language in Language::ALL {
            let candidates = language.interpreter_candidates();
            let Some(path) = candidates.iter().find(|p| warren_image::rootfs::is_executable_in_root(image.root(), p.trim_start_matches('/'))) else {
                continue;
            };
            match self.probe(language, path, &rootfs, &image.env()).await {
                Some(version) => found.push(warren_image::Interpreter { language: language.as_str().into(), path: path.to_string(), version }),
                None => tracing::warn!(image = %image.reference(), interpreter = path, "interpreter present but did not run; not offered"),
            }
        }
        tracing::info!(image = %image.reference(), found = ?found, "image interpreters discovered");
        if let Err(e) = image.set_interpreters(found.clone()) {
            tracing::warn!(error = %e, "recording an image's interpreters");
        }
        found
    }

    /// Runs `path` in a sandbox of `rootfs` to print its version.
    async fn probe(&self, language: Language, path: &str, rootfs: &Rootfs, image_env: &[(String, String)]) -> Option<String> {
        let spec = ExecSpec::check(&mut Spec::new(language, language.version_probe(), PROBE_TIMEOUT), &self.policy).ok()?;
        let sandbox = self.pool.claim(Shape::of(&spec.limits, rootfs.clone(), None), &spec.limits).await.ok()?;
        let (tx, mut rx) = mpsc::channel(16);
        let collect = tokio::spawn(async move {
            let mut out = Vec::new();
            while let Some(ev) = rx.recv().await {
                if let Event::Stdout(d) = ev {
                    out.extend(d.into_iter().take(64usize.saturating_sub(out.len())));
                }
            }
            out
        });
        let (outcome, teardown) = sandbox.run(&spec, go_for(&spec, path, image_env), Instant::now(), &tx).await;
        drop(tx);
        tokio::spawn(teardown.run());
        let out = collect.await.ok()?;
        let version = String::from_utf8(out).ok()?.trim().to_string();
        let plausible = !version.is_empty() && version.len() <= 32 && version.chars().all(|c| c.is_ascii_alphanumeric() || ".-+".contains(c));
        (outcome.exit_code == 0 && plausible).then_some(version)
    }

    /// Id of an admitted execution.
    pub fn admission_id(admission: &Admission) -> &str {
        &admission.spec.id
    }

    /// Tears down the pool, stops the supervisors' spawner and removes the
    /// agent's (now empty) cgroup parents.
    pub async fn shutdown(&self) {
        self.live.end_all().await;
        self.pool.shutdown().await;
        let env = self.env.clone();
        let _ = tokio::task::spawn_blocking(move || {
            env.spawner.stop(std::time::Duration::from_secs(5));
            env.groups.close();
        })
        .await;
        if let Err(e) = self.env.groups.layout().remove_parents() {
            debug!(error = %e, "the agent's cgroup stays delegated to it");
        }
    }
}
