//! Prometheus metrics. Every label has a small fixed set of values: route
//! templates (not raw paths), status codes, languages, outcomes.


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
        registry.register("executions_in_flight", "Executions running now", in_flight.clone());
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
        Metrics { registry, requests, durations, in_flight, healthy_nodes, warm_sandboxes, warm_memory, idle_cpu, idle_discards }
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

    /// Text exposition, with the node gauges refreshed.
    pub fn render(&self, nodes: NodeTotals) -> String {
        self.healthy_nodes.set(nodes.healthy as i64);
        self.warm_sandboxes.set(nodes.warm_sandboxes as i64);
        self.warm_memory.set(nodes.warm_memory_bytes.min(i64::MAX as u64) as i64);
        self.idle_cpu.set(nodes.idle_cpu_ms as f64 / 1000.0);
        self.idle_discards.set(nodes.idle_discards.min(i64::MAX as u64) as i64);
        let mut out = String::new();
        // Writing into a String cannot fail.
        let _ = prometheus_client::encoding::text::encode(&mut out, &self.registry);
        out
    }
}
