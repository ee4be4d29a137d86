//! StorageConnection and Connector status: Ready when the credentials Secret
//! they reference exists and holds the entries their provider needs.

use std::sync::Arc;

use k8s_openapi::api::core::v1::Secret;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition;
use kube::api::Api;
use kube::runtime::controller::Action;
use kube::{Resource, ResourceExt};
use warren_api::reasons;
use warren_api::{Connector, ReadyStatus, StorageConnection};

use crate::context::{Context, Error};
use crate::status::{self, now, RESYNC};

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
    let Some(name) = name else { return (true, reasons::VALID, "uses the node's ambient identity".into()) };
    let Some(Some(s)) = secret else { return (false, reasons::SECRET_NOT_FOUND, format!("Secret {name} not found in namespace {ns}")) };
    let has = |e: &str| s.data.as_ref().is_some_and(|d| d.contains_key(e)) || s.string_data.as_ref().is_some_and(|d| d.contains_key(e));
    let missing: Vec<&str> = entries.iter().copied().filter(|e| !has(e)).collect();
    if missing.is_empty() {
        (true, reasons::VALID, format!("Secret {name} holds {}", if entries.is_empty() { "no required entries".to_string() } else { entries.join(", ") }))
    } else {
        (false, reasons::SECRET_INCOMPLETE, format!("Secret {name} lacks {}", missing.join(", ")))
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
        assert_eq!(secret_verdict("ns", Some("c"), Some(&None), s3).1, reasons::SECRET_NOT_FOUND);
        let partial = secret(&["accessKeyId"]);
        let v = secret_verdict("ns", Some("c"), Some(&partial), s3);
        assert_eq!((v.0, v.1, v.2.as_str()), (false, reasons::SECRET_INCOMPLETE, "Secret c lacks secretAccessKey"));
        let full = secret(&["accessKeyId", "secretAccessKey"]);
        assert!(secret_verdict("ns", Some("c"), Some(&full), s3).0);
    }
}
