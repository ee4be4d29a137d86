//! One sandbox's chain, sets and map entries as an nf_tables netlink batch
//! (applied atomically, like one `nft -f` script; see [`crate::nft`] for
//! the node table they hang off). The rules, in `nft` syntax:
//!
//! ```text
//! chain sbx_N {
//!   ip daddr @forbidden4 meta l4proto @l4 limit rate 200/second burst 200 packets log group G snaplen S queue-threshold 1
//!   ip daddr @forbidden4 reject with icmpx admin-prohibited
//!   ct mark set MARK accept                                   # Unrestricted, or with an allowlist:
//!   ip daddr @any_N ct mark set MARK accept                   # its CIDRs (interval set)
//!   ip daddr @dany_N ct mark set MARK accept                  # what the DNS proxy resolved
//!   meta l4proto @l4 ip daddr . th dport @port_N ct mark set MARK accept
//!   meta l4proto @l4 ip daddr . th dport @dport_N ct mark set MARK accept
//!   meta l4proto @l4 limit rate 200/second burst 200 packets log group G snaplen S queue-threshold 1
//!   reject with icmpx admin-prohibited
//! }
//! ```

use std::io;
use std::net::Ipv4Addr;

use warren_core::egress::{Rule, Target};

use crate::netlink::{Family, Msgs, Socket, NLM_F_ACK, NLM_F_APPEND, NLM_F_CREATE};
use crate::nft::SandboxNames;
use crate::policy::NetPolicy;

const NFT: u16 = 10 << 8;
const NFNL_MSG_BATCH_BEGIN: u16 = 0x10;
const NFNL_MSG_BATCH_END: u16 = 0x11;
const NEWCHAIN: u16 = NFT | 3;
const DELCHAIN: u16 = NFT | 5;
const NEWRULE: u16 = NFT | 6;
const DELRULE: u16 = NFT | 8;
const NEWSET: u16 = NFT | 9;
const DELSET: u16 = NFT | 11;
const NEWSETELEM: u16 = NFT | 12;
const DELSETELEM: u16 = NFT | 14;
const NFPROTO_INET: u8 = 1;
const NFPROTO_IPV4: u8 = 2;
/// Batch messages carry the subsystem in `res_id` (big-endian).
const BATCH_HEADER: [u8; 4] = [0, 0, 0, 10];
const INET_HEADER: [u8; 4] = [NFPROTO_INET, 0, 0, 0];

// Attributes (linux/netfilter/nf_tables.h).
const TABLE: u16 = 1;
const CHAIN_NAME: u16 = 3;
const RULE_CHAIN: u16 = 2;
const RULE_EXPRESSIONS: u16 = 4;
const LIST_ELEM: u16 = 1;
const EXPR_NAME: u16 = 1;
const EXPR_DATA: u16 = 2;
const SET_NAME: u16 = 2;
const SET_FLAGS: u16 = 3;
const SET_KEY_TYPE: u16 = 4;
const SET_KEY_LEN: u16 = 5;
const SET_DESC: u16 = 9;
const SET_ID: u16 = 10;
const SET_DESC_SIZE: u16 = 1;
const SET_DESC_CONCAT: u16 = 2;
const SET_FIELD_LEN: u16 = 1;
const SET_INTERVAL: u32 = 0x4;
const SET_CONCAT: u32 = 0x80;
const ELEM_LIST_SET: u16 = 2;
const ELEM_LIST_ELEMENTS: u16 = 3;
const ELEM_KEY: u16 = 1;
const ELEM_DATA: u16 = 2;
const ELEM_FLAGS: u16 = 3;
const ELEM_KEY_END: u16 = 10;
const ELEM_INTERVAL_END: u32 = 1;
const DATA_VALUE: u16 = 1;
const DATA_VERDICT: u16 = 2;
const VERDICT_CODE: u16 = 1;
const VERDICT_CHAIN: u16 = 2;
const NFT_GOTO: i32 = -4;
const NF_ACCEPT: i32 = 1;
const REG_VERDICT: u32 = 0;
const REG_1: u32 = 1;
const REG32_01: u32 = 9;

