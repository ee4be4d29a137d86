//! The record's domain values, free of any database.

use std::collections::BTreeMap;

/// How the caller receives the result (the record's `delivery_mode`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mode {
    /// One JSON response.
    Inline,
    /// NDJSON on the request's connection.
    Stream,
    /// `Prefer: respond-async`: 202 now, status and output later (and a webhook).
    Async,
    /// The MCP endpoint's `sandbox_execute`.
    Mcp,
    /// The console's playground (its metadata names the signed-in user).
    Console,
}

impl Mode {
    /// Stored and shown value.
    pub fn as_str(self) -> &'static str {
        match self {
            Mode::Inline => "inline",
            Mode::Stream => "stream",
            Mode::Async => "async",
            Mode::Mcp => "mcp",
            Mode::Console => "console",
        }
    }
}

/// A record's status. `running` until it ends; then one of the terminal
/// values the Baponi SDK's `wait()` stops at (an infrastructure failure is
/// `failed`, with `error` saying which).
pub struct Status;

impl Status {
    /// Running on a node.
    pub const RUNNING: &'static str = "running";
    /// Every terminal value.
    pub const TERMINAL: [&'static str; 7] = ["success", "failed", "timeout", "cancelled", "blocked", "oom", "seccomp"];

    /// Whether `s` is final.
    pub fn is_terminal(s: &str) -> bool {
        Self::TERMINAL.contains(&s)
    }

    /// Whether `s` is a value a record can have (the audit query's filter).
    pub fn is_known(s: &str) -> bool {
        s == Self::RUNNING || Self::is_terminal(s)
    }
}

/// A record as it starts.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NewRecord {
    /// `trc_…`.
    pub trace_id: String,
    /// The ApiKey's namespace.
    pub namespace: String,
    /// The ApiKey's name.
    pub key_name: String,
    /// The Sandbox it runs in.
    pub sandbox: String,
    /// `python`, `node`, `bash`.
    pub language: &'static str,
    /// Thread, when one was named.
    pub thread_id: Option<String>,
    /// The W3C trace it continued (32 hex), when it carried one.
    pub otel_trace_id: Option<String>,
    /// The caller's metadata (audit only).
    pub metadata: BTreeMap<String, String>,
    /// Delivery mode.
    pub mode: Mode,
    /// Node-agent name it was sent to.
    pub node: String,
    /// The gateway instance that holds its stream.
    pub owner: String,
    /// Its timeout, seconds (bounds how long a reader may wait for it).
    pub timeout_secs: u32,
    /// Async delivery target.
    pub webhook_url: Option<String>,
    /// When it was admitted, Unix ms.
    pub created_ms: i64,
}

/// How a record ends.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Finished {
    /// A terminal [`Status`] value (`cancelled` wins when a cancel was asked and it did not succeed).
    pub status: &'static str,
    /// The result's `error` code, if any.
    pub error: Option<String>,
    /// Exit code; `None` when unknown (the node was lost).
    pub exit_code: Option<i32>,
    /// Wall time of the program.
    pub duration_ms: u64,
    /// CPU time.
    pub cpu_ms: u64,
    /// Peak memory (`None`: the node keeps no peak).
    pub peak_memory_bytes: Option<u64>,
    /// Output kept (already cut to the retention size).
    pub stdout: Option<String>,
    /// Error output kept.
    pub stderr: Option<String>,
    /// Output was cut, at the sandbox's cap or the retention size.
    pub stdout_truncated: bool,
    /// Error output was cut.
    pub stderr_truncated: bool,
    /// When it ended, Unix ms.
    pub completed_ms: i64,
    /// The refused destinations, the result's `blocked_egress` as JSON
    /// (`None`: none were refused).
    pub blocked_egress: Option<String>,
}

/// A stored record, as read back.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Row {
    /// `trc_…`.
    pub trace_id: String,
    /// ApiKey namespace.
    pub namespace: String,
    /// ApiKey name.
    pub key_name: String,
    /// Sandbox name.
    pub sandbox: String,
    /// Language.
    pub language: String,
    /// Thread id.
    pub thread_id: Option<String>,
    /// The W3C trace it continued.
    pub otel_trace_id: Option<String>,
    /// Metadata.
    pub metadata: BTreeMap<String, String>,
    /// Delivery mode.
    pub mode: String,
    /// Status.
    pub status: String,
    /// Error code.
    pub error: Option<String>,
    /// Exit code.
    pub exit_code: Option<i32>,
    /// Wall time.
    pub duration_ms: u64,
    /// CPU time.
    pub cpu_ms: u64,
    /// Peak memory (`None`: the node keeps no peak).
    pub peak_memory_bytes: Option<u64>,
    /// Output, unless expired or not kept.
    pub stdout: Option<String>,
    /// Error output.
    pub stderr: Option<String>,
    /// Output cut.
    pub stdout_truncated: bool,
    /// Error output cut.
    pub stderr_truncated: bool,
    /// Output removed by retention.
    pub output_expired: bool,
    /// Node name.
    pub node: String,
    /// Owning gateway.
    pub owner: String,
    /// Timeout, seconds.
    pub timeout_secs: u32,
    /// A cancel was asked.
    pub cancel_requested: bool,
    /// Webhook target.
    pub webhook_url: Option<String>,
    /// Webhook delivery state (`pending`, `delivered`, `failed`, `refused`).
    pub webhook_status: Option<String>,
    /// Webhook attempts made.
    pub webhook_attempts: u32,
    /// Admitted at.
    pub created_ms: i64,
    /// Ended at.
    pub completed_ms: Option<i64>,
    /// Refused destinations as JSON (not read by list views).
    pub blocked_egress: Option<String>,
}

