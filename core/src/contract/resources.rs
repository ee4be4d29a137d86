//! What a key lends one execution beyond the sandbox itself: storage
//! mounts and connectors. The config compiler publishes them (serialized in
//! camelCase inside the key's Secret), the gateway narrows and sends them,
//! the node-agent checks and serves them.

use serde::{Deserialize, Serialize};

use crate::kinds::{ConnectorKind, Provider};
use crate::secret::Credentials;

/// One storage mount of an execution.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Mount {
    /// `/data/<name>`.
    pub name: String,
    /// Where the objects live (`volume`: managed).
    pub provider: Provider,
    /// Bucket, container or directory.
    pub bucket: String,
    /// Everything the mount may see: connection, Sandbox and ApiKey
    /// prefixes joined (requests may narrow it with `sub_paths`).
    pub prefix: String,
    /// Writes are refused.
    pub read_only: bool,
    /// Endpoint URL.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub endpoint: Option<String>,
    /// Region.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub region: Option<String>,
    /// Credentials (empty: unsigned requests, or the node's identity where
    /// `ambient_identity` says so).
    #[serde(default)]
    pub credentials: Credentials,
    /// Most bytes one call may write to the mount.
    #[serde(default)]
    pub max_write_bytes: u64,
    /// No credentials, and the namespace's admin lent the node's cloud
    /// identity (`warren.dev/ambient-identity`).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub ambient_identity: bool,
}

/// One connector of an execution.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Connector {
    /// Connector name.
    pub name: String,
    /// The service (its wire name in the published configuration: `postgresql`, `mysql`, …).
    pub kind: ConnectorKind,
    /// Service host.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub host: Option<String>,
    /// Service port.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub port: Option<u16>,
    /// Database.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub database: Option<String>,
    /// User name.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub username: Option<String>,
    /// Google Cloud project.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub project: Option<String>,
    /// S3-compatible endpoint.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub endpoint: Option<String>,
    /// S3 region.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub region: Option<String>,
    /// PostgreSQL credential custody.
    #[serde(default)]
    pub custody: bool,
    /// Custody: plain TCP toward the server (the Connector chose it).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub tls_disabled: bool,
    /// Custody: the CA bundle (the Secret's `ca.crt`; none: the public web PKI).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tls_ca_pem: Option<String>,
    /// Custody: the name the certificate must carry (none: the host).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tls_server_name: Option<String>,
    /// Custody: weaker password methods allowed (`md5`, `cleartext`).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub weak_auth: Vec<String>,
    /// The Secret's entries the type needs.
    #[serde(default)]
    pub credentials: Credentials,
}

impl Mount {
    /// `bucket` of `provider` at `/data/<name>`, read-write, the rest unset.
    pub fn new(name: &str, provider: Provider, bucket: &str) -> Mount {
        Mount {
            name: name.into(),
            provider,
            bucket: bucket.into(),
            prefix: String::new(),
            read_only: false,
            endpoint: None,
            region: None,
            credentials: Credentials::default(),
            max_write_bytes: 0,
            ambient_identity: false,
        }
    }
}

impl Connector {
    /// Connector `name` of `kind`, every setting unset and no credentials.
    pub fn new(name: &str, kind: ConnectorKind) -> Connector {
        Connector {
            name: name.into(),
            kind,
            host: None,
            port: None,
            database: None,
            username: None,
            project: None,
            endpoint: None,
            region: None,
            custody: false,
            tls_disabled: false,
            tls_ca_pem: None,
            tls_server_name: None,
            weak_auth: Vec::new(),
            credentials: Credentials::default(),
        }
    }
}
