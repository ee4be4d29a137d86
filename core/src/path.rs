//! Path scoping: object-store prefixes and sandbox paths under `/data`.
//! Every level (connection, Sandbox mount, ApiKey, request) may only narrow
//! the one above it, matched by whole path segments; anything that could
//! climb out (`..`, `.`, empty segments, encoded separators, backslashes,
//! NUL) is refused before it reaches a store or the kernel.

/// Splits a prefix into segments; `None` when it holds an empty, `.` or `..`
/// segment, a backslash, a NUL or percent-encoding.
pub fn segments(prefix: &str) -> Option<Vec<&str>> {
    let p = prefix.strip_suffix('/').unwrap_or(prefix);
    if p.is_empty() {
        return Some(Vec::new());
    }
    if p.starts_with('/') || p.contains(['\\', '\0', '%']) {
        return None;
    }
    let segs: Vec<&str> = p.split('/').collect();
    segs.iter().all(|s| !s.is_empty() && *s != "." && *s != "..").then_some(segs)
}

/// True when `child` is `parent` or below it, by whole segments
/// (`tenants/a` covers `tenants/a/x`, not `tenants/ab`).
pub fn within(parent: &str, child: &str) -> bool {
    match (segments(parent), segments(child)) {
        (Some(p), Some(c)) => c.len() >= p.len() && p.iter().zip(&c).all(|(a, b)| a == b),
        _ => false,
    }
}

/// Joins prefixes (each already validated).
pub fn join(a: &str, b: &str) -> String {
    let a = a.trim_end_matches('/');
    let b = b.trim_end_matches('/');
    match (a.is_empty(), b.is_empty()) {
        (true, _) => b.to_string(),
        (_, true) => a.to_string(),
        _ => format!("{a}/{b}"),
    }
}

/// Longest `sub_paths` entry.
pub const MAX_SUB_PATH: usize = 512;

/// A full sandbox path under `/data/<mount>/…` (a request's `sub_paths`
/// entry), with no way to climb out. Returns the mount name and the path
/// below it (without a trailing `/`).
pub fn data_sub_path(p: &str) -> Result<(&str, &str), &'static str> {
    if p.len() > MAX_SUB_PATH {
        return Err("must be at most 512 characters");
    }
    let Some(rest) = p.strip_prefix("/data/") else { return Err("must start with /data/") };
    if p.contains('\0') || p.contains('\\') || p.chars().any(char::is_control) {
        return Err("must not contain NUL, backslash or control characters");
    }
    let lower = p.to_ascii_lowercase();
    const ENCODED: &[&str] = &["%2e", "%2f", "%5c", "%00", "%25", "%c0", "%c1"];
    if ENCODED.iter().any(|e| lower.contains(e)) {
        return Err("must not contain percent-encoded separators or dots");
    }
    let rest = rest.strip_suffix('/').unwrap_or(rest);
    if rest.split('/').any(|seg| seg.is_empty() || seg == "." || seg == "..") {
        return Err("must not contain empty, '.' or '..' segments");
    }
    Ok(rest.split_once('/').unwrap_or((rest, "")))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn prefixes_match_by_whole_segments() {
        assert!(within("tenants/a", "tenants/a"));
        assert!(within("tenants/a", "tenants/a/x"));
        assert!(within("tenants/a/", "tenants/a/x/"));
        assert!(!within("tenants/a", "tenants/ab"));
        assert!(!within("tenants/a", "tenants"));
        assert!(within("", "anything/below"));
        for bad in ["tenants/a/../b", "tenants/a/./x", "tenants//a", "/tenants/a", "tenants/a%2f..", "a\\b"] {
            assert!(!within("tenants/a", bad), "{bad}");
        }
        assert_eq!(join("shared/acme/", "tenant-a"), "shared/acme/tenant-a");
        assert_eq!(join("", "x"), "x");
    }

    #[test]
    fn data_sub_paths() {
        for bad in ["/data/", "/data//x", "/data/a/./b", "/data/a/../b", "/data/a%2f..", "/data/a\\b", "/etc/x", "data/a", "/data/%C0x"] {
            assert!(data_sub_path(bad).is_err(), "{bad}");
        }
        assert_eq!(data_sub_path("/data/a"), Ok(("a", "")));
        assert_eq!(data_sub_path("/data/a/b/"), Ok(("a", "b")));
        assert_eq!(data_sub_path("/data/bucket/tenant-a/x.csv"), Ok(("bucket", "tenant-a/x.csv")));
    }
}
