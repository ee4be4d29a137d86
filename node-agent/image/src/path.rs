//! Tar entry paths made safe: relative, no `..`, bounded. Pure.

use std::ffi::OsStr;
use std::os::unix::ffi::OsStrExt;

use crate::layer::LayerError;

/// Longest path accepted (Linux PATH_MAX).
pub const MAX_PATH: usize = 4095;
/// Deepest path accepted.
pub const MAX_DEPTH: usize = 128;
/// Longest file name (NAME_MAX).
const MAX_NAME: usize = 255;

/// A normalized relative path: components without `/`, `.`, `..` or NUL.
/// Empty means the layer's root.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct RelPath(Vec<Vec<u8>>);

impl RelPath {
    /// Normalizes a tar path. A leading `/` is dropped (tar writers emit
    /// both `./usr` and `/usr`); `..` anywhere is refused rather than
    /// resolved, since no honest image builder emits it.
    pub fn parse(raw: &[u8]) -> Result<RelPath, LayerError> {
        if raw.len() > MAX_PATH {
            return Err(LayerError::refused("path longer than 4095 bytes"));
        }
        if raw.contains(&0) {
            return Err(LayerError::refused("path contains NUL"));
        }
        let mut parts = Vec::new();
        for part in raw.split(|b| *b == b'/') {
            match part {
                b"" | b"." => continue,
                b".." => return Err(LayerError::refused(format!("path {:?} climbs out with ..", String::from_utf8_lossy(raw)))),
                p if p.len() > MAX_NAME => return Err(LayerError::refused("file name longer than 255 bytes")),
                p => parts.push(p.to_vec()),
            }
        }
        if parts.len() > MAX_DEPTH {
            return Err(LayerError::refused("path deeper than 128 directories"));
        }
        Ok(RelPath(parts))
    }

    /// True for the layer's root.
    pub fn is_root(&self) -> bool {
        self.0.is_empty()
    }

    /// Parent directory and file name; `None` for the root.
    pub fn split_last(&self) -> Option<(RelPath, &OsStr)> {
        let (last, parent) = self.0.split_last()?;
        Some((RelPath(parent.to_vec()), OsStr::from_bytes(last)))
    }

    /// The components.
    pub fn components(&self) -> impl Iterator<Item = &OsStr> {
        self.0.iter().map(|c| OsStr::from_bytes(c))
    }

    /// `a/b/c` (`.` for the root), for openat2 and messages.
    pub fn joined(&self) -> Vec<u8> {
        if self.0.is_empty() {
            return b".".to_vec();
        }
        self.0.join(&b'/')
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parts(raw: &str) -> Vec<String> {
        RelPath::parse(raw.as_bytes()).unwrap().components().map(|c| c.to_string_lossy().into_owned()).collect()
    }

    #[test]
    fn normalizes_honest_paths() {
        assert_eq!(parts("./usr/bin/python3"), ["usr", "bin", "python3"]);
        assert_eq!(parts("usr//lib/"), ["usr", "lib"]);
        assert_eq!(parts("/etc/passwd"), ["etc", "passwd"], "absolute paths are anchored in the layer");
        assert!(RelPath::parse(b"./").unwrap().is_root());
        assert_eq!(RelPath::parse(b"a/b").unwrap().joined(), b"a/b");
    }

    #[test]
    fn refuses_escapes_and_oversized_paths() {
        for bad in ["../etc/passwd", "usr/../../x", "a/..", "..", "a\0b"] {
            assert!(RelPath::parse(bad.as_bytes()).is_err(), "{bad:?}");
        }
        assert!(RelPath::parse(&vec![b'a'; 4096]).is_err());
        assert!(RelPath::parse("a/".repeat(129).as_bytes()).is_err());
        assert!(RelPath::parse(&vec![b'n'; 256]).is_err());
        assert!(RelPath::parse("a/".repeat(128).as_bytes()).is_ok());
    }
}
