//! Threads and managed volumes in the console: list a key's thread or
//! volume, download, upload and delete a file, delete a thread. Reading
//! needs `get` on ApiKeys in the key's namespace (the key's stored data);
//! every change is a write (CSRF token, `patch` on ApiKeys, audited). The node
//! calls are the Files API's own ([`FileAccess`]), so the same paths are
//! refused (no `..`, no links out of the home or volume).

use std::sync::Arc;

use axum::body::Body;
use axum::extract::{Path, Query, State};
use axum::http::{header, HeaderMap, StatusCode, Uri};
use axum::response::{IntoResponse, Response};
use futures_util::StreamExt as _;
use serde::Deserialize;
use warren_config::EffectiveKey;

use super::frame::{csrf_ok, exec_status, not_found_page, page, see_other, Console};
use super::body::{Form, SMALL_FORM};
use super::html::{table, Html};
use super::pages::Viewer;
use crate::files::{FileAccess, FileError};

/// A trace id for the node calls the console makes (its logs name it).
const TRACE: &str = "console";

/// `/files/{namespace}/{key}/{source}/{id}`.
type Place = (String, String, String, String);

/// Largest upload through the console's form (held in memory while it is
/// read); the Files API's signed URLs stream larger files.
const UPLOAD_MAX: u64 = 64 << 20;
/// Room for the form's other fields and its boundaries.
const FORM_OVERHEAD: u64 = 16 << 10;

#[derive(Deserialize)]
pub(super) struct FileQuery {
    path: String,
}

impl Console {
    /// The viewer and the key of a files URL, when the user may read it.
    pub(super) async fn files_of(&self, headers: &HeaderMap, uri: &Uri, namespace: &str, key: &str, verb: &'static str) -> Result<(Viewer<'_>, Arc<EffectiveKey>), Response> {
        let v = self.viewer(headers, uri).await?;
        let key = v.warren.keys().named(namespace, key).filter(|_| v.namespaces.iter().any(|n| n == namespace)).ok_or_else(not_found_page)?;
        match self.access.may(&v.session.identity, verb, "apikeys", namespace).await {
            Ok(true) => Ok((v, key)),
            Ok(false) => Err(page(StatusCode::FORBIDDEN, "Refused", Some(&v.session), &Html::text("Your RBAC does not allow this in this namespace."))),
            Err(e) => {
                tracing::warn!(error = %e, "console: the cluster could not answer an access review");
                Err(page(StatusCode::SERVICE_UNAVAILABLE, "Unavailable", Some(&v.session), &Html::text("The cluster could not say what you may see. Try again shortly.")))
            }
        }
    }
}

/// The console's one reading of a file refusal: a page.
fn failed(v: &Viewer<'_>, e: FileError) -> Response {
    let (status, why) = match &e {
        FileError::NotFound(_) => (StatusCode::NOT_FOUND, "There is no such thread, volume or file.".to_string()),
        FileError::Invalid { .. } => (StatusCode::BAD_REQUEST, e.to_string()),
        FileError::ThreadBusy => (StatusCode::CONFLICT, e.to_string()),
        FileError::TooLarge => (StatusCode::PAYLOAD_TOO_LARGE, e.to_string()),
        FileError::ThreadLimit | FileError::ReadOnly => (StatusCode::FORBIDDEN, e.to_string()),
        FileError::Unavailable(_) => (StatusCode::SERVICE_UNAVAILABLE, "The files could not be reached. Try again shortly.".to_string()),
    };
    page(status, "Files", Some(&v.session), &Html::text(&why))
}

fn bad(v: &Viewer<'_>, why: &str) -> Response {
    page(StatusCode::BAD_REQUEST, "Files", Some(&v.session), &Html::text(why))
}

fn forged(v: &Viewer<'_>) -> Response {
    page(StatusCode::FORBIDDEN, "Refused", Some(&v.session), &Html::text("This form did not come from your console session."))
}

