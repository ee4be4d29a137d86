//! A small OCI distribution client whose every read is bounded: manifests,
//! token answers and configs are read up to a cap while streaming (a
//! registry is whatever answers, and a 1 GiB "manifest" must not become
//! 1 GiB of agent memory), layers are handed over as a stream for the
//! metered unpacker. Manifests are hashed here: a digest header proves
//! nothing.
//!
//! Authentication follows the distribution spec: the request is sent; a 401
//! with a `Bearer` challenge is answered by asking the named realm for a
//! pull token for this repository (with the caller's credentials, if any),
//! a `Basic` challenge with the credentials themselves; then the request is
//! sent once more. Redirects (blobs on a CDN) are followed by reqwest, which
//! drops the `Authorization` header when the host changes.
//!
//! A registry is a tenant-named endpoint like a storage endpoint or a
//! connector host: the registry, its token realm and every redirect are held
//! to the agent's endpoint policy ([`warren_objects::guard`]), so an image
//! reference cannot aim the agent at the node itself (its loopback ports,
//! the metadata service) unless an admin allowed that destination.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use futures_util::{Stream, StreamExt, TryStreamExt};
use oci_client::Reference;
use sha2::{Digest, Sha256};
use warren_core::reach::EndpointPolicy;
use warren_objects::guard;

use crate::pull::{PullAuth, PullError};

/// Largest manifest or index read (containerd and the distribution
/// registry use 4 MiB too).
pub const MAX_MANIFEST_BYTES: usize = 4 << 20;
/// Largest token answer read.
const MAX_TOKEN_BYTES: usize = 64 << 10;

const OCI_MANIFEST: &str = "application/vnd.oci.image.manifest.v1+json";
const DOCKER_MANIFEST: &str = "application/vnd.docker.distribution.manifest.v2+json";
const OCI_INDEX: &str = "application/vnd.oci.image.index.v1+json";
const DOCKER_LIST: &str = "application/vnd.docker.distribution.manifest.list.v2+json";

/// An image manifest as served: its bytes and their digest.
#[derive(Debug, Clone)]
pub struct Manifest {
    /// The body, at most [`MAX_MANIFEST_BYTES`].
    pub body: Vec<u8>,
    /// `sha256:<hex>` of the body.
    pub digest: String,
}

/// One repository of one registry, with one caller's credentials.
pub struct Registry {
    http: reqwest::Client,
    policy: Arc<EndpointPolicy>,
    base: String,
    repository: String,
    auth: PullAuth,
    /// The `Authorization` value earned by a challenge.
    authorization: Mutex<Option<String>>,
}

/// The error with its causes (reqwest's own text omits them, and a
/// refusal by the endpoint policy is one of them).
fn registry_error(e: impl std::error::Error) -> PullError {
    let mut text = e.to_string();
    let mut cause = e.source();
    while let Some(c) = cause {
        text.push_str(": ");
        text.push_str(&c.to_string());
        cause = c.source();
    }
    PullError::Registry(text)
}

impl Registry {
    /// The repository `reference` names, over HTTP when `plain`, reached
    /// only where `policy` allows.
    pub fn new(reference: &Reference, plain: bool, auth: &PullAuth, policy: &Arc<EndpointPolicy>) -> Result<Registry, PullError> {
        let http = guard::client_builder(policy, true).connect_timeout(Duration::from_secs(10)).read_timeout(Duration::from_secs(60)).build().map_err(registry_error)?;
        let scheme = if plain { "http" } else { "https" };
        let base = format!("{scheme}://{}", reference.resolve_registry());
        refuse_literal(policy, &base)?;
        Ok(Registry { http, policy: policy.clone(), base, repository: reference.repository().to_string(), auth: auth.clone(), authorization: Mutex::new(None) })
    }

    /// The image manifest `reference` (a tag or a digest) names for this
    /// platform: an index is resolved to its linux entry for this machine's
    /// architecture. Every manifest fetched by digest must hash to it.
    pub async fn image_manifest(&self, reference: &str) -> Result<Manifest, PullError> {
        let (media_type, first) = self.manifest(reference, &[OCI_MANIFEST, DOCKER_MANIFEST, OCI_INDEX, DOCKER_LIST]).await?;
        if !is_index(&media_type, &first.body) {
            return Ok(first);
        }
        let digest = platform_entry(&first.body)?;
        let (media_type, manifest) = self.manifest(&digest, &[OCI_MANIFEST, DOCKER_MANIFEST]).await?;
        if is_index(&media_type, &manifest.body) {
            return Err(PullError::Registry("an index names another index for this platform".into()));
        }
        Ok(manifest)
    }

    /// The manifest `reference` names, as served (media type, manifest).
    pub async fn manifest(&self, reference: &str, accept: &[&str]) -> Result<(String, Manifest), PullError> {
        let url = format!("{}/v2/{}/manifests/{reference}", self.base, self.repository);
        let res = self.get(&url, &accept.join(", ")).await?;
        let media_type = res.headers().get(reqwest::header::CONTENT_TYPE).and_then(|v| v.to_str().ok()).unwrap_or_default().split(';').next().unwrap_or_default().trim().to_string();
        let body = bounded(res, MAX_MANIFEST_BYTES, "manifest").await?;
        let digest = format!("sha256:{:x}", Sha256::digest(&body));
        if reference.starts_with("sha256:") && reference != digest {
            return Err(PullError::Registry(format!("the manifest served for {reference} hashes to {digest}")));
        }
        Ok((media_type, Manifest { body, digest }))
    }

