//! What an execution returns: the result object, the NDJSON stream events,
//! and the outcome classification used by responses, metrics and audit.

use serde::{Deserialize, Serialize};
use utoipa::ToSchema;
use warren_core::exit::{Blocked, Exit as Exited, Failure};

/// SIGSYS: what a seccomp kill looks like from outside.
const SIGSYS: i32 = 31;

/// How an execution ended (bounded set: used as a metric label).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Outcome {
    /// Exit 0.
    Success,
    /// Non-zero exit or killed by a signal.
    Failed,
    /// Wall-clock limit.
    Timeout,
    /// Memory limit.
    Oom,
    /// Seccomp violation.
    Seccomp,
    /// The sandbox could not start the program.
    SandboxError,
    /// The node died mid-execution.
    NodeLost,
    /// The client went away; the execution was killed.
    Cancelled,
    /// The thread's home could not be restored (nothing ran) or saved (the
    /// previous state is kept).
    ThreadError(ThreadFailure),
    /// A storage mount could not be set up (nothing ran), or changes under
    /// /data could not all be stored (the output is complete).
    StorageError(StorageFailure),
    /// The program failed after the network policy refused it a
    /// destination (`blocked_egress` says which).
    Blocked,
    /// A connector's credentials could not be set up; nothing ran.
    CredentialError,
}

/// How storage failed (the result's `error` value).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StorageFailure {
    /// Mounting failed; the program did not run.
    Mount,
    /// Some changes were not stored; `unsynced_paths` says which.
    Sync,
}

/// How a thread's home failed (the result's `error` value).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ThreadFailure {
    /// Restoring failed; the program did not run.
    Mount,
    /// Saving would exceed the Sandbox's `threadMaxSize`.
    TooLarge,
    /// The store failed while saving.
    Save,
    /// Another execution saved the thread meanwhile (on another node).
    Conflict,
    /// A new thread beyond the key's `maxThreads`; the program did not run.
    Limit,
}

impl ThreadFailure {
    fn code(self) -> &'static str {
        match self {
            ThreadFailure::Mount => "thread_mount_error",
            ThreadFailure::TooLarge => "thread_state_too_large",
            ThreadFailure::Save => "thread_save_error",
            ThreadFailure::Conflict => "thread_conflict",
            ThreadFailure::Limit => "thread_limit_reached",
        }
    }
}

