//! `POST /v1/sandbox/execute`: one request, one fresh sandbox.
//!
//! Order of checks: key (401/403), content type (415), body size (413),
//! fields (400), options against the key (400/501), key concurrency (429),
//! thread (409), node capacity (503). Nothing reaches a node before all pass.

use std::time::Duration;

use axum::body::Body;
use axum::extract::State;
use axum::http::{header, HeaderMap, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};

use crate::error::ApiError;
use crate::exec::{Delivery, ExecError, Exit, Lost, Run, RunEvent};
use crate::request::{self, ExecuteRequest};
use crate::result::{ExecuteResult, Outcome, StreamEvent, Utf8Chunks};
use crate::state::AppState;

/// Largest request body. Code is at most 1 MiB, but JSON escaping can double
/// it; env_vars add up to 64 KiB.
pub const MAX_BODY_BYTES: usize = 4 << 20;
const NDJSON: &str = "application/x-ndjson";

/// Run code in a fresh sandbox.
///
/// With `Accept: application/x-ndjson` the response is a stream of
/// [`StreamEvent`] lines; otherwise one [`ExecuteResult`].
#[utoipa::path(
    post,
    path = "/v1/sandbox/execute",
    tag = "execute",
    request_body(content = crate::openapi::ExecuteRequestDoc, content_type = "application/json"),
    params(("Accept" = Option<String>, Header, description = "application/x-ndjson to stream events")),
    responses(
        (status = 200, description = "The execution ran (whatever its exit code); NDJSON lines when streaming",
            content((ExecuteResult = "application/json"), (StreamEvent = "application/x-ndjson"))),
        (status = 400, description = "Invalid request; `field` names what to fix", body = crate::error::ErrorBody),
        (status = 401, description = "Missing or unknown API key", body = crate::error::ErrorBody),
        (status = 403, description = "API key disabled", body = crate::error::ErrorBody),
        (status = 409, description = "The thread is running another execution", body = crate::error::ErrorBody),
        (status = 408, description = "The body did not arrive in time", body = crate::error::ErrorBody),
        (status = 413, description = "Body larger than 4 MiB", body = crate::error::ErrorBody),
        (status = 415, description = "Body is not application/json", body = crate::error::ErrorBody),
        (status = 429, description = "The key is at its concurrency limit; see Retry-After", body = crate::error::ErrorBody),
        (status = 501, description = "Asynchronous execution (Prefer: respond-async) is not offered yet", body = crate::error::ErrorBody),
        (status = 502, description = "The node died mid-execution; the code may have partly run", body = crate::error::ErrorBody),
        (status = 503, description = "No node can run it now; nothing ran, safe to retry", body = crate::error::ErrorBody),
    ),
    security(("bearer" = []))
)]
pub async fn execute(State(st): State<AppState>, headers: HeaderMap, body: Body) -> Response {
    let delivery = if wants_stream(&headers) { Delivery::Streamed } else { Delivery::Collected };
    let run = match admit_and_start(&st, &headers, body, delivery).await {
        Ok(run) => run,
        Err(e) => return e.into_response(),
    };
    let trace = HeaderValue::from_str(&run.id).ok();
    let mut resp = match delivery {
        Delivery::Streamed => streamed(run, &st.settings),
        Delivery::Collected => collected(run).await,
    };
    if let Some(t) = trace {
        resp.headers_mut().insert("x-trace-id", t);
    }
    resp
}

/// Everything before the program runs: the key, the body, the service.
async fn admit_and_start(st: &AppState, headers: &HeaderMap, body: Body, delivery: Delivery) -> Result<Run, ApiError> {
    let key = st.keys().authenticate(headers)?;
    let req = read_request(st, headers, body).await?;
    let admitted = st.service.admit(&key, req, delivery).await?;
    Ok(st.service.start(admitted).await?)
}

/// The body as a request; options this server does not offer are refused.
async fn read_request(st: &AppState, headers: &HeaderMap, body: Body) -> Result<ExecuteRequest, ApiError> {
    if !is_json(headers) {
        return Err(ApiError::unsupported_media_type());
    }
    let bytes = read_body(headers, body, st.settings.body_timeout).await?;
    let req = request::parse(&bytes)?;
    let asynchronous = headers.get_all("prefer").iter().any(|v| v.to_str().is_ok_and(|s| s.contains("respond-async")));
    if asynchronous {
        return Err(ExecError::NotImplemented("asynchronous execution (Prefer: respond-async, webhooks) is not offered by this server yet; call without it").into());
    }
    if req.webhook_url.is_some() {
        return Err(ApiError::invalid("webhook_url", "needs the Prefer: respond-async header"));
    }
    Ok(req)
}

