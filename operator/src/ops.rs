//! The operator's own health and metrics endpoint (`--ops-listen`).
//!
//! `/healthz`: the process serves. `/readyz`: the API server answered and
//! Warren's CRDs are queryable (the controllers are running). `/metrics`:
//! reconciles by kind and result, their durations, and failures by reason —
//! every label from a small fixed set.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use axum::extract::State;
use axum::http::{header, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use axum::Router;
use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::histogram::{exponential_buckets, Histogram};
use prometheus_client::registry::Registry;

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ReconcileLabels {
    kind: &'static str,
    result: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct KindLabel {
    kind: &'static str,
}

/// Reconcile counters and the readiness flag.
pub struct Ops {
    registry: Registry,
    reconciles: Family<ReconcileLabels, Counter>,
    durations: Family<KindLabel, Histogram>,
    ready: AtomicBool,
}

impl Default for Ops {
    fn default() -> Ops {
        let mut registry = Registry::with_prefix("warren_operator");
        let reconciles = Family::<ReconcileLabels, Counter>::default();
        registry.register("reconciles", "Reconciles by kind and result (ok, error)", reconciles.clone());
        // 1 ms … ~16 s: a status write is milliseconds, a slow API server seconds.
        let durations = Family::<KindLabel, Histogram>::new_with_constructor(|| Histogram::new(exponential_buckets(0.001, 2.0, 15)));
        registry.register("reconcile_duration_seconds", "Reconcile wall time by kind", durations.clone());
        Ops { registry, reconciles, durations, ready: AtomicBool::new(false) }
    }
}

impl Ops {
    /// Records one reconcile of `kind`.
    pub fn reconciled(&self, kind: &'static str, ok: bool, took: Duration) {
        self.reconciles.get_or_create(&ReconcileLabels { kind, result: if ok { "ok" } else { "error" } }).inc();
        self.durations.get_or_create(&KindLabel { kind }).observe(took.as_secs_f64());
    }

    /// Marks the operator ready (its controllers are running).
    pub fn set_ready(&self) {
        self.ready.store(true, Ordering::Relaxed);
    }

    /// The metrics in the OpenMetrics text format.
    pub fn render(&self) -> String {
        let mut out = String::new();
        // Writing to a String cannot fail.
        let _ = prometheus_client::encoding::text::encode(&mut out, &self.registry);
        out
    }
}

/// The endpoint's routes.
pub fn router(ops: Arc<Ops>) -> Router {
    Router::new()
        .route("/healthz", get(|| async { "ok" }))
        .route("/readyz", get(readyz))
        .route("/metrics", get(metrics))
        .with_state(ops)
}

async fn readyz(State(ops): State<Arc<Ops>>) -> Response {
    if ops.ready.load(Ordering::Relaxed) {
        (StatusCode::OK, "ok").into_response()
    } else {
        (StatusCode::SERVICE_UNAVAILABLE, "waiting for the API server and Warren's CRDs").into_response()
    }
}

async fn metrics(State(ops): State<Arc<Ops>>) -> Response {
    ([(header::CONTENT_TYPE, "application/openmetrics-text; version=1.0.0; charset=utf-8")], ops.render()).into_response()
}

/// Serves the endpoint until the process ends.
pub async fn serve(listener: tokio::net::TcpListener, ops: Arc<Ops>) {
    if let Err(e) = axum::serve(listener, router(ops)).await {
        tracing::warn!(error = %e, "the health and metrics endpoint stopped");
    }
}

#[cfg(test)]
mod tests {
    use axum::body::Body;
    use axum::http::Request;
    use http_body_util::BodyExt;
    use tower::ServiceExt;

    use super::*;

    async fn get(ops: &Arc<Ops>, path: &str) -> (StatusCode, String) {
        let resp = router(ops.clone()).oneshot(Request::get(path).body(Body::empty()).unwrap()).await.unwrap();
        let status = resp.status();
        (status, String::from_utf8(resp.into_body().collect().await.unwrap().to_bytes().to_vec()).unwrap())
    }

    #[tokio::test]
    async fn ready_only_once_the_controllers_run() {
        let ops = Arc::new(Ops::default());
        assert_eq!(get(&ops, "/healthz").await.0, StatusCode::OK);
        assert_eq!(get(&ops, "/readyz").await.0, StatusCode::SERVICE_UNAVAILABLE);
        ops.set_ready();
        assert_eq!(get(&ops, "/readyz").await.0, StatusCode::OK);
    }

    #[tokio::test]
    async fn reconciles_are_counted_by_kind_and_result() {
        let ops = Arc::new(Ops::default());
        ops.reconciled("ApiKey", true, Duration::from_millis(3));
        ops.reconciled("ApiKey", false, Duration::from_millis(3));
        ops.reconciled("ApiKey", true, Duration::from_millis(3));
        let (status, text) = get(&ops, "/metrics").await;
        assert_eq!(status, StatusCode::OK);
        assert!(text.contains(r#"warren_operator_reconciles_total{kind="ApiKey",result="ok"} 2"#), "{text}");
        assert!(text.contains(r#"warren_operator_reconciles_total{kind="ApiKey",result="error"} 1"#), "{text}");
        assert!(text.contains(r#"warren_operator_reconcile_duration_seconds_count{kind="ApiKey"} 3"#), "{text}");
    }
}
