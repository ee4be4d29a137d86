//! The edge to a node-agent: a trait the execution service calls, the gRPC
//! implementation, and (in tests) doubles that need neither root nor sockets.

use std::sync::Arc;

use futures_util::future::BoxFuture;
use futures_util::stream::BoxStream;
use futures_util::{FutureExt, StreamExt};
use tonic::transport::Channel;
use tonic::Status;
use warren_proto::agent::node_agent_client::NodeAgentClient;
use warren_proto::agent::{self as pb};
use warren_proto::client::AgentAddress;

/// The events of one execution, as the agent sends them.
pub type EventStream = BoxStream<'static, Result<pb::ExecuteEvent, Status>>;

/// What the gateway asks of a node-agent.
pub trait Agent: Send + Sync + std::fmt::Debug {
    /// Starts an execution; a status means nothing ran.
    fn execute(&self, req: pb::ExecuteRequest) -> BoxFuture<'static, Result<EventStream, Status>>;
    /// Deletes a thread's saved home; `trace_id` names the HTTP request in the agent's log.
    fn delete_thread(&self, req: pb::DeleteThreadRequest, trace_id: &str) -> BoxFuture<'static, Result<(), Status>>;
    /// Identity, features and capacity.
    fn status(&self) -> BoxFuture<'static, Result<pb::StatusResponse, Status>>;
    /// Kills execution `execution_id` if it runs there; resolves once it has
    /// ended, true when it was running.
    fn cancel(&self, execution_id: &str) -> BoxFuture<'static, Result<bool, Status>>;
    /// The Files API of this agent (doubles may have none).
    fn files(&self) -> Option<&dyn FileAgent> {
        None
    }
    /// Takes a slot of ApiKey `key` (`namespace/name`) under `limit`,
    /// letting the agent wait up to `wait_ms` for one; resolves once
    /// granted. The slot is held until the returned stream is dropped.
    fn hold_key_slot(&self, key: &str, limit: u32, wait_ms: u32) -> BoxFuture<'static, Result<HeldSlot, Status>>;
    /// The live sandboxes of this agent (doubles may have none).
    fn live(&self) -> Option<&dyn LiveAgent> {
        None
    }
    /// Thread versions: forks, restores, histories (doubles may have none).
    fn versions(&self) -> Option<&dyn VersionAgent> {
        None
    }
}

/// The thread-version calls (see the agent's proto: `ForkThread`,
/// `RestoreThread`, `ThreadHistory`); `trace_id` names the HTTP request.
pub trait VersionAgent: Send + Sync {
    /// Forks a thread.
    fn fork(&self, req: pb::ForkThreadRequest, trace_id: &str) -> BoxFuture<'static, Result<(), Status>>;
    /// Restores a thread to an earlier version.
    fn restore(&self, req: pb::RestoreThreadRequest, trace_id: &str) -> BoxFuture<'static, Result<pb::ThreadVersion, Status>>;
    /// A thread's versions, newest first.
    fn history(&self, req: pb::ThreadHistoryRequest, trace_id: &str) -> BoxFuture<'static, Result<Vec<pb::ThreadVersion>, Status>>;
    /// Forks a live sandbox's home as it is now.
    fn live_fork(&self, req: pb::LiveForkRequest, trace_id: &str) -> BoxFuture<'static, Result<(), Status>>;
}

/// A live process's events, as the agent sends them.
pub type LiveStream = BoxStream<'static, Result<pb::LiveEvent, Status>>;

