//! The nftables side (scripts are built purely; [`run`] hands one batch to
//! `nft`, which applies it atomically).
//!
//! The node table jumps from a sandbox's interface to its own chain through
//! a verdict map, so an interface without a chain (being set up, or torn
//! down) matches nothing and falls to the final drop: default-deny.

use std::fmt::Write as _;
use std::io;
use std::net::Ipv4Addr;
use std::process::Stdio;

use tokio::io::AsyncWriteExt;
use warren_core::egress::{Rule, Target, FORBIDDEN_V4};

use crate::policy::NetPolicy;

/// Which table and interfaces belong to one agent: `inet warren_<prefix>`
/// and veths named `<prefix><slot>` (one agent per node in production;
/// tests run several side by side, each with its own prefix).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Scope {
    /// `inet warren_<prefix>`.
    pub table: String,
    /// Interface name prefix.
    pub prefix: String,
    /// NFLOG group refused packets are logged to.
    pub group: u16,
}

impl Scope {
    /// The scope of `prefix`: 1–6 lower-case letters and digits, starting
    /// with a letter (interface names are at most 15 bytes).
    pub fn new(prefix: &str) -> Option<Scope> {
        let ok = (1..=6).contains(&prefix.len())
            && prefix.starts_with(|c: char| c.is_ascii_lowercase())
            && prefix.bytes().all(|b| b.is_ascii_lowercase() || b.is_ascii_digit());
        ok.then(|| Scope { table: format!("inet warren_{prefix}"), prefix: prefix.to_string(), group: crate::nflog::group_of(prefix) })
    }
}
/// Refused packets logged per sandbox and second, at most (a flood is
/// refused all the same, just not all reported).
const LOG_RATE: u32 = 200;
/// How a refused packet is answered: "administratively prohibited", so a
/// connect fails at once (EHOSTUNREACH) instead of timing out.
const REJECT: &str = "reject with icmpx admin-prohibited";

/// The node table, replacing any previous one (and with it anything a
/// crashed agent left behind). `sandbox_net` is the range sandbox addresses
/// come from (masqueraded on the way out).
///
/// Established traffic is accepted without the sandbox's chain only when
/// its connection carries the mark of the sandbox now on the interface
/// (`flows`): a slot's next occupant, whose address and interface name are
/// the same, never inherits its predecessor's connections (their entries
/// stay in conntrack until they time out) in either direction.
pub fn node_table(scope: &Scope, sandbox_net: (Ipv4Addr, u8)) -> String {
    let (table, if_prefix) = (&scope.table, &scope.prefix);
    let forbidden: Vec<String> = FORBIDDEN_V4.iter().map(|(a, p)| format!("{a}/{p}")).collect();
    let (net, prefix) = sandbox_net;
    format!(
        r#"add table {table}
delete table {table}
table {table} {{
  set forbidden4 {{ type ipv4_addr; flags interval; elements = {{ {forbidden} }}; }}
  map sandboxes {{ type ifname : verdict; }}
  set flows {{ type ifname . mark; }}
  chain input {{
    type filter hook input priority filter - 5; policy accept;
    iifname "{if_prefix}*" drop
  }}
  chain forward {{
    type filter hook forward priority filter - 5; policy accept;
    oifname "{if_prefix}*" ct state established,related oifname . ct mark @flows accept
    oifname "{if_prefix}*" drop
    iifname "{if_prefix}*" jump from_sandbox
  }}
  chain from_sandbox {{
    meta nfproto ipv6 drop
    fib daddr type {{ local, broadcast, multicast }} drop
    ct state established,related iifname . ct mark @flows accept
    iifname vmap @sandboxes
    drop
  }}
  chain postrouting {{
    type nat hook postrouting priority srcnat; policy accept;
    ip saddr {net}/{prefix} oifname != "{if_prefix}*" masquerade
  }}
}}
"#,
        forbidden = forbidden.join(", ")
    )
}

/// Removes the node table (agent shutdown).
pub fn drop_node_table(scope: &Scope) -> String {
    let table = &scope.table;
    format!("add table {table}\ndelete table {table}\n")
}

/// Names of one sandbox's chain and sets.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SandboxNames {
    /// Node end of the veth.
    pub ifname: String,
    /// The agent's table.
    pub table: String,
    group: u16,
    n: usize,
    /// Conntrack mark of this sandbox's connections: unique per sandbox
    /// (not per slot), so nothing of a slot's earlier occupant matches it.
    pub mark: u32,
}

