//! The DNS proxy of one sandbox. It listens inside the sandbox (so it knows
//! who asks without any address bookkeeping), forwards queries to the node's
//! resolver from outside, and:
//!
//! - with an allowlist, refuses names outside it (no lookup leaves the node)
//!   and, for allowed names, adds the answered addresses to the sandbox's
//!   allow sets *before* answering;
//! - relays nothing the program built: it sends the resolver a query of its
//!   own from the one decided question (opcode QUERY, class IN, lower-cased
//!   name, its own EDNS, a fresh id), so no extra record, EDNS option, flag
//!   or UPDATE/NOTIFY/IQUERY/STATUS/DSO message of the program's reaches the
//!   resolver, and answers the program with a message of its own holding
//!   only the records that answer that question (the name and the CNAME
//!   chain it leads to);
//! - answers AAAA queries with no records (sandboxes have no IPv6 route);
//! - answers the call's connector hosts itself, with the loopback address
//!   of their forwarder ([`Statics`]);
//! - remembers which name gave which address, to name refused destinations.
//!
//! A `Blocked` sandbox with connectors gets a proxy that knows only those
//! names and refuses everything else: no lookup leaves the node.
//!
//! Enforcement never depends on the proxy: the firewall decides by address,
//! so a program resolving names itself (or a name rebinding to a private
//! address) gains nothing.

use std::collections::BTreeMap;
use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use hickory_proto::op::{Edns, Message, MessageType, OpCode, Query, ResponseCode};
use hickory_proto::rr::{DNSClass, Name, RData, Record, RecordType};
use tokio::net::UdpSocket;
use tokio::sync::Semaphore;
use tracing::debug;
use warren_core::egress::Rule;

use crate::nft::{self, SandboxNames};
use crate::nftnl::Nft;
use crate::policy::NetPolicy;

/// Queries in flight per sandbox; more are dropped (the client retries).
const IN_FLIGHT: usize = 16;
/// How long the upstream resolver may take.
const UPSTREAM_TIMEOUT: Duration = Duration::from_secs(3);
/// Largest message handled (EDNS answers above it come back truncated).
const MAX_MESSAGE: usize = 4096;
/// Names remembered per sandbox, for reports.
const MAX_REMEMBERED: usize = 1024;
/// The UDP payload the proxy's own queries offer (the DNS flag day size).
const EDNS_PAYLOAD: u16 = 1232;
/// Answers without EDNS fit this (RFC 1035).
const PLAIN_UDP: usize = 512;
/// CNAME links followed in an answer.
const MAX_CHAIN: usize = 8;
/// Addresses remembered as already in the allow sets, per sandbox.
const MAX_ALLOWED: usize = 4096;

/// Question types a program may ask about an allowed name: ordinary data,
/// never zone transfers, meta or wildcard types.
const ASKABLE: &[RecordType] = &[
    RecordType::A,
    RecordType::AAAA,
    RecordType::CNAME,
    RecordType::TXT,
    RecordType::MX,
    RecordType::SRV,
    RecordType::NS,
    RecordType::SOA,
    RecordType::PTR,
    RecordType::CAA,
    RecordType::HTTPS,
    RecordType::SVCB,
    RecordType::NAPTR,
    RecordType::TLSA,
];

/// Names answered locally (connector hosts → their forwarders), set per call.
pub type Statics = Arc<Mutex<BTreeMap<String, Ipv4Addr>>>;

/// What to do with one query.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Decision {
    /// A connector host: its forwarder's address.
    Static(Ipv4Addr),
    /// Outside the allowlist: REFUSED, never looked up.
    Refuse,
    /// Answer "no records" at once (AAAA: no IPv6 here).
    Empty,
    /// Look it up; addresses answered are allowed under the rule, if any.
    Forward(Option<Rule>),
}

