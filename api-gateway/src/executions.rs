//! `/v1/executions`: the records of executions — status, cancel, resuming
//! the output stream, and the audit query. Every gateway answers for every
//! execution: all of it is read from the record database.
//!
//! A key sees its own executions; anything else is 404, exactly like an id
//! that never existed. A key with `auditScope: Namespace` also lists those
//! of every key in its namespace.

use std::time::Duration;

use axum::extract::{Path, Query, State};
use axum::http::HeaderMap;
use axum::response::{IntoResponse, Response};
use serde::Serialize;
use utoipa::ToSchema;
use warren_config::EffectiveKey;

use crate::error::ApiError;
use crate::ndjson;
use crate::records::{self, ExecutionStatus, Filter, Row, Status, Store};
use crate::result::{BlockedEgress, ExecuteResult, StreamEvent};
use crate::state::AppState;

/// Answer to a cancel.
#[derive(Debug, Serialize, ToSchema)]
pub struct CancelAnswer {
    /// Execution id.
    pub trace_id: String,
    /// `cancelled`, or the status it had already ended with.
    pub status: String,
}

/// A page of the audit query.
#[derive(Debug, Serialize, ToSchema)]
pub struct ExecutionList {
    /// Newest first, without their output.
    pub executions: Vec<ExecutionStatus>,
    /// Pass as `cursor` for the next page; absent on the last.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub next_cursor: Option<String>,
}

const TRACE_PARAM: &str = "Execution id (`trc_…`)";

/// An execution's status, and its output once ended.
#[utoipa::path(
    get,
    path = "/v1/executions/{trace_id}",
    tag = "executions",
    params(("trace_id" = String, Path, description = TRACE_PARAM)),
    security(("bearer" = [])),
    responses(
        (status = 200, body = ExecutionStatus),
        (status = 401, description = "Missing or unknown key", body = crate::error::ErrorBody),
        (status = 404, description = "No such execution for this key", body = crate::error::ErrorBody),
        (status = 429, description = "The record store was busy for the whole queue wait; see Retry-After", body = crate::error::ErrorBody),
        (status = 503, description = "The record store is unavailable; retry", body = crate::error::ErrorBody),
    )
)]
pub async fn get_execution(State(st): State<AppState>, headers: HeaderMap, Path(trace_id): Path<String>) -> Response {
    match own(&st, &headers, &trace_id).await {
        Ok((_, row)) => axum::Json(ExecutionStatus::of(row)).into_response(),
        Err(e) => e.into_response(),
    }
}

/// Cancels a running execution, wherever it runs; answers once it has
/// ended. An execution that already ended keeps its status.
#[utoipa::path(
    post,
    path = "/v1/executions/{trace_id}/cancel",
    tag = "executions",
    params(("trace_id" = String, Path, description = TRACE_PARAM)),
    security(("bearer" = [])),
    responses(
        (status = 200, body = CancelAnswer),
        (status = 401, description = "Missing or unknown key", body = crate::error::ErrorBody),
        (status = 404, description = "No such execution for this key", body = crate::error::ErrorBody),
        (status = 429, description = "The record store was busy for the whole queue wait; see Retry-After", body = crate::error::ErrorBody),
        (status = 503, description = "Its node or the record store is unreachable; retry", body = crate::error::ErrorBody),
    )
)]
pub async fn cancel_execution(State(st): State<AppState>, headers: HeaderMap, Path(trace_id): Path<String>) -> Response {
    match cancel(&st, &headers, &trace_id).await {
        Ok(a) => axum::Json(a).into_response(),
        Err(e) => e.into_response(),
    }
}

/// How long a cancel waits for the node to confirm the end.
const CANCEL_WAIT: Duration = Duration::from_secs(30);

async fn cancel(st: &AppState, headers: &HeaderMap, trace_id: &str) -> Result<CancelAnswer, ApiError> {
    let (_, row) = own(st, headers, trace_id).await?;
    let status = cancel_row(st, row).await?;
    Ok(CancelAnswer { trace_id: trace_id.to_string(), status })
}

