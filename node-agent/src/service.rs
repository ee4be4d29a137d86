//! The tonic adapter: proto in, backend call, events out.
//!
//! The service talks to a [`Backend`] — the real [`Executor`] in the agent,
//! a scripted double in tests — so the gRPC edge (refusals, status mapping,
//! streaming, a caller that stops reading) is tested without root.

use std::future::Future;
use std::sync::Arc;
use std::time::{Duration, Instant};

use tokio::sync::mpsc;
use tokio_stream::wrappers::ReceiverStream;
use tonic::{Request, Response, Status};
use tracing::{debug, info, info_span, warn, Instrument};
use warren_isolation::features::Features;
use warren_core::contract::Spec;
use warren_isolation::spec::Language;
use warren_proto::agent::{self as pb, execute_event::Event as PbEvent, node_agent_server::NodeAgent};

use crate::convert;
use crate::live_rpc as live;
use crate::refusal;
use crate::executor::{Admission, ExecError, Executor, WarmedImage};
use crate::keyslots::KeySlots;
use crate::running::Running;
use crate::sandbox::{Event, Outcome};
use crate::threads::{ThreadError, ThreadKey};

pub use warren_proto::TRACE_HEADER;

/// What the agent reports about itself in `Status`.
#[derive(Debug, Clone)]
pub struct NodeReport {
    /// Node name.
    pub node_name: String,
    /// Isolation features found at start.
    pub features: Features,
    /// Executions holding a slot now.
    pub running: u32,
    /// Concurrency limit.
    pub max_executions: u32,
    /// Languages the host image provides.
    pub languages: Vec<Language>,
    /// OCI images warm here: (reference, digest).
    pub images: Vec<(String, String)>,
    /// `Unrestricted` sandboxes are offered.
    pub network: bool,
    /// Sandboxes in the warm pool, ready for a call.
    pub warm_sandboxes: u32,
    /// Memory those sandboxes hold, bytes.
    pub warm_memory_bytes: u64,
    /// Calls warm interpreters ran.
    pub warm_starts: u64,
    /// CPU (µs) pooled sandboxes used before their calls, and idle ones
    /// discarded for it.
    pub idle: (u64, u64),
}

/// What the gRPC service needs from the node: the seam between the wire and
/// the sandboxes.
pub trait Backend: Send + Sync + 'static {
    /// A request that passed admission; holding it holds its slot.
    type Admitted: Send + 'static;
    /// Validates and admits, waiting up to `wait` (or the node's own short
    /// wait, whichever is longer) for one of its execution slots; nothing
    /// runs yet.
    fn admit(&self, spec: Spec, wait: Duration) -> impl Future<Output = Result<Self::Admitted, ExecError>> + Send;
    /// The admitted execution's id.
    fn execution_id(a: &Self::Admitted) -> &str;
    /// Runs an admitted execution, sending its events; errors only when nothing ran.
    fn execute(&self, a: Self::Admitted, received: Instant, events: mpsc::Sender<Event>) -> impl Future<Output = Result<Outcome, ExecError>> + Send;
    /// Deletes a thread held on (or through) this node.
    fn delete_thread(&self, key: &ThreadKey) -> impl Future<Output = Result<(), ThreadError>> + Send;
    /// The node's name (on every `Started`; cheaper than a whole report).
    fn node_name(&self) -> &str;
    /// The node's report.
    fn report(&self) -> NodeReport;
    /// How long a caller may take none of an execution's output.
    fn output_stall(&self) -> Duration;
    /// Pulls an image (unless warm) and finds its interpreters.
    fn warm_image(&self, reference: &str, auth: &warren_image::PullAuth, warm: &warren_core::warm::WarmModules) -> impl Future<Output = Result<WarmedImage, ExecError>> + Send;
    /// The Files API, when this backend offers it.
    fn files(&self) -> Option<crate::files::Files> {
        None
    }
    /// The thread store, for forks, restores and histories, when this
    /// backend offers them.
    fn threads(&self) -> Option<Arc<crate::threads::Threads>> {
        None
    }
    /// Makes an admitted request's sandbox live as `name` (see [`crate::live`]).
    fn go_live(&self, _a: Self::Admitted, _name: String, _lifetime: Duration) -> impl Future<Output = Result<(), ExecError>> + Send {
        async { Err(ExecError::MissingFeature("live sandboxes are not offered by this agent".into())) }
    }
    /// The node's live sandboxes, when this backend offers them.
    fn live(&self) -> Option<Arc<crate::live::LiveSandboxes>> {
        None
    }
}

