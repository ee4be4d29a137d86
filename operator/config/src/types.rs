//! The custom resources (`warren.dev/v1alpha1`, namespaced) as users write
//! them. The doc comments become `kubectl explain`; the schemars attributes
//! become the CRD's OpenAPI validation (plain schema only: the oldest API
//! server Warren supports has no CEL), so `kubectl apply` rejects bad values
//! with field-level messages. Cross-object rules are checked by `compile`.
//!
//! Unknown fields are refused everywhere: a misspelt limit must not silently
//! fall back to a default.

use std::collections::BTreeMap;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition;
use kube_derive::CustomResource;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

/// API group and version of Warren's kinds.
pub const API_VERSION: &str = "warren.dev/v1alpha1";

pub use warren_core::Language;

pub use warren_core::Network;

/// How long a thread's saved home directory is kept after its last use.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize, JsonSchema)]
pub enum ThreadRetention {
    /// One day.
    #[serde(rename = "24h")]
    Day,
    /// One week.
    #[serde(rename = "7d")]
    Week,
    /// Thirty days.
    #[serde(rename = "30d")]
    Month,
    /// Until the thread is deleted.
    #[default]
    Forever,
}

impl ThreadRetention {
    /// The retention as a duration; `None` is forever.
    pub fn duration(self) -> Option<std::time::Duration> {
        const DAY: u64 = 86_400;
        match self {
            ThreadRetention::Day => Some(std::time::Duration::from_secs(DAY)),
            ThreadRetention::Week => Some(std::time::Duration::from_secs(7 * DAY)),
            ThreadRetention::Month => Some(std::time::Duration::from_secs(30 * DAY)),
            ThreadRetention::Forever => None,
        }
    }
}

/// A resource quantity as Kubernetes writes it: `"500m"`, `2`, `"1Gi"`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(untagged)]
#[schemars(schema_with = "int_or_string")]
pub enum Quantity {
    /// A bare number.
    Int(u64),
    /// A number with an optional suffix.
    Str(String),
}

/// Kubernetes' structural form of "integer or string".
fn int_or_string(_: &mut schemars::SchemaGenerator) -> schemars::Schema {
    // No `type` and no anyOf: the pattern applies to strings only, so whole
    // numbers pass and text must look like a quantity.
    schemars::json_schema!({
        "x-kubernetes-int-or-string": true,
        "pattern": "^[0-9]+(\\.[0-9]+)?(m|k|M|G|T|Ki|Mi|Gi|Ti)?$"
    })
}

impl EnvVar {
    /// The value, empty when unset.
    pub fn value(&self) -> &str {
        self.value.as_deref().unwrap_or_default()
    }
}

impl Quantity {
    /// The quantity as text.
    pub fn text(&self) -> String {
        match self {
            Quantity::Int(n) => n.to_string(),
            Quantity::Str(s) => s.clone(),
        }
    }
}

/// One environment variable.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct EnvVar {
    /// `^[A-Z][A-Z0-9_]*$`, at most 128 characters, not reserved (PATH, HOME, LD_*, PYTHON*, *_PROXY, WARREN_*, …).
    #[schemars(regex(pattern = "^[A-Z][A-Z0-9_]*$"), length(min = 1, max = 128))]
    pub name: String,
    /// Value (≤ 4096 bytes, no control characters but tab, LF, CR; empty when unset).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = 4096))]
    pub value: Option<String>,
}

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
    printcolumn = r#"{"name": "Network", "type": "string", "jsonPath": ".spec.network"}"#,
    printcolumn = r#"{"name": "Age", "type": "date", "jsonPath": ".metadata.creationTimestamp"}"#
)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct SandboxSpec {
    /// Root filesystem: `host` (the node's own `/usr`, read-only). OCI image
    /// references arrive with the image store.
    #[schemars(length(min = 1, max = 512))]
    pub image: String,
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
    /// Buckets mounted under `/data/<name>` in every execution.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 16))]
    pub storage: Vec<StorageMount>,
    /// Connectors (same namespace) whose credentials every execution gets.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 16))]
    pub connectors: Vec<LocalRef>,
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
    /// The StorageConnection (same namespace).
    pub connection_ref: LocalRef,
    /// Access mode (default ReadOnly).
    #[serde(default)]
    pub mode: MountMode,
    /// A prefix under the connection's prefix (whole segments).
    #[schemars(regex(pattern = "^[A-Za-z0-9_.=-]+(/[A-Za-z0-9_.=-]+)*/?$"), length(max = 1024))]
    pub prefix: Option<String>,
}

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

