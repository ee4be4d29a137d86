//! The CRD manifests, rendered from the Rust types. `crdgen` writes them to
//! `crds/` and to the chart; a test fails when the committed files drift.

use kube_core::CustomResourceExt;
use warren_config::types::{ApiKey, Connector, Sandbox, StorageConnection};

const HEADER: &str = "# Generated from operator/config/src/types.rs by `cargo run -p warren-operator --bin crdgen`; do not edit.\n";

/// Directories (relative to the repository root) that hold the CRDs.
pub const DIRS: &[&str] = &["crds", "charts/warren/crds"];

/// `(file name, YAML)` for every CRD.
pub fn render() -> Vec<(String, String)> {
    [Sandbox::crd(), ApiKey::crd(), StorageConnection::crd(), Connector::crd()]
        .into_iter()
        .map(|crd| {
            let name = format!("{}.yaml", crd.spec.names.plural);
            // A CRD always serializes: it is plain data.
            let yaml = serde_yaml::to_string(&crd).unwrap_or_default();
            (name, format!("{HEADER}{yaml}"))
        })
        .collect()
}
