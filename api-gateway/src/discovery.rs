//! Cluster mode: the node-agents are the running pods matching a label
//! selector (the chart's DaemonSet). Pods are watched directly: the oldest
//! API servers Warren supports predate discovery.k8s.io/v1 EndpointSlices.
//! Nodes are watched too: a cordoned one (`kubectl drain`/`cordon`) gets no
//! new calls while another node can take them.

use std::sync::Arc;

use futures_util::StreamExt;
use k8s_openapi::api::core::v1::{Node, Pod};
use kube::runtime::{reflector, watcher, WatchStreamExt};
use kube::{Api, Client};
use warren_config::watch::ShortBackoff;
use tracing::{info, warn};
use warren_proto::client::AgentAddress;

use crate::nodes::Nodes;

/// Addresses of the ready agent pods (those `daemonset` controls, when set).
fn addresses(pods: &[Arc<Pod>], port: u16, daemonset: Option<&str>) -> Vec<AgentAddress> {
    let mut out: Vec<AgentAddress> = pods
        .iter()
        .filter(|p| p.metadata.deletion_timestamp.is_none())
        .filter(|p| daemonset.is_none_or(|name| controlled_by(p, name)))
        .filter_map(|p| p.status.as_ref())
        .filter(|s| s.phase.as_deref() == Some("Running"))
        .filter_map(|s| s.pod_ip.as_ref())
        .map(|ip| AgentAddress::Tcp(format!("https://{ip}:{port}")))
        .collect();
    out.sort_by_key(|a| a.to_string());
    out.dedup();
    out
}

/// True when the DaemonSet `name` is `pod`'s controller: a pod that merely
/// carries the agents' labels (anyone who may create pods in the namespace
/// could add those) is not sent code and bearer tokens.
fn controlled_by(pod: &Pod, name: &str) -> bool {
    pod.metadata.owner_references.iter().flatten().any(|o| o.controller == Some(true) && o.kind == "DaemonSet" && o.api_version == "apps/v1" && o.name == name)
}

/// Keeps `nodes` equal to the agent pods selected by `selector` in
/// `namespace` (and controlled by the DaemonSet `daemonset`, when set).
pub async fn watch_loop(client: Client, namespace: String, selector: String, daemonset: Option<String>, port: u16, nodes: Arc<Nodes>) {
    tokio::join!(pods_loop(client.clone(), namespace, selector, daemonset, port, nodes.clone()), cordon_loop(client, nodes));
}

/// The names of the cordoned nodes among `all`.
fn cordoned(all: &[Arc<Node>]) -> std::collections::BTreeSet<String> {
    all.iter().filter(|n| n.spec.as_ref().and_then(|s| s.unschedulable).unwrap_or(false)).filter_map(|n| n.metadata.name.clone()).collect()
}

/// Keeps `nodes` told which Kubernetes nodes are cordoned. Without the
/// right to watch nodes (an older chart's RBAC) it says so once and keeps
/// retrying: placement then ignores cordons.
async fn cordon_loop(client: Client, nodes: Arc<Nodes>) {
    let api: Api<Node> = Api::all(client);
    let (reader, writer) = reflector::store();
    let events = reflector(writer, watcher(api, watcher::Config::default())).backoff(ShortBackoff::default());
    tokio::pin!(events);
    let mut last = std::collections::BTreeSet::new();
    let mut warned = false;
    while let Some(event) = events.next().await {
        match event {
            Ok(watcher::Event::InitApply(_)) | Ok(watcher::Event::Init) => continue,
            Ok(_) => {
                let now = cordoned(&reader.state());
                if now != last {
                    info!(cordoned = ?now, "cordoned nodes changed: they get no new calls");
                    nodes.cordon(now.iter().cloned().collect());
                    last = now;
                }
            }
            Err(e) if !warned => {
                warned = true;
                warn!(error = %e, "watching nodes failed (the gateway needs get/list/watch on nodes); cordons are not seen until it works");
            }
            Err(_) => {}
        }
    }
}

async fn pods_loop(client: Client, namespace: String, selector: String, daemonset: Option<String>, port: u16, nodes: Arc<Nodes>) {
    let api: Api<Pod> = Api::namespaced(client, &namespace);
    let (reader, writer) = reflector::store();
    let events = reflector(writer, watcher(api, watcher::Config::default().labels(&selector))).backoff(ShortBackoff::default());
    tokio::pin!(events);
    let mut last = Vec::new();
    while let Some(event) = events.next().await {
        match event {
            Ok(watcher::Event::InitApply(_)) | Ok(watcher::Event::Init) => continue,
            Ok(_) => {
                let now = addresses(&reader.state(), port, daemonset.as_deref());
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

#[cfg(test)]
mod tests {
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference;

    use super::*;

    fn pod(ip: &str, owner: Option<(&str, &str, bool)>) -> Arc<Pod> {
        let mut p = Pod::default();
        p.metadata.owner_references = owner.map(|(kind, name, controller)| {
            vec![OwnerReference { api_version: "apps/v1".into(), kind: kind.into(), name: name.into(), uid: "u".into(), controller: Some(controller), ..Default::default() }]
        });
        p.status = Some(k8s_openapi::api::core::v1::PodStatus { phase: Some("Running".into()), pod_ip: Some(ip.into()), ..Default::default() });
        Arc::new(p)
    }

    #[test]
    fn only_pods_the_agents_daemonset_controls_are_agents() {
        let pods = [
            pod("10.0.0.1", Some(("DaemonSet", "warren-node-agent", true))),
            pod("10.0.0.2", None),
            pod("10.0.0.3", Some(("DaemonSet", "other", true))),
            pod("10.0.0.4", Some(("ReplicaSet", "warren-node-agent", true))),
            pod("10.0.0.5", Some(("DaemonSet", "warren-node-agent", false))),
        ];
        let only = addresses(&pods, 7443, Some("warren-node-agent"));
        assert_eq!(only, [AgentAddress::Tcp("https://10.0.0.1:7443".into())]);
        assert_eq!(addresses(&pods, 7443, None).len(), 5, "without a DaemonSet name, labels decide");
    }
}
