//! The HTTP client of storage mounts (and of image registries), held to the agent's endpoint policy
//! ([`warren_core::reach`]): every name is resolved by a resolver that keeps
//! only permitted addresses (on every new connection, so a rebinding name
//! gains nothing), an address literal is checked before a client is built,
//! and a redirect to a refused literal is not followed.

use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;
use std::time::Duration;

use object_store::client::{HttpClient, HttpConnector};
use object_store::ClientOptions;
use warren_core::reach::EndpointPolicy;

/// Redirects followed at most.
const MAX_REDIRECTS: usize = 10;

/// Why `url`'s host may not be reached, when it is an address literal the
/// policy refuses.
pub fn literal_refusal(policy: &EndpointPolicy, url: &str) -> Option<String> {
    let rest = url.split_once("://").map_or(url, |(_, r)| r);
    let authority = rest.split(['/', '?', '#']).next().unwrap_or("");
    let host = authority.rsplit_once('@').map_or(authority, |(_, h)| h);
    let host = match host.strip_prefix('[') {
        Some(v6) => v6.split(']').next().unwrap_or(""),
        None => host.split(':').next().unwrap_or(""),
    };
    let ip: IpAddr = host.parse().ok()?;
    policy.refusal(ip).map(|why| format!("{url}: {ip} is {why}: endpoints may not reach the node unless an admin allows it (--allow-endpoint)"))
}

#[derive(Debug)]
struct Resolver(Arc<EndpointPolicy>);

impl reqwest::dns::Resolve for Resolver {
    fn resolve(&self, name: reqwest::dns::Name) -> reqwest::dns::Resolving {
        let policy = self.0.clone();
        Box::pin(async move {
            let host = name.as_str().to_string();
            let found: Vec<SocketAddr> = tokio::net::lookup_host((host.as_str(), 0)).await?.collect();
            let permitted = policy.permitted(&host, found)?;
            Ok(Box::new(permitted.into_iter()) as reqwest::dns::Addrs)
        })
    }
}

/// Builds the mounts' HTTP clients (what `object_store` would build from
/// the same settings, plus the policy).
#[derive(Debug, Clone)]
pub struct GuardedConnector {
    /// The agent's policy.
    pub policy: Arc<EndpointPolicy>,
    /// Plain HTTP allowed (an `http://` endpoint).
    pub allow_http: bool,
    /// Idle connections kept per host.
    pub pool_max_idle: Option<usize>,
    /// Connection setup limit.
    pub connect_timeout: Duration,
    /// One request's limit.
    pub timeout: Duration,
}

/// A reqwest client builder held to `policy`: names resolve to permitted
/// addresses only (on every new connection), a redirect to a refused
/// literal or past [`MAX_REDIRECTS`] is not followed, and only HTTPS
/// unless `allow_http`. Address literals in the first URL never reach the
/// resolver: callers check them with [`literal_refusal`] first.
pub fn client_builder(policy: &Arc<EndpointPolicy>, allow_http: bool) -> reqwest::ClientBuilder {
    let redirects = {
        let policy = policy.clone();
        reqwest::redirect::Policy::custom(move |attempt| {
            let refused = attempt.url().host_str().and_then(|h| h.trim_start_matches('[').trim_end_matches(']').parse::<IpAddr>().ok()).and_then(|ip| policy.refusal(ip));
            if attempt.previous().len() >= MAX_REDIRECTS || refused.is_some() {
                attempt.stop()
            } else {
                attempt.follow()
            }
        })
    };
    reqwest::ClientBuilder::new()
        .user_agent(concat!("warren-node-agent/", env!("CARGO_PKG_VERSION")))
        .dns_resolver(Arc::new(Resolver(policy.clone())))
        .redirect(redirects)
        .https_only(!allow_http)
}

impl HttpConnector for GuardedConnector {
    fn connect(&self, _options: &ClientOptions) -> object_store::Result<HttpClient> {
        let mut b = client_builder(&self.policy, self.allow_http).connect_timeout(self.connect_timeout).timeout(self.timeout);
        if let Some(n) = self.pool_max_idle {
            b = b.pool_max_idle_per_host(n);
        }
        let client = b.build().map_err(|e| object_store::Error::Generic { store: "http", source: Box::new(e) })?;
        Ok(HttpClient::new(client))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn literal_hosts_are_checked_in_any_spelling() {
        let p = EndpointPolicy::new(&[], vec![]).unwrap();
        for url in ["http://127.0.0.1:9000", "http://169.254.169.254/latest", "https://user:pw@127.0.0.1/x", "http://[::1]:9000/b", "http://[::ffff:169.254.169.254]/"] {
            assert!(literal_refusal(&p, url).is_some(), "{url}");
        }
        for url in ["https://s3.example.com", "http://10.0.0.7:9000", "https://[2001:db8::1]/"] {
            assert_eq!(literal_refusal(&p, url), None, "{url}");
        }
    }
}
