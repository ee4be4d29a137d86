//! Generated gRPC types for `warren.agent.v1` (see `warren/agent/v1/agent.proto`).
//!
//! The Rust code in `src/gen/` is committed so that consumers need no `protoc`;
//! `tests/bootstrap.rs` regenerates it with `protox` and fails when it drifts
//! (`WARREN_UPDATE_GENERATED=1 cargo test -p warren-proto` rewrites it).

/// Package `warren.agent.v1`.
#[allow(missing_docs, clippy::all)]
pub mod agent {
    include!("gen/warren.agent.v1.rs");
}

pub mod client;

pub mod exit;
pub mod kinds;
mod language;
pub mod refusal;
pub mod spec;
#[cfg(test)]
mod testgen;
pub mod tls;

/// gRPC metadata key carrying the gateway's trace id (the execution id, or
/// the HTTP request id for calls that are not executions) to the agent,
/// which records it on its span for the call.
pub const TRACE_HEADER: &str = "x-warren-trace-id";