/// Whether a message is one plain question the proxy may decide: `None`
/// for a response (dropped), else the code of the refusal for anything but
/// a standard query of one IN question of an ordinary type with no records
/// of its own (an OPT aside, which is never passed on).
pub fn screen(query: &Message) -> Option<Result<(), ResponseCode>> {
    if query.message_type() != MessageType::Query {
        return None;
    }
    Some(if query.op_code() != OpCode::Query {
        Err(ResponseCode::NotImp)
    } else if query.queries().len() != 1 || !query.answers().is_empty() || !query.name_servers().is_empty() || !query.additionals().is_empty() || !query.signature().is_empty() {
        Err(ResponseCode::FormErr)
    } else if query.queries()[0].query_class() != DNSClass::IN || !ASKABLE.contains(&query.queries()[0].query_type()) {
        Err(ResponseCode::Refused)
    } else {
        Ok(())
    })
}

/// Decides a screened query ([`screen`]; `None` for anything else).
/// Without a policy (a `Blocked` sandbox) only `statics` are answered.
pub fn decide(query: &Message, policy: Option<&NetPolicy>, statics: &BTreeMap<String, Ipv4Addr>) -> Option<(String, Decision)> {
    if screen(query) != Some(Ok(())) {
        return None;
    }
    let q = &query.queries()[0];
    let name = q.name().to_ascii().trim_end_matches('.').to_ascii_lowercase();
    if let Some(ip) = statics.get(&name) {
        return Some((name, if q.query_type() == RecordType::A { Decision::Static(*ip) } else { Decision::Empty }));
    }
    let decision = match policy.map(|p| p.rule_for_name(&name)) {
        None | Some(Err(())) => Decision::Refuse,
        Some(Ok(_)) if q.query_type() == RecordType::AAAA => Decision::Empty,
        Some(Ok(rule)) => Decision::Forward(rule.cloned()),
    };
    Some((name, decision))
}

/// The IPv4 addresses in an answer.
pub fn answered_v4(answers: &[Record]) -> Vec<Ipv4Addr> {
    answers
        .iter()
        .filter_map(|r| match r.data() {
            RData::A(a) => Some(a.0),
            _ => None,
        })
        .collect()
}

fn lower(name: &Name) -> String {
    name.to_ascii().trim_end_matches('.').to_ascii_lowercase()
}

/// The query the proxy sends for the decided `name` and `qtype` (pure):
/// nothing of the program's message but the question it decided on.
pub fn upstream_query(id: u16, name: &str, qtype: RecordType) -> Option<Message> {
    let mut m = Message::new();
    m.set_id(id).set_message_type(MessageType::Query).set_op_code(OpCode::Query).set_recursion_desired(true);
    m.add_query(Query::query(Name::from_ascii(format!("{name}.")).ok()?, qtype));
    let mut edns = Edns::new();
    edns.set_max_payload(EDNS_PAYLOAD);
    m.set_edns(edns);
    Some(m)
}

/// Whether `answer` is the resolver's answer to `sent`.
pub fn answers_query(sent: &Message, answer: &Message) -> bool {
    answer.id() == sent.id() && answer.message_type() == MessageType::Response && answer.op_code() == OpCode::Query && answer.queries() == sent.queries()
}

/// The records of `answer` that answer `question`: of class IN, owned by
/// the asked name or by a name a kept CNAME leads to, of the asked type or
/// CNAME (pure). Anything else the resolver (or whoever answered in its
/// place) added is dropped.
pub fn chain(question: &Query, answer: &Message) -> Vec<Record> {
    let mut names = vec![lower(question.name())];
    let mut kept = vec![false; answer.answers().len()];
    for _ in 0..MAX_CHAIN {
        let mut grew = false;
        for (i, r) in answer.answers().iter().enumerate() {
            if kept[i] || r.dns_class() != DNSClass::IN || !names.contains(&lower(r.name())) {
                continue;
            }
            if let RData::CNAME(target) = r.data() {
                kept[i] = true;
                names.push(lower(&target.0));
                grew = true;
            } else if r.record_type() == question.query_type() {
                kept[i] = true;
            }
        }
        if !grew {
            break;
        }
    }
    answer.answers().iter().zip(kept).filter(|(_, k)| *k).map(|(r, _)| r.clone()).collect()
}