impl Outcome {
    /// Label and stream `status` value.
    pub fn as_str(self) -> &'static str {
        match self {
            Outcome::Success => "success",
            Outcome::Failed => "failed",
            Outcome::Timeout => "timeout",
            Outcome::Oom => "oom",
            Outcome::Seccomp => "seccomp",
            Outcome::SandboxError => "sandbox_error",
            Outcome::NodeLost => "node_lost",
            Outcome::Cancelled => "cancelled",
            Outcome::ThreadError(_) => "thread_error",
            Outcome::StorageError(_) => "storage_error",
            Outcome::Blocked => "blocked",
            Outcome::CredentialError => "credential_error",
        }
    }

    /// Classifies an agent's final event.
    pub fn of(e: &Exited) -> Outcome {
        let thread = |t| Outcome::ThreadError(t);
        match e.failure {
            Some(Failure::Start(_) | Failure::Sandbox(_)) => return Outcome::SandboxError,
            Some(Failure::ThreadMount) => return thread(ThreadFailure::Mount),
            Some(Failure::ThreadTooLarge) => return thread(ThreadFailure::TooLarge),
            Some(Failure::ThreadSave) => return thread(ThreadFailure::Save),
            Some(Failure::ThreadConflict) => return thread(ThreadFailure::Conflict),
            Some(Failure::ThreadLimit) => return thread(ThreadFailure::Limit),
            Some(Failure::StorageMount(_)) => return Outcome::StorageError(StorageFailure::Mount),
            Some(Failure::StorageSync(_)) => return Outcome::StorageError(StorageFailure::Sync),
            Some(Failure::CredentialMount(_)) => return Outcome::CredentialError,
            None => {}
        }
        if e.timed_out {
            Outcome::Timeout
        } else if e.oom_killed {
            Outcome::Oom
        } else if e.signal == SIGSYS {
            Outcome::Seccomp
        } else if e.exit_code == 0 && e.signal == 0 {
            Outcome::Success
        } else if !e.blocked.is_empty() {
            // Policy, not (necessarily) a bug: an agent can tell them apart.
            Outcome::Blocked
        } else {
            Outcome::Failed
        }
    }

    /// The execution record's status: one of the terminal values the
    /// Baponi SDK knows; an infrastructure failure is `failed` (its
    /// [`Outcome::error_code`] says which).
    pub fn status(self) -> &'static str {
        match self {
            Outcome::Success | Outcome::Failed | Outcome::Timeout | Outcome::Oom | Outcome::Seccomp | Outcome::Cancelled | Outcome::Blocked => self.as_str(),
            Outcome::SandboxError | Outcome::NodeLost | Outcome::ThreadError(_) | Outcome::StorageError(_) | Outcome::CredentialError => "failed",
        }
    }

    /// The result's `error` value (the SDK's documented codes).
    pub fn error_code(self) -> Option<&'static str> {
        match self {
            Outcome::Timeout => Some("timeout"),
            Outcome::Oom => Some("memory_limit_exceeded"),
            Outcome::Seccomp => Some("security_policy_violation"),
            Outcome::SandboxError => Some("sandbox_error"),
            Outcome::ThreadError(t) => Some(t.code()),
            Outcome::StorageError(StorageFailure::Mount) => Some("storage_mount_error"),
            Outcome::StorageError(StorageFailure::Sync) => Some("storage_sync_error"),
            Outcome::Blocked => Some("blocked"),
            Outcome::CredentialError => Some("credential_mount_error"),
            Outcome::NodeLost => Some("node_lost"),
            Outcome::Success | Outcome::Failed | Outcome::Cancelled => None,
        }
    }
}

/// The result of one execution (the 200 body, and `result` in a stream's
/// last event). A timeout is a result, not an HTTP error.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, ToSchema)]
pub struct ExecuteResult {
    /// Exit code 0 and not killed.
    pub success: bool,
    /// Standard output (invalid UTF-8 replaced with U+FFFD).
    pub stdout: String,
    /// Standard error of the process only; never infrastructure messages.
    pub stderr: String,
    /// Exit code; 128 + signal when killed; -1 when the process never ran.
    pub exit_code: i32,
    /// `timeout`, `memory_limit_exceeded`, `security_policy_violation`, `blocked` (the program failed after the network policy refused it a destination), `sandbox_error`, `thread_mount_error`, `thread_state_too_large`, `thread_save_error`, `thread_conflict`, `thread_limit_reached`, `storage_mount_error`, `storage_sync_error`, `credential_mount_error`, or null.
    pub error: Option<String>,
    /// With `storage_sync_error`: the files under `/data` whose changes were not stored (absent otherwise).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub unsynced_paths: Vec<String>,
    /// Destinations the network policy refused during the call, most frequent first, at most 64 (absent when none).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub blocked_egress: Vec<BlockedEgress>,
    /// Id of this execution (`trc_…`), also in the `X-Trace-Id` header and the audit log.
    pub trace_id: String,
    /// Wall time of the program, milliseconds.
    pub duration_ms: u64,
    /// CPU time of all its processes, milliseconds.
    pub cpu_ms: u64,
    /// Peak memory, bytes; null where the node's kernel keeps no peak
    /// (cgroup v2 before Linux 5.19), never a guess.
    pub peak_memory_bytes: Option<u64>,
    /// The timeout killed it.
    pub timed_out: bool,
    /// The memory limit killed a process.
    pub oom_killed: bool,
    /// Signal that killed the main process, or null.
    pub signal: Option<i32>,
    /// stdout hit the output cap; the rest was discarded.
    pub stdout_truncated: bool,
    /// stderr hit the output cap; the rest was discarded.
    pub stderr_truncated: bool,
}

