//! ApiKey: make sure the key exists (generating it into an owned Secret when
//! the spec names none), compile the effective configuration against the
//! Sandbox with `warren-config` (the narrowing rules of single-machine mode),
//! publish it for the gateways or withdraw it, and report status.

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::api::core::v1::Secret;
use k8s_openapi::ByteString;
use kube::api::{Api, ObjectMeta, Patch, PatchParams, PostParams};
use kube::runtime::controller::Action;
use kube::runtime::finalizer::{finalizer, Event as Finalize};
use kube::{Resource, ResourceExt};
use warren_core::contract;
use warren_config::types::{ApiKey, ApiKeyStatus, Connector, Sandbox, StorageConnection};
use warren_api::reasons;
use warren_config::ceilings::Ceilings;
use warren_config::storage::Connection;
use warren_config::{key, published, ConfigError, EffectiveKey, SecretBody, Where};

use crate::context::{Context, Error};
use crate::status::{self, now};

/// Removes the published key before the ApiKey goes away.
pub const FINALIZER: &str = "warren.dev/withdraw-key";
const RESYNC: Duration = Duration::from_secs(300);

/// Reconciles one ApiKey.
pub async fn reconcile(key: Arc<ApiKey>, ctx: Arc<Context>) -> Result<Action, Error> {
    let ns = key.namespace().ok_or(Error::NoNamespace)?;
    let api: Api<ApiKey> = Api::namespaced(ctx.client.clone(), &ns);
    finalizer(&api, FINALIZER, key, |event| async {
        match event {
            Finalize::Apply(k) => apply(&k, &ns, &ctx).await,
            Finalize::Cleanup(k) => withdraw(&ctx, &ns, &k.name_any()).await.map(|()| Action::await_change()),
        }
    })
    .await
    .map_err(|e| Error::Finalizer(e.to_string()))
}

async fn apply(key: &ApiKey, ns: &str, ctx: &Context) -> Result<Action, Error> {
    let name = key.name_any();
    if let Some(holder) = secret_holder(key, ns, ctx).await? {
        // Someone else's key: refused, and the holder keeps working.
        withdraw(ctx, ns, &name).await?;
        let message = warren_config::shared_key_message(&format!("{ns}/{holder}"));
        return set_status(key, ns, ctx, false, reasons::SECRET_IN_USE, message, None).await;
    }
    let secret = match ensure_secret(key, ns, ctx).await? {
        Ok(secret) => secret,
        Err(why) => {
            withdraw(ctx, ns, &name).await?;
            return set_status(key, ns, ctx, false, reasons::SECRET_NOT_CONSUMABLE, why, None).await;
        }
    };
    let sandbox = Api::<Sandbox>::namespaced(ctx.client.clone(), ns).get_opt(&key.spec.sandbox_ref.name).await?;
    let referenced = match &sandbox {
        Some(sb) => Referenced { connections: connections_of(sb, ns, ctx).await?, connectors: connectors_of(sb, ns, ctx).await? },
        None => Referenced::default(),
    };
    let namespace = Api::<k8s_openapi::api::core::v1::Namespace>::all(ctx.client.clone()).get_opt(ns).await?;
    let ceilings = namespace.map_or(Ok(Ceilings::default()), |n| Ceilings::from_annotations(&n.metadata.annotations.unwrap_or_default()));
    let pull = match sandbox.as_ref().filter(|sb| sb.spec.image != "host") {
        Some(sb) => crate::warm::pull_secret(ctx, ns, sb.spec.image_pull_secret.as_ref().map(|r| r.name.as_str()), &sb.spec.image).await?,
        None => Ok(None),
    };
    let compiled = compile(key, ns, sandbox.as_ref(), secret.as_ref(), &referenced, ceilings, pull);
    let (ok, reason, message, prefix) = match &compiled {
        Ok(eff) => {
            publish(ctx, eff).await?;
            let reason = if eff.disabled { reasons::DISABLED } else { reasons::PUBLISHED };
            (true, reason, format!("published for the gateways (key {})", eff.display_prefix), Some(eff.display_prefix.clone()))
        }
        Err(e) => {
            withdraw(ctx, ns, &name).await?;
            (false, e.reason, e.to_string(), None)
        }
    };
    set_status(key, ns, ctx, ok, reason, message, prefix).await
}

