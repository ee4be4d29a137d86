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
pub mod guard;
pub mod local;
pub mod name;
pub mod pool;
pub mod probe;
pub mod session;
pub mod spec;
pub mod stores;
pub mod tree;
mod write;

pub use error::FsError;
pub use spec::{MountSpec, Provider};
pub use tree::{Attr, Kind, MountOptions, ObjectTree, ROOT};
pub use write::SyncFailure;