/// Cancels the execution of `row` (whoever may: the key that ran it, or
/// a console user); its status afterwards.
pub async fn cancel_row(st: &AppState, row: Row) -> Result<String, ApiError> {
    if row.is_terminal() {
        return Ok(row.status);
    }
    let trace_id = row.trace_id.as_str();
    let store = st.service.records.store();
    let row = store.request_cancel(trace_id).await.map_err(unavailable)?.ok_or_else(not_found)?;
    if row.is_terminal() {
        return Ok(row.status);
    }
    let node = st.service.nodes.named(&row.node).ok_or_else(|| ApiError::unavailable("the node running this execution is not reachable from this gateway; retry"))?;
    match tokio::time::timeout(CANCEL_WAIT, node.agent().cancel(trace_id)).await {
        Ok(Ok(_)) => {}
        _ => return Err(ApiError::unavailable("the node running this execution did not confirm the cancel; retry")),
    }
    tracing::info!(execution_id = %trace_id, node = %row.node, "execution cancelled");
    // The node has ended it; its record says `cancelled` unless it had
    // already succeeded (the owning gateway's write may still be queued).
    let now = store.get(trace_id).await.map_err(unavailable)?;
    Ok(now.filter(Row::is_terminal).map_or_else(|| "cancelled".to_string(), |r| r.status))
}

/// `after_seq` of a resumed stream.
#[derive(Debug, serde::Deserialize, utoipa::IntoParams)]
#[into_params(parameter_in = Query)]
pub struct OutputQuery {
    /// Lines with a larger `seq` are sent (0: from the start).
    #[serde(default)]
    #[param(minimum = 0)]
    pub after_seq: u64,
}

/// Resumes an execution's NDJSON stream after line `after_seq`: the lines
/// recorded since, then the rest as it runs, ending with the `result` line.
/// An execution that was not streamed gets its result line alone.
#[utoipa::path(
    get,
    path = "/v1/executions/{trace_id}/output",
    tag = "executions",
    params(("trace_id" = String, Path, description = TRACE_PARAM), OutputQuery),
    security(("bearer" = [])),
    responses(
        (status = 200, content_type = "application/x-ndjson", body = StreamEvent),
        (status = 400, description = "Malformed after_seq", body = crate::error::ErrorBody),
        (status = 401, description = "Missing or unknown key", body = crate::error::ErrorBody),
        (status = 404, description = "No such execution for this key", body = crate::error::ErrorBody),
        (status = 429, description = "The record store was busy for the whole queue wait; see Retry-After", body = crate::error::ErrorBody),
        (status = 503, description = "The record store is unavailable; retry", body = crate::error::ErrorBody),
    )
)]
pub async fn execution_output(State(st): State<AppState>, headers: HeaderMap, Path(trace_id): Path<String>, query: Result<Query<OutputQuery>, axum::extract::rejection::QueryRejection>) -> Response {
    let Some(Query(q)) = query.ok().filter(|q| i64::try_from(q.after_seq).is_ok()) else {
        return ApiError::invalid("after_seq", "must be an integer from 0 to 2^63-1").into_response();
    };
    let row = match own(&st, &headers, &trace_id).await {
        Ok((_, row)) => row,
        Err(e) => return e.into_response(),
    };
    let (tx, resp) = ndjson::response();
    let lease = st.settings.record_lease;
    tokio::spawn(replay(st.service.records.store().clone(), row, q.after_seq, tx, st.settings.keepalive, st.settings.stream_stall, lease));
    resp
}

/// How often a resumed stream looks for new lines: at first, and at most
/// (it backs off while nothing new comes).
const POLL: Duration = Duration::from_millis(100);
const POLL_MAX: Duration = Duration::from_secs(1);

