//! The console's HTTP side, served on its own listener: its state, its
//! routes (sign-in in [`super::signin`]), the embedded assets, and the
//! pages behind a session. Every answer carries the security headers; a
//! request without a live session is sent to sign in, without its body
//! being read ([`super::body`]); a provider that is down gets a clear page
//! (and the execute API never waits on it).

use std::sync::Arc;
use std::time::{Duration, Instant};

use axum::body::Bytes;
use axum::extract::{DefaultBodyLimit, State};
use axum::http::{header, HeaderMap, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::Router;
use tokio::sync::OnceCell;

use super::access::Access;
use super::body::{self, Form, SMALL_FORM};
use super::client::TrustedProxies;
use super::html::{self, Html, SECURITY_HEADERS};
use super::link::LocalLink;
use super::oidc::Identity;
use super::provider::{Provider, ProviderConfig};
use super::session::{self, Session, Sessions};
use crate::state::AppState;

const CSS: &str = include_str!("console.css");
const JS: &str = include_str!("console.js");

/// How users sign in.
pub enum SignIn {
    /// With the identity provider; only members of `allowed_groups` (when
    /// any are named).
    Oidc {
        /// The provider.
        config: ProviderConfig,
        /// Who may sign in at all (empty: anyone the provider signs in).
        allowed_groups: Vec<String>,
    },
    /// Single-machine mode: the local admin's one-time link.
    Link(LocalLink),
}

impl std::fmt::Debug for SignIn {
    // Never the client secret or the link's token.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            SignIn::Oidc { config, allowed_groups } => f.debug_struct("Oidc").field("issuer", &config.issuer).field("allowed_groups", allowed_groups).finish_non_exhaustive(),
            SignIn::Link(_) => f.write_str("Link"),
        }
    }
}

/// The console's bounds and trust (the gateway's flags).
#[derive(Debug, Clone)]
pub struct Settings {
    /// Longest wait for a form's body once its headers arrived.
    pub body_timeout: Duration,
    /// With a provider, how long a sign-in's identity (groups included)
    /// is used before the browser is sent through the provider again: a
    /// group removed there stops counting within this time.
    pub recheck: Duration,
    /// Proxies whose `X-Forwarded-For` names the client (sign-ins under
    /// way are bounded per client).
    pub trusted_proxies: TrustedProxies,
}

impl Default for Settings {
    fn default() -> Settings {
        Settings { body_timeout: Duration::from_secs(30), recheck: Duration::from_secs(900), trusted_proxies: TrustedProxies::default() }
    }
}

/// The console's state: how users sign in (the provider is discovered on
/// first use, so a provider that is down at start does not stop the
/// gateway), sessions, who may see what, and the gateway it shows.
pub struct Console {
    pub(super) sign_in: SignIn,
    provider: OnceCell<Arc<Provider>>,
    pub(super) sessions: Sessions,
    pub(super) access: Access,
    /// The gateway's keys, records and nodes (`None`: sign-in only).
    pub(super) warren: Option<AppState>,
    pub(super) settings: Settings,
}

impl Console {
    /// A console signing users in by `sign_in`, deciding with `access`,
    /// showing `warren`, with the default [`Settings`].
    pub fn new(sign_in: SignIn, access: Access, warren: Option<AppState>) -> Arc<Console> {
        Console::with(sign_in, access, warren, Settings::default())
    }

    /// The same with `settings`.
    pub fn with(sign_in: SignIn, access: Access, warren: Option<AppState>, settings: Settings) -> Arc<Console> {
        Arc::new(Console { sign_in, provider: OnceCell::new(), sessions: Sessions::default(), access, warren, settings })
    }

    pub(super) async fn provider(&self) -> Result<&Arc<Provider>, Response> {
        let SignIn::Oidc { config, .. } = &self.sign_in else { return Err(not_found_page()) };
        self.provider.get_or_try_init(|| async { Provider::discover(config.clone()).await.map(Arc::new) }).await.map_err(|e| {
            tracing::warn!(error = %e, "console: the identity provider cannot be used");
            page(StatusCode::SERVICE_UNAVAILABLE, "Sign-in unavailable", None, &Html::text("The identity provider is not answering as it should. Try again shortly; the execute API is not affected."))
        })
    }