impl Backend for Executor {
    type Admitted = Admission;

    fn admit(&self, spec: Spec, wait: Duration) -> impl Future<Output = Result<Admission, ExecError>> + Send {
        Executor::admit(self, spec, wait)
    }

    fn execution_id(a: &Admission) -> &str {
        Executor::admission_id(a)
    }

    fn execute(&self, a: Admission, received: Instant, events: mpsc::Sender<Event>) -> impl Future<Output = Result<Outcome, ExecError>> + Send {
        Executor::execute(self, a, received, events)
    }

    async fn delete_thread(&self, key: &ThreadKey) -> Result<(), ThreadError> {
        self.threads().delete(key).await
    }

    fn node_name(&self) -> &str {
        Executor::node_name(self)
    }

    fn report(&self) -> NodeReport {
        let warm = self.pool().ready();
        NodeReport {
            node_name: self.node_name().to_string(),
            features: self.features().clone(),
            running: self.running(),
            max_executions: self.max_executions(),
            languages: self.languages(),
            images: self.warm_images(),
            network: self.has_network(),
            warm_sandboxes: warm.0 as u32,
            warm_memory_bytes: warm.1,
            warm_starts: self.warm_starts(),
            idle: self.idle_cost(),
        }
    }

    fn output_stall(&self) -> Duration {
        Executor::output_stall(self)
    }

    fn warm_image(&self, reference: &str, auth: &warren_image::PullAuth, warm: &warren_core::warm::WarmModules) -> impl Future<Output = Result<WarmedImage, ExecError>> + Send {
        Executor::warm_image(self, reference, auth, warm)
    }

    fn files(&self) -> Option<crate::files::Files> {
        Some(Executor::files(self))
    }

    fn threads(&self) -> Option<Arc<crate::threads::Threads>> {
        Some(Executor::threads(self).clone())
    }

    async fn go_live(&self, a: Admission, name: String, lifetime: Duration) -> Result<(), ExecError> {
        Executor::go_live(self, a, name, lifetime).await.map(drop)
    }

    fn live(&self) -> Option<Arc<crate::live::LiveSandboxes>> {
        Some(Executor::live(self).clone())
    }
}

/// The target of a file request.
fn file_target(req: &pb::FilesRequest) -> Result<crate::files::Target, Status> {
    use pb::files_request::Target;
    match &req.target {
        Some(Target::Thread(t)) => Ok(crate::files::Target::Thread(convert::thread_options(t.clone())?)),
        Some(Target::VolumePrefix(p)) => Ok(crate::files::Target::Volume(p.clone())),
        None => Err(refusal::invalid("target", "a thread or a volume")),
    }
}

/// gRPC service over a [`Backend`].
pub struct AgentService<B = Executor> {
    backend: Arc<B>,
    running: Arc<Running>,
    key_slots: Arc<KeySlots>,
}

impl<B: Backend> AgentService<B> {
    /// Wraps a backend, with fresh key slots.
    pub fn new(backend: Arc<B>) -> AgentService<B> {
        Self::shared(backend, Arc::default(), Arc::default())
    }

    /// Wraps a backend; `key_slots` and `running` are shared by every
    /// listener of this agent (Unix socket and TCP count one set, and the
    /// shutdown deadline cancels them all).
    pub fn shared(backend: Arc<B>, key_slots: Arc<KeySlots>, running: Arc<Running>) -> AgentService<B> {
        AgentService { backend, running, key_slots }
    }
}

fn trace_of<T>(req: &Request<T>) -> String {
    req.metadata().get(TRACE_HEADER).and_then(|v| v.to_str().ok()).filter(|t| t.len() <= 64).unwrap_or("").to_string()
}

type EventResult = Result<pb::ExecuteEvent, Status>;

fn event(e: PbEvent) -> pb::ExecuteEvent {
    pb::ExecuteEvent { event: Some(e) }
}

impl<B: Backend> AgentService<B> {
    /// A slot of the request's key, waiting up to its `wait_ms` in order
    /// behind the key's earlier requests.
    async fn key_slot(&self, k: pb::KeySlotRequest) -> Result<crate::keyslots::KeySlot, Status> {
        let asked = Instant::now();
        let slot = self.key_slots.hold_within(&k.key, k.limit, Duration::from_millis(k.wait_ms.into())).await.map_err(|e| refusal::status(&e))?;
        // The key's count at each grant: what shows that a key never ran
        // more than its limit at once.
        debug!(key = %k.key, held = slot.held(), limit = k.limit, waited_ms = asked.elapsed().as_millis() as u64, "key slot granted");
        Ok(slot)
    }

