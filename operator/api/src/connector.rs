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
