//! `Idempotency-Key` on `POST /v1/sandbox/execute`: a call retried with the
//! same key and the same request (body and delivery) within 24 hours
//! answers what the first call answered — the same `trace_id`, output and
//! accounting — without running anything again, through any replica (the
//! key is claimed in the record database before anything runs). The same
//! key while the first call still runs is 409 with `Retry-After`; with
//! another request, 422. Keys are per ApiKey. A first call refused before
//! it ran (a 4xx, a 429, a 503) releases its key, so its retry runs.
//!
//! A collected call's answer is stored with the key — it runs to its end
//! even when its client leaves, so the retry finds its answer; a stream is
//! replayed from its recorded lines (kept for `--output-retention-hours`);
//! an async call answers its 202 again.

use axum::body::Body;
use axum::http::{HeaderMap, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use sha2::Digest;

use crate::error::ApiError;
use crate::exec::Delivery;
use crate::records::{now_ms, Claimed, IdemKey, Row, Status};
use crate::state::AppState;

/// The request header.
pub const HEADER: &str = "idempotency-key";
/// The header a replayed answer carries.
const REPLAYED: &str = "idempotent-replayed";
/// Longest key.
const MAX_KEY: usize = 255;

/// The caller's key: 1–255 visible ASCII characters (else why not).
pub fn key_of(headers: &HeaderMap) -> Result<Option<String>, String> {
    let Some(v) = headers.get(HEADER) else { return Ok(None) };
    let bad = || format!("Idempotency-Key: 1 to {MAX_KEY} visible ASCII characters (no spaces)");
    let s = v.to_str().map_err(|_| bad())?;
    if s.is_empty() || s.len() > MAX_KEY || !s.bytes().all(|b| b.is_ascii_graphic()) {
        return Err(bad());
    }
    Ok(Some(s.to_string()))
}

/// What makes two requests the same: how it is delivered and its body.
pub fn request_hash(mode: &str, body: &[u8]) -> String {
    let mut h = sha2::Sha256::new();
    h.update(mode.as_bytes());
    h.update(b"\n");
    h.update(body);
    h.finalize().iter().map(|b| format!("{b:02x}")).collect()
}

/// `POST /v1/sandbox/execute` with an `Idempotency-Key`.
pub async fn execute(st: &AppState, headers: &HeaderMap, body: Body, delivery: Delivery) -> Response {
    match run(st, headers, body, delivery).await {
        Ok(r) => r,
        Err(e) => e.into_response(),
    }
}

async fn run(st: &AppState, headers: &HeaderMap, body: Body, delivery: Delivery) -> Result<Response, ApiError> {
    let key = st.keys().authenticate(headers)?;
    let idem = key_of(headers).map_err(|why| ApiError::invalid("Idempotency-Key", why.trim_start_matches("Idempotency-Key: ")))?.unwrap_or_default();
    let bytes = super::read_json(st, headers, body).await?;
    // A request that cannot run never claims its key.
    let mut req = super::parse_request(&bytes, delivery)?;
    req.trace = crate::traced::from_headers(headers);
    let k = IdemKey { namespace: &key.namespace, key_name: &key.name, scope: "execute", key: &idem };
    let store = st.service.records.store();
    let id = crate::exec::new_trace_id();
    let claimed = store.claim_idempotency(&k, &request_hash(delivery.mode().as_str(), &bytes), &id, now_ms()).await.map_err(unavailable)?;
    let mut resp = match claimed {
        Claimed::Different => return Err(ApiError::unprocessable("idempotency_key_reused", "this Idempotency-Key was used with another request (body or delivery) in the last 24 hours")),
        Claimed::Same { id, answer } => return replay(st, delivery, &id, answer).await,
        Claimed::New => {
            let (run, hook) = match super::start_request(st, &key, req, delivery, id.clone()).await {
                Ok(started) => started,
                Err(e) => {
                    // Nothing ran: the key is free for the retry.
                    let _ = store.release_idempotency(&k).await;
                    return Err(e);
                }
            };
            match delivery {
                Delivery::Streamed => super::streamed(run, st, true),
                Delivery::Async | Delivery::Console => super::accepted(run, st, hook),
                Delivery::Collected | Delivery::Mcp => {
                    // It runs to its end and its answer is stored even if the
                    // client leaves (a retry then finds it, not a cancelled run).
                    let (tx, rx) = tokio::sync::oneshot::channel();
                    let (st2, owned) = (st.clone(), (key.namespace.clone(), key.name.clone(), idem.clone()));
                    st.tasks.spawn(async move {
                        let k = IdemKey { namespace: &owned.0, key_name: &owned.1, scope: "execute", key: &owned.2 };
                        let _ = tx.send(answered(&st2, &k, super::collected(run).await).await);
                    });
                    rx.await.unwrap_or_else(|_| ApiError::unavailable("the gateway is shutting down; retry with the same Idempotency-Key").into_response())
                }
            }
        }
    };
    if let Ok(t) = HeaderValue::from_str(&id) {
        resp.headers_mut().insert("x-trace-id", t);
    }
    Ok(resp)
}

/// Stores a collected call's answer with its key (a 200 with its result,
/// or the error it ended with) and answers it.
async fn answered(st: &AppState, k: &IdemKey<'_>, resp: Response) -> Response {
    let status = resp.status();
    let (parts, body) = resp.into_parts();
    // The answer is bounded by the execution's output cap (and the gateway's memory for it).
    let bytes = axum::body::to_bytes(body, usize::MAX).await.unwrap_or_default();
    if let Err(e) = st.service.records.store().answer_idempotency(k, &answer(status, &String::from_utf8_lossy(&bytes))).await {
        tracing::warn!(error = %e, "storing an idempotent call's answer failed; a retry rebuilds it from the record");
    }
    Response::from_parts(parts, Body::from(bytes))
}

/// What a retry of execution `id` is answered.
async fn replay(st: &AppState, delivery: Delivery, id: &str, answer: Option<String>) -> Result<Response, ApiError> {
    let mut resp = match (delivery, answer) {
        (Delivery::Async | Delivery::Console, _) => super::accepted_answer(id),
        (_, Some(a)) => stored(&a),
        (Delivery::Streamed, None) => match ended(st, id).await? {
            Some(_) => lines(st, id).await?,
            None => return Err(still_running(id)),
        },
        (_, None) => match ended(st, id).await? {
            Some(row) => (StatusCode::OK, axum::Json(crate::executions::result_of(&row))).into_response(),
            None => return Err(still_running(id)),
        },
    };
    resp.headers_mut().insert(REPLAYED, HeaderValue::from_static("true"));
    if let Ok(v) = HeaderValue::from_str(id) {
        resp.headers_mut().insert("x-trace-id", v);
    }
    Ok(resp)
}

/// The record of execution `id` once it ended.
async fn ended(st: &AppState, id: &str) -> Result<Option<Row>, ApiError> {
    let row = st.service.records.store().get(id).await.map_err(unavailable)?;
    Ok(row.filter(|r| Status::is_terminal(&r.status)))
}

fn still_running(id: &str) -> ApiError {
    let mut e = ApiError::conflict("idempotency_key_in_use", format!("the call with this Idempotency-Key is still running (trace {id}); retry when it has ended, or read GET /v1/executions/{id}"));
    e.retry_after = Some(1);
    e
}

/// The answer to store for `status` and `body`.
pub fn answer(status: StatusCode, body: &str) -> String {
    serde_json::json!({"status": status.as_u16(), "body": body}).to_string()
}

/// A stored answer: its status and body.
pub fn stored(answer: &str) -> Response {
    let v: serde_json::Value = serde_json::from_str(answer).unwrap_or_default();
    let status = v["status"].as_u64().and_then(|s| StatusCode::from_u16(s as u16).ok()).unwrap_or(StatusCode::OK);
    let body = v["body"].as_str().unwrap_or_default().to_string();
    (status, [(axum::http::header::CONTENT_TYPE, "application/json")], body).into_response()
}

/// A stream's recorded lines, as NDJSON.
async fn lines(st: &AppState, id: &str) -> Result<Response, ApiError> {
    let lines = st.service.records.store().lines_after(id, 0, 1_000_000).await.map_err(unavailable)?;
    let mut body = String::new();
    for (_, line) in lines {
        body.push_str(&line);
        body.push('\n');
    }
    Ok((StatusCode::OK, [(axum::http::header::CONTENT_TYPE, crate::ndjson::NDJSON)], body).into_response())
}

fn unavailable(e: crate::records::StoreError) -> ApiError {
    tracing::warn!(error = %e, "the record database did not answer an idempotency key");
    ApiError::unavailable("the record database is not answering; retry")
}
