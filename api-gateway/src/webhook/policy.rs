//! Where a webhook may go, and how it is signed: pure rules, no I/O.
//!
//! A webhook is a request the gateway makes on a caller's behalf, from
//! inside the operator's network: without these rules it would be a way to
//! reach the cluster's private services and the cloud metadata endpoint
//! (SSRF). So: `https` only, no credentials in the URL, and no destination
//! in a private, loopback, link-local, metadata or otherwise reserved range
//! — checked on the literal address, on every address a name resolves to
//! (the connection then uses exactly those addresses), and again on every
//! redirect — unless the operator allowed that host.

use std::net::IpAddr;

use hmac::{Hmac, Mac};
use sha2::Sha256;

/// Longest webhook URL (the SDK's limit).
pub const MAX_URL: usize = 2048;

/// Hosts the operator allows despite their addresses, lower-cased.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Allowed(Vec<String>);

impl Allowed {
    /// From `--webhook-allow-host` values.
    pub fn new(hosts: &[String]) -> Allowed {
        Allowed(hosts.iter().map(|h| h.trim().trim_matches(['[', ']']).to_ascii_lowercase()).filter(|h| !h.is_empty()).collect())
    }

    /// Whether `host` (a name or an address, as in a URL) is allowed.
    pub fn has(&self, host: &str) -> bool {
        let host = host.trim_matches(['[', ']']).to_ascii_lowercase();
        self.0.iter().any(|h| *h == host)
    }
}

/// Why a destination is refused (the record's `webhook_delivery_status` is
/// `refused`; at submit, a 400 naming `webhook_url`).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Refusal {
    /// Not a URL this gateway sends to.
    #[error("{0}")]
    Url(&'static str),
    /// A private, loopback, link-local, metadata or reserved address.
    #[error("{0} is a private, loopback, link-local or reserved address; webhooks go to public https endpoints")]
    Address(IpAddr),
}

/// Checks a URL's shape: `https` (or `http` to an allowed host), a host, no
/// user info, at most [`MAX_URL`]; a literal address is checked too.
pub fn check_url(url: &str, allowed: &Allowed) -> Result<reqwest::Url, Refusal> {
    if url.len() > MAX_URL {
        return Err(Refusal::Url("at most 2048 characters"));
    }
    let u = reqwest::Url::parse(url).map_err(|_| Refusal::Url("not a valid absolute URL"))?;
    let host = u.host_str().filter(|h| !h.is_empty()).ok_or(Refusal::Url("needs a host"))?;
    match u.scheme() {
        "https" => {}
        "http" if allowed.has(host) => {}
        _ => return Err(Refusal::Url("must be an https URL")),
    }
    if !u.username().is_empty() || u.password().is_some() {
        return Err(Refusal::Url("must not carry credentials (user:password@)"));
    }
    if let Some(ip) = literal_ip(&u) {
        check_ip(ip, host, allowed)?;
    }
    Ok(u)
}

/// The URL's host when it is an address.
pub fn literal_ip(u: &reqwest::Url) -> Option<IpAddr> {
    match u.host()? {
        url::Host::Ipv4(a) => Some(IpAddr::V4(a)),
        url::Host::Ipv6(a) => Some(IpAddr::V6(a)),
        url::Host::Domain(_) => None,
    }
}

/// Refuses a forbidden address unless `host` is allowed.
pub fn check_ip(ip: IpAddr, host: &str, allowed: &Allowed) -> Result<(), Refusal> {
    if warren_core::egress::is_forbidden(ip) && !allowed.has(host) {
        return Err(Refusal::Address(ip));
    }
    Ok(())
}

/// `Warren-Signature` value: `v1=` + hex HMAC-SHA256 of
/// `"{timestamp}.{body}"` under the key's webhook secret.
pub fn signature(secret: &str, timestamp: i64, body: &[u8]) -> String {
    // HMAC takes keys of any length.
    let mut mac = Hmac::<Sha256>::new_from_slice(secret.as_bytes()).unwrap_or_else(|_| unreachable!("HMAC accepts any key length"));
    mac.update(timestamp.to_string().as_bytes());
    mac.update(b".");
    mac.update(body);
    let tag = mac.finalize().into_bytes();
    let mut out = String::with_capacity(3 + 64);
    out.push_str("v1=");
    for b in tag {
        out.push_str(&format!("{b:02x}"));
    }
    out
}

/// Delay before attempt `n` (1-based; the first is immediate): `base`
/// × 4^(n-2), at most an hour.
pub fn backoff(n: u32, base: std::time::Duration) -> std::time::Duration {
    if n <= 1 {
        return std::time::Duration::ZERO;
    }
    base.saturating_mul(4u32.saturating_pow(n - 2)).min(std::time::Duration::from_secs(3600))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn allowed() -> Allowed {
        Allowed::new(&["hooks.internal".into(), "127.0.0.1".into()])
    }

    #[test]
    fn only_https_to_public_or_allowed_hosts() {
        let a = allowed();
        assert!(check_url("https://example.com/hook", &a).is_ok());
        assert!(check_url("https://hooks.internal:8443/x", &a).is_ok());
        assert!(check_url("http://hooks.internal/x", &a).is_ok(), "http only to an allowed host");
        assert_eq!(check_url("http://example.com/x", &a), Err(Refusal::Url("must be an https URL")));
        assert_eq!(check_url("ftp://example.com/x", &a), Err(Refusal::Url("must be an https URL")));
        assert!(matches!(check_url("https://user:pw@example.com/", &a), Err(Refusal::Url(_))));
        assert!(matches!(check_url("not a url", &a), Err(Refusal::Url(_))));
        assert!(matches!(check_url(&format!("https://example.com/{}", "a".repeat(2048)), &a), Err(Refusal::Url(_))));
    }

    #[test]
    fn literal_private_metadata_and_loopback_addresses_are_refused() {
        let a = allowed();
        for url in ["https://10.200.0.10/", "https://169.254.169.254/latest", "https://[::1]/", "https://192.168.1.1/", "https://[::ffff:127.0.0.2]/", "https://0.0.0.0/"] {
            assert!(matches!(check_url(url, &a), Err(Refusal::Address(_))), "{url}");
        }
        assert!(check_url("https://127.0.0.1:8443/", &a).is_ok(), "the operator allowed it");
        assert!(check_url("https://93.184.216.34/", &a).is_ok());
    }

    #[test]
    fn signatures_are_hmac_sha256_of_timestamp_dot_body() {
        // Python: hmac.new(b"k", b"1700000000.{}", hashlib.sha256).hexdigest()
        assert_eq!(signature("k", 1_700_000_000, b"{}"), "v1=c6ef4734033cee2367414a0939385eca0397754aa7a59716da7463a9298b5146");
        assert_ne!(signature("k", 1_700_000_001, b"{}"), signature("k", 1_700_000_000, b"{}"), "the timestamp is signed");
    }

    #[test]
    fn backoff_grows_by_four_from_the_base() {
        let base = std::time::Duration::from_secs(1);
        let d: Vec<u64> = (1..=5).map(|n| backoff(n, base).as_secs()).collect();
        assert_eq!(d, [0, 1, 4, 16, 64]);
        assert_eq!(backoff(30, base).as_secs(), 3600);
    }
}
