//! The nftables side: the node table (a script [`run`] hands to `nft` at
//! agent start) and the names of each sandbox's chain and sets (built over
//! netlink: [`crate::nftnl`]).
//!
//! The node table jumps from a sandbox's interface to its own chain through
//! a verdict map, so an interface without a chain (being set up, or torn
//! down) matches nothing and falls to the final drop: default-deny.

use std::io;
use std::net::Ipv4Addr;
use std::process::Stdio;

use tokio::io::AsyncWriteExt;
use warren_core::egress::{Rule, FORBIDDEN_V4};


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
  set l4 {{ type inet_proto; elements = {{ tcp, udp }}; }}
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
    pub(crate) group: u16,
    pub(crate) n: usize,
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

/// Where what the DNS proxy resolved for a name under `rule` goes: the
/// set's name (in the bare table [`SandboxNames::bare_table`]) and its
/// element keys (see [`crate::setelem`]).
pub fn resolved_elements(names: &SandboxNames, rule: &Rule, ips: &[Ipv4Addr]) -> (String, Vec<Vec<u8>>) {
    let n = names.n;
    if rule.ports.is_empty() {
        (format!("dany_{n}"), ips.iter().map(|ip| crate::nftnl::key(*ip, None)).collect())
    } else {
        (format!("dport_{n}"), ips.iter().flat_map(|ip| rule.ports.iter().map(move |p| crate::nftnl::key(*ip, Some(*p)))).collect())
    }
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
    fn established_traffic_must_carry_the_mark_of_the_sandbox_now_in_the_slot() {
        let t = node_table(&scope(), (Ipv4Addr::new(100, 127, 0, 0), 16));
        assert!(!t.contains("ct state established,related accept"), "no connection is accepted for its state alone: {t}");
        assert!(t.contains("oifname \"wrn*\" ct state established,related oifname . ct mark @flows accept"));
        assert!(t.contains("ct state established,related iifname . ct mark @flows accept"));
        assert!(t.contains("set l4 { type inet_proto; elements = { tcp, udp }; }"), "the sandbox chains' transport check");
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
        assert_eq!(keys[1], crate::nftnl::key(ips[0], Some(8443)));
    }
}
