use std::fmt::Write as _;
use std::process::{Command, Stdio};

use warren_core::egress::EgressRule;

use super::*;
use crate::nft::Scope;

fn rules(hosts: &[(&str, &[u16])]) -> Vec<Rule> {
    hosts.iter().map(|(h, p)| Rule::parse(&EgressRule { host: h.to_string(), ports: p.to_vec() }).unwrap()).collect()
}

fn names(prefix: &str, n: usize, mark: u32) -> SandboxNames {
    SandboxNames::new(&Scope::new(prefix).unwrap(), n, mark)
}

/// The same chain and sets written as an `nft` script: what the batch must
/// build, element for element (the kernel test compares both).
fn oracle(names: &SandboxNames, policy: &NetPolicy) -> String {
    let (n, table) = (names.n, &names.table);
    let accept = format!("ct mark set {:#x} accept", names.mark);
    let mut s = String::new();
    let _ = writeln!(s, "add chain {table} sbx_{n}\nflush chain {table} sbx_{n}");
    let log = format!("limit rate 200/second burst 200 packets log group {} snaplen {} queue-threshold 1", names.group, crate::nflog::SNAPLEN);
    let _ = writeln!(s, "add rule {table} sbx_{n} ip daddr @forbidden4 meta l4proto @l4 {log}");
    let _ = writeln!(s, "add rule {table} sbx_{n} ip daddr @forbidden4 reject with icmpx admin-prohibited");
    match &policy.allow {
        None => {
            let _ = writeln!(s, "add rule {table} sbx_{n} {accept}");
        }
        Some(rules) => {
            for (set, spec) in [
                ("any", "type ipv4_addr; flags interval;"),
                ("port", "type ipv4_addr . inet_service; flags interval;"),
                ("dany", "type ipv4_addr; size 65536;"),
                ("dport", "type ipv4_addr . inet_service; size 65536;"),
            ] {
                let _ = writeln!(s, "add set {table} {set}_{n} {{ {spec} }}\nflush set {table} {set}_{n}");
            }
            // Ranges as merged by the batch (merging is tested on its own).
            let ranges = |port: Option<u16>| -> Vec<String> {
                let picked = rules.iter().filter(|r| port.map_or(r.ports.is_empty(), |p| r.ports.contains(&p)));
                let nets = picked.filter_map(|r| match r.target {
                    Target::Cidr(a, p) => Some((a, p)),
                    _ => None,
                });
                merged(nets).iter().map(|(a, b)| format!("{}-{}", Ipv4Addr::from(*a), Ipv4Addr::from((b - 1) as u32))).collect()
            };
            let any = ranges(None);
            if !any.is_empty() {
                let _ = writeln!(s, "add element {table} any_{n} {{ {} }}", any.join(", "));
            }
            let mut ports: Vec<u16> = rules.iter().filter(|r| matches!(r.target, Target::Cidr(..))).flat_map(|r| r.ports.clone()).collect();
            ports.sort_unstable();
            ports.dedup();
            let ported: Vec<String> = ports.iter().flat_map(|p| ranges(Some(*p)).into_iter().map(move |c| format!("{c} . {p}"))).collect();
            if !ported.is_empty() {
                let _ = writeln!(s, "add element {table} port_{n} {{ {} }}", ported.join(", "));
            }
            let _ = writeln!(s, "add rule {table} sbx_{n} ip daddr @any_{n} {accept}");
            let _ = writeln!(s, "add rule {table} sbx_{n} ip daddr @dany_{n} {accept}");
            let _ = writeln!(s, "add rule {table} sbx_{n} meta l4proto @l4 ip daddr . th dport @port_{n} {accept}");
            let _ = writeln!(s, "add rule {table} sbx_{n} meta l4proto @l4 ip daddr . th dport @dport_{n} {accept}");
            let _ = writeln!(s, "add rule {table} sbx_{n} meta l4proto @l4 {log}");
            let _ = writeln!(s, "add rule {table} sbx_{n} reject with icmpx admin-prohibited");
        }
    }
    let _ = writeln!(s, "add element {table} flows {{ \"{}\" . {:#x} }}", names.ifname, names.mark);
    let _ = writeln!(s, "add element {table} sandboxes {{ \"{}\" : goto sbx_{n} }}", names.ifname);
    s
}