/// The proxy's answer to the program (pure): its id, flags and question,
/// the resolver's code (NOERROR/NXDOMAIN; anything else SERVFAIL) and
/// `records`; truncated when it would not fit the program's UDP size.
pub fn reply_with(query: &Message, code: ResponseCode, records: Vec<Record>) -> Option<Vec<u8>> {
    let code = if matches!(code, ResponseCode::NoError | ResponseCode::NXDomain) { code } else { ResponseCode::ServFail };
    let mut m = Message::new();
    m.set_id(query.id()).set_message_type(MessageType::Response).set_op_code(OpCode::Query).set_response_code(code);
    m.set_recursion_desired(query.recursion_desired()).set_recursion_available(true);
    m.add_queries(query.queries().to_vec());
    let limit = match query.extensions() {
        Some(_) => {
            let mut edns = Edns::new();
            edns.set_max_payload(EDNS_PAYLOAD);
            m.set_edns(edns);
            usize::from(EDNS_PAYLOAD)
        }
        None => PLAIN_UDP,
    };
    let without = m.clone();
    m.add_answers(records);
    let bytes = m.to_vec().ok()?;
    if bytes.len() <= limit {
        return Some(bytes);
    }
    let mut m = without;
    m.set_truncated(true);
    m.to_vec().ok()
}

/// What the proxy saw, for the call's report.
#[derive(Debug, Default)]
pub struct Seen {
    /// Address → the name it was answered for.
    pub names: BTreeMap<IpAddr, String>,
    /// Refused name → how often.
    pub refused: BTreeMap<String, u64>,
}

/// A running proxy; dropping it stops it.
pub struct DnsProxy {
    task: tokio::task::JoinHandle<()>,
    seen: Arc<Mutex<Seen>>,
    statics: Statics,
}

/// Where an `Unrestricted` sandbox's lookups go, and what they may ask.
pub struct Forwarding {
    /// The node's resolver.
    pub upstream: SocketAddr,
    /// The sandbox's policy.
    pub policy: Arc<NetPolicy>,
    /// Its chain and sets (answers feed the allow sets).
    pub names: SandboxNames,
    /// The agent's netlink writer of set elements.
    pub sets: Arc<Nft>,
}

impl Drop for DnsProxy {
    fn drop(&mut self) {
        self.task.abort();
    }
}

impl DnsProxy {
    /// Serves `socket` (bound inside the sandbox) until dropped; without
    /// `forwarding`, only the statics.
    pub fn spawn(socket: std::net::UdpSocket, forwarding: Option<Forwarding>) -> std::io::Result<DnsProxy> {
        socket.set_nonblocking(true)?;
        let socket = Arc::new(UdpSocket::from_std(socket)?);
        let seen = Arc::new(Mutex::new(Seen::default()));
        let statics = Statics::default();
        let ctx = Arc::new(Ctx { socket, forwarding, statics: statics.clone(), seen: seen.clone(), allowed: Mutex::default() });
        let task = tokio::spawn(serve(ctx));
        Ok(DnsProxy { task, seen, statics })
    }

    /// The names this proxy answers itself.
    pub fn statics(&self) -> &Statics {
        &self.statics
    }

    /// What was seen so far.
    pub fn seen(&self) -> (BTreeMap<IpAddr, String>, BTreeMap<String, u64>) {
        let s = self.seen.lock().unwrap_or_else(|p| p.into_inner());
        (s.names.clone(), s.refused.clone())
    }
}

struct Ctx {
    socket: Arc<UdpSocket>,
    forwarding: Option<Forwarding>,
    statics: Statics,
    seen: Arc<Mutex<Seen>>,
    /// Set elements already added for this sandbox: a repeated answer
    /// touches no set.
    allowed: Mutex<std::collections::HashSet<(String, Vec<u8>)>>,
}

async fn serve(ctx: Arc<Ctx>) {
    let permits = Arc::new(Semaphore::new(IN_FLIGHT));
    let mut buf = vec![0u8; MAX_MESSAGE];
    // Queries in flight belong to this task: stopping the proxy aborts them,
    // so none can touch the slot's sets after the sandbox is gone.
    let mut in_flight = tokio::task::JoinSet::new();
    loop {
        let Ok((n, peer)) = ctx.socket.recv_from(&mut buf).await else { return };
        while in_flight.try_join_next().is_some() {}
        let Ok(permit) = permits.clone().try_acquire_owned() else { continue };
        let query = buf[..n].to_vec();
        let ctx = ctx.clone();
        in_flight.spawn(async move {
            if let Some(reply) = answer(&ctx, &query).await {
                let _ = ctx.socket.send_to(&reply, peer).await;
            }
            drop(permit);
        });
    }
}

