//! Warren's operator: reconciles Sandbox, ApiKey, StorageConnection and
//! Connector. The types and the compiler live in `warren-config` (shared
//! with the gateway's single-machine mode); this crate owns their CRD
//! manifests and the controllers.
//!
//! Every controller is driven by watches (its own kind plus the objects it
//! reads), writes status with server-side apply only when something changed,
//! records events on Ready transitions, and retries failures with a
//! per-object exponential backoff.

pub mod agent_access;
pub mod apikey;
pub mod context;
pub mod crds;
pub mod credentials;
pub mod ops;
pub mod sandbox;
pub mod status;
pub mod warm;

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use anyhow::Context as _;
use clap::Parser;
use futures_util::future::BoxFuture;
use futures_util::StreamExt;
use tracing::Instrument;
use k8s_openapi::api::core::v1::Secret;
use kube::runtime::controller::{Action, Controller};
use kube::runtime::reflector::ObjectRef;
use kube::core::PartialObjectMeta;
use kube::runtime::{watcher, WatchStreamExt};
use kube::{Api, Client, Resource, ResourceExt};
use warren_config::consumable::SecretScope;
use warren_config::types::{ApiKey, Connector, Sandbox, StorageConnection};
use warren_config::watch::ShortBackoff;

use crate::context::{Context, Error};

/// Command line of `warren-operator`.
#[derive(Debug, Clone, Parser)]
#[command(name = "warren-operator", version, about = "Warren operator")]
pub struct Args {
    /// Warren's namespace, where the node-agent pods run.
    #[arg(long, env = "WARREN_NAMESPACE", default_value = "warren-system")]
    pub namespace: String,
    /// Namespace the effective keys are published in for the gateways
    /// (defaults to `--namespace`); a dedicated one holds nothing else, so
    /// the gateways' RBAC reaches no other Secret.
    #[arg(long, env = "WARREN_PUBLISH_NAMESPACE")]
    pub publish_namespace: Option<String>,
    /// Labels of the node-agent pods in `--namespace` (a `host` Sandbox is
    /// warm on every node that runs one).
    #[arg(long, env = "WARREN_AGENT_SELECTOR", default_value = "app.kubernetes.io/component=node-agent")]
    pub agent_selector: String,
    /// gRPC port of the node-agent pods (to warm images).
    #[arg(long, env = "WARREN_AGENT_PORT", default_value_t = 7443)]
    pub agent_port: u16,
    /// File holding the bearer token of the node-agents.
    #[arg(long, env = "WARREN_AGENT_TOKEN_FILE")]
    pub agent_token_file: Option<std::path::PathBuf>,
    /// Client certificate for the node-agents (PEM; issued by the gateway
    /// CA, the only CA agents accept callers from). Without the three TLS
    /// files OCI Sandboxes stay `Ready=False` (nothing can warm them).
    #[arg(long, env = "WARREN_AGENT_TLS_CERT_FILE")]
    pub agent_tls_cert_file: Option<std::path::PathBuf>,
    /// Client private key (PEM).
    #[arg(long, env = "WARREN_AGENT_TLS_KEY_FILE")]
    pub agent_tls_key_file: Option<std::path::PathBuf>,
    /// CA bundle (PEM) agent certificates must chain to: the agent CA.
    #[arg(long, env = "WARREN_AGENT_TLS_CA_FILE")]
    pub agent_tls_ca_file: Option<std::path::PathBuf>,
    /// Address of the health (`/healthz`, `/readyz`) and metrics (`/metrics`) endpoint.
    #[arg(long, env = "WARREN_OPS_LISTEN", default_value = "0.0.0.0:8081")]
    pub ops_listen: std::net::SocketAddr,
    /// Log format.
    #[arg(long, default_value = "json", value_parser = ["json", "plain"])]
    pub log_format: String,
    /// Destinations (addresses or CIDRs) a StorageConnection's endpoint may
    /// name although they are loopback or link-local (the metadata
    /// service), as the agents' `--allow-endpoint`; the reachability probe
    /// refuses them otherwise.
    #[arg(long = "allow-endpoint", env = "WARREN_ALLOW_ENDPOINTS", value_delimiter = ',')]
    pub allow_endpoints: Vec<String>,
    /// Namespaces whose Secrets tenants' objects may name (their
    /// credentials, pull secrets, API keys). The operator reads Secrets
    /// nowhere else, and only those labelled `warren.dev/consumable: "true"`.
    #[arg(long = "tenant-namespace", env = "WARREN_TENANT_NAMESPACES", value_delimiter = ',')]
    pub tenant_namespaces: Vec<String>,
    /// Reads (consumable) Secrets in every namespace instead, for a cluster
    /// where the operator's RBAC allows it; the chart never sets it.
    #[arg(long, env = "WARREN_SECRETS_CLUSTER_WIDE")]
    pub secrets_cluster_wide: bool,
}