#[test]
fn networks_merge_when_nested_or_adjacent() {
    let net = |a: [u8; 4], p| (Ipv4Addr::from(a), p);
    let m = merged([net([198, 51, 100, 128], 25), net([198, 51, 100, 0], 24), net([10, 0, 0, 0], 25), net([10, 0, 0, 128], 25), net([10, 0, 1, 7], 32)].into_iter());
    assert_eq!(m, vec![(0x0a00_0000, 0x0a00_0100), (0x0a00_0107, 0x0a00_0108), (0xc633_6400, 0xc633_6500)]);
    assert_eq!(merged([net([0, 0, 0, 0], 0)].into_iter()), vec![(0, 1 << 32)], "the whole space ends past the last address");
    assert_eq!(merged([net([10, 1, 2, 3], 24)].into_iter()), vec![(0x0a01_0200, 0x0a01_0300)], "host bits are ignored");
}

#[test]
fn interval_elements_close_each_range_and_open_ended_ones_stay_open() {
    let (any, ported) = static_elements(&rules(&[("10.1.2.3", &[]), ("203.0.113.0/24", &[443, 80]), ("api.example.com", &[])]));
    let flags: Vec<(Vec<u8>, u32)> = any.iter().map(|e| (e.key.clone(), e.flags)).collect();
    assert_eq!(flags, vec![(vec![0, 0, 0, 0], 1), (vec![10, 1, 2, 3], 0), (vec![10, 1, 2, 4], 1)], "as nft writes them");
    assert_eq!(ported.len(), 2);
    assert_eq!(ported[0].key, key(Ipv4Addr::new(203, 0, 113, 0), Some(80)));
    assert_eq!(ported[0].key_end, Some(key(Ipv4Addr::new(203, 0, 113, 255), Some(80))), "a concatenated range's end is its last key");
    let (everything, _) = static_elements(&rules(&[("0.0.0.0/0", &[])]));
    assert_eq!(everything, vec![Elem::of(vec![0; 4])], "no closing element past the last address");
}

#[test]
fn every_message_of_a_batch_is_acknowledged_and_the_markers_are_not() {
    let mut m = Msgs::new(100);
    sandbox_batch(&mut m, &names("wrn", 3, 0x2a), &NetPolicy::new(None, 1000));
    // chain, flush, two forbidden rules, accept, flows, map entry.
    assert_eq!(m.next_seq() - 100, 9);
    let b = m.bytes();
    assert_eq!(u16::from_ne_bytes([b[4], b[5]]), NFNL_MSG_BATCH_BEGIN);
    let text = String::from_utf8_lossy(b);
    assert!(text.contains("warren_wrn\0") && text.contains("sbx_3\0") && !text.contains("any_3"), "Unrestricted has no sets");
}

#[test]
fn the_unrestricted_oracle_accepts_after_the_forbidden_check() {
    let s = oracle(&names("wrn", 3, 0x2a), &NetPolicy::new(None, 1000));
    let forbidden = s.find("@forbidden4 reject").unwrap();
    assert!(s.find("sbx_3 ct mark set 0x2a accept").unwrap() > forbidden, "{s}");
    assert!(s.contains("\"wrn3\" : goto sbx_3"));
    assert!(s.contains("add element inet warren_wrn flows { \"wrn3\" . 0x2a }"));
}

#[test]
fn teardown_removes_sets_only_where_an_allowlist_made_them() {
    let n = names("wrn", 3, 0x2a);
    assert_eq!(teardown_steps(&n, false), vec![Step::MapEntry, Step::Flows, Step::Chain]);
    let with = teardown_steps(&n, true);
    assert_eq!(with.len(), 7);
    assert_eq!(with[3..], ["any_3", "port_3", "dany_3", "dport_3"].map(|s| Step::Set(s.into())));
}

fn root_with_nft(test: &str) -> bool {
    let ok = nix::unistd::geteuid().is_root() && Command::new("nft").arg("--version").output().is_ok();
    if !ok {
        eprintln!("SKIPPED {test}: needs root and nft");
    }
    ok
}

fn nft(script: &str) -> Result<(), String> {
    let mut c = Command::new("nft").args(["-f", "-"]).stdin(Stdio::piped()).stderr(Stdio::piped()).spawn().map_err(|e| e.to_string())?;
    std::io::Write::write_all(c.stdin.as_mut().unwrap(), script.as_bytes()).map_err(|e| e.to_string())?;
    let out = c.wait_with_output().map_err(|e| e.to_string())?;
    if out.status.success() {
        Ok(())
    } else {
        Err(format!("{}\n{script}", String::from_utf8_lossy(&out.stderr)))
    }
}

