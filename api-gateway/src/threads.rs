//! Threads: where a thread runs, and `DELETE /v1/threads/{thread_id}`.

use axum::extract::{Path, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use warren_config::EffectiveKey;
use warren_proto::agent as pb;

use crate::error::ApiError;
use crate::state::AppState;

/// What rendezvous placement hashes: threads of different keys are different
/// threads, even with the same id.
pub fn placement_key(key: &EffectiveKey, thread_id: &str) -> String {
    format!("{}/{}/{thread_id}", key.namespace, key.name)
}

/// The agent's reference to a thread of `key`.
pub fn thread_ref(key: &EffectiveKey, thread_id: &str) -> pb::ThreadRef {
    pb::ThreadRef { namespace: key.namespace.clone(), key_name: key.name.clone(), thread_id: thread_id.to_string() }
}

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
    if !warren_core::ids::is_thread_id(thread_id) {
        return Err(ApiError::invalid("thread_id", warren_core::ids::THREAD_ID_RULE));
    }
    // Held for the call: an execute through this gateway cannot start meanwhile.
    let _lock = st.admission.thread(&key.qualified_name(), thread_id)?;
    let node = st
        .nodes
        .home_of(&placement_key(&key, thread_id))
        .ok_or_else(|| ApiError::unavailable("no node-agent is reachable right now; retry shortly"))?;
    let msg = pb::DeleteThreadRequest { thread: Some(thread_ref(&key, thread_id)) };
    match node.client().delete_thread(node.request(msg)).await {
        Ok(_) => {
            tracing::info!(key = %key.qualified_name(), thread_id, "thread deleted");
            Ok(())
        }
        Err(s) if s.code() == tonic::Code::NotFound => Err(ApiError::not_found(format!("thread {thread_id:?} does not exist for this key"))),
        Err(s) if s.code() == tonic::Code::Aborted => Err(ApiError::thread_busy(thread_id)),
        Err(s) => {
            tracing::warn!(node = %node.address, code = ?s.code(), "deleting a thread failed");
            Err(ApiError::unavailable("the thread could not be deleted right now; retry shortly"))
        }
    }
}
