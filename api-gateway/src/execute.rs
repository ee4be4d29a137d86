//! `POST /v1/sandbox/execute`: one request, one fresh sandbox.
//!
//! Order of checks: key (401/403), content type (415), body size (413),
//! fields (400), options against the key (400/501), thread (409), then, each
//! waiting in order up to the queue wait (429 past it), the key's
//! concurrency, output memory and a node slot; no reachable node is 503.
//! Nothing reaches a node before all pass.

pub mod idempotent;

use std::time::{Duration, Instant};

use axum::body::Body;
use axum::extract::State;
use axum::http::{header, HeaderMap, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};

use crate::error::ApiError;
use crate::exec::{Delivery, ExecError, Exit, Lost, Run, RunEvent};
use crate::ndjson::{self, Tape};
use crate::webhook::Hook;
use crate::exec::ExecuteRequest;
use crate::request;
use crate::result::{ExecuteResult, Outcome, StreamEvent, Utf8Chunks};
use crate::state::AppState;

/// Largest request body. Code is at most 1 MiB, but JSON escaping can double
/// it; env_vars add up to 64 KiB.
pub const MAX_BODY_BYTES: usize = 4 << 20;

/// Run code in a fresh sandbox.
///
/// With `Accept: application/x-ndjson` the response is a stream of
/// [`StreamEvent`] lines; otherwise one [`ExecuteResult`].
#[utoipa::path(
    post,
    path = "/v1/sandbox/execute",
    tag = "execute",
    request_body(content = crate::request::ExecuteRequestDoc, content_type = "application/json"),
    params(
        ("Accept" = Option<String>, Header, description = "application/x-ndjson to stream events"),
        ("Prefer" = Option<String>, Header, description = "respond-async: answer 202 at once; the execution runs on and is read with /v1/executions/{trace_id}"),
        ("Idempotency-Key" = Option<String>, Header, description = "1–255 visible ASCII characters: a retry with the same key and the same request (body, Accept, Prefer) within 24 h answers what the first call answered (same trace_id and output; header Idempotent-Replayed: true) without running again; per API key"),
    ),
    responses(
        (status = 200, description = "The execution ran (whatever its exit code); NDJSON lines when streaming",
            content((ExecuteResult = "application/json"), (StreamEvent = "application/x-ndjson"))),
        (status = 400, description = "Invalid request; `field` names what to fix", body = crate::error::ErrorBody),
        (status = 401, description = "Missing or unknown API key", body = crate::error::ErrorBody),
        (status = 403, description = "API key disabled", body = crate::error::ErrorBody),
        (status = 409, description = "The thread is running another execution (`thread_busy`), or the call with this Idempotency-Key still runs (`idempotency_key_in_use`, see Retry-After)", body = crate::error::ErrorBody),
        (status = 422, description = "This Idempotency-Key was used with another request in the last 24 h (`idempotency_key_reused`); nothing ran", body = crate::error::ErrorBody),
        (status = 408, description = "The body did not arrive in time", body = crate::error::ErrorBody),
        (status = 413, description = "Body larger than 4 MiB", body = crate::error::ErrorBody),
        (status = 415, description = "Body is not application/json", body = crate::error::ErrorBody),
        (status = 429, description = "Capacity stayed taken for the whole queue wait: the key at its concurrency limit (`concurrency_limit`), or every node slot or the gateway's output memory (`queue_timeout`); nothing ran, see Retry-After", body = crate::error::ErrorBody),
        (status = 202, description = "With Prefer: respond-async: accepted and running; poll GET /v1/executions/{trace_id} (Location)", body = Accepted),
        (status = 502, description = "The node died mid-execution; the code may have partly run", body = crate::error::ErrorBody),
        (status = 503, description = "No node-agent is reachable, or the node cannot run it; nothing ran, safe to retry", body = crate::error::ErrorBody),
    ),
    security(("bearer" = []))
)]
pub async fn execute(State(st): State<AppState>, headers: HeaderMap, body: Body) -> Response {
    let delivery = if prefers_async(&headers) {
        Delivery::Async
    } else if wants_stream(&headers) {
        Delivery::Streamed
    } else {
        Delivery::Collected
    };
    if headers.contains_key(idempotent::HEADER) {
        return idempotent::execute(&st, &headers, body, delivery).await;
    }
    let t0 = Instant::now();
    let (run, hook) = match admit_and_start(&st, &headers, body, delivery).await {
        Ok(started) => started,
        Err(e) => return e.into_response(),
    };
    let trace = HeaderValue::from_str(&run.id).ok();
    let started = t0.elapsed();
    let mut resp = match delivery {
        Delivery::Streamed => streamed(run, &st, false),
        // The HTTP API never asks for the MCP delivery.
        Delivery::Collected | Delivery::Mcp => collected(run).await,
        Delivery::Async | Delivery::Console => accepted(run, &st, hook),
    };
    // The gateway's part of the per-phase profile (docs: Performance).
    tracing::debug!(start_us = started.as_micros() as u64, answer_us = (t0.elapsed() - started).as_micros() as u64, "execution phases");
    if let Some(t) = trace {
        resp.headers_mut().insert("x-trace-id", t);
    }
    resp
}

