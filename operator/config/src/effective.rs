//! The compiled, effective configuration of one API key: everything the
//! gateway needs to authenticate a request and build the node-agent call.

use serde::{Deserialize, Serialize};

use crate::key::KeyHash;
use crate::types::{Language, Network, ThreadRetention};
pub use warren_core::Limits;

/// What one API key may do, with every narrowing applied. This is what the
/// operator publishes for the gateways (it holds the key's hash, never the key).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct EffectiveKey {
    /// Namespace of the ApiKey (the tenant).
    pub namespace: String,
    /// ApiKey name.
    pub name: String,
    /// Sandbox name.
    pub sandbox: String,
    /// SHA-256 of the key.
    pub hash: KeyHash,
    /// SHA-256 of the key's E2B alias (`key::e2b_alias`); absent in keys
    /// published by an operator older than the E2B API.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub e2b_hash: Option<KeyHash>,
    /// Non-secret prefix for logs and status.
    pub display_prefix: String,
    /// Refused with 403 when set.
    pub disabled: bool,
    /// Longest timeout a request may ask for, in seconds.
    pub max_timeout_seconds: u32,
    /// Most executions at once.
    pub max_concurrency: u32,
    /// Signs its webhook deliveries (entry `webhook-secret` of the key's
    /// Secret); without it, `webhook_url` is refused.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub webhook_secret: Option<warren_core::secret::SigningSecret>,
    /// May list the execution records of every key in its namespace.
    #[serde(default)]
    pub audit_namespace: bool,
    /// Most live threads; 0 (published by an operator older than the
    /// field) means no limit.
    #[serde(default)]
    pub max_threads: u32,
    /// Most live sandboxes at once; 0 (published by an operator older than
    /// the field) means the default.
    #[serde(default)]
    pub max_live_sandboxes: u32,
    /// Longest life given to a live sandbox at a time, seconds; 0 (an
    /// older operator) means the default.
    #[serde(default)]
    pub max_live_seconds: u32,
    /// Idle seconds after which a live sandbox is paused; 0: never.
    #[serde(default)]
    pub live_idle_seconds: u32,
    /// Its live sandboxes may be created with public ports.
    #[serde(default)]
    pub public_ports: bool,
    /// Root filesystem: `host` or an OCI reference.
    pub image: String,
    /// The manifest digest the operator resolved the image to (warm on
    /// nodes); absent for `host` and in single-machine mode, where the
    /// agent resolves the tag itself.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub image_digest: Option<String>,
    /// Registry credentials from the Sandbox's pull secret (published only
    /// in the keys Secret, never logged).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub image_pull: Option<warren_core::secret::Credentials>,
    /// Languages offered.
    pub languages: Vec<Language>,
    /// Per-execution limits.
    pub limits: Limits,
    /// Network policy after narrowing.
    pub network: Network,
    /// With `Unrestricted`: the egress allowlist after narrowing (absent:
    /// every public destination).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub egress: Option<Vec<warren_core::egress::EgressRule>>,
    /// Sandbox variables overridden by the key's, sorted by name.
    pub env: Vec<(String, String)>,
    /// Thread retention of the Sandbox.
    pub thread_retention: ThreadRetention,
    /// Largest saved home of one thread.
    pub thread_max_bytes: u64,
    /// Versions a thread's history keeps (absent in keys published before
    /// histories: the default).
    #[serde(default = "default_thread_history")]
    pub thread_history: u32,
    /// Storage mounts under `/data` (absent in keys published before mounts).
    #[serde(default)]
    pub storage: Vec<warren_core::contract::Mount>,
    /// Connectors whose credentials every call gets (published only in the
    /// keys Secret, never logged).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub connectors: Vec<warren_core::contract::Connector>,
    /// Modules the Sandbox's warm interpreters load ahead of the call.
    #[serde(default, skip_serializing_if = "warren_core::warm::WarmModules::is_empty")]
    pub warm: warren_core::warm::WarmModules,
}

impl EffectiveKey {
    /// Most live sandboxes at once (the default where an older operator published none).
    pub fn live_sandboxes(&self) -> u32 {
        if self.max_live_sandboxes == 0 { warren_core::bounds::LIVE_SANDBOXES.default } else { self.max_live_sandboxes }
    }

    /// Longest life given to a live sandbox at a time, seconds (the default where none was published).
    pub fn live_seconds(&self) -> u32 {
        if self.max_live_seconds == 0 { warren_core::bounds::LIVE_SECONDS.default } else { self.max_live_seconds }
    }

    /// `namespace/name`, as logs name keys.
    pub fn qualified_name(&self) -> String {
        format!("{}/{}", self.namespace, self.name)
    }
}

fn default_thread_history() -> u32 {
    warren_core::bounds::THREAD_HISTORY.default
}