/// The live-sandbox calls (see the agent's proto: `Live*`).
pub trait LiveAgent: Send + Sync {
    /// Makes a live sandbox.
    fn create(&self, req: pb::LiveCreateRequest) -> BoxFuture<'static, Result<pb::LiveCreateResponse, Status>>;
    /// Starts a process and streams it.
    fn start(&self, req: pb::LiveStartRequest) -> BoxFuture<'static, Result<LiveStream, Status>>;
    /// Re-attaches to a process.
    fn connect(&self, req: pb::LiveProcessRequest) -> BoxFuture<'static, Result<LiveStream, Status>>;
    /// Input, close or resize.
    fn input(&self, req: pb::LiveInputRequest) -> BoxFuture<'static, Result<(), Status>>;
    /// Signals a process.
    fn signal(&self, req: pb::LiveSignalRequest) -> BoxFuture<'static, Result<(), Status>>;
    /// Lists its processes.
    fn list(&self, req: pb::LiveRef) -> BoxFuture<'static, Result<pb::LiveListResponse, Status>>;
    /// Sets its lifetime.
    fn update(&self, req: pb::LiveUpdateRequest) -> BoxFuture<'static, Result<(), Status>>;
    /// Ends it (its home saved).
    fn end(&self, req: pb::LiveRef) -> BoxFuture<'static, Result<pb::LiveEndResponse, Status>>;
    /// A connection to one of its ports: `first` names it, `rest` carries the caller's bytes.
    fn port(&self, first: pb::LivePortRequest, rest: BoxStream<'static, pb::LivePortRequest>) -> BoxFuture<'static, Result<PortStream, Status>>;
}

/// The bytes a sandbox's port sends back.
pub type PortStream = BoxStream<'static, Result<pb::LivePortData, Status>>;

/// A file's bytes, as the agent streams them.
pub type FileStream = BoxStream<'static, Result<bytes::Bytes, Status>>;

/// The file operations of the Files API (`trace_id` names the HTTP request).
pub trait FileAgent: Send + Sync {
    /// Lists regular files.
    fn list_files(&self, req: pb::FilesRequest, trace_id: &str) -> BoxFuture<'static, Result<pb::ListFilesResponse, Status>>;
    /// Streams one file.
    fn read_file(&self, req: pb::FilesRequest, trace_id: &str) -> BoxFuture<'static, Result<FileStream, Status>>;
    /// Stores one file of `size` bytes from `data`.
    fn write_file(&self, target: pb::FilesRequest, size: u64, data: BoxStream<'static, bytes::Bytes>, trace_id: &str) -> BoxFuture<'static, Result<(), Status>>;
    /// Removes one file.
    fn delete_file(&self, req: pb::FilesRequest, trace_id: &str) -> BoxFuture<'static, Result<(), Status>>;
}

/// A granted key slot: the open call that holds it on the counting agent.
pub type HeldSlot = BoxStream<'static, Result<pb::KeySlotEvent, Status>>;

/// A node-agent reached over gRPC (Unix socket, or TCP with mutual TLS and a bearer token).
#[derive(Debug, Clone)]
pub struct GrpcAgent {
    client: NodeAgentClient<Channel>,
    token: Option<Arc<str>>,
}

impl GrpcAgent {
    /// A lazily connecting client; TCP agents get the bearer token.
    pub fn new(address: &AgentAddress, token: Option<Arc<str>>, tls: &warren_proto::client::TcpTls) -> anyhow::Result<GrpcAgent> {
        let channel = warren_proto::client::lazy_channel(address, tls)?;
        Ok(GrpcAgent {
            client: NodeAgentClient::new(channel).max_decoding_message_size(16 << 20),
            token: matches!(address, AgentAddress::Tcp(_)).then_some(token).flatten(),
        })
    }

    fn request<T>(&self, msg: T, trace_id: &str) -> tonic::Request<T> {
        let mut req = tonic::Request::new(msg);
        if let Some(v) = self.token.as_ref().and_then(|t| format!("Bearer {t}").parse().ok()) {
            req.metadata_mut().insert("authorization", v);
        }
        if let Ok(v) = trace_id.parse() {
            req.metadata_mut().insert(warren_proto::TRACE_HEADER, v);
        }
        req
    }
}

impl VersionAgent for GrpcAgent {
    fn fork(&self, req: pb::ForkThreadRequest, trace_id: &str) -> BoxFuture<'static, Result<(), Status>> {
        let (mut client, req) = (self.client.clone(), self.request(req, trace_id));
        async move { client.fork_thread(req).await.map(|_| ()) }.boxed()
    }

    fn restore(&self, req: pb::RestoreThreadRequest, trace_id: &str) -> BoxFuture<'static, Result<pb::ThreadVersion, Status>> {
        let (mut client, req) = (self.client.clone(), self.request(req, trace_id));
        async move { client.restore_thread(req).await?.into_inner().version.ok_or_else(|| Status::internal("the agent sent no version")) }.boxed()
    }

