//! `Sandbox`: the execution environment API keys run code in.

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition;
use kube_derive::CustomResource;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use crate::common::{EnvVar, LocalRef, Quantity, ThreadRetention};
use crate::{Egress, Language, Network};

/// Resources of each execution.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct Resources {
    /// CPU cores, 0.5–4 (default 1), e.g. `500m`, `2`.
    pub cpu: Option<Quantity>,
    /// Memory, swap off, 32Mi–4Gi (default 1 GiB per CPU).
    pub memory: Option<Quantity>,
    /// Most processes and threads, 8–4096 (default 256).
    #[schemars(range(min = 8, max = 4096))]
    pub pids: Option<u32>,
    /// Size of `/tmp`, 1Mi–4Gi (default 512Mi).
    pub tmp_size: Option<Quantity>,
    /// Size of the home directory, 1Mi–4Gi (default 512Mi).
    pub home_size: Option<Quantity>,
}

/// The execution environment API keys run code in: root filesystem,
/// resources, limits, network policy and environment. An ApiKey may only
/// narrow it.
#[derive(CustomResource, Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[kube(
    group = "warren.dev",
    version = "v1alpha1",
    crates(kube_core = "::kube_core", k8s_openapi = "::k8s_openapi", schemars = "::schemars"),
    kind = "Sandbox",
    doc = "An execution environment: root filesystem, resources, limits, network policy and environment. ApiKeys bind to it and may only narrow it.",
    namespaced,
    status = "SandboxStatus",
    shortname = "sbx",
    derive = "PartialEq",
    printcolumn = r#"{"name": "Ready", "type": "string", "jsonPath": ".status.conditions[?(@.type==\"Ready\")].status"}"#,
    printcolumn = r#"{"name": "Image", "type": "string", "jsonPath": ".spec.image"}"#,
    printcolumn = r#"{"name": "Languages", "type": "string", "jsonPath": ".status.languages"}"#,
    printcolumn = r#"{"name": "Network", "type": "string", "jsonPath": ".spec.network"}"#,
    printcolumn = r#"{"name": "Age", "type": "date", "jsonPath": ".metadata.creationTimestamp"}"#
)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct SandboxSpec {
    /// Root filesystem: an OCI image reference (`registry/repo:tag`,
    /// optionally `@sha256:…`), pulled and unpacked read-only on the nodes;
    /// or `host` (the node's own `/usr`, read-only; for development).
    #[schemars(length(min = 1, max = 512))]
    pub image: String,
    /// A `kubernetes.io/dockerconfigjson` Secret (same namespace) holding
    /// credentials for the image's registry.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub image_pull_secret: Option<LocalRef>,
    /// Languages offered (default: all the image has).
    #[schemars(length(min = 1, max = 3))]
    pub languages: Option<Vec<Language>>,
    /// Per-execution resources.
    #[serde(default)]
    pub resources: Resources,
    /// Longest timeout a request may ask for, 1–3600 s (default 3600).
    #[schemars(range(min = 1, max = 3600))]
    pub max_timeout_seconds: Option<u32>,
    /// Per-stream output cap, 1Ki–64Mi (default 1Mi).
    pub max_output_bytes: Option<Quantity>,
    /// Network policy (default Blocked).
    #[serde(default)]
    pub network: Network,
    /// With `network: Unrestricted`: an allowlist of DNS names
    /// (`api.example.com`, `*.example.com`) and IPv4 CIDRs, with ports; the
    /// only destinations reachable. Without it every public one is.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub egress: Option<Egress>,
    /// Variables for every execution (ApiKey and request values win).
    #[serde(default)]
    #[schemars(length(max = 50))]
    pub env: Vec<EnvVar>,
    /// How long thread state is kept after its last use (default Forever).
    #[serde(default)]
    pub thread_retention: ThreadRetention,
    /// Largest saved home of one thread, 1Mi–100Gi (default 1Gi): file sizes
    /// plus 512 bytes per entry. A call that would save more fails with
    /// `thread_state_too_large` and the previous state is kept.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub thread_max_size: Option<Quantity>,
    /// Versions of a thread kept for restore and fork, 1–1000 (default
    /// 50): one per execution that changed the home. Versions older than
    /// `threadRetention` go too; the current one always stays.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1, max = 1000))]
    pub thread_history: Option<u32>,
    /// Buckets mounted under `/data/<name>` in every execution.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 16))]
    pub storage: Vec<StorageMount>,
    /// Connectors (same namespace) whose credentials every execution gets.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 16))]
    pub connectors: Vec<LocalRef>,
    /// Modules warm interpreters load before their call arrives (only
    /// what the image has; one that fails to import is listed in
    /// `status.warmFailures`, never in calls).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub warm: Option<Warm>,
}