/// An OCI Sandbox as its status says it is warm: pinned to the digest the
/// nodes hold, offering the languages found there, with its pull
/// credentials. A `host` Sandbox is used as checked.
fn as_warmed(checked: warren_config::compile::SandboxConfig, sb: &Sandbox, pull: Result<Option<warren_core::secret::Credentials>, String>) -> Result<warren_config::compile::SandboxConfig, String> {
    if !checked.is_oci() {
        return Ok(checked);
    }
    let status = sb.status.clone().unwrap_or_default();
    let ready = crate::status::ready_of(&status.conditions).is_some_and(|(s, _)| s == "True");
    match (status.image_digest, ready) {
        (Some(digest), true) => Ok(checked.warmed(digest, status.languages, pull?)),
        _ => Err(format!("Sandbox {} is not Ready: its image is not warm on any node yet", sb.name_any())),
    }
}

/// The objects a Sandbox refers to, each with its credentials.
#[derive(Default)]
struct Referenced {
    connections: HashMap<String, Result<Connection, String>>,
    connectors: HashMap<String, Result<contract::Connector, String>>,
}

/// The Connectors the Sandbox offers, each with its credentials read from
/// the one Secret it names.
async fn connectors_of(sb: &Sandbox, ns: &str, ctx: &Context) -> Result<HashMap<String, Result<contract::Connector, String>>, Error> {
    let api = Api::<Connector>::namespaced(ctx.client.clone(), ns);
    let mut out = HashMap::new();
    for r in &sb.spec.connectors {
        if out.contains_key(&r.name) {
            continue;
        }
        let Some(c) = api.get_opt(&r.name).await? else { continue };
        let resolved = match ctx.tenant_secret(ns, &c.spec.credentials_secret_ref.name, None).await? {
            Ok(secret) => warren_config::connector::resolve(&r.name, &c.spec, secret.map(|s| secret_body(&s)).as_ref()),
            Err(why) => Err(why),
        };
        out.insert(r.name.clone(), resolved);
    }
    Ok(out)
}

/// The StorageConnections the Sandbox mounts, each with its credentials
/// read from the one Secret it names (no other Secret is read).
async fn connections_of(sb: &Sandbox, ns: &str, ctx: &Context) -> Result<HashMap<String, Result<Connection, String>>, Error> {
    let conns = Api::<StorageConnection>::namespaced(ctx.client.clone(), ns);
    let mut out = HashMap::new();
    for m in &sb.spec.storage {
        // Managed volumes need no connection.
        let Some(name) = m.connection_ref.as_ref().map(|r| &r.name) else { continue };
        if out.contains_key(name) {
            continue;
        }
        let Some(c) = conns.get_opt(name).await? else { continue };
        let secret = match &c.spec.credentials_secret_ref {
            Some(r) => ctx.tenant_secret(ns, &r.name, None).await?.map(|s| s.map(|s| secret_body(&s))),
            None => Ok(None),
        };
        out.insert(name.clone(), secret.and_then(|secret| warren_config::storage::connection(&c.spec, secret.as_ref())));
    }
    Ok(out)
}

/// An older ApiKey of the namespace naming the same Secret entry, if any.
async fn secret_holder(key: &ApiKey, ns: &str, ctx: &Context) -> Result<Option<String>, Error> {
    let all = Api::<ApiKey>::namespaced(ctx.client.clone(), ns).list(&Default::default()).await?.items;
    let created = |k: &ApiKey| k.meta().creation_timestamp.as_ref().map_or(i64::MAX, |t| t.0.as_second());
    let claims: Vec<warren_config::SecretClaim<'_>> =
        all.iter().map(|k| warren_config::SecretClaim { name: k.meta().name.as_deref().unwrap_or_default(), spec: &k.spec, created: created(k) }).collect();
    let name = key.name_any();
    let me = warren_config::SecretClaim { name: &name, spec: &key.spec, created: created(key) };
    Ok(warren_config::secret_holder(&me, &claims).map(str::to_string))
}

