//! Live sandboxes through the gateway: the typed service front ends (the
//! E2B API today) call, never another API's request. A live sandbox is
//! built from the key's Sandbox exactly as an execution's (the same
//! [`ExecutionSpec`] travels as its contract), on the home node of its
//! thread, and is then reached on the node that holds it.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use futures_util::StreamExt;
use tonic::{Code, Status};
use warren_config::EffectiveKey;
use warren_core::Language;
use warren_proto::agent::{self as pb, live_event::Event as Ev, RefusalReason as Reason};
use warren_proto::refusal::refusal_of;

use super::spec::{Delivery, ExecutionSpec, Tenant};
use super::{ExecError, ExecuteRequest, ExecutionService};
use crate::nodes::agent::LiveAgent;
use crate::nodes::Node;

/// SIGKILL, as the agent takes it.
pub const SIGKILL: i32 = 9;
/// SIGTERM.
pub const SIGTERM: i32 = 15;
/// SIGINT.
pub const SIGINT: i32 = 2;

/// Why a live-sandbox call failed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum LiveError {
    /// The sandbox is not live (ended, paused, or its node lost it).
    #[error("the sandbox is not running")]
    Gone,
    /// No such process runs in it.
    #[error("process {0} is not running in the sandbox")]
    NoProcess(i32),
    /// A malformed request (the message names the field).
    #[error("{0}")]
    Invalid(String),
    /// It cannot be done to this process (no such program, stdin closed,
    /// not a terminal).
    #[error("{0}")]
    Refused(String),
    /// The sandbox runs as many processes as it may.
    #[error("{0}")]
    Busy(String),
    /// Its node is unreachable.
    #[error("the sandbox's node is unreachable")]
    NodeLost,
}

/// A process's events.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum LiveEvent {
    /// It started with this pid.
    Started(i32),
    /// Output on stdout.
    Stdout(bytes::Bytes),
    /// Output on stderr.
    Stderr(bytes::Bytes),
    /// Output of its terminal.
    Pty(bytes::Bytes),
    /// It ended: exit code (128 + signal when killed), signal (0 when it exited).
    Ended(i32, i32),
}

/// A process's stream; an `Err` item means the node stopped answering.
pub type LiveEvents = futures_util::stream::BoxStream<'static, Result<LiveEvent, LiveError>>;

/// What a process is started with.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Start {
    /// Program and arguments.
    pub argv: Vec<String>,
    /// Its own variables, over the sandbox's.
    pub env: BTreeMap<String, String>,
    /// Absolute working directory; the home when `None`.
    pub cwd: Option<String>,
    /// Keep its stdin open.
    pub stdin: bool,
    /// A terminal of (rows, cols).
    pub pty: Option<(u32, u32)>,
    /// The caller's name for it.
    pub tag: Option<String>,
}

/// A process as listed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Listed {
    /// Its pid in the sandbox.
    pub pid: i32,
    /// How it was started.
    pub start: Start,
}

/// A live sandbox on its node.
pub struct Live {
    node: Arc<Node>,
    name: pb::LiveRef,
}

