//! The execution service: admission, node selection and the agent call,
//! shared by every adapter (HTTP JSON, NDJSON stream, later async and MCP).
//! It speaks domain values only: a key and a request in, [`RunEvent`]s and
//! [`ExecError`]s out.

use std::sync::Arc;
use std::time::Duration;

use futures_util::StreamExt;
use warren_config::EffectiveKey;

use super::agent::EventStream;
use super::convert::{self, run_event, RunEvent};
use super::spec::{placement_key, Delivery, ExecutionSpec, Tenant};
use super::{ExecError, Exit};
use super::keyslot::{self, KeySlot};
use super::output::{Holding, Output};
use super::refusal;
use warren_proto::agent as pb;
use crate::admission::{Admission, KeyTurn, ThreadLock};
use crate::audit::Audit;
use crate::budget::OutputBudget;
use crate::metrics::{InFlight, Metrics};
use crate::nodes::{Lease, Nodes};
use super::request::ExecuteRequest;
use crate::result::Outcome;

/// The gateway's execution service; cheap to clone.
#[derive(Debug, Clone)]
pub struct ExecutionService {
    /// Node-agents.
    pub nodes: Arc<Nodes>,
    /// Per-thread admission within this gateway.
    pub admission: Arc<Admission>,
    /// Gateway memory for execution output.
    pub budget: Arc<OutputBudget>,
    /// Metrics.
    pub metrics: Arc<Metrics>,
    /// How long a request waits, in order, for capacity (its key's turn
    /// and slot, output memory, a node slot) before it is refused with 429.
    pub queue_wait: Duration,
    /// The execution records.
    pub records: crate::records::Recorder,
}

/// An admitted execution, not sent yet.
#[derive(Debug)]
pub struct Admitted {
    /// The resolved execution.
    pub spec: ExecutionSpec,
    held: Held,
    /// Resolves to true once its record is committed.
    pub recorded: tokio::sync::oneshot::Receiver<bool>,
}

/// Everything one execution holds; dropping it releases the key slot and
/// turn, the thread, the output memory and the node slot, and writes the
/// audit record.
#[derive(Debug)]
struct Held {
    lease: Lease,
    audit: Audit,
    _in_flight: InFlight,
    _thread: Option<ThreadLock>,
    slot: KeySlot,
    _turn: KeyTurn,
    output: Output,
    /// The end of the queue wait: what the agent may still wait for its slots.
    deadline: tokio::time::Instant,
}

/// A started execution: its events, and what it holds until it ends.
///
/// Dropped before its agent said `Exited` (client gone, stalled, timed
/// out here), it asks the agent to cancel and keeps holding the key slot,
/// node lease and output memory until the agent answers that the execution
/// has ended, so nothing is released while the sandbox may still run.
pub struct Run {
    /// Execution id (`trc_…`).
    pub id: String,
    // `None` only once dropped.
    live: Option<Live>,
    /// What its output may hold, kept once the run let go of its holdings.
    holding: Holding,
}

struct Live {
    held: Held,
    events: EventStream,
    /// The agent stream ended (with `Exited` or broken).
    ended: bool,
    /// An output chunk waiting for memory (kept if that wait is cancelled).
    pending: Option<RunEvent>,
}

/// The agent stream ended without `Exited`. Once the agent accepted the call
/// the program may have started, so this is never "nothing ran".
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Lost;

impl ExecutionService {
    /// Checks `req` against `key` and takes everything the execution holds:
    /// the thread (409 when busy, or after the queue wait when the request waits for it), then, each waiting in order until the
    /// queue wait ends (429 then), the key's turn, a first step of output
    /// memory, a node slot and the key's slot (or its request, taken with
    /// the execution). Nothing has reached a node when this returns.
    pub async fn admit(&self, key: &EffectiveKey, req: ExecuteRequest, delivery: Delivery) -> Result<Admitted, ExecError> {
        self.admit_as(key, req, delivery, super::new_trace_id()).await
    }