async fn set_status(key: &ApiKey, ns: &str, ctx: &Context, ok: bool, reason: &str, message: String, prefix: Option<String>) -> Result<Action, Error> {
    let name = key.name_any();
    let old = key.status.clone().unwrap_or_default();
    let conditions = status::ready(ok, reason, &message, key.meta().generation, &old.conditions, now());
    let new = ApiKeyStatus { conditions, observed_generation: key.meta().generation, key_prefix: prefix };
    if status::differs(&old.conditions, &new.conditions) || old.key_prefix != new.key_prefix || old.observed_generation != new.observed_generation {
        status::patch(&Api::<ApiKey>::namespaced(ctx.client.clone(), ns), &name, &new).await?;
        if status::ready_of(&old.conditions) != status::ready_of(&new.conditions) {
            ctx.event(key, !ok, reason, message).await;
        }
    }
    Ok(Action::requeue(RESYNC))
}


fn compile(
    key: &ApiKey,
    ns: &str,
    sandbox: Option<&Sandbox>,
    secret: Option<&Secret>,
    referenced: &Referenced,
    ceilings: Result<Ceilings, String>,
    pull: Result<Option<warren_core::secret::Credentials>, String>,
) -> Result<EffectiveKey, ConfigError> {
    let at = Where { file: String::new(), object: format!("ApiKey {ns}/{}", key.name_any()) };
    let sandbox = match sandbox {
        None => None,
        Some(s) => {
            let sb_at = Where { file: String::new(), object: format!("Sandbox {ns}/{}", s.name_any()) };
            let checked = warren_config::check_sandbox(&sb_at, &s.spec).map_err(|e| ConfigError {
                field: "spec.sandboxRef.name".into(),
                reason: reasons::SANDBOX_NOT_FOUND,
                message: format!("the Sandbox is not valid ({e})"),
                ..e
            })?;
            Some(as_warmed(checked, s, pull).map_err(|message| ConfigError {
                file: String::new(),
                object: Some(at.object.clone()),
                field: "spec.sandboxRef.name".into(),
                reason: reasons::SANDBOX_NOT_READY,
                message,
                syntax: false,
            })?)
        }
    };
    let body = secret.map(secret_body);
    let lookups = warren_config::compile::Lookups { connection: &|c| referenced.connections.get(c).cloned(), connector: &|c| referenced.connectors.get(c).cloned() };
    warren_config::effective_key(&at, ns, &key.name_any(), &key.spec, sandbox.as_ref(), body.as_ref(), lookups, ceilings)
}

pub(crate) fn secret_body(s: &Secret) -> SecretBody {
    let data = s.data.iter().flatten().map(|(k, v)| (k.clone(), v.0.clone())).collect();
    SecretBody { data, string_data: s.string_data.clone().unwrap_or_default() }
}

/// Entry of a generated Secret holding the key's E2B alias (`e2b_…`, what
/// the E2B SDKs send); derived from the key, so any key has one.
const E2B_KEY_ENTRY: &str = "e2b-key";

