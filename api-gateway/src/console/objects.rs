//! Warren's objects as the API server holds them (cluster mode): Sandboxes,
//! ApiKeys, StorageConnections and Connectors in the namespaces where the
//! user may list each kind, with their Ready condition; one object's
//! manifest as YAML to copy into Git (server-set fields dropped; these
//! kinds hold references to Secrets, never their values) and its events.

use std::sync::Arc;

use axum::extract::{Path, State};
use axum::http::{HeaderMap, StatusCode, Uri};
use axum::response::Response;
use k8s_openapi::api::core::v1::Event;
use kube::api::{Api, ApiResource, DynamicObject, GroupVersionKind, ListParams};

use super::frame::{not_found_page, page, Console};
use super::html::{table, Html};
use super::pages::Viewer;

/// The kinds shown: (plural in URLs and RBAC, kind).
pub const KINDS: [(&str, &str); 4] = [("sandboxes", "Sandbox"), ("apikeys", "ApiKey"), ("storageconnections", "StorageConnection"), ("connectors", "Connector")];

fn kind_of(plural: &str) -> Option<(&'static str, &'static str)> {
    KINDS.into_iter().find(|(p, _)| *p == plural)
}

fn api(client: &kube::Client, namespace: &str, (plural, kind): (&str, &str)) -> Api<DynamicObject> {
    let gvk = GroupVersionKind::gvk(super::access::GROUP, "v1alpha1", kind);
    Api::namespaced_with(client.clone(), namespace, &ApiResource::from_gvk_with_plural(&gvk, plural))
}

/// `Ready`'s status, reason and message, from an object's conditions.
pub fn ready(obj: &serde_json::Value) -> (String, String, String) {
    let conditions = obj["status"]["conditions"].as_array().cloned().unwrap_or_default();
    let Some(c) = conditions.iter().find(|c| c["type"] == "Ready") else { return ("Unknown".into(), String::new(), "not reconciled yet".into()) };
    let s = |k: &str| c[k].as_str().unwrap_or_default().to_string();
    (s("status"), s("reason"), s("message"))
}

/// The manifest to keep in Git: apiVersion, kind, name, namespace, labels,
/// annotations (not kubectl's copy of the last apply) and spec.
pub fn manifest(obj: &serde_json::Value) -> String {
    let mut meta = serde_json::Map::new();
    for k in ["name", "namespace", "labels"] {
        if let Some(v) = obj["metadata"].get(k) {
            meta.insert(k.into(), v.clone());
        }
    }
    if let Some(a) = obj["metadata"]["annotations"].as_object() {
        let kept: serde_json::Map<_, _> = a.iter().filter(|(k, _)| k.as_str() != "kubectl.kubernetes.io/last-applied-configuration").map(|(k, v)| (k.clone(), v.clone())).collect();
        if !kept.is_empty() {
            meta.insert("annotations".into(), kept.into());
        }
    }
    let doc = serde_json::json!({"apiVersion": obj["apiVersion"], "kind": obj["kind"], "metadata": meta, "spec": obj["spec"]});
    serde_yaml::to_string(&doc).unwrap_or_default()
}

impl Console {
    /// The viewer of an object page, its kind and the API server's client.
    async fn objects_of(&self, headers: &HeaderMap, uri: &Uri, plural: &str) -> Result<(Viewer<'_>, (&'static str, &'static str), &kube::Client), Response> {
        let v = self.viewer(headers, uri).await?;
        let kind = kind_of(plural).ok_or_else(not_found_page)?;
        let Some(client) = self.access.client() else {
            return Err(page(StatusCode::NOT_FOUND, "Objects", Some(&v.session), &Html::text("On one machine the objects are the manifest files; see API keys and Sandboxes for their effect.")));
        };
        Ok((v, kind, client))
    }
}

fn unavailable(v: &Viewer<'_>, e: kube::Error) -> Response {
    tracing::warn!(error = %e, "console: the API server could not be read");
    page(StatusCode::SERVICE_UNAVAILABLE, "Unavailable", Some(&v.session), &Html::text("The API server could not be read. Try again shortly."))
}

