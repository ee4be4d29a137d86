//! The execution service's typed request and its checks (pure).
//!
//! Every front end (the HTTP body, MCP's tool arguments, an E2B command,
//! the console's form) builds an [`ExecuteRequest`] from its own wire and
//! hands it to `ExecutionService::admit`, which checks it here first: the
//! rules are the ones the Baponi SDK checks client-side, and each refusal
//! names its field as the HTTP body spells it.

use std::collections::BTreeMap;

use warren_core::bounds::{MAX_CODE_BYTES, TIMEOUT_SECS};
use warren_core::{env, ids, path, Language};

use super::ExecError;

const MAX_METADATA_KEYS: usize = 10;
const MAX_METADATA_KEY: usize = 40;
const MAX_METADATA_VALUE: usize = 256;
const MAX_SUB_PATHS: usize = 10;
const MAX_WEBHOOK_URL: usize = 2048;

/// What a caller asks to run, before it is checked.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ExecuteRequest {
    /// Program text.
    pub code: String,
    /// Interpreter.
    pub language: Language,
    /// Seconds; `None` = the default.
    pub timeout: Option<u32>,
    /// Persistent home directory id.
    pub thread_id: Option<String>,
    /// Audit-only key/value pairs.
    pub metadata: BTreeMap<String, String>,
    /// Request-scope environment.
    pub env_vars: Vec<(String, String)>,
    /// Mount narrowings.
    pub sub_paths: Vec<String>,
    /// Async delivery target.
    pub webhook_url: Option<String>,
    /// While another execution through this gateway holds the thread, wait
    /// for it (up to the queue wait) instead of refusing at once: a live
    /// sandbox's next command after one that was cut off.
    pub wait_for_thread: bool,
    /// The caller's W3C trace context (from its `traceparent` and
    /// `tracestate` headers), when it sent a valid one.
    pub trace: Option<warren_core::trace::Trace>,
}

impl ExecuteRequest {
    /// `code` in `language`, everything else at its default.
    pub fn new(code: impl Into<String>, language: Language) -> Self {
        ExecuteRequest {
            code: code.into(),
            language,
            timeout: None,
            thread_id: None,
            metadata: BTreeMap::new(),
            env_vars: Vec::new(),
            sub_paths: Vec::new(),
            webhook_url: None,
            wait_for_thread: false,
            trace: None,
        }
    }

    /// Checks every field's own rules (what the key allows is checked when
    /// the execution is resolved against it).
    pub fn check(&self) -> Result<(), ExecError> {
        check_code(&self.code)?;
        if let Some(t) = self.timeout {
            check_timeout(t)?;
        }
        if let Some(t) = &self.thread_id {
            if !ids::is_thread_id(t) {
                return Err(ExecError::invalid("thread_id", ids::THREAD_ID_RULE));
            }
        }
        check_metadata(&self.metadata)?;
        check_env(self.env_vars.iter().map(|(k, v)| (k.as_str(), v.as_str())))?;
        check_sub_paths(&self.sub_paths)?;
        if let Some(u) = &self.webhook_url {
            check_webhook_url(u)?;
        }
        Ok(())
    }
}

fn check_code(code: &str) -> Result<(), ExecError> {
    if code.is_empty() {
        return Err(ExecError::invalid("code", "must not be empty"));
    }
    if code.len() > MAX_CODE_BYTES {
        return Err(ExecError::invalid("code", format!("is {} bytes; the limit is {MAX_CODE_BYTES} (1 MiB)", code.len())));
    }
    if code.contains('\0') {
        return Err(ExecError::invalid("code", "must not contain NUL characters"));
    }
    Ok(())
}

/// The refusal of a timeout that is not a whole number of seconds in range.
pub fn timeout_refused() -> ExecError {
    ExecError::invalid("timeout", format!("must be a whole number of seconds from {} to {}", TIMEOUT_SECS.min, TIMEOUT_SECS.max))
}

fn check_timeout(t: u32) -> Result<(), ExecError> {
    if TIMEOUT_SECS.contains(t) { Ok(()) } else { Err(timeout_refused()) }
}

/// How a field named after a caller's key is shown (printable, bounded).
pub fn shown(key: &str) -> String {
    env::printable(key)
}

/// A metadata key: `^[a-zA-Z0-9][a-zA-Z0-9_.-]*$`, 1–40 characters.
pub fn is_metadata_key(k: &str) -> bool {
    !k.is_empty() && k.len() <= MAX_METADATA_KEY && k.as_bytes()[0].is_ascii_alphanumeric() && k.bytes().all(|c| c.is_ascii_alphanumeric() || matches!(c, b'_' | b'.' | b'-'))
}