async fn answer(ctx: &Ctx, raw: &[u8]) -> Option<Vec<u8>> {
    let query = Message::from_vec(raw).ok()?;
    let reply = |code| {
        let mut m = Message::error_msg(query.id(), OpCode::Query, code);
        if let Some(q) = query.queries().first().filter(|_| query.queries().len() == 1) {
            m.add_query(q.clone());
        }
        m.set_recursion_desired(query.recursion_desired()).set_recursion_available(true);
        m.to_vec().ok()
    };
    if let Err(code) = screen(&query)? {
        return reply(code);
    }
    let decided = {
        let statics = ctx.statics.lock().unwrap_or_else(|p| p.into_inner());
        decide(&query, ctx.forwarding.as_ref().map(|f| f.policy.as_ref()), &statics)
    };
    let (name, decision) = decided?;
    match decision {
        Decision::Refuse => {
            let mut seen = ctx.seen.lock().unwrap_or_else(|p| p.into_inner());
            if seen.refused.len() < MAX_REMEMBERED || seen.refused.contains_key(&name) {
                *seen.refused.entry(name).or_default() += 1;
            }
            reply(ResponseCode::Refused)
        }
        Decision::Empty => reply(ResponseCode::NoError),
        Decision::Static(ip) => {
            let q = &query.queries()[0];
            reply_with(&query, ResponseCode::NoError, vec![Record::from_rdata(q.name().clone(), 60, RData::A(ip.into()))])
        }
        Decision::Forward(rule) => {
            // Forward is only decided with a forwarding policy.
            let f = ctx.forwarding.as_ref()?;
            let qtype = query.queries()[0].query_type();
            let Some(sent) = upstream_query(rand::random(), &name, qtype) else { return reply(ResponseCode::FormErr) };
            let Some(got) = lookup(f.upstream, &sent).await else { return reply(ResponseCode::ServFail) };
            let records = chain(&sent.queries()[0], &got);
            let ips = answered_v4(&records);
            remember(&ctx.seen, &name, &ips);
            if let Some(rule) = rule {
                let public: Vec<Ipv4Addr> = ips.into_iter().filter(|ip| !warren_core::egress::is_forbidden(IpAddr::V4(*ip))).collect();
                if let Err(e) = allow(ctx, f, &rule, &public).await {
                    debug!(error = %e, "allowing resolved addresses failed");
                    return reply(ResponseCode::ServFail);
                }
            }
            // The program's own question (its case), the records as answered.
            reply_with(&query, got.response_code(), records)
        }
    }
}

/// Adds to the sandbox's allow sets what is not there yet.
async fn allow(ctx: &Ctx, f: &Forwarding, rule: &Rule, ips: &[Ipv4Addr]) -> std::io::Result<()> {
    let (set, keys) = nft::resolved_elements(&f.names, rule, ips);
    let fresh: Vec<Vec<u8>> = {
        let allowed = ctx.allowed.lock().unwrap_or_else(|p| p.into_inner());
        keys.into_iter().filter(|k| !allowed.contains(&(set.clone(), k.clone()))).collect()
    };
    if fresh.is_empty() {
        return Ok(());
    }
    let (sets, table, to, keys) = (f.sets.clone(), f.names.bare_table().to_string(), set.clone(), fresh.clone());
    tokio::task::spawn_blocking(move || sets.add(&table, &to, &keys)).await.map_err(std::io::Error::other)??;
    let mut allowed = ctx.allowed.lock().unwrap_or_else(|p| p.into_inner());
    if allowed.len() < MAX_ALLOWED {
        allowed.extend(fresh.into_iter().map(|k| (set.clone(), k)));
    }
    Ok(())
}

fn remember(seen: &Mutex<Seen>, name: &str, ips: &[Ipv4Addr]) {
    let mut seen = seen.lock().unwrap_or_else(|p| p.into_inner());
    for ip in ips {
        if seen.names.len() < MAX_REMEMBERED || seen.names.contains_key(&IpAddr::V4(*ip)) {
            seen.names.insert(IpAddr::V4(*ip), name.to_string());
        }
    }
}

