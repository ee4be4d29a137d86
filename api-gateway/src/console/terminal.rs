//! A terminal in the console: a user allowed to `use` Sandboxes in a
//! namespace opens a live sandbox of one of its keys and types into a shell
//! there, in the page (xterm.js, vendored beside this file under its MIT
//! license), over a WebSocket of the console itself that carries what
//! `crate::terminal` carries. The sandbox is recorded with the user
//! (`console.user`), lives 30 minutes unless the user ends it first, and the
//! session is logged with user, sandbox and key.

use std::sync::Arc;

use axum::extract::ws::WebSocketUpgrade;
use axum::extract::{Path, State};
use axum::http::{HeaderMap, StatusCode, Uri};
use axum::response::{IntoResponse, Response};
use serde_json::json;

use super::body::Form;
use super::frame::{page, see_other, Console};
use super::html::Html;
use super::playground::{chosen_key, key_form, usable};

/// A console terminal's life, seconds.
const LIFETIME: i64 = 1800;
/// Largest form (a key's name and the CSRF token).
const MAX_FORM: usize = 4 << 10;

/// `GET /terminal`: the keys the user may open a terminal with.
pub(super) async fn form(State(c): State<Arc<Console>>, headers: HeaderMap, uri: Uri) -> Response {
    let v = match c.viewer(&headers, &uri).await {
        Ok(v) => v,
        Err(r) => return r,
    };
    let keys = usable(&c, &v).await;
    if keys.is_empty() {
        return v.page("Terminal", &Html::text("No API key you may open a terminal with (the RBAC verb `use` on Sandboxes in its namespace)."));
    }
    let mut h = key_form(&v, "terminal", "/terminal", &keys);
    h.push_markup("<button type=\"submit\">Open a terminal</button></form>");
    h.push_markup("<p>");
    h.push_text("A live sandbox of the key's Sandbox starts for 30 minutes: a shell as its user, its home saved when it ends.");
    h.push_markup("</p>");
    v.page("Terminal", &h)
}

/// `POST /terminal`: makes the live sandbox and goes to its page.
pub(super) async fn open(State(c): State<Arc<Console>>, headers: HeaderMap, uri: Uri, Form(body): Form<MAX_FORM>) -> Response {
    let v = match c.viewer(&headers, &uri).await {
        Ok(v) => v,
        Err(r) => return r,
    };
    let refuse = |status, why: &str| page(status, "Terminal", Some(&v.session), &Html::text(why));
    let key = match chosen_key(&c, &v, "Terminal", &body).await {
        Ok(k) => k,
        Err(r) => return r,
    };
    let (ns, name) = (key.namespace.clone(), key.name.clone());
    let user: String = v.session.identity.user.chars().take(256).collect();
    let ask = json!({"templateID": key.sandbox, "timeout": LIFETIME.min(i64::from(key.live_seconds())), "metadata": {"console.user": user}});
    match crate::e2b::control::create_sandbox(v.warren, &key, &ask, "console").await {
        Ok(s) => {
            tracing::info!(user = %v.session.identity.user, sandbox = %s.id, namespace = %ns, key = %name, "console: terminal sandbox opened");
            see_other(&format!("/terminal/{}", s.id), None)
        }
        Err(e) => refuse(e.status, &e.message),
    }
}

/// The sandbox `id`'s record and key, when the viewer may use that key's Sandboxes.
async fn allowed(c: &Console, v: &super::pages::Viewer<'_>, id: &str) -> Option<(crate::records::E2bSandbox, Arc<warren_config::EffectiveKey>)> {
    if !warren_core::ids::is_thread_id(id) {
        return None;
    }
    let s = v.warren.service.records.store().sandbox(id).await.ok()??;
    let mine = usable(c, v).await.iter().any(|(ns, name)| *ns == s.namespace && *name == s.key_name);
    let key = v.warren.keys().named(&s.namespace, &s.key_name)?;
    (mine && s.state == "running" && s.end_ms > crate::records::now_ms()).then_some((s, key))
}

/// `GET /terminal/{id}`: the page with the terminal.
pub(super) async fn show(State(c): State<Arc<Console>>, headers: HeaderMap, uri: Uri, Path(id): Path<String>) -> Response {
    let v = match c.viewer(&headers, &uri).await {
        Ok(v) => v,
        Err(r) => return r,
    };
    let Some((s, _)) = allowed(&c, &v, &id).await else {
        return page(StatusCode::NOT_FOUND, "Terminal", Some(&v.session), &Html::text("No running sandbox by that id that you may use."));
    };
    let mut h = Html::default();
    h.push_markup("<link rel=\"stylesheet\" href=\"/assets/xterm.css\"><p>");
    h.push_text(&format!("Sandbox {} of {}/{} — a shell as its user.", s.id, s.namespace, s.key_name));
    h.push_markup("</p><div id=\"terminal\" data-ws=\"");
    h.push(&Html::attr(&format!("/terminal/{}/ws", s.id)));
    h.push_markup("\"></div><script src=\"/assets/xterm.js\"></script><script src=\"/assets/console.js\"></script>");
    v.page("Terminal", &h)
}

/// `GET /terminal/{id}/ws`: the terminal's WebSocket, for the signed-in
/// user's own page only (its Origin must be the console's).
pub(super) async fn socket(State(c): State<Arc<Console>>, headers: HeaderMap, uri: Uri, Path(id): Path<String>, ws: WebSocketUpgrade) -> Response {
    let v = match c.viewer(&headers, &uri).await {
        Ok(v) => v,
        Err(r) => return r,
    };
    // A page of another site cannot ride the session's cookie into a shell.
    let host = headers.get("host").and_then(|h| h.to_str().ok()).unwrap_or_default();
    let origin = headers.get("origin").and_then(|h| h.to_str().ok()).unwrap_or_default();
    if origin.split_once("://").map(|(_, rest)| rest) != Some(host) {
        return StatusCode::FORBIDDEN.into_response();
    }
    let Some((s, key)) = allowed(&c, &v, &id).await else { return StatusCode::NOT_FOUND.into_response() };
    let Some(node) = s.node.clone() else { return StatusCode::NOT_FOUND.into_response() };
    let live = match v.warren.service.live(&key, &s.id, &node) {
        Ok(l) => l,
        Err(_) => return StatusCode::BAD_GATEWAY.into_response(),
    };
    tracing::info!(user = %v.session.identity.user, sandbox = %s.id, key = %key.qualified_name(), "console: terminal session opened");
    crate::e2b::activity::log(v.warren, &s, &v.session.identity.user, "sandbox.terminal", "console terminal");
    ws.on_upgrade(move |socket| crate::terminal::session(socket, live, (24, 80)))
}
