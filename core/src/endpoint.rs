//! Service endpoints as manifests and connectors name them (pure): a host
//! (DNS name or IPv4 address) and the host and port of an http(s) URL.

/// A DNS name or an IPv4 address (no scheme, no port).
pub fn is_host(h: &str) -> bool {
    if h.parse::<std::net::Ipv4Addr>().is_ok() {
        return true;
    }
    !h.is_empty()
        && h.len() <= 253
        && h.split('.').all(|l| !l.is_empty() && l.len() <= 63 && l.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_') && !l.starts_with('-'))
}

/// `(host, port)` of an `http(s)://host[:port][/…]` URL, the host lower-cased.
pub fn url_host_port(url: &str) -> Option<(String, u16)> {
    let (rest, default) = match url.split_once("://") {
        Some(("http", rest)) => (rest, 80),
        Some(("https", rest)) => (rest, 443),
        _ => return None,
    };
    let authority = rest.split('/').next()?;
    let (host, port) = match authority.rsplit_once(':') {
        Some((h, p)) => (h, p.parse().ok()?),
        None => (authority, default),
    };
    is_host(host).then(|| (host.to_ascii_lowercase(), port))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hosts_and_url_endpoints() {
        assert!(is_host("db.internal") && is_host("10.0.0.1") && is_host("localhost"));
        assert!(!is_host("") && !is_host("db:5432") && !is_host("http://db") && !is_host("-x.y"));
        assert_eq!(url_host_port("https://S3.example.com/bucket"), Some(("s3.example.com".into(), 443)));
        assert_eq!(url_host_port("http://127.0.0.1:9000"), Some(("127.0.0.1".into(), 9000)));
        assert_eq!(url_host_port("ftp://x"), None);
        assert_eq!(url_host_port("http://a b:1"), None);
    }
}