/// Audit metadata: at most 10 keys, keys by [`is_metadata_key`], values of
/// at most 256 characters without control characters (they land in logs).
pub fn check_metadata(m: &BTreeMap<String, String>) -> Result<(), ExecError> {
    if m.len() > MAX_METADATA_KEYS {
        return Err(ExecError::invalid("metadata", format!("has {} keys; at most {MAX_METADATA_KEYS}", m.len())));
    }
    for (k, v) in m {
        let field = || format!("metadata.{}", shown(k));
        if !is_metadata_key(k) {
            return Err(ExecError::invalid(field(), "keys must match ^[a-zA-Z0-9][a-zA-Z0-9_.-]*$ and be 1–40 characters"));
        }
        if v.chars().count() > MAX_METADATA_VALUE {
            return Err(ExecError::invalid(field(), format!("values must be at most {MAX_METADATA_VALUE} characters")));
        }
        if v.chars().any(char::is_control) {
            return Err(ExecError::invalid(field(), "values must not contain control characters"));
        }
    }
    Ok(())
}

/// A request's environment: at most 50 variables, names and values by the
/// contract's rules (reserved names refused), 64 KiB in all.
pub fn check_env<'a>(vars: impl ExactSizeIterator<Item = (&'a str, &'a str)> + Clone) -> Result<(), ExecError> {
    if vars.len() > env::MAX_REQUEST_VARS {
        return Err(ExecError::invalid("env_vars", format!("has {} variables; at most {}", vars.len(), env::MAX_REQUEST_VARS)));
    }
    for (k, v) in vars.clone() {
        env::check_var(k, v).map_err(|e| ExecError::invalid(format!("env_vars.{}", shown(k)), e.to_string()))?;
    }
    if env::total_bytes(vars) > env::MAX_TOTAL_BYTES {
        return Err(ExecError::invalid("env_vars", "names and values exceed 64 KiB in total"));
    }
    Ok(())
}

fn check_sub_paths(paths: &[String]) -> Result<(), ExecError> {
    if paths.len() > MAX_SUB_PATHS {
        return Err(ExecError::invalid("sub_paths", format!("at most {MAX_SUB_PATHS} paths")));
    }
    for (i, p) in paths.iter().enumerate() {
        path::data_sub_path(p).map_err(|m| ExecError::invalid(format!("sub_paths[{i}]"), m))?;
    }
    Ok(())
}

/// A webhook URL's form: at most 2048 characters, no spaces or controls.
pub fn check_webhook_url(u: &str) -> Result<(), ExecError> {
    // Where it may point (https, public addresses) is the webhook policy's
    // to decide, with the operator's allowed hosts.
    if u.len() > MAX_WEBHOOK_URL || u.chars().any(|c| c.is_control() || c == ' ') {
        return Err(ExecError::invalid("webhook_url", "must be a URL of at most 2048 characters"));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn field(r: &ExecuteRequest) -> Option<String> {
        match r.check() {
            Err(ExecError::Invalid { field, .. }) => Some(field),
            _ => None,
        }
    }

    #[test]
    fn a_request_built_in_code_is_held_to_the_same_rules_as_a_body() {
        assert_eq!(field(&ExecuteRequest::new("echo 1", Language::Bash)), None);
        assert_eq!(field(&ExecuteRequest::new("", Language::Bash)).as_deref(), Some("code"));
        assert_eq!(field(&ExecuteRequest::new("a\0b", Language::Bash)).as_deref(), Some("code"));
        let mut r = ExecuteRequest::new("x", Language::Python);
        r.timeout = Some(0);
        assert_eq!(field(&r).as_deref(), Some("timeout"));
        r.timeout = Some(u32::MAX);
        assert_eq!(field(&r).as_deref(), Some("timeout"));
        let mut r = ExecuteRequest::new("x", Language::Python);
        r.env_vars = vec![("PATH".into(), "/x".into())];
        assert_eq!(field(&r).as_deref(), Some("env_vars.PATH"), "reserved names are refused whoever builds the request");
        let mut r = ExecuteRequest::new("x", Language::Python);
        r.metadata.insert("k".into(), "a\nforged log line".into());
        assert_eq!(field(&r).as_deref(), Some("metadata.k"));
        let mut r = ExecuteRequest::new("x", Language::Python);
        r.thread_id = Some("../t".into());
        assert_eq!(field(&r).as_deref(), Some("thread_id"));
        let mut r = ExecuteRequest::new("x", Language::Python);
        r.sub_paths = vec!["/data/a/../b".into()];
        assert_eq!(field(&r).as_deref(), Some("sub_paths[0]"));
    }

    #[test]
    fn environments_are_bounded_in_count_and_size() {
        let many: Vec<(String, String)> = (0..=env::MAX_REQUEST_VARS).map(|i| (format!("V{i}"), "x".into())).collect();
        assert!(matches!(check_env(many.iter().map(|(k, v)| (k.as_str(), v.as_str()))), Err(ExecError::Invalid { field, .. }) if field == "env_vars"));
        let big: Vec<(String, String)> = (0..20).map(|i| (format!("V{i}"), "x".repeat(env::MAX_VALUE_BYTES))).collect();
        assert!(matches!(check_env(big.iter().map(|(k, v)| (k.as_str(), v.as_str()))), Err(ExecError::Invalid { field, .. }) if field == "env_vars"));
    }
}
