//! Exactly one audit record per execution, however it ends.
//!
//! The record is emitted on drop, so an execution whose client disconnects
//! (and whose handler future is dropped mid-way) is still recorded, as
//! `cancelled`. It never holds the key or the code.

use std::collections::BTreeMap;
use std::time::Instant;

use warren_config::EffectiveKey;

use crate::result::Outcome;

/// An execution being recorded.
#[derive(Debug)]
pub struct Audit {
    trace_id: String,
    key: String,
    namespace: String,
    sandbox: String,
    language: &'static str,
    thread_id: Option<String>,
    metadata: String,
    started: Instant,
    node: String,
    exit_code: Option<i32>,
    outcome: Outcome,
    metrics: std::sync::Arc<crate::metrics::Metrics>,
}

impl Audit {
    /// Starts a record; the outcome is `cancelled` until [`Audit::finish`].
    pub fn start(
        trace_id: &str,
        key: &EffectiveKey,
        language: &'static str,
        thread_id: Option<&str>,
        metadata: &BTreeMap<String, String>,
        metrics: std::sync::Arc<crate::metrics::Metrics>,
    ) -> Self {
        Audit {
            trace_id: trace_id.to_string(),
            key: key.name.clone(),
            namespace: key.namespace.clone(),
            sandbox: key.sandbox.clone(),
            language,
            thread_id: thread_id.map(str::to_string),
            metadata: serde_json::to_string(metadata).unwrap_or_default(),
            started: Instant::now(),
            node: String::new(),
            exit_code: None,
            outcome: Outcome::Cancelled,
            metrics,
        }
    }

    /// Notes the node that ran it.
    pub fn node(&mut self, name: String) {
        self.node = name;
    }

    /// Sets the final outcome.
    pub fn finish(&mut self, outcome: Outcome, exit_code: Option<i32>) {
        self.outcome = outcome;
        self.exit_code = exit_code;
    }
}

impl Drop for Audit {
    fn drop(&mut self) {
        let elapsed = self.started.elapsed();
        self.metrics.execution(self.language, self.outcome.as_str(), elapsed.as_secs_f64());
        tracing::info!(
            target: "warren::audit",
            execution_id = %self.trace_id,
            key = %self.key,
            namespace = %self.namespace,
            sandbox = %self.sandbox,
            language = self.language,
            thread_id = self.thread_id.as_deref().unwrap_or(""),
            metadata = %self.metadata,
            node = %self.node,
            duration_ms = elapsed.as_millis() as u64,
            exit_code = self.exit_code.unwrap_or(-1),
            outcome = self.outcome.as_str(),
            "execution"
        );
    }
}