/// Everything before the program runs: the key, the body, the service.
async fn admit_and_start(st: &AppState, headers: &HeaderMap, body: Body, delivery: Delivery) -> Result<(Run, Option<Hook>), ApiError> {
    let t0 = Instant::now();
    let key = st.keys().authenticate(headers)?;
    let t_key = t0.elapsed();
    let mut req = parse_request(&read_json(st, headers, body).await?, delivery)?;
    req.trace = crate::traced::from_headers(headers);
    let t_body = t0.elapsed();
    let us = |d: Duration| d.as_micros() as u64;
    tracing::debug!(key_us = us(t_key), body_us = us(t_body - t_key), "request phases");
    start_request(st, &key, req, delivery, crate::exec::new_trace_id()).await
}

/// Admits `req` of `key` as execution `id` and starts it. An
/// async execution starts only once its record is committed (its 202
/// promises that the status can be read); a stream's headers wait for it
/// too (they carry the trace id a client resumes with), while the program
/// already starts.
pub(crate) async fn start_request(st: &AppState, key: &warren_config::EffectiveKey, req: ExecuteRequest, delivery: Delivery, id: String) -> Result<(Run, Option<Hook>), ApiError> {
    let t0 = Instant::now();
    let hook = req.webhook_url.as_deref().map(|url| hook(st, key, url)).transpose()?;
    let mut admitted = st.service.admit_as(key, req, delivery, id).await?;
    tracing::debug!(admit_us = t0.elapsed().as_micros() as u64, "admission phases");
    let (_, recorded) = tokio::sync::oneshot::channel();
    let mut recorded = std::mem::replace(&mut admitted.recorded, recorded);
    if matches!(delivery, Delivery::Async | Delivery::Console) && !(&mut recorded).await.unwrap_or(false) {
        return Err(ExecError::RecordStore.into());
    }
    let run = st.service.start(admitted).await?;
    if delivery == Delivery::Streamed {
        let _ = recorded.await;
    }
    Ok((run, hook))
}

/// A webhook the key may ask for: a destination the policy allows, and a
/// signing secret to sign it with.
fn hook(st: &AppState, key: &warren_config::EffectiveKey, url: &str) -> Result<Hook, ApiError> {
    // Its form first (the policy reads a URL); the rest of the request is
    // checked when it is admitted.
    crate::exec::request::check_webhook_url(url)?;
    let url = st.webhooks.check(url).map_err(|r| ApiError::invalid("webhook_url", r.to_string()))?;
    let secret = key.webhook_secret.clone().ok_or_else(|| {
        ApiError::invalid("webhook_url", "this API key has no webhook signing secret (entry webhook-secret of its Secret); ask the operator to add one")
    })?;
    Ok(Hook { url, secret })
}

/// The body of a JSON request, bounded in size and time.
pub(crate) async fn read_json(st: &AppState, headers: &HeaderMap, body: Body) -> Result<bytes::Bytes, ApiError> {
    if !is_json(headers) {
        return Err(ApiError::unsupported_media_type());
    }
    read_body(headers, body, st.settings.body_timeout).await
}

