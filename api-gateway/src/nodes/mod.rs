//! The node-agents this gateway can use: health checks, capacity, selection.
//!
//! Each agent is polled with `Status`; an agent that answers is healthy and
//! tells its capacity. A request takes a [`Lease`] on the healthy agent with
//! the most free slots; when all are busy it waits, in order of arrival
//! (`queue`), until a deadline. Leases are counted here, so the gateway does
//! not push work at a full agent.

pub mod agent;
mod queue;

use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::sync::Arc;
use std::time::Duration;

use tracing::{info, warn};
use warren_proto::client::AgentAddress;

use agent::{Agent, GrpcAgent};

use crate::exec_error::ExecError;

/// One node-agent.
#[derive(Debug)]
pub struct Node {
    /// Where it listens.
    pub address: AgentAddress,
    /// Node name it reported.
    name: std::sync::Mutex<String>,
    agent: Arc<dyn Agent>,
    healthy: AtomicBool,
    capacity: AtomicU32,
    in_flight: AtomicU32,
    /// OCI images warm on it (their references and digests), from `Status`.
    warm: std::sync::RwLock<std::collections::HashSet<String>>,
    /// Its last `Status` answer (the console shows it).
    last: std::sync::RwLock<Option<warren_proto::agent::StatusResponse>>,
    /// When that answer was asked for, Unix ms (0: never answered).
    last_asked_ms: std::sync::atomic::AtomicI64,
    /// When this gateway began watching it, Unix ms.
    since_ms: i64,
}

/// What a node's last status says of the time since `after`.
#[derive(Debug, Clone, PartialEq)]
pub enum Heard {
    /// It answered a status check asked after `after`.
    Status(Box<warren_proto::agent::StatusResponse>),
    /// Nothing yet from a check asked after `after`.
    NotYet,
    /// It has not answered (nor been healthy) for this long.
    Silent(Duration),
}

impl Node {
    fn new(address: AgentAddress, agent: Arc<dyn Agent>) -> Arc<Node> {
        Arc::new(Node {
            name: std::sync::Mutex::new(address.to_string()),
            address,
            agent,
            healthy: AtomicBool::new(false),
            capacity: AtomicU32::new(0),
            in_flight: AtomicU32::new(0),
            warm: Default::default(),
            last: Default::default(),
            last_asked_ms: Default::default(),
            since_ms: crate::records::now_ms(),
        })
    }

    /// The agent's client.
    pub fn agent(&self) -> &dyn Agent {
        &*self.agent
    }

    /// Name the agent reported (its address until it answered once).
    pub fn name(&self) -> String {
        self.name.lock().map(|n| n.clone()).unwrap_or_default()
    }

    /// Marks the node down after a transport failure, until the next check.
    pub fn mark_unhealthy(&self) {
        if self.healthy.swap(false, Ordering::AcqRel) {
            warn!(node = %self.address, "node-agent marked unhealthy after a failed call");
        }
    }

    /// Whether `image` (a reference or digest) is warm here.
    pub fn has_warm(&self, image: &str) -> bool {
        self.warm.read().map(|w| w.contains(image)).unwrap_or(false)
    }

    /// Whether its last check succeeded.
    pub fn is_healthy(&self) -> bool {
        self.healthy.load(Ordering::Acquire)
    }

    /// What it said at its last successful check (version, features,
    /// running executions, warm images).
    pub fn last_status(&self) -> Option<warren_proto::agent::StatusResponse> {
        self.last.read().ok().and_then(|l| l.clone())
    }

    /// Its last status, when healthy and asked after `after` (Unix ms);
    /// unhealthy, how long since its last answer (or `after`, or this
    /// gateway's start, whichever is later).
    pub fn heard_since(&self, after: i64, now: i64) -> Heard {
        let asked = self.last_asked_ms.load(Ordering::Acquire);
        if !self.is_healthy() {
            return Heard::Silent(Duration::from_millis((now - asked.max(self.since_ms).max(after)).max(0) as u64));
        }
        match (asked > after).then(|| self.last_status()).flatten() {
            Some(s) => Heard::Status(Box::new(s)),
            None => Heard::NotYet,
        }
    }

    fn free(&self) -> u32 {
        self.capacity.load(Ordering::Acquire).saturating_sub(self.in_flight.load(Ordering::Acquire))
    }