impl Row {
    /// Whether the record is final.
    pub fn is_terminal(&self) -> bool {
        Status::is_terminal(&self.status)
    }
}

/// An audit query. Always scoped to namespaces (none: nothing matches);
/// to one key unless the caller may see its namespace.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Filter {
    /// Namespaces (an empty list matches nothing).
    pub namespaces: Vec<String>,
    /// One key's records only.
    pub key_name: Option<String>,
    /// Created at or after, Unix ms.
    pub since_ms: Option<i64>,
    /// Created before, Unix ms.
    pub until_ms: Option<i64>,
    /// One status.
    pub status: Option<String>,
    /// One language.
    pub language: Option<String>,
    /// One thread.
    pub thread_id: Option<String>,
    /// One W3C trace.
    pub otel_trace_id: Option<String>,
    /// Every pair must match.
    pub metadata: Vec<(String, String)>,
    /// Page after this (created_ms, trace_id), newest first.
    pub after: Option<(i64, String)>,
    /// Page size.
    pub limit: u32,
}

/// A change made in the console, for the audit log.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Action {
    /// When, Unix ms.
    pub at_ms: i64,
    /// Who (as the identity provider names them).
    pub user: String,
    /// What: `disable-key`, `enable-key`, `cancel-execution`.
    pub action: String,
    /// The namespace of the object.
    pub namespace: String,
    /// The object: a key's or an execution's name.
    pub object: String,
}

/// Ended executions over a window, summed up (the console's overview).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Stats {
    /// How many ended.
    pub total: u64,
    /// Executions per minute: (minute start, Unix ms; count), oldest first.
    pub per_minute: BTreeMap<i64, u64>,
    /// Count per outcome: the status, or `failed (error)` for an
    /// infrastructure failure; most frequent first once [`Stats::outcomes`] sorts them.
    pub outcomes: BTreeMap<String, u64>,
    /// Median duration.
    pub p50_ms: Option<u64>,
    /// 99th percentile duration.
    pub p99_ms: Option<u64>,
}

impl Stats {
    /// Counts `n` executions that ended with `status` (and `error`), in
    /// the minute starting at `minute_ms` when counted per minute.
    pub fn add(&mut self, minute_ms: Option<i64>, status: &str, error: Option<&str>, n: u64) {
        self.total += n;
        if let Some(m) = minute_ms {
            *self.per_minute.entry(m).or_default() += n;
        }
        let outcome = match error {
            Some(e) => format!("{status} ({e})"),
            None => status.to_string(),
        };
        *self.outcomes.entry(outcome).or_default() += n;
    }

    /// The 0-based rank of the `p`th percentile among `total` sorted
    /// durations (nearest rank); `None` when there are none.
    pub fn rank(&self, p: u64) -> Option<u64> {
        (self.total > 0).then(|| (self.total * p).div_ceil(100).saturating_sub(1))
    }

    /// The outcomes, most frequent first.
    pub fn outcomes(&self) -> Vec<(&str, u64)> {
        let mut v: Vec<_> = self.outcomes.iter().map(|(k, n)| (k.as_str(), *n)).collect();
        v.sort_by(|a, b| b.1.cmp(&a.1).then(a.0.cmp(b.0)));
        v
    }
}

/// `s` cut to at most `max` bytes on a character boundary; true when cut.
pub fn cut(s: &str, max: usize) -> (String, bool) {
    if s.len() <= max {
        return (s.to_string(), false);
    }
    let mut end = max;
    while !s.is_char_boundary(end) {
        end -= 1;
    }
    (s[..end].to_string(), true)
}

#[cfg(test)]
mod tests {
    #[test]
    fn stats_count_per_minute_and_outcome_and_rank_percentiles() {
        let mut s = super::Stats::default();
        assert_eq!(s.rank(50), None);
        s.add(Some(60_000), "success", None, 97);
        s.add(Some(60_000), "failed", Some("node_lost"), 2);
        s.add(Some(120_000), "timeout", None, 1);
        assert_eq!((s.total, s.per_minute[&60_000], s.per_minute[&120_000]), (100, 99, 1));
        assert_eq!(s.outcomes(), vec![("success", 97), ("failed (node_lost)", 2), ("timeout", 1)]);
        assert_eq!((s.rank(50), s.rank(99), s.rank(100)), (Some(49), Some(98), Some(99)));
        let one = { let mut o = super::Stats::default(); o.add(None, "success", None, 1); o };
        assert_eq!((one.rank(50), one.rank(99), one.per_minute.len()), (Some(0), Some(0), 0));
    }

    use super::*;

    #[test]
    fn cut_keeps_whole_characters() {
        assert_eq!(cut("abc", 5), ("abc".into(), false));
        assert_eq!(cut("a€b", 2), ("a".into(), true));
        assert_eq!(cut("a€b", 4), ("a€".into(), true));
    }

    #[test]
    fn statuses() {
        assert!(Status::is_terminal("cancelled") && !Status::is_terminal("running"));
        assert!(Status::is_known("running") && !Status::is_known("node_lost"));
    }
}
