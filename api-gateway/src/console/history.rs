//! A thread's history in the console: its versions, newest first, each with
//! a Restore button and a Fork form. Reading needs what the thread's files
//! need (`get` on ApiKeys); restoring and forking are writes (CSRF token,
//! `patch` on ApiKeys, audited), through the same service calls as the
//! HTTP API's.

use std::sync::Arc;

use axum::extract::{Path, State};
use axum::http::{HeaderMap, StatusCode, Uri};
use axum::response::Response;
use warren_config::EffectiveKey;

use super::body::{Form, SMALL_FORM};
use super::frame::{csrf_ok, exec_status, not_found_page, page, see_other, Console};
use super::html::{table, Html};
use super::pages::Viewer;
use crate::exec::versions::{Targets, ThreadVersion};

const TRACE: &str = "console";

/// `/files/{namespace}/{key}/thread/{id}`.
type Place = (String, String, String, String);

/// The history section of thread `id`'s page (empty when it has none to show).
pub(super) async fn section(v: &Viewer<'_>, k: &EffectiveKey, base: &str, id: &str) -> Html {
    let mut h = Html::default();
    h.push_markup("<h2>History</h2>");
    let versions = match v.warren.service.thread_history(k, id, TRACE).await {
        Ok(list) => list,
        Err(e) => {
            h.push(&Html::text(&format!("The history could not be read: {e}")));
            return h;
        }
    };
    let rows = versions.iter().map(|ver| row(ver, base, &v.session.csrf));
    h.push(&table(&["execution", "kind", "saved (UTC)", "bytes", "exit", ""], rows));
    h
}

fn row(ver: &ThreadVersion, base: &str, csrf: &str) -> Vec<Html> {
    let saved = crate::records::rfc3339(i64::try_from(ver.at_unix.saturating_mul(1000)).unwrap_or(i64::MAX));
    let exit = ver.exit_code.map(|c| c.to_string()).unwrap_or_default();
    let mut actions = Html::default();
    if ver.current {
        actions.push_text("current");
    } else if !ver.trace_id.is_empty() {
        actions.push(&form(base, "restore", csrf, &ver.trace_id, "Restore", false));
    }
    if !ver.trace_id.is_empty() {
        actions.push(&form(base, "fork", csrf, &ver.trace_id, "Fork", true));
    }
    vec![Html::text(&ver.trace_id), Html::text(&ver.kind), Html::text(&saved), Html::text(&ver.bytes.to_string()), Html::text(&exit), actions]
}

/// A form posting `at` (and, for a fork, the new thread's id) to `base/action`.
fn form(base: &str, action: &str, csrf: &str, at: &str, label: &str, named: bool) -> Html {
    let mut h = Html::default();
    h.push_markup("<form method=\"post\" action=\"");
    h.push(&Html::attr(&format!("{base}/{action}")));
    h.push_markup("\"><input type=\"hidden\" name=\"csrf\" value=\"");
    h.push(&Html::attr(csrf));
    h.push_markup("\"><input type=\"hidden\" name=\"at\" value=\"");
    h.push(&Html::attr(at));
    h.push_markup("\">");
    if named {
        h.push_markup("<input name=\"thread_id\" placeholder=\"new thread id\" required> ");
    }
    h.push_markup("<button type=\"submit\">");
    h.push_text(label);
    h.push_markup("</button></form>");
    h
}

/// The user, the key and the form's fields, for a write on thread `id`.
async fn write<'a>(c: &'a Console, headers: &HeaderMap, uri: &Uri, place: &Place, body: &bytes::Bytes) -> Result<(Viewer<'a>, Arc<EffectiveKey>, Vec<(String, String)>), Response> {
    let (ns, key, source, _) = place;
    if source != "thread" {
        return Err(not_found_page());
    }
    let (v, k) = c.files_of(headers, uri, ns, key, "patch").await?;
    if !csrf_ok(&v.session, body) {
        return Err(page(StatusCode::FORBIDDEN, "Refused", Some(&v.session), &Html::text("This form did not come from your console session.")));
    }
    let fields = url::form_urlencoded::parse(body).map(|(a, b)| (a.into_owned(), b.into_owned())).collect();
    Ok((v, k, fields))
}

fn field<'f>(fields: &'f [(String, String)], name: &str) -> &'f str {
    fields.iter().find(|(k, _)| k == name).map_or("", |(_, v)| v.as_str())
}

fn refused(v: &Viewer<'_>, e: &crate::exec::ExecError) -> Response {
    let status = exec_status(e);
    let why = if status.is_server_error() { "The thread could not be reached. Try again shortly.".to_string() } else { e.to_string() };
    page(status, "History", Some(&v.session), &Html::text(&why))
}

/// Restores the thread to the version the form names: a write.
pub(super) async fn restore(State(c): State<Arc<Console>>, headers: HeaderMap, uri: Uri, Path(place): Path<Place>, Form(body): Form<SMALL_FORM>) -> Response {
    let (v, k, fields) = match write(&c, &headers, &uri, &place, &body).await {
        Ok(ok) => ok,
        Err(r) => return r,
    };
    let (ns, key, _, id) = &place;
    let at = field(&fields, "at");
    if let Err(e) = v.warren.service.restore_thread(&k, id, at, TRACE).await {
        return refused(&v, &e);
    }
    super::writes::audit(&v, "restore-thread", ns, &format!("{key}/{id}@{at}")).await;
    see_other(&format!("/files/{ns}/{key}/thread/{id}"), None)
}

/// Forks the thread at the version the form names into the id it names: a write.
pub(super) async fn fork(State(c): State<Arc<Console>>, headers: HeaderMap, uri: Uri, Path(place): Path<Place>, Form(body): Form<SMALL_FORM>) -> Response {
    let (v, k, fields) = match write(&c, &headers, &uri, &place, &body).await {
        Ok(ok) => ok,
        Err(r) => return r,
    };
    let (ns, key, _, id) = &place;
    let (at, target) = (field(&fields, "at"), field(&fields, "thread_id").to_string());
    if let Err(e) = v.warren.service.fork_thread(&k, id, Targets::Named(vec![target.clone()]), Some(at).filter(|a| !a.is_empty()), TRACE).await {
        return refused(&v, &e);
    }
    super::writes::audit(&v, "fork-thread", ns, &format!("{key}/{id}@{at} -> {target}")).await;
    see_other(&format!("/files/{ns}/{key}/thread/{target}"), None)
}