fn wants_stream(headers: &HeaderMap) -> bool {
    headers.get_all(header::ACCEPT).iter().any(|v| v.to_str().is_ok_and(|s| s.contains(NDJSON)))
}

fn is_json(headers: &HeaderMap) -> bool {
    let Some(ct) = headers.get(header::CONTENT_TYPE).and_then(|v| v.to_str().ok()) else { return false };
    let mut parts = ct.split(';').map(str::trim);
    let essence_ok = parts.next().is_some_and(|m| m.eq_ignore_ascii_case("application/json"));
    essence_ok
        && parts.all(|p| match p.split_once('=') {
            Some((k, v)) if k.trim().eq_ignore_ascii_case("charset") => v.trim().trim_matches('"').eq_ignore_ascii_case("utf-8"),
            _ => true,
        })
}

async fn read_body(headers: &HeaderMap, body: Body, limit: Duration) -> Result<bytes::Bytes, ApiError> {
    let declared = headers.get(header::CONTENT_LENGTH).and_then(|v| v.to_str().ok()).and_then(|v| v.parse::<u64>().ok());
    if declared.is_some_and(|n| n > MAX_BODY_BYTES as u64) {
        return Err(ApiError::too_large(MAX_BODY_BYTES));
    }
    // A client trickling its body must not hold the connection for ever.
    let read = tokio::time::timeout(limit, axum::body::to_bytes(body, MAX_BODY_BYTES)).await.map_err(|_| ApiError::body_timeout(limit))?;
    read.map_err(|e| {
        let too_large = std::error::Error::source(&e).is_some_and(|s| s.is::<http_body_util::LengthLimitError>());
        if too_large { ApiError::too_large(MAX_BODY_BYTES) } else { ApiError::invalid_json("the request body could not be read") }
    })
}

async fn collected(mut run: Run) -> Response {
    let (mut out, mut err) = (Vec::new(), Vec::new());
    let end = loop {
        match run.next().await {
            Ok(RunEvent::Stdout(c)) => out.extend_from_slice(&c),
            Ok(RunEvent::Stderr(c)) => err.extend_from_slice(&c),
            Ok(RunEvent::Exited(x)) => break Ok(x),
            Ok(RunEvent::Started) => {}
            Err(lost) => break Err(lost),
        }
    };
    match end {
        Ok(x) => {
            let result = ExecuteResult::new(&run.id, &x, String::from_utf8_lossy(&out).into_owned(), String::from_utf8_lossy(&err).into_owned());
            run.finish(Outcome::of(&x), Some(x.exit_code));
            (StatusCode::OK, axum::Json(result)).into_response()
        }
        Err(Lost) => run.lost().into_response(),
    }
}

fn line(ev: &StreamEvent) -> bytes::Bytes {
    let mut v = serde_json::to_vec(ev).unwrap_or_default();
    v.push(b'\n');
    v.into()
}

/// Lines buffered between the relay task and the HTTP body.
const STREAM_LINES: usize = 16;

/// NDJSON response. The agent stream is relayed by a task of its own into a
/// small channel the body drains, so a client that stops reading cannot
/// hold the execution: after `stall` without taking a line, or as soon as
/// it disconnects, the task ends, which drops the agent stream (the agent
/// kills the sandbox) and releases the key slot, thread and node lease.
fn streamed(run: Run, settings: &crate::state::Settings) -> Response {
    let (tx, mut rx) = tokio::sync::mpsc::channel::<bytes::Bytes>(STREAM_LINES);
    tokio::spawn(relay(run, tx, settings.keepalive, settings.stream_stall));
    let body = async_stream::stream! {
        while let Some(line) = rx.recv().await {
            yield Ok::<_, std::convert::Infallible>(line);
        }
    };
    Response::builder()
        .status(StatusCode::OK)
        .header(header::CONTENT_TYPE, NDJSON)
        .header(header::CACHE_CONTROL, "no-cache")
        .body(Body::from_stream(body))
        .unwrap_or_else(|_| ApiError::unavailable("could not start the stream").into_response())
}

