//! Signing in: the start at the provider, the callback, and on one machine
//! the local admin's link. A sign-in is bound to the browser that started
//! it (a cookie only this console sets, which the callback must carry), so
//! an attacker's own callback link signs nobody else in (login CSRF); the
//! sign-ins under way are bounded per client ([`super::client`]).

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Instant, SystemTime, UNIX_EPOCH};

use axum::extract::{ConnectInfo, Path, Query, State};
use axum::http::{header, HeaderMap, StatusCode};
use axum::response::Response;
use axum::Extension;
use serde::Deserialize;

use super::frame::{not_found_page, page, random, see_other, Console, SignIn};
use super::html::Html;
use super::oidc::{Identity, TokenError};
use super::provider::ProviderError;
use super::session::{self, Browser};

#[derive(Deserialize)]
pub(super) struct SignInQuery {
    #[serde(default, rename = "return")]
    return_to: Option<String>,
}

/// The value of the request's binding cookie, when it carries one.
fn binding_of(headers: &HeaderMap) -> Option<&str> {
    headers.get_all(header::COOKIE).iter().filter_map(|v| v.to_str().ok()).find_map(session::binding_value)
}

/// Starts a sign-in at the provider (or, on one machine, says where the link is).
pub(super) async fn sign_in(State(c): State<Arc<Console>>, peer: Option<Extension<ConnectInfo<SocketAddr>>>, headers: HeaderMap, Query(q): Query<SignInQuery>) -> Response {
    if let SignIn::Link(_) = c.sign_in {
        let body = Html::text("Open the one-time sign-in link that scripts/run-local.sh printed, or read the current one from the gateway's --console-link-file.");
        return page(StatusCode::OK, "Sign in", None, &body);
    }
    let provider = match c.provider().await {
        Ok(p) => p,
        Err(r) => return r,
    };
    let client = c.settings.trusted_proxies.client_of(peer.map(|Extension(ConnectInfo(a))| a.ip()), &headers);
    // The browser's binding cookie is kept while it has one, so sign-ins
    // started in two of its tabs both finish.
    let binding = binding_of(&headers).map_or_else(|| session::token(random::<1>()[0]), str::to_string);
    let started = c.sessions.begin(&Browser { client, binding: &binding }, q.return_to.as_deref().unwrap_or("/"), random::<3>(), Instant::now());
    see_other(&provider.authorization_url(&started), Some(session::binding_cookie(&binding)))
}

#[derive(Deserialize)]
pub(super) struct CallbackQuery {
    #[serde(default)]
    state: Option<String>,
    #[serde(default)]
    code: Option<String>,
    #[serde(default)]
    error: Option<String>,
}

fn again(status: StatusCode, why: &str) -> Response {
    let mut body = Html::text(why);
    body.push_markup(" <a href=\"/signin\">Sign in again</a>.");
    page(status, "Not signed in", None, &body)
}

/// The provider's answer: the sign-in this browser started, the code
/// exchanged, the token checked, a session.
pub(super) async fn callback(State(c): State<Arc<Console>>, headers: HeaderMap, Query(q): Query<CallbackQuery>) -> Response {
    let Some(sign_in) = q.state.as_deref().and_then(|s| c.sessions.finish(s, binding_of(&headers), Instant::now())) else {
        return again(StatusCode::BAD_REQUEST, "This sign-in is unknown, was already used, took too long, or was started in another browser.");
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
        Ok(identity) if !c.allows(&identity) => {
            tracing::warn!(user = %identity.user, "console: signed in at the provider, but in none of the allowed groups");
            page(StatusCode::FORBIDDEN, "Not allowed", None, &Html::text("Your account is not in a group allowed to use this console."))
        }
        Ok(identity) => c.start_session(identity, &sign_in.return_to),
        Err(ProviderError::Token(TokenError::Identity(why))) => {
            tracing::warn!(reason = why, "console: the provider's token names no identity the console accepts");
            page(StatusCode::FORBIDDEN, "Not allowed", None, &Html::text(&format!("The identity provider signed you in, but the console cannot use the identity it gave: {why}.")))
        }
        Err(e) => {
            tracing::warn!(error = %e, "console: a sign-in was refused");
            again(StatusCode::UNAUTHORIZED, "The sign-in could not be verified.")
        }
    }
}

/// Single-machine mode: the local admin's one-time link.
pub(super) async fn sign_in_link(State(c): State<Arc<Console>>, Path(token): Path<String>) -> Response {
    match &c.sign_in {
        SignIn::Link(link) if link.redeem(&token) => c.start_session(super::link::local_admin(), "/"),
        SignIn::Link(_) => page(StatusCode::FORBIDDEN, "Not signed in", None, &Html::text("This sign-in link was already used or is not valid. Read the current one from the gateway's --console-link-file.")),
        SignIn::Oidc { .. } => not_found_page(),
    }
}

impl Console {
    /// Whether `who` is in a group allowed to sign in.
    fn allows(&self, who: &Identity) -> bool {
        match &self.sign_in {
            SignIn::Oidc { allowed_groups, .. } => allowed_groups.is_empty() || who.groups.iter().any(|g| allowed_groups.contains(g)),
            SignIn::Link(_) => true,
        }
    }
}