/// What a Sandbox's warm interpreters load ahead of their call.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct Warm {
    /// Python's.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub python: Option<WarmPython>,
    /// Node's.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub node: Option<WarmNode>,
}

/// Python modules imported ahead of the call.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct WarmPython {
    /// Module names (`numpy`, `pandas`, `os.path`), at most 32.
    #[serde(default)]
    #[schemars(length(max = 32))]
    pub imports: Vec<String>,
}

/// Node packages required ahead of the call.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct WarmNode {
    /// Package names (`lodash`, `@scope/pkg`), at most 32.
    #[serde(default)]
    #[schemars(length(max = 32))]
    pub modules: Vec<String>,
}

/// A warm module that did not load.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct WarmFailure {
    /// `python` or `node`.
    pub language: Language,
    /// The module, as listed in `spec.warm`.
    pub module: String,
    /// What the interpreter said (first line).
    pub message: String,
}

/// Read-only or read-write access to a mount.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize, JsonSchema)]
pub enum MountMode {
    /// Writes fail with "Read-only file system".
    #[default]
    ReadOnly,
    /// Writes reach the bucket before the response returns.
    ReadWrite,
}

/// A bucket mounted into the sandbox.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct StorageMount {
    /// Mount name: the sandbox sees the bucket at `/data/<name>`.
    #[schemars(regex(pattern = "^[a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?$"))]
    pub name: String,
    /// The StorageConnection (same namespace). Exactly one of
    /// `connectionRef` and `volume`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub connection_ref: Option<LocalRef>,
    /// A managed volume: kept in the platform's own object store (the one
    /// holding thread state), under this namespace, created on first write.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(regex(pattern = "^[a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?$"))]
    pub volume: Option<String>,
    /// Access mode (default ReadOnly).
    #[serde(default)]
    pub mode: MountMode,
    /// A prefix under the connection's prefix (whole segments).
    #[schemars(regex(pattern = "^[A-Za-z0-9_.=-]+(/[A-Za-z0-9_.=-]+)*/?$"), length(max = 1024))]
    pub prefix: Option<String>,
    /// Most bytes one call may write to this mount (default 1Gi, at most
    /// 64Gi); past it writes fail with ENOSPC.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_write_bytes: Option<Quantity>,
}

/// Observed state of a Sandbox.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct SandboxStatus {
    /// `Ready`: True when the spec is valid and its image is warm on at
    /// least one node. Reasons: `Valid`, `InvalidSpec`, `Unsupported`
    /// (connectors are not offered yet), `ImagePullFailed`,
    /// `LanguageUnavailable` (the spec lists a language the image lacks).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub conditions: Vec<Condition>,
    /// The `metadata.generation` this status describes.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub observed_generation: Option<i64>,
    /// Languages offered: those the image has (and the spec allows).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub languages: Vec<Language>,
    /// The interpreters found in the image, with the versions they report.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub interpreters: Vec<Interpreter>,
    /// Manifest digest the image reference resolved to (re-resolved at
    /// every resync, so a moved tag is picked up and warmed).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub image_digest: Option<String>,
    /// Nodes where the image is unpacked and ready.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub warm_nodes: Vec<String>,
    /// Modules of `spec.warm` that did not load in the image (calls still
    /// run; they import them themselves, or fail to, as without `warm`).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub warm_failures: Vec<WarmFailure>,
}

/// An interpreter found in a Sandbox's image.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct Interpreter {
    /// `python`, `node` or `bash`.
    pub language: Language,
    /// What it reported, e.g. `3.11.2`.
    pub version: String,
}
