//! Rules for environment variables set by manifests and requests.
//!
//! One list for every place that accepts a variable (Sandbox and ApiKey
//! manifests, the HTTP request, the node-agent's own check), so the layers
//! can never disagree about what is reserved.

/// Most variables one request may set (`env_vars`).
pub const MAX_REQUEST_VARS: usize = 50;
/// Most variables after merging Sandbox, ApiKey and request scopes.
pub const MAX_MERGED_VARS: usize = 200;
/// Longest name, in bytes.
pub const MAX_NAME_BYTES: usize = 128;
/// Longest value, in bytes.
pub const MAX_VALUE_BYTES: usize = 4096;
/// Largest sum of name and value bytes in one scope.
pub const MAX_TOTAL_BYTES: usize = 64 * 1024;

/// Names the sandbox sets itself, or that change how the loader, shells and
/// interpreters behave (code injection, module search paths, proxies).
const RESERVED: &[&str] = &[
    "PATH", "HOME", "TMPDIR", "PWD", "OLDPWD", "SHELL", "USER", "LOGNAME", "HOSTNAME", "TERM", "LANG",
    "LANGUAGE", "MAIL", "EDITOR", "VISUAL", "BASH_ENV", "ENV", "IFS", "PS1", "PS2", "PS4", "PROMPT_COMMAND",
    "CDPATH", "GLOBIGNORE", "BASH_XTRACEFD", "SHELLOPTS", "BASHOPTS", "NODE_PATH", "NODE_OPTIONS",
    "NODE_EXTRA_CA_CERTS", "PIP_USER", "PIP_TARGET", "PIP_PREFIX", "CARGO_HOME", "RUSTUP_HOME", "GOPATH",
    "GOMODCACHE", "GOBIN", "GOROOT", "GOFLAGS", "GOENV", "GOTOOLCHAIN", "R_LIBS_USER", "JULIA_DEPOT_PATH",
];
const RESERVED_PREFIXES: &[&str] =
    &["LD_", "LC_", "XDG_", "_", "WARREN_", "PYTHON", "NPM_CONFIG_", "BASH_FUNC_", "GCONV_", "MALLOC_"];

/// True when `name` may not be set by configuration or requests.
pub fn is_reserved(name: &str) -> bool {
    RESERVED.contains(&name) || RESERVED_PREFIXES.iter().any(|p| name.starts_with(p)) || name.ends_with("_PROXY")
}

/// Why a variable was refused. The reserved list itself is never echoed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum EnvError {
    /// Name not `^[A-Z][A-Z0-9_]*$` or too long.
    #[error("names must match ^[A-Z][A-Z0-9_]*$ and be at most 128 characters")]
    BadName,
    /// Reserved name.
    #[error("is reserved and cannot be set")]
    Reserved,
    /// Value too long.
    #[error("value is longer than 4096 bytes")]
    ValueTooLong,
    /// Control characters other than tab, LF and CR (including NUL).
    #[error("value contains control characters")]
    ControlCharacter,
}

/// Checks one variable.
pub fn check_var(name: &str, value: &str) -> Result<(), EnvError> {
    let name_ok = !name.is_empty()
        && name.len() <= MAX_NAME_BYTES
        && name.as_bytes()[0].is_ascii_uppercase()
        && name.bytes().all(|b| b.is_ascii_uppercase() || b.is_ascii_digit() || b == b'_');
    if !name_ok {
        return Err(EnvError::BadName);
    }
    if is_reserved(name) {
        return Err(EnvError::Reserved);
    }
    if value.len() > MAX_VALUE_BYTES {
        return Err(EnvError::ValueTooLong);
    }
    if value.chars().any(|c| c.is_control() && !matches!(c, '\t' | '\n' | '\r')) {
        return Err(EnvError::ControlCharacter);
    }
    Ok(())
}

/// Sum of name and value bytes, the size a scope is limited by.
pub fn total_bytes<'a>(vars: impl IntoIterator<Item = (&'a str, &'a str)>) -> usize {
    vars.into_iter().map(|(n, v)| n.len() + v.len()).sum()
}

/// A name safe to echo in an error message (bounded, printable).
pub fn printable(name: &str) -> String {
    name.chars().take(64).map(|c| if c.is_ascii_graphic() { c } else { '?' }).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names() {
        for bad in ["lower", "1A", "A-B", "", "A B", "É"] {
            assert_eq!(check_var(bad, "v"), Err(EnvError::BadName), "{bad}");
        }
        assert_eq!(check_var(&"A".repeat(129), "v"), Err(EnvError::BadName));
        assert!(check_var(&"A".repeat(128), "v").is_ok());
        for ok in ["API_BASE_URL", "A", "GOOGLE_CLOUD_PROJECT", "LOG_LEVEL", "X1"] {
            assert!(check_var(ok, "v").is_ok(), "{ok}");
        }
    }

    #[test]
    fn reserved_names_and_prefixes() {
        let reserved = [
            "PATH", "HOME", "LD_PRELOAD", "LC_ALL", "PYTHONPATH", "PYTHONSTARTUP", "HTTPS_PROXY", "NO_PROXY",
            "WARREN_X", "BASH_ENV", "NODE_OPTIONS", "NPM_CONFIG_PREFIX", "GOPATH", "XDG_CONFIG_HOME", "IFS",
        ];
        for name in reserved {
            assert_eq!(check_var(name, "v"), Err(EnvError::Reserved), "{name}");
        }
    }

    #[test]
    fn values() {
        assert_eq!(check_var("A", "a\u{1b}b"), Err(EnvError::ControlCharacter));
        assert_eq!(check_var("A", "a\0b"), Err(EnvError::ControlCharacter));
        assert!(check_var("A", "line1\nline2\t\r").is_ok());
        assert_eq!(check_var("A", &"x".repeat(MAX_VALUE_BYTES + 1)), Err(EnvError::ValueTooLong));
        assert!(check_var("A", &"x".repeat(MAX_VALUE_BYTES)).is_ok());
    }

    #[test]
    fn error_messages_do_not_list_reserved_names() {
        assert!(!EnvError::Reserved.to_string().contains("PATH"));
    }
}