/// Where the operator may read Secrets. Never Warren's own namespace (its
/// Secrets hold the CA keys and agent tokens) nor the one the keys are
/// published in (the gateways' effective configurations): a tenant with
/// Secrets rights there could read or forge every key.
pub fn secret_scope(args: &Args) -> anyhow::Result<SecretScope> {
    let scope = match (args.secrets_cluster_wide, args.tenant_namespaces.is_empty()) {
        (true, true) => SecretScope::Cluster,
        (true, false) => anyhow::bail!("--secrets-cluster-wide and --tenant-namespace exclude each other"),
        (false, _) => SecretScope::Namespaces(args.tenant_namespaces.iter().cloned().collect()),
    };
    if let SecretScope::Namespaces(list) = &scope {
        if list.is_empty() {
            tracing::warn!("no --tenant-namespace: the operator reads no Secret, so no ApiKey, credentials or pull secret can be used");
        }
        if list.contains(&args.namespace) {
            anyhow::bail!("Warren's own namespace {} cannot be a tenant namespace (its Secrets hold the CA keys and agent tokens)", args.namespace);
        }
        if let Some(keys) = args.publish_namespace.as_ref().filter(|keys| list.contains(*keys)) {
            anyhow::bail!("the keys namespace {keys} (--publish-namespace) cannot be a tenant namespace (it holds every key's published configuration)");
        }
    }
    Ok(scope)
}

/// Per-object retry delays: 1 s doubling to 5 min, reset by a success; and
/// the reconcile metrics, recorded where every reconcile passes.
#[derive(Default)]
struct Backoff {
    failures: Mutex<HashMap<String, u32>>,
    ops: Arc<ops::Ops>,
}

impl Backoff {
    fn next(&self, id: String) -> Duration {
        let mut m = self.failures.lock().unwrap_or_else(|p| p.into_inner());
        let n = m.entry(id).or_default();
        *n = (*n + 1).min(9);
        Duration::from_secs(1 << (*n - 1)).min(Duration::from_secs(300))
    }

    fn reset(&self, id: &str) {
        self.failures.lock().unwrap_or_else(|p| p.into_inner()).remove(id);
    }
}

/// The kind's name as a metric label (one of Warren's four kinds).
fn kind<K: Resource<DynamicType = ()>>() -> &'static str {
    match K::kind(&()).as_ref() {
        "Sandbox" => "Sandbox",
        "ApiKey" => "ApiKey",
        "StorageConnection" => "StorageConnection",
        "Connector" => "Connector",
        _ => "other",
    }
}

fn id<K: Resource<DynamicType = ()>>(obj: &K) -> String {
    format!("{}/{}/{}", K::kind(&()), obj.namespace().unwrap_or_default(), obj.name_any())
}