    /// Takes one slot if one is free (never past its capacity).
    fn try_take(&self) -> bool {
        loop {
            let cur = self.in_flight.load(Ordering::Acquire);
            if cur >= self.capacity.load(Ordering::Acquire) {
                return false;
            }
            if self.in_flight.compare_exchange(cur, cur + 1, Ordering::AcqRel, Ordering::Acquire).is_ok() {
                return true;
            }
        }
    }

    /// Returns one slot taken with [`Node::try_take`].
    fn give_back(&self) {
        self.in_flight.fetch_sub(1, Ordering::AcqRel);
    }
}

/// The set of agents.
#[derive(Debug)]
pub struct Nodes {
    /// The current set; replaced whole when discovery changes it.
    nodes: std::sync::RwLock<Arc<Vec<Arc<Node>>>>,
    token: Option<Arc<str>>,
    tls: warren_proto::client::TcpTls,
    /// Requests waiting for a slot; every slot is taken under its lock.
    waiting: std::sync::Mutex<queue::Queue>,
    /// Rotates among equally free nodes, so idle capacity is spread.
    turn: std::sync::atomic::AtomicUsize,
    /// Names of the cordoned nodes (drained, or cordoned by hand).
    cordoned: std::sync::RwLock<Arc<std::collections::HashSet<String>>>,
}

/// A slot on a node, returned on drop.
#[derive(Debug)]
pub struct Lease {
    nodes: Arc<Nodes>,
    /// The chosen node.
    pub node: Arc<Node>,
}

impl Drop for Lease {
    fn drop(&mut self) {
        self.node.give_back();
        // One slot freed: it goes to the oldest waiter that may use it.
        self.nodes.dispatch();
    }
}

impl Nodes {
    /// Builds the set; channels connect lazily and reconnect on their own.
    pub fn new(addresses: &[AgentAddress], token: Option<String>, tls: warren_proto::client::TcpTls) -> anyhow::Result<Arc<Nodes>> {
        let nodes = Arc::new(Nodes {
            nodes: Default::default(),
            token: token.map(Into::into),
            tls,
            waiting: Default::default(),
            turn: Default::default(),
            cordoned: Default::default(),
        });
        nodes.set(addresses)?;
        Ok(nodes)
    }

    fn node(&self, a: &AgentAddress) -> anyhow::Result<Arc<Node>> {
        Ok(Node::new(a.clone(), Arc::new(GrpcAgent::new(a, self.token.clone(), &self.tls)?)))
    }

    /// A fixed set of agents (tests use doubles; nothing is discovered).
    pub fn from_agents(agents: Vec<(AgentAddress, Arc<dyn Agent>)>) -> Arc<Nodes> {
        let nodes = agents.into_iter().map(|(a, agent)| Node::new(a, agent)).collect();
        Arc::new(Nodes { nodes: std::sync::RwLock::new(Arc::new(nodes)), token: None, tls: None, waiting: Default::default(), turn: Default::default(), cordoned: Default::default() })
    }

    /// Replaces the set (discovery). Nodes that stay keep their state and
    /// connections; new ones start unhealthy until their first check; leases
    /// on removed nodes finish normally.
    pub fn set(&self, addresses: &[AgentAddress]) -> anyhow::Result<()> {
        let current = self.snapshot();
        let next = addresses
            .iter()
            .map(|a| match current.iter().find(|n| &n.address == a) {
                Some(n) => Ok(n.clone()),
                None => self.node(a),
            })
            .collect::<anyhow::Result<Vec<_>>>()?;
        *self.nodes.write().unwrap_or_else(|p| p.into_inner()) = Arc::new(next);
        Ok(())
    }

    fn snapshot(&self) -> Arc<Vec<Arc<Node>>> {
        self.nodes.read().unwrap_or_else(|p| p.into_inner()).clone()
    }

    /// Every agent, healthy or not.
    pub fn all(&self) -> Vec<Arc<Node>> {
        self.snapshot().to_vec()
    }

    /// Number of healthy agents.
    pub fn healthy(&self) -> usize {
        self.snapshot().iter().filter(|n| n.healthy.load(Ordering::Acquire)).count()
    }