/// The key's Secret; generated (and owned by the ApiKey) when the spec names
/// none and it does not exist yet, with a webhook signing secret beside the
/// key (entry `webhook-secret`) and its E2B alias (entry `e2b-key`). An existing Secret is never rewritten:
/// without that entry, its key's webhooks are refused until one is added.
async fn ensure_secret(key: &ApiKey, ns: &str, ctx: &Context) -> Result<Result<Option<Secret>, String>, Error> {
    let (secret_name, entry) = warren_config::secret_ref(&key.name_any(), &key.spec);
    let api: Api<Secret> = Api::namespaced(ctx.client.clone(), ns);
    match ctx.tenant_secret(ns, &secret_name, key.meta().uid.as_deref()).await? {
        Ok(Some(s)) => return Ok(Ok(Some(s))),
        Err(why) => return Ok(Err(why)),
        Ok(None) => {}
    }
    if key.spec.secret_ref.is_some() {
        return Ok(Ok(None)); // the user's Secret: reported, never invented
    }
    let value = generate_key();
    let secret = Secret {
        metadata: ObjectMeta {
            name: Some(secret_name),
            namespace: Some(ns.into()),
            owner_references: key.controller_owner_ref(&()).map(|o| vec![o]),
            labels: Some(BTreeMap::from([
                ("app.kubernetes.io/managed-by".to_string(), status::MANAGER.to_string()),
                (warren_config::consumable::LABEL.to_string(), "true".to_string()),
            ])),
            ..Default::default()
        },
        data: Some(BTreeMap::from([
            (E2B_KEY_ENTRY.to_string(), ByteString(key::e2b_alias(&value).into_bytes())),
            (entry, ByteString(value.into_bytes())),
            (warren_config::WEBHOOK_SECRET_ENTRY.to_string(), ByteString(generate_webhook_secret().into_bytes())),
        ])),
        type_: Some("Opaque".into()),
        ..Default::default()
    };
    match api.create(&PostParams { field_manager: Some(status::MANAGER.into()), ..Default::default() }, &secret).await {
        Ok(s) => {
            tracing::info!(namespace = ns, apikey = %key.name_any(), "generated a key");
            Ok(Ok(Some(s)))
        }
        // Created concurrently (another reconcile): use that one.
        Err(kube::Error::Api(e)) if e.code == 409 => ctx.tenant_secret(ns, &secret.name_any(), key.meta().uid.as_deref()).await,
        Err(e) => Err(e.into()),
    }
}

/// `whsec_` + 43 base62 characters (256 bits).
fn generate_webhook_secret() -> String {
    warren_core::ids::random_id("whsec_", 43, &mut |b: &mut [u8]| {
        use rand::RngCore;
        rand::rng().fill_bytes(b)
    })
}

fn generate_key() -> String {
    use rand::RngCore;
    loop {
        let mut bytes = [0u8; 96];
        rand::rng().fill_bytes(&mut bytes);
        if let Some(k) = key::from_random_bytes(&bytes) {
            return k;
        }
    }
}

/// Publishes (server-side apply: identical content changes nothing).
async fn publish(ctx: &Context, eff: &EffectiveKey) -> Result<(), Error> {
    use base64::Engine as _;
    let name = published::secret_name(&eff.namespace, &eff.name);
    let body = serde_json::json!({
        "apiVersion": "v1",
        "kind": "Secret",
        "metadata": {
            "name": name,
            "namespace": ctx.publish_namespace,
            "labels": {published::LABEL: "true", "app.kubernetes.io/managed-by": status::MANAGER},
            "annotations": {published::SOURCE_ANNOTATION: eff.qualified_name()},
        },
        "type": "Opaque",
        "data": {published::DATA_KEY: base64::engine::general_purpose::STANDARD.encode(published::encode(eff))},
    });
    let api: Api<Secret> = Api::namespaced(ctx.client.clone(), &ctx.publish_namespace);
    api.patch(&name, &PatchParams::apply(status::MANAGER).force(), &Patch::Apply(&body)).await?;
    Ok(())
}

/// Removes the published key, if any.
async fn withdraw(ctx: &Context, ns: &str, name: &str) -> Result<(), Error> {
    let api: Api<Secret> = Api::namespaced(ctx.client.clone(), &ctx.publish_namespace);
    match api.delete(&published::secret_name(ns, name), &Default::default()).await {
        Ok(_) => Ok(()),
        Err(kube::Error::Api(e)) if e.code == 404 => Ok(()),
        Err(e) => Err(e.into()),
    }
}