/// Runs every controller until SIGTERM/SIGINT.
pub async fn run(args: Args) -> anyhow::Result<()> {
    let ops = Arc::new(ops::Ops::default());
    let listener = tokio::net::TcpListener::bind(args.ops_listen).await.with_context(|| format!("binding {}", args.ops_listen))?;
    tracing::info!(addr = %listener.local_addr()?, "health and metrics endpoint listening");
    tokio::spawn(ops::serve(listener, ops.clone()));
    let client = Client::try_default().await.context("connecting to the Kubernetes API")?;
    for check in [
        Api::<Sandbox>::all(client.clone()).list(&Default::default()).await.map(drop),
        Api::<ApiKey>::all(client.clone()).list(&Default::default()).await.map(drop),
    ] {
        check.context("Warren's CRDs are not queryable; install them with `kubectl apply -f crds/`")?;
    }
    let publish = args.publish_namespace.clone().unwrap_or_else(|| args.namespace.clone());
    let scope = secret_scope(&args)?;
    let agents = warm::AgentAccess::from_files(
        args.agent_port,
        args.agent_token_file.clone(),
        args.agent_tls_cert_file.clone(),
        args.agent_tls_key_file.clone(),
        args.agent_tls_ca_file.clone(),
    )
    .context("loading the node-agent client credentials")?;
    let endpoints = warren_core::reach::EndpointPolicy::new(&args.allow_endpoints, Vec::new()).map_err(anyhow::Error::msg)?;
    let ctx = Arc::new(Context::new(client.clone(), publish, args.namespace.clone(), args.agent_selector.clone(), agents).with_endpoints(Arc::new(endpoints)).with_secret_scope(scope.clone()));
    let backoff = Arc::new(Backoff { ops: ops.clone(), ..Backoff::default() });
    ops.set_ready();
    tracing::info!(publish_namespace = %ctx.publish_namespace, agent_namespace = %ctx.agent_namespace, "operator starting");
    tokio::join!(
        api_keys(client.clone(), ctx.clone(), backoff.clone(), &scope),
        sandboxes(client.clone(), ctx.clone(), backoff.clone()),
        simple::<StorageConnection, _, _>(client.clone(), ctx.clone(), backoff.clone(), &scope, credentials::storage, |s| {
            s.spec.credentials_secret_ref.as_ref().map(|r| r.name.clone())
        }),
        simple::<Connector, _, _>(client, ctx.clone(), backoff, &scope, credentials::connector, |c| Some(c.spec.credentials_secret_ref.name.clone())),
    );
    tracing::info!("operator stopped");
    Ok(())
}

/// The ApiKey controller: also woken by its namespace, its Sandbox, its
/// Secret, and the StorageConnections of its namespace and their Secrets
/// (a key carries its mounts' credentials: a rotation republishes it).
async fn api_keys(client: Client, ctx: Arc<Context>, backoff: Arc<Backoff>, scope: &SecretScope) {
    let wc = watcher::Config::default();
    let controller = Controller::new(Api::<ApiKey>::all(client.clone()), wc.clone());
    let keys = controller.store();
    let keys2 = keys.clone();
    let keys3 = keys.clone();
    let keys4 = keys.clone();
    let (connections, writer) = kube::runtime::reflector::store::<StorageConnection>();
    let mirror = kube::runtime::reflector::reflector(writer, watcher::watcher(Api::<StorageConnection>::all(client.clone()), wc.clone())).backoff(ShortBackoff::default());
    tokio::spawn(mirror.for_each(|_| async {}));
    let in_namespace = |keys: &kube::runtime::reflector::Store<ApiKey>, ns: Option<String>| {
        keys.state().into_iter().filter(|k| k.namespace() == ns).map(|k| ObjectRef::from_obj(k.as_ref())).collect::<Vec<_>>()
    };
    let controller = controller
        .watches(Api::<StorageConnection>::all(client.clone()), wc.clone(), move |c| in_namespace(&keys4, c.namespace()))
        // A namespace's ceilings (warren.dev/max-* annotations) changed.
        .watches(Api::<k8s_openapi::api::core::v1::Namespace>::all(client.clone()), wc.clone(), move |ns| {
            let name = ns.name_any();
            keys3.state().into_iter().filter(|k| k.namespace().as_deref() == Some(name.as_str())).map(|k| ObjectRef::from_obj(k.as_ref())).collect::<Vec<_>>()
        })
        .watches(Api::<Sandbox>::all(client.clone()), wc.clone(), move |sb| {
            let ns = sb.namespace();
            keys.state()
                .into_iter()
                .filter(|k| k.namespace() == ns && k.spec.sandbox_ref.name == sb.name_any())
                .map(|k| ObjectRef::from_obj(k.as_ref()))
                .collect::<Vec<_>>()
        });
    let controller = watch_secrets(controller, &client, scope, move |secret| {
        let (ns, name) = (secret.namespace(), secret.name_any());
        let credentials = connections.state().iter().any(|c| c.namespace() == ns && c.spec.credentials_secret_ref.as_ref().is_some_and(|r| r.name == name));
        if credentials {
            return in_namespace(&keys2, ns);
        }
        keys2
            .state()
            .into_iter()
            .filter(|k| k.namespace() == ns && warren_config::secret_ref(&k.name_any(), &k.spec).0 == name)
            .map(|k| ObjectRef::from_obj(k.as_ref()))
            .collect::<Vec<_>>()
    });
    controller
        .trigger_backoff(ShortBackoff::default())
        .shutdown_on_signal()
        .run(tracked(backoff.clone(), apikey::reconcile), move |k, e, _| retry(&backoff, k.as_ref(), e), ctx)
        .for_each(|_| async {})
        .await;
}

