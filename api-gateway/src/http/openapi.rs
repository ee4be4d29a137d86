//! The OpenAPI 3.1 document, generated from the handlers and types.
//!
//! Routes registered through `utoipa_axum::routes!` land in the router and
//! the document together. The execute body is parsed by hand (to name every
//! bad field), so its schema is a separate type
//! (`crate::request::ExecuteRequestDoc`): a unit test keeps its properties
//! equal to the parser's field list.

use utoipa::openapi::security::{Http, HttpAuthScheme, SecurityScheme};
use utoipa::{Modify, OpenApi};

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
        let (_, doc) = crate::http::build();
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
        let (_, doc) = crate::http::build();
        let json = serde_json::to_value(&doc).unwrap();
        assert!(json["openapi"].as_str().unwrap().starts_with("3.1"));
    }
}
