//! The console's HTTP side, served on its own listener: sign-in with the
//! identity provider, sessions, sign-out, the embedded assets, and the
//! pages behind a session. Every answer carries the security headers; a
//! request without a live session is sent to sign in; a provider that is
//! down gets a clear page (and the execute API never waits on it).

use std::sync::Arc;
use std::time::{Instant, SystemTime, UNIX_EPOCH};

use axum::body::Bytes;
use axum::extract::{Query, State};
use axum::http::{header, HeaderMap, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::Router;
use serde::Deserialize;
use tokio::sync::OnceCell;

use super::html::{self, Html, SECURITY_HEADERS};
use super::provider::{Provider, ProviderConfig};
use super::session::{self, Session, Sessions};

const CSS: &str = include_str!("console.css");
/// Longest form body read (sign-out carries one token).
const MAX_FORM_BYTES: usize = 4096;

/// The console's state: the provider (discovered on first use, so a
/// provider that is down at start does not stop the gateway) and sessions.
pub struct Console {
    config: ProviderConfig,
    provider: OnceCell<Arc<Provider>>,
    sessions: Sessions,
}

impl Console {
    /// A console signing in with the provider `config` names.
    pub fn new(config: ProviderConfig) -> Arc<Console> {
        Arc::new(Console { config, provider: OnceCell::new(), sessions: Sessions::default() })
    }

    async fn provider(&self) -> Result<&Arc<Provider>, Response> {
        self.provider.get_or_try_init(|| async { Provider::discover(self.config.clone()).await.map(Arc::new) }).await.map_err(|e| {
            tracing::warn!(error = %e, "console: the identity provider cannot be used");
            page(StatusCode::SERVICE_UNAVAILABLE, "Sign-in unavailable", None, &Html::text("The identity provider is not answering as it should. Try again shortly; the execute API is not affected."))
        })
    }

    /// The live session of this request, if any.
    fn session(&self, headers: &HeaderMap) -> Option<(String, Session)> {
        let cookie = headers.get_all(header::COOKIE).iter().filter_map(|v| v.to_str().ok()).find_map(session::cookie_value)?;
        let s = self.sessions.get(cookie, Instant::now())?;
        Some((cookie.to_string(), s))
    }
}

/// The console's routes.
pub fn router(console: Arc<Console>) -> Router {
    Router::new()
        .route("/", get(overview))
        .route("/signin", get(sign_in))
        .route("/callback", get(callback))
        .route("/signout", post(sign_out))
        .route("/assets/console.css", get(css))
        .fallback(not_found)
        .with_state(console)
        .layer(axum::middleware::map_response(secure))
}

async fn secure(mut r: Response) -> Response {
    for (k, v) in SECURITY_HEADERS {
        r.headers_mut().insert(k, HeaderValue::from_static(v));
    }
    r
}

fn page(status: StatusCode, title: &str, user: Option<&str>, body: &Html) -> Response {
    let html = html::page(title, user, body);
    (status, [(header::CONTENT_TYPE, "text/html; charset=utf-8")], html.as_str().to_string()).into_response()
}

fn see_other(location: &str, cookie: Option<String>) -> Response {
    let mut r = (StatusCode::SEE_OTHER, [(header::LOCATION, location.to_string())]).into_response();
    if let Some(c) = cookie.and_then(|c| HeaderValue::from_str(&c).ok()) {
        r.headers_mut().insert(header::SET_COOKIE, c);
    }
    r
}

fn random<const N: usize>() -> [[u8; 32]; N] {
    std::array::from_fn(|_| {
        let mut b = [0u8; 32];
        rand::fill(&mut b);
        b
    })
}

async fn css() -> Response {
    ([(header::CONTENT_TYPE, "text/css; charset=utf-8")], CSS).into_response()
}

async fn not_found() -> Response {
    page(StatusCode::NOT_FOUND, "Not found", None, &Html::text("There is no such page."))
}

/// The first page: who is signed in, and the way out.
async fn overview(State(c): State<Arc<Console>>, headers: HeaderMap) -> Response {
    let Some((_, s)) = c.session(&headers) else { return see_other("/signin?return=%2F", None) };
    let mut body = Html::default();
    body.push_markup("<p>Signed in as ");
    body.push_text(&s.identity.user);
    body.push_markup(". Groups: ");
    body.push_text(&s.identity.groups.join(", "));
    body.push_markup(".</p><form method=\"post\" action=\"/signout\"><input type=\"hidden\" name=\"csrf\" value=\"");
    body.push(&Html::attr(&s.csrf));
    body.push_markup("\"><button type=\"submit\">Sign out</button></form>");
    page(StatusCode::OK, "Overview", Some(&s.identity.user), &body)
}

#[derive(Deserialize)]
struct SignInQuery {
    #[serde(default, rename = "return")]
    return_to: Option<String>,
}

/// Starts a sign-in at the provider.
async fn sign_in(State(c): State<Arc<Console>>, Query(q): Query<SignInQuery>) -> Response {
    let provider = match c.provider().await {
        Ok(p) => p,
        Err(r) => return r,
    };
    let started = c.sessions.begin(q.return_to.as_deref().unwrap_or("/"), random::<3>(), Instant::now());
    see_other(&provider.authorization_url(&started), None)
}

#[derive(Deserialize)]
struct CallbackQuery {
    #[serde(default)]
    state: Option<String>,
    #[serde(default)]
    code: Option<String>,
    #[serde(default)]
    error: Option<String>,
}

/// The provider's answer: the code exchanged, the token checked, a session.
async fn callback(State(c): State<Arc<Console>>, Query(q): Query<CallbackQuery>) -> Response {
    let again = |status, why: &str| {
        let mut body = Html::text(why);
        body.push_markup(" <a href=\"/signin\">Sign in again</a>.");
        page(status, "Not signed in", None, &body)
    };
    let Some(sign_in) = q.state.as_deref().and_then(|s| c.sessions.finish(s, Instant::now())) else {
        return again(StatusCode::BAD_REQUEST, "This sign-in is unknown, was already used, or took too long.");
    };
    let (Some(code), None) = (q.code.as_deref(), q.error.as_deref()) else {
        return again(StatusCode::UNAUTHORIZED, "The identity provider did not sign you in.");
    };
    let provider = match c.provider().await {
        Ok(p) => p,
        Err(r) => return r,
    };
    let now = SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |d| d.as_secs() as i64);
    match provider.exchange(code, &sign_in, now).await {
        Ok(identity) => {
            tracing::info!(user = %identity.user, "console: signed in");
            let (id, _) = c.sessions.create(identity, random::<2>(), Instant::now());
            see_other(&sign_in.return_to, Some(session::set_cookie(&id)))
        }
        Err(e) => {
            tracing::warn!(error = %e, "console: a sign-in was refused");
            again(StatusCode::UNAUTHORIZED, "The sign-in could not be verified.")
        }
    }
}

/// Ends the session; the form must carry the session's CSRF token.
async fn sign_out(State(c): State<Arc<Console>>, headers: HeaderMap, body: Bytes) -> Response {
    let Some((id, s)) = c.session(&headers) else { return see_other("/signin", Some(session::clear_cookie())) };
    let token = (body.len() <= MAX_FORM_BYTES).then(|| url::form_urlencoded::parse(&body).find(|(k, _)| k == "csrf").map(|(_, v)| v.into_owned())).flatten();
    if !token.is_some_and(|t| s.csrf_ok(&t)) {
        return page(StatusCode::FORBIDDEN, "Refused", Some(&s.identity.user), &Html::text("This form did not come from your console session."));
    }
    c.sessions.end(&id);
    see_other("/signin", Some(session::clear_cookie()))
}
