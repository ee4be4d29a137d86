//! The E2B API: the unmodified E2B SDKs (`e2b`, `e2b-code-interpreter`)
//! against Warren.
//!
//! ```text
//! control plane (E2B_API_URL, X-API-KEY: e2b_…)   data plane (E2B_SANDBOX_URL, E2b-Sandbox-Id + X-Access-Token)
//! POST /sandboxes, /v2/sandboxes                  GET /health
//! GET|DELETE /sandboxes/{id}, GET /v2/sandboxes    /process.Process/*        (Connect RPC, JSON)
//! POST /sandboxes/{id}/{timeout,connect,...}       /filesystem.Filesystem/*  (Connect RPC, JSON)
//!                                                  GET|POST /files, POST /execute, /contexts
//! ```
//!
//! An E2B sandbox is a thread of the caller's key: nothing runs between
//! calls, the home (`/home/sandbox`, also spelled `/home/user`) is what
//! persists, a command is one execution in the thread, a file is a file of
//! the thread's saved home. The sandbox's record (template, metadata,
//! environment — sealed, `sealed.rs` —, end) is in the record database so
//! every replica answers.
//! What cannot hold in that model — processes that outlive a command,
//! terminals, exposed ports, interpreter state between `run_code` calls —
//! answers an error that names the limit (docs/src/e2b.md).

pub(crate) mod activity;
mod connect;
pub(crate) mod control;
pub(crate) mod files;
mod filesystem;
mod fork;
mod interpreter;
mod lifecycle;
mod list;
pub(crate) mod paths;
pub mod ports;
mod process;
pub(crate) mod reconcile;
pub(crate) mod sandbox;
mod sealed;
mod sweep;
pub(crate) mod token;
mod watch;

use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::Router;

use crate::exec_error::ExecError;
use crate::files::FileError;
use crate::state::AppState;

pub use sweep::sweep_loop;

/// The envd version Warren's data plane answers like: octet-stream and
/// multipart uploads (≥ 0.5.7), no file metadata or watch entries (0.6.x).
pub const ENVD_VERSION: &str = "0.5.7";

/// The E2B routes.
pub fn router() -> Router<AppState> {
    Router::new()
        .route("/sandboxes", post(control::create).get(list::list_v1))
        .route("/v2/sandboxes", post(control::create).get(list::list))
        .route("/sandboxes/{id}", get(control::get_info).delete(control::kill))
        .route("/sandboxes/{id}/timeout", post(control::set_timeout))
        .route("/sandboxes/{id}/connect", post(control::connect))
        .route("/v2/sandboxes/{id}/connect", post(control::connect))
        .route("/sandboxes/{id}/pause", post(control::pause))
        .route("/sandboxes/{id}/fork", post(fork::fork))
        .route("/sandboxes/{id}/resume", post(control::resume))
        .route("/sandboxes/{id}/refreshes", post(control::refresh))
        .route("/sandboxes/{id}/ports/{port}", get(ports::port_url))
        .route("/sandboxes/{id}/ports/{port}/", axum::routing::any(ports::by_path_root))
        .route("/sandboxes/{id}/ports/{port}/{*path}", axum::routing::any(ports::by_path))
        .route("/health", get(sandbox::health))
        .route("/files", get(files::download).post(files::upload))
        .route("/process.Process/{method}", post(process::call))
        .route("/filesystem.Filesystem/{method}", post(filesystem::call))
        .route("/execute", post(interpreter::execute))
        .route("/contexts", post(interpreter::contexts_root).get(interpreter::contexts_root))
        .route("/contexts/{id}", axum::routing::delete(interpreter::contexts))
        .route("/contexts/{id}/restart", post(interpreter::contexts))
}

/// An E2B error: `{"code": status, "message": …}`, which the SDKs turn into
/// their exceptions by status.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct E2bError {
    /// HTTP status.
    pub status: StatusCode,
    /// What the caller reads.
    pub message: String,
    /// The Connect code, when the status alone does not say it.
    pub connect_code: Option<&'static str>,
    /// Seconds after which a retry may succeed (`Retry-After`).
    pub retry_after: Option<u32>,
}

