//! The identity provider the console signs users in with, over HTTP: its
//! discovery document and keys, the authorization request, and the code
//! exchange. Whatever answers is untrusted: no redirects are followed,
//! every answer is bounded in size and time, the discovery document must
//! name exactly the configured issuer, and plain `http` is accepted only
//! for a provider on loopback (a development setup).

use std::sync::RwLock;
use std::time::Duration;

use futures_util::StreamExt;
use serde::Deserialize;

use super::oidc::{self, ClaimMapping, Expected, Identity, Jwks, TokenError};
use super::session::{SignIn, Started};

/// Longest answer read from the provider.
const MAX_ANSWER_BYTES: usize = 256 * 1024;
/// Longest wait for one answer.
const TIMEOUT: Duration = Duration::from_secs(10);
/// Clock skew tolerated on ID tokens.
const LEEWAY_SECS: i64 = 60;

/// How the console is registered with the provider (chart values / flags).
#[derive(Clone)]
pub struct ProviderConfig {
    /// The issuer URL, exactly as the provider names itself.
    pub issuer: String,
    /// The console's client id.
    pub client_id: String,
    /// The console's client secret (never logged).
    pub client_secret: String,
    /// `<console URL>/callback`, as registered.
    pub redirect_uri: String,
    /// How the ID token's claims name a user and groups.
    pub claims: ClaimMapping,
}

impl std::fmt::Debug for ProviderConfig {
    // Never the client secret.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ProviderConfig").field("issuer", &self.issuer).field("client_id", &self.client_id).field("redirect_uri", &self.redirect_uri).field("claims", &self.claims).finish_non_exhaustive()
    }
}

/// Why the provider could not be used, or a sign-in failed. The text names
/// no secret and no token.
#[derive(Debug, thiserror::Error)]
pub enum ProviderError {
    /// Unreachable, too slow, too large, or not JSON.
    #[error("the identity provider: {0}")]
    Unavailable(String),
    /// It answered with something no provider may say.
    #[error("the identity provider's {0}")]
    Refused(String),
    /// The ID token failed a check.
    #[error(transparent)]
    Token(#[from] TokenError),
}

#[derive(Debug, Clone, Deserialize)]
struct Discovery {
    issuer: String,
    authorization_endpoint: String,
    token_endpoint: String,
    jwks_uri: String,
}

#[derive(Deserialize)]
struct TokenAnswer {
    id_token: String,
}

/// A discovered provider.
pub struct Provider {
    config: ProviderConfig,
    discovery: Discovery,
    /// `discovery.authorization_endpoint`, parsed.
    authorize: url::Url,
    keys: RwLock<Jwks>,
    http: reqwest::Client,
}

impl std::fmt::Debug for Provider {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Provider").field("issuer", &self.config.issuer).field("client_id", &self.config.client_id).finish_non_exhaustive()
    }
}

/// `u` is https, or http on a loopback host.
fn acceptable_url(u: &str) -> bool {
    let Ok(url) = url::Url::parse(u) else { return false };
    match url.scheme() {
        "https" => url.host().is_some(),
        "http" => match url.host() {
            Some(url::Host::Ipv4(a)) => a.is_loopback(),
            Some(url::Host::Ipv6(a)) => a.is_loopback(),
            Some(url::Host::Domain(d)) => d == "localhost",
            None => false,
        },
        _ => false,
    }
}

impl Provider {
    /// Reads the provider's discovery document and keys.
    pub async fn discover(config: ProviderConfig) -> Result<Provider, ProviderError> {
        if !acceptable_url(&config.issuer) {
            return Err(ProviderError::Refused("issuer must be an https URL (http only on loopback)".into()));
        }
        let http = reqwest::Client::builder()
            .redirect(reqwest::redirect::Policy::none())
            .timeout(TIMEOUT)
            .connect_timeout(TIMEOUT)
            .build()
            .map_err(|e| ProviderError::Unavailable(e.to_string()))?;
        let url = format!("{}/.well-known/openid-configuration", config.issuer.trim_end_matches('/'));
        let discovery: Discovery = json(http.get(&url)).await?;
        if discovery.issuer != config.issuer {
            return Err(ProviderError::Refused(format!("discovery document names issuer {:?}, not the configured one", discovery.issuer.chars().take(200).collect::<String>())));
        }
        for (what, u) in [("authorization endpoint", &discovery.authorization_endpoint), ("token endpoint", &discovery.token_endpoint), ("jwks_uri", &discovery.jwks_uri)] {
            if !acceptable_url(u) {
                return Err(ProviderError::Refused(format!("{what} must be an https URL (http only on loopback)")));
            }
        }
        let authorize = url::Url::parse(&discovery.authorization_endpoint).map_err(|_| ProviderError::Refused("authorization endpoint is not a URL".into()))?;
        let keys = fetch_keys(&http, &discovery.jwks_uri).await?;
        Ok(Provider { config, discovery, authorize, keys: RwLock::new(keys), http })
    }