    fn files(&self) -> Result<crate::files::Files, Status> {
        self.backend.files().ok_or_else(|| Status::unimplemented("this agent does not serve files"))
    }

    fn threads(&self) -> Result<Arc<crate::threads::Threads>, Status> {
        self.backend.threads().ok_or_else(|| Status::unimplemented("this agent does not keep thread versions"))
    }

    fn live(&self) -> Result<Arc<crate::live::LiveSandboxes>, Status> {
        self.backend.live().ok_or_else(|| Status::unimplemented("this agent offers no live sandboxes"))
    }
}

#[tonic::async_trait]
impl<B: Backend> NodeAgent for AgentService<B> {
    type ExecuteStream = ReceiverStream<EventResult>;

    async fn execute(&self, req: Request<pb::ExecuteRequest>) -> Result<Response<Self::ExecuteStream>, Status> {
        crate::auth::require_full(&req)?;
        let received = Instant::now();
        let span = info_span!("execute", trace_id = %trace_of(&req), execution_id = tracing::field::Empty);
        let mut req = req.into_inner();
        // The caller's queue wait, for this agent's slots (transport, not contract).
        let deadline = received + Duration::from_millis(req.queue_wait_ms.into()).min(crate::keyslots::MAX_WAIT);
        // The key's slot, when this agent counts the key: first, so a key at
        // its limit touches nothing else (it waits holding nothing of this
        // node); held until the execution has ended.
        let key_slot = match req.key_slot.take() {
            Some(k) => Some(self.key_slot(k).instrument(span.clone()).await?),
            None => None,
        };
        let admitted = async {
            let spec = Spec::try_from(req).map_err(|e| refusal::status(&e))?;
            self.backend.admit(spec, deadline.saturating_duration_since(Instant::now())).await.map_err(|e| refusal::status(&e))
        }
        .instrument(span.clone())
        .await?;
        let id = B::execution_id(&admitted).to_string();
        span.record("execution_id", id.as_str());
        let registration = self.running.register(&id).map_err(|_| refusal::id_in_use())?;
        let (tx, rx) = mpsc::channel::<EventResult>(16);
        let backend = self.backend.clone();
        let task = async move {
            let (ev_tx, ev_rx) = mpsc::channel::<Event>(16);
            let stall = backend.output_stall();
            let fwd = forward(ev_rx, tx.clone(), id.clone(), backend.node_name().to_string(), stall, registration.cancelled());
            let (result, ()) = tokio::join!(backend.execute(admitted, received, ev_tx), fwd);
            let last = match result {
                Ok(outcome) => {
                    log_outcome(&outcome);
                    Ok(event(PbEvent::Exited(pb::Exited::from(&outcome))))
                }
                Err(e) => {
                    warn!(error = %e, "execution failed before it started");
                    Err(refusal::status(&e))
                }
            };
            // A caller that reads nothing does not keep this task forever.
            let _ = tokio::time::timeout(stall, tx.send(last)).await;
            // Only now has the execution ended for a waiting `Cancel`, and
            // for the key's count.
            drop(registration);
            drop(key_slot);
        };
        debug!(admit_us = received.elapsed().as_micros() as u64, "admission phases");
        tokio::spawn(task.instrument(span));
        Ok(Response::new(ReceiverStream::new(rx)))
    }

    async fn delete_thread(&self, req: Request<pb::DeleteThreadRequest>) -> Result<Response<pb::DeleteThreadResponse>, Status> {
        crate::auth::require_full(&req)?;
        let span = info_span!("delete_thread", trace_id = %trace_of(&req));
        async {
            let key = convert::thread_key(req.into_inner().thread)?;
            self.backend.delete_thread(&key).await.map_err(|e| refusal::status(&e))?;
            Ok(Response::new(pb::DeleteThreadResponse {}))
        }
        .instrument(span)
        .await
    }

    async fn fork_thread(&self, req: Request<pb::ForkThreadRequest>) -> Result<Response<pb::ForkThreadResponse>, Status> {
        crate::auth::require_full(&req)?;
        let span = info_span!("fork_thread", trace_id = %trace_of(&req));
        let threads = self.threads()?;
        Ok(Response::new(crate::thread_rpc::fork(&threads, req.into_inner()).instrument(span).await?))
    }

