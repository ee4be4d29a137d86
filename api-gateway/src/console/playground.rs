//! The playground: run Python, Node or Bash with a key the user may use,
//! and watch it on the execution's page (which reloads itself while it
//! runs, showing the lines so far). Running code with a tenant's key (and
//! so its Sandbox's credentials) needs the RBAC verb `use` on Sandboxes in
//! the namespace — granted deliberately, never implied by viewing. Each run
//! is recorded with delivery mode `console` and the signed-in user in its
//! metadata (`console.user`).

use std::sync::Arc;

use axum::extract::State;
use axum::http::{HeaderMap, StatusCode, Uri};
use axum::response::Response;
use warren_core::Language;

use super::frame::{csrf_ok, exec_status, page, see_other, Console};
use crate::exec::ExecuteRequest;
use super::body::Form;
use super::html::Html;
use super::pages::Viewer;

/// Largest playground form: the code is at most 1 MiB (the execute API's
/// limit, [`warren_core::bounds::MAX_CODE_BYTES`]), and form-encoding at
/// most triples it; the other fields are short.
const MAX_FORM: usize = 3 * warren_core::bounds::MAX_CODE_BYTES + (16 << 10);
/// Longest user name kept in the run's metadata (its values' limit).
const MAX_USER: usize = 256;

/// The keys `v`'s user may run code with: enabled, in namespaces where
/// they may `use` Sandboxes.
pub(super) async fn usable(c: &Console, v: &Viewer<'_>) -> Vec<(String, String)> {
    let mut out = Vec::new();
    for ns in &v.namespaces {
        if !c.access.may(&v.session.identity, "use", "sandboxes", ns).await.unwrap_or(false) {
            continue;
        }
        let mut keys: Vec<_> = v.warren.keys().keys().iter().filter(|k| &k.namespace == ns && !k.disabled).map(|k| (k.namespace.clone(), k.name.clone())).collect();
        keys.sort();
        out.extend(keys);
    }
    out
}

/// The form: a key, a language, the code.
pub(super) async fn form(State(c): State<Arc<Console>>, headers: HeaderMap, uri: Uri) -> Response {
    let v = match c.viewer(&headers, &uri).await {
        Ok(v) => v,
        Err(r) => return r,
    };
    let keys = usable(&c, &v).await;
    if keys.is_empty() {
        return v.page("Playground", &Html::text("No API key you may run code with (the RBAC verb `use` on Sandboxes in its namespace)."));
    }
    let mut h = Html::default();
    h.push_markup("<form class=\"playground\" method=\"post\" action=\"/playground\"><input type=\"hidden\" name=\"csrf\" value=\"");
    h.push(&Html::attr(&v.session.csrf));
    h.push_markup("\"><label>key <select name=\"key\">");
    for (ns, name) in &keys {
        let both = format!("{ns}/{name}");
        h.push_markup("<option value=\"");
        h.push(&Html::attr(&both));
        h.push_markup("\">");
        h.push_text(&both);
        h.push_markup("</option>");
    }
    h.push_markup("</select></label> <label>language <select name=\"language\"><option>python</option><option>node</option><option>bash</option></select></label>");
    h.push_markup("<textarea name=\"code\" rows=\"12\" cols=\"100\" spellcheck=\"false\">print(\"hello from Warren\")</textarea><button type=\"submit\">Run</button></form>");
    v.page("Playground", &h)
}

/// Runs the form's code; the browser goes to the execution's page.
pub(super) async fn run(State(c): State<Arc<Console>>, headers: HeaderMap, uri: Uri, Form(body): Form<MAX_FORM>) -> Response {
    let v = match c.viewer(&headers, &uri).await {
        Ok(v) => v,
        Err(r) => return r,
    };
    let refuse = |status, why: &str| page(status, "Playground", Some(&v.session), &Html::text(why));
    if !csrf_ok(&v.session, &body) {
        return refuse(StatusCode::FORBIDDEN, "This form did not come from your console session.");
    }
    let field = |name: &str| url::form_urlencoded::parse(&body).find(|(k, _)| k == name).map(|(_, v)| v.into_owned()).unwrap_or_default();
    let (chosen, language, code) = (field("key"), field("language"), field("code"));
    let usable = usable(&c, &v).await;
    let Some((ns, name)) = usable.iter().find(|(ns, name)| chosen == format!("{ns}/{name}")) else {
        return refuse(StatusCode::FORBIDDEN, "You may not run code with this key.");
    };
    let Some(key) = v.warren.keys().named(ns, name) else { return refuse(StatusCode::NOT_FOUND, "No such key.") };
    let Some(language) = Language::parse(&language) else { return refuse(StatusCode::BAD_REQUEST, "language: must be one of python, node, bash") };
    let user: String = v.session.identity.user.chars().take(MAX_USER).collect();
    let mut request = ExecuteRequest::new(code, language);
    request.metadata.insert("console.user".into(), user);
    match crate::execute::run_for_console(v.warren, &key, request).await {
        Ok(id) => {
            tracing::info!(user = %v.session.identity.user, execution_id = %id, namespace = %ns, key = %name, "console: playground run");
            see_other(&format!("/executions/{id}"), None)
        }
        Err(e) => refuse(exec_status(&e), &e.to_string()),
    }
}
