//! Prometheus metrics. Every label has a small fixed set of values: route
//! templates (not raw paths), status codes, languages, outcomes, and node
//! names (one per node-agent: bounded by the cluster's size).
//!
//! The autoscaling signals: `executions_in_flight` (this replica's admitted
//! executions, each holding a node slot: the per-pod metric an HPA averages),
//! `executions_queued` (this replica's requests waiting for a node slot: the
//! queue depth KEDA can scale on), and `node_running` / `node_capacity` per
//! node-agent (what the cluster can still take).


use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::Histogram;
use prometheus_client::registry::Registry;

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct RequestLabels {
    route: String,
    status: u16,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct NodeLabels {
    node: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ExecutionLabels {
    language: &'static str,
    outcome: &'static str,
}

/// The gateway's metrics.
pub struct Metrics {
    registry: Registry,
    requests: Family<RequestLabels, Counter>,
    durations: Family<ExecutionLabels, Histogram>,
    in_flight: Gauge,
    healthy_nodes: Gauge,
    warm_sandboxes: Gauge,
    warm_memory: Gauge,
    idle_cpu: Gauge<f64, std::sync::atomic::AtomicU64>,
    idle_discards: Gauge,
    queued: Gauge,
    node_running: Family<NodeLabels, Gauge>,
    node_capacity: Family<NodeLabels, Gauge>,
    node_started: Family<NodeLabels, Gauge>,
    /// One scrape at a time: the node families are cleared and refilled.
    rendering: std::sync::Mutex<()>,
}

/// What the healthy node-agents last said of themselves, summed.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct NodeTotals {
    /// Node-agents answering health checks.
    pub healthy: usize,
    /// Sandboxes waiting in their warm pools.
    pub warm_sandboxes: u64,
    /// Memory those sandboxes hold, bytes.
    pub warm_memory_bytes: u64,
    /// CPU their pools used before calls since each agent started, ms.
    pub idle_cpu_ms: u64,
    /// Idle sandboxes discarded for using CPU.
    pub idle_discards: u64,
}

/// One healthy node-agent's slots, from its last status answer.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct NodeSlots {
    /// The name it reported.
    pub name: String,
    /// Executions it said were running.
    pub running: u32,
    /// Concurrent executions it takes (its `max_executions`).
    pub capacity: u32,
    /// Executions it has started since it started (its own count).
    pub started: u64,
}

impl NodeSlots {
    /// The slots a status answer from node `name` tells.
    pub fn of(name: String, status: &warren_proto::agent::StatusResponse) -> NodeSlots {
        NodeSlots { name, running: status.running_executions, capacity: status.max_executions, started: status.executions_total }
    }
}

/// The load signals an autoscaler reads besides the in-flight gauge.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Load {
    /// Requests on this replica waiting, in order, for a node slot.
    pub queued: usize,
    /// The healthy node-agents' slots.
    pub nodes: Vec<NodeSlots>,
}

impl std::fmt::Debug for Metrics {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Metrics")
    }
}

impl Default for Metrics {
    fn default() -> Self {
        let mut registry = Registry::with_prefix("warren_gateway");
        let requests = Family::<RequestLabels, Counter>::default();
        registry.register("http_requests", "HTTP requests by route template and status", requests.clone());
        let durations = Family::<ExecutionLabels, Histogram>::new_with_constructor(|| {
            // 1 ms … ~65 s, doubling: covers a bash echo and long jobs alike.
            Histogram::new(prometheus_client::metrics::histogram::exponential_buckets(0.001, 2.0, 17))
        });
        registry.register("execution_duration_seconds", "Execution wall time as seen by the gateway, by language and outcome", durations.clone());
        let in_flight = Gauge::default();
        // Admitted executions holding a node slot on this replica, until their
        // answer is out: the per-pod figure an HPA averages across replicas.
        registry.register("executions_in_flight", "Executions this gateway replica admitted and runs now (each holds a node slot)", in_flight.clone());
        let queued = Gauge::default();
        registry.register("executions_queued", "Execution requests on this gateway replica waiting, in order, for a node slot (queue depth)", queued.clone());
        let node_running = Family::<NodeLabels, Gauge>::default();
        registry.register("node_running", "Executions a healthy node-agent said it runs, by node", node_running.clone());
        let node_capacity = Family::<NodeLabels, Gauge>::default();
        registry.register("node_capacity", "Concurrent executions a healthy node-agent takes (its max_executions), by node", node_capacity.clone());
        let node_started = Family::<NodeLabels, Gauge>::default();
        registry.register("node_executions_started", "Executions a healthy node-agent has started since it started (its own count: how calls spread), by node", node_started.clone());
        let healthy_nodes = Gauge::default();
        registry.register("healthy_nodes", "Node-agents answering health checks", healthy_nodes.clone());
        let warm_sandboxes = Gauge::default();
        registry.register("warm_sandboxes", "Sandboxes waiting in the healthy nodes' warm pools", warm_sandboxes.clone());
        let warm_memory = Gauge::default();
        registry.register("warm_sandbox_memory_bytes", "Memory the healthy nodes' idle warm sandboxes hold", warm_memory.clone());
        let idle_cpu = Gauge::<f64, std::sync::atomic::AtomicU64>::default();
        registry.register("warm_pool_cpu_seconds", "CPU the healthy nodes' warm pools used before calls (setup, warm imports; charged to no key), since each agent started", idle_cpu.clone());
        let idle_discards = Gauge::default();
        registry.register("warm_pool_idle_discards", "Pooled sandboxes the healthy nodes discarded for using CPU while idle, since each agent started", idle_discards.clone());
        Metrics { registry, requests, durations, in_flight, healthy_nodes, warm_sandboxes, warm_memory, idle_cpu, idle_discards, queued, node_running, node_capacity, node_started, rendering: Default::default() }
    }
}