impl ExecuteResult {
    /// Cuts each stream where its text and JSON encoding would hold more
    /// than its share of the execution's output reservation (see
    /// `budget::fit_encoded`), marking it truncated, as it is when the
    /// gateway cut it for want of memory.
    pub fn held_within(mut self, h: &crate::budget::Holding) -> Self {
        self.stdout_truncated |= crate::budget::fit_encoded(&mut self.stdout, h.shares[0]) | h.cut[0];
        self.stderr_truncated |= crate::budget::fit_encoded(&mut self.stderr, h.shares[1]) | h.cut[1];
        self
    }

    /// Builds the result from the agent's final event and the collected output.
    pub fn new(trace_id: &str, e: &Exited, stdout: String, stderr: String) -> Self {
        let outcome = Outcome::of(e);
        ExecuteResult {
            success: outcome == Outcome::Success,
            stdout,
            stderr,
            exit_code: e.exit_code,
            error: outcome.error_code().map(str::to_string),
            unsynced_paths: e.unsynced_paths().to_vec(),
            blocked_egress: e.blocked.iter().map(BlockedEgress::from).collect(),
            trace_id: trace_id.to_string(),
            duration_ms: e.wall.as_millis().try_into().unwrap_or(u64::MAX),
            cpu_ms: e.cpu_micros / 1000,
            peak_memory_bytes: e.peak_memory_bytes,
            timed_out: e.timed_out,
            oom_killed: e.oom_killed,
            signal: (e.signal != 0).then_some(e.signal),
            stdout_truncated: e.stdout_truncated,
            stderr_truncated: e.stderr_truncated,
        }
    }
}


/// One destination the network policy refused.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct BlockedEgress {
    /// The DNS name the program resolved the address from, or asked for.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub host: Option<String>,
    /// The address; absent for a name the allowlist refused to resolve.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub ip: Option<String>,
    /// Destination port (53 for a refused name).
    pub port: u16,
    /// `tcp`, `udp` or `dns`.
    pub protocol: String,
    /// Packets (or queries) refused.
    pub count: u64,
}

impl BlockedEgress {
    /// The list a record kept (the JSON this crate wrote; anything else
    /// reads as none).
    pub fn from_record(json: Option<&str>) -> Vec<BlockedEgress> {
        json.and_then(|j| serde_json::from_str(j).ok()).unwrap_or_default()
    }
}

impl From<&Blocked> for BlockedEgress {
    fn from(b: &Blocked) -> BlockedEgress {
        BlockedEgress { host: b.host.clone(), ip: b.ip.map(|ip| ip.to_string()), port: b.port, protocol: b.protocol.clone(), count: b.count }
    }
}

/// One line of an `application/x-ndjson` execute response. `seq` increases
/// by one per line, starting at 1.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, ToSchema)]
#[serde(tag = "type", rename_all = "lowercase")]
pub enum StreamEvent {
    /// Lifecycle change: `running` once the sandbox started.
    Status {
        /// Execution id.
        trace_id: String,
        /// `running`.
        status: String,
        /// Sequence number.
        seq: u64,
    },
    /// Output as the program produced it.
    Output {
        /// `stdout` or `stderr`.
        stream: String,
        /// Text (UTF-8; a character split across chunks is kept whole).
        data: String,
        /// Sequence number.
        seq: u64,
    },
    /// Sent during silence so proxies and clients keep the connection.
    Keepalive {
        /// Sequence number.
        seq: u64,
    },
    /// Last line: the whole result.
    Result {
        /// Execution id.
        trace_id: String,
        /// `success`, `failed`, `blocked`, `timeout`, `oom`, `seccomp`, `sandbox_error`, `thread_error`, `storage_error`, `credential_error` or `node_lost`.
        status: String,
        /// The result object, with the whole output again.
        result: ExecuteResult,
        /// Some output was discarded at the cap.
        output_truncated: bool,
        /// Sequence number.
        seq: u64,
    },
}