/// `nft`'s data type ids, so `nft list` shows the sets as written.
const TYPE_IPV4_ADDR: u32 = 7;
const TYPE_INET_SERVICE: u32 = 13;
const TYPE_ADDR_SERVICE: u32 = (TYPE_IPV4_ADDR << 6) | TYPE_INET_SERVICE;
/// Addresses the DNS proxy may add to one sandbox's sets, at most.
const RESOLVED_MAX: u32 = 65_536;
/// Refused packets logged per sandbox and second, at most (a flood is
/// refused all the same, just not all reported).
const LOG_RATE: u64 = 200;

/// One expression of a rule.
#[derive(Debug, Clone, Copy)]
enum Expr<'a> {
    /// The packet is IPv4 (the dependency of every `ip …` match in `inet`).
    Ipv4,
    /// Destination address into register 1.
    Daddr,
    /// Transport destination port into the register after the address.
    Dport,
    /// The transport protocol is in the node's `l4` set (TCP, UDP).
    TcpOrUdp,
    /// Register 1 is in `set`.
    Lookup(&'a str),
    /// Counts the refusal in the sandbox's NFLOG group, rate-limited.
    Log { group: u16, snaplen: u32 },
    /// Refuses with "administratively prohibited".
    Reject,
    /// Marks the connection as this sandbox's and accepts.
    MarkAccept(u32),
}

fn expr(m: &mut Msgs, name: &str, fill: impl FnOnce(&mut Msgs)) {
    m.nest(LIST_ELEM, |m| {
        m.str(EXPR_NAME, name);
        m.nest(EXPR_DATA, fill);
    });
}

fn value(m: &mut Msgs, kind: u16, bytes: &[u8]) {
    m.nest(kind, |m| m.attr(DATA_VALUE, bytes));
}

fn verdict(m: &mut Msgs, kind: u16, code: i32, chain: Option<&str>) {
    m.nest(kind, |m| {
        m.nest(DATA_VERDICT, |m| {
            m.be32(VERDICT_CODE, code as u32);
            if let Some(c) = chain {
                m.str(VERDICT_CHAIN, c);
            }
        });
    });
}

fn meta(m: &mut Msgs, key: u32) {
    expr(m, "meta", |m| {
        m.be32(1, REG_1); // NFTA_META_DREG
        m.be32(2, key); // NFTA_META_KEY
    });
}

fn lookup(m: &mut Msgs, set: &str) {
    expr(m, "lookup", |m| {
        m.str(1, set); // NFTA_LOOKUP_SET
        m.be32(2, REG_1); // NFTA_LOOKUP_SREG
    });
}

fn payload(m: &mut Msgs, reg: u32, base: u32, offset: u32, len: u32) {
    expr(m, "payload", |m| {
        m.be32(1, reg);
        m.be32(2, base);
        m.be32(3, offset);
        m.be32(4, len);
    });
}

fn immediate_verdict(m: &mut Msgs, code: i32) {
    expr(m, "immediate", |m| {
        m.be32(1, REG_VERDICT);
        verdict(m, 2, code, None);
    });
}