/// Counts an execution as running until dropped.
#[derive(Debug)]
pub struct InFlight(Gauge);

impl Drop for InFlight {
    fn drop(&mut self) {
        self.0.dec();
    }
}

impl Metrics {
    /// Counts one HTTP response.
    pub fn request(&self, route: &str, status: u16) {
        self.requests.get_or_create(&RequestLabels { route: route.to_string(), status }).inc();
    }

    /// Records one finished execution.
    pub fn execution(&self, language: &'static str, outcome: &'static str, seconds: f64) {
        self.durations.get_or_create(&ExecutionLabels { language, outcome }).observe(seconds);
    }

    /// Marks one execution running.
    pub fn in_flight(&self) -> InFlight {
        self.in_flight.inc();
        InFlight(self.in_flight.clone())
    }

    /// Executions this replica runs now (the console shows it).
    pub fn executions_in_flight(&self) -> i64 {
        self.in_flight.get()
    }

    /// Text exposition, with the node gauges and the load refreshed.
    pub fn render(&self, nodes: NodeTotals, load: &Load) -> String {
        // A poisoned lock guards no data: the gauges are refilled below anyway.
        let _one = self.rendering.lock().unwrap_or_else(|p| p.into_inner());
        self.healthy_nodes.set(nodes.healthy as i64);
        self.warm_sandboxes.set(nodes.warm_sandboxes as i64);
        self.warm_memory.set(nodes.warm_memory_bytes.min(i64::MAX as u64) as i64);
        self.idle_cpu.set(nodes.idle_cpu_ms as f64 / 1000.0);
        self.idle_discards.set(nodes.idle_discards.min(i64::MAX as u64) as i64);
        self.queued.set(load.queued.min(i64::MAX as usize) as i64);
        // Refilled from the current set, so a node that left (or stopped
        // answering) has no series; its name is the label, one per node.
        self.node_running.clear();
        self.node_capacity.clear();
        self.node_started.clear();
        for n in &load.nodes {
            let label = NodeLabels { node: n.name.clone() };
            // Two agents reporting one name are added up, not overwritten.
            self.node_running.get_or_create(&label).inc_by(i64::from(n.running));
            self.node_capacity.get_or_create(&label).inc_by(i64::from(n.capacity));
            self.node_started.get_or_create(&label).inc_by(n.started.min(i64::MAX as u64) as i64);
        }
        let mut out = String::new();
        // Writing into a String cannot fail.
        let _ = prometheus_client::encoding::text::encode(&mut out, &self.registry);
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn slots(name: &str, running: u32, capacity: u32) -> NodeSlots {
        NodeSlots { name: name.into(), running, capacity, started: 0 }
    }

    #[test]
    fn the_autoscaling_signals_follow_the_queue_and_the_node_set() {
        let m = Metrics::default();
        let _a = m.in_flight();
        let _b = m.in_flight();
        let load = Load { queued: 3, nodes: vec![slots("node-a", 2, 32), slots("node-b", 0, 8)] };
        let text = m.render(NodeTotals { healthy: 2, ..NodeTotals::default() }, &load);
        for want in [
            "warren_gateway_executions_in_flight 2\n",
            "warren_gateway_executions_queued 3\n",
            "warren_gateway_node_running{node=\"node-a\"} 2\n",
            "warren_gateway_node_capacity{node=\"node-a\"} 32\n",
            "warren_gateway_node_running{node=\"node-b\"} 0\n",
            "warren_gateway_node_capacity{node=\"node-b\"} 8\n",
        ] {
            assert!(text.contains(want), "{want} not in:\n{text}");
        }
        assert_eq!(m.executions_in_flight(), 2);
        // node-b left the set: its series go with it; node-a's values are the latest, not added up.
        let text = m.render(NodeTotals::default(), &Load { queued: 0, nodes: vec![slots("node-a", 5, 32)] });
        assert!(!text.contains("node-b"), "{text}");
        assert!(text.contains("warren_gateway_node_running{node=\"node-a\"} 5\n") && text.contains("warren_gateway_node_capacity{node=\"node-a\"} 32\n"), "{text}");
        assert!(text.contains("warren_gateway_executions_queued 0\n"), "{text}");
        // Two agents reporting one name count together.
        let text = m.render(NodeTotals::default(), &Load { queued: 0, nodes: vec![slots("twin", 1, 4), slots("twin", 2, 4)] });
        assert!(text.contains("warren_gateway_node_running{node=\"twin\"} 3\n") && text.contains("warren_gateway_node_capacity{node=\"twin\"} 8\n"), "{text}");
    }
}