/// The files of a thread or volume, each with its download link.
pub(super) async fn list(State(c): State<Arc<Console>>, headers: HeaderMap, uri: Uri, Path((ns, key, source, id)): Path<Place>) -> Response {
    let (v, k) = match c.files_of(&headers, &uri, &ns, &key, "get").await {
        Ok(ok) => ok,
        Err(r) => return r,
    };
    let listed = match FileAccess::new(v.warren, &k, &source, &id) {
        Ok(access) => access.list("", TRACE).await,
        Err(e) => Err(e),
    };
    let listed = match listed {
        Ok(l) => l,
        Err(e) => return failed(&v, e),
    };
    let base = format!("/files/{ns}/{key}/{source}/{id}");
    let rows = listed.files.iter().map(|f| {
        let mut link = Html::default();
        link.push_markup("<a href=\"");
        let href = format!("{base}/download?{}", url::form_urlencoded::Serializer::new(String::new()).append_pair("path", &f.path).finish());
        link.push(&Html::attr(&href));
        link.push_markup("\">");
        link.push_text(&f.path);
        link.push_markup("</a>");
        vec![link, Html::text(&f.size.to_string()), Html::text(f.modified.as_deref().unwrap_or("")), remove_form(&base, &f.path, &v.session.csrf)]
    });
    let mut body = table(&["file", "bytes", "modified (UTC)", ""], rows);
    if listed.truncated {
        body.push_markup("<p>(more files than listed)</p>");
    }
    body.push(&upload_form(&base, &v.session.csrf));
    if source == "thread" {
        body.push_markup("<form method=\"post\" action=\"");
        body.push(&Html::attr(&format!("{base}/delete")));
        body.push_markup("\"><input type=\"hidden\" name=\"csrf\" value=\"");
        body.push(&Html::attr(&v.session.csrf));
        body.push_markup("\"><button type=\"submit\">Delete this thread</button></form>");
        body.push(&super::history::section(&v, &k, &base, &id).await);
    }
    v.page(&format!("{source} {id} of {ns}/{key}"), &body)
}

/// One file, as an attachment (never rendered by the browser).
pub(super) async fn download(State(c): State<Arc<Console>>, headers: HeaderMap, uri: Uri, Path((ns, key, source, id)): Path<Place>, Query(q): Query<FileQuery>) -> Response {
    let (v, k) = match c.files_of(&headers, &uri, &ns, &key, "get").await {
        Ok(ok) => ok,
        Err(r) => return r,
    };
    let stream = match FileAccess::new(v.warren, &k, &source, &id) {
        Ok(access) => access.read(&q.path, TRACE).await,
        Err(e) => Err(e),
    };
    match stream {
        Ok(stream) => {
            let name: String = q.path.rsplit('/').next().unwrap_or("file").chars().map(|c| if c.is_ascii_alphanumeric() || "._-".contains(c) { c } else { '_' }).collect();
            let body = Body::from_stream(stream.map(|c| c.map_err(|s| std::io::Error::other(s.message().to_string()))));
            let headers = [(header::CONTENT_TYPE, "application/octet-stream".to_string()), (header::CONTENT_DISPOSITION, format!("attachment; filename=\"{name}\""))];
            (headers, body).into_response()
        }
        Err(e) => failed(&v, e),
    }
}

/// Deletes a thread (its home, everywhere): a write.
pub(super) async fn delete_thread(State(c): State<Arc<Console>>, headers: HeaderMap, uri: Uri, Path((ns, key, source, id)): Path<Place>, Form(body): Form<SMALL_FORM>) -> Response {
    if source != "thread" {
        return not_found_page();
    }
    let (v, k) = match c.files_of(&headers, &uri, &ns, &key, "patch").await {
        Ok(ok) => ok,
        Err(r) => return r,
    };
    if !csrf_ok(&v.session, &body) {
        return forged(&v);
    }
    if let Err(e) = v.warren.service.delete_thread(&k, &id, TRACE).await {
        let status = exec_status(&e);
        let why = if status.is_server_error() { "The thread could not be reached. Try again shortly.".to_string() } else { e.to_string() };
        return page(status, "Files", Some(&v.session), &Html::text(&why));
    }
    super::writes::audit(&v, "delete-thread", &ns, &format!("{key}/{id}")).await;
    see_other(&format!("/files/{ns}/{key}/thread/{id}"), None)
}

/// The button that deletes one file (its path escaped as an attribute).
fn remove_form(base: &str, path: &str, csrf: &str) -> Html {
    let mut h = Html::default();
    h.push_markup("<form method=\"post\" action=\"");
    h.push(&Html::attr(&format!("{base}/remove")));
    h.push_markup("\"><input type=\"hidden\" name=\"csrf\" value=\"");
    h.push(&Html::attr(csrf));
    h.push_markup("\"><input type=\"hidden\" name=\"path\" value=\"");
    h.push(&Html::attr(path));
    h.push_markup("\"><button type=\"submit\">Delete</button></form>");
    h
}