/// Hands one line to the body; false when the client left or took nothing
/// for `stall`.
async fn deliver(tx: &tokio::sync::mpsc::Sender<bytes::Bytes>, ev: &StreamEvent, stall: Duration) -> bool {
    matches!(tokio::time::timeout(stall, tx.send(line(ev))).await, Ok(Ok(())))
}

async fn relay(mut run: Run, tx: tokio::sync::mpsc::Sender<bytes::Bytes>, keepalive: Duration, stall: Duration) {
    let mut lines = Lines::new(run.id.clone());
    loop {
        let ev = tokio::select! {
            ev = run.next() => ev,
            _ = tokio::time::sleep(keepalive) => {
                if !deliver(&tx, &lines.keepalive(), stall).await { break; }
                continue;
            }
            // The client left: dropping the agent stream kills the sandbox.
            _ = tx.closed() => break,
        };
        let (out, done) = match ev {
            Ok(RunEvent::Exited(x)) => {
                let outcome = Outcome::of(&x);
                run.finish(outcome, Some(x.exit_code));
                (lines.exited(&x, outcome), true)
            }
            Ok(ev) => (lines.event(ev), false),
            Err(Lost) => {
                // Headers are sent: the failure goes in the last line.
                let e = ApiError::from(run.lost());
                (vec![lines.lost(e.body.error)], true)
            }
        };
        for ev in &out {
            if !deliver(&tx, ev, stall).await {
                if !done {
                    tracing::warn!(execution_id = %run.id, "the client stopped reading the stream; the execution is cancelled");
                }
                return;
            }
        }
        if done {
            return;
        }
    }
}

/// Turns agent events into NDJSON events: sequence numbers, whole UTF-8
/// characters, and the output again in the final result.
struct Lines {
    trace_id: String,
    seq: u64,
    /// Per stream, in [`STREAMS`] order: the decoder and everything decoded.
    decoders: [Utf8Chunks; 2],
    all: [String; 2],
}

/// Stream names, indexing [`Lines`]' per-stream state.
const STREAMS: [&str; 2] = ["stdout", "stderr"];

impl Lines {
    fn new(trace_id: String) -> Lines {
        Lines { trace_id, seq: 0, decoders: Default::default(), all: Default::default() }
    }

    fn next(&mut self) -> u64 {
        self.seq += 1;
        self.seq
    }

    fn keepalive(&mut self) -> StreamEvent {
        StreamEvent::Keepalive { seq: self.next() }
    }

    /// An output line for stream `i`, unless `data` is empty.
    fn output(&mut self, i: usize, data: String) -> Option<StreamEvent> {
        if data.is_empty() {
            return None;
        }
        self.all[i].push_str(&data);
        Some(StreamEvent::Output { stream: STREAMS[i].into(), data, seq: self.next() })
    }

    fn event(&mut self, ev: RunEvent) -> Vec<StreamEvent> {
        let (i, bytes) = match ev {
            RunEvent::Started => return vec![StreamEvent::Status { trace_id: self.trace_id.clone(), status: "running".into(), seq: self.next() }],
            RunEvent::Stdout(c) => (0, c),
            RunEvent::Stderr(c) => (1, c),
            RunEvent::Exited(_) => return vec![],
        };
        let data = self.decoders[i].push(&bytes);
        self.output(i, data).into_iter().collect()
    }

    /// The last output (an incomplete character at the end) and the result.
    fn exited(&mut self, x: &Exit, outcome: Outcome) -> Vec<StreamEvent> {
        let mut lines = Vec::new();
        for i in 0..STREAMS.len() {
            let data = self.decoders[i].finish();
            lines.extend(self.output(i, data));
        }
        let [out, err] = std::mem::take(&mut self.all);
        let result = ExecuteResult::new(&self.trace_id, x, out, err);
        let truncated = x.stdout_truncated || x.stderr_truncated;
        let seq = self.next();
        lines.push(StreamEvent::Result { trace_id: self.trace_id.clone(), status: outcome.as_str().into(), result, output_truncated: truncated, seq });
        lines
    }

    fn lost(&mut self, error: String) -> StreamEvent {
        let x = Exit { exit_code: -1, ..Default::default() };
        let mut result = ExecuteResult::new(&self.trace_id, &x, String::new(), String::new());
        result.error = Some(error);
        StreamEvent::Result { trace_id: self.trace_id.clone(), status: Outcome::NodeLost.as_str().into(), result, output_truncated: false, seq: self.next() }
    }
}
