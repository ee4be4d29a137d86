//! The OpenAPI 3.1 document, generated from the handlers and types.
//!
//! Routes registered through `utoipa_axum::routes!` land in the router and
//! the document together. The execute body is parsed by hand (to name every
//! bad field), so its schema is a separate type: a unit test keeps its
//! properties equal to the parser's field list.

use std::collections::BTreeMap;

use serde::Serialize;
use utoipa::openapi::security::{Http, HttpAuthScheme, SecurityScheme};
use utoipa::{Modify, OpenApi, ToSchema};

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
    /// https URL for asynchronous delivery; needs `Prefer: respond-async` (not offered yet: 501).
    #[schema(pattern = "^https://", max_length = 2048)]
    pub webhook_url: Option<String>,
}

struct BearerAuth;

impl Modify for BearerAuth {
    fn modify(&self, openapi: &mut utoipa::openapi::OpenApi) {
        let components = openapi.components.get_or_insert_with(Default::default);
        let scheme = Http::builder().scheme(HttpAuthScheme::Bearer).bearer_format("sk-wrn-…").build();
        components.add_security_scheme("bearer", SecurityScheme::Http(scheme));
    }
}

/// Document metadata; paths come from the router.
#[derive(OpenApi)]
#[openapi(
    info(title = "Warren API", description = "Run untrusted code in fresh sandboxes. Wire-compatible with the Baponi Python SDK."),
    modifiers(&BearerAuth),
    components(schemas(crate::error::ErrorBody))
)]
pub struct ApiDoc;

/// The document as served, pretty-printed with a trailing newline.
pub fn render(doc: &utoipa::openapi::OpenApi) -> String {
    let mut s = doc.to_pretty_json().unwrap_or_default();
    s.push('\n');
    s
}

#[cfg(test)]
mod tests {
    #[test]
    fn execute_schema_lists_exactly_the_accepted_fields() {
        let (_, doc) = crate::router::build();
        let json = serde_json::to_value(&doc).unwrap();
        let props = json["components"]["schemas"]["ExecuteRequest"]["properties"].as_object().expect("ExecuteRequest schema");
        let mut documented: Vec<&str> = props.keys().map(String::as_str).collect();
        let mut accepted = crate::request::FIELDS.to_vec();
        documented.sort();
        accepted.sort();
        assert_eq!(documented, accepted);
    }

    #[test]
    fn document_is_openapi_3_1() {
        let (_, doc) = crate::router::build();
        let json = serde_json::to_value(&doc).unwrap();
        assert!(json["openapi"].as_str().unwrap().starts_with("3.1"));
    }
}
