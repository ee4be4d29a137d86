//! The console's writes: only what a team expects to click in an emergency
//! and that Git keeps authority over. Disabling or enabling an ApiKey is a
//! server-side apply of `spec.disabled` under the console's own field
//! manager, so the cluster records who owns the field and the next GitOps
//! sync shows the drift. Each write needs the session's CSRF token and the
//! RBAC verb (patch ApiKeys in the namespace), and is audited with the user.
//! Cancelling a running execution changes no declared state; it needs the
//! same verb (the right to stop the key that ran it).

use std::sync::Arc;

use axum::body::Bytes;
use axum::extract::{Path, State};
use axum::http::{HeaderMap, StatusCode, Uri};
use axum::response::Response;
use kube::api::{Api, ApiResource, DynamicObject, GroupVersionKind, Patch, PatchParams};

use super::frame::{csrf_ok, not_found_page, page, see_other, Console};
use super::body::{Form, SMALL_FORM};
use super::html::Html;
use super::pages::Viewer;
use crate::records::{now_ms, Action};

/// The field manager the console's changes are applied under.
pub const FIELD_MANAGER: &str = "warren-console";

pub(super) async fn disable_key(State(c): State<Arc<Console>>, headers: HeaderMap, uri: Uri, Path((namespace, name)): Path<(String, String)>, Form(body): Form<SMALL_FORM>) -> Response {
    set_disabled(&c, &headers, &uri, &namespace, &name, &body, true).await
}

pub(super) async fn enable_key(State(c): State<Arc<Console>>, headers: HeaderMap, uri: Uri, Path((namespace, name)): Path<(String, String)>, Form(body): Form<SMALL_FORM>) -> Response {
    set_disabled(&c, &headers, &uri, &namespace, &name, &body, false).await
}

/// Cancels a running execution: needs `patch` on ApiKeys in its
/// namespace (the right to stop the key that ran it).
pub(super) async fn cancel_execution(State(c): State<Arc<Console>>, headers: HeaderMap, uri: Uri, Path(id): Path<String>, Form(body): Form<SMALL_FORM>) -> Response {
    let v = match c.viewer(&headers, &uri).await {
        Ok(v) => v,
        Err(r) => return r,
    };
    let refuse = |status, why: &str| page(status, "Refused", Some(&v.session), &Html::text(why));
    if !csrf_ok(&v.session, &body) {
        return refuse(StatusCode::FORBIDDEN, "This form did not come from your console session.");
    }
    let row = match v.warren.service.records.store().get(&id).await {
        Ok(Some(r)) if warren_core::ids::is_execution_id(&id) && v.namespaces.contains(&r.namespace) => r,
        Ok(_) => return not_found_page(),
        Err(e) => return v.unavailable(e),
    };
    if let Err(r) = may_patch_keys(&c, &v, &row.namespace).await {
        return r;
    }
    let (namespace, back) = (row.namespace.clone(), format!("/executions/{id}"));
    if let Err(e) = crate::executions::cancel_row(v.warren, row).await {
        tracing::warn!(execution_id = %id, error = ?e, "console: a cancel did not go through");
        return refuse(StatusCode::SERVICE_UNAVAILABLE, "The node running this execution did not confirm the cancel. Try again shortly.");
    }
    audit(&v, "cancel-execution", &namespace, &id).await;
    see_other(&back, None)
}

/// `Ok` when the user's RBAC allows patching ApiKeys in `namespace`; else the refusal page.
async fn may_patch_keys(c: &Console, v: &Viewer<'_>, namespace: &str) -> Result<(), Response> {
    let refuse = |status, why: &str| page(status, "Refused", Some(&v.session), &Html::text(why));
    match c.access.may(&v.session.identity, "patch", "apikeys", namespace).await {
        Ok(true) => Ok(()),
        Ok(false) => Err(refuse(StatusCode::FORBIDDEN, "Your RBAC does not allow this in this namespace (it needs patch on ApiKeys).")),
        Err(e) => {
            tracing::warn!(error = %e, "console: the cluster could not answer an access review");
            Err(refuse(StatusCode::SERVICE_UNAVAILABLE, "The cluster could not say what you may change. Try again shortly."))
        }
    }
}

/// Adds the change to the audit log (and the gateway's log) with the user.
pub(super) async fn audit(v: &Viewer<'_>, action: &str, namespace: &str, object: &str) {
    let action = Action { at_ms: now_ms(), user: v.session.identity.user.clone(), action: action.into(), namespace: namespace.into(), object: object.into() };
    tracing::info!(user = %action.user, action = %action.action, namespace, object, "console: a change was made");
    if let Err(e) = v.warren.service.records.store().record_action(&action).await {
        tracing::warn!(error = %e, "console: the change was made but could not be added to the audit log");
    }
}

async fn set_disabled(c: &Console, headers: &HeaderMap, uri: &Uri, namespace: &str, name: &str, body: &Bytes, disabled: bool) -> Response {
    let v = match c.viewer(headers, uri).await {
        Ok(v) => v,
        Err(r) => return r,
    };
    let refuse = |status, why: &str| page(status, "Refused", Some(&v.session), &Html::text(why));
    if !csrf_ok(&v.session, body) {
        return refuse(StatusCode::FORBIDDEN, "This form did not come from your console session.");
    }
    if !v.namespaces.iter().any(|n| n == namespace) || v.warren.keys().named(namespace, name).is_none() {
        return not_found_page();
    }
    let Some(client) = c.access.client() else {
        return refuse(StatusCode::CONFLICT, "On one machine keys are declared in the manifest files: set `disabled` there.");
    };
    if let Err(r) = may_patch_keys(c, &v, namespace).await {
        return r;
    }
    if let Err(e) = apply_disabled(client, namespace, name, disabled).await {
        tracing::warn!(error = %e, namespace, key = name, "console: the ApiKey could not be changed");
        return refuse(StatusCode::SERVICE_UNAVAILABLE, "The API server did not take the change. Try again shortly.");
    }
    audit(&v, if disabled { "disable-key" } else { "enable-key" }, namespace, name).await;
    see_other("/keys", None)
}

/// Server-side apply of `spec.disabled` on ApiKey `namespace/name`,
/// owned by [`FIELD_MANAGER`] (forced: the console's click wins over the
/// manifest's value until Git applies it again).
async fn apply_disabled(client: &kube::Client, namespace: &str, name: &str, disabled: bool) -> Result<(), kube::Error> {
    let gvk = GroupVersionKind::gvk(super::access::GROUP, "v1alpha1", "ApiKey");
    let api: Api<DynamicObject> = Api::namespaced_with(client.clone(), namespace, &ApiResource::from_gvk_with_plural(&gvk, "apikeys"));
    let patch = serde_json::json!({
        "apiVersion": "warren.dev/v1alpha1",
        "kind": "ApiKey",
        "metadata": {"name": name, "namespace": namespace},
        "spec": {"disabled": disabled},
    });
    api.patch(name, &PatchParams::apply(FIELD_MANAGER).force(), &Patch::Apply(&patch)).await.map(drop)
}
