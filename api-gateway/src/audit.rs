//! Exactly one audit record per execution, however it ends: a log line, a
//! metric, and the execution's row in the record database.
//!
//! The record is finished on drop, so an execution whose client disconnects
//! (and whose handler future is dropped mid-way) is still recorded, as
//! `cancelled`. It never holds the key or the code.

use std::time::Instant;

use crate::records::{self, Finished, NewRecord, Recorder};
use crate::result::{ExecuteResult, Outcome};

/// An execution being recorded.
#[derive(Debug)]
pub struct Audit {
    record: NewRecord,
    started: Instant,
    exit_code: Option<i32>,
    outcome: Outcome,
    result: Option<Finished>,
    metrics: std::sync::Arc<crate::metrics::Metrics>,
    recorder: Recorder,
    /// The gateway's spans of the call, when they are exported.
    spans: Option<crate::traced::GatewaySpans>,
    /// The end was recorded ([`Audit::end_now`]): dropping it records nothing more.
    ended: bool,
}

impl Audit {
    /// Starts a record (queued for the database; the receiver says when it
    /// is committed); the outcome is `cancelled` until [`Audit::finish`].
    pub fn start(record: NewRecord, recorder: &Recorder, metrics: std::sync::Arc<crate::metrics::Metrics>, spans: Option<crate::traced::GatewaySpans>) -> (Self, tokio::sync::oneshot::Receiver<bool>) {
        let committed = recorder.insert(record.clone());
        let audit = Audit { record, started: Instant::now(), exit_code: None, outcome: Outcome::Cancelled, result: None, metrics, recorder: recorder.clone(), spans, ended: false };
        (audit, committed)
    }

    /// Sets the final outcome of an execution that gave no result.
    pub fn finish(&mut self, outcome: Outcome, exit_code: Option<i32>) {
        self.outcome = outcome;
        self.exit_code = exit_code;
        if let Some(s) = self.spans.as_mut() {
            s.exited();
        }
    }

    /// Sets the final outcome and keeps the result (its output cut to the
    /// retention size).
    pub fn result(&mut self, outcome: Outcome, r: &ExecuteResult) {
        self.finish(outcome, Some(r.exit_code));
        let max = self.recorder.output_max;
        let (stdout, out_cut) = records::cut(&r.stdout, max);
        let (stderr, err_cut) = records::cut(&r.stderr, max);
        self.result = Some(Finished {
            status: outcome.status(),
            error: r.error.clone(),
            exit_code: Some(r.exit_code),
            duration_ms: r.duration_ms,
            cpu_ms: r.cpu_ms,
            peak_memory_bytes: r.peak_memory_bytes,
            stdout: Some(stdout),
            stderr: Some(stderr),
            stdout_truncated: r.stdout_truncated || out_cut,
            stderr_truncated: r.stderr_truncated || err_cut,
            completed_ms: 0,
            blocked_egress: (!r.blocked_egress.is_empty()).then(|| serde_json::to_string(&r.blocked_egress).unwrap_or_default()),
        });
    }

    /// Records the end now, with the outcome set so far (once: later calls
    /// and the drop record nothing). A stream whose retry replays its record
    /// queues the end before its last line leaves, so the record is ended
    /// by the time the client can retry.
    pub fn end_now(&mut self) {
        if std::mem::replace(&mut self.ended, true) {
            return;
        }
        let elapsed = self.started.elapsed();
        let r = &self.record;
        self.metrics.execution(r.language, self.outcome.as_str(), elapsed.as_secs_f64());
        tracing::info!(
            target: "warren::audit",
            execution_id = %r.trace_id,
            key = %r.key_name,
            namespace = %r.namespace,
            sandbox = %r.sandbox,
            language = r.language,
            thread_id = r.thread_id.as_deref().unwrap_or(""),
            metadata = %serde_json::to_string(&r.metadata).unwrap_or_default(),
            node = %r.node,
            mode = r.mode.as_str(),
            duration_ms = elapsed.as_millis() as u64,
            exit_code = self.exit_code.unwrap_or(-1),
            outcome = self.outcome.as_str(),
            "execution"
        );
        let mut end = self.result.take().unwrap_or_else(|| Finished {
            status: self.outcome.status(),
            error: self.outcome.error_code().map(str::to_string),
            exit_code: self.exit_code,
            duration_ms: elapsed.as_millis() as u64,
            ..Default::default()
        });
        end.completed_ms = records::now_ms();
        self.recorder.finish(&r.trace_id, end);
        if let Some(spans) = self.spans.take() {
            spans.export(&r.trace_id, &format!("{}/{}", r.namespace, r.key_name), self.outcome.as_str());
        }
    }
}

impl Drop for Audit {
    fn drop(&mut self) {
        self.end_now();
    }
}