async fn replay(store: Store, row: Row, mut last: u64, tx: ndjson::Tx, keepalive: Duration, stall: Duration, lease: Duration) {
    let id = row.trace_id.clone();
    // Bounded: the execution's own timeout, and the time its gateway's death takes to be noticed.
    let deadline = tokio::time::Instant::now() + Duration::from_secs(u64::from(row.timeout_secs) + 60) + lease;
    let mut quiet = tokio::time::Instant::now();
    let mut ended = row.is_terminal();
    let mut poll = POLL;
    while tokio::time::Instant::now() < deadline {
        let Ok(lines) = store.lines_after(&id, last, 256).await else { return };
        if let Some((seq, _)) = lines.last() {
            last = *seq;
            quiet = tokio::time::Instant::now();
            poll = POLL;
            let done = lines.iter().any(|(_, l)| is_result_line(l));
            for (_, l) in lines {
                let mut b = l.into_bytes();
                b.push(b'\n');
                if !ndjson::deliver_line(&tx, b.into(), stall).await {
                    return;
                }
            }
            if done {
                return;
            }
            continue;
        }
        if ended {
            // Every line is written before the end: none will come. Unrecorded (inline)
            // or expired output, or a gateway that stopped: the result from the record.
            if let Ok(Some(row)) = store.get(&id).await {
                let _ = ndjson::deliver(&tx, &result_line(&row, last + 1), stall).await;
            }
            return;
        }
        if quiet.elapsed() >= keepalive {
            if !ndjson::deliver(&tx, &StreamEvent::Keepalive { seq: last }, stall).await {
                return;
            }
            quiet = tokio::time::Instant::now();
        }
        tokio::time::sleep(poll).await;
        poll = (poll * 2).min(POLL_MAX);
        ended = matches!(store.get(&id).await, Ok(Some(r)) if r.is_terminal());
    }
}

/// Whether a recorded line is the last one (lines are serialized by this
/// crate, with their tag first).
fn is_result_line(line: &str) -> bool {
    line.starts_with(r#"{"type":"result""#)
}

/// The `result` line of an ended execution, from its record.
fn result_line(row: &Row, seq: u64) -> StreamEvent {
    let result = result_of(row);
    let output_truncated = row.stdout_truncated || row.stderr_truncated;
    StreamEvent::Result { trace_id: row.trace_id.clone(), status: row.status.clone(), result, output_truncated, seq }
}

/// An ended execution's result, from its record (the signal and the
/// unsynced paths are not kept).
pub fn result_of(row: &Row) -> ExecuteResult {
    ExecuteResult {
        success: row.status == "success",
        stdout: row.stdout.clone().unwrap_or_default(),
        stderr: row.stderr.clone().unwrap_or_default(),
        exit_code: row.exit_code.unwrap_or(-1),
        error: row.error.clone(),
        unsynced_paths: Vec::new(),
        blocked_egress: BlockedEgress::from_record(row.blocked_egress.as_deref()),
        trace_id: row.trace_id.clone(),
        duration_ms: row.duration_ms,
        cpu_ms: row.cpu_ms,
        peak_memory_bytes: row.peak_memory_bytes,
        timed_out: row.status == "timeout",
        oom_killed: row.status == "oom",
        signal: None,
        stdout_truncated: row.stdout_truncated,
        stderr_truncated: row.stderr_truncated,
    }
}

/// Query of the audit list. Besides these, `metadata.<name>=<value>`
/// (repeatable, at most 10) keeps executions whose metadata has that pair.
#[derive(Debug, Default, utoipa::IntoParams)]
#[into_params(parameter_in = Query)]
pub struct ListQueryDoc {
    /// Created at or after (RFC 3339).
    #[param(format = DateTime)]
    pub since: Option<String>,
    /// Created before (RFC 3339).
    #[param(format = DateTime)]
    pub until: Option<String>,
    /// One status.
    #[param(pattern = "^(running|success|failed|timeout|cancelled|blocked|oom|seccomp)$")]
    pub status: Option<String>,
    /// One thread.
    #[param(pattern = "^[a-zA-Z0-9][a-zA-Z0-9_-]{0,127}$")]
    pub thread_id: Option<String>,
    /// One W3C trace (the trace id of the caller's `traceparent`).
    #[param(pattern = "^[0-9a-f]{32}$")]
    pub otel_trace_id: Option<String>,
    /// One ApiKey of the namespace, or `*` for all (keys with `auditScope: Namespace`; others may name only themselves).
    #[param(pattern = "^([a-z0-9]([-a-z0-9.]{0,251}[a-z0-9])?|\\*)$")]
    pub key: Option<String>,
    /// Page size (default 50).
    #[param(minimum = 1, maximum = 200)]
    pub limit: Option<u32>,
    /// `next_cursor` of the previous page, unchanged.
    #[param(pattern = "^[0-9]{1,19}\\.trc_[A-Za-z0-9_-]{1,60}$")]
    pub cursor: Option<String>,
}

/// The audit query: this key's executions (or its namespace's, with
/// `auditScope: Namespace`), newest first, paginated. Filter by metadata
/// with `metadata.<name>=<value>` (repeatable; all must match).
#[utoipa::path(
    get,
    path = "/v1/executions",
    tag = "executions",
    params(ListQueryDoc),
    security(("bearer" = [])),
    responses(
        (status = 200, body = ExecutionList),
        (status = 400, description = "A malformed parameter; `field` names it", body = crate::error::ErrorBody),
        (status = 401, description = "Missing or unknown key", body = crate::error::ErrorBody),
        (status = 403, description = "`key` names another key, and this key may not see its namespace", body = crate::error::ErrorBody),
        (status = 429, description = "The record store was busy for the whole queue wait; see Retry-After", body = crate::error::ErrorBody),
        (status = 503, description = "The record store is unavailable; retry", body = crate::error::ErrorBody),
    )
)]
pub async fn list_executions(State(st): State<AppState>, headers: HeaderMap, query: Result<Query<Vec<(String, String)>>, axum::extract::rejection::QueryRejection>) -> Response {
    match list(&st, &headers, query).await {
        Ok(l) => axum::Json(l).into_response(),
        Err(e) => e.into_response(),
    }
}