impl SandboxNames {
    /// Names for slot `n`, holding the sandbox whose connections carry `mark`.
    pub fn new(scope: &Scope, n: usize, mark: u32) -> SandboxNames {
        SandboxNames { ifname: format!("{}{n}", scope.prefix), table: scope.table.clone(), group: scope.group, n, mark }
    }

    /// The table's name without its family (`warren_<prefix>`).
    pub fn bare_table(&self) -> &str {
        self.table.strip_prefix("inet ").unwrap_or(&self.table)
    }
}

/// The chain, sets and map entry of one sandbox. Anything of the same slot
/// that a setup interrupted half-way left behind is emptied first: a
/// sandbox never inherits another's rules or allowed addresses.
pub fn sandbox_rules(names: &SandboxNames, policy: &NetPolicy) -> String {
    let (n, table) = (names.n, &names.table);
    // What the chain lets through becomes this sandbox's connection.
    let accept = format!("ct mark set {:#x} accept", names.mark);
    let mut s = String::new();
    let _ = writeln!(s, "add chain {table} sbx_{n}\nflush chain {table} sbx_{n}");
    // queue-threshold 1: the kernel sends each refused packet at once (the
    // instance setting alone is not honoured by nft's log), so a call's
    // refusals are queued before its program even sees the error.
    let count = format!("meta l4proto {{ tcp, udp }} limit rate {LOG_RATE}/second burst {LOG_RATE} packets log group {} snaplen {} queue-threshold 1", names.group, crate::nflog::SNAPLEN);
    let _ = writeln!(s, "add rule {table} sbx_{n} ip daddr @forbidden4 {count}");
    let _ = writeln!(s, "add rule {table} sbx_{n} ip daddr @forbidden4 {REJECT}");
    match &policy.allow {
        None => {
            let _ = writeln!(s, "add rule {table} sbx_{n} {accept}");
        }
        Some(rules) => {
            let (any, ported) = static_elements(rules);
            for (set, spec) in [
                ("any", "type ipv4_addr; flags interval;"),
                ("port", "type ipv4_addr . inet_service; flags interval;"),
                ("dany", "type ipv4_addr; size 65536;"),
                ("dport", "type ipv4_addr . inet_service; size 65536;"),
            ] {
                let _ = writeln!(s, "add set {table} {set}_{n} {{ {spec} }}\nflush set {table} {set}_{n}");
            }
            if !any.is_empty() {
                let _ = writeln!(s, "add element {table} any_{n} {{ {} }}", any.join(", "));
            }
            if !ported.is_empty() {
                let _ = writeln!(s, "add element {table} port_{n} {{ {} }}", ported.join(", "));
            }
            let _ = writeln!(s, "add rule {table} sbx_{n} ip daddr @any_{n} {accept}");
            let _ = writeln!(s, "add rule {table} sbx_{n} ip daddr @dany_{n} {accept}");
            let _ = writeln!(s, "add rule {table} sbx_{n} meta l4proto {{ tcp, udp }} ip daddr . th dport @port_{n} {accept}");
            let _ = writeln!(s, "add rule {table} sbx_{n} meta l4proto {{ tcp, udp }} ip daddr . th dport @dport_{n} {accept}");
            let _ = writeln!(s, "add rule {table} sbx_{n} {count}");
            let _ = writeln!(s, "add rule {table} sbx_{n} {REJECT}");
        }
    }
    let _ = writeln!(s, "add element {table} flows {{ \"{}\" . {:#x} }}", names.ifname, names.mark);
    let _ = writeln!(s, "add element {table} sandboxes {{ \"{}\" : goto sbx_{n} }}", names.ifname);
    s
}

/// Where what the DNS proxy resolved for a name under `rule` goes: the
/// set's name (in the bare table [`SandboxNames::bare_table`]) and its
/// element keys (see [`crate::setelem`]).
pub fn resolved_elements(names: &SandboxNames, rule: &Rule, ips: &[Ipv4Addr]) -> (String, Vec<Vec<u8>>) {
    let n = names.n;
    if rule.ports.is_empty() {
        (format!("dany_{n}"), ips.iter().map(|ip| crate::setelem::key(*ip, None)).collect())
    } else {
        (format!("dport_{n}"), ips.iter().flat_map(|ip| rule.ports.iter().map(move |p| crate::setelem::key(*ip, Some(*p)))).collect())
    }
}

