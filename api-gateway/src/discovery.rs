//! Cluster mode: the node-agents are the running pods matching a label
//! selector (the chart's DaemonSet). Pods are watched directly: the oldest
//! API servers Warren supports predate discovery.k8s.io/v1 EndpointSlices.

use std::sync::Arc;

use futures_util::StreamExt;
use k8s_openapi::api::core::v1::Pod;
use kube::runtime::{reflector, watcher, WatchStreamExt};
use kube::{Api, Client};
use tracing::{info, warn};
use warren_proto::client::AgentAddress;

use crate::nodes::Nodes;

/// Addresses of the ready agent pods.
fn addresses(pods: &[Arc<Pod>], port: u16) -> Vec<AgentAddress> {
    let mut out: Vec<AgentAddress> = pods
        .iter()
        .filter(|p| p.metadata.deletion_timestamp.is_none())
        .filter_map(|p| p.status.as_ref())
        .filter(|s| s.phase.as_deref() == Some("Running"))
        .filter_map(|s| s.pod_ip.as_ref())
        .map(|ip| AgentAddress::Tcp(format!("http://{ip}:{port}")))
        .collect();
    out.sort_by_key(|a| a.to_string());
    out.dedup();
    out
}

/// Keeps `nodes` equal to the agent pods selected by `selector` in `namespace`.
pub async fn watch_loop(client: Client, namespace: String, selector: String, port: u16, nodes: Arc<Nodes>) {
    let api: Api<Pod> = Api::namespaced(client, &namespace);
    let (reader, writer) = reflector::store();
    let events = reflector(writer, watcher(api, watcher::Config::default().labels(&selector))).default_backoff();
    tokio::pin!(events);
    let mut last = Vec::new();
    while let Some(event) = events.next().await {
        match event {
            Ok(watcher::Event::InitApply(_)) | Ok(watcher::Event::Init) => continue,
            Ok(_) => {
                let now = addresses(&reader.state(), port);
                if now != last {
                    info!(agents = now.len(), "node-agent pods changed");
                    if let Err(e) = nodes.set(&now) {
                        warn!(error = %e, "bad agent address");
                    }
                    nodes.check_all().await;
                    last = now;
                }
            }
            Err(e) => warn!(error = %e, "watching node-agent pods failed; retrying"),
        }
    }
}