async fn list(st: &AppState, headers: &HeaderMap, query: Result<Query<Vec<(String, String)>>, axum::extract::rejection::QueryRejection>) -> Result<ExecutionList, ApiError> {
    let key = st.keys().authenticate(headers)?;
    let Ok(Query(pairs)) = query else { return Err(ApiError::invalid("query", "not a valid query string")) };
    let filter = filter(&key, &pairs)?;
    let rows = st.service.records.store().query(&filter).await.map_err(unavailable)?;
    let next_cursor = (rows.len() == filter.limit as usize).then(|| rows.last().map(|r| format!("{}.{}", r.created_ms, r.trace_id))).flatten();
    Ok(ExecutionList { executions: rows.into_iter().map(ExecutionStatus::of).collect(), next_cursor })
}

/// Most metadata filters in one query.
const MAX_METADATA_FILTERS: usize = 10;

/// The query string as a [`Filter`] the key may run.
fn filter(key: &EffectiveKey, pairs: &[(String, String)]) -> Result<Filter, ApiError> {
    let mut f = Filter { namespaces: vec![key.namespace.clone()], key_name: Some(key.name.clone()), limit: 50, ..Default::default() };
    for (k, v) in pairs {
        match k.as_str() {
            "since" => f.since_ms = Some(time(k, v)?),
            "until" => f.until_ms = Some(time(k, v)?),
            "status" if Status::is_known(v) => f.status = Some(v.clone()),
            "status" => return Err(ApiError::invalid(k, format!("one of running, {}", Status::TERMINAL.join(", ")))),
            "thread_id" if warren_core::ids::is_thread_id(v) => f.thread_id = Some(v.clone()),
            "thread_id" => return Err(ApiError::invalid(k, warren_core::ids::THREAD_ID_RULE)),
            "otel_trace_id" if v.len() == 32 && v.bytes().all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f')) => f.otel_trace_id = Some(v.clone()),
            "otel_trace_id" => return Err(ApiError::invalid(k, "32 lowercase hex digits (a W3C trace id)")),
            "limit" => f.limit = v.parse().ok().filter(|n| (1..=200).contains(n)).ok_or_else(|| ApiError::invalid(k, "an integer from 1 to 200"))?,
            "cursor" => f.after = Some(cursor(v).ok_or_else(|| ApiError::invalid(k, "pass next_cursor of the previous page unchanged"))?),
            "key" if v == &key.name => {}
            "key" if key.audit_namespace => f.key_name = (v != "*").then(|| v.clone()),
            "key" => return Err(ApiError::forbidden("audit_scope", "this API key sees only its own executions (auditScope: Own)")),
            _ => match k.strip_prefix("metadata.") {
                Some(name) if crate::exec::request::is_metadata_key(name) && v.len() <= 256 => f.metadata.push((name.to_string(), v.clone())),
                Some(_) => return Err(ApiError::invalid(k, "metadata.<name>=<value>: a metadata key (1–40 of [a-zA-Z0-9_.-]) and a value of at most 256 characters")),
                None => return Err(ApiError::invalid(k, "unknown parameter; use since, until, status, thread_id, otel_trace_id, key, limit, cursor or metadata.<name>")),
            },
        }
    }
    if f.metadata.len() > MAX_METADATA_FILTERS {
        return Err(ApiError::invalid("metadata", format!("at most {MAX_METADATA_FILTERS} metadata filters")));
    }
    Ok(f)
}