/// The body as a request; options this server does not offer are refused.
pub(crate) fn parse_request(bytes: &[u8], delivery: Delivery) -> Result<ExecuteRequest, ApiError> {
    let req = request::read(bytes)?;
    if req.webhook_url.is_some() && delivery != Delivery::Async {
        return Err(ApiError::invalid("webhook_url", "needs the Prefer: respond-async header"));
    }
    Ok(req)
}

/// `Prefer: respond-async` (RFC 7240), among other preferences.
fn prefers_async(headers: &HeaderMap) -> bool {
    headers.get_all("prefer").iter().filter_map(|v| v.to_str().ok()).flat_map(|v| v.split(',')).any(|p| p.trim().eq_ignore_ascii_case("respond-async"))
}

fn wants_stream(headers: &HeaderMap) -> bool {
    headers.get_all(header::ACCEPT).iter().any(|v| v.to_str().is_ok_and(|s| s.contains(ndjson::NDJSON)))
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

pub(crate) async fn collected(mut run: Run) -> Response {
    match run.collect().await {
        Ok(result) => (StatusCode::OK, axum::Json(result)).into_response(),
        Err(e) => ApiError::from(e).into_response(),
    }
}

/// NDJSON response. The agent stream is relayed by a task of its own into a
/// small channel the body drains, and every line but keepalives is
/// recorded. A client that disconnects, or takes no line for `stall`,
/// detaches: the execution runs on to its end (within its timeout, holding
/// its key slot) and the client resumes with `GET …/output?after_seq=N`,
/// or stops it with `POST …/cancel`. The gateway's shutdown waits for it.
///
/// `settled`: the last line waits until the record's end and lines are
/// committed, so a retry with the same Idempotency-Key made the moment the
/// stream ends finds it ended (one commit; only streams with a key pay it).
pub(crate) fn streamed(run: Run, st: &AppState, settled: bool) -> Response {
    let (tx, resp) = ndjson::response();
    let tape = Tape::new(st.service.records.clone(), &run.id);
    st.tasks.spawn(relay(run, tx, tape, settled, (st.settings.keepalive, st.settings.stream_stall)));
    resp
}

async fn relay(mut run: Run, tx: ndjson::Tx, mut tape: Tape, settled: bool, (keepalive, stall): (Duration, Duration)) {
    let mut lines = Lines::new(run.id.clone());
    loop {
        let ev = tokio::select! {
            ev = run.next() => ev,
            _ = tokio::time::sleep(keepalive) => {
                if !ndjson::deliver(&tx, &lines.keepalive(), stall).await { break; }
                continue;
            }
            _ = tx.closed() => break,
        };
        let (out, done) = step(&mut run, &mut lines, ev);
        tape.record(&out);
        if done && settled {
            // The record's end, then everything, committed before the last
            // line leaves: a retry of the call replays the ended record.
            // Bounded: a stalled database delays the end, never holds it.
            run.record_end();
            let _ = tokio::time::timeout(stall, tape.flush()).await;
        }
        for ev in &out {
            if !ndjson::deliver(&tx, ev, stall).await {
                if !done {
                    tracing::info!(execution_id = %run.id, "the client left the stream; the execution runs on (resumable)");
                    return drive(run, lines, tape).await;
                }
                return;
            }
        }
        if done {
            return;
        }
    }
    tracing::info!(execution_id = %run.id, "the client left the stream; the execution runs on (resumable)");
    drive(run, lines, tape).await
}

/// 202: the execution runs on in a task of the gateway, its lines recorded,
/// then its webhook delivered (the gateway's shutdown waits for both).
pub(crate) fn accepted(run: Run, st: &AppState, hook: Option<Hook>) -> Response {
    let id = run.id.clone();
    run_on(run, st, hook);
    accepted_answer(&id)
}

/// The 202 of async execution `id` (also what a retry of it is answered).
pub(crate) fn accepted_answer(id: &str) -> Response {
    let body = Accepted { trace_id: id.to_string(), status: crate::records::Status::RUNNING.into() };
    (StatusCode::ACCEPTED, [(header::LOCATION, format!("/v1/executions/{id}"))], axum::Json(body)).into_response()
}

/// Drives `run` to its end in a task of the gateway, recording its lines.
fn run_on(run: Run, st: &AppState, hook: Option<Hook>) {
    let rec = st.service.records.clone();
    let (tape, lines, id) = (Tape::new(rec.clone(), &run.id), Lines::new(run.id.clone()), run.id.clone());
    let webhooks = st.webhooks.clone();
    st.tasks.spawn(async move {
        drive(run, lines, tape).await;
        if let Some(hook) = hook {
            webhooks.deliver(rec, id, hook).await;
        }
    });
}

/// The console's playground: `req` run with `key`, recorded with delivery
/// mode `console`, running on after this returns its trace id (once its
/// record is committed).
pub async fn run_for_console(st: &AppState, key: &warren_config::EffectiveKey, req: ExecuteRequest) -> Result<String, ExecError> {
    let mut admitted = st.service.admit(key, req, Delivery::Console).await?;
    let (_, recorded) = tokio::sync::oneshot::channel();
    if !std::mem::replace(&mut admitted.recorded, recorded).await.unwrap_or(false) {
        return Err(ExecError::RecordStore);
    }
    let run = st.service.start(admitted).await?;
    let id = run.id.clone();
    run_on(run, st, None);
    Ok(id)
}

/// The 202 body of an asynchronous execution.
#[derive(Debug, serde::Serialize, utoipa::ToSchema)]
pub struct Accepted {
    /// Execution id: poll `GET /v1/executions/{trace_id}`.
    pub trace_id: String,
    /// `running`.
    pub status: String,
}

/// Runs an execution with no client to its end, recording its lines.
async fn drive(mut run: Run, mut lines: Lines, mut tape: Tape) {
    loop {
        let ev = run.next().await;
        let (out, done) = step(&mut run, &mut lines, ev);
        tape.record(&out);
        if done {
            return;
        }
    }
}

/// One agent event as stream lines, and whether it was the last; the end
/// is recorded on the run.
fn step(run: &mut Run, lines: &mut Lines, ev: Result<RunEvent, Lost>) -> (Vec<StreamEvent>, bool) {
    match ev {
        Ok(RunEvent::Exited(x)) => {
            let (mut out, [stdout, stderr]) = lines.drain();
            let (result, outcome) = run.end(&x, stdout, stderr);
            out.push(lines.result(result, outcome));
            (out, true)
        }
        Ok(ev) => (lines.event(ev), false),
        Err(Lost) => {
            // Headers are sent: the failure goes in the last line.
            let e = ApiError::from(run.lost());
            (vec![lines.lost(e.body.error)], true)
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

    /// The last output (an incomplete character at the end), and all the
    /// output shown, per stream.
    fn drain(&mut self) -> (Vec<StreamEvent>, [String; 2]) {
        let mut lines = Vec::new();
        for i in 0..STREAMS.len() {
            let data = self.decoders[i].finish();
            lines.extend(self.output(i, data));
        }
        (lines, std::mem::take(&mut self.all))
    }

    /// The result line: it repeats the output, text and encoding, held
    /// within what the run reserved for it.
    fn result(&mut self, result: ExecuteResult, outcome: Outcome) -> StreamEvent {
        let truncated = result.stdout_truncated || result.stderr_truncated;
        StreamEvent::Result { trace_id: self.trace_id.clone(), status: outcome.as_str().into(), result, output_truncated: truncated, seq: self.next() }
    }

    fn lost(&mut self, error: String) -> StreamEvent {
        let x = Exit { exit_code: -1, ..Default::default() };
        let mut result = ExecuteResult::new(&self.trace_id, &x, String::new(), String::new());
        result.error = Some(error);
        StreamEvent::Result { trace_id: self.trace_id.clone(), status: Outcome::NodeLost.as_str().into(), result, output_truncated: false, seq: self.next() }
    }
}
