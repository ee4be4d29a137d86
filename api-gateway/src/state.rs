//! Shared state of the HTTP handlers.

use std::sync::Arc;
use std::time::Duration;

use tokio::sync::watch;

use crate::admission::Admission;
use crate::auth::KeyStore;
use crate::metrics::Metrics;
use crate::nodes::Nodes;

/// Tunables of the request path.
#[derive(Debug, Clone)]
pub struct Settings {
    /// How long a request waits for a free node slot before 503.
    pub queue_wait: Duration,
    /// Silence after which a stream gets a keepalive line.
    pub keepalive: Duration,
    /// How long a streaming client may take no line before its execution
    /// is cancelled.
    pub stream_stall: Duration,
    /// Longest wait for a request body.
    pub body_timeout: Duration,
}

/// Everything a handler needs; cheap to clone.
#[derive(Debug, Clone)]
pub struct AppState {
    /// Current key configuration (swapped whole on reload).
    pub keys: watch::Receiver<Arc<KeyStore>>,
    /// Node-agents.
    pub nodes: Arc<Nodes>,
    /// Per-key and per-thread admission.
    pub admission: Arc<Admission>,
    /// Gateway memory for execution output.
    pub budget: Arc<crate::budget::OutputBudget>,
    /// Metrics.
    pub metrics: Arc<Metrics>,
    /// Tunables.
    pub settings: Settings,
}

impl AppState {
    /// The configuration generation for one request.
    pub fn keys(&self) -> Arc<KeyStore> {
        self.keys.borrow().clone()
    }
}
