//! `Connector`: credentials for a service the code may use.

use kube_derive::CustomResource;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use crate::common::{LocalRef, ReadyStatus};

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
    /// The kind in the execution contract.
    pub fn contract(self) -> warren_core::kinds::ConnectorKind {
        use warren_core::kinds::ConnectorKind as K;
        match self {
            ConnectorType::PostgreSQL => K::Postgres,
            ConnectorType::MySQL => K::Mysql,
            ConnectorType::Redis => K::Redis,
            ConnectorType::MongoDB => K::Mongo,
            ConnectorType::BigQuery => K::BigQuery,
            ConnectorType::S3 => K::S3,
            ConnectorType::GCS => K::Gcs,
            ConnectorType::Azure => K::Azure,
            ConnectorType::GitHub => K::GitHub,
        }
    }

    /// The service's port when none is given (services with an endpoint).
    pub fn default_port(self) -> Option<u16> {
        match self {
            ConnectorType::PostgreSQL => Some(5432),
            ConnectorType::MySQL => Some(3306),
            ConnectorType::Redis => Some(6379),
            ConnectorType::MongoDB => Some(27017),
            _ => None,
        }
    }

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

/// How custody reaches the server.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub enum TlsMode {
    /// TLS, the certificate verified against the CA and for the server's name.
    #[default]
    VerifyFull,
    /// Plain TCP: anyone on the path sees the session (and, with a weak
    /// password method, the password or its hash).
    Disable,
}

/// TLS toward a custody connector's server.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct ConnectorTls {
    /// `VerifyFull` (default) or `Disable`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mode: Option<TlsMode>,
    /// The name the server's certificate must carry (default: `host`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = 253))]
    pub server_name: Option<String>,
}

/// A password method weaker than SCRAM-SHA-256.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub enum PasswordMethod {
    /// md5 (`AuthenticationMD5Password`).
    Md5,
    /// Cleartext (`AuthenticationCleartextPassword`).
    Cleartext,
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
    /// S3: an S3-compatible endpoint URL (default: AWS).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = 512))]
    pub endpoint: Option<String>,
    /// S3: region.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = 64))]
    pub region: Option<String>,
    /// PostgreSQL: the node-agent's forwarder authenticates to the server on
    /// the sandbox's behalf (SCRAM-SHA-256, with channel binding over TLS);
    /// no password enters the sandbox at all.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub custody: Option<bool>,
    /// Custody: TLS toward the server. By default it is required and
    /// verified against the credentials Secret's `ca.crt` entry (without
    /// one, the public web PKI) for `host`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tls: Option<ConnectorTls>,
    /// Custody: password methods weaker than SCRAM-SHA-256 the forwarder
    /// may answer when the server asks for them (`Md5`: the server learns a
    /// hash it can replay; `Cleartext`: the password). Default: none.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = 2))]
    pub allow_password_methods: Option<Vec<PasswordMethod>>,
    /// Secret with the credentials, by type: `password` (PostgreSQL, MySQL,
    /// MongoDB, Redis), `serviceAccountJson` (BigQuery, GCS), `accessKeyId` +
    /// `secretAccessKey` (S3), `connectionString` (Azure), `token` (GitHub).
    pub credentials_secret_ref: LocalRef,
}