/// The Sandbox controller: also woken when node-agent pods come and go.
async fn sandboxes(client: Client, ctx: Arc<Context>, backoff: Arc<Backoff>) {
    let wc = watcher::Config::default();
    let controller = Controller::new(Api::<Sandbox>::all(client.clone()), wc);
    let store = controller.store();
    let pods = Api::<k8s_openapi::api::core::v1::Pod>::namespaced(client, &ctx.agent_namespace);
    controller
        .watches(pods, watcher::Config::default().labels(&ctx.agent_selector), move |_| {
            store.state().into_iter().map(|s| ObjectRef::from_obj(s.as_ref())).collect::<Vec<_>>()
        })
        .trigger_backoff(ShortBackoff::default())
        .shutdown_on_signal()
        .run(tracked(backoff.clone(), sandbox::sandbox), move |o, e, _| retry(&backoff, o.as_ref(), e), ctx)
        .for_each(|_| async {})
        .await;
}

/// Changes to Secrets, metadata only, in the tenant namespaces (or
/// everywhere, when cluster-wide): the operator learns which Secret changed
/// (a new unlabelled one too, so its refusal shows at once), never the data
/// of Secrets it does not use; a reconcile then `get`s only the Secret its
/// object names.
fn watch_secrets<K, F, I>(controller: Controller<K>, client: &Client, scope: &SecretScope, mapper: F) -> Controller<K>
where
    K: Resource<DynamicType = ()> + Clone + serde::de::DeserializeOwned + std::fmt::Debug + Send + Sync + 'static,
    F: Fn(PartialObjectMeta<Secret>) -> I + Clone + Send + Sync + 'static,
    I: IntoIterator<Item = ObjectRef<K>> + Send + 'static,
    I::IntoIter: Send,
{
    let wc = watcher::Config::default();
    match scope {
        SecretScope::Cluster => controller.watches(Api::<PartialObjectMeta<Secret>>::all(client.clone()), wc, mapper),
        SecretScope::Namespaces(list) => list.iter().fold(controller, |c, ns| c.watches(Api::<PartialObjectMeta<Secret>>::namespaced(client.clone(), ns), wc.clone(), mapper.clone())),
    }
}

