//! E2B paths and Warren's home. E2B's user is `user` with home
//! `/home/user`; Warren's sandbox home is `/home/sandbox`. Either spelling,
//! `~` and relative paths (E2B resolves them against the home) name the same
//! home. In a live sandbox every other absolute path is the sandbox's own
//! ([`absolute`]); the saved home of a sandbox that is not running has only
//! the home ([`relative`]). Pure; unit-tested.

use super::E2bError;

/// The home inside Warren's sandboxes.
pub const HOME: &str = "/home/sandbox";
/// The home as E2B spells it (what Warren reports back).
pub const E2B_HOME: &str = "/home/user";

/// `path` relative to the home (empty: the home itself), `.` and `..`
/// resolved; refused when it leaves the home.
pub fn relative(path: &str) -> Result<String, E2bError> {
    let rest = if path.is_empty() || path == "~" {
        ""
    } else if let Some(r) = path.strip_prefix("~/") {
        r
    } else if let Some(r) = [HOME, E2B_HOME].iter().find_map(|h| path.strip_prefix(h).filter(|r| r.is_empty() || r.starts_with('/'))) {
        r
    } else if path.starts_with('/') {
        return Err(outside(path));
    } else {
        path
    };
    let mut parts: Vec<&str> = Vec::new();
    for seg in rest.split('/') {
        match seg {
            "" | "." => {}
            ".." => {
                if parts.pop().is_none() {
                    return Err(outside(path));
                }
            }
            s if s.chars().any(|c| c.is_control() || c == '\\') => return Err(E2bError::invalid(format!("path {path:?}: no control characters or backslashes"))),
            s => parts.push(s),
        }
    }
    if parts.len() > 64 || rest.len() > 1024 {
        return Err(E2bError::invalid("a path has at most 1024 characters and 64 segments"));
    }
    Ok(parts.join("/"))
}

/// The absolute path inside a live sandbox that `path` names: the home
/// for `~`, relative paths and either home spelling; any other absolute
/// path as it is, `.` and `..` resolved.
pub fn absolute(path: &str) -> Result<String, E2bError> {
    if !path.starts_with('/') || [HOME, E2B_HOME].iter().any(|h| path == *h || path.starts_with(&format!("{h}/"))) {
        return relative(path).map(|r| in_sandbox(&r));
    }
    let mut parts: Vec<&str> = Vec::new();
    for seg in path.split('/') {
        match seg {
            "" | "." => {}
            ".." => {
                parts.pop();
            }
            s if s.chars().any(|c| c.is_control() || c == '\\') => return Err(E2bError::invalid(format!("path {path:?}: no control characters or backslashes"))),
            s => parts.push(s),
        }
    }
    if parts.len() > 64 || path.len() > 1024 {
        return Err(E2bError::invalid("a path has at most 1024 characters and 64 segments"));
    }
    let abs = format!("/{}", parts.join("/"));
    // `/home/x/../user` resolves into the home: spelled as Warren's.
    match [E2B_HOME].iter().find_map(|h| abs.strip_prefix(h).filter(|r| r.is_empty() || r.starts_with('/'))) {
        Some(rest) => Ok(format!("{HOME}{rest}")),
        None => Ok(abs),
    }
}

/// An absolute path of a live sandbox as E2B callers see it (the home
/// spelled `/home/user`).
pub fn shown(abs: &str) -> String {
    match abs.strip_prefix(HOME).filter(|r| r.is_empty() || r.starts_with('/')) {
        Some(rest) => format!("{E2B_HOME}{rest}"),
        None => abs.to_string(),
    }
}

/// The absolute path inside the sandbox of a home-relative path.
pub fn in_sandbox(rel: &str) -> String {
    if rel.is_empty() { HOME.to_string() } else { format!("{HOME}/{rel}") }
}

fn outside(path: &str) -> E2bError {
    E2bError::invalid(format!(
        "path {path:?} is outside the home: in Warren only the home ({E2B_HOME}, also {HOME}) persists between calls; each command runs in a fresh sandbox"
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn home_spellings_and_relative_paths_name_the_home() {
        for (p, want) in [
            ("/home/user/a.txt", "a.txt"),
            ("/home/sandbox/d/e", "d/e"),
            ("/home/user", ""),
            ("/home/user/", ""),
            ("~/x", "x"),
            ("~", ""),
            ("x/./y/../z", "x/z"),
            ("rel.txt", "rel.txt"),
            ("", ""),
        ] {
            assert_eq!(relative(p).unwrap(), want, "{p}");
        }
        assert_eq!(in_sandbox("a"), "/home/sandbox/a");
    }

    #[test]
    fn paths_outside_the_home_are_refused_with_the_reason() {
        for p in ["/etc/passwd", "/tmp/x", "/home/userx/a", "/home/user/../sandbox2", "../x", "a/../../b", "/home/user/a\u{0}b"] {
            let e = relative(p).unwrap_err();
            assert_eq!(e.status, axum::http::StatusCode::BAD_REQUEST, "{p}");
        }
        assert!(relative("/tmp/x").unwrap_err().message.contains("only the home"));
    }

    #[test]
    fn a_live_sandbox_has_every_absolute_path() {
        for (p, want) in [
            ("/tmp/x", "/tmp/x"),
            ("/home/user/a", "/home/sandbox/a"),
            ("a/b", "/home/sandbox/a/b"),
            ("~", "/home/sandbox"),
            ("/var/../etc/./hosts", "/etc/hosts"),
            ("/../..", "/"),
            ("/home/x/../user/y", "/home/sandbox/y"),
        ] {
            assert_eq!(absolute(p).unwrap(), want, "{p}");
        }
        assert!(absolute("/tmp/a\u{0}b").is_err() && absolute("../x").is_err());
        assert_eq!((shown("/home/sandbox/a"), shown("/home/sandboxes"), shown("/tmp")), ("/home/user/a".into(), "/home/sandboxes".into(), "/tmp".into()));
    }
}