fn live_ref(tenant: &Tenant, id: &str) -> pb::LiveRef {
    pb::LiveRef { r#ref: Some(pb::ThreadRef { namespace: tenant.namespace.clone(), key_name: tenant.key_name.clone(), thread_id: id.to_string() }) }
}

/// A call's status as a [`LiveError`].
fn error(s: &Status) -> LiveError {
    let (reason, field) = refusal_of(s);
    match (s.code(), reason) {
        (Code::NotFound, Reason::LiveNotFound) if field == "pid" => LiveError::NoProcess(0),
        (Code::NotFound, _) => LiveError::Gone,
        (Code::InvalidArgument, _) => LiveError::Invalid(s.message().to_string()),
        (Code::FailedPrecondition, _) => LiveError::Refused(s.message().to_string()),
        (Code::ResourceExhausted, _) => LiveError::Busy(s.message().to_string()),
        _ => LiveError::NodeLost,
    }
}

fn event(e: pb::LiveEvent) -> Option<LiveEvent> {
    Some(match e.event? {
        Ev::Started(s) => LiveEvent::Started(s.pid),
        Ev::Stdout(b) => LiveEvent::Stdout(b.into()),
        Ev::Stderr(b) => LiveEvent::Stderr(b.into()),
        Ev::Pty(b) => LiveEvent::Pty(b.into()),
        Ev::Ended(e) => LiveEvent::Ended(e.exit_code, e.signal),
    })
}

fn events(s: crate::nodes::agent::LiveStream) -> LiveEvents {
    s.filter_map(|item| async move {
        match item {
            Ok(e) => event(e).map(Ok),
            Err(s) => Some(Err(error(&s))),
        }
    })
    .boxed()
}

/// How long the node may keep a live sandbox beyond the lifetime the
/// front end asked for: the front end normally ends it itself (pausing or
/// killing it as its API says); the node's own end is the backstop for a
/// gateway that is gone.
const NODE_GRACE: Duration = Duration::from_secs(120);

impl ExecutionService {
    /// Makes sandbox `id` of `key` live with `env` for `lifetime`, its home
    /// the thread `id`; the name of its node.
    pub async fn live_create(&self, key: &EffectiveKey, id: &str, env: BTreeMap<String, String>, lifetime: Duration) -> Result<String, ExecError> {
        let mut req = ExecuteRequest::new(":", Language::Bash);
        req.thread_id = Some(id.to_string());
        req.env_vars = env.into_iter().collect();
        let spec = ExecutionSpec::new(super::new_trace_id(), key, &mut req, Delivery::Collected)?;
        let placement = spec.placement().unwrap_or_default();
        let node = self.nodes.home_of(&placement).ok_or(ExecError::NoNode)?;
        let agent = node.agent().live().ok_or(ExecError::NodeRefused("the node offers no live sandboxes"))?;
        let name = live_ref(&spec.tenant, id);
        let mut wire = pb::ExecuteRequest::from(spec.contract);
        wire.queue_wait_ms = u32::try_from(self.queue_wait.as_millis()).unwrap_or(u32::MAX);
        let lifetime_ms = (lifetime + NODE_GRACE).as_millis().min(u128::from(u64::MAX)) as u64;
        match agent.create(pb::LiveCreateRequest { live: Some(name), sandbox: Some(wire), lifetime_ms }).await {
            Ok(r) => Ok(if r.node_name.is_empty() { node.name() } else { r.node_name }),
            Err(status) => {
                let (e, broken) = super::refusal::AgentRefusal::read(&status).of_execute(Some(id), key.max_concurrency);
                if broken {
                    node.mark_unhealthy();
                }
                tracing::warn!(sandbox = id, node = %node.address, code = ?status.code(), reason = status.message(), "the node refused a live sandbox");
                Err(e)
            }
        }
    }

    /// Sandbox `id` of `key`, live on node `node`.
    pub fn live(&self, key: &EffectiveKey, id: &str, node: &str) -> Result<Live, LiveError> {
        let node = self.nodes.named(node).ok_or(LiveError::NodeLost)?;
        Ok(Live { node, name: live_ref(&Tenant::of(key), id) })
    }
}

impl Live {
    fn agent(&self) -> Result<&dyn LiveAgent, LiveError> {
        self.node.agent().live().ok_or(LiveError::NodeLost)
    }

    fn name(&self) -> Option<pb::LiveRef> {
        Some(self.name.clone())
    }

    /// Starts a process; its events from `Started` to `Ended`.
    pub async fn start(&self, s: Start) -> Result<LiveEvents, LiveError> {
        let req = pb::LiveStartRequest {
            live: self.name(),
            argv: s.argv,
            env: s.env.into_iter().collect(),
            cwd: s.cwd.unwrap_or_default(),
            stdin: s.stdin,
            pty: s.pty.map(|(rows, cols)| pb::PtySize { rows, cols }),
            tag: s.tag.unwrap_or_default(),
        };
        self.agent()?.start(req).await.map(events).map_err(|s| error(&s))
    }

    /// Re-attaches to process `pid`: what it printed (its last MiB), then on.
    pub async fn connect(&self, pid: i32) -> Result<LiveEvents, LiveError> {
        let req = pb::LiveProcessRequest { live: self.name(), pid };
        self.agent()?.connect(req).await.map(events).map_err(|s| no_process(pid, error(&s)))
    }

    async fn input(&self, pid: i32, input: pb::live_input_request::Input) -> Result<(), LiveError> {
        let req = pb::LiveInputRequest { live: self.name(), pid, input: Some(input) };
        self.agent()?.input(req).await.map_err(|s| no_process(pid, error(&s)))
    }

    /// Writes to its stdin (or terminal).
    pub async fn write(&self, pid: i32, data: Vec<u8>) -> Result<(), LiveError> {
        self.input(pid, pb::live_input_request::Input::Data(data)).await
    }

    /// Closes its stdin.
    pub async fn close_stdin(&self, pid: i32) -> Result<(), LiveError> {
        self.input(pid, pb::live_input_request::Input::Close(true)).await
    }

    /// Resizes its terminal.
    pub async fn resize(&self, pid: i32, rows: u32, cols: u32) -> Result<(), LiveError> {
        self.input(pid, pb::live_input_request::Input::Resize(pb::PtySize { rows, cols })).await
    }

    /// Signals it (and what it started).
    pub async fn signal(&self, pid: i32, signal: i32) -> Result<(), LiveError> {
        let req = pb::LiveSignalRequest { live: self.name(), pid, signal };
        self.agent()?.signal(req).await.map_err(|s| no_process(pid, error(&s)))
    }

    /// Kills process `pid` (and what it started) and waits, at most 10 s,
    /// until it is gone: a listing right after no longer shows it.
    pub async fn kill(&self, pid: i32) -> Result<(), LiveError> {
        self.signal(pid, SIGKILL).await?;
        let mut events = match self.connect(pid).await {
            Ok(e) => e,
            Err(LiveError::NoProcess(_)) => return Ok(()),
            Err(e) => return Err(e),
        };
        let ended = async {
            while let Some(e) = events.next().await {
                if matches!(e, Ok(LiveEvent::Ended(..)) | Err(_)) {
                    return;
                }
            }
        };
        let _ = tokio::time::timeout(std::time::Duration::from_secs(10), ended).await;
        Ok(())
    }

    /// Its running processes.
    pub async fn list(&self) -> Result<Vec<Listed>, LiveError> {
        let r = self.agent()?.list(self.name.clone()).await.map_err(|s| error(&s))?;
        Ok(r.processes
            .into_iter()
            .map(|p| Listed {
                pid: p.pid,
                start: Start {
                    argv: p.argv,
                    env: p.env.into_iter().collect(),
                    cwd: Some(p.cwd).filter(|c| !c.is_empty()),
                    stdin: false,
                    pty: None,
                    tag: Some(p.tag).filter(|t| !t.is_empty()),
                },
            })
            .collect())
    }

    /// Sets how long it may live from now.
    pub async fn set_lifetime(&self, lifetime: Duration) -> Result<(), LiveError> {
        let lifetime_ms = (lifetime + NODE_GRACE).as_millis().min(u128::from(u64::MAX)) as u64;
        self.agent()?.update(pb::LiveUpdateRequest { live: self.name(), lifetime_ms }).await.map_err(|s| error(&s))
    }

    /// A byte stream to `port` on the sandbox's own loopback (nothing else
    /// is reachable this way): write to it and read from it as from the socket.
    pub async fn port(&self, port: u16) -> Result<tokio::io::DuplexStream, LiveError> {
        let (ours, theirs) = tokio::io::duplex(64 << 10);
        let (mut from_caller, mut to_caller) = tokio::io::split(theirs);
        // What the caller writes goes to the agent as messages.
        let outgoing = async_stream::stream! {
            use tokio::io::AsyncReadExt;
            let mut buf = vec![0u8; 32 << 10];
            loop {
                match from_caller.read(&mut buf).await {
                    Ok(0) | Err(_) => return,
                    Ok(n) => yield pb::LivePortRequest { live: None, port: 0, data: buf[..n].to_vec() },
                }
            }
        };
        let first = pb::LivePortRequest { live: self.name(), port: u32::from(port), data: Vec::new() };
        let mut incoming = self.agent()?.port(first, outgoing.boxed()).await.map_err(|s| error(&s))?;
        tokio::spawn(async move {
            use tokio::io::AsyncWriteExt;
            while let Some(Ok(m)) = incoming.next().await {
                if to_caller.write_all(&m.data).await.is_err() {
                    return;
                }
            }
            let _ = to_caller.shutdown().await;
        });
        Ok(ours)
    }

    /// Forks its home as it is now into the new threads `targets` of its
    /// key (`trace_id` names the request).
    pub async fn fork_home(&self, targets: Vec<String>, trace_id: &str) -> Result<(), ExecError> {
        let versions = self.node.agent().versions().ok_or(ExecError::NodeRefused("the sandbox's node does not fork homes"))?;
        let source = self.name.r#ref.as_ref().map(|r| r.thread_id.clone()).unwrap_or_default();
        let first = targets.first().cloned().unwrap_or_default();
        let req = pb::LiveForkRequest { live: self.name(), targets };
        versions.live_fork(req, trace_id).await.map_err(|s| match refusal_of(&s) {
            (Reason::LiveNotFound, _) => ExecError::ThreadNotFound(source.clone()),
            _ => super::refusal::AgentRefusal::read(&s).of_version(&source, &first),
        })
    }

    /// Ends it; true when its home was saved.
    pub async fn end(&self) -> Result<bool, LiveError> {
        let r = self.agent()?.end(self.name.clone()).await.map_err(|s| error(&s))?;
        Ok(!r.save_failed)
    }
}

fn no_process(pid: i32, e: LiveError) -> LiveError {
    match e {
        LiveError::NoProcess(_) => LiveError::NoProcess(pid),
        other => other,
    }
}
