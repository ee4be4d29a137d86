//! The custom resources (`warren.dev/v1alpha1`, namespaced) as users write
//! them, one kind per module. The doc comments become `kubectl explain`; the schemars attributes
//! become the CRD's OpenAPI validation (plain schema only: the oldest API
//! server Warren supports has no CEL), so `kubectl apply` rejects bad values
//! with field-level messages. Cross-object rules are checked by `compile`.
//!
//! Unknown fields are refused everywhere: a misspelt limit must not silently
//! fall back to a default.

#![warn(missing_docs)]

pub mod apikey;
pub mod common;
pub mod connector;
pub mod reasons;
pub mod sandbox;
pub mod storage_connection;

/// API group and version of Warren's kinds.
pub const API_VERSION: &str = "warren.dev/v1alpha1";

pub use apikey::{ApiKey, ApiKeySpec, ApiKeyStatus, StorageNarrowing};
pub use common::{EnvVar, LocalRef, Quantity, ReadyStatus, SecretBody, SecretKeyRef, ThreadRetention};
pub use connector::{Connector, ConnectorSpec, ConnectorTls, ConnectorType, PasswordMethod, TlsMode};
pub use sandbox::{MountMode, Resources, Sandbox, SandboxSpec, SandboxStatus, StorageMount};
pub use storage_connection::{StorageConnection, StorageConnectionSpec, StorageProvider};
pub use warren_core::egress::{Egress, EgressRule};
pub use warren_core::{Language, Network};
