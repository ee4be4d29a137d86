//! Egress allowlists (pure): which destinations an `Unrestricted` sandbox may
//! reach, how an ApiKey may narrow them, and the ranges no policy can open.
//!
//! A rule names a DNS name (`api.example.com`), a suffix wildcard
//! (`*.pypi-mirror.internal`, matching names *below* the suffix) or an IPv4
//! CIDR (`198.51.100.0/24`), with TCP/UDP ports (empty: any port).

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

use serde::{Deserialize, Serialize};

/// Rules in one allowlist, at most.
pub const MAX_RULES: usize = 64;
/// Ports in one rule, at most.
pub const MAX_PORTS: usize = 16;

/// One allowed destination, as written in a manifest or a request.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(deny_unknown_fields)]
pub struct EgressRule {
    /// A DNS name (`api.example.com`), `*.` + a suffix (names below it), or
    /// an IPv4 CIDR (`198.51.100.0/24`).
    #[cfg_attr(feature = "schema", schemars(length(min = 1, max = 253)))]
    pub host: String,
    /// TCP/UDP ports (default: any port).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[cfg_attr(feature = "schema", schemars(length(max = 16)))]
    pub ports: Vec<u16>,
}

/// The egress section of a Sandbox or ApiKey.
#[derive(Debug, Clone, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(deny_unknown_fields)]
pub struct Egress {
    /// The only destinations reachable (with `network: Unrestricted`);
    /// private, link-local and metadata ranges stay unreachable whatever
    /// this says (Connectors reach private services).
    #[cfg_attr(feature = "schema", schemars(length(min = 1, max = 64)))]
    pub allow: Vec<EgressRule>,
}

/// What a rule's `host` designates.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum Target {
    /// Exactly this name (lower case, no trailing dot).
    Name(String),
    /// Any name below this suffix (`*.example.com` → `example.com`).
    Below(String),
    /// An IPv4 network (address already masked).
    Cidr(Ipv4Addr, u8),
}

/// A checked rule.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Rule {
    /// Destination.
    pub target: Target,
    /// Ports, sorted and unique; empty means any.
    pub ports: Vec<u16>,
}

impl Rule {
    /// Checks one rule.
    pub fn parse(rule: &EgressRule) -> Result<Rule, String> {
        let host = rule.host.trim();
        let target = parse_target(host).map_err(|e| format!("{host:?}: {e}"))?;
        if rule.ports.len() > MAX_PORTS {
            return Err(format!("{host:?}: at most {MAX_PORTS} ports"));
        }
        if rule.ports.contains(&0) {
            return Err(format!("{host:?}: port 0 is not a port"));
        }
        let mut ports = rule.ports.clone();
        ports.sort_unstable();
        ports.dedup();
        Ok(Rule { target, ports })
    }

    /// Back to the manifest form.
    pub fn to_wire(&self) -> EgressRule {
        let host = match &self.target {
            Target::Name(n) => n.clone(),
            Target::Below(s) => format!("*.{s}"),
            Target::Cidr(a, p) => format!("{a}/{p}"),
        };
        EgressRule { host, ports: self.ports.clone() }
    }

    /// Whether this rule allows `port` (`None`: any port is asked for).
    fn allows_ports(&self, ports: &[u16]) -> bool {
        self.ports.is_empty() || (!ports.is_empty() && ports.iter().all(|p| self.ports.contains(p)))
    }

    /// Whether everything `narrower` allows, this rule allows too.
    pub fn covers(&self, narrower: &Rule) -> bool {
        let target = match (&self.target, &narrower.target) {
            (Target::Name(a), Target::Name(b)) => a == b,
            (Target::Below(s), Target::Name(n)) => is_below(n, s),
            (Target::Below(s), Target::Below(t)) => s == t || is_below(t, s),
            (Target::Cidr(a, p), Target::Cidr(b, q)) => q >= p && mask(*b, *p) == *a,
            _ => false,
        };
        target && self.allows_ports(&narrower.ports)
    }

    /// Whether this rule allows the DNS name `name` (lower case).
    pub fn matches_name(&self, name: &str) -> bool {
        match &self.target {
            Target::Name(n) => n == name,
            Target::Below(s) => is_below(name, s),
            Target::Cidr(..) => false,
        }
    }
}