    async fn restore_thread(&self, req: Request<pb::RestoreThreadRequest>) -> Result<Response<pb::RestoreThreadResponse>, Status> {
        crate::auth::require_full(&req)?;
        let span = info_span!("restore_thread", trace_id = %trace_of(&req));
        let threads = self.threads()?;
        Ok(Response::new(crate::thread_rpc::restore(&threads, req.into_inner()).instrument(span).await?))
    }

    async fn live_fork(&self, req: Request<pb::LiveForkRequest>) -> Result<Response<pb::ForkThreadResponse>, Status> {
        crate::auth::require_full(&req)?;
        let trace_id = trace_of(&req);
        let span = info_span!("live_fork", trace_id = %trace_id);
        let (threads, live) = (self.threads()?, self.live()?);
        Ok(Response::new(crate::thread_rpc::live_fork(&threads, &live, req.into_inner(), trace_id).instrument(span).await?))
    }

    async fn thread_history(&self, req: Request<pb::ThreadHistoryRequest>) -> Result<Response<pb::ThreadHistoryResponse>, Status> {
        crate::auth::require_full(&req)?;
        let threads = self.threads()?;
        Ok(Response::new(crate::thread_rpc::history(&threads, req.into_inner()).await?))
    }

    async fn cancel(&self, req: Request<pb::CancelRequest>) -> Result<Response<pb::CancelResponse>, Status> {
        crate::auth::require_full(&req)?;
        let span = info_span!("cancel", trace_id = %trace_of(&req));
        let id = req.into_inner().execution_id;
        let was_running = self.running.cancel(&id).instrument(span.clone()).await;
        span.in_scope(|| info!(execution_id = %id, was_running, "cancel answered"));
        Ok(Response::new(pb::CancelResponse { was_running }))
    }

    async fn list_files(&self, req: Request<pb::FilesRequest>) -> Result<Response<pb::ListFilesResponse>, Status> {
        crate::auth::require_full(&req)?;
        let span = info_span!("list_files", trace_id = %trace_of(&req));
        let (files, req) = (self.files()?, req.into_inner());
        let target = file_target(&req)?;
        let (list, truncated) = files.list(&target, &req.path).instrument(span).await.map_err(|e| refusal::status(&e))?;
        let files = list.into_iter().map(|f| pb::FileInfo { path: f.path, size: f.size, modified: f.modified }).collect();
        Ok(Response::new(pb::ListFilesResponse { files, truncated }))
    }

    type ReadFileStream = std::pin::Pin<Box<dyn futures_util::Stream<Item = Result<pb::FileChunk, Status>> + Send>>;

    async fn read_file(&self, req: Request<pb::FilesRequest>) -> Result<Response<Self::ReadFileStream>, Status> {
        crate::auth::require_full(&req)?;
        use futures_util::StreamExt;
        let span = info_span!("read_file", trace_id = %trace_of(&req));
        let (files, req) = (self.files()?, req.into_inner());
        let target = file_target(&req)?;
        let stream = files.read(&target, &req.path).instrument(span).await.map_err(|e| refusal::status(&e))?;
        let chunks = stream.map(|c| c.map(|data| pb::FileChunk { data: data.to_vec() }).map_err(|_| Status::unavailable("reading the file failed")));
        Ok(Response::new(Box::pin(chunks)))
    }

    async fn write_file(&self, req: Request<tonic::Streaming<pb::WriteFileRequest>>) -> Result<Response<pb::WriteFileResponse>, Status> {
        crate::auth::require_full(&req)?;
        use futures_util::StreamExt;
        let span = info_span!("write_file", trace_id = %trace_of(&req));
        let files = self.files()?;
        let mut messages = req.into_inner();
        let first = messages.message().await?.ok_or_else(|| refusal::invalid("target", "the first message names the file"))?;
        let target_req = first.target.ok_or_else(|| refusal::invalid("target", "required on the first message"))?;
        let target = file_target(&target_req)?;
        let head = futures_util::stream::iter((!first.data.is_empty()).then(|| Ok(bytes::Bytes::from(first.data))));
        let rest = messages.map(|m| m.map(|m| bytes::Bytes::from(m.data)).map_err(|_| crate::files::FilesError::Size { want: first.size, got: 0 }));
        files.write(&target, &target_req.path, first.size, head.chain(rest)).instrument(span).await.map_err(|e| refusal::status(&e))?;
        Ok(Response::new(pb::WriteFileResponse {}))
    }

