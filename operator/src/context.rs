//! What every reconciler shares, and the operator's one error type.

use k8s_openapi::api::core::v1::Secret;
use kube::runtime::events::{Event, EventType, Recorder, Reporter};
use kube::{Api, Client, Resource, ResourceExt};
use warren_config::consumable::{self, SecretScope};

/// Shared state of the controllers.
pub struct Context {
    /// API client.
    pub client: Client,
    /// Namespace where effective keys are published for the gateways.
    pub publish_namespace: String,
    /// Namespace where the node-agent pods run.
    pub agent_namespace: String,
    /// Labels of the node-agent pods.
    pub agent_selector: String,
    /// How to reach node-agents (to warm images); `None` without credentials.
    pub agents: Option<crate::agent_access::AgentAccess>,
    /// What StorageConnection endpoints the reachability probe may reach.
    pub endpoints: std::sync::Arc<warren_core::reach::EndpointPolicy>,
    /// Where Secrets may be read.
    pub secret_scope: SecretScope,
    recorder: Recorder,
}

impl Context {
    /// Builds the context.
    pub fn new(client: Client, publish_namespace: String, agent_namespace: String, agent_selector: String, agents: Option<crate::agent_access::AgentAccess>) -> Context {
        let reporter = Reporter { controller: "warren-operator".into(), instance: std::env::var("POD_NAME").ok() };
        Context { recorder: Recorder::new(client.clone(), reporter), client, publish_namespace, agent_namespace, agent_selector, agents, endpoints: Default::default(), secret_scope: SecretScope::Cluster }
    }

    /// Secrets are read only where `scope` allows.
    pub fn with_secret_scope(mut self, scope: SecretScope) -> Context {
        self.secret_scope = scope;
        self
    }

    /// The Secret `name` of `ns` that a Warren object names, if the operator
    /// may use it; `Ok(Err(why))` when `ns` is not a tenant namespace (it is
    /// not even read) or the Secret is not marked consumable (nothing of it
    /// is used). `owner`: the naming object's uid, for a Secret the operator
    /// generated for it.
    pub async fn tenant_secret(&self, ns: &str, name: &str, owner: Option<&str>) -> Result<Result<Option<Secret>, String>, Error> {
        if let Some(why) = self.secret_scope.refusal(ns) {
            return Ok(Err(why));
        }
        let Some(s) = Api::<Secret>::namespaced(self.client.clone(), ns).get_opt(name).await? else { return Ok(Ok(None)) };
        let generated = owner.is_some_and(|uid| s.metadata.owner_references.iter().flatten().any(|o| o.uid == uid && o.controller == Some(true)));
        match consumable::refusal(name, &s.metadata.labels.clone().unwrap_or_default(), generated) {
            Some(why) => Ok(Err(why)),
            None => Ok(Ok(Some(s))),
        }
    }

    /// The probe reaches only what `policy` permits.
    pub fn with_endpoints(mut self, policy: std::sync::Arc<warren_core::reach::EndpointPolicy>) -> Context {
        self.endpoints = policy;
        self
    }

    /// Records an event on `obj` (best effort: a failed event never fails a reconcile).
    pub async fn event<K: Resource<DynamicType = ()>>(&self, obj: &K, warning: bool, reason: &str, note: String) {
        let ev = Event {
            type_: if warning { EventType::Warning } else { EventType::Normal },
            reason: reason.into(),
            note: Some(note.chars().take(1000).collect()),
            action: "Reconcile".into(),
            secondary: None,
        };
        if let Err(e) = self.recorder.publish(&ev, &obj.object_ref(&())).await {
            tracing::debug!(error = %e, object = %obj.name_any(), "event not recorded");
        }
    }
}

/// Why a reconcile failed (the object is retried with backoff).
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The API server refused or failed a call.
    #[error("Kubernetes API: {0}")]
    Kube(#[from] kube::Error),
    /// An object lacks its namespace.
    #[error("object has no namespace")]
    NoNamespace,
    /// The finalizer machinery failed.
    #[error("finalizer: {0}")]
    Finalizer(String),
}
