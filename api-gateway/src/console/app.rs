//! The console's HTTP side, served on its own listener: its routes
//! (sign-in in [`super::signin`], the state in [`super::frame`]), the
//! embedded assets, and the pages behind a session. Every answer carries the security headers; a
//! request without a live session is sent to sign in, without its body
//! being read ([`super::body`]); a provider that is down gets a clear page
//! (and the execute API never waits on it).

use std::sync::Arc;

use axum::extract::{DefaultBodyLimit, State};
use axum::http::{header, HeaderMap, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::Router;

use super::body::{self, Form, SMALL_FORM};
use super::frame::{csrf_ok, not_found_page, page, see_other};
use super::html::{Html, SECURITY_HEADERS};
use super::session;
pub use super::frame::{Console, Settings, SignIn};

const CSS: &str = include_str!("console.css");
const JS: &str = include_str!("console.js");
/// xterm.js 5.5.0 (MIT, `vendor/XTERM-LICENSE`): the terminal page's emulator.
const XTERM_JS: &str = include_str!("vendor/xterm.js");
const XTERM_CSS: &str = include_str!("vendor/xterm.css");

/// The console's routes. Every request carrying a body passes the
/// session [`body::gate`] first; a response sent before its request's body
/// was read closes the connection.
pub fn router(console: Arc<Console>) -> Router {
    Router::new()
        .route("/", get(super::pages::overview))
        .route("/executions", get(super::pages::executions))
        .route("/executions/{id}", get(super::pages::execution))
        .route("/executions/{id}/cancel", post(super::writes::cancel_execution))
        .route("/executions/{id}/events", get(super::pages::events))
        .route("/keys", get(super::pages::keys))
        .route("/keys/{namespace}/{name}/disable", post(super::writes::disable_key))
        .route("/keys/{namespace}/{name}/enable", post(super::writes::enable_key))
        .route("/activity", get(super::pages::activity))
        .route("/objects/{kind}", get(super::objects::list))
        .route("/objects/{kind}/{namespace}/{name}", get(super::objects::show))
        .route("/playground", get(super::playground::form).post(super::playground::run))
        .route("/terminal", get(super::terminal::form).post(super::terminal::open))
        .route("/terminal/{id}", get(super::terminal::show))
        .route("/terminal/{id}/ws", get(super::terminal::socket))
        .route("/files/{namespace}/{key}/{source}/{id}", get(super::files::list))
        .route("/files/{namespace}/{key}/{source}/{id}/download", get(super::files::download))
        .route("/files/{namespace}/{key}/{source}/{id}/delete", post(super::files::delete_thread))
        .route("/files/{namespace}/{key}/{source}/{id}/upload", post(super::files::upload))
        .route("/files/{namespace}/{key}/{source}/{id}/remove", post(super::files::remove))
        .route("/files/{namespace}/{key}/{source}/{id}/restore", post(super::history::restore))
        .route("/files/{namespace}/{key}/{source}/{id}/fork", post(super::history::fork))
        .route("/sandboxes", get(super::pages::sandboxes))
        .route("/account", get(account))
        .route("/signin", get(super::signin::sign_in))
        .route("/signin/link/{token}", get(super::signin::sign_in_link))
        .route("/callback", get(super::signin::callback))
        .route("/signout", post(sign_out))
        .route("/assets/console.css", get(css))
        .route("/assets/console.js", get(js))
        .route("/assets/xterm.js", get(xterm_js))
        .route("/assets/xterm.css", get(xterm_css))
        .fallback(not_found)
        // Only for an extractor reading the body whole without a bound of
        // its own; the console's own ([`Form`], [`body::read`]) bound per route.
        .layer(DefaultBodyLimit::max(SMALL_FORM))
        .layer(axum::middleware::from_fn_with_state(console.clone(), body::gate))
        .layer(axum::middleware::from_fn(crate::unread::close_when_unread))
        .with_state(console)
        .layer(axum::middleware::map_response(secure))
}

async fn secure(mut r: Response) -> Response {
    for (k, v) in SECURITY_HEADERS {
        r.headers_mut().insert(k, HeaderValue::from_static(v));
    }
    r
}

async fn css() -> Response {
    ([(header::CONTENT_TYPE, "text/css; charset=utf-8")], CSS).into_response()
}

async fn js() -> Response {
    ([(header::CONTENT_TYPE, "text/javascript; charset=utf-8")], JS).into_response()
}

async fn xterm_js() -> Response {
    ([(header::CONTENT_TYPE, "text/javascript; charset=utf-8")], XTERM_JS).into_response()
}

async fn xterm_css() -> Response {
    ([(header::CONTENT_TYPE, "text/css; charset=utf-8")], XTERM_CSS).into_response()
}

async fn not_found() -> Response {
    not_found_page()
}

/// Who is signed in, as the console (and the cluster's RBAC) sees them.
async fn account(State(c): State<Arc<Console>>, headers: HeaderMap, uri: axum::http::Uri) -> Response {
    let s = match c.signed_in(&headers, &uri) {
        Ok(s) => s,
        Err(r) => return r,
    };
    let mut body = Html::default();
    body.push_markup("<dl><dt>user</dt><dd>");
    body.push_text(&s.identity.user);
    body.push_markup("</dd><dt>groups</dt><dd>");
    body.push_text(&s.identity.groups.join(", "));
    body.push_markup("</dd></dl>");
    page(StatusCode::OK, "Account", Some(&s), &body)
}

/// Ends the session; the form must carry the session's CSRF token.
async fn sign_out(State(c): State<Arc<Console>>, headers: HeaderMap, Form(body): Form<SMALL_FORM>) -> Response {
    let Some((id, s)) = c.session(&headers) else { return see_other("/signin", Some(session::clear_cookie())) };
    if !csrf_ok(&s, &body) {
        return page(StatusCode::FORBIDDEN, "Refused", Some(&s), &Html::text("This form did not come from your console session."));
    }
    c.sessions.end(&id);
    see_other("/signin", Some(session::clear_cookie()))
}
