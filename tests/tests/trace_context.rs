//! W3C trace context across the sandbox boundary (#47), end to end: a real
//! OTLP receiver (the official protocol definitions, `warren_e2e::otlp`)
//! gets the gateway's and the node-agent's spans of a call made with a
//! `traceparent`, and a sandboxed program using the official
//! `opentelemetry-sdk` from PyPI continues the caller's trace under the
//! program's span. Without an endpoint the caller's context passes through
//! untouched; a malformed one is ignored; the trace id is in the record and
//! the audit query.

use std::time::Duration;

use serde_json::{json, Value};
use warren_e2e::gateway::{key, Gateway};
use warren_e2e::otlp::{Receiver, Span};
use warren_e2e::{skip_unless_root, Agent};

const CALLER_TRACE: &str = "4bf92f3577b34da6a3ce929d0e0e4736";
const CALLER_SPAN: &str = "00f067aa0ba902b7";
/// The SDK pinned for the sandboxed program.
const OTEL_SDK: &str = "opentelemetry-sdk==1.38.0";
/// Batches leave the exporters within this (instead of the SDK's 5 s).
const BATCH: (&str, &str) = ("OTEL_BSP_SCHEDULE_DELAY", "100");

fn traceparent() -> String {
    format!("00-{CALLER_TRACE}-{CALLER_SPAN}-01")
}

/// `POST /v1/sandbox/execute` with extra headers; the result.
fn execute(gw: &Gateway, k: &str, body: &Value, headers: &[(&str, &str)]) -> Value {
    let body = body.to_string();
    let extra: String = headers.iter().map(|(h, v)| format!("{h}: {v}\r\n")).collect();
    let req = format!(
        "POST /v1/sandbox/execute HTTP/1.1\r\nHost: {}\r\nConnection: close\r\nAuthorization: Bearer {k}\r\nContent-Type: application/json\r\n{extra}Content-Length: {}\r\n\r\n{body}",
        gw.addr,
        body.len()
    );
    let r = warren_e2e::http::raw(gw.addr, req.as_bytes()).unwrap();
    assert_eq!(r.status, 200, "{}", r.text());
    r.json()
}

/// Puts the SDK's packages into thread `thread`'s home (Files API, one
/// tarball unpacked by a call): the sandbox has no network to pip from.
fn install_sdk(gw: &Gateway, k: &str, thread: &str) {
    let venv = warren_e2e::python::venv("otel-venv", OTEL_SDK);
    let site = venv.join("lib/python3.11/site-packages");
    let tarball = venv.join("sdk.tgz");
    let ok = std::process::Command::new("tar").arg("czf").arg(&tarball).arg("-C").arg(&site).arg(".").status().unwrap();
    assert!(ok.success());
    let bytes = std::fs::read(&tarball).unwrap();
    let asked = gw.post_json(k, "/v1/files/upload_url", &json!({"source": "thread", "id": thread, "path": "sdk.tgz", "content_length": bytes.len()}));
    assert_eq!(asked.status, 200, "{}", asked.text());
    let url = asked.json()["url"].as_str().unwrap().to_string();
    let path = url.split_once(&gw.addr.to_string()).map(|(_, p)| p.to_string()).unwrap();
    let put = warren_e2e::http::request(gw.addr, "PUT", &path, &[("content-type", "application/octet-stream")], &bytes);
    assert!(put.status < 300, "{}", put.text());
    let r = execute(gw, k, &json!({"code": "mkdir -p ~/py && tar xzf ~/sdk.tgz -C ~/py && rm ~/sdk.tgz && echo ok", "language": "bash", "thread_id": thread, "timeout": 60}), &[]);
    assert_eq!(r["stdout"].as_str(), Some("ok\n"), "{r}");
}

/// A program that continues the trace in `TRACEPARENT` with the official
/// SDK and prints its span's trace id, parent span id and `TRACESTATE`.
const PROGRAM: &str = r#"
import os, sys
sys.path.insert(0, os.path.expanduser("~/py"))
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator
exporter = InMemorySpanExporter()
provider = TracerProvider()
provider.add_span_processor(SimpleSpanProcessor(exporter))
carrier = {"traceparent": os.environ.get("TRACEPARENT", ""), "tracestate": os.environ.get("TRACESTATE", "")}
with provider.get_tracer("tool").start_as_current_span("work", context=TraceContextTextMapPropagator().extract(carrier)):
    pass
span = exporter.get_finished_spans()[0]
print(format(span.context.trace_id, "032x"), format(span.parent.span_id, "016x") if span.parent else "-", os.environ.get("TRACESTATE", "-"))
"#;