/// Wraps a reconciler so a success resets the object's backoff.
fn tracked<K, F, Fut>(backoff: Arc<Backoff>, reconcile: F) -> impl Fn(Arc<K>, Arc<Context>) -> BoxFuture<'static, Result<Action, Error>>
where
    K: Resource<DynamicType = ()> + Send + Sync + 'static,
    F: Fn(Arc<K>, Arc<Context>) -> Fut + Clone + Send + Sync + 'static,
    Fut: std::future::Future<Output = Result<Action, Error>> + Send + 'static,
{
    move |o, ctx| {
        let (b, f) = (backoff.clone(), reconcile.clone());
        let key = id(o.as_ref());
        let span = tracing::info_span!("reconcile", object = %key);
        Box::pin(
            async move {
                let started = std::time::Instant::now();
                let r = f(o, ctx).await;
                b.ops.reconciled(kind::<K>(), r.is_ok(), started.elapsed());
                if r.is_ok() {
                    b.reset(&key);
                }
                r
            }
            .instrument(span),
        )
    }
}

fn retry<K: Resource<DynamicType = ()>>(backoff: &Backoff, obj: &K, e: &Error) -> Action {
    let delay = backoff.next(id(obj));
    tracing::warn!(object = %id(obj), error = %e, retry_in_s = delay.as_secs(), "reconcile failed");
    Action::requeue(delay)
}

/// A status-only controller, woken by its own kind and by the Secret it names.
async fn simple<K, F, Fut>(client: Client, ctx: Arc<Context>, backoff: Arc<Backoff>, scope: &SecretScope, reconcile: F, secret_of: fn(&K) -> Option<String>)
where
    K: Resource<DynamicType = ()> + Clone + serde::de::DeserializeOwned + std::fmt::Debug + Send + Sync + 'static,
    F: Fn(Arc<K>, Arc<Context>) -> Fut + Send + Sync + Clone + 'static,
    Fut: std::future::Future<Output = Result<Action, Error>> + Send + 'static,
{
    let wc = watcher::Config::default();
    let controller = Controller::new(Api::<K>::all(client.clone()), wc.clone());
    let store = controller.store();
    let controller = watch_secrets(controller, &client, scope, move |secret| {
        let ns = secret.namespace();
        store
            .state()
            .into_iter()
            .filter(|o| o.namespace() == ns && secret_of(o).as_deref() == Some(secret.name_any().as_str()))
            .map(|o| ObjectRef::from_obj(o.as_ref()))
            .collect::<Vec<_>>()
    });
    controller
        .trigger_backoff(ShortBackoff::default())
        .shutdown_on_signal()
        .run(tracked(backoff.clone(), reconcile), move |o, e, _| retry(&backoff, o.as_ref(), e), ctx)
        .for_each(|_| async {})
        .await;
}

#[cfg(test)]
mod tests {
    use super::*;

    fn args(extra: &[&str]) -> Args {
        Args::parse_from(["warren-operator", "--namespace", "warren-system", "--publish-namespace", "warren-keys"].iter().chain(extra))
    }

    /// The attack: an admin lists the keys namespace among the tenants'
    /// (a typo, or a values file copied between clusters); the operator
    /// would then read, and a tenant with Secrets rights there could
    /// write, every key's published configuration. Refused at start, as
    /// Warren's own namespace is.
    #[test]
    fn the_keys_namespace_and_warrens_own_are_never_tenant_namespaces() {
        let keys = secret_scope(&args(&["--tenant-namespace", "team-a,warren-keys"])).unwrap_err().to_string();
        assert!(keys.contains("keys namespace warren-keys"), "{keys}");
        let own = secret_scope(&args(&["--tenant-namespace", "warren-system"])).unwrap_err().to_string();
        assert!(own.contains("Warren's own namespace"), "{own}");
        assert_eq!(secret_scope(&args(&["--tenant-namespace", "team-a"])).unwrap(), SecretScope::Namespaces(["team-a".to_string()].into()));
        assert!(secret_scope(&args(&["--secrets-cluster-wide", "--tenant-namespace", "team-a"])).is_err());
    }
}
