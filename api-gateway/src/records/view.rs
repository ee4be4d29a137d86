//! A record as the API shows it: the execution status of `GET
//! /v1/executions/{id}`, lists, and webhook deliveries.

use std::collections::BTreeMap;

use serde::Serialize;
use utoipa::ToSchema;

use super::Row;
use crate::result::BlockedEgress;

/// An execution's record (`GET /v1/executions/{trace_id}`).
#[derive(Debug, Clone, Serialize, ToSchema)]
pub struct ExecutionStatus {
    /// Execution id.
    pub trace_id: String,
    /// `running`, or the end: `success`, `failed`, `timeout`, `cancelled`, `blocked`, `oom`, `seccomp`.
    pub status: String,
    /// Exit code once ended (`-1`: the process never ran); null while running or when unknown.
    pub exit_code: Option<i32>,
    /// Standard output (absent in lists, and once the output retention removed it).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub stdout: Option<String>,
    /// Standard error.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub stderr: Option<String>,
    /// The result's error code (as in the execute result), `node_lost`, or `gateway_lost`.
    pub error: Option<String>,
    /// Wall time of the program, milliseconds.
    pub duration_ms: u64,
    /// `inline`, `stream`, `async`, `mcp` or `console` (the admin console's playground).
    pub delivery_mode: String,
    /// When it was admitted (RFC 3339).
    pub created_at: String,
    /// When it ended.
    pub completed_at: Option<String>,
    /// Where the result is delivered (async).
    pub webhook_url: Option<String>,
    /// `pending`, `delivered`, `failed` (rejected, or every attempt failed) or `refused` (a destination the SSRF rules forbid).
    pub webhook_delivery_status: Option<String>,
    /// Delivery attempts made.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub webhook_attempts: Option<u32>,
    /// Interpreter.
    pub language: String,
    /// The thread it ran in.
    pub thread_id: Option<String>,
    /// The W3C trace it continued (the caller's `traceparent`, or the one
    /// Warren started when it exports spans): 32 hex digits.
    pub otel_trace_id: Option<String>,
    /// The caller's metadata.
    pub metadata: BTreeMap<String, String>,
    /// The ApiKey that ran it.
    pub key: String,
    /// The Sandbox it ran in.
    pub sandbox: String,
    /// CPU time, milliseconds.
    pub cpu_ms: u64,
    /// Peak memory, bytes; null where the node keeps no peak.
    pub peak_memory_bytes: Option<u64>,
    /// stdout was cut (at the sandbox's cap or the record's size).
    pub stdout_truncated: bool,
    /// stderr was cut.
    pub stderr_truncated: bool,
    /// The output was removed by retention; the record stays.
    pub output_expired: bool,
    /// Destinations the Sandbox's network refused (absent when none, and in lists).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub blocked_egress: Vec<BlockedEgress>,
}

impl ExecutionStatus {
    /// The record as the API shows it.
    pub fn of(r: Row) -> Self {
        let webhook_attempts = r.webhook_url.is_some().then_some(r.webhook_attempts);
        ExecutionStatus {
            trace_id: r.trace_id,
            status: r.status,
            exit_code: r.exit_code,
            stdout: r.stdout,
            stderr: r.stderr,
            error: r.error,
            duration_ms: r.duration_ms,
            delivery_mode: r.mode,
            created_at: super::rfc3339(r.created_ms),
            completed_at: r.completed_ms.map(super::rfc3339),
            webhook_url: r.webhook_url,
            webhook_attempts,
            webhook_delivery_status: r.webhook_status,
            language: r.language,
            thread_id: r.thread_id,
            otel_trace_id: r.otel_trace_id,
            metadata: r.metadata,
            key: r.key_name,
            sandbox: r.sandbox,
            cpu_ms: r.cpu_ms,
            peak_memory_bytes: r.peak_memory_bytes,
            stdout_truncated: r.stdout_truncated,
            stderr_truncated: r.stderr_truncated,
            output_expired: r.output_expired,
            blocked_egress: BlockedEgress::from_record(r.blocked_egress.as_deref()),
        }
    }
}