fn listing(table: &str) -> String {
    let out = Command::new("nft").args(["list", "table", "inet", table]).output().unwrap();
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// A table with what the node table gives every sandbox chain, removed on drop.
struct Table(String);

impl Table {
    fn new(bare: &str) -> Table {
        let t = format!("inet {bare}");
        nft(&format!(
            "add table {t}\ndelete table {t}\ntable {t} {{\n set forbidden4 {{ type ipv4_addr; flags interval; elements = {{ 10.0.0.0/8 }}; }}\n set l4 {{ type inet_proto; elements = {{ tcp, udp }}; }}\n map sandboxes {{ type ifname : verdict; }}\n set flows {{ type ifname . mark; }}\n}}\n"
        ))
        .unwrap();
        Table(bare.to_string())
    }
}

impl Drop for Table {
    fn drop(&mut self) {
        let _ = nft(&format!("delete table inet {}\n", self.0));
    }
}

/// Against the kernel: the batch builds exactly what the `nft` script
/// builds (same listing), for Unrestricted and for an allowlist with
/// nested, adjacent and ported networks; teardown leaves the node's sets
/// as they were.
#[test]
fn the_kernel_holds_the_same_chain_and_sets_as_the_script_builds() {
    if !root_with_nft("the_kernel_holds_the_same_chain_and_sets_as_the_script_builds") {
        return;
    }
    let id = std::process::id() % 10_000;
    let (po, pn) = (format!("zo{id}"), format!("zn{id}"));
    let (o, n) = (Table::new(&format!("warren_{po}")), Table::new(&format!("warren_{pn}")));
    let nft_sock = Nft::open().unwrap();
    let policies = [
        NetPolicy::new(None, 1000),
        NetPolicy::new(Some(rules(&[("198.51.100.0/25", &[]), ("198.51.100.128/25", &[]), ("198.51.100.7", &[]), ("203.0.113.0/24", &[443, 80]), ("203.0.113.7", &[443]), ("api.example.com", &[8443])])), 1000),
        NetPolicy::new(Some(rules(&[("api.example.com", &[])])), 1000),
    ];
    for (slot, policy) in policies.iter().enumerate() {
        let (a, mut b) = (names(&po, slot, 0x2a + slot as u32), names(&pn, slot, 0x2a + slot as u32));
        b.group = a.group;
        nft(&oracle(&a, policy)).unwrap();
        nft_sock.apply(|m| sandbox_batch(m, &b, policy)).unwrap();
        // Again: a slot's leftovers are emptied, not doubled.
        nft_sock.apply(|m| sandbox_batch(m, &b, policy)).unwrap();
    }
    let (lo, ln) = (listing(&o.0), listing(&n.0));
    assert!(ln.contains("chain sbx_1") && ln.contains("198.51.100.0/24") && ln.contains("203.0.113.0/24 . 443"), "{ln}");
    assert_eq!(lo.replace(&po, "P"), ln.replace(&pn, "P"), "script:\n{lo}\nbatch:\n{ln}");
    for (slot, policy) in policies.iter().enumerate() {
        let b = names(&pn, slot, 0x2a + slot as u32);
        nft_sock.apply(|m| teardown_batch(m, &b, &teardown_steps(&b, policy.allow.is_some()))).unwrap();
    }
    let left = listing(&n.0);
    assert!(!left.contains("sbx_") && !left.contains("any_") && !left.contains(&format!("\"{pn}")), "{left}");
    // A missing piece fails its batch (the caller then goes step by step).
    let gone = names(&pn, 0, 0x2a);
    assert!(nft_sock.apply(|m| teardown_batch(m, &gone, &teardown_steps(&gone, false))).is_err());
}

/// Against the kernel: resolved addresses join a sandbox's sets; one
/// already there is no error, a missing set is.
#[test]
fn the_kernel_adds_resolved_addresses() {
    if !root_with_nft("the_kernel_adds_resolved_addresses") {
        return;
    }
    let table = format!("warren_t{}", std::process::id() % 100_000);
    let _t = Table::new(&table);
    nft(&format!("add set inet {table} dany {{ type ipv4_addr; size 65536; }}\nadd set inet {table} dport {{ type ipv4_addr . inet_service; size 65536; }}\n")).unwrap();
    let w = Nft::open().unwrap();
    let added = w.add(&table, "dany", &[key(Ipv4Addr::new(198, 51, 100, 10), None), key(Ipv4Addr::new(198, 51, 100, 11), None)]);
    let again = w.add(&table, "dany", &[key(Ipv4Addr::new(198, 51, 100, 10), None)]);
    let ported = w.add(&table, "dport", &[key(Ipv4Addr::new(198, 51, 100, 10), Some(443))]);
    let missing = w.add(&table, "nope", &[key(Ipv4Addr::new(198, 51, 100, 10), None)]);
    let listed = listing(&table);
    added.unwrap();
    again.expect("an element already there is no error");
    ported.unwrap();
    assert!(missing.is_err(), "a missing set is an error");
    assert!(listed.contains("198.51.100.10") && listed.contains("198.51.100.11"), "{listed}");
    assert!(listed.contains("198.51.100.10 . 443"), "{listed}");
}
