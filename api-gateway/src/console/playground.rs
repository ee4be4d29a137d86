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

/// The start of a form posting to `action` with the session's CSRF token
/// and a choice of `keys` (the caller adds its fields and button, and
/// closes it).
pub(super) fn key_form(v: &Viewer<'_>, class: &str, action: &str, keys: &[(String, String)]) -> Html {
    let mut h = Html::default();
    h.push_markup("<form class=\"");
    h.push(&Html::attr(class));
    h.push_markup("\" method=\"post\" action=\"");
    h.push(&Html::attr(action));
    h.push_markup("\"><input type=\"hidden\" name=\"csrf\" value=\"");
    h.push(&Html::attr(&v.session.csrf));
    h.push_markup("\"><label>key <select name=\"key\">");
    for (ns, name) in keys {
        let both = format!("{ns}/{name}");
        h.push_markup("<option value=\"");
        h.push(&Html::attr(&both));
        h.push_markup("\">");
        h.push_text(&both);
        h.push_markup("</option>");
    }
    h.push_markup("</select></label> ");
    h
}

/// The key a posted form chose (`key` = `namespace/name`), when the user may
/// use it; the answer to send otherwise. The form's CSRF token is checked first.
pub(super) async fn chosen_key(c: &Console, v: &Viewer<'_>, title: &str, body: &axum::body::Bytes) -> Result<Arc<warren_config::EffectiveKey>, Response> {
    let refuse = |status, why: &str| page(status, title, Some(&v.session), &Html::text(why));
    if !csrf_ok(&v.session, body) {
        return Err(refuse(StatusCode::FORBIDDEN, "This form did not come from your console session."));
    }
    let chosen = url::form_urlencoded::parse(body).find(|(k, _)| k == "key").map(|(_, v)| v.into_owned()).unwrap_or_default();
    let usable = usable(c, v).await;
    let Some((ns, name)) = usable.iter().find(|(ns, name)| chosen == format!("{ns}/{name}")) else {
        return Err(refuse(StatusCode::FORBIDDEN, "You may not use this key."));
    };
    v.warren.keys().named(ns, name).ok_or_else(|| refuse(StatusCode::NOT_FOUND, "No such key."))
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
    let mut h = key_form(&v, "playground", "/playground", &keys);
    h.push_markup("<label>language <select name=\"language\"><option>python</option><option>node</option><option>bash</option></select></label>");
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
    let key = match chosen_key(&c, &v, "Playground", &body).await {
        Ok(k) => k,
        Err(r) => return r,
    };
    let (ns, name) = (key.namespace.clone(), key.name.clone());
    let field = |name: &str| url::form_urlencoded::parse(&body).find(|(k, _)| k == name).map(|(_, v)| v.into_owned()).unwrap_or_default();
    let (language, code) = (field("language"), field("code"));
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
