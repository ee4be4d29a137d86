//! `/v1/threads/{thread_id}`: the HTTP adapter of the service's thread
//! calls — delete, fork, restore, history.

use axum::body::Body;
use axum::extract::{Path, Query, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::Json;
use serde::{Deserialize, Serialize};
use utoipa::{IntoParams, ToSchema};

use crate::error::ApiError;
use crate::exec::versions::{Targets, ThreadVersion, MAX_FORKS};
use crate::state::AppState;

const THREAD_ID: &str = "The thread id used with execute";

/// Delete a thread's saved home directory.
///
/// Only the key that created the thread can see it: another key gets 404
/// for the same id, exactly as for an id that never existed. Forks made
/// from it keep their homes.
#[utoipa::path(
    delete,
    path = "/v1/threads/{thread_id}",
    tag = "threads",
    params(("thread_id" = String, Path, description = "The thread id used with execute", pattern = "^[a-zA-Z0-9][a-zA-Z0-9_-]{0,127}$")),
    security(("bearer" = [])),
    responses(
        (status = 204, description = "Deleted: the next call with this thread_id starts with a fresh home"),
        (status = 400, description = "Malformed thread_id", body = crate::error::ErrorBody),
        (status = 401, description = "Missing or unknown key", body = crate::error::ErrorBody),
        (status = 403, description = "Key disabled", body = crate::error::ErrorBody),
        (status = 404, description = "No such thread for this key", body = crate::error::ErrorBody),
        (status = 409, description = "The thread is running an execution", body = crate::error::ErrorBody),
        (status = 503, description = "No node or the thread store is unavailable; retry", body = crate::error::ErrorBody),
    )
)]
pub async fn delete_thread(State(st): State<AppState>, headers: HeaderMap, Path(thread_id): Path<String>) -> Response {
    match delete(&st, &headers, &thread_id).await {
        Ok(()) => StatusCode::NO_CONTENT.into_response(),
        Err(e) => e.into_response(),
    }
}

async fn delete(st: &AppState, headers: &HeaderMap, thread_id: &str) -> Result<(), ApiError> {
    let key = st.keys().authenticate(headers)?;
    Ok(st.service.delete_thread(&key, thread_id, crate::request_id::of(headers)).await?)
}

/// What to fork: one new id, or a count of ids Warren picks.
#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct ForkRequest {
    /// The new thread's id (same rule as execute's `thread_id`).
    pub thread_id: Option<String>,
    /// How many new threads, 1–32, with ids Warren picks (`fork_…`).
    pub count: Option<u32>,
    /// Fork the version this execution (its `trace_id`) produced; default:
    /// the thread's current state.
    pub at: Option<String>,
}

/// The threads a fork made.
#[derive(Debug, Serialize, ToSchema)]
pub struct ForkResponse {
    /// Their ids, each a thread of the same key.
    pub threads: Vec<String>,
}

/// Fork a thread: new threads that start as its saved state.
///
/// Each new home names the source's saved layers (no bytes are copied), so
/// a fork costs the same whatever the home's size. The source may be
/// running: a fork sees its last saved state. The forks are threads of the
/// same key, with its Sandbox's retention, size limit and `maxThreads`;
/// deleting the source leaves them whole. Processes and memory are not
/// forked — only the home.
#[utoipa::path(
    post,
    path = "/v1/threads/{thread_id}/fork",
    tag = "threads",
    params(("thread_id" = String, Path, description = THREAD_ID)),
    request_body = ForkRequest,
    security(("bearer" = [])),
    responses(
        (status = 201, description = "The new threads", body = ForkResponse),
        (status = 400, description = "Malformed ids, neither or both of thread_id and count, count outside 1–32", body = crate::error::ErrorBody),
        (status = 401, description = "Missing or unknown key", body = crate::error::ErrorBody),
        (status = 403, description = "The key keeps its maxThreads (`thread_limit_reached`)", body = crate::error::ErrorBody),
        (status = 404, description = "No such thread for this key, or no version by `at` (`version_not_found`)", body = crate::error::ErrorBody),
        (status = 408, description = "The body did not arrive in time", body = crate::error::ErrorBody),
        (status = 409, description = "A new thread id is taken (`thread_exists`)", body = crate::error::ErrorBody),
        (status = 413, description = "The home is larger than the key's threadMaxSize, or the body than 4 MiB", body = crate::error::ErrorBody),
        (status = 415, description = "Body is not application/json", body = crate::error::ErrorBody),
        (status = 503, description = "No node or the thread store is unavailable; retry", body = crate::error::ErrorBody),
    )
)]
pub async fn fork_thread(State(st): State<AppState>, headers: HeaderMap, Path(thread_id): Path<String>, body: Body) -> Response {
    match fork(&st, &headers, &thread_id, body).await {
        Ok(threads) => (StatusCode::CREATED, Json(ForkResponse { threads })).into_response(),
        Err(e) => e.into_response(),
    }
}

