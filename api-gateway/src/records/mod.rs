//! Execution records: one row per execution (sync, stream, async, MCP) in a
//! real database — SQLite on one machine, PostgreSQL in a cluster — so any
//! gateway replica answers for any execution, and the audit log is a query.
//!
//! ```text
//! Audit (per execution) ──ops──▶ Recorder (batching task) ──▶ Store (sqlx: sqlite | postgres)
//! HTTP handlers (get, cancel, output, list) ───────────────▶ Store (reads)
//! Sweeper (per gateway): heartbeat, orphaned executions, retention
//! ```
//!
//! Writes leave the request path through a channel: a synchronous execute
//! never waits for the database.

mod batch;
mod idempotency;
mod model;
mod sandboxes;
mod store;
mod sweep;
mod view;
mod writer;

pub use idempotency::{Claimed, IdemKey, KEPT_MS as IDEMPOTENCY_KEPT_MS};
pub use model::{cut, Action, Filter, Finished, Mode, NewRecord, Row, Stats, Status};
pub use sandboxes::{E2bSandbox, Inserted, SandboxPage};
pub use store::{Store, StoreError};
pub use sweep::{sweep_loop, Redeliver, Retention};
pub use view::ExecutionStatus;
pub use writer::Recorder;

/// Milliseconds since the Unix epoch.
pub fn now_ms() -> i64 {
    jiff::Timestamp::now().as_millisecond()
}

/// RFC 3339 (UTC, milliseconds) for a Unix-epoch millisecond time.
pub fn rfc3339(ms: i64) -> String {
    jiff::Timestamp::from_millisecond(ms).map(|t| format!("{t:.3}")).unwrap_or_default()
}
