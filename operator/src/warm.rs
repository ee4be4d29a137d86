//! Warming a Sandbox's image on every node: the operator calls each
//! node-agent's `WarmImage` (mutual TLS and the agent token, like a
//! gateway), and reads the pull secret the image needs.

use std::time::Duration;

use k8s_openapi::api::core::v1::Pod;
use kube::api::{Api, ListParams};
use warren_core::secret::Credentials;
use warren_core::warm::WarmModules;
use warren_proto::agent::{self as pb, node_agent_client::NodeAgentClient};
use warren_proto::client::AgentAddress;

pub use crate::agent_access::AgentAccess;
use crate::context::{Context, Error};

/// Longest a node may take to pull and unpack an image for the operator.
const WARM_TIMEOUT: Duration = Duration::from_secs(600);

/// A running node-agent pod.
#[derive(Debug, Clone)]
pub struct AgentPod {
    /// Node it runs on.
    pub node: String,
    /// Pod IP.
    pub ip: String,
}

/// The running node-agent pods.
pub async fn agent_pods(ctx: &Context) -> Result<Vec<AgentPod>, Error> {
    let pods = Api::<Pod>::namespaced(ctx.client.clone(), &ctx.agent_namespace).list(&ListParams::default().labels(&ctx.agent_selector)).await?;
    let mut out: Vec<AgentPod> = pods
        .into_iter()
        .filter(|p| p.status.as_ref().and_then(|s| s.phase.as_deref()) == Some("Running"))
        .filter_map(|p| Some(AgentPod { node: p.spec?.node_name?, ip: p.status?.pod_ip? }))
        .collect();
    out.sort_by(|a, b| a.node.cmp(&b.node));
    Ok(out)
}

/// Asks one agent to warm `image`.
async fn warm_one(access: &AgentAccess, pod: &AgentPod, image: &str, pull: Option<&Credentials>, warm: &WarmModules) -> Result<pb::WarmImageResponse, String> {
    let host = if pod.ip.contains(':') { format!("[{}]", pod.ip) } else { pod.ip.clone() };
    let address = AgentAddress::Tcp(format!("https://{host}:{}", access.port));
    let channel = warren_proto::client::connect(&address, &access.tls).await.map_err(|e| format!("cannot reach the node-agent: {e}"))?;
    let mut request = tonic::Request::new(pb::WarmImageRequest {
        image: image.to_string(),
        image_pull: pull.map(|c| pb::Credentials { values: c.0.clone().into_iter().collect() }),
        warm: [(pb::Language::Python, &warm.python), (pb::Language::Node, &warm.node)]
            .into_iter()
            .filter(|(_, m)| !m.is_empty())
            .map(|(l, m)| pb::WarmModules { language: l as i32, modules: m.clone() })
            .collect(),
    });
    request.set_timeout(WARM_TIMEOUT);
    if let Some(v) = access.token.as_ref().and_then(|t| format!("Bearer {t}").parse().ok()) {
        request.metadata_mut().insert("authorization", v);
    }
    let reply = tokio::time::timeout(WARM_TIMEOUT, NodeAgentClient::new(channel).warm_image(request)).await.map_err(|_| "timed out".to_string())?;
    reply.map(|r| r.into_inner()).map_err(|s| s.message().to_string())
}

/// Warms `image` on every agent in parallel (trying `warm`'s modules in
/// it): (node, result) per agent.
pub async fn warm_everywhere(access: &AgentAccess, pods: &[AgentPod], image: &str, pull: Option<&Credentials>, warm: &WarmModules) -> Vec<(String, Result<pb::WarmImageResponse, String>)> {
    let calls = pods.iter().map(|pod| async move { (pod.node.clone(), warm_one(access, pod, image, pull, warm).await) });
    futures_util::future::join_all(calls).await
}

/// What the nodes answered, summarised.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Summary {
    /// The digest most nodes hold.
    pub digest: String,
    /// The nodes holding it, sorted.
    pub nodes: Vec<String>,
    /// Its interpreters and their versions.
    pub languages: Vec<(pb::Language, String)>,
    /// Warm modules that did not load there (one node's answer).
    pub warm_failures: Vec<pb::WarmFailure>,
}

/// The digest most nodes hold, the nodes holding it, its interpreters and
/// warm failures; or the first error when no node could warm it.
pub fn summarise(results: Vec<(String, Result<pb::WarmImageResponse, String>)>) -> Result<Summary, String> {
    let mut by_digest: std::collections::BTreeMap<String, Summary> = Default::default();
    let mut first_error = None;
    for (node, result) in results {
        match result {
            Ok(r) => {
                let entry = by_digest.entry(r.digest.clone()).or_insert_with(|| Summary { digest: r.digest.clone(), nodes: vec![], languages: vec![], warm_failures: vec![] });
                entry.nodes.push(node);
                entry.languages = r.languages.iter().map(|l| (l.language(), l.version.clone())).collect();
                entry.warm_failures = r.warm_failures;
            }
            Err(e) => {
                first_error.get_or_insert(format!("node {node}: {e}"));
            }
        }
    }
    match by_digest.into_values().max_by_key(|s| s.nodes.len()) {
        Some(mut best) => {
            best.nodes.sort();
            Ok(best)
        }
        None => Err(first_error.unwrap_or_else(|| "no node-agent is running".into())),
    }
}

/// The registry credentials a Sandbox's `imagePullSecret` holds for its image.
pub async fn pull_secret(ctx: &Context, ns: &str, secret: Option<&str>, image: &str) -> Result<Result<Option<Credentials>, String>, Error> {
    let Some(name) = secret else { return Ok(Ok(None)) };
    let s = match ctx.tenant_secret(ns, name, None).await? {
        Ok(Some(s)) => s,
        Ok(None) => return Ok(Err(format!("imagePullSecret {name:?} does not exist"))),
        Err(why) => return Ok(Err(format!("imagePullSecret: {why}"))),
    };
    let data = s.data.unwrap_or_default();
    let Some(config) = data.get(".dockerconfigjson") else {
        return Ok(Err(format!("imagePullSecret {name:?} has no .dockerconfigjson entry (type kubernetes.io/dockerconfigjson)")));
    };
    Ok(warren_config::image::pull_credentials(&config.0, image).map_err(|e| format!("imagePullSecret {name:?}: {e}")))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ok(digest: &str) -> Result<pb::WarmImageResponse, String> {
        Ok(pb::WarmImageResponse { digest: digest.into(), languages: vec![pb::ImageLanguage { language: pb::Language::Python as i32, version: "3.12.1".into() }], bytes: 1, warm_failures: vec![] })
    }

    #[test]
    fn the_digest_most_nodes_hold_wins() {
        let results = vec![("n3".to_string(), ok("sha256:new")), ("n1".to_string(), ok("sha256:old")), ("n2".to_string(), ok("sha256:new")), ("n4".to_string(), Err("registry: unauthorized".into()))];
        let s = summarise(results).unwrap();
        assert_eq!((s.digest.as_str(), s.nodes), ("sha256:new", vec!["n2".to_string(), "n3".to_string()]));
        assert_eq!(s.languages, [(pb::Language::Python, "3.12.1".to_string())]);
        assert_eq!(summarise(vec![("n1".into(), Err("registry: unauthorized".into()))]).unwrap_err(), "node n1: registry: unauthorized");
        assert_eq!(summarise(vec![]).unwrap_err(), "no node-agent is running");
    }
}
