//! Warren's domain core: the types and rules every runtime shares, with no
//! I/O and no Kubernetes.
//!
//! ```text
//!            warren-core  (languages, bounds, env rules, ids, path scoping)
//!           /     |      \
//!  warren-api  warren-isolation  warren-proto glue
//!      |            |
//!  warren-config  warren-node-agent      warren-api-gateway, warren-operator
//! ```
//!
//! Anything a request, a manifest and the sandbox must agree on lives here
//! exactly once, so the layers cannot drift apart.
#![forbid(unsafe_code)]
#![warn(missing_docs)]

pub mod bounds;
pub mod contract;
pub mod egress;
pub mod endpoint;
pub mod env;
pub mod exit;
pub mod ids;
pub mod kinds;
pub mod language;
pub mod layout;
pub mod limits;
pub mod network;
pub mod path;
pub mod quantity;
pub mod reach;
pub mod secret;
pub mod trace;
pub mod warm;

pub use language::Language;
pub use limits::Limits;
pub use network::Network;
