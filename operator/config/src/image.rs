//! Image references and registry credentials, checked without a network:
//! what a Sandbox's `image` may be, and which of a dockerconfigjson
//! Secret's entries applies to it.

use base64::Engine as _;
use warren_core::secret::Credentials;

/// Longest reference accepted.
pub const MAX_REFERENCE: usize = 512;

/// The registry host a reference pulls from (`docker.io` when it names none).
pub fn registry_of(reference: &str) -> &str {
    match reference.split_once('/') {
        Some((first, _)) if first.contains(['.', ':']) || first == "localhost" => first,
        _ => "docker.io",
    }
}

/// Checks an OCI reference: `[registry[:port]/]path[:tag][@sha256:<64 hex>]`
/// with lower-case path components. `host` is not a reference.
pub fn check_reference(reference: &str) -> Result<(), String> {
    if reference.is_empty() || reference.len() > MAX_REFERENCE {
        return Err(format!("must be 1–{MAX_REFERENCE} characters"));
    }
    let (name, digest) = match reference.split_once('@') {
        Some((n, d)) => (n, Some(d)),
        None => (reference, None),
    };
    if let Some(d) = digest {
        let hex = d.strip_prefix("sha256:").ok_or("the digest must be sha256:<64 hex>")?;
        if hex.len() != 64 || !hex.bytes().all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b)) {
            return Err("the digest must be sha256:<64 lower-case hex>".into());
        }
    }
    let registry = registry_of(name);
    let path_and_tag = if registry == "docker.io" && !name.starts_with("docker.io/") { name } else { &name[registry.len() + 1..] };
    let (path, tag) = match path_and_tag.rsplit_once(':') {
        Some((p, t)) => (p, Some(t)),
        None => (path_and_tag, None),
    };
    if let Some(t) = tag {
        let ok = !t.is_empty() && t.len() <= 128 && t.bytes().next().is_some_and(|b| b.is_ascii_alphanumeric() || b == b'_');
        if !ok || !t.bytes().all(|b| b.is_ascii_alphanumeric() || b"_.-".contains(&b)) {
            return Err(format!("tag {t:?} is not valid ([A-Za-z0-9_][A-Za-z0-9_.-]{{0,127}})"));
        }
    }
    let component_ok = |c: &str| {
        !c.is_empty()
            && c.bytes().all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b"._-".contains(&b))
            && c.bytes().next().is_some_and(|b| b.is_ascii_alphanumeric())
            && c.bytes().last().is_some_and(|b| b.is_ascii_alphanumeric())
    };
    if !path.split('/').all(component_ok) {
        return Err(format!("repository {path:?} must be lower-case path components ([a-z0-9] with . _ - inside)"));
    }
    if registry != "docker.io" && !registry.bytes().all(|b| b.is_ascii_alphanumeric() || b".-:[]".contains(&b)) {
        return Err(format!("registry {registry:?} is not a host[:port]"));
    }
    Ok(())
}

/// Names a registry goes by in a dockerconfigjson `auths` map.
fn matches_registry(key: &str, registry: &str) -> bool {
    let host = key.trim_start_matches("https://").trim_start_matches("http://");
    let host = host.split('/').next().unwrap_or(host);
    host == registry || (registry == "docker.io" && matches!(host, "index.docker.io" | "registry-1.docker.io" | "docker.io"))
}

/// The username and password a `kubernetes.io/dockerconfigjson` Secret
/// (its `.dockerconfigjson` value) holds for `reference`'s registry;
/// `None` when it has no entry for it.
pub fn pull_credentials(dockerconfigjson: &[u8], reference: &str) -> Result<Option<Credentials>, String> {
    #[derive(serde::Deserialize)]
    struct Config {
        auths: std::collections::BTreeMap<String, Entry>,
    }
    #[derive(serde::Deserialize)]
    struct Entry {
        username: Option<String>,
        password: Option<String>,
        auth: Option<String>,
    }
    let config: Config = serde_json::from_slice(dockerconfigjson).map_err(|e| format!("not a dockerconfigjson document: {e}"))?;
    let registry = registry_of(reference);
    let Some((_, entry)) = config.auths.iter().find(|(k, _)| matches_registry(k, registry)) else { return Ok(None) };
    let (username, password) = match (&entry.username, &entry.password, &entry.auth) {
        (Some(u), Some(p), _) => (u.clone(), p.clone()),
        (_, _, Some(auth)) => {
            let decoded = base64::engine::general_purpose::STANDARD.decode(auth).map_err(|_| format!("auths.{registry}.auth is not base64"))?;
            let text = String::from_utf8(decoded).map_err(|_| format!("auths.{registry}.auth is not UTF-8"))?;
            let (u, p) = text.split_once(':').ok_or_else(|| format!("auths.{registry}.auth is not user:password"))?;
            (u.to_string(), p.to_string())
        }
        _ => return Err(format!("auths.{registry} has neither username/password nor auth")),
    };
    Ok(Some(Credentials([("username".to_string(), username), ("password".to_string(), password)].into())))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn references() {
        let d = format!("sha256:{}", "a".repeat(64));
        for ok in ["python", "python:3.12-slim", "library/python:3.12", "ghcr.io/org/app:v1.2", "127.0.0.1:5000/warren/runtime:1", "localhost/x", &format!("py@{d}"), &format!("reg.io:443/a/b:c@{d}")] {
            assert_eq!(check_reference(ok), Ok(()), "{ok}");
        }
        for bad in ["", "Python", "a//b", "a:", "a:-x", "py@sha256:abc", "py@md5:00", "-a", "a b", "a/b/", &"a".repeat(513)] {
            assert!(check_reference(bad).is_err(), "{bad:?}");
        }
        assert_eq!(registry_of("python:3"), "docker.io");
        assert_eq!(registry_of("org/app"), "docker.io");
        assert_eq!(registry_of("ghcr.io/org/app"), "ghcr.io");
        assert_eq!(registry_of("127.0.0.1:5000/a"), "127.0.0.1:5000");
    }

    #[test]
    fn dockerconfigjson_entries() {
        let auth = base64::engine::general_purpose::STANDARD.encode("robot:s3cret");
        let cfg = format!(r#"{{"auths":{{"https://index.docker.io/v1/":{{"auth":"{auth}"}},"ghcr.io":{{"username":"u","password":"p"}}}}}}"#);
        let hub = pull_credentials(cfg.as_bytes(), "python:3.12").unwrap().unwrap();
        assert_eq!((hub.0["username"].as_str(), hub.0["password"].as_str()), ("robot", "s3cret"));
        let gh = pull_credentials(cfg.as_bytes(), "ghcr.io/org/app:1").unwrap().unwrap();
        assert_eq!(gh.0["username"], "u");
        assert_eq!(pull_credentials(cfg.as_bytes(), "quay.io/x/y").unwrap(), None);
        assert!(pull_credentials(b"{}", "x").is_err());
        assert!(pull_credentials(br#"{"auths":{"ghcr.io":{"auth":"!!"}}}"#, "ghcr.io/a").is_err());
    }
}
