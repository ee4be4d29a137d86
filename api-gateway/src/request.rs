//! The execute request: parsing and validation (pure).
//!
//! The body is parsed as strict JSON, then each field is checked by hand so
//! every refusal names its field, unknown fields included. The limits are the
//! ones the Baponi SDK checks client-side; other clients get the same answer.

use std::collections::BTreeMap;

use serde::Serialize;
use serde_json::{Map, Value};
use utoipa::ToSchema;
use warren_core::bounds::{MAX_CODE_BYTES, TIMEOUT_SECS};
use warren_core::{env, ids, path, Language};

use crate::error::ApiError;

const MAX_METADATA_KEYS: usize = 10;
const MAX_METADATA_KEY: usize = 40;
const MAX_METADATA_VALUE: usize = 256;
const MAX_SUB_PATHS: usize = 10;
const MAX_WEBHOOK_URL: usize = 2048;

/// Every field the execute body may hold; anything else is refused.
pub const FIELDS: &[&str] = &["code", "language", "timeout", "thread_id", "metadata", "env_vars", "sub_paths", "webhook_url"];

/// A syntactically valid execute request.
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
}

/// Parses a JSON body into an [`ExecuteRequest`].
pub fn parse(body: &[u8]) -> Result<ExecuteRequest, ApiError> {
    let value = crate::json::parse(body).map_err(|e| ApiError::invalid_json(json_error(&e)))?;
    let Value::Object(mut obj) = value else {
        return Err(ApiError::invalid_json("the body must be a JSON object"));
    };
    if let Some(unknown) = obj.keys().find(|k| !FIELDS.contains(&k.as_str())) {
        let shown: String = unknown.chars().take(64).collect();
        return Err(ApiError::invalid(shown, format!("unknown field; the accepted fields are {}", FIELDS.join(", "))));
    }
    // `null` means "not given" for optional fields (some clients send it).
    obj.retain(|_, v| !v.is_null());
    Ok(ExecuteRequest {
        code: code(&mut obj)?,
        language: language(&mut obj)?,
        timeout: timeout(&mut obj)?,
        thread_id: thread_id(&mut obj)?,
        metadata: metadata(&mut obj)?,
        env_vars: env_vars(&mut obj)?,
        sub_paths: sub_paths(&mut obj)?,
        webhook_url: webhook_url(&mut obj)?,
    })
}

/// serde_json's message without echoing input; position helps the caller.
fn json_error(e: &serde_json::Error) -> String {
    use serde_json::error::Category;
    let what = match e.classify() {
        Category::Eof => "the JSON body is truncated",
        Category::Syntax => "the body is not valid JSON",
        Category::Data => "the JSON body is not acceptable",
        Category::Io => "the body could not be read",
    };
    format!("{what} (line {}, column {}): {e}", e.line(), e.column())
}

fn string(obj: &mut Map<String, Value>, field: &str) -> Result<Option<String>, ApiError> {
    match obj.remove(field) {
        None => Ok(None),
        Some(Value::String(s)) => Ok(Some(s)),
        Some(other) => Err(ApiError::invalid(field, format!("must be a string, not {}", type_name(&other)))),
    }
}

fn type_name(v: &Value) -> &'static str {
    match v {
        Value::Null => "null",
        Value::Bool(_) => "a boolean",
        Value::Number(_) => "a number",
        Value::String(_) => "a string",
        Value::Array(_) => "an array",
        Value::Object(_) => "an object",
    }
}

fn code(obj: &mut Map<String, Value>) -> Result<String, ApiError> {
    let code = string(obj, "code")?.ok_or_else(|| ApiError::invalid("code", "is required"))?;
    if code.is_empty() {
        return Err(ApiError::invalid("code", "must not be empty"));
    }
    if code.len() > MAX_CODE_BYTES {
        return Err(ApiError::invalid("code", format!("is {} bytes; the limit is {MAX_CODE_BYTES} (1 MiB)", code.len())));
    }
    if code.contains('\0') {
        return Err(ApiError::invalid("code", "must not contain NUL characters"));
    }
    Ok(code)
}