    fn history(&self, req: pb::ThreadHistoryRequest, trace_id: &str) -> BoxFuture<'static, Result<Vec<pb::ThreadVersion>, Status>> {
        let (mut client, req) = (self.client.clone(), self.request(req, trace_id));
        async move { Ok(client.thread_history(req).await?.into_inner().versions) }.boxed()
    }

    fn live_fork(&self, req: pb::LiveForkRequest, trace_id: &str) -> BoxFuture<'static, Result<(), Status>> {
        let (mut client, req) = (self.client.clone(), self.request(req, trace_id));
        async move { client.live_fork(req).await.map(|_| ()) }.boxed()
    }
}

impl Agent for GrpcAgent {
    fn execute(&self, req: pb::ExecuteRequest) -> BoxFuture<'static, Result<EventStream, Status>> {
        let trace_id = req.execution_id.clone();
        let (mut client, req) = (self.client.clone(), self.request(req, &trace_id));
        async move { Ok(client.execute(req).await?.into_inner().boxed()) }.boxed()
    }

    fn delete_thread(&self, req: pb::DeleteThreadRequest, trace_id: &str) -> BoxFuture<'static, Result<(), Status>> {
        let (mut client, req) = (self.client.clone(), self.request(req, trace_id));
        async move { client.delete_thread(req).await.map(|_| ()) }.boxed()
    }

    fn status(&self) -> BoxFuture<'static, Result<pb::StatusResponse, Status>> {
        let (mut client, req) = (self.client.clone(), self.request(pb::StatusRequest {}, ""));
        async move { Ok(client.status(req).await?.into_inner()) }.boxed()
    }

    fn cancel(&self, execution_id: &str) -> BoxFuture<'static, Result<bool, Status>> {
        let msg = pb::CancelRequest { execution_id: execution_id.to_string() };
        let (mut client, req) = (self.client.clone(), self.request(msg, execution_id));
        async move { Ok(client.cancel(req).await?.into_inner().was_running) }.boxed()
    }

    fn files(&self) -> Option<&dyn FileAgent> {
        Some(self)
    }

    fn versions(&self) -> Option<&dyn VersionAgent> {
        Some(self)
    }

    fn live(&self) -> Option<&dyn LiveAgent> {
        Some(self)
    }

    fn hold_key_slot(&self, key: &str, limit: u32, wait_ms: u32) -> BoxFuture<'static, Result<HeldSlot, Status>> {
        let msg = pb::KeySlotRequest { key: key.to_string(), limit, wait_ms };
        let (mut client, req) = (self.client.clone(), self.request(msg, ""));
        async move {
            let mut stream = client.hold_key_slot(req).await?.into_inner();
            // Granted with the first event; a stream that ends first granted nothing.
            match stream.message().await? {
                Some(_) => Ok(stream.boxed()),
                None => Err(Status::unavailable("the key-slot call ended before a grant")),
            }
        }
        .boxed()
    }
}

