//! Which client a request comes from, as far as the console can tell: what
//! bounds the sign-ins one client may have under way, so a flood from one
//! address cannot push out anyone else's. Pure.
//!
//! The client is the connection's peer address, unless that peer is one
//! of the configured trusted proxies (an ingress controller): then it is
//! the address the proxies say they received the request from, the last
//! `X-Forwarded-For` entry that is not itself a trusted proxy. Entries
//! further left were written by the client and are never believed. An IPv6
//! client counts by its /64 (one host is commonly given a whole /64).

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

use axum::http::HeaderMap;

/// Most `X-Forwarded-For` entries looked at (a chain of proxies is short).
const MAX_HOPS: usize = 16;

/// A client, as sign-ins are counted per client.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Client(IpAddr);

impl Client {
    /// Requests whose peer is not known (a server that does not record
    /// peers; the console's own does) count as one client.
    pub const UNKNOWN: Client = Client(IpAddr::V4(Ipv4Addr::UNSPECIFIED));

    /// The client at `addr`: an IPv4 address, or an IPv6 /64.
    pub fn of(addr: IpAddr) -> Client {
        match addr {
            IpAddr::V4(a) => Client(IpAddr::V4(a)),
            IpAddr::V6(a) => match a.to_ipv4_mapped() {
                Some(v4) => Client(IpAddr::V4(v4)),
                None => Client(IpAddr::V6(Ipv6Addr::from(u128::from(a) & !((1u128 << 64) - 1)))),
            },
        }
    }
}

/// Address ranges whose `X-Forwarded-For` is believed.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct TrustedProxies(Vec<(IpAddr, u8)>);

impl TrustedProxies {
    /// Parses `a.b.c.d/n`, `x::y/n` or a bare address, each; the first bad one is named.
    pub fn parse(list: &[String]) -> Result<TrustedProxies, String> {
        let mut out = Vec::new();
        for item in list.iter().map(|s| s.trim()).filter(|s| !s.is_empty()) {
            out.push(cidr(item).ok_or_else(|| format!("{item:?} is not an address or CIDR range"))?);
        }
        Ok(TrustedProxies(out))
    }

    fn contains(&self, addr: IpAddr) -> bool {
        let addr = unmapped(addr);
        self.0.iter().any(|(net, prefix)| in_range(addr, *net, *prefix))
    }

    /// The client of a request from `peer` carrying `headers`.
    pub fn client_of(&self, peer: Option<IpAddr>, headers: &HeaderMap) -> Client {
        let Some(mut addr) = peer else { return Client::UNKNOWN };
        if !self.contains(addr) {
            return Client::of(addr);
        }
        // Right to left: each trusted proxy appended the address it saw.
        for hop in forwarded(headers).into_iter().rev().take(MAX_HOPS) {
            let Some(hop) = hop else { break };
            addr = hop;
            if !self.contains(addr) {
                break;
            }
        }
        Client::of(addr)
    }
}

/// The `X-Forwarded-For` entries in order (`None` for one that is not an address).
fn forwarded(headers: &HeaderMap) -> Vec<Option<IpAddr>> {
    headers
        .get_all("x-forwarded-for")
        .iter()
        .flat_map(|v| v.to_str().unwrap_or("?").split(','))
        .map(|s| s.trim().parse::<IpAddr>().ok())
        .collect()
}

fn unmapped(addr: IpAddr) -> IpAddr {
    match addr {
        IpAddr::V6(a) => a.to_ipv4_mapped().map_or(addr, IpAddr::V4),
        v4 => v4,
    }
}

fn cidr(s: &str) -> Option<(IpAddr, u8)> {
    let (addr, prefix) = match s.split_once('/') {
        Some((a, p)) => (a.parse::<IpAddr>().ok()?, p.parse::<u8>().ok()?),
        None => {
            let a = s.parse::<IpAddr>().ok()?;
            (a, if a.is_ipv4() { 32 } else { 128 })
        }
    };
    let max = if addr.is_ipv4() { 32 } else { 128 };
    (prefix <= max).then_some((unmapped(addr), prefix))
}

fn in_range(addr: IpAddr, net: IpAddr, prefix: u8) -> bool {
    match (addr, net) {
        (IpAddr::V4(a), IpAddr::V4(n)) => prefix == 0 || (u32::from(a) ^ u32::from(n)) >> (32 - u32::from(prefix)) == 0,
        (IpAddr::V6(a), IpAddr::V6(n)) => prefix == 0 || (u128::from(a) ^ u128::from(n)) >> (128 - u32::from(prefix)) == 0,
        _ => false,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use axum::http::HeaderValue;

    fn ip(s: &str) -> IpAddr {
        s.parse().unwrap()
    }

    fn xff(values: &[&str]) -> HeaderMap {
        let mut h = HeaderMap::new();
        for v in values {
            h.append("x-forwarded-for", HeaderValue::from_str(v).unwrap());
        }
        h
    }

    #[test]
    fn without_a_trusted_proxy_the_peer_is_the_client_whatever_it_forwards() {
        let none = TrustedProxies::default();
        assert_eq!(none.client_of(Some(ip("203.0.113.7")), &xff(&["198.51.100.1"])), Client::of(ip("203.0.113.7")), "a client cannot name itself");
        assert_eq!(none.client_of(None, &HeaderMap::new()), Client::UNKNOWN);
    }

    #[test]
    fn behind_trusted_proxies_the_client_is_the_last_address_they_did_not_write() {
        let proxies = TrustedProxies::parse(&["10.0.0.0/8".into(), " fd00::/8 ".into(), String::new()]).unwrap();
        let ingress = Some(ip("10.1.2.3"));
        // The client wrote the first entry itself (a lie); the ingress appended the real one.
        assert_eq!(proxies.client_of(ingress, &xff(&["1.2.3.4, 203.0.113.7"])), Client::of(ip("203.0.113.7")));
        // Two proxies: the inner one's address is skipped.
        assert_eq!(proxies.client_of(ingress, &xff(&["203.0.113.7", "10.9.9.9"])), Client::of(ip("203.0.113.7")));
        // Junk where an address belongs: the last trusted hop stands in (a bucket of its own, never the junk).
        assert_eq!(proxies.client_of(ingress, &xff(&["nonsense"])), Client::of(ip("10.1.2.3")));
        assert_eq!(proxies.client_of(ingress, &HeaderMap::new()), Client::of(ip("10.1.2.3")));
        assert_eq!(proxies.client_of(Some(ip("::ffff:10.1.2.3")), &xff(&["203.0.113.9"])), Client::of(ip("203.0.113.9")), "an IPv4-mapped peer");
        assert!(TrustedProxies::parse(&["10.0.0.0/33".into()]).is_err() && TrustedProxies::parse(&["proxy.example".into()]).is_err());
    }

    #[test]
    fn an_ipv6_client_counts_by_its_64() {
        assert_eq!(Client::of(ip("2001:db8:1:2:aaaa::1")), Client::of(ip("2001:db8:1:2:bbbb::2")));
        assert_ne!(Client::of(ip("2001:db8:1:2::1")), Client::of(ip("2001:db8:1:3::1")));
        assert_eq!(Client::of(ip("::ffff:192.0.2.1")), Client::of(ip("192.0.2.1")));
    }
}