fn body_of<T: serde::de::DeserializeOwned>(bytes: &[u8]) -> Result<T, ApiError> {
    serde_json::from_slice(bytes).map_err(|e| ApiError::invalid("body", e.to_string()))
}

async fn fork(st: &AppState, headers: &HeaderMap, thread_id: &str, body: Body) -> Result<Vec<String>, ApiError> {
    let key = st.keys().authenticate(headers)?;
    let req: ForkRequest = body_of(&crate::execute::read_json(st, headers, body).await?)?;
    let targets = match (req.thread_id, req.count) {
        (Some(id), None) => Targets::Named(vec![id]),
        (None, Some(n)) => Targets::Count(n),
        _ => return Err(ApiError::invalid("thread_id", format!("give thread_id (one new thread) or count (1–{MAX_FORKS}), not both"))),
    };
    if req.at.as_ref().is_some_and(|a| a.is_empty() || a.len() > 64) {
        return Err(ApiError::invalid("at", "the trace_id of an execution on this thread"));
    }
    Ok(st.service.fork_thread(&key, thread_id, targets, req.at.as_deref(), crate::request_id::of(headers)).await?)
}

/// Which version to return to.
#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct RestoreRequest {
    /// The `trace_id` of the execution whose version to return to (see the
    /// thread's history).
    pub at: String,
}

/// One saved version of a thread.
#[derive(Debug, Serialize, ToSchema)]
pub struct VersionBody {
    /// The execution that produced it (a restore's own request id for a
    /// restore); `null` when unknown (saved before histories).
    pub trace_id: Option<String>,
    /// `execution`, `files` (an upload or removal) or `restore`.
    pub kind: String,
    /// When it was saved (RFC 3339).
    pub created_at: String,
    /// Charged size of the home: file sizes + 512 bytes per entry.
    pub size_bytes: u64,
    /// The execution's exit code.
    pub exit_code: Option<i32>,
    /// It is the thread's current state.
    pub current: bool,
}

impl From<ThreadVersion> for VersionBody {
    fn from(v: ThreadVersion) -> VersionBody {
        VersionBody {
            trace_id: (!v.trace_id.is_empty()).then_some(v.trace_id),
            kind: v.kind,
            created_at: crate::records::rfc3339(i64::try_from(v.at_unix.saturating_mul(1000)).unwrap_or(i64::MAX)),
            size_bytes: v.bytes,
            exit_code: v.exit_code,
            current: v.current,
        }
    }
}

/// Return a thread to an earlier version.
///
/// The version `at` produced becomes the thread's state again, as a new
/// version (so a restore can itself be undone). Refused with 409 while an
/// execution runs on the thread.
#[utoipa::path(
    post,
    path = "/v1/threads/{thread_id}/restore",
    tag = "threads",
    params(("thread_id" = String, Path, description = THREAD_ID)),
    request_body = RestoreRequest,
    security(("bearer" = [])),
    responses(
        (status = 200, description = "The version the restore made", body = VersionBody),
        (status = 400, description = "Malformed thread_id or body", body = crate::error::ErrorBody),
        (status = 401, description = "Missing or unknown key", body = crate::error::ErrorBody),
        (status = 404, description = "No such thread for this key, or no version by `at` (`version_not_found`)", body = crate::error::ErrorBody),
        (status = 408, description = "The body did not arrive in time", body = crate::error::ErrorBody),
        (status = 409, description = "An execution runs on the thread", body = crate::error::ErrorBody),
        (status = 413, description = "Body larger than 4 MiB", body = crate::error::ErrorBody),
        (status = 415, description = "Body is not application/json", body = crate::error::ErrorBody),
        (status = 503, description = "No node or the thread store is unavailable; retry", body = crate::error::ErrorBody),
    )
)]
pub async fn restore_thread(State(st): State<AppState>, headers: HeaderMap, Path(thread_id): Path<String>, body: Body) -> Response {
    match restore(&st, &headers, &thread_id, body).await {
        Ok(v) => Json(VersionBody::from(v)).into_response(),
        Err(e) => e.into_response(),
    }
}

