//! OpenID Connect sign-in rules, pure: PKCE (S256) and the checks an ID
//! token must pass before anyone is signed in (OpenID Connect Core 1.0,
//! §3.1.3.7). The identity provider, its discovery document and its keys
//! are whatever answers on the network, so everything read is bounded and
//! nothing is trusted that the rules below did not check:
//!
//! - only RS256 and ES256 signatures, with keys from the provider's JWKS
//!   (`none` and the HMAC algorithms are refused: an attacker who knows a
//!   public key must not be able to use it as a shared secret);
//! - the issuer exactly, our client id among the audiences (and as `azp`
//!   when there are several), not expired, not issued in the future, and
//!   the nonce this browser's sign-in started with (compared in constant
//!   time);
//! - who it names follows the API server's own OIDC rules ([`mapping`]):
//!   a verified email only, prefixes, no `system:` names.

use base64::engine::general_purpose::URL_SAFE_NO_PAD as B64;
use base64::Engine as _;
use ring::signature::{self, RsaPublicKeyComponents, UnparsedPublicKey};
use serde::Deserialize;
use sha2::{Digest, Sha256};
use subtle::ConstantTimeEq;

mod mapping;
pub use mapping::ClaimMapping;

/// Longest ID token read.
pub const MAX_TOKEN_BYTES: usize = 16 * 1024;
/// Most keys read from a JWKS.
pub const MAX_KEYS: usize = 32;
/// Most groups kept from a token.
pub const MAX_GROUPS: usize = 256;
/// Longest group name kept.
pub const MAX_GROUP_BYTES: usize = 256;

/// A PKCE pair: the verifier stays in the browser's sign-in state, the
/// challenge goes to the provider.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Pkce {
    /// 43 characters of base64url (RFC 7636 §4.1).
    pub verifier: String,
    /// `BASE64URL(SHA256(verifier))`, sent with `code_challenge_method=S256`.
    pub challenge: String,
}

impl Pkce {
    /// The pair for 32 random bytes.
    pub fn from_random(random: [u8; 32]) -> Pkce {
        let verifier = B64.encode(random);
        let challenge = B64.encode(Sha256::digest(verifier.as_bytes()));
        Pkce { verifier, challenge }
    }
}

/// A signing key from the provider's JWKS.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Key {
    Rsa { kid: Option<String>, n: Vec<u8>, e: Vec<u8> },
    /// Uncompressed P-256 point (`04 ‖ x ‖ y`).
    P256 { kid: Option<String>, point: Vec<u8> },
}

impl Key {
    fn kid(&self) -> Option<&str> {
        match self {
            Key::Rsa { kid, .. } | Key::P256 { kid, .. } => kid.as_deref(),
        }
    }

    fn fits(&self, alg: Alg) -> bool {
        matches!((self, alg), (Key::Rsa { .. }, Alg::Rs256) | (Key::P256 { .. }, Alg::Es256))
    }

    fn verify(&self, message: &[u8], sig: &[u8]) -> bool {
        match self {
            Key::Rsa { n, e, .. } => RsaPublicKeyComponents { n, e }.verify(&signature::RSA_PKCS1_2048_8192_SHA256, message, sig).is_ok(),
            Key::P256 { point, .. } => UnparsedPublicKey::new(&signature::ECDSA_P256_SHA256_FIXED, point).verify(message, sig).is_ok(),
        }
    }
}

/// The provider's signing keys (RSA and P-256 only; others are skipped).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Jwks {
    keys: Vec<Key>,
}

#[derive(Deserialize)]
struct RawJwks {
    keys: Vec<RawJwk>,
}

#[derive(Deserialize)]
struct RawJwk {
    kty: String,
    #[serde(default)]
    kid: Option<String>,
    #[serde(default, rename = "use")]
    usage: Option<String>,
    #[serde(default)]
    n: Option<String>,
    #[serde(default)]
    e: Option<String>,
    #[serde(default)]
    crv: Option<String>,
    #[serde(default)]
    x: Option<String>,
    #[serde(default)]
    y: Option<String>,
}

impl Jwks {
    /// Reads a JWKS document; keys not for signatures, of other types or
    /// malformed are skipped, and none at all is an error.
    pub fn parse(json: &[u8]) -> Result<Jwks, TokenError> {
        let raw: RawJwks = serde_json::from_slice(json).map_err(|_| TokenError::Keys("not a JWKS document"))?;
        let keys: Vec<Key> = raw.keys.into_iter().filter(|k| k.usage.as_deref().is_none_or(|u| u == "sig")).filter_map(Key::from_raw).take(MAX_KEYS).collect();
        if keys.is_empty() {
            return Err(TokenError::Keys("no RSA or P-256 signing key"));
        }
        Ok(Jwks { keys })
    }

    /// The key that must have signed a token of `alg` naming `kid`: the
    /// one with that id, or without an id the only key of that type.
    fn key_for(&self, alg: Alg, kid: Option<&str>) -> Option<&Key> {
        let mut fitting = self.keys.iter().filter(|k| k.fits(alg));
        match kid {
            Some(kid) => fitting.find(|k| k.kid() == Some(kid)),
            None => match (fitting.next(), fitting.next()) {
                (Some(only), None) => Some(only),
                _ => None,
            },
        }
    }
}

