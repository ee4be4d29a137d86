//! Sandbox status: Ready when its spec passes the same checks single-machine
//! mode applies (`host` is warm on every node by definition), with the nodes
//! where it is warm.

use std::sync::Arc;

use kube::api::Api;
use kube::runtime::controller::Action;
use kube::{Resource, ResourceExt};
use warren_api::reasons;
use warren_api::{Sandbox, SandboxStatus};
use warren_config::Where;

use crate::context::{Context, Error};
use crate::status::{self, now, RESYNC};

/// Reconciles one Sandbox.
pub async fn sandbox(sb: Arc<Sandbox>, ctx: Arc<Context>) -> Result<Action, Error> {
    let ns = sb.namespace().ok_or(Error::NoNamespace)?;
    let at = Where { file: String::new(), object: format!("Sandbox {ns}/{}", sb.name_any()) };
    let checked = warren_config::check_sandbox(&at, &sb.spec);
    let old = sb.status.clone().unwrap_or_default();
    let (ok, reason, message, languages): (bool, &str, String, _) = match &checked {
        Ok(c) => match c.unsupported() {
            Some(why) => (false, reasons::UNSUPPORTED, why.to_string(), Vec::new()),
            None => (true, reasons::VALID, format!("image {} is available on every node", c.image), c.languages.clone()),
        },
        Err(e) => (false, reasons::INVALID_SPEC, e.to_string(), Vec::new()),
    };
    let conditions = status::ready(ok, reason, &message, sb.meta().generation, &old.conditions, now());
    let warm_nodes = if ok { agent_nodes(&ctx).await? } else { Vec::new() };
    let new = SandboxStatus { conditions, observed_generation: sb.meta().generation, languages, warm_nodes };
    if status::differs(&old.conditions, &new.conditions)
        || old.languages != new.languages
        || old.observed_generation != new.observed_generation
        || old.warm_nodes != new.warm_nodes
    {
        status::patch(&Api::<Sandbox>::namespaced(ctx.client.clone(), &ns), &sb.name_any(), &new).await?;
        if status::ready_of(&old.conditions) != status::ready_of(&new.conditions) {
            ctx.event(sb.as_ref(), !ok, reason, message).await;
        }
    }
    Ok(Action::requeue(RESYNC))
}

/// Nodes running a ready node-agent: where a `host` Sandbox is warm.
async fn agent_nodes(ctx: &Context) -> Result<Vec<String>, Error> {
    let pods = Api::<k8s_openapi::api::core::v1::Pod>::namespaced(ctx.client.clone(), &ctx.agent_namespace)
        .list(&kube::api::ListParams::default().labels(&ctx.agent_selector))
        .await?;
    let mut nodes: Vec<String> = pods
        .into_iter()
        .filter(|p| p.status.as_ref().and_then(|s| s.phase.as_deref()) == Some("Running"))
        .filter_map(|p| p.spec.and_then(|s| s.node_name))
        .collect();
    nodes.sort();
    nodes.dedup();
    Ok(nodes)
}