impl StreamEvent {
    /// Its sequence number.
    pub fn seq(&self) -> u64 {
        match self {
            StreamEvent::Status { seq, .. } | StreamEvent::Output { seq, .. } | StreamEvent::Keepalive { seq } | StreamEvent::Result { seq, .. } => *seq,
        }
    }
}

/// Turns a byte stream into text without splitting characters across chunks.
#[derive(Debug, Default)]
pub struct Utf8Chunks {
    pending: Vec<u8>,
}

impl Utf8Chunks {
    /// Text for `bytes`; an incomplete trailing character waits for the next chunk.
    pub fn push(&mut self, bytes: &[u8]) -> String {
        self.pending.extend_from_slice(bytes);
        let mut out = String::new();
        let mut rest: &[u8] = &self.pending;
        loop {
            match std::str::from_utf8(rest) {
                Ok(s) => {
                    out.push_str(s);
                    rest = &[];
                    break;
                }
                Err(e) => {
                    let (good, bad) = rest.split_at(e.valid_up_to());
                    out.push_str(std::str::from_utf8(good).unwrap_or_default());
                    match e.error_len() {
                        Some(n) => {
                            out.push(char::REPLACEMENT_CHARACTER);
                            rest = &bad[n..];
                        }
                        None => {
                            rest = bad;
                            break;
                        }
                    }
                }
            }
        }
        self.pending = rest.to_vec();
        out
    }

