//! What a sandbox's network may do (pure) and what it was refused.

use std::collections::BTreeMap;
use std::net::IpAddr;

use warren_core::egress::Rule;

/// Bandwidth per CPU of the sandbox, each direction.
pub const BITS_PER_CPU: u64 = 200_000_000;
/// Refused destinations reported per call, at most (the exit contract's bound).
pub use warren_core::exit::MAX_BLOCKED;

/// The network of an `Unrestricted` sandbox. Equal policies share pooled
/// sandboxes, so it is part of the pool's shape.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct NetPolicy {
    /// The allowlist; `None`: every public destination.
    pub allow: Option<Vec<Rule>>,
    /// Shaping rate, bits per second, each direction.
    pub rate_bits: u64,
}

impl NetPolicy {
    /// The policy for `cpu_millis` of CPU.
    pub fn new(allow: Option<Vec<Rule>>, cpu_millis: u32) -> NetPolicy {
        NetPolicy { allow, rate_bits: BITS_PER_CPU * u64::from(cpu_millis.max(100)) / 1000 }
    }

    /// The first rule allowing the DNS name `name`, if names are restricted;
    /// `Ok(None)` when every name is.
    pub fn rule_for_name(&self, name: &str) -> Result<Option<&Rule>, ()> {
        match &self.allow {
            None => Ok(None),
            Some(rules) => rules.iter().find(|r| r.matches_name(name)).map(Some).ok_or(()),
        }
    }
}

/// One refused destination, as reported to the caller (the exit contract's).
pub use warren_core::exit::Blocked;

/// Merges what the firewall refused with what the DNS proxy refused,
/// naming addresses the proxy resolved; most frequent first, bounded.
pub fn report(mut refused: Vec<Blocked>, names: &BTreeMap<IpAddr, String>, dns_refused: &BTreeMap<String, u64>) -> Vec<Blocked> {
    for b in &mut refused {
        if let Some(ip) = b.ip {
            b.host = names.get(&ip).cloned();
        }
    }
    refused.extend(dns_refused.iter().map(|(name, count)| Blocked { host: Some(name.clone()), ip: None, port: 53, protocol: "dns".into(), count: *count }));
    refused.sort_by(|a, b| b.count.cmp(&a.count).then_with(|| a.ip.cmp(&b.ip)).then_with(|| a.host.cmp(&b.host)));
    refused.truncate(MAX_BLOCKED);
    refused
}

#[cfg(test)]
mod tests {
    use warren_core::egress::{EgressRule, Rule};

    use super::*;

    #[test]
    fn rate_follows_cpu_and_names_follow_the_allowlist() {
        assert_eq!(NetPolicy::new(None, 1000).rate_bits, 200_000_000);
        assert_eq!(NetPolicy::new(None, 500).rate_bits, 100_000_000);
        let open = NetPolicy::new(None, 1000);
        assert_eq!(open.rule_for_name("anything.org"), Ok(None));
        let rule = Rule::parse(&EgressRule { host: "*.example.com".into(), ports: vec![443] }).unwrap();
        let narrow = NetPolicy::new(Some(vec![rule.clone()]), 1000);
        assert_eq!(narrow.rule_for_name("api.example.com"), Ok(Some(&rule)));
        assert_eq!(narrow.rule_for_name("evil.org"), Err(()));
    }

    #[test]
    fn report_names_addresses_adds_dns_refusals_and_is_bounded() {
        let ip: IpAddr = "10.200.0.10".parse().unwrap();
        let fw = vec![Blocked { host: None, ip: Some(ip), port: 80, protocol: "tcp".into(), count: 2 }];
        let names = BTreeMap::from([(ip, "rebind.test".to_string())]);
        let dns = BTreeMap::from([("evil.org".to_string(), 3)]);
        let r = report(fw, &names, &dns);
        assert_eq!(r[0], Blocked { host: Some("evil.org".into()), ip: None, port: 53, protocol: "dns".into(), count: 3 });
        assert_eq!(r[1].host.as_deref(), Some("rebind.test"));
        let many: Vec<Blocked> = (0..100u16).map(|p| Blocked { host: None, ip: Some(ip), port: p, protocol: "udp".into(), count: 1 }).collect();
        assert_eq!(report(many, &BTreeMap::new(), &BTreeMap::new()).len(), MAX_BLOCKED);
    }
}
