//! The pages behind a session: each asks who is signed in, which
//! namespaces they may see (the cluster's RBAC, or everything for the
//! local admin), and renders only those namespaces' objects and records
//! (and of the nodes' warm images, only those their keys use). Another
//! namespace's record answers like a missing one.

use std::collections::HashSet;
use std::sync::Arc;

use axum::extract::{Path, Query, RawQuery, State};
use axum::http::{HeaderMap, StatusCode, Uri};
use axum::response::sse::{Event, KeepAlive, Sse};
use axum::response::{IntoResponse, Response};

use super::frame::{not_found_page, page, Console};
use super::html::Html;
use super::query::{ListQuery, Refusal};
use super::session::Session;
use super::views;
use crate::records::{now_ms, Row};
use crate::state::AppState;

/// A signed-in request: who, what they may see, and the gateway.
pub(super) struct Viewer<'c> {
    pub(super) session: Session,
    pub(super) namespaces: Vec<String>,
    pub(super) warren: &'c AppState,
}

impl Console {
    /// The viewer of a page request, or the answer instead of the page
    /// (sign in, or a clear page when the gateway or RBAC cannot answer).
    pub(super) async fn viewer(&self, headers: &HeaderMap, uri: &Uri) -> Result<Viewer<'_>, Response> {
        let session = self.signed_in(headers, uri)?;
        let Some(warren) = self.warren.as_ref() else {
            return Err(page(StatusCode::SERVICE_UNAVAILABLE, "Unavailable", Some(&session), &Html::text("This console is not connected to a gateway.")));
        };
        let candidates = warren.keys().namespaces();
        match self.access.visible(&session.identity, &candidates).await {
            Ok(namespaces) => Ok(Viewer { session, namespaces, warren }),
            Err(e) => {
                tracing::warn!(error = %e, "console: the cluster could not answer an access review");
                Err(page(StatusCode::SERVICE_UNAVAILABLE, "Unavailable", Some(&session), &Html::text("The cluster could not say what you may see. Try again shortly.")))
            }
        }
    }
}

impl Viewer<'_> {
    pub(super) fn page(&self, title: &str, body: &Html) -> Response {
        page(StatusCode::OK, title, Some(&self.session), body)
    }

    pub(super) fn unavailable(&self, e: crate::records::StoreError) -> Response {
        tracing::warn!(error = %e, "console: the record store failed");
        page(StatusCode::SERVICE_UNAVAILABLE, "Unavailable", Some(&self.session), &Html::text("The execution records cannot be read right now. Try again shortly."))
    }

    /// The keys in the namespaces they may see, by namespace and name.
    fn keys(&self) -> Vec<Arc<warren_config::EffectiveKey>> {
        let mut keys: Vec<_> = self.warren.keys().keys().iter().filter(|k| self.namespaces.contains(&k.namespace)).cloned().collect();
        keys.sort_by(|a, b| (&a.namespace, &a.name).cmp(&(&b.namespace, &b.name)));
        keys
    }
}

/// The overview: nodes, and the records of the last hour and day.
pub(super) async fn overview(State(c): State<Arc<Console>>, headers: HeaderMap, uri: Uri) -> Response {
    let v = match c.viewer(&headers, &uri).await {
        Ok(v) => v,
        Err(r) => return r,
    };
    let now = now_ms();
    let store = v.warren.service.records.store();
    let (hour, day) = tokio::join!(store.stats(&v.namespaces, now - 3_600_000, true), store.stats(&v.namespaces, now - 86_400_000, false));
    let (hour, day) = match (hour, day) {
        (Ok(h), Ok(d)) => (h, d),
        (Err(e), _) | (_, Err(e)) => return v.unavailable(e),
    };
    let keys = v.keys();
    let used = used_images(&keys);
    let nodes: Vec<views::NodeFacts> = v.warren.service.nodes.all().iter().map(|n| facts(n, &used)).collect();
    let load = views::GatewayLoad { queued: v.warren.service.nodes.waiting(), in_flight: v.warren.service.metrics.executions_in_flight() };
    v.page("Overview", &views::overview(&nodes, load, &hour, &day, now))
}

/// The images the keys `v` may see use: references and pinned digests.
/// A node's other warm images belong to tenants the user may not see.
fn used_images(keys: &[Arc<warren_config::EffectiveKey>]) -> HashSet<&str> {
    keys.iter().flat_map(|k| std::iter::once(k.image.as_str()).chain(k.image_digest.as_deref())).collect()
}

/// Whether a warm image (`reference`, maybe pinned `@sha256:…`, and its
/// `digest`) is one of `used`.
fn is_used(reference: &str, digest: &str, used: &HashSet<&str>) -> bool {
    let unpinned = reference.split_once('@').map_or(reference, |(r, _)| r);
    used.contains(reference) || used.contains(unpinned) || (!digest.is_empty() && used.contains(digest))
}