fn named<'s>(spans: &'s [Span], name: &str) -> &'s Span {
    spans.iter().find(|s| s.name == name).unwrap_or_else(|| panic!("no {name} span in {spans:#?}"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_callers_trace_continues_through_warren_into_the_program() {
    if skip_unless_root("a_callers_trace_continues_through_warren_into_the_program") {
        return;
    }
    let receiver = Receiver::start().await.unwrap();
    let endpoint = receiver.endpoint();
    let agent = Agent::start_with(&["--otlp-endpoint", &endpoint], &[BATCH], None).await.unwrap();
    let gw = Gateway::start_with_env(&[agent.address()], &["--otlp-endpoint", &endpoint], &[BATCH], true).await.unwrap();
    let k = key("thr");
    install_sdk(&gw, &k, "otel");
    let tp = traceparent();
    let r = execute(&gw, &k, &json!({"code": PROGRAM, "language": "python", "thread_id": "otel", "timeout": 60}), &[("traceparent", &tp), ("tracestate", "vendor=abc")]);
    let out = r["stdout"].as_str().unwrap_or_default().to_string();
    let [trace, parent, state]: [&str; 3] = out.split_whitespace().collect::<Vec<_>>().try_into().unwrap_or_else(|_| panic!("{r}"));
    assert_eq!((trace, state), (CALLER_TRACE, "vendor=abc"), "the program continues the caller's trace: {r}");
    // Every phase as a span of the caller's trace: the gateway's call under
    // the caller's span, the node's phases under the call, the program's own
    // span under Warren's `program` span.
    let want = ["execute", "admission", "answer", "claim", "sandbox start", "program", "save"];
    let spans = receiver.spans_when(CALLER_TRACE, Duration::from_secs(30), |s| want.iter().all(|w| s.iter().any(|x| x.name == *w))).await;
    let call = named(&spans, "execute");
    assert_eq!((call.parent.as_str(), call.service.as_str()), (CALLER_SPAN, "warren-gateway"), "{spans:#?}");
    for name in ["admission", "answer"] {
        assert_eq!(named(&spans, name).parent, call.span_id, "{name}");
    }
    for name in ["claim", "sandbox start", "program", "save"] {
        let s = named(&spans, name);
        assert_eq!((s.parent.as_str(), s.service.as_str()), (call.span_id.as_str(), "warren-node-agent"), "{name}: {spans:#?}");
    }
    let program = named(&spans, "program");
    assert_eq!(parent, program.span_id, "the program's span is the parent of the program's own");
    let trace_id = r["trace_id"].as_str().unwrap();
    assert!(program.attributes.contains(&("warren.execution_id".into(), trace_id.into())), "{program:?}");
    assert!(!spans.iter().any(|s| s.attributes.iter().any(|(_, v)| v.contains("TracerProvider"))), "no code in span attributes");
    // The trace id is in the record and the audit query.
    let rec = gw.record_when("thr", trace_id, |v| v["status"] == "success");
    assert_eq!(rec["otel_trace_id"].as_str(), Some(CALLER_TRACE), "{rec}");
    let found = gw.get(&k, &format!("/v1/executions?otel_trace_id={CALLER_TRACE}")).json();
    assert_eq!(found["executions"].as_array().map(|a| a.iter().map(|e| e["trace_id"].as_str().unwrap_or("")).collect::<Vec<_>>()), Some(vec![trace_id]), "{found}");
    assert_eq!(gw.get(&k, "/v1/executions?otel_trace_id=NOTHEX").status, 400);

    // A malformed traceparent is ignored: the call runs in a new trace of
    // Warren's own, and the program continues that one.
    let r = execute(&gw, &k, &json!({"code": PROGRAM, "language": "python", "thread_id": "otel", "timeout": 60}), &[("traceparent", "00-nothex-00f067aa0ba902b7-01")]);
    let new_trace = r["stdout"].as_str().unwrap().split_whitespace().next().unwrap().to_string();
    assert!(new_trace.len() == 32 && new_trace != CALLER_TRACE, "{r}");
    let spans = receiver.spans_when(&new_trace, Duration::from_secs(30), |s| s.iter().any(|x| x.name == "execute")).await;
    assert_eq!(named(&spans, "execute").parent, "", "a root span of a new trace");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_an_endpoint_the_callers_context_passes_through_untouched() {
    if skip_unless_root("without_an_endpoint_the_callers_context_passes_through_untouched") {
        return;
    }
    let agent = Agent::start(&[]).await.unwrap();
    let gw = Gateway::start(&[agent.address()], &[], true).await.unwrap();
    let k = key("main");
    let code = "import os; print(os.environ.get('TRACEPARENT', '-'), os.environ.get('TRACESTATE', '-'))";
    let tp = traceparent();
    let r = execute(&gw, &k, &json!({"code": code, "env_vars": {"TRACEPARENT": "spoofed"}}), &[("traceparent", &tp), ("tracestate", "a=1, b=2")]);
    assert_eq!(r["stdout"].as_str(), Some(format!("{tp} a=1,b=2\n").as_str()), "{r}");
    let r = execute(&gw, &k, &json!({"code": code}), &[]);
    assert_eq!(r["stdout"].as_str(), Some("- -\n"), "no trace, no variables: {r}");
    let r = execute(&gw, &k, &json!({"code": code}), &[("traceparent", "garbage"), ("tracestate", "x=1")]);
    assert_eq!(r["stdout"].as_str(), Some("- -\n"), "a malformed one is ignored, never an error: {r}");
}
