//! How sandboxes end: past their timeout (a call that finds one, or each
//! gateway's sweep) a sandbox's live sandbox ends and it is forgotten with
//! its thread — or, created with `autoPause`, paused (its home saved) and
//! kept — and a killed sandbox's processes and thread go in the background.

use std::sync::Arc;

use warren_config::EffectiveKey;

use crate::records::{now_ms, E2bSandbox};
use crate::state::AppState;

/// Deletes the thread of a forgotten sandbox. A command still running holds
/// the thread: then the deletion is retried (once a second, a few minutes
/// at most) in the background, so the home never outlives its sandbox for long.
pub(super) async fn delete_thread(st: &AppState, key: &EffectiveKey, id: &str, trace: &str) {
    use crate::exec_error::ExecError;
    match st.service.delete_thread(key, id, trace).await {
        Ok(()) | Err(ExecError::ThreadNotFound(_)) => {}
        Err(_) => {
            let (st, key, id) = (st.clone(), key.clone(), id.to_string());
            tokio::spawn(async move {
                for _ in 0..300 {
                    tokio::time::sleep(std::time::Duration::from_secs(1)).await;
                    if matches!(st.service.delete_thread(&key, &id, "e2b-kill").await, Ok(()) | Err(ExecError::ThreadNotFound(_))) {
                        return;
                    }
                }
                tracing::warn!(sandbox = %id, "a killed sandbox's thread could not be deleted; its retention removes it");
            });
        }
    }
}

/// Ends the live sandbox of `s` (its home saved), wherever it runs; one
/// already gone is no error.
async fn end_live(st: &AppState, key: &EffectiveKey, s: &E2bSandbox) -> Result<(), crate::exec::live::LiveError> {
    let Some(node) = &s.node else { return Ok(()) };
    let live = st.service.live(key, &s.id, node)?;
    match live.end().await {
        Ok(true) | Err(crate::exec::live::LiveError::Gone) => Ok(()),
        Ok(false) => {
            tracing::warn!(sandbox = %s.id, "a sandbox's home could not be saved as it ended; its thread keeps its previous state");
            Ok(())
        }
        Err(e) => Err(e),
    }
}

/// Pauses `s`: `pausing` (no sweep takes it for failed meanwhile) while
/// its live sandbox ends with its home saved; a node that cannot be reached
/// leaves it running, for the sweep to find failed.
pub(super) async fn pause(st: &AppState, key: &EffectiveKey, s: &E2bSandbox) -> Result<(), super::E2bError> {
    let store = st.service.records.store();
    store.set_sandbox_status(&s.id, "pausing").await?;
    if let Err(e) = end_live(st, key, s).await {
        let _ = store.set_sandbox_status(&s.id, "").await;
        return Err(e.into());
    }
    store.set_sandbox_node(&s.id, None).await?;
    tracing::info!(sandbox = %s.id, "e2b sandbox paused");
    Ok(())
}

/// A forgotten (killed, or past its timeout) sandbox: its processes end
/// and its thread is deleted.
pub(super) async fn forget(st: &AppState, key: &EffectiveKey, s: &E2bSandbox, trace: &str) {
    if let Err(e) = end_live(st, key, s).await {
        tracing::warn!(sandbox = %s.id, error = %e, "ending a forgotten sandbox failed; its node ends it at its lifetime");
    }
    delete_thread(st, key, &s.id, trace).await;
}

/// Tells the node of a running sandbox its new end (`end_ms`).
pub(super) async fn extend(st: &AppState, key: &EffectiveKey, s: &E2bSandbox, end_ms: i64) {
    let Some(node) = &s.node else { return };
    let left = std::time::Duration::from_millis((end_ms - now_ms()).max(1000) as u64);
    let done = match st.service.live(key, &s.id, node) {
        Ok(live) => live.set_lifetime(left).await,
        Err(e) => Err(e),
    };
    if let Err(e) = done {
        tracing::warn!(sandbox = %s.id, error = %e, "a sandbox's node did not take its new timeout");
    }
}

/// How long a sandbox paused at its timeout (`autoPause`) is kept when its
/// Sandbox sets no thread retention (E2B keeps paused sandboxes too).
const PAUSED_KEPT: std::time::Duration = std::time::Duration::from_secs(30 * 86_400);

/// How long a paused sandbox is kept: its Sandbox's thread retention, at most (and without one) [`PAUSED_KEPT`].
pub(super) fn paused_kept(key: &EffectiveKey) -> std::time::Duration {
    key.thread_retention.duration().unwrap_or(PAUSED_KEPT).min(PAUSED_KEPT)
}

/// Ends a sandbox past its timeout, in the background (not a task shutdown
/// waits for: what is left, the next sweep or the thread's retention
/// finishes): one created with `autoPause` that was running is paused and
/// kept (for the Sandbox's thread retention, 30 days without); any other is
/// forgotten and its thread deleted.
pub fn expire(st: &AppState, key: &Arc<EffectiveKey>, s: &E2bSandbox) {
    let (st, key, s) = (st.clone(), key.clone(), s.clone());
    tokio::spawn(async move {
        let store = st.service.records.store();
        if s.auto_pause && s.state == "running" {
            let kept = paused_kept(&key);
            if let Ok(true) = store.auto_pause(&s, now_ms() + kept.as_millis() as i64).await {
                if let Err(e) = pause(&st, &key, &s).await {
                    tracing::warn!(sandbox = %s.id, error = %e.message, "pausing a sandbox at its timeout failed; its node ends it at its lifetime");
                }
                tracing::info!(sandbox = %s.id, "e2b sandbox paused at its timeout");
                super::activity::log(&st, &s, "warren", "sandbox.pause", "at its timeout (autoPause)");
            }
            return;
        }
        if let Ok(true) = store.delete_sandbox(&s.id).await {
            tracing::info!(sandbox = %s.id, "e2b sandbox reached its timeout");
            super::activity::log(&st, &s, "warren", "sandbox.end", "at its timeout");
            forget(&st, &key, &s, "e2b-timeout").await;
        }
    });
}

/// Seals the environment of sandboxes an earlier release (or a replica of
/// it, during a rolling upgrade) stored in plain JSON, and gives their
/// metadata its rows: after this, no variable is readable in the records.
pub(super) async fn seal_earlier_rows(st: &AppState) {
    let store = st.service.records.store();
    let rows = match store.unsealed_sandboxes(100).await {
        Ok(rows) => rows,
        Err(e) => return tracing::warn!(error = %e, "looking for unsealed e2b sandboxes failed"),
    };
    for s in rows {
        let owner = super::sealed::Owner { namespace: &s.namespace, key: &s.key_name, id: &s.id };
        // As the earlier release read it: JSON, or nothing.
        let plain: std::collections::BTreeMap<String, String> = serde_json::from_str(s.env.as_deref().unwrap_or_default()).unwrap_or_default();
        let Some(sealed) = super::sealed::seal(&st.files.signing_key.current(), owner, &plain) else { continue };
        if let Err(e) = store.seal_sandbox(&s, &sealed).await {
            tracing::warn!(error = %e, sandbox = %s.id, "sealing an e2b sandbox's environment failed");
        }
    }
}