fn write(m: &mut Msgs, e: Expr<'_>) {
    match e {
        Expr::Ipv4 => {
            meta(m, 15); // NFT_META_NFPROTO
            expr(m, "cmp", |m| {
                m.be32(1, REG_1);
                m.be32(2, 0); // NFT_CMP_EQ
                value(m, 3, &[NFPROTO_IPV4]);
            });
        }
        Expr::Daddr => payload(m, REG_1, 1, 16, 4), // network header + 16
        Expr::Dport => payload(m, REG32_01, 2, 2, 2), // transport header + 2
        Expr::TcpOrUdp => {
            meta(m, 16); // NFT_META_L4PROTO
            lookup(m, "l4");
        }
        Expr::Lookup(set) => lookup(m, set),
        Expr::Log { group, snaplen } => {
            expr(m, "limit", |m| {
                m.attr(1, &LOG_RATE.to_be_bytes()); // rate
                m.attr(2, &1u64.to_be_bytes()); // per second
                m.be32(3, LOG_RATE as u32); // burst
                m.be32(4, 0); // packets
                m.be32(5, 0);
            });
            // queue-threshold 1: the kernel sends each refused packet at
            // once, so a call's refusals are queued before its program
            // even sees the error.
            expr(m, "log", |m| {
                m.attr(1, &group.to_be_bytes());
                m.be32(3, snaplen);
                m.attr(4, &1u16.to_be_bytes());
            });
        }
        Expr::Reject => expr(m, "reject", |m| {
            m.be32(1, 2); // NFT_REJECT_ICMPX_UNREACH
            m.attr(2, &[3]); // NFT_REJECT_ICMPX_ADMIN_PROHIBITED
        }),
        Expr::MarkAccept(mark) => {
            expr(m, "immediate", |m| {
                m.be32(1, REG_1);
                value(m, 2, &mark.to_ne_bytes());
            });
            expr(m, "ct", |m| {
                m.be32(2, 3); // NFT_CT_MARK
                m.be32(4, REG_1); // NFTA_CT_SREG
            });
            immediate_verdict(m, NF_ACCEPT);
        }
    }
}

fn rule(m: &mut Msgs, names: &SandboxNames, chain: &str, exprs: &[Expr<'_>]) {
    let at = m.begin(NEWRULE, NLM_F_CREATE | NLM_F_APPEND | NLM_F_ACK, &INET_HEADER, "adding a rule");
    m.str(TABLE, names.bare_table());
    m.str(RULE_CHAIN, chain);
    m.nest(RULE_EXPRESSIONS, |m| {
        for e in exprs {
            write(m, *e);
        }
    });
    m.end(at);
}

/// A set: its name, key type and length, flags, and a size or the field
/// lengths of a concatenated interval key.
struct SetSpec {
    name: String,
    key_type: u32,
    key_len: u32,
    flags: u32,
    size: Option<u32>,
    concat: &'static [u32],
}

fn add_set(m: &mut Msgs, table: &str, spec: &SetSpec, id: u32) {
    let at = m.begin(NEWSET, NLM_F_CREATE | NLM_F_ACK, &INET_HEADER, "adding a set");
    m.str(TABLE, table);
    m.str(SET_NAME, &spec.name);
    m.be32(SET_FLAGS, spec.flags);
    m.be32(SET_KEY_TYPE, spec.key_type);
    m.be32(SET_KEY_LEN, spec.key_len);
    m.be32(SET_ID, id);
    if spec.size.is_some() || !spec.concat.is_empty() {
        m.nest(SET_DESC, |m| {
            if let Some(size) = spec.size {
                m.be32(SET_DESC_SIZE, size);
            }
            if !spec.concat.is_empty() {
                m.nest(SET_DESC_CONCAT, |m| {
                    for len in spec.concat {
                        m.nest(LIST_ELEM, |m| m.be32(SET_FIELD_LEN, *len));
                    }
                });
            }
        });
    }
    m.end(at);
}

/// One element: key, optional closing key, flags, optional verdict.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Elem {
    key: Vec<u8>,
    key_end: Option<Vec<u8>>,
    flags: u32,
    goto: Option<String>,
}

impl Elem {
    fn of(key: Vec<u8>) -> Elem {
        Elem { key, key_end: None, flags: 0, goto: None }
    }
}

fn elements(m: &mut Msgs, kind: u16, table: &str, set: &str, elems: &[Elem], what: &'static str) {
    let flags = if kind == NEWSETELEM { NLM_F_CREATE | NLM_F_ACK } else { NLM_F_ACK };
    let at = m.begin(kind, flags, &INET_HEADER, what);
    m.str(TABLE, table);
    m.str(ELEM_LIST_SET, set);
    if !elems.is_empty() {
        m.nest(ELEM_LIST_ELEMENTS, |m| {
            for e in elems {
                m.nest(LIST_ELEM, |m| {
                    value(m, ELEM_KEY, &e.key);
                    if let Some(end) = &e.key_end {
                        value(m, ELEM_KEY_END, end);
                    }
                    if e.flags != 0 {
                        m.be32(ELEM_FLAGS, e.flags);
                    }
                    if let Some(chain) = &e.goto {
                        verdict(m, ELEM_DATA, NFT_GOTO, Some(chain));
                    }
                });
            }
        });
    }
    m.end(at);
}

