//! OCI images for sandboxes.
//!
//! A node keeps one directory per layer (keyed by the layer blob's digest,
//! so images sharing a base share its layers on disk) and, per image, a
//! read-only overlayfs of its layers topped by a small Warren layer (the
//! mount points of Warren's zones and the sandbox's identity files). A
//! sandbox's root is a bind of that overlay: warm starts cost one bind.

pub mod config;
pub mod digest;
pub mod layer;
pub mod pull;
pub mod registry;
pub mod rootfs;
pub mod store;

pub use layer::{Budget, LayerError, LayerStats};
pub use pull::{repository, PullAuth, PullError, Pulled};
pub use store::{CollectReport, Image, Interpreter, Limits, Registries, Store};