fn time(field: &str, v: &str) -> Result<i64, ApiError> {
    v.parse::<jiff::Timestamp>().map(|t| t.as_millisecond()).map_err(|_| ApiError::invalid(field, "an RFC 3339 time, e.g. 2026-01-31T12:00:00Z"))
}

fn cursor(v: &str) -> Option<(i64, String)> {
    let (t, id) = v.split_once('.')?;
    (id.starts_with("trc_") && warren_core::ids::is_execution_id(id)).then_some(())?;
    Some((t.parse().ok()?, id.to_string()))
}

/// The record `trace_id` if the request's key ran it.
async fn own(st: &AppState, headers: &HeaderMap, trace_id: &str) -> Result<(std::sync::Arc<EffectiveKey>, Row), ApiError> {
    let key = st.keys().authenticate(headers)?;
    if !(trace_id.starts_with("trc_") && warren_core::ids::is_execution_id(trace_id)) {
        return Err(not_found());
    }
    let row = st.service.records.store().get(trace_id).await.map_err(unavailable)?;
    match row {
        Some(r) if r.namespace == key.namespace && r.key_name == key.name => Ok((key, r)),
        _ => Err(not_found()),
    }
}

fn not_found() -> ApiError {
    ApiError::not_found("no such execution for this API key")
}

fn unavailable(e: records::StoreError) -> ApiError {
    if e.is_busy() {
        return ApiError::busy("queue_timeout", "the execution record store was busy for the whole queue wait; retry shortly");
    }
    tracing::warn!(error = %e, "the record store failed");
    ApiError::unavailable("the execution record store is unavailable; retry shortly")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cursors_round_trip_and_refuse_junk() {
        assert_eq!(cursor("1700000000000.trc_abc"), Some((1_700_000_000_000, "trc_abc".into())));
        assert_eq!(cursor("x.trc_abc"), None);
        assert_eq!(cursor("1.trc_a'b"), None);
        assert_eq!(cursor("1"), None);
    }

    #[test]
    fn result_lines_are_recognized() {
        let row = Row { trace_id: "trc_a".into(), status: "success".into(), exit_code: Some(0), ..Default::default() };
        let line = serde_json::to_string(&result_line(&row, 3)).unwrap();
        assert!(is_result_line(&line), "{line}");
        assert!(!is_result_line(r#"{"type":"output","stream":"stdout","data":"{\"type\":\"result\"","seq":1}"#));
    }
}
