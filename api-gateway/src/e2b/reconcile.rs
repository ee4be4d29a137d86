//! Live sandboxes as the records and their nodes see them together. Each
//! gateway, at every sweep, compares the running sandboxes in the records
//! with what their nodes last reported (`Status` lists every live sandbox,
//! how long it has been idle and how many processes it runs, and the ones
//! that ended lately, with why): one its node no longer runs, or whose node
//! has been silent for [`LOST_AFTER`], has **failed** — kept like a paused
//! one, its home as last saved, resumable; one idle past its key's
//! `liveIdleSeconds` is **paused**. Every change is a compare-and-swap on
//! the record, so replicas racing each other (or a caller's own pause,
//! resume or kill) change it once.
//!
//! The lifecycle names are Banata's: `queued` (recorded, not live yet),
//! `ready` (live, nothing running), `active` (a process a caller started
//! runs), `pausing`, `paused`, `failed`. `ending` and `ended` are not
//! observable: a killed sandbox is gone at once (404), as E2B's SDKs expect.

use std::time::Duration;

use warren_proto::agent as pb;

use super::activity::log;
use crate::nodes::Heard;
use crate::records::{now_ms, E2bSandbox};
use crate::state::AppState;

/// How long a node may stay silent before its live sandboxes have failed.
pub const LOST_AFTER: Duration = Duration::from_secs(30);
/// Sandboxes this close to their timeout are left to it.
const NEAR_END_MS: i64 = 30_000;
/// Most running sandboxes one sweep looks at.
const PER_SWEEP: u32 = 5000;

/// Where a sandbox is in its life (Banata's names).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Status {
    /// Recorded; its live sandbox is being made.
    Queued,
    /// Live, running nothing a caller started.
    Ready,
    /// Live, running a process a caller started.
    Active,
    /// Its live sandbox is ending, its home being saved.
    Pausing,
    /// Paused (by its caller, its timeout, or idleness).
    Paused,
    /// Its live sandbox was lost; its home is as last saved.
    Failed,
}

impl Status {
    /// As the APIs and the console show it.
    pub fn as_str(self) -> &'static str {
        match self {
            Status::Queued => "queued",
            Status::Ready => "ready",
            Status::Active => "active",
            Status::Pausing => "pausing",
            Status::Paused => "paused",
            Status::Failed => "failed",
        }
    }
}

/// The status of `s`, given how many caller processes its node last
/// reported running in it (`None`: no report).
pub fn status_of(s: &E2bSandbox, busy: Option<u32>) -> Status {
    match (s.state.as_str(), s.status.as_str(), &s.node) {
        ("paused", "failed", _) => Status::Failed,
        ("paused", _, _) => Status::Paused,
        (_, "pausing", _) => Status::Pausing,
        (_, _, None) => Status::Queued,
        _ if busy.unwrap_or(0) > 0 => Status::Active,
        _ => Status::Ready,
    }
}

/// `s`'s entry in a node's status.
fn summary<'a>(s: &E2bSandbox, status: &'a pb::StatusResponse) -> Option<&'a pb::LiveSummary> {
    status.live.iter().find(|l| names(l.live.as_ref(), s))
}

fn names(r: Option<&pb::LiveRef>, s: &E2bSandbox) -> bool {
    r.and_then(|r| r.r#ref.as_ref()).is_some_and(|t| t.thread_id == s.id && t.key_name == s.key_name && t.namespace == s.namespace)
}

/// The status of `s` now, from the records and its node's last report.
pub fn status(st: &AppState, s: &E2bSandbox) -> Status {
    let busy = s.node.as_deref().and_then(|n| st.service.nodes.named(n)).and_then(|n| n.last_status()).and_then(|r| summary(s, &r).map(|l| l.busy));
    status_of(s, busy)
}

/// What a sweep does to a running sandbox.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Verdict {
    /// Nothing.
    Keep,
    /// Pause it: idle this many seconds.
    Idle(u64),
    /// It failed, for this reason.
    Failed(String),
}