/// Observed state of a Sandbox.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct SandboxStatus {
    /// `Ready`: True when the spec is valid and can run on this release's
    /// node-agents. Reasons: `Valid`, `InvalidSpec`, `Unsupported` (storage
    /// mounts and connectors are not offered yet).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub conditions: Vec<Condition>,
    /// The `metadata.generation` this status describes.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub observed_generation: Option<i64>,
    /// Languages found in the image.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub languages: Vec<Language>,
    /// Nodes where the image is unpacked and ready.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub warm_nodes: Vec<String>,
}

/// Reference to an object in the same namespace.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct LocalRef {
    /// Object name.
    #[schemars(length(min = 1, max = 253))]
    pub name: String,
}

/// Where a key's secret value lives.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct SecretKeyRef {
    /// Secret name (same namespace).
    #[schemars(length(min = 1, max = 253))]
    pub name: String,
    /// Entry in the Secret's data (default `key`).
    #[serde(default = "default_secret_key")]
    pub key: String,
}

fn default_secret_key() -> String {
    "key".to_string()
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
    /// Network policy; may only be stricter than the Sandbox's.
    pub network: Option<Network>,
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

/// The parts of a core/v1 Secret Warren reads.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct SecretBody {
    /// Base64 values.
    #[serde(default)]
    pub data: BTreeMap<String, String>,
    /// Plain values (win over `data`, as in Kubernetes).
    #[serde(default)]
    pub string_data: BTreeMap<String, String>,
}

/// Kind of object store.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub enum StorageProvider {
    /// Any S3-compatible endpoint.
    S3,
    /// Google Cloud Storage.
    GCS,
    /// Azure Blob Storage.
    Azure,
    /// A directory present on every node (development).
    Local,
}

/// A bucket sandboxes can mount under `/data/<name>`. Every mount is confined
/// below `prefix`; ApiKeys and requests may only narrow it further.
#[derive(CustomResource, Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[kube(
    group = "warren.dev",
    version = "v1alpha1",
    crates(kube_core = "::kube_core", k8s_openapi = "::k8s_openapi", schemars = "::schemars"),
    kind = "StorageConnection",
    doc = "A bucket sandboxes can mount under /data/<name>.",
    namespaced,
    status = "ReadyStatus",
    shortname = "wsc",
    derive = "PartialEq",
    printcolumn = r#"{"name": "Ready", "type": "string", "jsonPath": ".status.conditions[?(@.type==\"Ready\")].status"}"#,
    printcolumn = r#"{"name": "Provider", "type": "string", "jsonPath": ".spec.provider"}"#,
    printcolumn = r#"{"name": "Bucket", "type": "string", "jsonPath": ".spec.bucket"}"#,
    printcolumn = r#"{"name": "Age", "type": "date", "jsonPath": ".metadata.creationTimestamp"}"#
)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct StorageConnectionSpec {
    /// Kind of store.
    pub provider: StorageProvider,
    /// Bucket (S3, GCS), container (Azure) or absolute directory (Local).
    #[schemars(length(min = 1, max = 1024))]
    pub bucket: String,
    /// Connection prefix: the broadest path any mount may see, matched by
    /// whole segments (`tenants/a` covers `tenants/a/x`, not `tenants/ab`).
    #[schemars(regex(pattern = "^[A-Za-z0-9_.=-]+(/[A-Za-z0-9_.=-]+)*/?$"), length(max = 1024))]
    pub prefix: Option<String>,
    /// Endpoint URL (S3-compatible services, Azure account URL).
    #[schemars(regex(pattern = "^https?://"), length(max = 2048))]
    pub endpoint: Option<String>,
    /// Region (S3).
    pub region: Option<String>,
    /// Secret with the credentials (S3: `accessKeyId`, `secretAccessKey`;
    /// GCS: `serviceAccountJson`; Azure: `accountName`, `accountKey`).
    /// Omitted: the node's ambient identity.
    pub credentials_secret_ref: Option<LocalRef>,
}