    /// [`ExecutionService::admit`] as execution `id` (a `trc_…` id the
    /// caller made: an idempotent call's, claimed before it runs).
    pub async fn admit_as(&self, key: &EffectiveKey, mut req: ExecuteRequest, delivery: Delivery, id: String) -> Result<Admitted, ExecError> {
        let deadline = tokio::time::Instant::now() + self.queue_wait;
        let (trace, mut spans) = crate::traced::begin(req.trace.take());
        let mut spec = ExecutionSpec::new(id, key, &mut req, delivery)?;
        spec.contract.trace = trace;
        let qualified = key.qualified_name();
        let thread = match &spec.contract.thread {
            Some(t) if req.wait_for_thread => Some(self.admission.thread_until(&qualified, &t.id, deadline).await?),
            Some(t) => Some(self.admission.thread(&qualified, &t.id)?),
            None => None,
        };
        let max_output = spec.max_output_bytes();
        self.budget.fits(crate::budget::worst_case(max_output))?;
        // Those waiting for the key's turn hold nothing else meanwhile.
        let turn = self.admission.key_turn(&qualified, key.max_concurrency, deadline).await?;
        let first = crate::budget::STEP.min(crate::budget::worst_case(max_output));
        let output = Output::new(self.budget.reserve_until(&qualified, first, deadline).await?, max_output, self.queue_wait);
        let lease = self.nodes.lease_for(spec.placement().as_deref(), spec.contract.image.warm_key(), deadline).await?;
        let slot = keyslot::take(&self.nodes, &qualified, key.max_concurrency, &lease.node, deadline).await?;
        let record = crate::records::NewRecord {
            trace_id: spec.contract.id.clone(),
            namespace: key.namespace.clone(),
            key_name: key.name.clone(),
            sandbox: key.sandbox.clone(),
            language: spec.contract.language.as_str(),
            thread_id: req.thread_id.take(),
            otel_trace_id: spec.contract.trace.as_ref().map(|t| t.parent.trace_hex()),
            metadata: std::mem::take(&mut req.metadata),
            mode: delivery.mode(),
            node: lease.node.name(),
            owner: self.records.owner.to_string(),
            timeout_secs: spec.contract.timeout.as_secs() as u32,
            webhook_url: req.webhook_url.take(),
            created_ms: crate::records::now_ms(),
        };
        if let Some(s) = spans.as_mut() {
            s.admitted();
        }
        let (audit, recorded) = Audit::start(record, &self.records, self.metrics.clone(), spans);
        let held = Held { lease, audit, _in_flight: self.metrics.in_flight(), _thread: thread, slot, _turn: turn, output, deadline };
        Ok(Admitted { spec, held, recorded })
    }

    /// Sends the execution to its node; an error means nothing ran.
    pub async fn start(&self, a: Admitted) -> Result<Run, ExecError> {
        let Admitted { spec, mut held, .. } = a;
        let (id, thread_id) = (spec.contract.id.clone(), spec.contract.thread.as_ref().map(|t| t.id.clone()));
        // The code moves into the wire request (up to 1 MiB not copied).
        let mut wire = pb::ExecuteRequest::from(spec.contract);
        // What is left of the queue wait, for the agent's slots.
        wire.key_slot = held.slot.for_execute(held.deadline);
        wire.queue_wait_ms = keyslot::wait_ms(held.deadline);
        match held.lease.node.agent().execute(wire).await {
            Ok(events) => {
                let holding = held.output.holding();
                Ok(Run { id, live: Some(Live { held, events, ended: false, pending: None }), holding })
            }
            Err(status) => {
                held.audit.finish(Outcome::SandboxError, None);
                let (e, broken) = refusal::AgentRefusal::read(&status).of_execute(thread_id.as_deref(), held.slot.limit());
                tracing::warn!(execution_id = %id, node = %held.lease.node.address, code = ?status.code(), reason = status.message(), "node-agent refused the execution");
                if broken {
                    held.lease.node.mark_unhealthy();
                }
                Err(e)
            }
        }
    }

