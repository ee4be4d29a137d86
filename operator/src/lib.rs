//! Warren's operator: reconciles Sandbox, ApiKey, StorageConnection and
//! Connector (issue #4). The types live in `warren-config` (shared with the
//! gateway's single-machine mode); this crate owns their CRD manifests.

pub mod crds;