/// Checks a whole allowlist.
pub fn parse_rules(rules: &[EgressRule]) -> Result<Vec<Rule>, String> {
    if rules.len() > MAX_RULES {
        return Err(format!("at most {MAX_RULES} rules"));
    }
    rules.iter().map(Rule::parse).collect()
}

/// The allowlist after a narrower scope (an ApiKey) chose `narrower`: each
/// of its rules must be covered by one of `wider`'s (`None`: no allowlist,
/// anything public).
pub fn narrow(wider: Option<&[Rule]>, narrower: Option<&[Rule]>) -> Result<Option<Vec<Rule>>, String> {
    match (wider, narrower) {
        (w, None) => Ok(w.map(<[Rule]>::to_vec)),
        (None, Some(n)) => Ok(Some(n.to_vec())),
        (Some(w), Some(n)) => match n.iter().find(|r| !w.iter().any(|o| o.covers(r))) {
            Some(extra) => Err(format!("{:?} is not within the Sandbox's egress allowlist", extra.to_wire().host)),
            None => Ok(Some(n.to_vec())),
        },
    }
}

fn is_below(name: &str, suffix: &str) -> bool {
    name.len() > suffix.len() + 1 && name.ends_with(suffix) && name.as_bytes()[name.len() - suffix.len() - 1] == b'.'
}

fn mask(a: Ipv4Addr, prefix: u8) -> Ipv4Addr {
    let bits = if prefix == 0 { 0 } else { u32::MAX << (32 - u32::from(prefix)) };
    Ipv4Addr::from(u32::from(a) & bits)
}

fn parse_target(host: &str) -> Result<Target, String> {
    if let Some((addr, prefix)) = host.split_once('/') {
        let addr: Ipv4Addr = addr.parse().map_err(|_| "not an IPv4 CIDR (IPv6 egress is not offered)".to_string())?;
        let prefix: u8 = prefix.parse().ok().filter(|p| *p <= 32).ok_or("prefix must be 0–32")?;
        if mask(addr, prefix) != addr {
            return Err(format!("host bits set; did you mean {}/{prefix}?", mask(addr, prefix)));
        }
        return Ok(Target::Cidr(addr, prefix));
    }
    if let Ok(addr) = host.parse::<Ipv4Addr>() {
        return Ok(Target::Cidr(addr, 32));
    }
    if host.parse::<Ipv6Addr>().is_ok() || host.starts_with('[') {
        return Err("IPv6 egress is not offered".into());
    }
    let (below, name) = match host.strip_prefix("*.") {
        Some(rest) => (true, rest),
        None => (false, host),
    };
    let name = name.strip_suffix('.').unwrap_or(name).to_ascii_lowercase();
    check_dns_name(&name)?;
    if below && !name.contains('.') {
        return Err("a wildcard needs at least two labels after `*.`".into());
    }
    Ok(if below { Target::Below(name) } else { Target::Name(name) })
}

fn check_dns_name(name: &str) -> Result<(), String> {
    if name.is_empty() || name.len() > 253 {
        return Err("a DNS name is 1–253 characters".into());
    }
    for label in name.split('.') {
        let ok = !label.is_empty()
            && label.len() <= 63
            && label.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_')
            && !label.starts_with('-')
            && !label.ends_with('-');
        if !ok {
            return Err(format!("label {label:?} is not a DNS label (letters, digits, '-', '_'; 1–63; `*` only as `*.suffix`)"));
        }
    }
    if name.rsplit('.').next().is_some_and(|tld| tld.bytes().all(|b| b.is_ascii_digit())) {
        return Err("looks like an IP address; write it as a CIDR".into());
    }
    Ok(())
}

/// IPv4 ranges no policy can open: "this network", private (RFC 1918),
/// shared (100.64/10), loopback, link-local and metadata, IETF protocol
/// assignments, benchmarking (198.18/15), multicast and reserved.
pub const FORBIDDEN_V4: &[(Ipv4Addr, u8)] = &[
    (Ipv4Addr::new(0, 0, 0, 0), 8),
    (Ipv4Addr::new(10, 0, 0, 0), 8),
    (Ipv4Addr::new(100, 64, 0, 0), 10),
    (Ipv4Addr::new(127, 0, 0, 0), 8),
    (Ipv4Addr::new(169, 254, 0, 0), 16),
    (Ipv4Addr::new(172, 16, 0, 0), 12),
    (Ipv4Addr::new(192, 0, 0, 0), 24),
    (Ipv4Addr::new(192, 168, 0, 0), 16),
    (Ipv4Addr::new(198, 18, 0, 0), 15),
    (Ipv4Addr::new(224, 0, 0, 0), 3),
];

