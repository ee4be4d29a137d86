//! Sandbox, StorageConnection and Connector: status only.
//!
//! A Sandbox is Ready when its spec passes the same checks single-machine mode
//! applies (`host` is warm on every node by definition). A StorageConnection
//! or Connector is Ready when the Secret it references exists.

use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::api::core::v1::Secret;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};
use kube::api::Api;
use kube::runtime::controller::Action;
use kube::{Resource, ResourceExt};
use warren_config::types::{Connector, ReadyStatus, Sandbox, SandboxStatus, StorageConnection};
use warren_config::Where;

use crate::context::{Context, Error};
use crate::status;

const RESYNC: Duration = Duration::from_secs(300);

fn now() -> Time {
    Time(k8s_openapi::jiff::Timestamp::now())
}

/// Reconciles one Sandbox.
pub async fn sandbox(sb: Arc<Sandbox>, ctx: Arc<Context>) -> Result<Action, Error> {
    let ns = sb.namespace().ok_or(Error::NoNamespace)?;
    let at = Where { file: String::new(), object: format!("Sandbox {ns}/{}", sb.name_any()) };
    let checked = warren_config::check_sandbox(&at, &sb.spec);
    let old = sb.status.clone().unwrap_or_default();
    let (ok, reason, message, languages): (bool, &str, String, _) = match &checked {
        Ok(c) => match c.unsupported() {
            Some(why) => (false, "Unsupported", why.to_string(), Vec::new()),
            None => (true, "Valid", format!("image {} is available on every node", c.image), c.languages.clone()),
        },
        Err(e) => (false, "InvalidSpec", e.to_string(), Vec::new()),
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
    let pods = Api::<k8s_openapi::api::core::v1::Pod>::namespaced(ctx.client.clone(), &ctx.publish_namespace)
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

/// Reconciles one StorageConnection.
pub async fn storage(sc: Arc<StorageConnection>, ctx: Arc<Context>) -> Result<Action, Error> {
    let secret = sc.spec.credentials_secret_ref.as_ref().map(|r| r.name.clone());
    let old = sc.status.clone().map(|s| s.conditions).unwrap_or_default();
    let api = Api::<StorageConnection>::namespaced(ctx.client.clone(), &sc.namespace().ok_or(Error::NoNamespace)?);
    secret_ready(sc.as_ref(), &api, secret.as_deref(), sc.spec.provider.secret_entries(), &old, &ctx).await
}

/// Reconciles one Connector.
pub async fn connector(cn: Arc<Connector>, ctx: Arc<Context>) -> Result<Action, Error> {
    let secret = Some(cn.spec.credentials_secret_ref.name.clone());
    let old = cn.status.clone().map(|s| s.conditions).unwrap_or_default();
    let api = Api::<Connector>::namespaced(ctx.client.clone(), &cn.namespace().ok_or(Error::NoNamespace)?);
    secret_ready(cn.as_ref(), &api, secret.as_deref(), cn.spec.kind.secret_entries(), &old, &ctx).await
}

async fn secret_ready<K>(
    obj: &K,
    api: &Api<K>,
    secret: Option<&str>,
    entries: &[&str],
    old: &[Condition],
    ctx: &Context,
) -> Result<Action, Error>
where
    K: Resource<DynamicType = ()> + Clone + serde::de::DeserializeOwned + std::fmt::Debug,
{
    let ns = obj.namespace().ok_or(Error::NoNamespace)?;
    let found = match secret {
        None => None,
        Some(name) => Some(Api::<Secret>::namespaced(ctx.client.clone(), &ns).get_opt(name).await?),
    };
    let (ok, reason, message) = secret_verdict(&ns, secret, found.as_ref(), entries);
    let conditions = status::ready(ok, reason, &message, obj.meta().generation, old, now());
    if status::differs(old, &conditions) {
        let new = ReadyStatus { conditions, observed_generation: obj.meta().generation };
        status::patch(api, &obj.name_any(), &new).await?;
        ctx.event(obj, !ok, reason, message).await;
    }
    Ok(Action::requeue(RESYNC))
}

/// Ready, reason and message for a credentials Secret (pure). Entry values
/// are never read into the message, only their names.
fn secret_verdict(ns: &str, name: Option<&str>, secret: Option<&Option<Secret>>, entries: &[&str]) -> (bool, &'static str, String) {
    let Some(name) = name else { return (true, "Valid", "uses the node's ambient identity".into()) };
    let Some(Some(s)) = secret else { return (false, "SecretNotFound", format!("Secret {name} not found in namespace {ns}")) };
    let has = |e: &str| s.data.as_ref().is_some_and(|d| d.contains_key(e)) || s.string_data.as_ref().is_some_and(|d| d.contains_key(e));
    let missing: Vec<&str> = entries.iter().copied().filter(|e| !has(e)).collect();
    if missing.is_empty() {
        (true, "Valid", format!("Secret {name} holds {}", if entries.is_empty() { "no required entries".to_string() } else { entries.join(", ") }))
    } else {
        (false, "SecretIncomplete", format!("Secret {name} lacks {}", missing.join(", ")))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::ByteString;

    fn secret(entries: &[&str]) -> Option<Secret> {
        let data = entries.iter().map(|e| (e.to_string(), ByteString(b"x".to_vec()))).collect();
        Some(Secret { data: Some(data), ..Default::default() })
    }

    #[test]
    fn verdicts() {
        let s3 = warren_config::types::StorageProvider::S3.secret_entries();
        assert_eq!(secret_verdict("ns", None, None, s3).1, "Valid");
        assert_eq!(secret_verdict("ns", Some("c"), Some(&None), s3).1, "SecretNotFound");
        let partial = secret(&["accessKeyId"]);
        let v = secret_verdict("ns", Some("c"), Some(&partial), s3);
        assert_eq!((v.0, v.1, v.2.as_str()), (false, "SecretIncomplete", "Secret c lacks secretAccessKey"));
        let full = secret(&["accessKeyId", "secretAccessKey"]);
        assert!(secret_verdict("ns", Some("c"), Some(&full), s3).0);
    }
}
