//! StorageConnection and Connector status: Ready when the credentials Secret
//! they reference exists and holds the entries their provider needs, and,
//! for an S3, GCS or Azure StorageConnection, when a listing of its prefix
//! succeeds with them (Local directories are checked by each node at mount
//! time).

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
    let ns = sc.namespace().ok_or(Error::NoNamespace)?;
    let api = Api::<StorageConnection>::namespaced(ctx.client.clone(), &ns);
    let found = match &secret {
        None => None,
        Some(name) => match ctx.tenant_secret(&ns, name, None).await? {
            Ok(s) => Some(s),
            Err(why) => return write_ready(sc.as_ref(), &api, false, reasons::SECRET_NOT_CONSUMABLE, why, &old, &ctx).await,
        },
    };
    let (mut ok, mut reason, mut message) = secret_verdict(&ns, secret.as_deref(), found.as_ref(), sc.spec.provider.secret_entries());
    if ok {
        (ok, reason, message) = reachability(&sc.spec, found.flatten().as_ref(), &ctx.endpoints).await;
    }
    write_ready(sc.as_ref(), &api, ok, reason, message, &old, &ctx).await
}

/// Ready, reason and message from one listing of the connection's prefix.
async fn reachability(spec: &warren_api::StorageConnectionSpec, secret: Option<&Secret>, endpoints: &std::sync::Arc<warren_core::reach::EndpointPolicy>) -> (bool, &'static str, String) {
    use warren_api::StorageProvider;
    use warren_objects::probe::ProbeError;
    match spec.provider {
        StorageProvider::Local => return (true, reasons::VALID, "a directory on the nodes: each node checks it when mounting".into()),
        StorageProvider::S3 | StorageProvider::GCS | StorageProvider::Azure => {}
    }
    // Without a Secret the operator lists nothing: a probe signed with its
    // own identity would tell a tenant which buckets that identity reads.
    if secret.is_none() {
        return (
            true,
            reasons::VALID,
            "no credentials Secret: nodes sign with their own identity only where the namespace's admin lent it (warren.dev/ambient-identity), else unsigned; each node checks it when mounting".into(),
        );
    }
    let body = secret.map(crate::apikey::secret_body);
    let conn = match warren_config::storage::connection(spec, body.as_ref()) {
        Ok(c) => c,
        Err(why) => return (false, reasons::SECRET_INCOMPLETE, why),
    };
    let raw = warren_core::contract::Mount {
        prefix: spec.prefix.clone().unwrap_or_default(),
        endpoint: spec.endpoint.clone(),
        region: spec.region.clone(),
        credentials: conn.credentials,
        ..warren_core::contract::Mount::new("probe", warren_config::storage::provider(spec.provider), &spec.bucket)
    };
    let Ok(Some(m)) = warren_objects::spec::validate(vec![raw]).map(|mut v| v.pop()) else {
        return (false, reasons::INVALID_SPEC, "the bucket or prefix cannot be used".into());
    };
    // The operator's own network position is no more the tenant's than the
    // node's: loopback and the metadata service are refused here too.
    let store = match m.store(endpoints) {
        Ok(s) => s,
        Err(why) => return (false, reasons::INVALID_SPEC, why),
    };
    let at = format!("{}/{}", spec.bucket, spec.prefix.as_deref().unwrap_or(""));
    match warren_objects::probe::probe(store, &m.root()).await {
        Ok(()) => (true, reasons::REACHABLE, format!("listed {at} with the configured credentials")),
        Err(e) => {
            let reason = match e {
                ProbeError::BucketNotFound => reasons::BUCKET_NOT_FOUND,
                ProbeError::CredentialsRefused => reasons::CREDENTIALS_REFUSED,
                ProbeError::Unreachable => reasons::STORE_UNREACHABLE,
            };
            (false, reason, format!("listing {at}: {}", e.describe()))
        }
    }
}

/// Reconciles one Connector.
pub async fn connector(cn: Arc<Connector>, ctx: Arc<Context>) -> Result<Action, Error> {
    let secret = Some(cn.spec.credentials_secret_ref.name.clone());
    let old = cn.status.clone().map(|s| s.conditions).unwrap_or_default();
    let api = Api::<Connector>::namespaced(ctx.client.clone(), &cn.namespace().ok_or(Error::NoNamespace)?);
    if let Err((field, why)) = warren_config::connector::check(&cn.spec) {
        return write_ready(cn.as_ref(), &api, false, reasons::INVALID_SPEC, format!("{field}: {why}"), &old, &ctx).await;
    }
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
        Some(name) => match ctx.tenant_secret(&ns, name, None).await? {
            Ok(s) => Some(s),
            Err(why) => return write_ready(obj, api, false, reasons::SECRET_NOT_CONSUMABLE, why, old, ctx).await,
        },
    };
    let (ok, reason, message) = secret_verdict(&ns, secret, found.as_ref(), entries);
    write_ready(obj, api, ok, reason, message, old, ctx).await
}

async fn write_ready<K>(obj: &K, api: &Api<K>, ok: bool, reason: &'static str, message: String, old: &[Condition], ctx: &Context) -> Result<Action, Error>
where
    K: Resource<DynamicType = ()> + Clone + serde::de::DeserializeOwned + std::fmt::Debug,
{
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
