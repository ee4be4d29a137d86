//! The HTTP edge: routes over the features (execute, threads, executions,
//! files, MCP), operational endpoints, request ids, the request-counting
//! middleware, the OpenAPI document (`openapi`) and the server (`serve`).

use axum::extract::{MatchedPath, Request, State};
use axum::http::{header, StatusCode};
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Response};
use axum::Router;
use serde::Serialize;
use tower_http::trace::TraceLayer;
use utoipa::{OpenApi, ToSchema};
use utoipa_axum::router::OpenApiRouter;
use utoipa_axum::routes;

pub mod openapi;
pub mod serve;

use crate::error::ApiError;
use crate::state::AppState;

/// Health answer.
#[derive(Debug, Serialize, ToSchema)]
pub struct Health {
    /// `ok` or `not_ready`.
    pub status: String,
    /// Why not ready, when not.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
}

/// Liveness: the process serves HTTP.
#[utoipa::path(get, path = "/healthz", tag = "operations", responses((status = 200, body = Health)))]
async fn healthz() -> axum::Json<Health> {
    axum::Json(Health { status: "ok".into(), reason: None })
}

/// Readiness: the key configuration has been read and at least one node-agent answers.
#[utoipa::path(get, path = "/readyz", tag = "operations", responses((status = 200, body = Health), (status = 503, body = Health)))]
async fn readyz(State(st): State<AppState>) -> Response {
    let reason = if !st.keys().is_loaded() {
        Some("the key configuration has not been read yet")
    } else if st.service.nodes.healthy() == 0 {
        Some("no node-agent is reachable")
    } else {
        None
    };
    let status = if reason.is_some() { StatusCode::SERVICE_UNAVAILABLE } else { StatusCode::OK };
    let body = Health { status: if reason.is_some() { "not_ready" } else { "ok" }.into(), reason: reason.map(Into::into) };
    (status, axum::Json(body)).into_response()
}

/// Prometheus metrics (text exposition format).
#[utoipa::path(get, path = "/metrics", tag = "operations", responses((status = 200, content_type = "application/openmetrics-text", body = String)))]
async fn metrics(State(st): State<AppState>) -> Response {
    let nodes = &st.service.nodes;
    // The healthy agents only, as the totals: an agent that stopped answering has no current figures.
    let slots = nodes.healthy_nodes().iter().filter_map(|n| n.last_status().map(|s| crate::metrics::NodeSlots::of(n.name(), &s))).collect();
    let load = crate::metrics::Load { queued: nodes.waiting(), nodes: slots };
    let text = st.service.metrics.render(nodes.totals(), &load);
    ([(header::CONTENT_TYPE, "application/openmetrics-text; version=1.0.0; charset=utf-8")], text).into_response()
}

/// This document.
#[utoipa::path(get, path = "/openapi.json", tag = "operations", responses((status = 200, content_type = "application/json", body = Object)))]
async fn openapi() -> Response {
    ([(header::CONTENT_TYPE, "application/json")], DOC.clone()).into_response()
}

static DOC: std::sync::LazyLock<String> = std::sync::LazyLock::new(|| openapi::render(&build().1));

/// The router (without state) and the OpenAPI document of its routes.
pub fn build() -> (Router<AppState>, utoipa::openapi::OpenApi) {
    OpenApiRouter::with_openapi(openapi::ApiDoc::openapi())
        .routes(routes!(crate::execute::execute))
        .routes(routes!(crate::threads::delete_thread))
        .routes(routes!(crate::threads::fork_thread))
        .routes(routes!(crate::threads::restore_thread))
        .routes(routes!(crate::threads::thread_history))
        .routes(routes!(crate::executions::list_executions))
        .routes(routes!(crate::executions::get_execution))
        .routes(routes!(crate::executions::cancel_execution))
        .routes(routes!(crate::executions::execution_output))
        .routes(routes!(crate::files::upload_url))
        .routes(routes!(crate::files::download_url))
        .routes(routes!(crate::files::list))
        .routes(routes!(crate::files::put_content, crate::files::get_content))
        .routes(routes!(healthz))
        .routes(routes!(readyz))
        .routes(routes!(metrics))
        .routes(routes!(openapi))
        .split_for_parts()
}

/// The complete application.
///
/// Every request gets an id (`x-request-id`: the caller's when it is a
/// short token, a fresh `req_…` otherwise), echoed in the response and
/// recorded on the request's span; executions are also known by their
/// `trc_…` id, which reaches the node-agent's log.
pub fn app(state: AppState) -> Router {
    let (router, _) = build();
    router
        .merge(crate::mcp::router(state.clone()))
        .merge(crate::e2b::router())
        .merge(crate::sandbase::router())
        .route("/sandboxes/{id}/terminal", axum::routing::get(crate::terminal::terminal))
        .fallback(|| async { ApiError::not_found("no such endpoint; see /openapi.json") })
        .method_not_allowed_fallback(|| async { ApiError::method_not_allowed() })
        .layer(middleware::from_fn(crate::unread::close_when_unread))
        .layer(middleware::from_fn_with_state(state.clone(), crate::e2b::ports::route))
        .layer(middleware::from_fn_with_state(state.clone(), count))
        .layer(TraceLayer::new_for_http().make_span_with(span_for))
        .layer(middleware::from_fn(crate::request_id::ensure))
        .with_state(state)
}

fn span_for<B>(req: &axum::http::Request<B>) -> tracing::Span {
    let route = req.extensions().get::<MatchedPath>().map_or("unmatched", |p| p.as_str());
    tracing::info_span!("http", method = %req.method(), route, request_id = crate::request_id::of(req.headers()))
}

/// Counts responses by route template (bounded) and status.
async fn count(State(st): State<AppState>, req: Request, next: Next) -> Response {
    let route = req.extensions().get::<MatchedPath>().map(|p| p.as_str().to_string()).unwrap_or_else(|| "unmatched".into());
    let resp = next.run(req).await;
    st.service.metrics.request(&route, resp.status().as_u16());
    resp
}
