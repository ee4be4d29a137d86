//! What every gateway does in the background for the shared records: say
//! it is alive, end the records of gateways that stopped (their streams,
//! and so their sandboxes, are gone), and apply retention.

use std::time::Duration;

use super::store::Store;

/// How long records and their output are kept.
#[derive(Debug, Clone, Copy)]
pub struct Retention {
    /// Whole records, after they end.
    pub records: Duration,
    /// Their stdout, stderr and stream lines.
    pub output: Duration,
    /// A gateway silent this long is gone.
    pub lease: Duration,
}

/// Delivers a webhook this gateway took over from a stopped one.
pub trait Redeliver: Send + Sync {
    /// Starts delivering `trace_id`'s final record to `url` for key `namespace/name`.
    fn redeliver(&self, trace_id: String, url: String, namespace: String, key_name: String);
}

/// Runs until aborted. `owner` is this gateway's instance id.
pub async fn sweep_loop(store: Store, owner: String, retention: Retention, redeliver: std::sync::Arc<dyn Redeliver>) {
    let beat = (retention.lease / 3).max(Duration::from_millis(200));
    let mut expire_due = tokio::time::Instant::now();
    loop {
        let now = super::now_ms();
        if let Err(e) = store.heartbeat(&owner, now).await {
            tracing::warn!(error = %e, "recording this gateway's heartbeat failed");
        }
        match store.end_orphans(now, now - retention.lease.as_millis() as i64).await {
            Ok(0) => {}
            Ok(n) => tracing::warn!(executions = n, "executions of a gateway that stopped were recorded as ended (gateway_lost)"),
            Err(e) => tracing::warn!(error = %e, "ending the executions of stopped gateways failed"),
        }
        match store.claim_webhooks(&owner, now - retention.lease.as_millis() as i64).await {
            Ok(claimed) => {
                for (trace_id, url, namespace, key_name) in claimed {
                    tracing::info!(execution_id = %trace_id, "delivering the webhook of a gateway that stopped");
                    redeliver.redeliver(trace_id, url, namespace, key_name);
                }
            }
            Err(e) => tracing::warn!(error = %e, "taking over the webhooks of stopped gateways failed"),
        }
        if tokio::time::Instant::now() >= expire_due {
            let (out, rec) = (now - retention.output.as_millis() as i64, now - retention.records.as_millis() as i64);
            if let Err(e) = store.expire(out, rec).await {
                tracing::warn!(error = %e, "applying record retention failed");
            }
            expire_due += Duration::from_secs(60);
        }
        tokio::time::sleep(beat).await;
    }
}