    /// Where to send the browser to sign in.
    pub fn authorization_url(&self, started: &Started) -> String {
        let mut url = self.authorize.clone();
        url.query_pairs_mut()
            .append_pair("response_type", "code")
            .append_pair("client_id", &self.config.client_id)
            .append_pair("redirect_uri", &self.config.redirect_uri)
            .append_pair("scope", self.scope())
            .append_pair("state", &started.state)
            .append_pair("nonce", &started.nonce)
            .append_pair("code_challenge", &started.challenge)
            .append_pair("code_challenge_method", "S256");
        url.into()
    }

    /// The scopes asked for: the ID token must carry the configured claims
    /// (`preferred_username` and the like come with `profile`).
    fn scope(&self) -> &'static str {
        match self.config.claims.username_claim.as_str() {
            "sub" | "email" => "openid email groups",
            _ => "openid email profile groups",
        }
    }

    /// Exchanges the callback's `code` for an ID token and checks it
    /// against the sign-in it belongs to; `now` in Unix seconds.
    pub async fn exchange(&self, code: &str, sign_in: &SignIn, now: i64) -> Result<Identity, ProviderError> {
        let form = [("grant_type", "authorization_code"), ("code", code), ("redirect_uri", &self.config.redirect_uri), ("code_verifier", &sign_in.verifier)];
        // RFC 6749 §2.3.1: the id and secret are form-encoded inside Basic.
        let enc = |s: &str| url::form_urlencoded::byte_serialize(s.as_bytes()).collect::<String>();
        let request = self.http.post(&self.discovery.token_endpoint).basic_auth(enc(&self.config.client_id), Some(enc(&self.config.client_secret))).form(&form);
        let answer: TokenAnswer = json(request).await?;
        let want = Expected { issuer: &self.config.issuer, client_id: &self.config.client_id, nonce: &sign_in.nonce, now, leeway: LEEWAY_SECS, mapping: &self.config.claims };
        let checked = oidc::verify_id_token(&answer.id_token, &self.keys.read().unwrap_or_else(|p| p.into_inner()), &want);
        match checked {
            // The provider may have rotated its keys: read them once more.
            Err(TokenError::UnknownKey) => {
                let keys = fetch_keys(&self.http, &self.discovery.jwks_uri).await?;
                let identity = oidc::verify_id_token(&answer.id_token, &keys, &want)?;
                *self.keys.write().unwrap_or_else(|p| p.into_inner()) = keys;
                Ok(identity)
            }
            other => Ok(other?),
        }
    }
}

async fn fetch_keys(http: &reqwest::Client, uri: &str) -> Result<Jwks, ProviderError> {
    Ok(Jwks::parse(&bounded(http.get(uri)).await?)?)
}

/// The answer's JSON, bounded.
async fn json<T: serde::de::DeserializeOwned>(request: reqwest::RequestBuilder) -> Result<T, ProviderError> {
    let body = bounded(request).await?;
    serde_json::from_slice(&body).map_err(|_| ProviderError::Unavailable("the answer is not the JSON expected".into()))
}

/// A successful answer's body, at most [`MAX_ANSWER_BYTES`].
async fn bounded(request: reqwest::RequestBuilder) -> Result<Vec<u8>, ProviderError> {
    let unavailable = |e: reqwest::Error| ProviderError::Unavailable(e.without_url().to_string());
    let answer = request.send().await.map_err(unavailable)?;
    if !answer.status().is_success() {
        return Err(ProviderError::Refused(format!("answer: HTTP {}", answer.status().as_u16())));
    }
    let mut body = Vec::new();
    let mut stream = answer.bytes_stream();
    while let Some(chunk) = stream.next().await {
        let chunk = chunk.map_err(unavailable)?;
        if body.len() + chunk.len() > MAX_ANSWER_BYTES {
            return Err(ProviderError::Unavailable(format!("an answer over {MAX_ANSWER_BYTES} bytes")));
        }
        body.extend_from_slice(&chunk);
    }
    Ok(body)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_https_or_loopback_http_providers_are_used() {
        for ok in ["https://idp.example.com", "https://idp.example.com/realms/x", "http://127.0.0.1:8080", "http://[::1]:9000", "http://localhost:5556/dex"] {
            assert!(acceptable_url(ok), "{ok}");
        }
        for bad in ["http://idp.example.com", "http://10.0.0.7", "ftp://idp.example.com", "javascript:alert(1)", "", "https://"] {
            assert!(!acceptable_url(bad), "{bad}");
        }
    }
}