impl LiveAgent for GrpcAgent {
    fn create(&self, req: pb::LiveCreateRequest) -> BoxFuture<'static, Result<pb::LiveCreateResponse, Status>> {
        let (mut client, req) = (self.client.clone(), self.request(req, ""));
        async move { Ok(client.live_create(req).await?.into_inner()) }.boxed()
    }

    fn start(&self, req: pb::LiveStartRequest) -> BoxFuture<'static, Result<LiveStream, Status>> {
        let (mut client, req) = (self.client.clone(), self.request(req, ""));
        async move { Ok(client.live_start(req).await?.into_inner().boxed()) }.boxed()
    }

    fn connect(&self, req: pb::LiveProcessRequest) -> BoxFuture<'static, Result<LiveStream, Status>> {
        let (mut client, req) = (self.client.clone(), self.request(req, ""));
        async move { Ok(client.live_connect(req).await?.into_inner().boxed()) }.boxed()
    }

    fn input(&self, req: pb::LiveInputRequest) -> BoxFuture<'static, Result<(), Status>> {
        let (mut client, req) = (self.client.clone(), self.request(req, ""));
        async move { client.live_input(req).await.map(drop) }.boxed()
    }

    fn signal(&self, req: pb::LiveSignalRequest) -> BoxFuture<'static, Result<(), Status>> {
        let (mut client, req) = (self.client.clone(), self.request(req, ""));
        async move { client.live_signal(req).await.map(drop) }.boxed()
    }

    fn list(&self, req: pb::LiveRef) -> BoxFuture<'static, Result<pb::LiveListResponse, Status>> {
        let (mut client, req) = (self.client.clone(), self.request(req, ""));
        async move { Ok(client.live_list(req).await?.into_inner()) }.boxed()
    }

    fn update(&self, req: pb::LiveUpdateRequest) -> BoxFuture<'static, Result<(), Status>> {
        let (mut client, req) = (self.client.clone(), self.request(req, ""));
        async move { client.live_update(req).await.map(drop) }.boxed()
    }

    fn end(&self, req: pb::LiveRef) -> BoxFuture<'static, Result<pb::LiveEndResponse, Status>> {
        let (mut client, req) = (self.client.clone(), self.request(req, ""));
        async move { Ok(client.live_end(req).await?.into_inner()) }.boxed()
    }

    fn port(&self, first: pb::LivePortRequest, rest: BoxStream<'static, pb::LivePortRequest>) -> BoxFuture<'static, Result<PortStream, Status>> {
        // A channel-fed stream of a concrete type, as for file writes.
        let (tx, rx) = tokio::sync::mpsc::channel(8);
        tokio::spawn(async move {
            let mut rest = rest;
            if tx.send(first).await.is_err() {
                return;
            }
            while let Some(m) = rest.next().await {
                if tx.send(m).await.is_err() {
                    return;
                }
            }
        });
        let messages = tokio_stream::wrappers::ReceiverStream::new(rx);
        let (mut client, req) = (self.client.clone(), self.request(messages, ""));
        async move {
            let mut stream = client.live_port(req).await?.into_inner();
            // The agent's first (empty) message says it connected.
            match stream.message().await? {
                Some(_) => Ok(stream.boxed()),
                None => Err(Status::unavailable("the port's stream ended before it connected")),
            }
        }
        .boxed()
    }
}

impl FileAgent for GrpcAgent {
    fn delete_file(&self, req: pb::FilesRequest, trace_id: &str) -> BoxFuture<'static, Result<(), Status>> {
        let (mut client, req) = (self.client.clone(), self.request(req, trace_id));
        async move { client.delete_file(req).await.map(drop) }.boxed()
    }

    fn list_files(&self, req: pb::FilesRequest, trace_id: &str) -> BoxFuture<'static, Result<pb::ListFilesResponse, Status>> {
        let (mut client, req) = (self.client.clone(), self.request(req, trace_id));
        async move { Ok(client.list_files(req).await?.into_inner()) }.boxed()
    }

    fn read_file(&self, req: pb::FilesRequest, trace_id: &str) -> BoxFuture<'static, Result<FileStream, Status>> {
        let (mut client, req) = (self.client.clone(), self.request(req, trace_id));
        async move { Ok(client.read_file(req).await?.into_inner().map(|c| c.map(|c| bytes::Bytes::from(c.data))).boxed()) }.boxed()
    }

    fn write_file(&self, target: pb::FilesRequest, size: u64, data: BoxStream<'static, bytes::Bytes>, trace_id: &str) -> BoxFuture<'static, Result<(), Status>> {
        // A channel-fed stream of a concrete type: what tonic's client
        // streaming can prove Send for. The feeder stops when the call does.
        let (tx, rx) = tokio::sync::mpsc::channel(4);
        tokio::spawn(async move {
            let mut data = data;
            if tx.send(pb::WriteFileRequest { target: Some(target), size, data: Vec::new() }).await.is_err() {
                return;
            }
            while let Some(d) = data.next().await {
                if tx.send(pb::WriteFileRequest { target: None, size: 0, data: d.to_vec() }).await.is_err() {
                    return;
                }
            }
        });
        let messages = tokio_stream::wrappers::ReceiverStream::new(rx);
        let (mut client, req) = (self.client.clone(), self.request(messages, trace_id));
        async move { client.write_file(req).await.map(|_| ()) }.boxed()
    }
}