    /// The healthy agents' counts, from their last status answers.
    pub fn totals(&self) -> crate::metrics::NodeTotals {
        let mut t = crate::metrics::NodeTotals::default();
        for n in self.snapshot().iter().filter(|n| n.healthy.load(Ordering::Acquire)) {
            t.healthy += 1;
            if let Some(s) = n.last_status() {
                t.warm_sandboxes += u64::from(s.warm_sandboxes);
                t.warm_memory_bytes = t.warm_memory_bytes.saturating_add(s.warm_memory_bytes);
                t.idle_cpu_ms = t.idle_cpu_ms.saturating_add(s.idle_cpu_ms);
                t.idle_discards = t.idle_discards.saturating_add(s.idle_discards);
            }
        }
        t
    }

    /// The healthy agents.
    pub fn healthy_nodes(&self) -> Vec<Arc<Node>> {
        self.snapshot().iter().filter(|n| n.healthy.load(Ordering::Acquire)).cloned().collect()
    }

    /// The agent named `name` (as an execution record names its node).
    pub fn named(&self, name: &str) -> Option<Arc<Node>> {
        self.snapshot().iter().find(|n| n.name() == name).cloned()
    }


    /// Marks the nodes named `names` cordoned (and no others): they get no
    /// new calls while an uncordoned healthy node exists; running calls
    /// finish there.
    pub fn cordon(&self, names: std::collections::HashSet<String>) {
        *self.cordoned.write().unwrap_or_else(|p| p.into_inner()) = Arc::new(names);
        self.dispatch();
    }

    /// Which nodes take calls: the healthy uncordoned ones; when none is,
    /// the healthy ones; when none is healthy, every node that has answered
    /// before (the last node is tried rather than every call refused: a
    /// busy one serves, a dead one fails the call at once).
    fn in_service(&self) -> impl Fn(&Node) -> bool {
        let cordoned = self.cordoned.read().unwrap_or_else(|p| p.into_inner()).clone();
        let healthy = |n: &Node| n.healthy.load(Ordering::Acquire);
        let open = move |n: &Node| cordoned.is_empty() || !cordoned.contains(&n.name());
        let nodes = self.snapshot();
        let any_open = nodes.iter().any(|n| healthy(n) && open(n));
        let any_healthy = any_open || nodes.iter().any(|n| healthy(n));
        move |n: &Node| match (any_open, any_healthy) {
            (true, _) => healthy(n) && open(n),
            (false, true) => healthy(n),
            (false, false) => n.capacity.load(Ordering::Acquire) > 0,
        }
    }

    /// Whether any node takes calls.
    fn any_in_service(&self) -> bool {
        let usable = self.in_service();
        self.snapshot().iter().any(|n| usable(n))
    }

    /// Checks every agent once.
    pub async fn check_all(&self) {
        let nodes = self.snapshot();
        let checks = nodes.iter().map(|n| check(n));
        futures_util::future::join_all(checks).await;
        if !self.any_in_service() {
            // Nothing to wait for: every waiter answers "no node" now.
            self.queue().fail_all();
        } else {
            // A node back, or larger: its slots go to the waiters.
            self.dispatch();
        }
    }

    fn queue(&self) -> std::sync::MutexGuard<'_, queue::Queue> {
        // Each critical section leaves the queue whole, so a poisoned lock is consistent.
        self.waiting.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Requests waiting for a node slot now.
    pub fn waiting(&self) -> usize {
        self.queue().len()
    }

    /// Some healthy node has a free slot.
    fn any_free(&self) -> bool {
        let usable = self.in_service();
        self.snapshot().iter().any(|n| usable(n) && n.free() > 0)
    }

    /// Checks agents every `period` until the task is dropped.
    pub async fn health_loop(self: Arc<Self>, period: Duration) {
        loop {
            self.check_all().await;
            tokio::time::sleep(period).await;
        }
    }

    /// Takes a slot on the healthy node with the most free slots, waiting up
    /// to `wait` in order for one to free up: 503 when no node is healthy,
    /// 429 when none freed in time.
    pub async fn lease(self: &Arc<Self>, wait: Duration) -> Result<Lease, ExecError> {
        self.lease_for(None, None, tokio::time::Instant::now() + wait).await
    }

    /// The healthy node a thread belongs on: rendezvous hashing of the node
    /// names with the thread, so every gateway replica picks the same node
    /// (where the thread is warm and its one-at-a-time lock lives), and
    /// only the threads of a node that leaves move elsewhere.
    pub fn home_of(&self, thread: &str) -> Option<Arc<Node>> {
        let usable = self.in_service();
        self.snapshot().iter().filter(|n| usable(n)).max_by_key(|n| rendezvous(&n.name(), thread)).cloned()
    }