/// The upload form: a file, and where to store it.
fn upload_form(base: &str, csrf: &str) -> Html {
    let mut h = Html::default();
    h.push_markup("<h2>Upload a file</h2><form method=\"post\" enctype=\"multipart/form-data\" action=\"");
    h.push(&Html::attr(&format!("{base}/upload")));
    h.push_markup("\"><input type=\"hidden\" name=\"csrf\" value=\"");
    h.push(&Html::attr(csrf));
    h.push_markup("\"><label>Path <input name=\"path\" placeholder=\"dir/name (default: the file's name)\"></label> ");
    h.push_markup("<input type=\"file\" name=\"file\" required> <button type=\"submit\">Upload</button></form>");
    h
}

/// Stores the form's file (a write): bounded by the key's upload limit and
/// [`UPLOAD_MAX`], read whole (within a deadline) before anything is
/// stored, and only once the user's session and RBAC allow the upload.
pub(super) async fn upload(State(c): State<Arc<Console>>, headers: HeaderMap, uri: Uri, Path((ns, key, source, id)): Path<Place>, body: Body) -> Response {
    let (v, k) = match c.files_of(&headers, &uri, &ns, &key, "patch").await {
        Ok(ok) => ok,
        Err(r) => return r,
    };
    let access = match FileAccess::new(v.warren, &k, &source, &id) {
        Ok(a) => a,
        Err(e) => return failed(&v, e),
    };
    let max = access.max_upload().min(UPLOAD_MAX);
    let Some(boundary) = headers.get(header::CONTENT_TYPE).and_then(|t| t.to_str().ok()).and_then(crate::multipart::boundary) else {
        return bad(&v, "Send the upload form as multipart/form-data.");
    };
    if headers.get(header::CONTENT_LENGTH).and_then(|l| l.to_str().ok()).and_then(|l| l.parse::<u64>().ok()).is_some_and(|l| l > max + FORM_OVERHEAD) {
        return page(StatusCode::PAYLOAD_TOO_LARGE, "Files", Some(&v.session), &Html::text(&format!("The console takes files of at most {max} bytes here; use the Files API for larger ones.")));
    }
    // The deadline grows with the bound: a floor of 1 MiB/s after the form's own.
    let deadline = c.settings.body_timeout + std::time::Duration::from_secs(max >> 20);
    let body = match super::body::read(&headers, body, (max + FORM_OVERHEAD) as usize, deadline).await {
        Ok(b) => b,
        Err(r) => return r,
    };
    let parts = match crate::multipart::parse(&body, &boundary) {
        Ok(p) => p,
        Err(why) => return bad(&v, why),
    };
    let field = |n: &str| parts.iter().find(|p| p.name == n);
    if !field("csrf").is_some_and(|t| std::str::from_utf8(&t.data).is_ok_and(|t| v.session.csrf_ok(t))) {
        return forged(&v);
    }
    let Some(file) = field("file") else { return bad(&v, "Choose a file to upload.") };
    let named = field("path").map(|p| String::from_utf8_lossy(&p.data).trim().to_string()).filter(|p| !p.is_empty());
    let Some(path) = named.or_else(|| file.filename.clone()).filter(|p| !p.is_empty()) else {
        return bad(&v, "Name where to store the file.");
    };
    if let Err(e) = access.write(&path, file.data.clone(), TRACE).await {
        return failed(&v, e);
    }
    super::writes::audit(&v, "upload-file", &ns, &format!("{key}/{source}/{id}/{path}")).await;
    see_other(&format!("/files/{ns}/{key}/{source}/{id}"), None)
}

/// Deletes one file (a write).
pub(super) async fn remove(State(c): State<Arc<Console>>, headers: HeaderMap, uri: Uri, Path((ns, key, source, id)): Path<Place>, Form(body): Form<SMALL_FORM>) -> Response {
    let (v, k) = match c.files_of(&headers, &uri, &ns, &key, "patch").await {
        Ok(ok) => ok,
        Err(r) => return r,
    };
    if !csrf_ok(&v.session, &body) {
        return forged(&v);
    }
    let Some(path) = url::form_urlencoded::parse(&body).find(|(k, _)| k == "path").map(|(_, p)| p.into_owned()) else {
        return bad(&v, "The form names no file.");
    };
    let removed = match FileAccess::new(v.warren, &k, &source, &id) {
        Ok(access) => access.delete(&path, TRACE).await,
        Err(e) => Err(e),
    };
    if let Err(e) = removed {
        return failed(&v, e);
    }
    super::writes::audit(&v, "delete-file", &ns, &format!("{key}/{source}/{id}/{path}")).await;
    see_other(&format!("/files/{ns}/{key}/{source}/{id}"), None)
}
