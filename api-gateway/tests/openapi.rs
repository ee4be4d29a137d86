//! `api-gateway/openapi.json` is generated from the code; this fails when the
//! routes or schemas change without regenerating it
//! (`WARREN_UPDATE_GENERATED=1 cargo test -p warren-api-gateway --test openapi`).

#[test]
fn committed_openapi_document_matches_the_code() {
    let (_, doc) = warren_api_gateway::http::build();
    let generated = warren_api_gateway::http::openapi::render(&doc);
    let path = concat!(env!("CARGO_MANIFEST_DIR"), "/openapi.json");
    if std::env::var_os("WARREN_UPDATE_GENERATED").is_some() {
        std::fs::write(path, &generated).unwrap();
    }
    let committed = std::fs::read_to_string(path).unwrap_or_default();
    assert!(committed == generated, "{path} is stale: run WARREN_UPDATE_GENERATED=1 cargo test -p warren-api-gateway --test openapi");
}

#[test]
fn every_documented_path_is_served_and_every_route_is_documented() {
    let (_, doc) = warren_api_gateway::http::build();
    let mut paths: Vec<&str> = doc.paths.paths.keys().map(String::as_str).collect();
    paths.sort();
    assert_eq!(
        paths,
        [
            "/healthz",
            "/metrics",
            "/openapi.json",
            "/readyz",
            "/v1/executions",
            "/v1/executions/{trace_id}",
            "/v1/executions/{trace_id}/cancel",
            "/v1/executions/{trace_id}/output",
            "/v1/files/content/{token}",
            "/v1/files/download_url",
            "/v1/files/list",
            "/v1/files/upload_url",
            "/v1/sandbox/execute",
            "/v1/threads/{thread_id}",
            "/v1/threads/{thread_id}/fork",
            "/v1/threads/{thread_id}/history",
            "/v1/threads/{thread_id}/restore"
        ]
    );
}
