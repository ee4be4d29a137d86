//! Tar entry paths made safe: relative, no `..`, bounded. Pure.

use std::ffi::OsStr;
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};

/// Longest path accepted (Linux PATH_MAX).
pub const MAX_PATH: usize = 4095;
/// Deepest path accepted.
pub const MAX_DEPTH: usize = 128;
/// Longest file name (NAME_MAX).
const MAX_NAME: usize = 255;

/// Why a path was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct PathError(pub String);

/// A normalized relative path: components without `/`, `.`, `..` or NUL.
/// Empty means the tree's root.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct RelPath(Vec<Vec<u8>>);

impl RelPath {
    /// Normalizes a tar path. A leading `/` is dropped (image tar writers
    /// emit both `./usr` and `/usr`); `..` anywhere is refused rather than
    /// resolved, since no honest writer emits it; at most [`MAX_DEPTH`]
    /// directories deep.
    pub fn parse(raw: &[u8]) -> Result<RelPath, PathError> {
        let parts = components(raw)?;
        if parts.len() > MAX_DEPTH {
            return Err(PathError("path deeper than 128 directories".into()));
        }
        Ok(RelPath(parts))
    }

    /// [`RelPath::parse`] for a writer that never emits absolute paths (a
    /// thread's layers are Warren's own): a leading `/` is refused; any
    /// depth a home may have is kept.
    pub fn parse_relative(raw: &[u8]) -> Result<RelPath, PathError> {
        if raw.first() == Some(&b'/') {
            return Err(PathError(format!("path {:?} is absolute", String::from_utf8_lossy(raw))));
        }
        Ok(RelPath(components(raw)?))
    }

    /// True for the tree's root.
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

    /// As a relative [`Path`] (empty for the root).
    pub fn to_path(&self) -> PathBuf {
        self.components().collect()
    }

    /// Shown in messages.
    pub fn display(&self) -> String {
        String::from_utf8_lossy(&self.joined()).into_owned()
    }
}

/// The plain components of `raw`: no NUL, no `..`, names and the whole
/// within the kernel's limits (`.` and empty components dropped).
fn components(raw: &[u8]) -> Result<Vec<Vec<u8>>, PathError> {
    if raw.len() > MAX_PATH {
        return Err(PathError("path longer than 4095 bytes".into()));
    }
    if raw.contains(&0) {
        return Err(PathError("path contains NUL".into()));
    }
    let mut parts = Vec::new();
    for part in raw.split(|b| *b == b'/') {
        match part {
            b"" | b"." => continue,
            b".." => return Err(PathError(format!("path {:?} climbs out with ..", String::from_utf8_lossy(raw)))),
            p if p.len() > MAX_NAME => return Err(PathError("file name longer than 255 bytes".into())),
            p => parts.push(p.to_vec()),
        }
    }
    Ok(parts)
}

/// True for a name that is one plain path component.
pub fn is_plain_name(name: &OsStr) -> bool {
    let b = name.as_bytes();
    !b.is_empty() && b != b"." && b != b".." && !b.contains(&b'/') && !b.contains(&0)
}

/// True for a relative path of plain components only ("" included).
pub fn is_plain_relative(rel: &Path) -> bool {
    rel.components().all(|c| matches!(c, std::path::Component::Normal(n) if is_plain_name(n)))
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
        assert_eq!(parts("/etc/passwd"), ["etc", "passwd"], "absolute paths are anchored in the tree");
        assert!(RelPath::parse(b"./").unwrap().is_root());
        assert_eq!(RelPath::parse(b"a/b").unwrap().joined(), b"a/b");
        assert_eq!(RelPath::parse(b"a/b").unwrap().to_path(), Path::new("a/b"));
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
        assert!(RelPath::parse_relative(b"/etc/passwd").is_err() && RelPath::parse_relative(b"etc/passwd").is_ok());
        assert!(RelPath::parse_relative("a/".repeat(200).as_bytes()).is_ok(), "a home may be deep");
    }

    #[test]
    fn plain_names_and_paths() {
        for bad in ["", ".", "..", "a/b", "a\0"] {
            assert!(!is_plain_name(OsStr::new(bad)), "{bad:?}");
        }
        assert!(is_plain_name(OsStr::new(".hidden")));
        assert!(is_plain_relative(Path::new("")) && is_plain_relative(Path::new("a/b")));
        for bad in ["/a", "a/../b", "./a", ".."] {
            assert!(!is_plain_relative(Path::new(bad)), "{bad:?}");
        }
    }
}