/// Asks the node's resolver; the answer must be a standard response with
/// the query's id and question.
async fn lookup(upstream: SocketAddr, sent: &Message) -> Option<Message> {
    let bind: SocketAddr = if upstream.is_ipv4() { "0.0.0.0:0".parse().ok()? } else { "[::]:0".parse().ok()? };
    let socket = UdpSocket::bind(bind).await.ok()?;
    socket.connect(upstream).await.ok()?;
    socket.send(&sent.to_vec().ok()?).await.ok()?;
    let mut buf = vec![0u8; MAX_MESSAGE];
    let wait = async {
        loop {
            let n = socket.recv(&mut buf).await.ok()?;
            let Ok(msg) = Message::from_vec(&buf[..n]) else { continue };
            if answers_query(sent, &msg) {
                return Some(msg);
            }
        }
    };
    tokio::time::timeout(UPSTREAM_TIMEOUT, wait).await.ok()?
}

#[cfg(test)]
mod tests {
    use hickory_proto::op::Query;
    use hickory_proto::rr::{Name, Record};
    use warren_core::egress::EgressRule;

    use super::*;

    fn query(name: &str, qtype: RecordType) -> Message {
        let mut m = Message::new();
        m.set_id(7).set_message_type(MessageType::Query);
        m.add_query(Query::query(Name::from_ascii(name).unwrap(), qtype));
        m
    }

    #[test]
    fn allowlisted_names_are_forwarded_others_refused_and_aaaa_answered_empty() {
        let none = BTreeMap::new();
        let rule = Rule::parse(&EgressRule { host: "*.example.com".into(), ports: vec![443] }).unwrap();
        let narrow = NetPolicy::new(Some(vec![rule.clone()]), 1000);
        assert_eq!(decide(&query("API.example.com.", RecordType::A), Some(&narrow), &none), Some(("api.example.com".into(), Decision::Forward(Some(rule)))));
        assert_eq!(decide(&query("evil.org.", RecordType::A), Some(&narrow), &none).unwrap().1, Decision::Refuse);
        assert_eq!(decide(&query("evil.org.", RecordType::AAAA), Some(&narrow), &none).unwrap().1, Decision::Refuse);
        assert_eq!(decide(&query("api.example.com.", RecordType::AAAA), Some(&narrow), &none).unwrap().1, Decision::Empty);
        let open = NetPolicy::new(None, 1000);
        assert_eq!(decide(&query("anything.org.", RecordType::TXT), Some(&open), &none).unwrap().1, Decision::Forward(None));
        let mut two = query("a.org.", RecordType::A);
        two.add_query(Query::query(Name::from_ascii("b.org.").unwrap(), RecordType::A));
        assert_eq!(decide(&two, Some(&open), &none), None);
        let mut response = query("a.org.", RecordType::A);
        response.set_message_type(MessageType::Response);
        assert_eq!(decide(&response, Some(&open), &none), None);
    }

    #[test]
    fn connector_hosts_are_answered_locally_and_blocked_sandboxes_ask_nothing_else() {
        let statics = BTreeMap::from([("db.internal".to_string(), Ipv4Addr::new(127, 0, 1, 1))]);
        assert_eq!(decide(&query("DB.internal.", RecordType::A), None, &statics).unwrap().1, Decision::Static(Ipv4Addr::new(127, 0, 1, 1)));
        assert_eq!(decide(&query("db.internal.", RecordType::AAAA), None, &statics).unwrap().1, Decision::Empty);
        assert_eq!(decide(&query("example.com.", RecordType::A), None, &statics).unwrap().1, Decision::Refuse);
        let open = NetPolicy::new(None, 1000);
        assert_eq!(decide(&query("db.internal.", RecordType::A), Some(&open), &statics).unwrap().1, Decision::Static(Ipv4Addr::new(127, 0, 1, 1)), "the forwarder wins over the resolver");
    }