impl E2bError {
    /// An error with this status and message.
    pub fn new(status: StatusCode, message: impl Into<String>) -> Self {
        E2bError { status, message: message.into(), connect_code: None, retry_after: None }
    }

    /// An error with its own Connect code.
    pub fn with_code(mut self, code: &'static str) -> Self {
        self.connect_code = Some(code);
        self
    }

    /// With `Retry-After: secs`.
    pub fn retry_after(mut self, secs: u32) -> Self {
        self.retry_after = Some(secs);
        self
    }

    /// 400.
    pub fn invalid(message: impl Into<String>) -> Self {
        Self::new(StatusCode::BAD_REQUEST, message)
    }

    /// 404.
    pub fn not_found(message: impl Into<String>) -> Self {
        Self::new(StatusCode::NOT_FOUND, message)
    }

    /// A Warren limit the E2B call runs into: a 400 (bad input, not a
    /// server failure) whose Connect code is `unimplemented`.
    pub fn unsupported(what: &str) -> Self {
        Self::new(StatusCode::BAD_REQUEST, format!("{what} — see the E2B page of Warren's documentation")).with_code("unimplemented")
    }

    /// The sandbox is gone (killed or past its timeout): the data plane's
    /// 502, which the SDKs read as "not running".
    pub fn gone(id: &str) -> Self {
        Self::new(StatusCode::BAD_GATEWAY, format!("The sandbox {id} was not found"))
    }
}

/// The string entries of a JSON object (envd's `envs`, the interpreter's
/// `env_vars`); anything else is not a variable and is left out.
pub fn string_entries(v: Option<&serde_json::Value>) -> std::collections::BTreeMap<String, String> {
    v.and_then(serde_json::Value::as_object).map(|m| m.iter().filter_map(|(k, v)| Some((k.clone(), v.as_str()?.to_string()))).collect()).unwrap_or_default()
}

/// A request body of at most `limit` bytes, arriving within the gateway's body timeout.
pub async fn read_body(st: &AppState, b: axum::body::Body, limit: usize) -> Result<axum::body::Bytes, E2bError> {
    tokio::time::timeout(st.settings.body_timeout, axum::body::to_bytes(b, limit))
        .await
        .map_err(|_| E2bError::new(StatusCode::REQUEST_TIMEOUT, "the request body did not arrive in time"))?
        .map_err(|_| E2bError::new(StatusCode::PAYLOAD_TOO_LARGE, format!("the request body exceeds {limit} bytes")))
}

/// E2B's one reading of the execution service's errors: the statuses its
/// SDKs turn into their exceptions. A 429 carries `Retry-After`: the JS
/// SDK's control plane retries it by itself, and on the data plane it is
/// `resource_exhausted`, rate limiting — never the 502/503 the SDKs read
/// as a dead sandbox.
impl From<ExecError> for E2bError {
    fn from(e: ExecError) -> Self {
        let message = e.to_string();
        let (status, retry) = match e {
            ExecError::Invalid { .. } => (StatusCode::BAD_REQUEST, None),
            ExecError::MissingKey | ExecError::InvalidKey(_) => (StatusCode::UNAUTHORIZED, None),
            ExecError::KeyDisabled => (StatusCode::FORBIDDEN, None),
            ExecError::ThreadNotFound(_) | ExecError::VersionNotFound(_) => (StatusCode::NOT_FOUND, None),
            ExecError::ThreadBusy(_) | ExecError::ThreadExists(_) => (StatusCode::CONFLICT, None),
            ExecError::ThreadLimit => (StatusCode::FORBIDDEN, None),
            ExecError::ThreadTooLarge => (StatusCode::PAYLOAD_TOO_LARGE, None),
            ExecError::KeyConcurrency(_) | ExecError::Busy(_) => (StatusCode::TOO_MANY_REQUESTS, Some(1)),
            ExecError::ImagePulling => (StatusCode::SERVICE_UNAVAILABLE, Some(crate::error::IMAGE_PULL_RETRY_SECS)),
            ExecError::OutputBudget(_) | ExecError::NoNode | ExecError::NodeRefused(_) | ExecError::ThreadStore | ExecError::RecordStore | ExecError::ImageUnavailable(_) => {
                (StatusCode::SERVICE_UNAVAILABLE, Some(1))
            }
            // The node died mid-command: the sandbox's command is gone.
            ExecError::NodeLost => (StatusCode::BAD_GATEWAY, None),
            ExecError::NotImplemented(_) => (StatusCode::NOT_IMPLEMENTED, None),
        };
        E2bError { retry_after: retry, ..E2bError::new(status, message) }
    }
}

