//! Where a storage mount's bytes live, apart from how a sandbox sees them.
//!
//! A mount's spec (provider, bucket, prefix, endpoint, credentials) and its
//! validation; object-store clients that reach only endpoints the policy
//! allows, checked after resolution on every connection (`guard`); which
//! file names are one object-key segment (`name`); and the one-listing
//! reachability probe. The node-agent's FUSE tree (`warren-storage`) is
//! built on this; the operator uses it alone, for its probe, and so never
//! links a filesystem server.

pub mod guard;
pub mod name;
pub mod probe;
pub mod spec;

pub use spec::{MountSpec, Provider};
