//! Each gateway's sweep of the E2B API's sandboxes: those past their
//! timeout end (`lifecycle`), running ones are held against what their
//! nodes report (`reconcile`), and rows of earlier releases are sealed.

use crate::records::now_ms;
use crate::state::AppState;

/// How often each gateway looks for sandboxes past their timeout.
const SWEEP_EVERY: std::time::Duration = std::time::Duration::from_secs(10);

/// Ends sandboxes past their timeout that no call touched (a call ends
/// them itself): their records and threads are deleted, whichever replica
/// gets there first. A sandbox whose key is gone loses its record; the
/// key's threads are the agents' to collect.
pub async fn sweep_loop(st: AppState) {
    let since = now_ms();
    loop {
        tokio::time::sleep(SWEEP_EVERY).await;
        super::lifecycle::seal_earlier_rows(&st).await;
        super::reconcile::sweep(&st, since).await;
        let ended = match st.service.records.store().ended_sandboxes(now_ms(), 200).await {
            Ok(ended) => ended,
            Err(e) => {
                tracing::warn!(error = %e, "looking for ended e2b sandboxes failed");
                continue;
            }
        };
        for s in ended {
            match st.keys().named(&s.namespace, &s.key_name) {
                Some(key) => super::lifecycle::expire(&st, &key, &s),
                None => {
                    let _ = st.service.records.store().delete_sandbox(&s.id).await;
                }
            }
        }
    }
}