/// The verdict on `s`, live on `node`, from what the node said since it went
/// live (`None`: the node is not among this gateway's), with its key's idle
/// limit (seconds, 0: none).
pub fn verdict(s: &E2bSandbox, node: &str, heard: Option<Heard>, idle_limit: u32) -> Verdict {
    let status = match heard {
        None => return Verdict::Failed(format!("its node {node} is gone from the cluster")),
        Some(Heard::NotYet) => return Verdict::Keep,
        Some(Heard::Silent(d)) if d >= LOST_AFTER => return Verdict::Failed(format!("its node {node} stopped answering ({} s)", d.as_secs())),
        Some(Heard::Silent(_)) => return Verdict::Keep,
        // An agent older than its live report: only its silence says anything.
        Some(Heard::Status(status)) if !status.reports_live => return Verdict::Keep,
        Some(Heard::Status(status)) => status,
    };
    if let Some(l) = summary(s, &status) {
        let idle = l.idle_ms / 1000;
        return match idle_limit > 0 && idle >= u64::from(idle_limit) {
            true => Verdict::Idle(idle),
            false => Verdict::Keep,
        };
    }
    let why = status.live_ended.iter().rev().find(|e| names(e.live.as_ref(), s)).map(|e| e.reason.as_str());
    Verdict::Failed(match why {
        Some("died") => format!("it died on node {node} (killed, or out of memory)"),
        Some("lifetime") => format!("node {node} ended it at its lifetime"),
        Some(_) => format!("node {node} ended it (its agent shut down)"),
        None => format!("node {node} no longer runs it (its agent restarted)"),
    })
}

/// Looks at every running sandbox once (see the module's comment); this
/// gateway has been watching since `since` (Unix ms).
pub async fn sweep(st: &AppState, since: i64) {
    let store = st.service.records.store();
    let running = match store.live_on_nodes(PER_SWEEP).await {
        Ok(r) => r,
        Err(e) => return tracing::warn!(error = %e, "looking for live sandboxes failed"),
    };
    let now = now_ms();
    for s in running {
        let (Some(node), Some(key)) = (s.node.clone(), st.keys().named(&s.namespace, &s.key_name)) else { continue };
        if s.end_ms <= now + NEAR_END_MS {
            continue;
        }
        let heard = st.service.nodes.named(&node).map(|n| n.heard_since(s.live_ms, now));
        // A node this gateway never saw may be one it has not discovered yet.
        if heard.is_none() && now - since < LOST_AFTER.as_millis() as i64 {
            continue;
        }
        match verdict(&s, &node, heard, key.live_idle_seconds) {
            Verdict::Keep => {}
            Verdict::Idle(secs) => idle_pause(st, &key, s, secs).await,
            Verdict::Failed(why) => fail(st, &key, &s, &why).await,
        }
    }
}

async fn fail(st: &AppState, key: &warren_config::EffectiveKey, s: &E2bSandbox, why: &str) {
    let kept = super::lifecycle::paused_kept(key);
    match st.service.records.store().fail_sandbox(s, why, now_ms() + kept.as_millis() as i64).await {
        Ok(true) => {
            tracing::warn!(sandbox = %s.id, key = %key.qualified_name(), reason = why, "live sandbox failed");
            log(st, s, "warren", "sandbox.failed", why);
        }
        Ok(false) => {}
        Err(e) => tracing::warn!(sandbox = %s.id, error = %e, "recording a failed sandbox failed"),
    }
}

async fn idle_pause(st: &AppState, key: &std::sync::Arc<warren_config::EffectiveKey>, s: E2bSandbox, secs: u64) {
    let store = st.service.records.store();
    if !matches!(store.begin_pause(&s).await, Ok(true)) {
        return;
    }
    // The pause itself (saving the home) runs on: the sweep goes on.
    let (st, key) = (st.clone(), key.clone());
    tokio::spawn(async move {
        if let Err(e) = super::lifecycle::pause(&st, &key, &s).await {
            return tracing::warn!(sandbox = %s.id, error = %e.message, "pausing an idle sandbox failed");
        }
        let why = format!("paused after {secs} s idle (liveIdleSeconds {})", key.live_idle_seconds);
        let kept = super::lifecycle::paused_kept(&key);
        if let Err(e) = st.service.records.store().paused_by_warren(&s.id, now_ms() + kept.as_millis() as i64, &why).await {
            return tracing::warn!(sandbox = %s.id, error = %e, "recording an idle pause failed");
        }
        tracing::info!(sandbox = %s.id, key = %key.qualified_name(), idle_s = secs, "idle sandbox paused");
        log(&st, &s, "warren", "sandbox.idle-pause", &why);
    });
}

#[cfg(test)]
mod tests;
