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
mod language;
pub mod refusal;
