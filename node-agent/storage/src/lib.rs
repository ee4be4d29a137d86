//! Storage mounts: a bucket prefix presented as a filesystem tree.
//!
//! The tree is what a FUSE server (run by the node-agent, outside the
//! sandbox) answers from: entries are discovered on demand — a lookup is
//! one HEAD (and, only for a missing file, a one-page listing), a directory
//! is listed when it is read — so a program that opens one file in a prefix
//! of ten thousand objects lists nothing. Every key the tree touches is
//! built from the mount's root prefix plus names that passed [`name`]'s
//! rules, so nothing above the root can be named, whatever the program
//! asks for.

pub mod cache;
pub mod error;
pub mod fuse;
pub mod local;
pub mod pool;
pub mod session;
pub mod stores;
pub mod tree;
mod write;

pub use error::FsError;
// The object side of a mount (spec, guarded clients, names, probe), shared
// with the operator, which has no use for the FUSE server.
pub use warren_objects::{guard, name, probe, spec};
pub use spec::{MountSpec, Provider};
pub use tree::{Attr, Kind, MountOptions, ObjectTree, ROOT};
pub use write::SyncFailure;
