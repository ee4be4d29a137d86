//! A real OTLP trace receiver for tests: the `TraceService` of the official
//! OpenTelemetry protocol definitions (`opentelemetry-proto`), served over
//! gRPC on loopback, keeping every span it is sent.

use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use opentelemetry_proto::tonic::collector::trace::v1::trace_service_server::{TraceService, TraceServiceServer};
use opentelemetry_proto::tonic::collector::trace::v1::{ExportTraceServiceRequest, ExportTraceServiceResponse};

/// One received span, as the collector got it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Span {
    /// `service.name` of the resource that sent it.
    pub service: String,
    /// Its name.
    pub name: String,
    /// Trace id, hex.
    pub trace_id: String,
    /// Span id, hex.
    pub span_id: String,
    /// Parent span id, hex; empty for a root.
    pub parent: String,
    /// Its string attributes.
    pub attributes: Vec<(String, String)>,
}

#[derive(Default, Clone)]
struct Kept(Arc<Mutex<Vec<Span>>>);

fn hex(b: &[u8]) -> String {
    b.iter().map(|x| format!("{x:02x}")).collect()
}

fn string(v: &Option<opentelemetry_proto::tonic::common::v1::AnyValue>) -> String {
    use opentelemetry_proto::tonic::common::v1::any_value::Value;
    match v.as_ref().and_then(|v| v.value.as_ref()) {
        Some(Value::StringValue(s)) => s.clone(),
        Some(Value::IntValue(i)) => i.to_string(),
        Some(Value::BoolValue(b)) => b.to_string(),
        _ => String::new(),
    }
}

#[tonic::async_trait]
impl TraceService for Kept {
    async fn export(&self, req: tonic::Request<ExportTraceServiceRequest>) -> Result<tonic::Response<ExportTraceServiceResponse>, tonic::Status> {
        let mut kept = self.0.lock().unwrap();
        for rs in req.into_inner().resource_spans {
            let service = rs.resource.as_ref().and_then(|r| r.attributes.iter().find(|a| a.key == "service.name")).map(|a| string(&a.value)).unwrap_or_default();
            for ss in rs.scope_spans {
                for s in ss.spans {
                    let attributes = s.attributes.iter().map(|a| (a.key.clone(), string(&a.value))).collect();
                    kept.push(Span { service: service.clone(), name: s.name, trace_id: hex(&s.trace_id), span_id: hex(&s.span_id), parent: hex(&s.parent_span_id), attributes });
                }
            }
        }
        Ok(tonic::Response::new(ExportTraceServiceResponse { partial_success: None }))
    }
}

/// The receiver; stops when dropped.
pub struct Receiver {
    /// Where it listens (`http://` + this is the endpoint to configure).
    pub addr: SocketAddr,
    kept: Kept,
    task: tokio::task::JoinHandle<()>,
}

impl Receiver {
    /// Starts one on a free loopback port.
    pub async fn start() -> anyhow::Result<Receiver> {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
        let addr = listener.local_addr()?;
        let kept = Kept::default();
        let service = TraceServiceServer::new(kept.clone());
        let incoming = futures_util::stream::unfold(listener, |l| async move { Some((l.accept().await.map(|(s, _)| s), l)) });
        let task = tokio::spawn(async move {
            let _ = tonic::transport::Server::builder().add_service(service).serve_with_incoming(incoming).await;
        });
        Ok(Receiver { addr, kept, task })
    }

    /// The endpoint flag's value.
    pub fn endpoint(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// The spans of `trace_id` once `done` holds for them (within `limit`;
    /// exporters batch, so spans arrive a moment after their call).
    pub async fn spans_when(&self, trace_id: &str, limit: Duration, done: impl Fn(&[Span]) -> bool) -> Vec<Span> {
        let end = tokio::time::Instant::now() + limit;
        loop {
            let spans: Vec<Span> = self.kept.0.lock().unwrap().iter().filter(|s| s.trace_id == trace_id).cloned().collect();
            if done(&spans) || tokio::time::Instant::now() >= end {
                return spans;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    /// Every span received.
    pub fn all(&self) -> Vec<Span> {
        self.kept.0.lock().unwrap().clone()
    }
}

impl Drop for Receiver {
    fn drop(&mut self) {
        self.task.abort();
    }
}