    /// The blob `digest`, as a stream (its reader meters and verifies it).
    pub async fn blob(&self, digest: &str) -> Result<impl Stream<Item = std::io::Result<Bytes>> + use<>, PullError> {
        let url = format!("{}/v2/{}/blobs/{digest}", self.base, self.repository);
        let res = self.get(&url, "*/*").await?;
        Ok(res.bytes_stream().map_err(std::io::Error::other))
    }

    /// The blob `digest`, read whole up to `limit` bytes.
    pub async fn small_blob(&self, digest: &str, limit: usize) -> Result<Vec<u8>, PullError> {
        let url = format!("{}/v2/{}/blobs/{digest}", self.base, self.repository);
        let res = self.get(&url, "*/*").await?;
        bounded(res, limit, "config").await
    }

    async fn get(&self, url: &str, accept: &str) -> Result<reqwest::Response, PullError> {
        let send = |authorization: Option<String>| {
            let mut req = self.http.get(url).header(reqwest::header::ACCEPT, accept);
            if let Some(a) = authorization {
                req = req.header(reqwest::header::AUTHORIZATION, a);
            }
            req.send()
        };
        let earned = self.authorization.lock().unwrap_or_else(|p| p.into_inner()).clone();
        let res = send(earned.clone()).await.map_err(registry_error)?;
        let res = match res.status() {
            reqwest::StatusCode::UNAUTHORIZED => {
                let challenge = res.headers().get(reqwest::header::WWW_AUTHENTICATE).and_then(|v| v.to_str().ok()).unwrap_or_default().to_string();
                let authorization = self.answer(&challenge).await?;
                *self.authorization.lock().unwrap_or_else(|p| p.into_inner()) = Some(authorization.clone());
                send(Some(authorization)).await.map_err(registry_error)?
            }
            _ => res,
        };
        match res.status() {
            s if s.is_success() => Ok(res),
            s => Err(PullError::Registry(format!("{url}: {s}"))),
        }
    }

    /// The `Authorization` value a challenge asks for.
    async fn answer(&self, challenge: &str) -> Result<String, PullError> {
        let basic = match &self.auth {
            PullAuth::Basic { username, password } => Some((username.clone(), password.clone())),
            PullAuth::Anonymous => None,
        };
        let (scheme, params) = challenge.split_once(' ').unwrap_or((challenge, ""));
        if scheme.eq_ignore_ascii_case("basic") {
            let (user, password) = basic.ok_or_else(|| PullError::Registry("the registry wants credentials (401)".into()))?;
            return Ok(basic_header(&user, &password));
        }
        if !scheme.eq_ignore_ascii_case("bearer") {
            return Err(PullError::Registry(format!("the registry answered 401 with an unknown challenge {scheme:?}")));
        }
        let params = challenge_params(params);
        let realm = params.iter().find(|(k, _)| k == "realm").map(|(_, v)| v.clone()).ok_or_else(|| PullError::Registry("a Bearer challenge without a realm".into()))?;
        let mut query = vec![("scope".to_string(), format!("repository:{}:pull", self.repository))];
        if let Some((_, service)) = params.iter().find(|(k, _)| k == "service") {
            query.push(("service".into(), service.clone()));
        }
        if !realm.starts_with("https://") && !realm.starts_with("http://") {
            return Err(PullError::Registry("the token realm is not an http(s) URL".into()));
        }
        refuse_literal(&self.policy, &realm)?;
        let mut req = self.http.get(&realm).query(&query);
        if let Some((user, password)) = basic {
            req = req.header(reqwest::header::AUTHORIZATION, basic_header(&user, &password));
        }
        let res = req.send().await.map_err(registry_error)?;
        if !res.status().is_success() {
            return Err(PullError::Registry(format!("the registry's token service refused: {}", res.status())));
        }
        let body = bounded(res, MAX_TOKEN_BYTES, "token answer").await?;
        #[derive(serde::Deserialize)]
        struct Token {
            token: Option<String>,
            access_token: Option<String>,
        }
        let t: Token = serde_json::from_slice(&body).map_err(|e| PullError::Registry(format!("the token answer is not JSON: {e}")))?;
        let token = t.token.or(t.access_token).filter(|t| !t.is_empty() && t.len() < MAX_TOKEN_BYTES).ok_or_else(|| PullError::Registry("the token answer holds no token".into()))?;
        Ok(format!("Bearer {token}"))
    }
}

/// A URL whose host is an address literal the policy refuses never gets a
/// connection (names are checked by the client's resolver).
fn refuse_literal(policy: &EndpointPolicy, url: &str) -> Result<(), PullError> {
    match guard::literal_refusal(policy, url) {
        Some(why) => Err(PullError::Endpoint(why)),
        None => Ok(()),
    }
}

