//! The DNS proxy of one sandbox. It listens inside the sandbox (so it knows
//! who asks without any address bookkeeping), forwards queries to the node's
//! resolver from outside, and:
//!
//! - with an allowlist, refuses names outside it (no lookup leaves the node,
//!   so names cannot carry data out) and, for allowed names, adds the
//!   answered addresses to the sandbox's allow sets *before* answering;
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

use hickory_proto::op::{Message, MessageType, ResponseCode};
use hickory_proto::rr::{DNSClass, RData, RecordType};
use tokio::net::UdpSocket;
use tokio::sync::Semaphore;
use tracing::debug;
use warren_core::egress::Rule;

use crate::nft::{self, SandboxNames};
use crate::policy::NetPolicy;

/// Queries in flight per sandbox; more are dropped (the client retries).
const IN_FLIGHT: usize = 16;
/// How long the upstream resolver may take.
const UPSTREAM_TIMEOUT: Duration = Duration::from_secs(3);
/// Largest message handled (EDNS answers above it come back truncated).
const MAX_MESSAGE: usize = 4096;
/// Names remembered per sandbox, for reports.
const MAX_REMEMBERED: usize = 1024;

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

/// Decides a parsed query: `None` for anything that is not one plain
/// question (dropped without an answer). Without a policy (a `Blocked`
/// sandbox) only `statics` are answered.
pub fn decide(query: &Message, policy: Option<&NetPolicy>, statics: &BTreeMap<String, Ipv4Addr>) -> Option<(String, Decision)> {
    if query.message_type() != MessageType::Query || query.queries().len() != 1 {
        return None;
    }
    let q = &query.queries()[0];
    if q.query_class() != DNSClass::IN {
        return None;
    }
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
pub fn answered_v4(answer: &Message) -> Vec<Ipv4Addr> {
    answer
        .answers()
        .iter()
        .filter_map(|r| match r.data() {
            RData::A(a) => Some(a.0),
            _ => None,
        })
        .collect()
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
        let ctx = Arc::new(Ctx { socket, forwarding, statics: statics.clone(), seen: seen.clone() });
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
    let decided = {
        let statics = ctx.statics.lock().unwrap_or_else(|p| p.into_inner());
        decide(&query, ctx.forwarding.as_ref().map(|f| f.policy.as_ref()), &statics)
    };
    let (name, decision) = decided?;
    let reply = |code| {
        let mut m = Message::error_msg(query.id(), query.op_code(), code);
        m.add_query(query.queries()[0].clone());
        m.set_recursion_desired(query.recursion_desired()).set_recursion_available(true);
        m.to_vec().ok()
    };
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
            let mut m = Message::error_msg(query.id(), query.op_code(), ResponseCode::NoError);
            let q = query.queries()[0].clone();
            m.add_answer(hickory_proto::rr::Record::from_rdata(q.name().clone(), 60, RData::A(ip.into())));
            m.add_query(q);
            m.set_recursion_desired(query.recursion_desired()).set_recursion_available(true).set_authoritative(true);
            m.to_vec().ok()
        }
        Decision::Forward(rule) => {
            // Forward is only decided with a forwarding policy.
            let f = ctx.forwarding.as_ref()?;
            let Some((bytes, msg)) = lookup(f.upstream, raw, &query).await else { return reply(ResponseCode::ServFail) };
            let ips = answered_v4(&msg);
            remember(&ctx.seen, &name, &ips);
            if let Some(rule) = rule {
                let public: Vec<Ipv4Addr> = ips.into_iter().filter(|ip| !warren_core::egress::is_forbidden(IpAddr::V4(*ip))).collect();
                if !public.is_empty() {
                    if let Err(e) = nft::run(&nft::allow_resolved(&f.names, &rule, &public), &["-f", "-"]).await {
                        debug!(error = %e, "allowing resolved addresses failed");
                        return reply(ResponseCode::ServFail);
                    }
                }
            }
            Some(bytes)
        }
    }
}

fn remember(seen: &Mutex<Seen>, name: &str, ips: &[Ipv4Addr]) {
    let mut seen = seen.lock().unwrap_or_else(|p| p.into_inner());
    for ip in ips {
        if seen.names.len() < MAX_REMEMBERED || seen.names.contains_key(&IpAddr::V4(*ip)) {
            seen.names.insert(IpAddr::V4(*ip), name.to_string());
        }
    }
}

/// Asks the node's resolver; the answer must carry the query's id and question.
async fn lookup(upstream: SocketAddr, raw: &[u8], query: &Message) -> Option<(Vec<u8>, Message)> {
    let bind: SocketAddr = if upstream.is_ipv4() { "0.0.0.0:0".parse().ok()? } else { "[::]:0".parse().ok()? };
    let socket = UdpSocket::bind(bind).await.ok()?;
    socket.connect(upstream).await.ok()?;
    socket.send(raw).await.ok()?;
    let mut buf = vec![0u8; MAX_MESSAGE];
    let wait = async {
        loop {
            let n = socket.recv(&mut buf).await.ok()?;
            let Ok(msg) = Message::from_vec(&buf[..n]) else { continue };
            if msg.id() == query.id() && msg.message_type() == MessageType::Response && msg.queries() == query.queries() {
                return Some((buf[..n].to_vec(), msg));
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
    fn only_a_records_count_as_answered_addresses() {
        let mut m = query("a.test.", RecordType::A);
        let name = Name::from_ascii("a.test.").unwrap();
        m.add_answer(Record::from_rdata(name.clone(), 60, RData::A("198.51.100.10".parse::<Ipv4Addr>().unwrap().into())));
        m.add_answer(Record::from_rdata(name.clone(), 60, RData::CNAME(hickory_proto::rr::rdata::CNAME(name.clone()))));
        assert_eq!(answered_v4(&m), vec![Ipv4Addr::new(198, 51, 100, 10)]);
    }
}