/// An interface name as a key: `IFNAMSIZ` bytes, zero-padded.
fn ifname_key(name: &str) -> Vec<u8> {
    let mut k = name.as_bytes().to_vec();
    k.resize(16, 0);
    k
}

fn flows_key(names: &SandboxNames) -> Vec<u8> {
    let mut k = ifname_key(&names.ifname);
    k.extend_from_slice(&names.mark.to_ne_bytes());
    k
}

/// A message naming only its table and one object: (table, the object's
/// attribute, its name).
fn named(m: &mut Msgs, kind: u16, flags: u16, (table, attr, name): (&str, u16, &str), what: &'static str) {
    let at = m.begin(kind, flags | NLM_F_ACK, &INET_HEADER, what);
    m.str(TABLE, table);
    m.str(attr, name);
    m.end(at);
}

fn begin_batch(m: &mut Msgs) {
    m.bare(NFNL_MSG_BATCH_BEGIN, 0, &BATCH_HEADER, "batch");
}

fn end_batch(m: &mut Msgs) {
    m.bare(NFNL_MSG_BATCH_END, 0, &BATCH_HEADER, "batch");
}

/// The sets of a sandbox with an allowlist.
fn allow_sets(n: usize) -> [SetSpec; 4] {
    [
        SetSpec { name: format!("any_{n}"), key_type: TYPE_IPV4_ADDR, key_len: 4, flags: SET_INTERVAL, size: None, concat: &[] },
        SetSpec { name: format!("port_{n}"), key_type: TYPE_ADDR_SERVICE, key_len: 8, flags: SET_INTERVAL | SET_CONCAT, size: None, concat: &[4, 2] },
        SetSpec { name: format!("dany_{n}"), key_type: TYPE_IPV4_ADDR, key_len: 4, flags: 0, size: Some(RESOLVED_MAX), concat: &[] },
        SetSpec { name: format!("dport_{n}"), key_type: TYPE_ADDR_SERVICE, key_len: 8, flags: 0, size: Some(RESOLVED_MAX), concat: &[] },
    ]
}

/// The batch installing one sandbox's chain, sets and map entries. Anything
/// of the same slot that an interrupted setup left behind is emptied
/// first: a sandbox never inherits another's rules or allowed addresses.
pub fn sandbox_batch(m: &mut Msgs, names: &SandboxNames, policy: &NetPolicy) {
    let (table, n) = (names.bare_table(), names.n);
    let chain = format!("sbx_{n}");
    let log = Expr::Log { group: names.group, snaplen: crate::nflog::SNAPLEN };
    let accept = Expr::MarkAccept(names.mark);
    begin_batch(m);
    named(m, NEWCHAIN, NLM_F_CREATE, (table, CHAIN_NAME, &chain), "adding the sandbox chain");
    named(m, DELRULE, 0, (table, RULE_CHAIN, &chain), "flushing the sandbox chain");
    rule(m, names, &chain, &[Expr::Ipv4, Expr::Daddr, Expr::Lookup("forbidden4"), Expr::TcpOrUdp, log]);
    rule(m, names, &chain, &[Expr::Ipv4, Expr::Daddr, Expr::Lookup("forbidden4"), Expr::Reject]);
    match &policy.allow {
        None => rule(m, names, &chain, &[accept]),
        Some(rules) => {
            let sets = allow_sets(n);
            for (i, spec) in sets.iter().enumerate() {
                add_set(m, table, spec, i as u32 + 1);
                elements(m, DELSETELEM, table, &spec.name, &[], "emptying a set");
            }
            let (any, ported) = static_elements(rules);
            if !any.is_empty() {
                elements(m, NEWSETELEM, table, &sets[0].name, &any, "adding allowed networks");
            }
            if !ported.is_empty() {
                elements(m, NEWSETELEM, table, &sets[1].name, &ported, "adding allowed networks and ports");
            }
            rule(m, names, &chain, &[Expr::Ipv4, Expr::Daddr, Expr::Lookup(&sets[0].name), accept]);
            rule(m, names, &chain, &[Expr::Ipv4, Expr::Daddr, Expr::Lookup(&sets[2].name), accept]);
            for set in [&sets[1].name, &sets[3].name] {
                rule(m, names, &chain, &[Expr::TcpOrUdp, Expr::Ipv4, Expr::Daddr, Expr::Dport, Expr::Lookup(set), accept]);
            }
            rule(m, names, &chain, &[Expr::TcpOrUdp, log]);
            rule(m, names, &chain, &[Expr::Reject]);
        }
    }
    elements(m, NEWSETELEM, table, "flows", &[Elem::of(flows_key(names))], "adding the sandbox's flows entry");
    let entry = Elem { goto: Some(chain), ..Elem::of(ifname_key(&names.ifname)) };
    elements(m, NEWSETELEM, table, "sandboxes", &[entry], "adding the sandbox's map entry");
    end_batch(m);
}