impl Key {
    fn from_raw(k: RawJwk) -> Option<Key> {
        let bytes = |v: &Option<String>| v.as_deref().and_then(|s| B64.decode(s).ok());
        match (k.kty.as_str(), k.crv.as_deref()) {
            ("RSA", _) => Some(Key::Rsa { n: bytes(&k.n).filter(|n| n.len() >= 256 && n.len() <= 1024)?, e: bytes(&k.e).filter(|e| !e.is_empty() && e.len() <= 8)?, kid: k.kid }),
            ("EC", Some("P-256")) => {
                let (x, y) = (bytes(&k.x).filter(|x| x.len() == 32)?, bytes(&k.y).filter(|y| y.len() == 32)?);
                Some(Key::P256 { point: [&[4u8][..], &x, &y].concat(), kid: k.kid })
            }
            _ => None,
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Alg {
    Rs256,
    Es256,
}

#[derive(Deserialize)]
struct Header {
    alg: String,
    #[serde(default)]
    kid: Option<String>,
}

/// What a token must say to sign someone in.
#[derive(Debug, Clone)]
pub struct Expected<'a> {
    /// The issuer, exactly as configured (and as the discovery document said).
    pub issuer: &'a str,
    /// Our client id.
    pub client_id: &'a str,
    /// The nonce the sign-in started with.
    pub nonce: &'a str,
    /// Now, in Unix seconds.
    pub now: i64,
    /// Clock skew tolerated either way, in seconds.
    pub leeway: i64,
    /// How its claims name a user and groups.
    pub mapping: &'a ClaimMapping,
}

/// Who signed in.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Identity {
    /// The provider's subject id.
    pub subject: String,
    /// The username claim, prefixed ([`ClaimMapping`]): what RBAC is
    /// asked about, the console shows and the audit log records.
    pub user: String,
    /// The groups claim, prefixed, without `system:` names (bounded), for RBAC.
    pub groups: Vec<String>,
}

#[derive(Deserialize)]
struct Claims {
    iss: String,
    sub: String,
    aud: Audience,
    exp: i64,
    iat: i64,
    #[serde(default)]
    nonce: Option<String>,
    #[serde(default)]
    azp: Option<String>,
}

#[derive(Deserialize)]
#[serde(untagged)]
enum Audience {
    One(String),
    Many(Vec<String>),
}

/// Why an ID token (or the keys it is checked with) was refused. The
/// text never holds the token.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum TokenError {
    /// Not three base64url parts of JSON, or too long.
    #[error("the ID token is malformed")]
    Malformed,
    /// An algorithm other than RS256 or ES256.
    #[error("the ID token's algorithm {0:?} is not accepted (RS256, ES256)")]
    Algorithm(String),
    /// No key of the provider's fits the token.
    #[error("no signing key of the provider fits the ID token")]
    UnknownKey,
    /// The signature does not verify.
    #[error("the ID token's signature does not verify")]
    Signature,
    /// A claim does not match.
    #[error("the ID token's {0} does not match")]
    Claim(&'static str),
    /// Expired, or issued in the future.
    #[error("the ID token is expired or not yet valid")]
    Time,
    /// The JWKS document.
    #[error("the provider's keys: {0}")]
    Keys(&'static str),
    /// A valid token naming nobody the console may sign in.
    #[error("{0}")]
    Identity(&'static str),
}

/// Checks `token` against the provider's `keys` and what the sign-in
/// expects; who it names.
pub fn verify_id_token(token: &str, keys: &Jwks, want: &Expected<'_>) -> Result<Identity, TokenError> {
    if token.len() > MAX_TOKEN_BYTES {
        return Err(TokenError::Malformed);
    }
    let mut parts = token.split('.');
    let (Some(h), Some(p), Some(s), None) = (parts.next(), parts.next(), parts.next(), parts.next()) else { return Err(TokenError::Malformed) };
    let decode = |part: &str| B64.decode(part).map_err(|_| TokenError::Malformed);
    let header: Header = serde_json::from_slice(&decode(h)?).map_err(|_| TokenError::Malformed)?;
    let alg = match header.alg.as_str() {
        "RS256" => Alg::Rs256,
        "ES256" => Alg::Es256,
        other => return Err(TokenError::Algorithm(other.chars().take(16).collect())),
    };
    let key = keys.key_for(alg, header.kid.as_deref()).ok_or(TokenError::UnknownKey)?;
    // The signature covers the encoded header and payload as sent.
    if !key.verify(&token.as_bytes()[..h.len() + 1 + p.len()], &decode(s)?) {
        return Err(TokenError::Signature);
    }
    let payload = decode(p)?;
    let claims: Claims = serde_json::from_slice(&payload).map_err(|_| TokenError::Malformed)?;
    check_claims(&claims, want)?;
    // Read again as a map: the username and groups claims are configured.
    let all: serde_json::Map<String, serde_json::Value> = serde_json::from_slice(&payload).map_err(|_| TokenError::Malformed)?;
    let user = want.mapping.username(want.issuer, &all)?;
    Ok(Identity { subject: claims.sub, user, groups: want.mapping.groups(&all) })
}

fn check_claims(c: &Claims, want: &Expected<'_>) -> Result<(), TokenError> {
    if c.iss != want.issuer {
        return Err(TokenError::Claim("issuer"));
    }
    let audiences = match &c.aud {
        Audience::One(a) => std::slice::from_ref(a),
        Audience::Many(v) => v.as_slice(),
    };
    if !audiences.iter().any(|a| a == want.client_id) {
        return Err(TokenError::Claim("audience"));
    }
    let azp_ok = match c.azp.as_deref() {
        Some(azp) => azp == want.client_id,
        None => audiences.len() == 1,
    };
    if !azp_ok {
        return Err(TokenError::Claim("authorized party"));
    }
    if c.exp + want.leeway <= want.now || c.iat - want.leeway > want.now {
        return Err(TokenError::Time);
    }
    let nonce_ok = c.nonce.as_deref().is_some_and(|n| n.len() == want.nonce.len() && bool::from(n.as_bytes().ct_eq(want.nonce.as_bytes())));
    if !nonce_ok {
        return Err(TokenError::Claim("nonce"));
    }
    Ok(())
}

#[cfg(test)]
mod tests;