fn language(obj: &mut Map<String, Value>) -> Result<Language, ApiError> {
    match string(obj, "language")? {
        None => Ok(Language::Python),
        Some(s) => Language::parse(&s).ok_or_else(|| ApiError::invalid("language", "must be one of python, node, bash")),
    }
}

fn timeout(obj: &mut Map<String, Value>) -> Result<Option<u32>, ApiError> {
    let Some(v) = obj.remove("timeout") else { return Ok(None) };
    let (lo, hi) = (TIMEOUT_SECS.min, TIMEOUT_SECS.max);
    match v.as_u64().and_then(|t| u32::try_from(t).ok()) {
        Some(t) if TIMEOUT_SECS.contains(t) => Ok(Some(t)),
        _ if v.is_number() => Err(ApiError::invalid("timeout", format!("must be a whole number of seconds from {lo} to {hi}"))),
        _ => Err(ApiError::invalid("timeout", format!("must be an integer, not {}", type_name(&v)))),
    }
}

fn thread_id(obj: &mut Map<String, Value>) -> Result<Option<String>, ApiError> {
    let Some(t) = string(obj, "thread_id")? else { return Ok(None) };
    if !ids::is_thread_id(&t) {
        return Err(ApiError::invalid("thread_id", ids::THREAD_ID_RULE));
    }
    Ok(Some(t))
}

fn object(obj: &mut Map<String, Value>, field: &str) -> Result<Option<Map<String, Value>>, ApiError> {
    match obj.remove(field) {
        None => Ok(None),
        Some(Value::Object(m)) => Ok(Some(m)),
        Some(other) => Err(ApiError::invalid(field, format!("must be an object of strings, not {}", type_name(&other)))),
    }
}

fn shown(key: &str) -> String {
    env::printable(key)
}

/// A metadata key: `^[a-zA-Z0-9][a-zA-Z0-9_.-]*$`, 1–40 characters.
pub fn is_metadata_key(k: &str) -> bool {
    !k.is_empty() && k.len() <= MAX_METADATA_KEY && k.as_bytes()[0].is_ascii_alphanumeric() && k.bytes().all(|c| c.is_ascii_alphanumeric() || matches!(c, b'_' | b'.' | b'-'))
}

fn metadata(obj: &mut Map<String, Value>) -> Result<BTreeMap<String, String>, ApiError> {
    let Some(m) = object(obj, "metadata")? else { return Ok(BTreeMap::new()) };
    if m.len() > MAX_METADATA_KEYS {
        return Err(ApiError::invalid("metadata", format!("has {} keys; at most {MAX_METADATA_KEYS}", m.len())));
    }
    let mut out = BTreeMap::new();
    for (k, v) in m {
        let field = format!("metadata.{}", shown(&k));
        if !is_metadata_key(&k) {
            return Err(ApiError::invalid(field, "keys must match ^[a-zA-Z0-9][a-zA-Z0-9_.-]*$ and be 1–40 characters"));
        }
        let Value::String(v) = v else {
            return Err(ApiError::invalid(field, format!("values must be strings, not {}", type_name(&v))));
        };
        if v.chars().count() > MAX_METADATA_VALUE {
            return Err(ApiError::invalid(field, format!("values must be at most {MAX_METADATA_VALUE} characters")));
        }
        // Metadata lands in audit logs: no control characters (log injection).
        if v.chars().any(char::is_control) {
            return Err(ApiError::invalid(field, "values must not contain control characters"));
        }
        out.insert(k, v);
    }
    Ok(out)
}

fn env_vars(obj: &mut Map<String, Value>) -> Result<Vec<(String, String)>, ApiError> {
    let Some(m) = object(obj, "env_vars")? else { return Ok(Vec::new()) };
    if m.len() > env::MAX_REQUEST_VARS {
        return Err(ApiError::invalid("env_vars", format!("has {} variables; at most {}", m.len(), env::MAX_REQUEST_VARS)));
    }
    let mut out = Vec::with_capacity(m.len());
    for (k, v) in m {
        let field = format!("env_vars.{}", shown(&k));
        let Value::String(v) = v else {
            return Err(ApiError::invalid(field, format!("values must be strings, not {}", type_name(&v))));
        };
        env::check_var(&k, &v).map_err(|e| ApiError::invalid(field, e.to_string()))?;
        out.push((k, v));
    }
    if env::total_bytes(out.iter().map(|(k, v)| (k.as_str(), v.as_str()))) > env::MAX_TOTAL_BYTES {
        return Err(ApiError::invalid("env_vars", "names and values exceed 64 KiB in total"));
    }
    Ok(out)
}