/// IPv6 ranges no policy can open (the sandbox has no IPv6 route at all;
/// these are dropped again at the node): loopback, unspecified, mapped and
/// translated IPv4 (NAT64, the local-use 64:ff9b:1::/48 too), the IPv4
/// tunnels whose addresses embed any IPv4 address (6to4 2002::/16, Teredo
/// 2001::/32), ULA (which holds fd00:ec2::254), link-local, multicast.
pub const FORBIDDEN_V6: &[(Ipv6Addr, u8)] = &[
    (Ipv6Addr::new(0, 0, 0, 0, 0, 0, 0, 0), 96),
    (Ipv6Addr::new(0, 0, 0, 0, 0, 0xffff, 0, 0), 96),
    (Ipv6Addr::new(0x64, 0xff9b, 0, 0, 0, 0, 0, 0), 96),
    (Ipv6Addr::new(0x64, 0xff9b, 1, 0, 0, 0, 0, 0), 48),
    (Ipv6Addr::new(0x2002, 0, 0, 0, 0, 0, 0, 0), 16),
    (Ipv6Addr::new(0x2001, 0, 0, 0, 0, 0, 0, 0), 32),
    (Ipv6Addr::new(0xfc00, 0, 0, 0, 0, 0, 0, 0), 7),
    (Ipv6Addr::new(0xfe80, 0, 0, 0, 0, 0, 0, 0), 10),
    (Ipv6Addr::new(0xff00, 0, 0, 0, 0, 0, 0, 0), 8),
];

/// Whether `ip` lies in a range no sandbox may reach.
pub fn is_forbidden(ip: IpAddr) -> bool {
    match ip {
        IpAddr::V4(a) => FORBIDDEN_V4.iter().any(|(net, p)| mask(a, *p) == *net),
        IpAddr::V6(a) => {
            if let Some(v4) = a.to_ipv4_mapped() {
                return is_forbidden(IpAddr::V4(v4));
            }
            FORBIDDEN_V6.iter().any(|(net, p)| {
                let bits = if *p == 0 { 0 } else { u128::MAX << (128 - u32::from(*p)) };
                u128::from(a) & bits == u128::from(*net)
            })
        }
    }
}

/// Whether a CIDR lies wholly inside a forbidden range (a rule naming it
/// could never reach anything; one merely overlapping, such as 0.0.0.0/0,
/// reaches its public part).
pub fn cidr_is_forbidden(addr: Ipv4Addr, prefix: u8) -> bool {
    FORBIDDEN_V4.iter().any(|(net, p)| *p <= prefix && mask(addr, *p) == *net)
}