fn facts(n: &crate::nodes::Node, used: &HashSet<&str>) -> views::NodeFacts {
    let last = n.last_status().unwrap_or_default();
    views::NodeFacts {
        name: n.name(),
        ready: n.is_healthy(),
        version: last.agent_version,
        running: last.running_executions,
        capacity: last.max_executions,
        cgroup: last.features.map_or(0, |f| f.cgroup_version),
        images: last.images.into_iter().filter(|i| is_used(&i.reference, &i.digest, used)).map(|i| i.reference).collect(),
        warm: last.warm_sandboxes,
        warm_memory: last.warm_memory_bytes,
    }
}

/// The audit log: filters, a page of records, the link to the next.
pub(super) async fn executions(State(c): State<Arc<Console>>, headers: HeaderMap, uri: Uri, RawQuery(raw): RawQuery) -> Response {
    let v = match c.viewer(&headers, &uri).await {
        Ok(v) => v,
        Err(r) => return r,
    };
    let pairs: Vec<(String, String)> = url::form_urlencoded::parse(raw.unwrap_or_default().as_bytes()).into_owned().collect();
    let (q, filter) = match ListQuery::parse(&pairs).and_then(|q| q.filter(&v.namespaces).map(|f| (q, f))) {
        Ok(ok) => ok,
        Err(Refusal::NotVisible) => return not_found_page(),
        Err(Refusal::Invalid(field, rule)) => {
            let body = Html::text(&format!("The filter {field} must be {rule}."));
            return page(StatusCode::BAD_REQUEST, "Executions", Some(&v.session), &body);
        }
    };
    let rows = match v.warren.service.records.store().query(&filter).await {
        Ok(rows) => rows,
        Err(e) => return v.unavailable(e),
    };
    let mut body = views::filter_form(&q, &v.namespaces);
    body.push(&views::executions(&rows));
    body.push(&views::pager(&q, &rows));
    v.page("Executions", &body)
}

/// One execution; while it runs, the page asks to be reloaded (a live
/// view without script).
pub(super) async fn execution(State(c): State<Arc<Console>>, headers: HeaderMap, uri: Uri, Path(id): Path<String>) -> Response {
    let v = match c.viewer(&headers, &uri).await {
        Ok(v) => v,
        Err(r) => return r,
    };
    if !warren_core::ids::is_execution_id(&id) {
        return not_found_page();
    }
    let row: Row = match v.warren.service.records.store().get(&id).await {
        Ok(Some(r)) if v.namespaces.contains(&r.namespace) => r,
        Ok(_) => return not_found_page(),
        Err(e) => return v.unavailable(e),
    };
    let mut body = views::execution(&row);
    if let Some(thread) = row.thread_id.as_deref().filter(|t| warren_core::ids::is_thread_id(t)) {
        body.push(&views::thread_link(&row.namespace, &row.key_name, thread));
    }
    let title = format!("Execution {id}");
    if row.is_terminal() {
        return v.page(&title, &body);
    }
    // The lines so far (recorded for async and playground runs), then live.
    let lines = v.warren.service.records.store().lines_after(&id, 0, 2000).await.unwrap_or_default();
    body.push(&views::live_output(&id, &lines));
    body.push(&views::cancel_form(&id, &v.session.csrf));
    page_live(&v, &title, &body)
}

fn page_live(v: &Viewer<'_>, title: &str, body: &Html) -> Response {
    let html = super::html::live_page(title, Some((&v.session.identity.user, &v.session.csrf)), body);
    (StatusCode::OK, [(axum::http::header::CONTENT_TYPE, "text/html; charset=utf-8")], html.as_str().to_string()).into_response()
}

#[derive(serde::Deserialize)]
pub(super) struct After {
    #[serde(default)]
    after: u64,
}

/// How often a live view looks for new lines.
const POLL: std::time::Duration = std::time::Duration::from_millis(300);

/// A running execution's output lines as server-sent events (each the
/// NDJSON event the API would send), then `end`. Bounded by the
/// execution's own timeout; a client that leaves ends it.
pub(super) async fn events(State(c): State<Arc<Console>>, headers: HeaderMap, uri: Uri, Path(id): Path<String>, Query(q): Query<After>) -> Response {
    let v = match c.viewer(&headers, &uri).await {
        Ok(v) => v,
        Err(r) => return r,
    };
    let row = match v.warren.service.records.store().get(&id).await {
        Ok(Some(r)) if warren_core::ids::is_execution_id(&id) && v.namespaces.contains(&r.namespace) => r,
        Ok(_) => return not_found_page(),
        Err(e) => return v.unavailable(e),
    };
    let store = v.warren.service.records.store().clone();
    let deadline = tokio::time::Instant::now() + std::time::Duration::from_secs(u64::from(row.timeout_secs) + 60);
    let stream = async_stream::stream! {
        let mut seq = q.after;
        while tokio::time::Instant::now() < deadline {
            let lines = store.lines_after(&id, seq, 200).await.unwrap_or_default();
            if lines.is_empty() {
                if store.get(&id).await.ok().flatten().is_none_or(|r| r.is_terminal()) {
                    break;
                }
                tokio::time::sleep(POLL).await;
                continue;
            }
            for (s, line) in lines {
                seq = s;
                yield Ok::<_, std::convert::Infallible>(Event::default().data(line));
            }
        }
        yield Ok(Event::default().event("end").data("end"));
    };
    Sse::new(stream).keep_alive(KeepAlive::default()).into_response()
}

