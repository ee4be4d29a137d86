//! `/mcp`: Warren as an MCP server (streamable HTTP, stateless, JSON
//! responses) for Claude Desktop, Claude Code, Cursor or any MCP client,
//! configured with just the URL and an API key (`Authorization: Bearer`).
//!
//! Tools: `sandbox_execute` (the execution service, recorded with delivery
//! mode `mcp`), `files_list`, `files_download` and `files_upload` (the
//! Files API's node calls). The key is checked before the protocol sees the
//! request; the tools read it from the request's extensions.

use std::sync::Arc;

use axum::extract::{Request, State};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use rmcp::model::{
    CallToolRequestParams, CallToolResponse, CallToolResult, ContentBlock, Implementation, InitializeResult, JsonObject, ListToolsResult, PaginatedRequestParams,
    ServerCapabilities, ServerConfig, Tool,
};
use rmcp::service::RequestContext;
use rmcp::{ErrorData, RoleServer, ServerHandler};
use serde_json::{json, Map, Value};
use warren_config::EffectiveKey;

use crate::exec::Delivery;
use crate::files::FileAccess;
use crate::result::ExecuteResult;
use crate::state::AppState;

/// Largest file `files_download` returns inline (as text).
const INLINE_MAX: u64 = 256 << 10;

/// The MCP service of one gateway; one per request (stateless).
#[derive(Clone)]
pub struct WarrenMcp {
    st: AppState,
}

/// The `/mcp` route: the rmcp service behind the key check.
pub fn router(st: AppState) -> axum::Router<AppState> {
    use rmcp::transport::streamable_http_server::{session::never::NeverSessionManager, StreamableHttpServerConfig, StreamableHttpService};
    let factory_state = st.clone();
    let mut config = StreamableHttpServerConfig::default();
    config.legacy_session_mode = false;
    config.json_response = true;
    // Any Host: the gateway is a network service, and every request carries a key.
    config.allowed_hosts = Vec::new();
    let service = StreamableHttpService::new(move || Ok(WarrenMcp { st: factory_state.clone() }), Arc::new(NeverSessionManager::default()), config);
    axum::Router::new().route_service("/mcp", service).layer(axum::middleware::from_fn_with_state(st, authenticate))
}

/// 401 without a valid key (the JSON error body every endpoint uses).
async fn authenticate(State(st): State<AppState>, mut req: Request, next: Next) -> Response {
    match st.keys().authenticate(req.headers()) {
        Ok(key) => {
            req.extensions_mut().insert(key);
            next.run(req).await
        }
        Err(e) => {
            let mut resp = crate::error::ApiError::from(e).into_response();
            resp.headers_mut().insert("www-authenticate", axum::http::HeaderValue::from_static("Bearer"));
            resp
        }
    }
}

fn schema(v: Value) -> Arc<JsonObject> {
    Arc::new(v.as_object().cloned().unwrap_or_default())
}

