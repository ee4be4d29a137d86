//! The tonic adapter: proto in, executor call, events out.

use std::sync::Arc;
use std::time::Instant;

use tokio::sync::mpsc;
use tokio_stream::wrappers::ReceiverStream;
use tonic::{Request, Response, Status};
use tracing::{info, warn};
use warren_proto::agent::{self as pb, execute_event::Event as PbEvent, node_agent_server::NodeAgent};

use crate::convert;
use crate::executor::Executor;
use crate::sandbox::{Event, Outcome};

/// gRPC service over an [`Executor`].
pub struct AgentService {
    exec: Arc<Executor>,
}

impl AgentService {
    /// Wraps an executor.
    pub fn new(exec: Arc<Executor>) -> AgentService {
        AgentService { exec }
    }
}

type EventResult = Result<pb::ExecuteEvent, Status>;

fn event(e: PbEvent) -> pb::ExecuteEvent {
    pb::ExecuteEvent { event: Some(e) }
}

#[tonic::async_trait]
impl NodeAgent for AgentService {
    type ExecuteStream = ReceiverStream<EventResult>;

    async fn execute(&self, req: Request<pb::ExecuteRequest>) -> Result<Response<Self::ExecuteStream>, Status> {
        let received = Instant::now();
        let mut req = req.into_inner();
        let thread = convert::thread_options(req.thread.take())?;
        let admission = self.exec.admit(convert::exec_request(req)?, thread).await.map_err(|e| convert::to_status(&e))?;
        let id = Executor::admission_id(&admission).to_string();
        let (tx, rx) = mpsc::channel::<EventResult>(16);
        let exec = self.exec.clone();
        tokio::spawn(async move {
            let (ev_tx, ev_rx) = mpsc::channel::<Event>(16);
            let node = exec.node_name().to_string();
            let stall = exec.output_stall();
            let fwd = forward(ev_rx, tx.clone(), id.clone(), node, stall);
            let (result, ()) = tokio::join!(exec.execute(admission, received, ev_tx), fwd);
            let last = match result {
                Ok(outcome) => {
                    log_outcome(&id, &outcome);
                    Ok(event(PbEvent::Exited(convert::exited(&outcome))))
                }
                Err(e) => {
                    warn!(execution_id = %id, error = %e, "execution failed before it started");
                    Err(convert::to_status(&e))
                }
            };
            // A caller that reads nothing does not keep this task forever.
            let _ = tokio::time::timeout(stall, tx.send(last)).await;
        });
        Ok(Response::new(ReceiverStream::new(rx)))
    }

    async fn delete_thread(&self, req: Request<pb::DeleteThreadRequest>) -> Result<Response<pb::DeleteThreadResponse>, Status> {
        let key = convert::thread_key(req.into_inner().thread)?;
        self.exec.threads().delete(&key).await.map_err(|e| convert::thread_status(&e))?;
        Ok(Response::new(pb::DeleteThreadResponse {}))
    }

    async fn status(&self, _req: Request<pb::StatusRequest>) -> Result<Response<pb::StatusResponse>, Status> {
        Ok(Response::new(pb::StatusResponse {
            node_name: self.exec.node_name().to_string(),
            features: Some(convert::features(self.exec.features())),
            running_executions: self.exec.running(),
            max_executions: self.exec.max_executions(),
            languages: self.exec.languages().into_iter().map(|l| pb::Language::from(l) as i32).collect(),
            agent_version: env!("CARGO_PKG_VERSION").to_string(),
        }))
    }
}

/// Moves sandbox events to the gRPC stream; returns (dropping `events`, which
/// kills the execution) as soon as the caller goes away or takes nothing
/// for `stall`.
async fn forward(mut events: mpsc::Receiver<Event>, tx: mpsc::Sender<EventResult>, id: String, node: String, stall: std::time::Duration) {
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

fn log_outcome(id: &str, o: &Outcome) {
    info!(
        execution_id = %id,
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