    /// Deletes a thread of `key`: on the node that holds it, whose answer
    /// decides the outcome, and then on every other healthy node, which
    /// drops its warm copy (and, with per-node stores, a copy saved while the
    /// thread's home was elsewhere). A thread the home node does not know
    /// but another node deleted counts as deleted. `trace_id` names the
    /// HTTP request in the agents' logs.
    pub async fn delete_thread(&self, key: &EffectiveKey, thread_id: &str, trace_id: &str) -> Result<(), ExecError> {
        if !warren_core::ids::is_thread_id(thread_id) {
            return Err(ExecError::invalid("thread_id", warren_core::ids::THREAD_ID_RULE));
        }
        // Held for the call: an execute through this gateway cannot start meanwhile.
        let _lock = self.admission.thread(&key.qualified_name(), thread_id)?;
        let tenant = Tenant::of(key);
        let home = self.nodes.home_of(&placement_key(&tenant, thread_id)).ok_or(ExecError::NoNode)?;
        let msg = warren_proto::agent::DeleteThreadRequest { thread: Some(convert::thread_ref(&tenant, thread_id)) };
        let at_home = home.agent().delete_thread(msg.clone(), trace_id).await.map_err(|s| {
            tracing::warn!(node = %home.address, code = ?s.code(), "deleting a thread failed");
            refusal::AgentRefusal::read(&s).of_delete(thread_id)
        });
        if matches!(at_home, Ok(()) | Err(ExecError::ThreadNotFound(_))) {
            let elsewhere = self.delete_elsewhere(&home, &msg, trace_id).await;
            if elsewhere && at_home.is_err() {
                tracing::info!(key = %key.qualified_name(), thread_id, "thread deleted on a node other than its home");
                return Ok(());
            }
        }
        at_home?;
        tracing::info!(key = %key.qualified_name(), thread_id, "thread deleted");
        Ok(())
    }

    /// Sends the deletion to every healthy node but `home`, each bounded in
    /// time; true when one of them had the thread.
    async fn delete_elsewhere(&self, home: &Arc<crate::nodes::Node>, msg: &warren_proto::agent::DeleteThreadRequest, trace_id: &str) -> bool {
        let others: Vec<_> = self.nodes.healthy_nodes().into_iter().filter(|n| !Arc::ptr_eq(n, home)).collect();
        let calls = others.iter().map(|n| {
            let call = n.agent().delete_thread(msg.clone(), trace_id);
            async move {
                match tokio::time::timeout(DELETE_ELSEWHERE_WAIT, call).await {
                    Ok(Ok(())) => true,
                    Ok(Err(s)) if refusal::AgentRefusal::read(&s).reason == pb::RefusalReason::ThreadNotFound => false,
                    Ok(Err(s)) => {
                        tracing::warn!(node = %n.address, code = ?s.code(), "dropping a thread's copy failed; its collector removes it later");
                        false
                    }
                    Err(_) => {
                        tracing::warn!(node = %n.address, "dropping a thread's copy timed out; its collector removes it later");
                        false
                    }
                }
            }
        });
        futures_util::future::join_all(calls).await.into_iter().any(|had| had)
    }
}

/// How long a deletion waits for each node other than the thread's home.
const DELETE_ELSEWHERE_WAIT: Duration = Duration::from_secs(10);

impl Run {
    /// The next event; `Err(Lost)` when the stream broke before `Exited`.
    /// Output is kept only once its memory is reserved (see `output`); a
    /// stream cut for want of memory yields nothing more. Cancel-safe.
    pub async fn next(&mut self) -> Result<RunEvent, Lost> {
        let Some(live) = self.live.as_mut() else { return Err(Lost) };
        loop {
            let ev = match live.pending.take() {
                Some(ev) => ev,
                None => match live.events.next().await {
                    Some(Ok(e)) => match run_event(e) {
                        Some(ev) => ev,
                        None => continue,
                    },
                    Some(Err(_)) | None => {
                        // A broken stream: the agent ended the call (or died).
                        live.ended = true;
                        return Err(Lost);
                    }
                },
            };
            let chunk = match &ev {
                RunEvent::Stdout(c) => Some((0, c.len())),
                RunEvent::Stderr(c) => Some((1, c.len())),
                RunEvent::Exited(_) => {
                    live.ended = true;
                    None
                }
                RunEvent::Started => None,
            };
            let Some((i, n)) = chunk else { return Ok(ev) };
            live.pending = Some(ev);
            let kept = live.held.output.room(i, n, &self.id).await;
            self.holding = live.held.output.holding();
            match live.pending.take() {
                Some(ev) if kept => return Ok(ev),
                _ => continue,
            }
        }
    }

