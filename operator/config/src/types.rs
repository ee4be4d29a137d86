//! The `spec` of each manifest kind, as users write it (`warren.dev/v1alpha1`).
//!
//! Unknown fields are refused everywhere: a misspelt limit must not silently
//! fall back to a default.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

/// API group and version of Warren's kinds.
pub const API_VERSION: &str = "warren.dev/v1alpha1";

/// Interpreters a sandbox can offer.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Language {
    /// `python3`.
    Python,
    /// `node`.
    Node,
    /// `bash`.
    Bash,
}

impl Language {
    /// All languages, in API order.
    pub const ALL: [Language; 3] = [Language::Python, Language::Node, Language::Bash];

    /// Lower-case name used on the wire.
    pub fn as_str(self) -> &'static str {
        match self {
            Language::Python => "python",
            Language::Node => "node",
            Language::Bash => "bash",
        }
    }

    /// Parses the wire name.
    pub fn parse(s: &str) -> Option<Language> {
        Language::ALL.into_iter().find(|l| l.as_str() == s)
    }
}

/// Outbound network policy.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
pub enum Network {
    /// Only loopback inside the sandbox.
    #[default]
    Blocked,
}

/// How long a thread's saved home directory is kept after its last use.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
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

/// A resource quantity as Kubernetes writes it: `"500m"`, `2`, `"1Gi"`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(untagged)]
pub enum Quantity {
    /// A bare number.
    Int(u64),
    /// A number with an optional suffix.
    Str(String),
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
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct EnvVar {
    /// `^[A-Z][A-Z0-9_]*$`, not reserved.
    pub name: String,
    /// Value (≤ 4096 bytes, no control characters but tab, LF, CR).
    #[serde(default)]
    pub value: String,
}

/// Resources of each execution.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct Resources {
    /// CPU cores, 0.5–4 (default 1).
    pub cpu: Option<Quantity>,
    /// Memory, swap off (default 1 GiB per CPU).
    pub memory: Option<Quantity>,
    /// Most processes and threads (default 256).
    pub pids: Option<u32>,
    /// Size of `/tmp` (default 512Mi).
    pub tmp_size: Option<Quantity>,
    /// Size of the home directory (default 512Mi).
    pub home_size: Option<Quantity>,
}

/// `Sandbox.spec`: the execution environment.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct SandboxSpec {
    /// Root filesystem: `host` (the node's own, read-only).
    pub image: String,
    /// Languages offered (default: all the image has).
    pub languages: Option<Vec<Language>>,
    /// Per-execution resources.
    #[serde(default)]
    pub resources: Resources,
    /// Longest timeout a request may ask for, 1–3600 s (default 3600).
    pub max_timeout_seconds: Option<u32>,
    /// Per-stream output cap (default 1Mi, at most 64Mi).
    pub max_output_bytes: Option<Quantity>,
    /// Network policy (default Blocked).
    #[serde(default)]
    pub network: Network,
    /// Variables for every execution.
    #[serde(default)]
    pub env: Vec<EnvVar>,
    /// How long thread state is kept (default Forever).
    #[serde(default)]
    pub thread_retention: ThreadRetention,
}

/// Reference to an object in the same namespace.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct LocalRef {
    /// Object name.
    pub name: String,
}

/// Where a key's secret value lives.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SecretKeyRef {
    /// Secret name (same namespace).
    pub name: String,
    /// Entry in the Secret's data (default `key`).
    #[serde(default = "default_secret_key")]
    pub key: String,
}

fn default_secret_key() -> String {
    "key".to_string()
}

/// `ApiKey.spec`: binds a key to a Sandbox and may only narrow it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct ApiKeySpec {
    /// The Sandbox this key runs code in.
    pub sandbox_ref: LocalRef,
    /// Secret holding the key (default: `<name>-key`, entry `key`).
    pub secret_ref: Option<SecretKeyRef>,
    /// A disabled key is refused with 403.
    #[serde(default)]
    pub disabled: bool,
    /// Lower maximum timeout than the Sandbox's.
    pub max_timeout_seconds: Option<u32>,
    /// Most executions running at once for this key (default 10).
    pub max_concurrency: Option<u32>,
    /// Network policy; may only be stricter than the Sandbox's.
    pub network: Option<Network>,
    /// Variables that override the Sandbox's.
    #[serde(default)]
    pub env: Vec<EnvVar>,
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