/// Removes everything of one sandbox (each command on its own, so a
/// missing piece does not keep the rest).
pub fn sandbox_teardown(names: &SandboxNames) -> Vec<String> {
    let (n, table) = (names.n, &names.table);
    let mut v = vec![
        format!("delete element {table} sandboxes {{ \"{}\" }}\n", names.ifname),
        format!("delete element {table} flows {{ \"{}\" . {:#x} }}\n", names.ifname, names.mark),
        format!("flush chain {table} sbx_{n}\ndelete chain {table} sbx_{n}\n"),
    ];
    v.extend(["any", "port", "dany", "dport"].iter().map(|set| format!("delete set {table} {set}_{n}\n")));
    v
}

/// CIDR rules as set elements: any-port networks, and network . port pairs.
/// Nested networks are collapsed into the wider one (interval sets refuse
/// overlapping elements).
fn static_elements(rules: &[Rule]) -> (Vec<String>, Vec<String>) {
    let cidrs = |with_port: Option<u16>| -> Vec<(Ipv4Addr, u8)> {
        let nets: Vec<(Ipv4Addr, u8)> = rules
            .iter()
            .filter(|r| match with_port {
                None => r.ports.is_empty(),
                Some(p) => r.ports.contains(&p),
            })
            .filter_map(|r| match r.target {
                Target::Cidr(a, p) => Some((a, p)),
                _ => None,
            })
            .collect();
        collapse(nets)
    };
    let any = cidrs(None).iter().map(|(a, p)| format!("{a}/{p}")).collect();
    let mut ports: Vec<u16> = rules.iter().filter(|r| matches!(r.target, Target::Cidr(..))).flat_map(|r| r.ports.iter().copied()).collect();
    ports.sort_unstable();
    ports.dedup();
    let ported = ports.iter().flat_map(|port| cidrs(Some(*port)).into_iter().map(move |(a, p)| format!("{a}/{p} . {port}"))).collect();
    (any, ported)
}

fn contains(outer: (Ipv4Addr, u8), inner: (Ipv4Addr, u8)) -> bool {
    let bits = if outer.1 == 0 { 0 } else { u32::MAX << (32 - u32::from(outer.1)) };
    inner.1 >= outer.1 && u32::from(inner.0) & bits == u32::from(outer.0)
}

fn collapse(mut nets: Vec<(Ipv4Addr, u8)>) -> Vec<(Ipv4Addr, u8)> {
    nets.sort_by_key(|(a, p)| (*p, *a));
    nets.dedup();
    let mut kept: Vec<(Ipv4Addr, u8)> = Vec::new();
    for net in nets {
        if !kept.iter().any(|k| contains(*k, net)) {
            kept.push(net);
        }
    }
    kept
}

/// Applies one script with `nft -f -`; its stdout is returned.
pub async fn run(script: &str, args: &[&str]) -> io::Result<Vec<u8>> {
    let mut cmd = tokio::process::Command::new("nft");
    cmd.args(args).stdin(Stdio::piped()).stdout(Stdio::piped()).stderr(Stdio::piped()).kill_on_drop(true);
    let mut child = cmd.spawn()?;
    if let Some(mut stdin) = child.stdin.take() {
        stdin.write_all(script.as_bytes()).await?;
    }
    let out = child.wait_with_output().await?;
    if out.status.success() {
        Ok(out.stdout)
    } else {
        Err(io::Error::other(format!("nft: {}", String::from_utf8_lossy(&out.stderr).trim())))
    }
}

#[cfg(test)]
mod tests {
    use warren_core::egress::EgressRule;

    use super::*;

    fn scope() -> Scope {
        Scope::new("wrn").unwrap()
    }

    fn rules(hosts: &[(&str, &[u16])]) -> Vec<Rule> {
        hosts.iter().map(|(h, p)| Rule::parse(&EgressRule { host: h.to_string(), ports: p.to_vec() }).unwrap()).collect()
    }