/// Checks an allowlist as a manifest states it: syntax, bounds, and no
/// rule that could only ever name forbidden addresses.
pub fn check_manifest_rules(rules: &[EgressRule]) -> Result<Vec<Rule>, String> {
    if rules.is_empty() {
        return Err("allow must list at least one destination (omit egress to allow every public one)".into());
    }
    let parsed = parse_rules(rules)?;
    for r in &parsed {
        if let Target::Cidr(a, p) = r.target {
            if cidr_is_forbidden(a, p) {
                return Err(format!("{a}/{p} is a private, link-local or reserved range that no sandbox may reach; reach private services through a Connector"));
            }
        }
    }
    Ok(parsed)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rule(host: &str, ports: &[u16]) -> Rule {
        Rule::parse(&EgressRule { host: host.into(), ports: ports.to_vec() }).unwrap()
    }

    #[test]
    fn hosts_parse_into_names_wildcards_and_cidrs() {
        assert_eq!(rule("API.Example.com.", &[]).target, Target::Name("api.example.com".into()));
        assert_eq!(rule("*.pypi-mirror.internal", &[]).target, Target::Below("pypi-mirror.internal".into()));
        assert_eq!(rule("198.51.100.0/24", &[]).target, Target::Cidr(Ipv4Addr::new(198, 51, 100, 0), 24));
        assert_eq!(rule("198.51.100.7", &[443, 80, 443]), Rule { target: Target::Cidr(Ipv4Addr::new(198, 51, 100, 7), 32), ports: vec![80, 443] });
        for bad in ["", "*", "*.com", "a..b", "-a.com", "a*.com", "198.51.100.1/24", "10.0.0.0/33", "::1", "fd00::/8", "[::1]", "1.2.3", "a b.com", "x.*.com"] {
            assert!(Rule::parse(&EgressRule { host: bad.into(), ports: vec![] }).is_err(), "{bad:?} should be refused");
        }
        assert!(Rule::parse(&EgressRule { host: "a.com".into(), ports: vec![0] }).is_err());
        assert!(Rule::parse(&EgressRule { host: "a.com".into(), ports: (1..=17).collect() }).is_err());
    }

    #[test]
    fn wildcards_match_names_below_the_suffix_only() {
        let r = rule("*.example.com", &[]);
        assert!(r.matches_name("api.example.com") && r.matches_name("a.b.example.com"));
        assert!(!r.matches_name("example.com") && !r.matches_name("badexample.com") && !r.matches_name("example.com.evil.org"));
        assert!(rule("example.com", &[]).matches_name("example.com"));
        assert!(!rule("example.com", &[]).matches_name("api.example.com"));
    }

    #[test]
    fn a_key_may_only_narrow_the_allowlist() {
        let sandbox = vec![rule("*.example.com", &[443]), rule("198.51.100.0/24", &[])];
        let ok = |key: Vec<Rule>| narrow(Some(&sandbox), Some(&key));
        assert!(ok(vec![rule("api.example.com", &[443])]).is_ok());
        assert!(ok(vec![rule("*.eu.example.com", &[443])]).is_ok());
        assert!(ok(vec![rule("198.51.100.128/25", &[22])]).is_ok());
        assert!(ok(vec![rule("api.example.com", &[])]).is_err(), "any port widens 443");
        assert!(ok(vec![rule("api.example.com", &[80])]).is_err());
        assert!(ok(vec![rule("example.com", &[443])]).is_err(), "the suffix itself is not below it");
        assert!(ok(vec![rule("198.51.0.0/16", &[])]).is_err());
        assert!(ok(vec![rule("*.example.com", &[443]), rule("evil.org", &[443])]).is_err());
        // No allowlist means anything public: a key may introduce one; no key keeps the Sandbox's.
        assert_eq!(narrow(None, Some(&sandbox)).unwrap(), Some(sandbox.clone()));
        assert_eq!(narrow(Some(&sandbox), None).unwrap(), Some(sandbox.clone()));
        assert_eq!(narrow(None, None).unwrap(), None);
    }

    #[test]
    fn private_link_local_metadata_and_local_ranges_are_forbidden() {
        for ip in ["10.200.0.10", "172.20.1.1", "192.168.1.1", "100.64.0.1", "127.0.0.1", "169.254.169.254", "198.18.0.1", "0.0.0.0", "224.0.0.1", "255.255.255.255"] {
            assert!(is_forbidden(ip.parse().unwrap()), "{ip}");
        }
        for ip in ["::1", "fd00:ec2::254", "fe80::1", "::ffff:10.0.0.1", "64:ff9b::a00:1", "64:ff9b:1::a9fe:a9fe", "2002:a9fe:a9fe::1", "2001:0:4136:e378:8000:63bf:3fff:fdd2", "ff02::1"] {
            assert!(is_forbidden(ip.parse().unwrap()), "{ip}");
        }
        for ip in ["198.51.100.10", "8.8.8.8", "100.128.0.1", "2001:db8::1", "::ffff:198.51.100.10"] {
            assert!(!is_forbidden(ip.parse().unwrap()), "{ip}");
        }
        assert!(cidr_is_forbidden(Ipv4Addr::new(10, 1, 0, 0), 16));
        assert!(cidr_is_forbidden(Ipv4Addr::new(169, 254, 169, 254), 32));
        assert!(!cidr_is_forbidden(Ipv4Addr::new(0, 0, 0, 0), 0), "overlapping is fine: its public part is reachable");
        assert!(!cidr_is_forbidden(Ipv4Addr::new(198, 51, 100, 0), 24));
        let rule = |h: &str| EgressRule { host: h.into(), ports: vec![] };
        assert!(check_manifest_rules(&[rule("10.0.0.0/8")]).unwrap_err().contains("Connector"));
        assert!(check_manifest_rules(&[]).is_err());
        assert_eq!(check_manifest_rules(&[rule("0.0.0.0/0"), rule("a.test")]).unwrap().len(), 2);
    }
}