    /// Whatever is left (an incomplete character becomes U+FFFD).
    pub fn finish(&mut self) -> String {
        let s = String::from_utf8_lossy(&self.pending).into_owned();
        self.pending.clear();
        s
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn outcomes() {
        let e = |f: &dyn Fn(&mut Exited)| {
            let mut x = Exited::default();
            f(&mut x);
            Outcome::of(&x)
        };
        assert_eq!(e(&|_| {}), Outcome::Success);
        assert_eq!(e(&|x| x.exit_code = 3), Outcome::Failed);
        assert_eq!(e(&|x| { x.exit_code = 137; x.signal = 9; x.timed_out = true }), Outcome::Timeout);
        assert_eq!(e(&|x| { x.exit_code = 137; x.signal = 9; x.oom_killed = true }), Outcome::Oom);
        assert_eq!(e(&|x| { x.exit_code = 159; x.signal = 31 }), Outcome::Seccomp);
        assert_eq!(e(&|x| { x.exit_code = -1; x.failure = Some(Failure::Sandbox("supervisor lost".into())) }), Outcome::SandboxError);
        assert_eq!(e(&|x| { x.exit_code = -1; x.failure = Some(Failure::Start("exec".into())) }), Outcome::SandboxError);
        assert_eq!(e(&|x| { x.exit_code = -1; x.failure = Some(Failure::ThreadMount) }), Outcome::ThreadError(ThreadFailure::Mount));
        assert_eq!(e(&|x| x.failure = Some(Failure::ThreadTooLarge)), Outcome::ThreadError(ThreadFailure::TooLarge));
        assert_eq!(e(&|x| x.failure = Some(Failure::ThreadSave)), Outcome::ThreadError(ThreadFailure::Save));
    }

    #[test]
    fn unsynced_paths_appear_only_with_a_sync_error() {
        let x = Exited { exit_code: 0, failure: Some(Failure::StorageSync(vec!["/data/out/r.csv".into()])), ..Default::default() };
        let v = serde_json::to_value(ExecuteResult::new("trc_x", &x, "done".into(), String::new())).unwrap();
        assert_eq!((v["success"].as_bool(), v["error"].as_str(), v["stdout"].as_str()), (Some(false), Some("storage_sync_error"), Some("done")));
        assert_eq!(v["unsynced_paths"], serde_json::json!(["/data/out/r.csv"]));
        let ok = serde_json::to_value(ExecuteResult::new("trc_x", &Exited::default(), String::new(), String::new())).unwrap();
        assert!(ok.get("unsynced_paths").is_none(), "absent unless something was not stored");
    }

    #[test]
    fn a_failure_after_refused_egress_is_blocked_and_lists_the_destinations() {
        let refused = Blocked { host: Some("private.test".into()), ip: Some("10.200.0.10".parse().unwrap()), port: 80, protocol: "tcp".into(), count: 2 };
        let x = Exited { exit_code: 1, blocked: vec![refused], ..Default::default() };
        let v = serde_json::to_value(ExecuteResult::new("trc_x", &x, String::new(), String::new())).unwrap();
        assert_eq!((v["success"].as_bool(), v["error"].as_str()), (Some(false), Some("blocked")));
        assert_eq!(v["blocked_egress"], serde_json::json!([{"host": "private.test", "ip": "10.200.0.10", "port": 80, "protocol": "tcp", "count": 2}]));
        // A program that handled the refusal and succeeded is a success; the list stays.
        let ok = Exited { exit_code: 0, ..x.clone() };
        let v = serde_json::to_value(ExecuteResult::new("trc_x", &ok, String::new(), String::new())).unwrap();
        assert_eq!((v["success"].as_bool(), v["error"].as_str(), v["blocked_egress"][0]["port"].as_u64()), (Some(true), None, Some(80)));
        // A plain failure, nothing refused: not blocked.
        assert_eq!(Outcome::of(&Exited { exit_code: 1, ..Default::default() }), Outcome::Failed);
    }

    #[test]
    fn thread_failures_are_named_in_the_result() {
        let cases = [
            (Failure::ThreadMount, "thread_mount_error"),
            (Failure::ThreadTooLarge, "thread_state_too_large"),
            (Failure::ThreadSave, "thread_save_error"),
            (Failure::ThreadConflict, "thread_conflict"),
            (Failure::ThreadLimit, "thread_limit_reached"),
            (Failure::StorageMount("unreachable".into()), "storage_mount_error"),
            (Failure::StorageSync(Vec::new()), "storage_sync_error"),
            (Failure::CredentialMount("forwarder".into()), "credential_mount_error"),
        ];
        for (failure, code) in cases {
            let x = Exited { exit_code: 0, failure: Some(failure), ..Default::default() };
            let r = ExecuteResult::new("trc_x", &x, "out".into(), String::new());
            assert_eq!((r.success, r.error.as_deref(), r.stdout.as_str()), (false, Some(code), "out"));
        }
    }

    #[test]
    fn result_fields() {
        let x = Exited { exit_code: 137, signal: 9, timed_out: true, wall: std::time::Duration::from_micros(2_500_000), ..Default::default() };
        let r = ExecuteResult::new("trc_x", &x, "a".into(), String::new());
        assert!(!r.success);
        assert_eq!((r.error.as_deref(), r.signal, r.duration_ms), (Some("timeout"), Some(9), 2500));
    }

    #[test]
    fn utf8_split_across_chunks() {
        let mut d = Utf8Chunks::default();
        let euro = "€".as_bytes();
        assert_eq!(d.push(&[b'a', euro[0]]), "a");
        assert_eq!(d.push(&euro[1..]), "€");
        assert_eq!(d.push(&[0xff, b'b']), "\u{fffd}b");
        assert_eq!(d.push(&euro[..2]), "");
        assert_eq!(d.finish(), "\u{fffd}");
    }

    #[test]
    fn stream_events_serialize_as_the_sdk_expects() {
        let v = serde_json::to_value(StreamEvent::Keepalive { seq: 3 }).unwrap();
        assert_eq!(v, serde_json::json!({"type": "keepalive", "seq": 3}));
        let v = serde_json::to_value(StreamEvent::Output { stream: "stdout".into(), data: "x".into(), seq: 2 }).unwrap();
        assert_eq!(v, serde_json::json!({"type": "output", "stream": "stdout", "data": "x", "seq": 2}));
    }
}
