//! Types every kind shares: quantities, environment variables, references,
//! retention and the plain Ready status.

use std::collections::BTreeMap;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

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

/// The parts of a core/v1 Secret Warren reads.
/// Manifests carry `data` in base64; it is decoded once, when read, so the
/// operator (which gets bytes from the API server) hands bytes over as they are.
#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct SecretBody {
    /// Values, decoded.
    #[serde(default, deserialize_with = "base64_values")]
    pub data: BTreeMap<String, Vec<u8>>,
    /// Plain values (win over `data`, as in Kubernetes).
    #[serde(default)]
    pub string_data: BTreeMap<String, String>,
}

fn base64_values<'de, D: serde::Deserializer<'de>>(d: D) -> Result<BTreeMap<String, Vec<u8>>, D::Error> {
    use base64::Engine as _;
    let encoded = BTreeMap::<String, String>::deserialize(d)?;
    encoded
        .into_iter()
        .map(|(k, v)| match base64::engine::general_purpose::STANDARD.decode(v.trim()) {
            Ok(bytes) => Ok((k, bytes)),
            // The value is never echoed: it may be a secret.
            Err(_) => Err(serde::de::Error::custom(format!("data.{k} is not valid base64"))),
        })
        .collect()
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
