//! The console's frame, shared by every page: its state ([`Console`]: how
//! users sign in, sessions, access, the gateway it shows, its settings),
//! the session of a request, and the page, redirect and form helpers. The
//! routes ([`super::app`]) sit on the pages, and the pages on this.

use std::sync::Arc;
use std::time::{Duration, Instant};

use axum::body::Bytes;
use axum::http::{header, HeaderMap, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use tokio::sync::OnceCell;

use super::access::Access;
use super::client::TrustedProxies;
use super::html::{self, Html};
use super::link::LocalLink;
use super::oidc::Identity;
use super::provider::{Provider, ProviderConfig};
use super::session::{self, Session, Sessions};
use crate::exec::ExecError;
use crate::state::AppState;

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

/// A page of the console.
pub(super) fn page(status: StatusCode, title: &str, user: Option<&Session>, body: &Html) -> Response {
    let user = user.map(|s| (s.identity.user.as_str(), s.csrf.as_str()));
    let html = html::page(title, user, body);
    (status, [(header::CONTENT_TYPE, "text/html; charset=utf-8")], html.as_str().to_string()).into_response()
}

/// A redirect (`303`), setting `cookie` when given.
pub(super) fn see_other(location: &str, cookie: Option<String>) -> Response {
    let mut r = (StatusCode::SEE_OTHER, [(header::LOCATION, location.to_string())]).into_response();
    if let Some(c) = cookie.and_then(|c| HeaderValue::from_str(&c).ok()) {
        r.headers_mut().insert(header::SET_COOKIE, c);
    }
    r
}

/// `N` independent 32-byte random values.
pub(super) fn random<const N: usize>() -> [[u8; 32]; N] {
    std::array::from_fn(|_| {
        let mut b = [0u8; 32];
        rand::fill(&mut b);
        b
    })
}

pub(super) fn not_found_page() -> Response {
    page(StatusCode::NOT_FOUND, "Not found", None, &Html::text("There is no such page."))
}

/// True when the form `body` carries the session's CSRF token. The body
/// was bounded by its route when it was read; its size is no reason to
/// refuse it here.
pub(super) fn csrf_ok(s: &Session, body: &Bytes) -> bool {
    let token = url::form_urlencoded::parse(body).find(|(k, _)| k == "csrf").map(|(_, v)| v.into_owned());
    token.is_some_and(|t| s.csrf_ok(&t))
}

/// The status of a page that tells why the execution service refused: the
/// console's one reading of its errors.
pub(super) fn exec_status(e: &ExecError) -> StatusCode {
    match e {
        ExecError::Invalid { .. } => StatusCode::BAD_REQUEST,
        ExecError::MissingKey | ExecError::InvalidKey(_) => StatusCode::UNAUTHORIZED,
        ExecError::KeyDisabled => StatusCode::FORBIDDEN,
        ExecError::ThreadNotFound(_) => StatusCode::NOT_FOUND,
        ExecError::ThreadBusy(_) => StatusCode::CONFLICT,
        ExecError::KeyConcurrency(_) | ExecError::Busy(_) => StatusCode::TOO_MANY_REQUESTS,
        ExecError::NotImplemented(_) => StatusCode::NOT_IMPLEMENTED,
        _ => StatusCode::SERVICE_UNAVAILABLE,
    }
}
