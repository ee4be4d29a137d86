//! Shared state of the HTTP handlers.

use std::sync::Arc;
use std::time::Duration;

use tokio::sync::watch;

use crate::auth::KeyStore;
use crate::exec::ExecutionService;

/// Tunables of the request path.
#[derive(Debug, Clone)]
pub struct Settings {
    /// Silence after which a stream gets a keepalive line.
    pub keepalive: Duration,
    /// How long a streaming client may take no line before its execution
    /// is cancelled.
    pub stream_stall: Duration,
    /// Longest wait for a request body (and longest silence of an upload held whole).
    pub body_timeout: Duration,
    /// Least average rate of an upload held whole, bytes per second.
    pub upload_min_rate: u64,
    /// A gateway silent this long is gone (its running executions end as `gateway_lost`).
    pub record_lease: Duration,
    /// The domain a live sandbox's ports are reached under by name
    /// (`<port>-<sandbox id>.<domain>`, wildcard DNS to the gateway); `None`:
    /// by header and path only.
    pub sandbox_domain: Option<String>,
}

/// Everything a handler needs; cheap to clone.
#[derive(Debug, Clone)]
pub struct AppState {
    /// Current key configuration (swapped whole on reload).
    pub keys: watch::Receiver<Arc<KeyStore>>,
    /// The execution service the adapters call.
    pub service: ExecutionService,
    /// Tunables.
    pub settings: Settings,
    /// File URLs.
    pub files: std::sync::Arc<crate::file_urls::Settings>,
    /// Webhook sender.
    pub webhooks: crate::webhook::Webhooks,
    /// Gateway memory for uploads held whole.
    pub uploads: Arc<crate::uploads::UploadBudget>,
    /// Asynchronous executions running in this gateway (shutdown waits for them).
    pub tasks: tokio_util::task::TaskTracker,
}

impl AppState {
    /// The configuration generation for one request.
    pub fn keys(&self) -> Arc<KeyStore> {
        self.keys.borrow().clone()
    }
}