    /// Like [`Nodes::lease`], until `deadline`; with a thread, only on the
    /// thread's node; with an image (digest, or reference when none is
    /// pinned), on a node where it is warm if one has a free slot, else on
    /// any (which pulls it). Requests that wait are served in order.
    pub async fn lease_for(self: &Arc<Self>, thread: Option<&str>, image: Option<&str>, deadline: tokio::time::Instant) -> Result<Lease, ExecError> {
        let want = match thread {
            Some(t) => queue::Want::Home(t.to_string()),
            None => queue::Want::Any(image.map(str::to_string)),
        };
        let (id, rx) = {
            let mut q = self.queue();
            // Nobody waits: a free slot is this request's at once.
            if q.is_empty() {
                if let Some(node) = self.take_for(&want) {
                    return Ok(Lease { nodes: self.clone(), node });
                }
            }
            if !self.any_in_service() {
                return Err(ExecError::NoNode);
            }
            q.push(want)
        };
        // A slot may be free for an earlier waiter (or this one) already.
        self.dispatch();
        let mut ticket = queue::Ticket { nodes: self.clone(), id, rx: Some(rx) };
        let granted = match ticket.rx.as_mut() {
            Some(rx) => tokio::time::timeout_at(deadline, rx).await,
            None => return Err(ExecError::NoNode),
        };
        let node = match granted {
            Ok(Ok(node)) => {
                ticket.rx = None;
                Some(node)
            }
            // The queue was failed: no node is healthy.
            Ok(Err(_)) => return Err(ExecError::NoNode),
            // A grant racing the deadline still counts.
            Err(_) => ticket.leave(),
        };
        match node {
            Some(node) => Ok(Lease { nodes: self.clone(), node }),
            None if !self.any_in_service() => Err(ExecError::NoNode),
            None => Err(ExecError::Busy("every node was at capacity")),
        }
    }

    /// A slot on the healthy node with the most free slots among those
    /// `fits` accepts, taken.
    fn take_where(&self, fits: impl Fn(&Node) -> bool) -> Option<Arc<Node>> {
        let nodes = self.snapshot();
        let in_service = self.in_service();
        loop {
            let usable = || nodes.iter().filter(|n| in_service(n) && n.free() > 0 && fits(n));
            let most = usable().map(|n| n.free()).max()?;
            let ties: Vec<&Arc<Node>> = usable().filter(|n| n.free() == most).collect();
            let Some(best) = ties.get(self.turn.fetch_add(1, Ordering::Relaxed) % ties.len().max(1)) else { continue };
            if best.try_take() {
                return Some(Arc::clone(best));
            }
        }
    }
}

/// Rendezvous score of `node` for `thread`.
fn rendezvous(node: &str, thread: &str) -> u64 {
    use sha2::Digest;
    let digest = sha2::Sha256::new().chain_update(node.as_bytes()).chain_update([0u8]).chain_update(thread.as_bytes()).finalize();
    u64::from_be_bytes(digest[..8].try_into().unwrap_or_default())
}

/// How long a status check may take.
const CHECK_TIMEOUT: Duration = Duration::from_secs(2);
/// How long a node that stops answering (checks time out: it may be busy,
/// not dead) stays in service. A refused connection or an error answer
/// takes it out at once; a late answer never does before this.
pub const SILENT_LIMIT: Duration = Duration::from_secs(10);

async fn check(node: &Node) {
    let asked = crate::records::now_ms();
    let result = tokio::time::timeout(CHECK_TIMEOUT, node.agent.status()).await;
    match result {
        Ok(Ok(s)) => answered(node, asked, s),
        Ok(Err(status)) => down(node, &format!("{}: {}", status.code(), status.message())),
        Err(_) => late(node, asked),
    }
}

fn answered(node: &Node, asked: i64, s: warren_proto::agent::StatusResponse) {
    node.capacity.store(s.max_executions, Ordering::Release);
    if let Ok(mut n) = node.name.lock() {
        n.clone_from(&s.node_name);
    }
    if let Ok(mut warm) = node.warm.write() {
        *warm = s.images.iter().flat_map(|i| [i.reference.clone(), i.digest.clone()]).collect();
    }
    let (name, capacity) = (s.node_name.clone(), s.max_executions);
    if let Ok(mut last) = node.last.write() {
        *last = Some(s);
    }
    node.last_asked_ms.fetch_max(asked, Ordering::AcqRel);
    if !node.healthy.swap(true, Ordering::AcqRel) {
        info!(node = %node.address, name = %name, capacity, "node-agent healthy");
    }
}