fn sub_paths(obj: &mut Map<String, Value>) -> Result<Vec<String>, ApiError> {
    let list = match obj.remove("sub_paths") {
        None => return Ok(Vec::new()),
        Some(Value::Array(a)) => a,
        Some(other) => return Err(ApiError::invalid("sub_paths", format!("must be a list of strings, not {}", type_name(&other)))),
    };
    if list.len() > MAX_SUB_PATHS {
        return Err(ApiError::invalid("sub_paths", format!("at most {MAX_SUB_PATHS} paths")));
    }
    list.into_iter()
        .enumerate()
        .map(|(i, v)| {
            let field = format!("sub_paths[{i}]");
            let Value::String(p) = v else { return Err(ApiError::invalid(field, "must be a string")) };
            path::data_sub_path(&p).map_err(|m| ApiError::invalid(field, m))?;
            Ok(p)
        })
        .collect()
}

fn webhook_url(obj: &mut Map<String, Value>) -> Result<Option<String>, ApiError> {
    let Some(u) = string(obj, "webhook_url")? else { return Ok(None) };
    // Where it may point (https, public addresses) is the webhook policy's
    // to decide, with the operator's allowed hosts.
    if u.len() > MAX_WEBHOOK_URL || u.chars().any(|c| c.is_control() || c == ' ') {
        return Err(ApiError::invalid("webhook_url", "must be a URL of at most 2048 characters"));
    }
    Ok(Some(u))
}

/// Body of `POST /v1/sandbox/execute`. Unknown fields are refused.
#[derive(Debug, Serialize, ToSchema)]
#[schema(as = ExecuteRequest)]
pub struct ExecuteRequestDoc {
    /// Program text, 1 byte to 1 MiB of UTF-8.
    #[schema(min_length = 1, max_length = 1048576)]
    pub code: String,
    /// Interpreter; must be offered by the key's Sandbox.
    #[schema(value_type = Option<String>, pattern = "^(python|node|bash)$", default = "python")]
    pub language: Option<String>,
    /// Seconds, 1–3600 and at most the key's maximum (default 60, capped by it).
    #[schema(minimum = 1, maximum = 3600, default = 60)]
    pub timeout: Option<u32>,
    /// Persistent home directory id, `^[a-zA-Z0-9][a-zA-Z0-9_-]{0,127}$`, scoped to the key: `/home/sandbox` is restored before the call and its changes are saved (durably) before the response. One execution per thread at a time (409). Result errors: `thread_mount_error` and `thread_limit_reached` (the key keeps its `maxThreads`; nothing ran), `thread_state_too_large`, `thread_save_error`, `thread_conflict` (the previous state, or the other execution's, is kept).
    #[schema(pattern = "^[a-zA-Z0-9][a-zA-Z0-9_-]{0,127}$")]
    pub thread_id: Option<String>,
    /// Audit-only pairs: at most 10 keys (`^[a-zA-Z0-9][a-zA-Z0-9_.-]*$`, 1–40 chars), string values ≤ 256 chars. Never reaches the sandbox.
    pub metadata: Option<BTreeMap<String, String>>,
    /// Request-scope environment (wins over ApiKey and Sandbox): at most 50, names `^[A-Z][A-Z0-9_]*$`, reserved names refused.
    pub env_vars: Option<BTreeMap<String, String>>,
    /// At most 10 paths under `/data/<mount>/`, each narrowing its mount for this call.
    #[schema(max_items = 10)]
    pub sub_paths: Option<Vec<String>>,
    /// With `Prefer: respond-async`: where the final status is POSTed, signed with the key's webhook secret. `https` to a public address (checked after DNS and on every redirect) unless the operator allows the host.
    #[schema(max_length = 2048)]
    pub webhook_url: Option<String>,
}

#[cfg(test)]
#[path = "request_tests.rs"]
mod tests;