    /// The live session of this request, if any (one whose identity is due
    /// for a re-check at the provider has ended).
    pub(super) fn session(&self, headers: &HeaderMap) -> Option<(String, Session)> {
        let cookie = headers.get_all(header::COOKIE).iter().filter_map(|v| v.to_str().ok()).find_map(session::cookie_value)?;
        let s = self.sessions.get(cookie, Instant::now())?;
        Some((cookie.to_string(), s))
    }

    /// The session of a page request, or the way to sign in and come back to `uri`.
    pub(super) fn signed_in(&self, headers: &HeaderMap, uri: &axum::http::Uri) -> Result<Session, Response> {
        match self.session(headers) {
            Some((_, s)) => Ok(s),
            None => {
                let back = uri.path_and_query().map_or("/", |p| p.as_str());
                let back: String = url::form_urlencoded::byte_serialize(back.as_bytes()).collect();
                Err(see_other(&format!("/signin?return={back}"), None))
            }
        }
    }

    /// A session for `identity`, sent on to `return_to`. With a provider it
    /// lasts the re-check interval: then the browser signs in again and
    /// the provider says anew who the user is and in which groups.
    pub(super) fn start_session(&self, identity: Identity, return_to: &str) -> Response {
        tracing::info!(user = %identity.user, "console: signed in");
        let ttl = match self.sign_in {
            SignIn::Oidc { .. } => self.settings.recheck,
            SignIn::Link(_) => session::SESSION_TTL,
        };
        let (id, _) = self.sessions.create(identity, random::<2>(), Instant::now(), ttl);
        see_other(return_to, Some(session::set_cookie(&id)))
    }
}

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
        .route("/files/{namespace}/{key}/{source}/{id}", get(super::files::list))
        .route("/files/{namespace}/{key}/{source}/{id}/download", get(super::files::download))
        .route("/files/{namespace}/{key}/{source}/{id}/delete", post(super::files::delete_thread))
        .route("/files/{namespace}/{key}/{source}/{id}/upload", post(super::files::upload))
        .route("/files/{namespace}/{key}/{source}/{id}/remove", post(super::files::remove))
        .route("/sandboxes", get(super::pages::sandboxes))
        .route("/account", get(account))
        .route("/signin", get(super::signin::sign_in))
        .route("/signin/link/{token}", get(super::signin::sign_in_link))
        .route("/callback", get(super::signin::callback))
        .route("/signout", post(sign_out))
        .route("/assets/console.css", get(css))
        .route("/assets/console.js", get(js))
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

pub(super) fn page(status: StatusCode, title: &str, user: Option<&Session>, body: &Html) -> Response {
    let user = user.map(|s| (s.identity.user.as_str(), s.csrf.as_str()));
    let html = html::page(title, user, body);
    (status, [(header::CONTENT_TYPE, "text/html; charset=utf-8")], html.as_str().to_string()).into_response()
}

pub(super) fn see_other(location: &str, cookie: Option<String>) -> Response {
    let mut r = (StatusCode::SEE_OTHER, [(header::LOCATION, location.to_string())]).into_response();
    if let Some(c) = cookie.and_then(|c| HeaderValue::from_str(&c).ok()) {
        r.headers_mut().insert(header::SET_COOKIE, c);
    }
    r
}

pub(super) fn random<const N: usize>() -> [[u8; 32]; N] {
    std::array::from_fn(|_| {
        let mut b = [0u8; 32];
        rand::fill(&mut b);
        b
    })
}

async fn css() -> Response {
    ([(header::CONTENT_TYPE, "text/css; charset=utf-8")], CSS).into_response()
}

async fn js() -> Response {
    ([(header::CONTENT_TYPE, "text/javascript; charset=utf-8")], JS).into_response()
}

async fn not_found() -> Response {
    not_found_page()
}

pub(super) fn not_found_page() -> Response {
    page(StatusCode::NOT_FOUND, "Not found", None, &Html::text("There is no such page."))
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

/// True when the form `body` carries the session's CSRF token. The body
/// was bounded by its route when it was read; its size is no reason to
/// refuse it here.
pub(super) fn csrf_ok(s: &Session, body: &Bytes) -> bool {
    let token = url::form_urlencoded::parse(body).find(|(k, _)| k == "csrf").map(|(_, v)| v.into_owned());
    token.is_some_and(|t| s.csrf_ok(&t))
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