    #[test]
    fn only_the_questions_chain_is_answered_and_only_its_a_records_count() {
        let sent = upstream_query(9, "a.test", RecordType::A).unwrap();
        let mut got = sent.clone();
        got.set_message_type(MessageType::Response);
        let name = |n: &str| Name::from_ascii(n).unwrap();
        let a = |n: &str, ip: &str| Record::from_rdata(name(n), 60, RData::A(ip.parse::<Ipv4Addr>().unwrap().into()));
        got.add_answer(Record::from_rdata(name("A.test."), 60, RData::CNAME(hickory_proto::rr::rdata::CNAME(name("b.test.")))));
        got.add_answer(a("b.test.", "198.51.100.10"));
        got.add_answer(a("smuggled.test.", "198.51.100.99"));
        got.add_answer(Record::from_rdata(name("a.test."), 60, RData::TXT(hickory_proto::rr::rdata::TXT::new(vec!["data".into()]))));
        let kept = chain(&sent.queries()[0], &got);
        assert_eq!(kept.len(), 2, "{kept:?}");
        assert_eq!(answered_v4(&kept), vec![Ipv4Addr::new(198, 51, 100, 10)]);
        assert!(answers_query(&sent, &got));
        let mut other = got.clone();
        other.set_id(10);
        assert!(!answers_query(&sent, &other), "another id");
        let mut update = got.clone();
        update.set_op_code(OpCode::Update);
        assert!(!answers_query(&sent, &update));
    }

    #[test]
    fn the_proxy_asks_only_its_own_question() {
        let sent = upstream_query(42, "api.example.com", RecordType::A).unwrap();
        assert_eq!((sent.id(), sent.op_code(), sent.queries().len()), (42, OpCode::Query, 1));
        assert_eq!(sent.queries()[0].query_class(), DNSClass::IN);
        assert!(sent.additionals().is_empty() && sent.answers().is_empty() && sent.name_servers().is_empty());
        let edns = sent.extensions().as_ref().unwrap();
        assert_eq!(edns.max_payload(), EDNS_PAYLOAD);
        assert!(edns.options().as_ref().is_empty(), "no option of the program's");
    }

    #[test]
    fn every_message_but_a_plain_question_is_refused() {
        assert_eq!(screen(&query("a.test.", RecordType::A)), Some(Ok(())));
        for op in [OpCode::Update, OpCode::Notify, OpCode::Status] {
            let mut m = query("a.test.", RecordType::A);
            m.set_op_code(op);
            assert_eq!(screen(&m), Some(Err(ResponseCode::NotImp)), "{op:?}");
        }
        let mut extra = query("a.test.", RecordType::A);
        extra.add_additional(Record::from_rdata(Name::from_ascii("x.a.test.").unwrap(), 0, RData::TXT(hickory_proto::rr::rdata::TXT::new(vec!["secret".into()]))));
        assert_eq!(screen(&extra), Some(Err(ResponseCode::FormErr)));
        for t in [RecordType::AXFR, RecordType::IXFR, RecordType::ANY, RecordType::NULL] {
            assert_eq!(screen(&query("a.test.", t)), Some(Err(ResponseCode::Refused)), "{t:?}");
        }
        let mut response = query("a.test.", RecordType::A);
        response.set_message_type(MessageType::Response);
        assert_eq!(screen(&response), None);
    }

    #[test]
    fn replies_are_built_fresh_and_fit_the_programs_udp_size() {
        let q = query("a.test.", RecordType::A);
        let many: Vec<Record> = (0..60).map(|i| Record::from_rdata(Name::from_ascii("a.test.").unwrap(), 60, RData::A(Ipv4Addr::new(198, 51, 100, i).into()))).collect();
        let small = Message::from_vec(&reply_with(&q, ResponseCode::NoError, many[..2].to_vec()).unwrap()).unwrap();
        assert_eq!((small.id(), small.answers().len(), small.truncated()), (7, 2, false));
        let big = Message::from_vec(&reply_with(&q, ResponseCode::NoError, many.clone()).unwrap()).unwrap();
        assert!(big.truncated() && big.answers().is_empty(), "over 512 bytes without EDNS");
        let refused = Message::from_vec(&reply_with(&q, ResponseCode::Refused, vec![]).unwrap()).unwrap();
        assert_eq!(refused.response_code(), ResponseCode::ServFail, "only NOERROR and NXDOMAIN pass");
    }
}
