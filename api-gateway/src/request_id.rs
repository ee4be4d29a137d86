//! Request ids: every request gets one (`x-request-id`), echoed in its
//! response and recorded on its span and in the agents' logs.

use axum::extract::Request;
use axum::http::{HeaderName, HeaderValue};
use axum::middleware::Next;
use axum::response::Response;

static REQUEST_ID: HeaderName = HeaderName::from_static("x-request-id");

/// The request id of a request that went through [`ensure`] ("" otherwise).
pub fn of(headers: &axum::http::HeaderMap) -> &str {
    headers.get(&REQUEST_ID).and_then(|v| v.to_str().ok()).unwrap_or("")
}

/// Keeps the caller's `x-request-id` when it is a short token that cannot
/// corrupt a log line, replaces it by a fresh `req_…` otherwise, and echoes
/// it in the response.
pub async fn ensure(mut req: Request, next: Next) -> Response {
    let theirs = req.headers().get(&REQUEST_ID).and_then(|v| v.to_str().ok()).is_some_and(warren_core::ids::is_execution_id);
    if !theirs {
        let id = warren_core::ids::random_id("req_", 20, &mut |b: &mut [u8]| rand::fill(b));
        if let Ok(v) = HeaderValue::from_str(&id) {
            req.headers_mut().insert(&REQUEST_ID, v);
        }
    }
    let id = req.headers().get(&REQUEST_ID).cloned();
    let mut resp = next.run(req).await;
    if let Some(id) = id {
        resp.headers_mut().insert(&REQUEST_ID, id);
    }
    resp
}