/// envd's reading of a file refusal (404 stays 404: the SDKs raise their
/// not-found errors from it).
impl From<FileError> for E2bError {
    fn from(e: FileError) -> Self {
        let message = e.to_string();
        let (status, retry) = match e {
            FileError::Invalid { .. } => (StatusCode::BAD_REQUEST, None),
            FileError::NotFound(_) => (StatusCode::NOT_FOUND, None),
            FileError::ThreadBusy => (StatusCode::CONFLICT, None),
            FileError::TooLarge => (StatusCode::PAYLOAD_TOO_LARGE, None),
            FileError::ThreadLimit | FileError::ReadOnly => (StatusCode::FORBIDDEN, None),
            FileError::Unavailable(_) => (StatusCode::SERVICE_UNAVAILABLE, Some(1)),
        };
        E2bError { retry_after: retry, ..E2bError::new(status, message) }
    }
}

impl From<crate::records::StoreError> for E2bError {
    fn from(e: crate::records::StoreError) -> Self {
        if e.is_busy() {
            return Self::new(StatusCode::TOO_MANY_REQUESTS, "the sandbox registry was busy for the whole queue wait; retry shortly").retry_after(1);
        }
        tracing::warn!(error = %e, "the record database failed an E2B call");
        Self::new(StatusCode::SERVICE_UNAVAILABLE, "the sandbox registry is unavailable; retry shortly")
    }
}

impl IntoResponse for E2bError {
    fn into_response(self) -> Response {
        let body = serde_json::json!({"code": self.status.as_u16(), "message": self.message});
        let mut r = (self.status, axum::Json(body)).into_response();
        if let Some(secs) = self.retry_after {
            r.headers_mut().insert(axum::http::header::RETRY_AFTER, secs.into());
        }
        r
    }
}

#[cfg(test)]
mod error_tests {
    use super::*;

    #[test]
    fn capacity_is_rate_limiting_and_only_a_lost_node_reads_as_a_dead_sandbox() {
        for e in [ExecError::KeyConcurrency(64), ExecError::Busy("every node slot was taken")] {
            let e = E2bError::from(e);
            assert_eq!((e.status, e.retry_after), (StatusCode::TOO_MANY_REQUESTS, Some(1)));
        }
        assert_eq!(E2bError::from(ExecError::NodeLost).status, StatusCode::BAD_GATEWAY);
        assert_eq!(E2bError::from(ExecError::NoNode).status, StatusCode::SERVICE_UNAVAILABLE);
        let e = E2bError::from(ExecError::invalid("env_vars.PATH", "is reserved"));
        assert_eq!((e.status, e.message.as_str()), (StatusCode::BAD_REQUEST, "env_vars.PATH: is reserved"));
    }

    #[test]
    fn file_refusals_keep_their_meaning() {
        assert_eq!(E2bError::from(FileError::NotFound("no such file")).status, StatusCode::NOT_FOUND);
        assert_eq!(E2bError::from(FileError::ThreadBusy).status, StatusCode::CONFLICT);
        assert_eq!(E2bError::from(FileError::ReadOnly).status, StatusCode::FORBIDDEN);
        let e = E2bError::from(FileError::Unavailable("no node-agent is reachable right now; retry shortly"));
        assert_eq!((e.status, e.retry_after), (StatusCode::SERVICE_UNAVAILABLE, Some(1)));
    }
}