    #[test]
    fn node_table_refuses_forbidden_and_masquerades_the_sandbox_range() {
        let t = node_table(&scope(), (Ipv4Addr::new(100, 127, 0, 0), 16));
        assert!(t.contains("10.0.0.0/8") && t.contains("169.254.0.0/16") && t.contains("100.64.0.0/10"));
        assert!(t.contains("ip saddr 100.127.0.0/16 oifname != \"wrn*\" masquerade"));
        assert!(t.contains("iifname \"wrn*\" drop"), "sandboxes never reach the node itself");
        assert!(t.starts_with("add table inet warren_wrn\ndelete table inet warren_wrn\n"), "replaces leftovers");
    }

    #[test]
    fn scopes_keep_interface_names_short() {
        assert_eq!(Scope::new("wrn").unwrap().table, "inet warren_wrn");
        for bad in ["", "1ab", "toolong", "a-b", "Wrn"] {
            assert!(Scope::new(bad).is_none(), "{bad:?}");
        }
    }

    #[test]
    fn unrestricted_accepts_after_the_forbidden_check() {
        let s = sandbox_rules(&SandboxNames::new(&scope(), 3, 0x2a), &NetPolicy::new(None, 1000));
        let forbidden = s.find("@forbidden4 reject").unwrap();
        assert!(s.find("sbx_3 ct mark set 0x2a accept").unwrap() > forbidden, "{s}");
        assert!(s.contains("\"wrn3\" : goto sbx_3"));
        assert!(s.starts_with("add chain inet warren_wrn sbx_3\nflush chain inet warren_wrn sbx_3\n"), "leftovers of the slot are emptied first");
        assert!(!s.contains("any_3"));
    }

    #[test]
    fn established_traffic_must_carry_the_mark_of_the_sandbox_now_in_the_slot() {
        let t = node_table(&scope(), (Ipv4Addr::new(100, 127, 0, 0), 16));
        assert!(!t.contains("ct state established,related accept"), "no connection is accepted for its state alone: {t}");
        assert!(t.contains("oifname \"wrn*\" ct state established,related oifname . ct mark @flows accept"));
        assert!(t.contains("ct state established,related iifname . ct mark @flows accept"));
        let names = SandboxNames::new(&scope(), 3, 0x2a);
        let r = sandbox_rules(&names, &NetPolicy::new(Some(rules(&[("a.test", &[443]), ("198.51.100.0/24", &[])])), 1000));
        assert!(r.contains("add element inet warren_wrn flows { \"wrn3\" . 0x2a }"));
        assert!(r.lines().filter(|l| l.ends_with("accept")).all(|l| l.ends_with("ct mark set 0x2a accept")), "{r}");
        assert!(sandbox_teardown(&names).concat().contains("delete element inet warren_wrn flows { \"wrn3\" . 0x2a }"));
    }

    #[test]
    fn allowlists_become_collapsed_sets_and_a_final_reject() {
        let r = rules(&[("198.51.100.0/24", &[]), ("198.51.100.128/25", &[]), ("203.0.113.0/24", &[443, 80]), ("203.0.113.7", &[443]), ("api.example.com", &[])]);
        let s = sandbox_rules(&SandboxNames::new(&scope(), 0, 1), &NetPolicy::new(Some(r), 1000));
        assert!(s.contains("add element inet warren_wrn any_0 { 198.51.100.0/24 }"), "{s}");
        assert!(s.contains("add element inet warren_wrn port_0 { 203.0.113.0/24 . 80, 203.0.113.0/24 . 443 }"), "{s}");
        assert!(s.trim_end().lines().rev().nth(2).unwrap().ends_with(REJECT), "{s}");
    }

    #[test]
    fn resolved_addresses_go_to_the_rules_ports() {
        let names = SandboxNames::new(&scope(), 7, 1);
        let ips = [Ipv4Addr::new(198, 51, 100, 10), Ipv4Addr::new(198, 51, 100, 11)];
        let any = &rules(&[("a.test", &[])])[0];
        assert_eq!(names.bare_table(), "warren_wrn");
        assert_eq!(resolved_elements(&names, any, &ips), ("dany_7".to_string(), vec![vec![198, 51, 100, 10], vec![198, 51, 100, 11]]));
        let ported = &rules(&[("a.test", &[443, 8443])])[0];
        let (set, keys) = resolved_elements(&names, ported, &ips[..1]);
        assert_eq!((set.as_str(), keys.len()), ("dport_7", 2));
        assert_eq!(keys[1], crate::setelem::key(ips[0], Some(8443)));
    }

}
