//! What a layer entry's name says beyond a file: the OCI image spec's
//! whiteouts (`.wh.<name>`: `name` was deleted) and opaque markers
//! (`.wh..wh..opq`: the directory replaces what lower layers had). The
//! image applier turns them into overlayfs whiteouts; the thread applier
//! deletes. Pure.

use std::ffi::OsStr;
use std::os::unix::ffi::OsStrExt;

use crate::path::{is_plain_name, PathError};

const WHITEOUT_PREFIX: &[u8] = b".wh.";
const OPAQUE_MARKER: &[u8] = b".wh..wh..opq";

/// A name that is a marker rather than an entry.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Marker<'a> {
    /// The directory holding it hides everything below layers had there.
    Opaque,
    /// This entry of the directory holding it was deleted.
    Whiteout(&'a OsStr),
    /// aufs bookkeeping (`.wh..wh.plnk` and the like): nothing to apply.
    Ignored,
}

impl<'a> Marker<'a> {
    /// What `name` (the last component of an entry's path) marks, if
    /// anything; a whiteout naming no single entry is refused.
    pub fn of(name: &'a OsStr) -> Result<Option<Marker<'a>>, PathError> {
        let b = name.as_bytes();
        if b == OPAQUE_MARKER {
            return Ok(Some(Marker::Opaque));
        }
        let Some(hidden) = b.strip_prefix(WHITEOUT_PREFIX) else { return Ok(None) };
        if hidden.starts_with(WHITEOUT_PREFIX) {
            return Ok(Some(Marker::Ignored));
        }
        let hidden = OsStr::from_bytes(hidden);
        if !is_plain_name(hidden) {
            return Err(PathError(format!("whiteout {:?} names no single entry", name.to_string_lossy())));
        }
        Ok(Some(Marker::Whiteout(hidden)))
    }

    /// Whether `name` could not be saved as an entry of its own (it would
    /// read back as a marker).
    pub fn looks_like_one(name: &OsStr) -> bool {
        name.as_bytes().starts_with(WHITEOUT_PREFIX)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn markers_are_read_and_hostile_ones_refused() {
        fn of(n: &str) -> Result<Option<Marker<'_>>, PathError> {
            Marker::of(OsStr::new(n))
        }
        assert_eq!(of("file").unwrap(), None);
        assert_eq!(of(".wh..wh..opq").unwrap(), Some(Marker::Opaque));
        assert_eq!(of(".wh.gone").unwrap(), Some(Marker::Whiteout(OsStr::new("gone"))));
        assert_eq!(of(".wh..wh.plnk").unwrap(), Some(Marker::Ignored));
        for bad in [".wh.", ".wh..", ".wh..."] {
            assert!(of(bad).is_err(), "{bad:?}");
        }
        assert!(Marker::looks_like_one(OsStr::new(".wh.x")) && !Marker::looks_like_one(OsStr::new("x.wh.")));
    }
}
