//! Splits YAML files into objects (`apiVersion`, `kind`, `metadata`, body) the
//! way `kubectl apply -f DIR` would, keeping where each came from.

use serde::Deserialize;
use serde_yaml::Value;

use crate::error::ConfigError;

/// One input file.
#[derive(Debug, Clone, Copy)]
pub struct Source<'a> {
    /// Path shown in errors.
    pub file: &'a str,
    /// YAML text (one or more documents).
    pub text: &'a str,
}

/// Object kinds Warren reads.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Kind {
    /// `warren.dev/v1alpha1` Sandbox.
    Sandbox,
    /// `warren.dev/v1alpha1` ApiKey.
    ApiKey,
    /// core/v1 Secret.
    Secret,
    /// `warren.dev/v1alpha1` StorageConnection.
    StorageConnection,
    /// `warren.dev/v1alpha1` Connector.
    Connector,
    /// core/v1 Namespace (only its `warren.dev/max-*` ceilings are read).
    Namespace,
}

impl Kind {
    /// Name as written in manifests.
    pub fn as_str(self) -> &'static str {
        match self {
            Kind::Sandbox => "Sandbox",
            Kind::ApiKey => "ApiKey",
            Kind::Secret => "Secret",
            Kind::StorageConnection => "StorageConnection",
            Kind::Connector => "Connector",
            Kind::Namespace => "Namespace",
        }
    }
}

/// A parsed object, not yet validated beyond its envelope.
#[derive(Debug, Clone)]
pub struct Object {
    /// File it came from.
    pub file: String,
    /// Kind.
    pub kind: Kind,
    /// Namespace (`default` when unset).
    pub namespace: String,
    /// Name.
    pub name: String,
    /// Annotations.
    pub annotations: std::collections::BTreeMap<String, String>,
    /// Everything but apiVersion, kind, metadata and status.
    pub body: serde_yaml::Mapping,
}

impl Object {
    /// `Kind namespace/name`, as errors name objects.
    pub fn id(&self) -> String {
        format!("{} {}/{}", self.kind.as_str(), self.namespace, self.name)
    }
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct Metadata {
    name: Option<String>,
    namespace: Option<String>,
    // Accepted so real manifests parse; Warren does not use them.
    #[serde(default, rename = "labels")]
    _labels: serde::de::IgnoredAny,
    #[serde(default)]
    annotations: std::collections::BTreeMap<String, String>,
}

/// Parses every document of every source. Syntax errors make the whole file
/// fail (`ConfigError::syntax`); envelope errors skip one object.
pub fn parse(sources: &[Source<'_>]) -> (Vec<Object>, Vec<ConfigError>) {
    let mut objects = Vec::new();
    let mut errors = Vec::new();
    for src in sources {
        let mut docs = Vec::new();
        for (i, doc) in serde_yaml::Deserializer::from_str(src.text).enumerate() {
            match Value::deserialize(doc) {
                Ok(Value::Null) => {}
                Ok(v) => docs.push((i, v)),
                Err(e) => {
                    errors.push(ConfigError::syntax(src.file, format!("document {}: {e}", i + 1)));
                    docs.clear();
                    break;
                }
            }
        }
        for (i, doc) in docs {
            match envelope(src.file, doc) {
                Ok(o) => objects.push(o),
                Err(mut e) => {
                    e.object.get_or_insert_with(|| format!("document {}", i + 1));
                    errors.push(e);
                }
            }
        }
    }
    (objects, errors)
}

fn envelope(file: &str, doc: Value) -> Result<Object, ConfigError> {
    let Value::Mapping(mut map) = doc else {
        return Err(ConfigError::invalid(file, None, "", "a manifest must be a mapping"));
    };
    let api_version = take_str(&mut map, "apiVersion");
    let kind_name = take_str(&mut map, "kind");
    let kind = match (api_version.as_deref(), kind_name.as_deref()) {
        (Some(crate::types::API_VERSION), Some("Sandbox")) => Kind::Sandbox,
        (Some(crate::types::API_VERSION), Some("ApiKey")) => Kind::ApiKey,
        (Some("v1"), Some("Secret")) => Kind::Secret,
        (Some(crate::types::API_VERSION), Some("StorageConnection")) => Kind::StorageConnection,
        (Some(crate::types::API_VERSION), Some("Connector")) => Kind::Connector,
        (Some("v1"), Some("Namespace")) => Kind::Namespace,
        (v, k) => {
            let msg = format!(
                "unsupported apiVersion/kind {}/{} (Warren reads warren.dev/v1alpha1 Sandbox, ApiKey, StorageConnection and Connector, and v1 Secret and Namespace)",
                v.unwrap_or("?"),
                k.unwrap_or("?")
            );
            return Err(ConfigError::invalid(file, None, "kind", msg));
        }
    };
    let meta_value = map.remove("metadata").unwrap_or(Value::Null);
    let meta: Metadata = serde_path_to_error::deserialize(meta_value)
        .map_err(|e| ConfigError::invalid(file, None, &format!("metadata.{}", e.path()), e.inner().to_string()))?;
    let name = meta.name.filter(|n| warren_core::ids::is_dns_label(n)).ok_or_else(|| {
        ConfigError::invalid(file, None, "metadata.name", "required; lower-case letters, digits and '-', at most 63")
    })?;
    // A Namespace is named by its name; its ceilings apply to that namespace.
    let namespace = if kind == Kind::Namespace { Some(name.clone()) } else { meta.namespace }.unwrap_or_else(|| "default".to_string());
    if !warren_core::ids::is_dns_label(&namespace) {
        return Err(ConfigError::invalid(file, None, "metadata.namespace", "not a valid namespace name"));
    }
    map.remove("status");
    Ok(Object { file: file.to_string(), kind, namespace, name, annotations: meta.annotations, body: map })
}

fn take_str(map: &mut serde_yaml::Mapping, key: &str) -> Option<String> {
    match map.remove(key) {
        Some(Value::String(s)) => Some(s),
        _ => None,
    }
}