fn basic_header(user: &str, password: &str) -> String {
    use base64::Engine as _;
    format!("Basic {}", base64::engine::general_purpose::STANDARD.encode(format!("{user}:{password}")))
}

/// `key="value", key=value` pairs of a challenge.
fn challenge_params(s: &str) -> Vec<(String, String)> {
    let mut out = Vec::new();
    let mut rest = s.trim();
    while let Some((key, after)) = rest.split_once('=') {
        let key = key.trim().trim_start_matches(',').trim().to_ascii_lowercase();
        let after = after.trim_start();
        let (value, next) = match after.strip_prefix('"') {
            Some(quoted) => match quoted.split_once('"') {
                Some((v, next)) => (v, next),
                None => (quoted, ""),
            },
            None => after.split_once(',').map_or((after, ""), |(v, next)| (v, next)),
        };
        out.push((key, value.trim().to_string()));
        rest = next.trim_start_matches(|c: char| c == ',' || c.is_whitespace());
    }
    out
}

/// The response body, refused as soon as it passes `limit` bytes (before
/// reading at all when the declared length does).
async fn bounded(res: reqwest::Response, limit: usize, what: &str) -> Result<Vec<u8>, PullError> {
    let too_large = || PullError::Registry(format!("the registry's {what} is larger than {limit} bytes"));
    if res.content_length().is_some_and(|l| l > limit as u64) {
        return Err(too_large());
    }
    let mut body = Vec::new();
    let mut stream = res.bytes_stream();
    while let Some(chunk) = stream.next().await {
        let chunk = chunk.map_err(registry_error)?;
        if body.len() + chunk.len() > limit {
            return Err(too_large());
        }
        body.extend_from_slice(&chunk);
    }
    Ok(body)
}

fn is_index(media_type: &str, body: &[u8]) -> bool {
    if media_type == OCI_INDEX || media_type == DOCKER_LIST {
        return true;
    }
    // A registry may omit the type: an index has `manifests`, an image `layers`.
    #[derive(serde::Deserialize)]
    struct Probe {
        #[serde(rename = "mediaType")]
        media_type: Option<String>,
        manifests: Option<serde::de::IgnoredAny>,
    }
    serde_json::from_slice::<Probe>(body).is_ok_and(|p| p.media_type.as_deref().is_some_and(|m| m == OCI_INDEX || m == DOCKER_LIST) || (media_type.is_empty() && p.manifests.is_some()))
}

/// The digest of an index's entry for linux on this machine's architecture.
fn platform_entry(body: &[u8]) -> Result<String, PullError> {
    #[derive(serde::Deserialize)]
    struct Index {
        manifests: Vec<Entry>,
    }
    #[derive(serde::Deserialize)]
    struct Entry {
        digest: String,
        platform: Option<Platform>,
    }
    #[derive(serde::Deserialize)]
    struct Platform {
        os: String,
        architecture: String,
    }
    let index: Index = serde_json::from_slice(body).map_err(|e| PullError::Registry(format!("malformed image index: {e}")))?;
    let arch = match std::env::consts::ARCH {
        "x86_64" => "amd64",
        "aarch64" => "arm64",
        other => other,
    };
    index
        .manifests
        .into_iter()
        .find(|m| m.platform.as_ref().is_some_and(|p| p.os == "linux" && p.architecture == arch))
        .map(|m| m.digest)
        .filter(|d| crate::digest::is_sha256(d))
        .ok_or_else(|| PullError::Registry(format!("the image index has no linux/{arch} image")))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn challenges_parse_with_and_without_quotes() {
        let p = challenge_params(r#"realm="https://auth.example/token",service="registry.example",scope="repository:a/b:pull""#);
        assert_eq!(p[0], ("realm".into(), "https://auth.example/token".into()));
        assert_eq!(p[1], ("service".into(), "registry.example".into()));
        assert_eq!(p[2].1, "repository:a/b:pull");
        assert_eq!(challenge_params("realm=x, service=y"), [("realm".to_string(), "x".to_string()), ("service".to_string(), "y".to_string())]);
    }

    #[test]
    fn an_index_resolves_to_this_platform_only() {
        let arch = if std::env::consts::ARCH == "aarch64" { "arm64" } else { "amd64" };
        let d = format!("sha256:{}", "a".repeat(64));
        let body = format!(r#"{{"manifests":[{{"digest":"sha256:{}","platform":{{"os":"windows","architecture":"{arch}"}}}},{{"digest":"{d}","platform":{{"os":"linux","architecture":"{arch}"}}}}]}}"#, "b".repeat(64));
        assert!(is_index("", body.as_bytes()));
        assert!(!is_index(OCI_MANIFEST, br#"{"layers":[]}"#));
        assert_eq!(platform_entry(body.as_bytes()).unwrap(), d);
        assert!(platform_entry(br#"{"manifests":[{"digest":"sha256:x","platform":{"os":"linux","architecture":"s390x"}}]}"#).is_err());
    }
}
