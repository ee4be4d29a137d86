//! `StorageConnection`: a bucket sandboxes can mount.

use kube_derive::CustomResource;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use crate::common::{LocalRef, ReadyStatus};

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
