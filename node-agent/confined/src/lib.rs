//! File operations that cannot leave a directory tree, for the agent's
//! work on trees a sandbox or a registry wrote: image layers it unpacks,
//! thread homes it saves and replays, Local storage it serves. Anything in
//! such a tree may be a symlink to a host path, and a path that was a
//! directory when one entry was applied may be a symlink by the next. So
//! nothing here resolves a path the usual way:
//!
//! - [`Dir`]: a directory held by a descriptor; a path below it is opened
//!   with `openat2(RESOLVE_BENEATH | RESOLVE_NO_SYMLINKS | RESOLVE_NO_XDEV |
//!   RESOLVE_NO_MAGICLINKS)`, and every operation is then on a single name
//!   relative to a descriptor, never following a final symlink and creating
//!   with `O_EXCL`;
//! - [`RelPath`]: a tar entry's path made safe (relative, no `..`, bounded);
//! - [`Marker`]: what an entry name says beyond a file (OCI whiteouts and
//!   opaque markers), shared by the image and thread layer appliers.

pub mod dir;
pub mod marker;
pub mod path;

pub use dir::{Dir, Kind, Stat};
pub use marker::Marker;
pub use path::{PathError, RelPath};