/// A check that timed out: the node stays in service until it has not
/// answered for [`SILENT_LIMIT`] (a node busy with calls answers late;
/// taking it out would refuse work it is doing).
fn late(node: &Node, asked: i64) {
    let heard = node.last_asked_ms.load(Ordering::Acquire).max(node.since_ms);
    let silent = Duration::from_millis((asked - heard).max(0) as u64);
    if silent >= SILENT_LIMIT {
        down(node, &format!("no status answer for {} s", silent.as_secs()));
    } else if node.is_healthy() {
        info!(node = %node.address, silent_ms = silent.as_millis() as u64, "node-agent status check timed out; kept in service while it has answered within the limit");
    }
}

fn down(node: &Node, why: &str) {
    if node.healthy.swap(false, Ordering::AcqRel) {
        warn!(node = %node.address, reason = why, "node-agent unhealthy");
    }
}

#[cfg(test)]
mod tests {
    use super::rendezvous;

    #[test]
    fn rendezvous_moves_only_the_threads_of_a_leaving_node() {
        let pick = |nodes: &[&str], t: &str| nodes.iter().copied().max_by_key(|n| rendezvous(n, t)).unwrap().to_string();
        let all = ["node-a", "node-b", "node-c"];
        let threads: Vec<String> = (0..300).map(|i| format!("ns/key/t{i}")).collect();
        let before: Vec<String> = threads.iter().map(|t| pick(&all, t)).collect();
        for n in all {
            assert!(before.iter().filter(|b| *b == n).count() > 50, "{n} gets a fair share");
        }
        let after: Vec<String> = threads.iter().map(|t| pick(&["node-a", "node-c"], t)).collect();
        for (b, a) in before.iter().zip(&after) {
            if b != "node-b" {
                assert_eq!(a, b, "a thread not on the leaving node stays put");
            }
        }
    }

    /// A node whose status answers are set by the test.
    #[derive(Debug)]
    struct Double(std::sync::Mutex<Option<Result<warren_proto::agent::StatusResponse, tonic::Status>>>);

