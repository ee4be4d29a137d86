//! The gateway's part of a call's trace (W3C Trace Context, #47): the
//! caller's `traceparent`/`tracestate` read from the headers, the trace the
//! execution continues on its node, and the gateway's own spans — the call
//! (`execute`, a server span), its `admission` (key turn, output memory, a
//! node, the key's slot) and its `answer` (from the node's exit to the end of
//! the call) — exported when `--otlp-endpoint` is set. Without an endpoint
//! the caller's context passes through unchanged and nothing is built.

use std::time::SystemTime;

use axum::http::HeaderMap;
use warren_core::trace::{SpanRef, Trace};
use warren_telemetry::otlp::{self, Phase};

/// The caller's trace context, when its headers carry a valid one
/// (malformed: ignored, as the spec says).
pub fn from_headers(headers: &HeaderMap) -> Option<Trace> {
    let value = |name: &str| headers.get(name).and_then(|v| v.to_str().ok()).unwrap_or("");
    Trace::from_headers(value("traceparent"), value("tracestate"))
}

/// An execution's spans at the gateway, while it runs.
#[derive(Debug, Clone)]
pub struct GatewaySpans {
    /// The call's span (the parent of every other span of it).
    pub call: SpanRef,
    /// The caller's span, when it sent one.
    caller: Option<[u8; 8]>,
    received: SystemTime,
    admitted: Option<SystemTime>,
    exited: Option<SystemTime>,
}

/// The trace the execution continues on its node, and the gateway's spans
/// to export (only with an endpoint).
pub fn begin(caller: Option<Trace>) -> (Option<Trace>, Option<GatewaySpans>) {
    if !otlp::enabled() {
        return (caller, None);
    }
    let mut fill = |b: &mut [u8]| rand::fill(b);
    let call = match &caller {
        Some(t) => t.parent.child(&mut fill),
        None => SpanRef::root(&mut fill),
    };
    let spans = GatewaySpans { call, caller: caller.as_ref().map(|t| t.parent.span_id), received: SystemTime::now(), admitted: None, exited: None };
    (Some(Trace { parent: call, state: caller.and_then(|t| t.state) }), Some(spans))
}

impl GatewaySpans {
    /// Admission is over.
    pub fn admitted(&mut self) {
        self.admitted = Some(SystemTime::now());
    }

    /// The node said the program ended (or the call ended without it).
    pub fn exited(&mut self) {
        self.exited.get_or_insert_with(SystemTime::now);
    }

    /// Exports the call's spans, ending now.
    pub fn export(self, execution_id: &str, key: &str, outcome: &str) {
        let now = SystemTime::now();
        let mut fill = |b: &mut [u8]| rand::fill(b);
        let ids = vec![("warren.execution_id", execution_id.to_string())];
        let attributes = [ids.clone(), vec![("warren.key", key.to_string()), ("warren.outcome", outcome.to_string())]].concat();
        let mut phases = vec![Phase { name: "execute", span: self.call, parent: self.caller, start: self.received, end: now, server: true, attributes }];
        let child = |name, start, end, fill: &mut dyn FnMut(&mut [u8])| Phase { name, span: self.call.child(fill), parent: Some(self.call.span_id), start, end, server: false, attributes: ids.clone() };
        if let Some(admitted) = self.admitted {
            phases.push(child("admission", self.received, admitted, &mut fill));
        }
        if let Some(exited) = self.exited {
            phases.push(child("answer", exited, now, &mut fill));
        }
        otlp::export(phases);
    }
}