/// One step of removing a sandbox.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Step {
    /// Its map entry (then nothing reaches its chain).
    MapEntry,
    /// Its flows entry.
    Flows,
    /// Its chain (flushed, then removed).
    Chain,
    /// One of its allowlist's sets.
    Set(String),
}

/// The steps removing one sandbox, in order; the sets only when it had an
/// allowlist.
pub fn teardown_steps(names: &SandboxNames, allowlist: bool) -> Vec<Step> {
    let mut steps = vec![Step::MapEntry, Step::Flows, Step::Chain];
    if allowlist {
        steps.extend(allow_sets(names.n).into_iter().map(|s| Step::Set(s.name)));
    }
    steps
}

/// A batch of `steps` (all of them normally; one at a time when something
/// was never made, so a missing piece does not keep the rest).
pub fn teardown_batch(m: &mut Msgs, names: &SandboxNames, steps: &[Step]) {
    let (table, chain) = (names.bare_table(), format!("sbx_{}", names.n));
    begin_batch(m);
    for step in steps {
        match step {
            Step::MapEntry => elements(m, DELSETELEM, table, "sandboxes", &[Elem::of(ifname_key(&names.ifname))], "removing the map entry"),
            Step::Flows => elements(m, DELSETELEM, table, "flows", &[Elem::of(flows_key(names))], "removing the flows entry"),
            Step::Chain => {
                named(m, DELRULE, 0, (table, RULE_CHAIN, &chain), "flushing the sandbox chain");
                named(m, DELCHAIN, 0, (table, CHAIN_NAME, &chain), "removing the sandbox chain");
            }
            Step::Set(name) => named(m, DELSET, 0, (table, SET_NAME, name), "removing a set"),
        }
    }
    end_batch(m);
}

/// The batch adding `keys` (see [`key`]) to `set` of `table`, as `nft add
/// element` does: one already there is no error.
pub fn elements_batch(m: &mut Msgs, table: &str, set: &str, keys: &[Vec<u8>]) {
    let elems: Vec<Elem> = keys.iter().map(|k| Elem::of(k.clone())).collect();
    begin_batch(m);
    elements(m, NEWSETELEM, table, set, &elems, "adding resolved addresses");
    end_batch(m);
}

/// One element's key: an address (`ipv4_addr` sets) or an address and a
/// port (`ipv4_addr . inet_service`: each field in a 4-byte register).
pub fn key(ip: Ipv4Addr, port: Option<u16>) -> Vec<u8> {
    let mut k = ip.octets().to_vec();
    if let Some(p) = port {
        k.extend_from_slice(&p.to_be_bytes());
        k.extend_from_slice(&[0, 0]);
    }
    k
}

/// Elements per message the DNS proxy may add at once, at most (an answer
/// has a handful).
pub const MAX_ELEMENTS: usize = 256;