    /// What each output stream may hold (its share of the reservation) and
    /// which were cut: what every result is held within.
    pub fn holding(&self) -> Holding {
        self.holding
    }

    /// Runs to the end, collecting the output; the result is recorded. On a
    /// broken stream the node is marked down and `NodeLost` returned.
    pub async fn collect(&mut self) -> Result<crate::result::ExecuteResult, ExecError> {
        let (mut out, mut err) = (Vec::new(), Vec::new());
        let x = loop {
            match self.next().await {
                Ok(RunEvent::Stdout(c)) => out.extend_from_slice(&c),
                Ok(RunEvent::Stderr(c)) => err.extend_from_slice(&c),
                Ok(RunEvent::Exited(x)) => break x,
                Ok(RunEvent::Started) => {}
                Err(Lost) => return Err(self.lost()),
            }
        };
        let text = |raw: Vec<u8>| String::from_utf8(raw).unwrap_or_else(|e| String::from_utf8_lossy(e.as_bytes()).into_owned());
        Ok(self.end(&x, text(out), text(err)).0)
    }

    /// Ends the run that exited with `x`, having shown `stdout` and `stderr`
    /// (what the adapter passed on): its result, held within what the run
    /// reserved for its output, is recorded and returned with its outcome.
    /// Every adapter ends a run here; none builds or records a result itself.
    pub fn end(&mut self, x: &Exit, stdout: String, stderr: String) -> (crate::result::ExecuteResult, Outcome) {
        let outcome = Outcome::of(x);
        let result = crate::result::ExecuteResult::new(&self.id, x, stdout, stderr).held_within(&self.holding);
        if let Some(live) = self.live.as_mut() {
            live.held.audit.result(outcome, &result);
        }
        (result, outcome)
    }

    /// Once the agent's stream has ended (`Exited` or broken), queues the
    /// record's end now rather than when the run is dropped.
    pub fn record_end(&mut self) {
        if let Some(live) = self.live.as_mut().filter(|l| l.ended) {
            live.held.audit.end_now();
        }
    }

    /// Records a broken stream and marks the node down until its next check.
    pub fn lost(&mut self) -> ExecError {
        if let Some(live) = self.live.as_mut() {
            tracing::warn!(execution_id = %self.id, node = %live.held.lease.node.address, "node-agent stream broke mid-execution");
            live.held.audit.finish(Outcome::NodeLost, None);
            live.held.lease.node.mark_unhealthy();
        }
        ExecError::NodeLost
    }
}

/// How long a released-early execution's holdings wait for its agent to
/// confirm the end; beyond it the agent is broken and its slots are freed.
const CANCEL_WAIT: Duration = Duration::from_secs(60);

impl Drop for Run {
    fn drop(&mut self) {
        let Some(Live { held, events, ended, .. }) = self.live.take() else { return };
        if ended {
            return;
        }
        let Ok(rt) = tokio::runtime::Handle::try_current() else { return };
        let id = std::mem::take(&mut self.id);
        rt.spawn(async move {
            // Letting go of the stream already tells the agent to kill the
            // sandbox; Cancel answers once it has actually ended.
            drop(events);
            let node = held.lease.node.clone();
            match tokio::time::timeout(CANCEL_WAIT, node.agent().cancel(&id)).await {
                Ok(Ok(_)) => {}
                Ok(Err(status)) => tracing::warn!(execution_id = %id, node = %node.address, code = ?status.code(), "cancel failed; releasing the execution's slots"),
                Err(_) => tracing::warn!(execution_id = %id, node = %node.address, "the agent did not confirm the cancelled execution's end; releasing its slots"),
            }
            drop(held);
        });
    }
}