impl StorageProvider {
    /// Entries the credentials Secret must hold.
    pub fn secret_entries(self) -> &'static [&'static str] {
        match self {
            StorageProvider::S3 => &["accessKeyId", "secretAccessKey"],
            StorageProvider::GCS => &["serviceAccountJson"],
            StorageProvider::Azure => &["accountName", "accountKey"],
            StorageProvider::Local => &[],
        }
    }
}

/// Services a connector can hold credentials for.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub enum ConnectorType {
    /// PostgreSQL (`.pgpass` + `PGPASSFILE`).
    PostgreSQL,
    /// MySQL / MariaDB (`.my.cnf`).
    MySQL,
    /// Redis (`REDISCLI_AUTH`).
    Redis,
    /// MongoDB (connection string file).
    MongoDB,
    /// BigQuery (ADC JSON + `GOOGLE_APPLICATION_CREDENTIALS`).
    BigQuery,
    /// S3 (`.aws/credentials` + `AWS_PROFILE`).
    S3,
    /// Google Cloud Storage (ADC JSON).
    GCS,
    /// Azure Storage (connection string).
    Azure,
    /// GitHub (`GH_TOKEN`).
    GitHub,
}

impl ConnectorType {
    /// Entries the credentials Secret must hold.
    pub fn secret_entries(self) -> &'static [&'static str] {
        match self {
            ConnectorType::PostgreSQL | ConnectorType::MySQL | ConnectorType::MongoDB | ConnectorType::Redis => &["password"],
            ConnectorType::BigQuery | ConnectorType::GCS => &["serviceAccountJson"],
            ConnectorType::S3 => &["accessKeyId", "secretAccessKey"],
            ConnectorType::Azure => &["connectionString"],
            ConnectorType::GitHub => &["token"],
        }
    }
}

/// Credentials for a service the code may use. They appear only for the
/// duration of a call, on a RAM-backed mount, as the files and variables the
/// standard tools read; never in thread state.
#[derive(CustomResource, Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[kube(
    group = "warren.dev",
    version = "v1alpha1",
    crates(kube_core = "::kube_core", k8s_openapi = "::k8s_openapi", schemars = "::schemars"),
    kind = "Connector",
    doc = "Credentials for a service the code may use, injected per call.",
    namespaced,
    status = "ReadyStatus",
    shortname = "wcn",
    derive = "PartialEq",
    printcolumn = r#"{"name": "Ready", "type": "string", "jsonPath": ".status.conditions[?(@.type==\"Ready\")].status"}"#,
    printcolumn = r#"{"name": "Type", "type": "string", "jsonPath": ".spec.type"}"#,
    printcolumn = r#"{"name": "Host", "type": "string", "jsonPath": ".spec.host"}"#,
    printcolumn = r#"{"name": "Age", "type": "date", "jsonPath": ".metadata.creationTimestamp"}"#
)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct ConnectorSpec {
    /// The service.
    #[serde(rename = "type")]
    pub kind: ConnectorType,
    /// Host name or address of the service (databases, Redis).
    #[schemars(length(max = 253))]
    pub host: Option<String>,
    /// Port of the service.
    #[schemars(range(min = 1, max = 65535))]
    pub port: Option<u16>,
    /// Database name (PostgreSQL, MySQL, MongoDB).
    pub database: Option<String>,
    /// User name, when not in the Secret.
    pub username: Option<String>,
    /// Project (BigQuery, GCS).
    pub project: Option<String>,
    /// Secret with the credentials, by type: `password` (PostgreSQL, MySQL,
    /// MongoDB, Redis), `serviceAccountJson` (BigQuery, GCS), `accessKeyId` +
    /// `secretAccessKey` (S3), `connectionString` (Azure), `token` (GitHub).
    pub credentials_secret_ref: LocalRef,
}

/// Observed state of a StorageConnection or Connector.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ReadyStatus {
    /// `Ready`: True when the referenced Secret and its entries exist.
    /// Reasons: `Valid`, `SecretNotFound`, `SecretIncomplete`.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub conditions: Vec<Condition>,
    /// The `metadata.generation` this status describes.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub observed_generation: Option<i64>,
}