/// Every object of one kind in the namespaces where the user may list it.
pub(super) async fn list(State(c): State<Arc<Console>>, headers: HeaderMap, uri: Uri, Path(plural): Path<String>) -> Response {
    let (v, kind, client) = match c.objects_of(&headers, &uri, &plural).await {
        Ok(ok) => ok,
        Err(r) => return r,
    };
    let mut rows = Vec::new();
    for ns in &v.namespaces {
        if !c.access.may(&v.session.identity, "list", kind.0, ns).await.unwrap_or(false) {
            continue;
        }
        let objects = match api(client, ns, kind).list(&ListParams::default()).await {
            Ok(l) => l.items,
            Err(e) => return unavailable(&v, e),
        };
        for o in objects {
            let value = serde_json::to_value(&o).unwrap_or_default();
            let (status, reason, message) = ready(&value);
            let name = o.metadata.name.clone().unwrap_or_default();
            let mut link = Html::default();
            link.push_markup("<a href=\"");
            link.push(&Html::attr(&format!("/objects/{plural}/{ns}/{name}")));
            link.push_markup("\">");
            link.push_text(&format!("{ns}/{name}"));
            link.push_markup("</a>");
            rows.push(vec![link, Html::text(&status), Html::text(&reason), Html::text(&message)]);
        }
    }
    let mut body = kinds_nav();
    body.push(&table(&["object", "ready", "reason", "message"], rows));
    v.page(kind.1, &body)
}

fn kinds_nav() -> Html {
    let mut h = Html::default();
    h.push_markup("<p>");
    for (plural, kind) in KINDS {
        h.push_markup("<a href=\"/objects/");
        h.push_text(plural);
        h.push_markup("\">");
        h.push_text(kind);
        h.push_markup("</a> ");
    }
    h.push_markup("</p>");
    h
}

/// One object: Ready, its manifest, its events.
pub(super) async fn show(State(c): State<Arc<Console>>, headers: HeaderMap, uri: Uri, Path((plural, ns, name)): Path<(String, String, String)>) -> Response {
    let (v, kind, client) = match c.objects_of(&headers, &uri, &plural).await {
        Ok(ok) => ok,
        Err(r) => return r,
    };
    if !v.namespaces.contains(&ns) || !c.access.may(&v.session.identity, "get", kind.0, &ns).await.unwrap_or(false) {
        return not_found_page();
    }
    let obj = match api(client, &ns, kind).get_opt(&name).await {
        Ok(Some(o)) => serde_json::to_value(&o).unwrap_or_default(),
        Ok(None) => return not_found_page(),
        Err(e) => return unavailable(&v, e),
    };
    let (status, reason, message) = ready(&obj);
    let mut body = Html::default();
    body.push_markup("<dl><dt>ready</dt><dd>");
    body.push_text(&format!("{status} {reason}"));
    body.push_markup("</dd><dt>message</dt><dd>");
    body.push_text(&message);
    body.push_markup("</dd></dl><h2>Manifest</h2><pre>");
    body.push_text(&manifest(&obj));
    body.push_markup("</pre><h2>Events</h2>");
    let events: Api<Event> = Api::namespaced(client.clone(), &ns);
    let selector = format!("involvedObject.name={name},involvedObject.kind={}", kind.1);
    let rows = match events.list(&ListParams::default().fields(&selector).limit(50)).await {
        Ok(l) => l.items.into_iter().map(|e| vec![Html::text(e.type_.as_deref().unwrap_or("")), Html::text(e.reason.as_deref().unwrap_or("")), Html::text(e.message.as_deref().unwrap_or(""))]).collect(),
        Err(e) => {
            tracing::warn!(error = %e, "console: events could not be read");
            Vec::new()
        }
    };
    body.push(&table(&["type", "reason", "message"], rows));
    v.page(&format!("{} {ns}/{name}", kind.1), &body)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_manifest_keeps_what_git_holds_and_ready_reads_the_condition() {
        let obj = serde_json::json!({
            "apiVersion": "warren.dev/v1alpha1", "kind": "ApiKey",
            "metadata": {"name": "agent", "namespace": "team-a", "uid": "u-1", "resourceVersion": "7", "managedFields": [{"manager": "kubectl"}],
                "annotations": {"kubectl.kubernetes.io/last-applied-configuration": "{…}", "team": "a"}},
            "spec": {"sandboxRef": {"name": "sb"}, "secretRef": {"name": "agent-key"}},
            "status": {"conditions": [{"type": "Ready", "status": "True", "reason": "Published", "message": "<b>ok</b>"}]},
        });
        let m = manifest(&obj);
        assert!(m.contains("name: agent") && m.contains("sandboxRef") && m.contains("team: a"), "{m}");
        for dropped in ["uid", "resourceVersion", "managedFields", "last-applied", "status", "Published"] {
            assert!(!m.contains(dropped), "{dropped} in {m}");
        }
        assert_eq!(ready(&obj), ("True".into(), "Published".into(), "<b>ok</b>".into()));
        assert_eq!(ready(&serde_json::json!({})).0, "Unknown");
    }
}
