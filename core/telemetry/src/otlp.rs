//! Spans of Warren's own phases (admission, claim, sandbox start, program,
//! save, answer), exported with OpenTelemetry's SDK and its OTLP exporter
//! (gRPC) when `--otlp-endpoint` is set.
//!
//! Nothing here runs unless [`init`] was called: [`enabled`] is one atomic
//! read, and callers build no span without it. Phases are timed by the code
//! that runs them and handed over whole ([`Phase`]), with the ids the
//! caller chose (a program's span id must be known before the program
//! starts, to put it in its `TRACEPARENT`). The SDK's batch processor
//! queues at most 2048 spans and drops beyond that: a slow or absent
//! collector never slows a call.

use std::sync::OnceLock;
use std::time::SystemTime;

use opentelemetry::trace::{Span as _, SpanBuilder, SpanContext, SpanId, SpanKind, TraceContextExt, TraceFlags, TraceId, TraceState, Tracer as _, TracerProvider as _};
use opentelemetry::{Context, KeyValue};
use opentelemetry_otlp::WithExportConfig;
use opentelemetry_sdk::trace::{SdkTracer, SdkTracerProvider};
use warren_core::trace::SpanRef;

static EXPORTER: OnceLock<(SdkTracerProvider, SdkTracer)> = OnceLock::new();

/// One timed phase, as a span.
#[derive(Debug, Clone)]
pub struct Phase {
    /// The span's name (`execute`, `admission`, `program`, …).
    pub name: &'static str,
    /// Its trace and its own span id.
    pub span: SpanRef,
    /// Its parent's span id (same trace); `None`: a root.
    pub parent: Option<[u8; 8]>,
    /// When it began.
    pub start: SystemTime,
    /// When it ended.
    pub end: SystemTime,
    /// A server span (the call as the service received it) rather than an internal one.
    pub server: bool,
    /// Attributes (bounded: ids, outcomes; never code, output or secrets).
    pub attributes: Vec<(&'static str, String)>,
}

/// Checks an endpoint flag: an `http://` or `https://` URL.
pub fn check_endpoint(endpoint: &str) -> Result<(), String> {
    match endpoint.strip_prefix("http://").or_else(|| endpoint.strip_prefix("https://")) {
        Some(rest) if !rest.is_empty() && !rest.contains(char::is_whitespace) => Ok(()),
        _ => Err(format!("OTLP endpoint {endpoint:?}: expected http://HOST:PORT or https://HOST:PORT (OTLP over gRPC)")),
    }
}

/// Starts exporting spans of `service` to `endpoint` (OTLP/gRPC). Call
/// once, inside the Tokio runtime; a second call changes nothing.
pub fn init(endpoint: &str, service: &'static str) -> Result<(), String> {
    check_endpoint(endpoint)?;
    let exporter = opentelemetry_otlp::SpanExporter::builder().with_tonic().with_endpoint(endpoint).build().map_err(|e| format!("OTLP exporter: {e}"))?;
    let resource = opentelemetry_sdk::Resource::builder().with_service_name(service).build();
    let provider = SdkTracerProvider::builder().with_batch_exporter(exporter).with_resource(resource).build();
    let tracer = provider.tracer("warren");
    let _ = EXPORTER.set((provider, tracer));
    Ok(())
}

/// Spans are exported.
pub fn enabled() -> bool {
    EXPORTER.get().is_some()
}

/// Hands `phases` to the exporter (nothing when not enabled).
pub fn export(phases: impl IntoIterator<Item = Phase>) {
    let Some((_, tracer)) = EXPORTER.get() else { return };
    for p in phases {
        let trace_id = TraceId::from_bytes(p.span.trace_id);
        let parent = match p.parent {
            Some(id) => Context::new().with_remote_span_context(SpanContext::new(trace_id, SpanId::from_bytes(id), TraceFlags::SAMPLED, true, TraceState::default())),
            None => Context::new(),
        };
        let kind = if p.server { SpanKind::Server } else { SpanKind::Internal };
        let attributes: Vec<KeyValue> = p.attributes.into_iter().map(|(k, v)| KeyValue::new(k, v)).collect();
        let builder = SpanBuilder::from_name(p.name).with_kind(kind).with_trace_id(trace_id).with_span_id(SpanId::from_bytes(p.span.span_id)).with_start_time(p.start).with_attributes(attributes);
        let mut span = tracer.build_with_context(builder, &parent);
        span.end_with_timestamp(p.end);
    }
}

/// Sends what is queued (at shutdown; bounded by the SDK's export timeout).
pub fn flush() {
    if let Some((provider, _)) = EXPORTER.get() {
        let _ = provider.force_flush();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn endpoints_are_checked_and_nothing_is_exported_without_one() {
        assert!(check_endpoint("http://127.0.0.1:4317").is_ok());
        assert!(check_endpoint("https://collector.example:4317").is_ok());
        for bad in ["", "127.0.0.1:4317", "http://", "grpc://x:1", "http://a b"] {
            assert!(check_endpoint(bad).is_err(), "{bad:?}");
        }
        assert!(!enabled());
        let now = SystemTime::now();
        let span = SpanRef { trace_id: [1; 16], span_id: [2; 8], sampled: true };
        export([Phase { name: "x", span, parent: None, start: now, end: now, server: false, attributes: vec![] }]);
    }
}
