//! The one mapping from failures to HTTP responses.
//!
//! Every error leaves as `{"error": code, "message": text, "field"?: name}`
//! with the status the Baponi SDK maps to the right exception. Messages are
//! written for the caller and never carry internal detail.

use axum::http::{header, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use serde::Serialize;
use utoipa::ToSchema;

use crate::exec_error::ExecError;

/// Error body of every non-2xx response.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, ToSchema)]
pub struct ErrorBody {
    /// Machine-readable code, e.g. `invalid_request`, `thread_busy`.
    pub error: String,
    /// Human-readable explanation.
    pub message: String,
    /// The offending request field, when there is one (`timeout`, `env_vars.PATH`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub field: Option<String>,
}

/// A refused or failed request.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ApiError {
    /// HTTP status.
    pub status: StatusCode,
    /// Body.
    pub body: ErrorBody,
    /// Seconds for `Retry-After` (429, 503).
    pub retry_after: Option<u32>,
}

impl ApiError {
    fn new(status: StatusCode, code: &str, message: impl Into<String>) -> Self {
        ApiError { status, body: ErrorBody { error: code.into(), message: message.into(), field: None }, retry_after: None }
    }

    /// 400: the request is malformed; `field` names what to fix.
    pub fn invalid(field: impl Into<String>, message: impl Into<String>) -> Self {
        let field = field.into();
        let mut e = Self::new(StatusCode::BAD_REQUEST, "invalid_request", format!("{field}: {}", message.into()));
        e.body.field = Some(field);
        e
    }

    /// 400: the body is not parseable JSON.
    pub fn invalid_json(message: impl Into<String>) -> Self {
        Self::new(StatusCode::BAD_REQUEST, "invalid_json", message)
    }

    /// 401: no key, or not a key we know.
    pub fn unauthenticated(code: &str, message: &str) -> Self {
        Self::new(StatusCode::UNAUTHORIZED, code, message)
    }

    /// 403: the key exists but may not do this.
    pub fn forbidden(code: &str, message: impl Into<String>) -> Self {
        Self::new(StatusCode::FORBIDDEN, code, message)
    }

    /// 404.
    pub fn not_found(message: impl Into<String>) -> Self {
        Self::new(StatusCode::NOT_FOUND, "not_found", message)
    }

    /// 405.
    pub fn method_not_allowed() -> Self {
        Self::new(StatusCode::METHOD_NOT_ALLOWED, "method_not_allowed", "this path does not accept that method")
    }

    /// 413.
    pub fn too_large(limit: usize) -> Self {
        Self::new(StatusCode::PAYLOAD_TOO_LARGE, "payload_too_large", format!("request body exceeds {limit} bytes"))
    }

    /// 413 with a reason.
    pub fn too_large_message(message: impl Into<String>) -> Self {
        Self::new(StatusCode::PAYLOAD_TOO_LARGE, "payload_too_large", message)
    }

    /// 409.
    pub fn conflict(code: &str, message: impl Into<String>) -> Self {
        Self::new(StatusCode::CONFLICT, code, message)
    }

    /// 422: well-formed, but it contradicts what was asked before (an
    /// idempotency key reused for another request).
    pub fn unprocessable(code: &str, message: impl Into<String>) -> Self {
        Self::new(StatusCode::UNPROCESSABLE_ENTITY, code, message)
    }

    /// 411: an upload must declare its length.
    pub fn length_required() -> Self {
        Self::new(StatusCode::LENGTH_REQUIRED, "length_required", "send the upload with a Content-Length header")
    }

    /// 408: the body did not arrive in time.
    pub fn body_timeout(limit: std::time::Duration) -> Self {
        Self::new(StatusCode::REQUEST_TIMEOUT, "request_timeout", format!("the request body did not arrive within {} seconds", limit.as_secs_f64()))
    }

    /// 415.
    pub fn unsupported_media_type() -> Self {
        Self::new(StatusCode::UNSUPPORTED_MEDIA_TYPE, "unsupported_media_type", "send the request body as Content-Type: application/json")
    }

    /// 501: a documented option this server does not offer yet.
    pub fn not_implemented(message: impl Into<String>) -> Self {
        Self::new(StatusCode::NOT_IMPLEMENTED, "not_implemented", message)
    }

    /// 429: capacity stayed taken for the whole queue wait; nothing ran.
    pub fn busy(code: &str, message: impl Into<String>) -> Self {
        let mut e = Self::new(StatusCode::TOO_MANY_REQUESTS, code, message);
        e.retry_after = Some(1);
        e
    }

    /// 503: nothing ran; safe to retry.
    pub fn unavailable(message: impl Into<String>) -> Self {
        let mut e = Self::new(StatusCode::SERVICE_UNAVAILABLE, "unavailable", message);
        e.retry_after = Some(1);
        e
    }
}

/// `Retry-After` while a node pulls the sandbox's image.
pub const IMAGE_PULL_RETRY_SECS: u32 = 5;

/// The one place an execution-service error becomes an HTTP status.
impl From<ExecError> for ApiError {
    fn from(e: ExecError) -> ApiError {
        let message = e.to_string();
        match e {
            ExecError::MissingKey => Self::unauthenticated("missing_api_key", &message),
            ExecError::InvalidKey(_) => Self::unauthenticated("invalid_api_key", &message),
            ExecError::KeyDisabled => Self::forbidden("api_key_disabled", message),
            ExecError::Invalid { field, message } => Self::invalid(field, message),
            // Waited in order for the whole queue wait: 429, which every SDK
            // reads as "retry later", never the 503 E2B's reads as a dead sandbox.
            ExecError::KeyConcurrency(_) => Self::busy("concurrency_limit", message),
            ExecError::Busy(_) => Self::busy("queue_timeout", message),
            ExecError::ThreadBusy(_) => Self::new(StatusCode::CONFLICT, "thread_busy", message),
            ExecError::ThreadNotFound(_) => Self::not_found(message),
            ExecError::VersionNotFound(_) => Self::new(StatusCode::NOT_FOUND, "version_not_found", message),
            ExecError::ThreadExists(_) => Self::new(StatusCode::CONFLICT, "thread_exists", message),
            ExecError::ThreadLimit => Self::forbidden("thread_limit_reached", message),
            ExecError::ThreadTooLarge => Self::new(StatusCode::PAYLOAD_TOO_LARGE, "thread_state_too_large", message),
            ExecError::OutputBudget(_) | ExecError::NoNode | ExecError::NodeRefused(_) | ExecError::ThreadStore | ExecError::RecordStore => {
                Self::unavailable(message)
            }
            // A pull takes seconds: retrying at once would only add load.
            ExecError::ImagePulling => {
                let mut e = Self::unavailable(message);
                e.retry_after = Some(IMAGE_PULL_RETRY_SECS);
                e
            }
            ExecError::ImageUnavailable(_) => Self::unavailable(message),
            // Deliberately not 503 (which clients retry automatically): the
            // code may have partly run.
            ExecError::NodeLost => Self::new(StatusCode::BAD_GATEWAY, "node_lost", message),
            ExecError::NotImplemented(_) => Self::not_implemented(message),
        }
    }
}

impl IntoResponse for ExecError {
    fn into_response(self) -> Response {
        ApiError::from(self).into_response()
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let mut resp = (self.status, axum::Json(self.body)).into_response();
        if let Some(s) = self.retry_after {
            resp.headers_mut().insert(header::RETRY_AFTER, HeaderValue::from(s));
        }
        resp
    }
}
