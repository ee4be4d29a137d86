//! Which file names a mount accepts: exactly those that are one object-key
//! segment as they are, so a name can never add a level, climb one, or be
//! rewritten by a store (Azure turns `\` into `/`).

use object_store::path::PathPart;


/// Longest name (Linux `NAME_MAX`).
pub const NAME_MAX: usize = 255;

/// A name that is not one plain key segment.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct InvalidName;

/// The name as a key segment, or [`InvalidName`].
pub fn segment(name: &[u8]) -> Result<PathPart<'_>, InvalidName> {
    let s = std::str::from_utf8(name).map_err(|_| InvalidName)?;
    if s.is_empty() || s.len() > NAME_MAX || s.contains('\\') {
        return Err(InvalidName);
    }
    // Refuses ".", "..", "/" and control characters.
    PathPart::parse(s).map_err(|_| InvalidName)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_plain_segments_are_names() {
        for ok in ["a", "customers.csv", "with space", "ünïcode", "a.b.c", "-x", "..a", "a..", "%2e%2e", "=;+,"] {
            assert_eq!(segment(ok.as_bytes()).unwrap().as_ref(), ok, "{ok}");
        }
        let long = "x".repeat(NAME_MAX + 1);
        for bad in ["", ".", "..", "a/b", "/", "a\\b", "a\0b", "a\nb", "\x7f", long.as_str()] {
            assert_eq!(segment(bad.as_bytes()).unwrap_err(), InvalidName, "{bad:?}");
        }
        assert_eq!(segment(b"\xff\xfe").unwrap_err(), InvalidName, "not UTF-8");
    }
}
