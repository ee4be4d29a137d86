//! `DELETE /v1/threads/{thread_id}`: the HTTP adapter of the service's thread deletion.

use axum::extract::{Path, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};

use crate::error::ApiError;
use crate::state::AppState;

/// Delete a thread's saved home directory.
///
/// Only the key that created the thread can see it: another key gets 404
/// for the same id, exactly as for an id that never existed.
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