/// The tools and what an LLM needs to know to use them well.
fn tools() -> Vec<Tool> {
    let source = json!({"type": "string", "enum": ["thread", "volume"], "description": "thread: a thread's saved home directory; volume: a managed volume mounted at /data/<mount>"});
    let id = json!({"type": "string", "description": "The thread_id (for source thread) or the volume's name (for source volume)"});
    vec![
        Tool::new(
            "sandbox_execute",
            "Run code in a fresh, isolated sandbox and get its stdout, stderr and exit code. Print what you want to see: only \
             output is returned, not the value of the last expression. Each call starts clean unless you pass the same thread_id, \
             which keeps the home directory (installed packages, files) between calls. Storage configured for this key is mounted \
             under /data/<name>. Network access depends on the key's policy.",
            schema(json!({
                "type": "object",
                "properties": {
                    "code": {"type": "string", "description": "The program to run (at most 1 MiB)"},
                    "language": {"type": "string", "enum": ["python", "node", "bash"], "default": "python"},
                    "timeout": {"type": "integer", "minimum": 1, "maximum": 3600, "description": format!("Seconds before the program is killed (default {}; the key may allow less)", warren_core::bounds::TIMEOUT_SECS.default)},
                    "thread_id": {"type": "string", "pattern": "^[a-zA-Z0-9][a-zA-Z0-9_-]{0,127}$", "description": "Keep the home directory across calls that use the same id"}
                },
                "required": ["code"],
                "additionalProperties": false
            })),
        ),
        Tool::new(
            "files_list",
            "List the files in a thread's saved home directory or a managed volume (paths relative to it).",
            schema(json!({"type": "object", "properties": {"source": source, "id": id, "path": {"type": "string", "description": "A directory to list (default: everything)"}}, "required": ["source", "id"], "additionalProperties": false})),
        ),
        Tool::new(
            "files_download",
            "Read a file from a thread's saved home directory or a managed volume: its text when it is small UTF-8, otherwise a short-lived download URL.",
            schema(json!({"type": "object", "properties": {"source": source, "id": id, "path": {"type": "string", "description": "Path relative to the home or volume"}}, "required": ["source", "id", "path"], "additionalProperties": false})),
        ),
        Tool::new(
            "files_upload",
            "Write a text file into a thread's saved home directory (available to the next sandbox_execute with that thread_id) or a managed volume.",
            schema(json!({
                "type": "object",
                "properties": {"source": source, "id": id, "path": {"type": "string", "description": "Path relative to the home or volume"}, "content": {"type": "string", "description": "The file's text (at most 1 MiB)"}},
                "required": ["source", "id", "path", "content"],
                "additionalProperties": false
            })),
        ),
    ]
}

impl ServerHandler for WarrenMcp {
    fn get_info(&self) -> ServerConfig {
        InitializeResult::new(ServerCapabilities::builder().enable_tools().build())
            .with_server_info(Implementation::new("warren", env!("CARGO_PKG_VERSION")))
            .with_instructions("Warren runs code in isolated sandboxes. Use sandbox_execute to run Python, Node or Bash; print results. Reuse a thread_id to keep files and packages between calls.")
    }

    fn list_tools(&self, _: Option<PaginatedRequestParams>, _: RequestContext<RoleServer>) -> impl std::future::Future<Output = Result<ListToolsResult, ErrorData>> + Send + '_ {
        std::future::ready(Ok(ListToolsResult::with_all_items(tools())))
    }

    fn call_tool(&self, req: CallToolRequestParams, ctx: RequestContext<RoleServer>) -> impl std::future::Future<Output = Result<CallToolResponse, ErrorData>> + Send + '_ {
        async move {
            let parts = ctx.extensions.get::<axum::http::request::Parts>().ok_or_else(|| ErrorData::invalid_request("not an HTTP request", None))?;
            let key = parts.extensions.get::<Arc<EffectiveKey>>().cloned().ok_or_else(|| ErrorData::invalid_request("no API key", None))?;
            let headers = parts.headers.clone();
            let args = req.arguments.unwrap_or_default();
            let result = match req.name.as_ref() {
                "files_list" => self.files_list(&key, &args).await,
                "files_download" => self.files_download(&key, &args, &headers).await,
                "files_upload" => self.files_upload(&key, &args).await,
                "sandbox_execute" => self.execute(&key, args, &headers).await,
                other => return Err(ErrorData::invalid_params(format!("no tool named {other:?}"), None)),
            };
            Ok(CallToolResponse::Complete(result.unwrap_or_else(|e| CallToolResult::error(vec![ContentBlock::text(e)]))))
        }
    }
}

/// A refusal as the text an LLM reads: MCP's one reading of the execution
/// service's and the Files API's errors (a tool error, never a protocol one).
fn said(e: impl std::fmt::Display) -> String {
    e.to_string()
}

