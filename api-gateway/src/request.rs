//! The execute request's JSON form (pure): the HTTP body, and MCP's
//! `sandbox_execute` arguments, which have the same fields.
//!
//! The body is parsed as strict JSON and each field's type read by hand, so
//! every refusal names its field, unknown fields included. What the values
//! may be is the execution service's to check (`exec::request`).

use std::collections::BTreeMap;

use serde::Serialize;
use serde_json::{Map, Value};
use utoipa::ToSchema;
use warren_core::Language;

use crate::error::ApiError;
use crate::exec::request::{shown, timeout_refused};
use crate::exec::{ExecError, ExecuteRequest};

/// Every field the execute body may hold; anything else is refused.
pub const FIELDS: &[&str] = &["code", "language", "timeout", "thread_id", "metadata", "env_vars", "sub_paths", "webhook_url"];

/// Reads a JSON body into an [`ExecuteRequest`], unchecked.
pub fn read(body: &[u8]) -> Result<ExecuteRequest, ApiError> {
    let value = crate::json::parse(body).map_err(|e| ApiError::invalid_json(json_error(&e)))?;
    let Value::Object(obj) = value else {
        return Err(ApiError::invalid_json("the body must be a JSON object"));
    };
    Ok(from_object(obj)?)
}

/// Reads the fields of a JSON object into an [`ExecuteRequest`], unchecked:
/// unknown fields and wrong types are refused by name.
pub fn from_object(mut obj: Map<String, Value>) -> Result<ExecuteRequest, ExecError> {
    if let Some(unknown) = obj.keys().find(|k| !FIELDS.contains(&k.as_str())) {
        let shown: String = unknown.chars().take(64).collect();
        return Err(ExecError::invalid(shown, format!("unknown field; the accepted fields are {}", FIELDS.join(", "))));
    }
    // `null` means "not given" for optional fields (some clients send it).
    obj.retain(|_, v| !v.is_null());
    Ok(ExecuteRequest {
        code: string(&mut obj, "code")?.ok_or_else(|| ExecError::invalid("code", "is required"))?,
        language: language(&mut obj)?,
        timeout: timeout(&mut obj)?,
        thread_id: string(&mut obj, "thread_id")?,
        metadata: strings(&mut obj, "metadata")?.into_iter().collect(),
        env_vars: strings(&mut obj, "env_vars")?,
        sub_paths: sub_paths(&mut obj)?,
        webhook_url: string(&mut obj, "webhook_url")?,
        wait_for_thread: false,
        trace: None,
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

fn string(obj: &mut Map<String, Value>, field: &str) -> Result<Option<String>, ExecError> {
    match obj.remove(field) {
        None => Ok(None),
        Some(Value::String(s)) => Ok(Some(s)),
        Some(other) => Err(ExecError::invalid(field, format!("must be a string, not {}", type_name(&other)))),
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

fn language(obj: &mut Map<String, Value>) -> Result<Language, ExecError> {
    match string(obj, "language")? {
        None => Ok(Language::Python),
        Some(s) => Language::parse(&s).ok_or_else(|| ExecError::invalid("language", "must be one of python, node, bash")),
    }
}

fn timeout(obj: &mut Map<String, Value>) -> Result<Option<u32>, ExecError> {
    let Some(v) = obj.remove("timeout") else { return Ok(None) };
    match v.as_u64().map(|t| u32::try_from(t).unwrap_or(u32::MAX)) {
        Some(t) => Ok(Some(t)),
        None if v.is_number() => Err(timeout_refused()),
        None => Err(ExecError::invalid("timeout", format!("must be an integer, not {}", type_name(&v)))),
    }
}

/// An object of strings, in its order.
fn strings(obj: &mut Map<String, Value>, field: &str) -> Result<Vec<(String, String)>, ExecError> {
    let m = match obj.remove(field) {
        None => return Ok(Vec::new()),
        Some(Value::Object(m)) => m,
        Some(other) => return Err(ExecError::invalid(field, format!("must be an object of strings, not {}", type_name(&other)))),
    };
    m.into_iter()
        .map(|(k, v)| match v {
            Value::String(v) => Ok((k, v)),
            other => Err(ExecError::invalid(format!("{field}.{}", shown(&k)), format!("values must be strings, not {}", type_name(&other)))),
        })
        .collect()
}

fn sub_paths(obj: &mut Map<String, Value>) -> Result<Vec<String>, ExecError> {
    let list = match obj.remove("sub_paths") {
        None => return Ok(Vec::new()),
        Some(Value::Array(a)) => a,
        Some(other) => return Err(ExecError::invalid("sub_paths", format!("must be a list of strings, not {}", type_name(&other)))),
    };
    list.into_iter()
        .enumerate()
        .map(|(i, v)| match v {
            Value::String(p) => Ok(p),
            _ => Err(ExecError::invalid(format!("sub_paths[{i}]"), "must be a string")),
        })
        .collect()
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