    async fn delete_file(&self, req: Request<pb::FilesRequest>) -> Result<Response<pb::DeleteFileResponse>, Status> {
        crate::auth::require_full(&req)?;
        let span = info_span!("delete_file", trace_id = %trace_of(&req));
        let (files, req) = (self.files()?, req.into_inner());
        let target = file_target(&req)?;
        files.delete(&target, &req.path).instrument(span).await.map_err(|e| refusal::status(&e))?;
        Ok(Response::new(pb::DeleteFileResponse {}))
    }

    type HoldKeySlotStream = std::pin::Pin<Box<dyn futures_util::Stream<Item = Result<pb::KeySlotEvent, Status>> + Send>>;

    async fn hold_key_slot(&self, req: Request<pb::KeySlotRequest>) -> Result<Response<Self::HoldKeySlotStream>, Status> {
        crate::auth::require_full(&req)?;
        use futures_util::StreamExt;
        let slot = self.key_slot(req.into_inner()).await?;
        let granted = pb::KeySlotEvent { held: slot.held() };
        // The stream owns the slot: tonic drops it when the caller cancels
        // the call or its connection ends, and the slot returns.
        let hold = futures_util::stream::pending().map(move |()| {
            let _ = &slot;
            Ok(pb::KeySlotEvent::default())
        });
        Ok(Response::new(futures_util::stream::once(async move { Ok(granted) }).chain(hold).boxed()))
    }

    async fn live_create(&self, req: Request<pb::LiveCreateRequest>) -> Result<Response<pb::LiveCreateResponse>, Status> {
        crate::auth::require_full(&req)?;
        let span = info_span!("live_create", trace_id = %trace_of(&req));
        async {
            self.live()?;
            let req = req.into_inner();
            let name = live::name(req.live)?;
            let lifetime = live::lifetime(req.lifetime_ms)?;
            let mut wire = req.sandbox.ok_or_else(|| refusal::invalid("sandbox", "required"))?;
            let wait = Duration::from_millis(wire.queue_wait_ms.into()).min(crate::keyslots::MAX_WAIT);
            // The contract's code is not run; a placeholder passes its check.
            wire.code = ":".into();
            let spec = Spec::try_from(wire).map_err(|e| refusal::status(&e))?;
            let admitted = self.backend.admit(spec, wait).await.map_err(|e| refusal::status(&e))?;
            self.backend.go_live(admitted, name.clone(), lifetime).await.map_err(|e| refusal::status(&e))?;
            info!(sandbox = %name, lifetime_s = lifetime.as_secs(), "live sandbox created");
            Ok(Response::new(pb::LiveCreateResponse { node_name: self.backend.node_name().to_string() }))
        }
        .instrument(span)
        .await
    }

    type LiveStartStream = live::Events;

    async fn live_start(&self, req: Request<pb::LiveStartRequest>) -> Result<Response<live::Events>, Status> {
        crate::auth::require_full(&req)?;
        let span = info_span!("live_start", trace_id = %trace_of(&req));
        let events = live::start(&*self.live()?, req.into_inner()).instrument(span).await?;
        Ok(Response::new(events))
    }

    type LiveConnectStream = live::Events;

    async fn live_connect(&self, req: Request<pb::LiveProcessRequest>) -> Result<Response<live::Events>, Status> {
        crate::auth::require_full(&req)?;
        Ok(Response::new(live::connect(&*self.live()?, req.into_inner())?))
    }

    async fn live_input(&self, req: Request<pb::LiveInputRequest>) -> Result<Response<pb::LiveAck>, Status> {
        crate::auth::require_full(&req)?;
        Ok(Response::new(live::input(&*self.live()?, req.into_inner()).await?))
    }

    async fn live_signal(&self, req: Request<pb::LiveSignalRequest>) -> Result<Response<pb::LiveAck>, Status> {
        crate::auth::require_full(&req)?;
        Ok(Response::new(live::signal(&*self.live()?, req.into_inner()).await?))
    }

    async fn live_list(&self, req: Request<pb::LiveRef>) -> Result<Response<pb::LiveListResponse>, Status> {
        crate::auth::require_full(&req)?;
        Ok(Response::new(live::list(&*self.live()?, req.into_inner())?))
    }

    async fn live_update(&self, req: Request<pb::LiveUpdateRequest>) -> Result<Response<pb::LiveAck>, Status> {
        crate::auth::require_full(&req)?;
        Ok(Response::new(live::update(&*self.live()?, req.into_inner())?))
    }