impl WarrenMcp {
    async fn execute(&self, key: &EffectiveKey, args: Map<String, Value>, headers: &axum::http::HeaderMap) -> Result<CallToolResult, String> {
        let mut req = crate::request::from_object(args).map_err(said)?;
        req.trace = crate::traced::from_headers(headers);
        if req.webhook_url.is_some() {
            return Err("webhook_url: not with sandbox_execute (the result is the tool's answer)".into());
        }
        let service = &self.st.service;
        let admitted = service.admit(key, req, Delivery::Mcp).await.map_err(said)?;
        let mut run = service.start(admitted).await.map_err(said)?;
        let r = run.collect().await.map_err(said)?;
        Ok(execution_result(&r))
    }

    async fn files_list(&self, key: &EffectiveKey, args: &Map<String, Value>) -> Result<CallToolResult, String> {
        let access = FileAccess::new(&self.st, key, str_arg(args, "source")?, str_arg(args, "id")?).map_err(said)?;
        let list = access.list(args.get("path").and_then(Value::as_str).unwrap_or_default(), "").await.map_err(said)?;
        let text = if list.files.is_empty() { "no files".to_string() } else { list.files.iter().map(|f| format!("{}\t{} bytes", f.path, f.size)).collect::<Vec<_>>().join("\n") };
        Ok(CallToolResult::success(vec![ContentBlock::text(text)]))
    }

    async fn files_download(&self, key: &EffectiveKey, args: &Map<String, Value>, headers: &axum::http::HeaderMap) -> Result<CallToolResult, String> {
        let access = FileAccess::new(&self.st, key, str_arg(args, "source")?, str_arg(args, "id")?).map_err(said)?;
        let path = str_arg(args, "path")?;
        let bytes = access.read_small(path, INLINE_MAX, "").await.map_err(said)?;
        match bytes.map(String::from_utf8) {
            Some(Ok(text)) => Ok(CallToolResult::success(vec![ContentBlock::text(text)])),
            // Large or binary: a link the user (or a tool) can fetch.
            _ => {
                let url = crate::files::download_url_of(&access, &self.st, path, headers).map_err(said)?;
                Ok(CallToolResult::success(vec![ContentBlock::text(format!("The file is large or binary; download it (valid until {}): {}", url.expires_at, url.url))]))
            }
        }
    }

    async fn files_upload(&self, key: &EffectiveKey, args: &Map<String, Value>) -> Result<CallToolResult, String> {
        let access = FileAccess::new(&self.st, key, str_arg(args, "source")?, str_arg(args, "id")?).map_err(said)?;
        let (path, content) = (str_arg(args, "path")?, str_arg(args, "content")?);
        if content.len() > 1 << 20 {
            return Err("content: at most 1 MiB".into());
        }
        access.write(path, bytes::Bytes::from(content.to_string()), "").await.map_err(said)?;
        Ok(CallToolResult::success(vec![ContentBlock::text(format!("wrote {} bytes to {path}", content.len()))]))
    }
}

fn str_arg<'a>(args: &'a Map<String, Value>, name: &str) -> Result<&'a str, String> {
    args.get(name).and_then(Value::as_str).ok_or_else(|| format!("{name}: required (a string)"))
}

/// An execution as MCP content: a summary line, stdout, stderr, and the
/// whole result object as structured content. A failed program is a tool error.
fn execution_result(r: &ExecuteResult) -> CallToolResult {
    let mut text = format!("exit_code: {}", r.exit_code);
    if let Some(e) = &r.error {
        text.push_str(&format!(" ({e})"));
    }
    if !r.stdout.is_empty() {
        text.push_str(&format!("\n--- stdout ---\n{}", r.stdout));
    }
    if !r.stderr.is_empty() {
        text.push_str(&format!("\n--- stderr ---\n{}", r.stderr));
    }
    if r.stdout_truncated || r.stderr_truncated {
        text.push_str("\n(output truncated at the sandbox's limit)");
    }
    let mut result = if r.success { CallToolResult::success(vec![ContentBlock::text(text)]) } else { CallToolResult::error(vec![ContentBlock::text(text)]) };
    result.structured_content = serde_json::to_value(r).ok();
    result
}