    impl super::Agent for Double {
        fn execute(&self, _: warren_proto::agent::ExecuteRequest) -> futures_util::future::BoxFuture<'static, Result<super::agent::EventStream, tonic::Status>> {
            Box::pin(async { Err(tonic::Status::unimplemented("double")) })
        }
        fn delete_thread(&self, _: warren_proto::agent::DeleteThreadRequest, _: &str) -> futures_util::future::BoxFuture<'static, Result<(), tonic::Status>> {
            Box::pin(async { Err(tonic::Status::unimplemented("double")) })
        }
        fn status(&self) -> futures_util::future::BoxFuture<'static, Result<warren_proto::agent::StatusResponse, tonic::Status>> {
            // None: the node never answers (the check times out).
            let answer = self.0.lock().unwrap().clone();
            Box::pin(async move {
                match answer {
                    Some(a) => a,
                    None => std::future::pending().await,
                }
            })
        }
        fn cancel(&self, _: &str) -> futures_util::future::BoxFuture<'static, Result<bool, tonic::Status>> {
            Box::pin(async { Ok(false) })
        }
        fn hold_key_slot(&self, _: &str, _: u32, _: u32) -> futures_util::future::BoxFuture<'static, Result<super::agent::HeldSlot, tonic::Status>> {
            Box::pin(async { Err(tonic::Status::unimplemented("double")) })
        }
    }

    fn status(name: &str) -> warren_proto::agent::StatusResponse {
        warren_proto::agent::StatusResponse { node_name: name.into(), max_executions: 2, ..Default::default() }
    }

    fn nodes(n: usize) -> (std::sync::Arc<super::Nodes>, Vec<std::sync::Arc<Double>>) {
        let doubles: Vec<_> = (0..n).map(|i| std::sync::Arc::new(Double(std::sync::Mutex::new(Some(Ok(status(&format!("n{i}")))))))).collect();
        let agents = doubles.iter().enumerate().map(|(i, d)| (format!("unix:/run/n{i}.sock").parse().unwrap(), d.clone() as std::sync::Arc<dyn super::Agent>)).collect();
        (super::Nodes::from_agents(agents), doubles)
    }

    #[tokio::test(start_paused = true)]
    async fn a_late_status_check_is_not_a_dead_node_but_silence_and_refusals_are() {
        let (nodes, doubles) = nodes(1);
        nodes.check_all().await;
        let node = nodes.all().remove(0);
        assert!(node.is_healthy());
        // Busy: its checks time out, and it stays in service within the limit.
        *doubles[0].0.lock().unwrap() = None;
        nodes.check_all().await;
        assert!(node.is_healthy(), "one late check took the node out");
        let answered = node.last_asked_ms.load(std::sync::atomic::Ordering::Acquire);
        super::late(&node, answered + super::SILENT_LIMIT.as_millis() as i64 - 1);
        assert!(node.is_healthy(), "late within the limit");
        // Silent past the limit: out.
        super::late(&node, answered + super::SILENT_LIMIT.as_millis() as i64);
        assert!(!node.is_healthy(), "silent past the limit");
        // It answers again: back. A refusal takes it out at once.
        *doubles[0].0.lock().unwrap() = Some(Ok(status("n0")));
        nodes.check_all().await;
        assert!(node.is_healthy());
        *doubles[0].0.lock().unwrap() = Some(Err(tonic::Status::unavailable("connection refused")));
        nodes.check_all().await;
        assert!(!node.is_healthy(), "a refused check");
    }

    #[tokio::test(start_paused = true)]
    async fn with_no_healthy_node_the_last_known_one_is_tried_rather_than_every_call_refused() {
        let (nodes, doubles) = nodes(2);
        // n0 has answered before; n1 never has.
        *doubles[1].0.lock().unwrap() = Some(Err(tonic::Status::unavailable("connection refused")));
        nodes.check_all().await;
        *doubles[0].0.lock().unwrap() = Some(Err(tonic::Status::unavailable("connection refused")));
        nodes.check_all().await;
        assert_eq!(nodes.healthy(), 0);
        let deadline = tokio::time::Instant::now() + std::time::Duration::from_secs(1);
        let lease = nodes.lease_for(None, None, deadline).await.expect("the node that answered before is tried");
        assert_eq!(lease.node.name(), "n0");
        let thread = nodes.lease_for(Some("ns/key/t"), None, deadline).await.expect("a thread's call too");
        assert_eq!(thread.node.name(), "n0");
        drop((lease, thread));
        // A node that is healthy again takes the calls, never the known-dead one.
        *doubles[1].0.lock().unwrap() = Some(Ok(status("n1")));
        nodes.check_all().await;
        for _ in 0..4 {
            assert_eq!(nodes.lease_for(None, None, deadline).await.unwrap().node.name(), "n1");
        }
        // No node has ever answered: refused at once.
        let (fresh, doubles) = self::nodes(1);
        *doubles[0].0.lock().unwrap() = Some(Err(tonic::Status::unavailable("connection refused")));
        fresh.check_all().await;
        assert!(matches!(fresh.lease_for(None, None, deadline).await, Err(crate::exec_error::ExecError::NoNode)));
    }

    #[tokio::test(start_paused = true)]
    async fn a_cordoned_node_gets_no_new_calls_while_another_can_take_them() {
        let (nodes, _doubles) = nodes(2);
        nodes.check_all().await;
        let deadline = tokio::time::Instant::now() + std::time::Duration::from_secs(1);
        nodes.cordon(["n0".to_string()].into());
        for _ in 0..4 {
            assert_eq!(nodes.lease_for(None, None, deadline).await.unwrap().node.name(), "n1");
        }
        // A thread whose home was the cordoned node moves while it is cordoned.
        let on_n0 = (0..100).map(|i| format!("ns/key/t{i}")).find(|t| super::rendezvous("n0", t) > super::rendezvous("n1", t)).unwrap();
        assert_eq!(nodes.lease_for(Some(&on_n0), None, deadline).await.unwrap().node.name(), "n1");
        // Every node cordoned: they still serve (better than refusing all).
        nodes.cordon(["n0".to_string(), "n1".to_string()].into());
        assert!(nodes.lease_for(None, None, deadline).await.is_ok());
        nodes.cordon(Default::default());
        assert_eq!(nodes.lease_for(Some(&on_n0), None, deadline).await.unwrap().node.name(), "n0", "uncordoned, it is the thread's home again");
    }
}