    async fn live_end(&self, req: Request<pb::LiveRef>) -> Result<Response<pb::LiveEndResponse>, Status> {
        crate::auth::require_full(&req)?;
        let span = info_span!("live_end", trace_id = %trace_of(&req));
        Ok(Response::new(live::end(&*self.live()?, req.into_inner()).instrument(span).await?))
    }

    type LivePortStream = live::PortStream;

    async fn live_port(&self, req: Request<tonic::Streaming<pb::LivePortRequest>>) -> Result<Response<live::PortStream>, Status> {
        crate::auth::require_full(&req)?;
        Ok(Response::new(live::port(&*self.live()?, req.into_inner()).await?))
    }

    async fn status(&self, _req: Request<pb::StatusRequest>) -> Result<Response<pb::StatusResponse>, Status> {
        let r = self.backend.report();
        let (live, live_ended) = self.backend.live().map(|all| live::summaries(&all)).unwrap_or_default();
        Ok(Response::new(pb::StatusResponse {
            node_name: r.node_name,
            features: Some(convert::features(&r.features, r.network)),
            running_executions: r.running,
            max_executions: r.max_executions,
            languages: r.languages.into_iter().map(|l| pb::Language::from(l) as i32).collect(),
            agent_version: env!("CARGO_PKG_VERSION").to_string(),
            images: r.images.into_iter().map(|(reference, digest)| pb::WarmImageInfo { reference, digest }).collect(),
            warm_sandboxes: r.warm_sandboxes,
            warm_memory_bytes: r.warm_memory_bytes,
            warm_starts: r.warm_starts,
            idle_cpu_ms: r.idle.0 / 1000,
            idle_discards: r.idle.1,
            reports_live: self.backend.live().is_some(),
            live,
            live_ended,
            executions_total: self.running.total(),
        }))
    }

    async fn warm_image(&self, req: Request<pb::WarmImageRequest>) -> Result<Response<pb::WarmImageResponse>, Status> {
        let span = info_span!("warm_image", trace_id = %trace_of(&req));
        async {
            let req = req.into_inner();
            let auth = convert::pull_auth(req.image_pull)?;
            let warm = convert::warm_modules(req.warm)?;
            let warmed = self.backend.warm_image(&req.image, &auth, &warm).await.map_err(|e| refusal::status(&e))?;
            info!(image = %req.image, digest = %warmed.digest, warm_failures = warmed.warm_failures.len(), "image warm");
            Ok(Response::new(convert::warmed(warmed)))
        }
        .instrument(span)
        .await
    }
}

/// Moves sandbox events to the gRPC stream; returns (dropping `events`, which
/// kills the execution) as soon as the caller goes away, takes nothing for
/// `stall`, or `Cancel` names the execution (even mid-send).
async fn forward(events: mpsc::Receiver<Event>, tx: mpsc::Sender<EventResult>, id: String, node: String, stall: Duration, cancelled: impl Future<Output = ()>) {
    tokio::select! {
        () = pump(events, tx, id, node, stall) => {}
        () = cancelled => {}
    }
}

async fn pump(mut events: mpsc::Receiver<Event>, tx: mpsc::Sender<EventResult>, id: String, node: String, stall: Duration) {
    loop {
        let ev = tokio::select! {
            ev = events.recv() => ev,
            _ = tx.closed() => return,
        };
        let Some(ev) = ev else { return };
        let msg = match ev {
            Event::Started { setup } => PbEvent::Started(pb::Started {
                execution_id: id.clone(),
                node_name: node.clone(),
                setup_micros: setup.as_micros() as u64,
            }),
            Event::Stdout(data) => PbEvent::Stdout(pb::OutputChunk { data }),
            Event::Stderr(data) => PbEvent::Stderr(pb::OutputChunk { data }),
        };
        if !matches!(tokio::time::timeout(stall, tx.send(Ok(event(msg)))).await, Ok(Ok(()))) {
            return;
        }
    }
}

fn log_outcome(o: &Outcome) {
    info!(
        exit_code = o.exit_code,
        signal = o.signal,
        timed_out = o.timed_out,
        oom_killed = o.oom_killed,
        cancelled = o.cancelled,
        wall_us = o.wall.as_micros() as u64,
        cpu_us = o.cpu_micros,
        peak_memory_bytes = o.peak_memory_bytes,
        "execution finished"
    );
}