/// The agent's nf_tables socket: sandbox chains and sets, and the
/// addresses the DNS proxies resolve — one request at a time.
pub struct Nft {
    sock: std::sync::Mutex<Socket>,
}

impl Nft {
    /// Opens the socket (in the agent's network namespace).
    pub fn open() -> io::Result<Nft> {
        Ok(Nft { sock: std::sync::Mutex::new(Socket::open(Family::Netfilter)?) })
    }

    /// Builds messages with `build` and applies them, returning once the
    /// kernel has (blocking: call off the async runtime).
    pub fn apply(&self, build: impl FnOnce(&mut Msgs)) -> io::Result<()> {
        let mut sock = self.sock.lock().unwrap_or_else(|p| p.into_inner());
        let mut m = sock.msgs();
        build(&mut m);
        sock.transact(&m)
    }

    /// Adds `keys` to `set` of `table` (the bare name, `warren_<prefix>`).
    pub fn add(&self, table: &str, set: &str, keys: &[Vec<u8>]) -> io::Result<()> {
        if keys.is_empty() {
            return Ok(());
        }
        if keys.len() > MAX_ELEMENTS {
            return Err(io::Error::new(io::ErrorKind::InvalidInput, "too many elements for one batch"));
        }
        self.apply(|m| elements_batch(m, table, set, keys))
    }
}

/// CIDR rules as set elements: merged address intervals for the any-port
/// networks (`any_N`: an element at each start, a closing one after each
/// end), and network . port ranges (`port_N`: each with its closing key).
fn static_elements(rules: &[Rule]) -> (Vec<Elem>, Vec<Elem>) {
    let nets = |port: Option<u16>| -> Vec<(u32, u64)> {
        let picked = rules.iter().filter(|r| match port {
            None => r.ports.is_empty(),
            Some(p) => r.ports.contains(&p),
        });
        merged(picked.filter_map(|r| match r.target {
            Target::Cidr(a, p) => Some((a, p)),
            _ => None,
        }))
    };
    let mut any = Vec::new();
    let ranges = nets(None);
    if ranges.first().is_some_and(|(start, _)| *start != 0) {
        any.push(Elem { flags: ELEM_INTERVAL_END, ..Elem::of(vec![0; 4]) });
    }
    for (start, end) in ranges {
        any.push(Elem::of(start.to_be_bytes().to_vec()));
        if let Ok(end) = u32::try_from(end) {
            any.push(Elem { flags: ELEM_INTERVAL_END, ..Elem::of(end.to_be_bytes().to_vec()) });
        }
    }
    let mut ports: Vec<u16> = rules.iter().filter(|r| matches!(r.target, Target::Cidr(..))).flat_map(|r| r.ports.iter().copied()).collect();
    ports.sort_unstable();
    ports.dedup();
    let ported = ports
        .iter()
        .flat_map(|port| {
            nets(Some(*port)).into_iter().map(move |(start, end)| {
                let last = (end - 1) as u32;
                let key = |a: u32| key(Ipv4Addr::from(a), Some(*port));
                Elem { key_end: Some(key(last)), ..Elem::of(key(start)) }
            })
        })
        .collect();
    (any, ported)
}

/// Networks as sorted, merged `[start, end)` intervals (nested and adjacent
/// ones joined: interval sets refuse overlapping elements).
fn merged(nets: impl Iterator<Item = (Ipv4Addr, u8)>) -> Vec<(u32, u64)> {
    let mut ranges: Vec<(u32, u64)> = nets
        .map(|(a, p)| {
            let size = 1u64 << (32 - u32::from(p));
            let start = u32::from(a) & !((size - 1) as u32);
            (start, u64::from(start) + size)
        })
        .collect();
    ranges.sort_unstable();
    let mut out: Vec<(u32, u64)> = Vec::new();
    for (start, end) in ranges {
        match out.last_mut() {
            Some(last) if u64::from(start) <= last.1 => last.1 = last.1.max(end),
            _ => out.push((start, end)),
        }
    }
    out
}

#[cfg(test)]
mod tests;
