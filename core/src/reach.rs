//! What an endpoint a tenant names (a Connector's host, a StorageConnection's
//! endpoint) may reach from the node-agent, which connects on the tenant's
//! behalf: anything but the node itself — loopback, link-local (the cloud
//! metadata service), unspecified, multicast and broadcast addresses, and the
//! agent's and the node's own addresses — unless an admin allowed that
//! destination (`--allow-endpoint`). Private ranges stay reachable (that is
//! what connectors are for); an admin narrows them with the agent pod's
//! egress NetworkPolicy.
//!
//! The check applies to every address a name resolves to, on every
//! connection, so a name that rebinds gains nothing.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};

/// The agent's rule for tenant-named endpoints.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct EndpointPolicy {
    allowed: Vec<(IpAddr, u8)>,
    own: Vec<IpAddr>,
}

/// `a.b.c.d`, `a.b.c.d/n`, `::1`, `fd00::/8`.
fn parse_cidr(s: &str) -> Option<(IpAddr, u8)> {
    let (ip, len) = match s.split_once('/') {
        Some((ip, len)) => (ip.parse::<IpAddr>().ok()?, len.parse::<u8>().ok()?),
        None => {
            let ip = s.parse::<IpAddr>().ok()?;
            (ip, if ip.is_ipv4() { 32 } else { 128 })
        }
    };
    let max = if ip.is_ipv4() { 32 } else { 128 };
    (len <= max).then_some((ip, len))
}

fn contains((net, len): (IpAddr, u8), ip: IpAddr) -> bool {
    match (net, ip) {
        (IpAddr::V4(n), IpAddr::V4(a)) => {
            let mask = if len == 0 { 0 } else { u32::MAX << (32 - u32::from(len)) };
            u32::from(n) & mask == u32::from(a) & mask
        }
        (IpAddr::V6(n), IpAddr::V6(a)) => {
            let mask = if len == 0 { 0 } else { u128::MAX << (128 - u32::from(len)) };
            u128::from(n) & mask == u128::from(a) & mask
        }
        _ => false,
    }
}

/// The IPv4 address an IPv6 one stands for (mapped or compatible), if any.
fn embedded_v4(a: Ipv6Addr) -> Option<Ipv4Addr> {
    a.to_ipv4_mapped().or_else(|| {
        let s = a.segments();
        (s[..6] == [0; 6] && a != Ipv6Addr::UNSPECIFIED && a != Ipv6Addr::LOCALHOST).then(|| Ipv4Addr::new((s[6] >> 8) as u8, s[6] as u8, (s[7] >> 8) as u8, s[7] as u8))
    })
}

impl EndpointPolicy {
    /// `allowed`: destinations an admin opened (CIDRs or addresses);
    /// `own`: the agent's and the node's addresses.
    pub fn new(allowed: &[String], own: Vec<IpAddr>) -> Result<EndpointPolicy, String> {
        let allowed = allowed
            .iter()
            .map(|s| parse_cidr(s.trim()).ok_or_else(|| format!("--allow-endpoint {s:?}: not an address or CIDR")))
            .collect::<Result<Vec<_>, String>>()?;
        Ok(EndpointPolicy { allowed, own })
    }

    /// Why a connection to `ip` is refused, if it is.
    pub fn refusal(&self, ip: IpAddr) -> Option<&'static str> {
        let ip = match ip {
            IpAddr::V6(a) => embedded_v4(a).map_or(ip, IpAddr::V4),
            v4 => v4,
        };
        if self.allowed.iter().any(|c| contains(*c, ip)) {
            return None;
        }
        let why = match ip {
            IpAddr::V4(a) if a.is_loopback() => "loopback",
            IpAddr::V4(a) if a.is_link_local() => "link-local (the metadata service)",
            IpAddr::V4(a) if a.is_unspecified() || a.is_broadcast() || a.is_multicast() => "not a unicast address",
            IpAddr::V6(a) if a.is_loopback() => "loopback",
            IpAddr::V6(a) if (a.segments()[0] & 0xffc0) == 0xfe80 => "link-local",
            IpAddr::V6(a) if a.is_unspecified() || a.is_multicast() => "not a unicast address",
            // fd00:ec2::254, the IPv6 metadata address.
            IpAddr::V6(a) if a == Ipv6Addr::new(0xfd00, 0xec2, 0, 0, 0, 0, 0, 0x254) => "the metadata service",
            _ if self.own.contains(&ip) => "the node's own address",
            _ => return None,
        };
        Some(why)
    }

    /// The addresses of `resolved` a connection may use; an error naming
    /// the refusal when none is left.
    pub fn permitted(&self, host: &str, resolved: impl IntoIterator<Item = SocketAddr>) -> Result<Vec<SocketAddr>, String> {
        let mut refused = None;
        let ok: Vec<SocketAddr> = resolved
            .into_iter()
            .filter(|a| match self.refusal(a.ip()) {
                None => true,
                Some(why) => {
                    refused = Some((a.ip(), why));
                    false
                }
            })
            .collect();
        match (ok.is_empty(), refused) {
            (false, _) => Ok(ok),
            (true, Some((ip, why))) => Err(format!("{host} resolves to {ip}, {why}: endpoints may not reach the node unless an admin allows it (--allow-endpoint)")),
            (true, None) => Err(format!("{host} has no address")),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_node_itself_is_refused_unless_an_admin_allowed_it() {
        let own: IpAddr = "10.0.0.5".parse().unwrap();
        let p = EndpointPolicy::new(&[], vec![own]).unwrap();
        for ip in ["127.0.0.1", "127.1.2.3", "169.254.169.254", "0.0.0.0", "255.255.255.255", "224.0.0.1", "::1", "fe80::1", "fd00:ec2::254", "::ffff:127.0.0.1", "::ffff:169.254.169.254", "::127.0.0.1", "10.0.0.5"] {
            assert!(p.refusal(ip.parse().unwrap()).is_some(), "{ip}");
        }
        for ip in ["10.0.0.6", "192.168.1.10", "198.51.100.10", "2001:db8::1"] {
            assert_eq!(p.refusal(ip.parse().unwrap()), None, "{ip}: private services are what connectors are for");
        }
        let admin = EndpointPolicy::new(&["127.0.0.0/8".into(), "169.254.170.2".into()], vec![own]).unwrap();
        assert_eq!(admin.refusal("127.0.0.1".parse().unwrap()), None);
        assert_eq!(admin.refusal("169.254.170.2".parse().unwrap()), None);
        assert!(admin.refusal("169.254.169.254".parse().unwrap()).is_some());
        assert!(EndpointPolicy::new(&["nonsense".into()], vec![]).is_err());
        assert!(EndpointPolicy::new(&["10.0.0.0/33".into()], vec![]).is_err());
    }

    #[test]
    fn a_name_keeps_only_its_permitted_addresses() {
        let p = EndpointPolicy::new(&[], vec![]).unwrap();
        let a = |s: &str| -> SocketAddr { s.parse().unwrap() };
        assert_eq!(p.permitted("db", [a("127.0.0.1:5432"), a("10.1.2.3:5432")]).unwrap(), vec![a("10.1.2.3:5432")]);
        let e = p.permitted("rebind.test", [a("169.254.169.254:80")]).unwrap_err();
        assert!(e.contains("169.254.169.254") && e.contains("--allow-endpoint"), "{e}");
        assert!(p.permitted("nothing", []).is_err());
    }
}
