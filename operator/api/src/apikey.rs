//! `ApiKey`: a key bound to a Sandbox, which it may only narrow.

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition;
use kube_derive::CustomResource;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use crate::common::{EnvVar, LocalRef, SecretKeyRef};
use crate::sandbox::MountMode;
use crate::{Egress, Network};

/// How an ApiKey narrows one of its Sandbox's mounts.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct StorageNarrowing {
    /// The Sandbox mount's name.
    pub name: String,
    /// A deeper prefix, under the Sandbox's (whole segments).
    #[schemars(regex(pattern = "^[A-Za-z0-9_.=-]+(/[A-Za-z0-9_.=-]+)*/?$"), length(max = 1024))]
    pub prefix: Option<String>,
    /// ReadOnly narrows a ReadWrite mount; never the reverse.
    pub mode: Option<MountMode>,
}

/// Which execution records an ApiKey may list (`GET /v1/executions`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize, JsonSchema)]
pub enum AuditScope {
    /// Its own executions only.
    #[default]
    Own,
    /// Those of every ApiKey in its namespace (an auditor's key; it still
    /// runs, reads and cancels only its own).
    Namespace,
}

/// Binds an API key to a Sandbox. It may only narrow the Sandbox (lower
/// timeout, stricter network, a concurrency limit, env overrides). The key
/// itself lives in a Secret, so manifests in Git hold no secrets.
#[derive(CustomResource, Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[kube(
    group = "warren.dev",
    version = "v1alpha1",
    crates(kube_core = "::kube_core", k8s_openapi = "::k8s_openapi", schemars = "::schemars"),
    kind = "ApiKey",
    doc = "An API key bound to a Sandbox; the key itself lives in a Secret.",
    namespaced,
    status = "ApiKeyStatus",
    shortname = "wak",
    derive = "PartialEq",
    printcolumn = r#"{"name": "Ready", "type": "string", "jsonPath": ".status.conditions[?(@.type==\"Ready\")].status"}"#,
    printcolumn = r#"{"name": "Sandbox", "type": "string", "jsonPath": ".spec.sandboxRef.name"}"#,
    printcolumn = r#"{"name": "Key", "type": "string", "jsonPath": ".status.keyPrefix"}"#,
    printcolumn = r#"{"name": "Disabled", "type": "boolean", "jsonPath": ".spec.disabled"}"#,
    printcolumn = r#"{"name": "Age", "type": "date", "jsonPath": ".metadata.creationTimestamp"}"#
)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct ApiKeySpec {
    /// The Sandbox (same namespace) this key runs code in.
    pub sandbox_ref: LocalRef,
    /// Secret holding the key, `sk-wrn-` + 32–128 letters and digits
    /// (default: `<name>-key`, entry `key`; the operator generates it when missing).
    pub secret_ref: Option<SecretKeyRef>,
    /// A disabled key is refused with 403.
    #[serde(default)]
    pub disabled: bool,
    /// Lower maximum timeout than the Sandbox's, in seconds.
    #[schemars(range(min = 1, max = 3600))]
    pub max_timeout_seconds: Option<u32>,
    /// Most executions running at once for this key, 1–1024 (default 10).
    #[schemars(range(min = 1, max = 1024))]
    pub max_concurrency: Option<u32>,
    /// Most threads (saved homes) the key keeps, 1–100000 (default 1000): a
    /// call that would create one more ends with `thread_limit_reached`
    /// before anything runs. Deleted and expired threads do not count.
    #[schemars(range(min = 1, max = 100000))]
    pub max_threads: Option<u32>,
    /// Most live sandboxes (running, not paused) the key holds at once,
    /// 1–10000 (default 100): one more is refused with 429 (E2B, Sandbase).
    #[schemars(range(min = 1, max = 10000))]
    pub max_live_sandboxes: Option<u32>,
    /// Longest life a live sandbox of this key may be given at a time, in
    /// seconds, 60–86400 (default 86400): a longer timeout is refused.
    #[schemars(range(min = 60, max = 86400))]
    pub max_live_seconds: Option<u32>,
    /// Pauses a live sandbox of this key (its home saved, its processes
    /// ended) once no call has reached it and no stream of it (a followed
    /// process, a terminal, a port connection) has been open for this many
    /// seconds, 30–86400; background processes alone do not keep it
    /// running. Unset: never paused for idleness, only at its timeout.
    #[schemars(range(min = 30, max = 86400))]
    pub live_idle_seconds: Option<u32>,
    /// Lets a live sandbox of this key be created with public ports (E2B's
    /// `network.allowPublicTraffic: true`): its ports then answer without a
    /// token. Off (default): every port needs the sandbox's traffic token or
    /// that port's token, and asking for public ports is refused.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub public_ports: Option<bool>,
    /// Network policy; may only be stricter than the Sandbox's.
    pub network: Option<Network>,
    /// An egress allowlist within the Sandbox's: every rule must be covered
    /// by one of the Sandbox's (or, without one, may name any public
    /// destination).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub egress: Option<Egress>,
    /// Narrowings of the Sandbox's mounts: deeper prefixes, read-only.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 16))]
    pub storage: Vec<StorageNarrowing>,
    /// A subset of the Sandbox's connectors (default: all of them).
    #[schemars(length(max = 16))]
    pub connectors: Option<Vec<LocalRef>>,
    /// Variables that override the Sandbox's.
    #[serde(default)]
    #[schemars(length(max = 50))]
    pub env: Vec<EnvVar>,
    /// Whose execution records the key may list: `Own` (default) or
    /// `Namespace`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub audit_scope: Option<AuditScope>,
}

/// Observed state of an ApiKey.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ApiKeyStatus {
    /// `Ready`: True when the key is valid, narrows its Sandbox and is
    /// published to the gateways. Reasons: `Published`, `Disabled`,
    /// `SandboxNotFound`, `InvalidNarrowing`, `SecretInvalid`, `SecretInUse` (an older ApiKey holds the Secret).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub conditions: Vec<Condition>,
    /// The `metadata.generation` this status describes.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub observed_generation: Option<i64>,
    /// Non-secret start of the key (`sk-wrn-AbCd…`), to tell keys apart.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub key_prefix: Option<String>,
}