/// The API keys the user may see; in a cluster, with a button to disable
/// or enable each key in namespaces where they may patch ApiKeys.
pub(super) async fn keys(State(c): State<Arc<Console>>, headers: HeaderMap, uri: Uri) -> Response {
    let v = match c.viewer(&headers, &uri).await {
        Ok(v) => v,
        Err(r) => return r,
    };
    let keys = v.keys();
    let mut writable = Vec::new();
    if c.access.client().is_some() {
        for ns in &v.namespaces {
            if c.access.may(&v.session.identity, "patch", "apikeys", ns).await.unwrap_or(false) {
                writable.push(ns.clone());
            }
        }
    }
    let rows: Vec<_> = keys.iter().map(|k| (&**k, writable.contains(&k.namespace))).collect();
    v.page("API keys", &views::keys(&rows, &v.session.csrf))
}

/// What console users changed in the namespaces the user may see.
pub(super) async fn activity(State(c): State<Arc<Console>>, headers: HeaderMap, uri: Uri) -> Response {
    let v = match c.viewer(&headers, &uri).await {
        Ok(v) => v,
        Err(r) => return r,
    };
    match v.warren.service.records.store().actions(&v.namespaces, 200).await {
        Ok(actions) => v.page("Activity", &views::actions(&actions)),
        Err(e) => v.unavailable(e),
    }
}

/// The Sandboxes, as the keys the user may see narrow them.
pub(super) async fn sandboxes(State(c): State<Arc<Console>>, headers: HeaderMap, uri: Uri) -> Response {
    let v = match c.viewer(&headers, &uri).await {
        Ok(v) => v,
        Err(r) => return r,
    };
    let keys = v.keys();
    let mut h = views::sandboxes(&keys.iter().map(|k| &**k).collect::<Vec<_>>());
    match v.warren.service.records.store().sandboxes_in(&v.namespaces, crate::records::now_ms(), 200).await {
        Ok(live) => {
            let rows: Vec<_> = live.iter().map(|s| (s, crate::e2b::reconcile::status(v.warren, s).as_str())).collect();
            h.push(&views::live_sandboxes(&rows));
        }
        Err(e) => return v.unavailable(e),
    }
    v.page("Sandboxes", &h)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn another_tenants_warm_images_are_not_listed_on_the_overview() {
        let compiled = warren_config::compile(&[warren_config::Source {
            file: "t.yaml",
            text: "apiVersion: warren.dev/v1alpha1\nkind: Sandbox\nmetadata: {name: a, namespace: team-a}\nspec: {image: \"registry.example/team-a/py:1\"}\n---\n\
                   apiVersion: warren.dev/v1alpha1\nkind: ApiKey\nmetadata: {name: k, namespace: team-a}\nspec: {sandboxRef: {name: a}, secretRef: {name: k}}\n---\n\
                   apiVersion: v1\nkind: Secret\nmetadata: {name: k, namespace: team-a}\nstringData: {key: sk-wrn-AAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA}\n",
        }]);
        assert!(compiled.errors.is_empty(), "{:?}", compiled.errors);
        let mut keys: Vec<Arc<warren_config::EffectiveKey>> = compiled.keys.into_iter().map(Arc::new).collect();
        Arc::make_mut(&mut keys[0]).image_digest = Some(format!("sha256:{}", "a".repeat(64)));
        let used = used_images(&keys);
        assert!(is_used("registry.example/team-a/py:1", "", &used));
        assert!(is_used(&format!("registry.example/team-a/py:1@sha256:{}", "a".repeat(64)), "", &used), "pinned");
        assert!(is_used("registry.example/team-a/py:2", &format!("sha256:{}", "a".repeat(64)), &used), "by its digest");
        assert!(!is_used("registry.example/team-b/secret-project:7", &format!("sha256:{}", "b".repeat(64)), &used), "team-b's image is not team-a's to see");
        assert!(!is_used("registry.example/team-b/x:1", "", &HashSet::new()), "a user who sees no key sees no image");
    }
}