async fn restore(st: &AppState, headers: &HeaderMap, thread_id: &str, body: Body) -> Result<ThreadVersion, ApiError> {
    let key = st.keys().authenticate(headers)?;
    let req: RestoreRequest = body_of(&crate::execute::read_json(st, headers, body).await?)?;
    if req.at.is_empty() || req.at.len() > 64 {
        return Err(ApiError::invalid("at", "the trace_id of an execution on this thread"));
    }
    Ok(st.service.restore_thread(&key, thread_id, &req.at, crate::request_id::of(headers)).await?)
}

/// Paging of a history.
#[derive(Debug, Deserialize, IntoParams)]
#[into_params(parameter_in = Query)]
pub struct HistoryQuery {
    /// Versions per page, 1–200 (default 50).
    pub limit: Option<usize>,
    /// Versions to skip, newest first (the previous page's `next_offset`).
    pub offset: Option<usize>,
}

/// A page of a thread's history.
#[derive(Debug, Serialize, ToSchema)]
pub struct HistoryResponse {
    /// Newest first.
    pub versions: Vec<VersionBody>,
    /// The next page's offset; `null` on the last page.
    pub next_offset: Option<usize>,
}

/// A thread's history: the versions it keeps, newest first.
///
/// One per execution that changed the home (and per upload or restore),
/// as many as the Sandbox's `threadHistory` (default 50) within its
/// `threadRetention`. Each can be restored or forked by its `trace_id`.
#[utoipa::path(
    get,
    path = "/v1/threads/{thread_id}/history",
    tag = "threads",
    params(("thread_id" = String, Path, description = THREAD_ID), HistoryQuery),
    security(("bearer" = [])),
    responses(
        (status = 200, description = "A page of versions", body = HistoryResponse),
        (status = 400, description = "Malformed thread_id or paging", body = crate::error::ErrorBody),
        (status = 401, description = "Missing or unknown key", body = crate::error::ErrorBody),
        (status = 404, description = "No such thread for this key", body = crate::error::ErrorBody),
        (status = 503, description = "No node or the thread store is unavailable; retry", body = crate::error::ErrorBody),
    )
)]
pub async fn thread_history(State(st): State<AppState>, headers: HeaderMap, Path(thread_id): Path<String>, query: Result<Query<HistoryQuery>, axum::extract::rejection::QueryRejection>) -> Response {
    match history(&st, &headers, &thread_id, query).await {
        Ok(page) => Json(page).into_response(),
        Err(e) => e.into_response(),
    }
}

async fn history(st: &AppState, headers: &HeaderMap, thread_id: &str, query: Result<Query<HistoryQuery>, axum::extract::rejection::QueryRejection>) -> Result<HistoryResponse, ApiError> {
    let key = st.keys().authenticate(headers)?;
    // A malformed query is the API's JSON 400, not the extractor's text.
    let Ok(Query(q)) = query else { return Err(ApiError::invalid("query", "limit and offset are whole numbers")) };
    let limit = q.limit.unwrap_or(50);
    if !(1..=200).contains(&limit) {
        return Err(ApiError::invalid("limit", "from 1 to 200"));
    }
    let offset = q.offset.unwrap_or(0);
    let all = st.service.thread_history(&key, thread_id, crate::request_id::of(headers)).await?;
    let total = all.len();
    let versions: Vec<VersionBody> = all.into_iter().skip(offset).take(limit).map(VersionBody::from).collect();
    let next_offset = (offset.saturating_add(limit) < total).then_some(offset + limit);
    Ok(HistoryResponse { versions, next_offset })
}
