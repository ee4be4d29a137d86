//! envd's filesystem service (`/filesystem.Filesystem/*`) in the live
//! sandbox: `Stat`, `ListDir`, `MakeDir`, `Move` and `Remove` run `fs.py`
//! (beside this file) as a process of the sandbox — exactly the filesystem
//! its commands see, as their user. Watching is `watch.rs`.

use axum::body::Body;
use axum::extract::{Path, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::Response;
use serde_json::{json, Value};

use super::connect;
use super::paths::absolute;
use super::sandbox::{open, Program};
use super::E2bError;
use crate::state::AppState;

/// The program the calls run (Python, in the sandbox).
const FS_PY: &str = include_str!("fs.py");
/// What precedes its answer on stdout.
const MARK: &str = "\u{1e}warren-e2b-fs ";
/// Seconds one call may take.
const TIMEOUT: u64 = 30;

/// `POST /filesystem.Filesystem/{method}` (unary, JSON).
pub async fn call(State(st): State<AppState>, headers: HeaderMap, Path(method): Path<String>, b: Body) -> Response {
    if method == "WatchDir" {
        return watching(&st, &headers, b).await.unwrap_or_else(|e| connect::stream_error(&e));
    }
    match unary(&st, &headers, &method, b).await {
        Ok(v) => connect::unary_ok(&v),
        Err(e) => connect::unary_error(&e),
    }
}

/// `WatchDir` (a server stream).
async fn watching(st: &AppState, headers: &HeaderMap, b: Body) -> Result<Response, E2bError> {
    let raw = super::read_body(st, b, 64 << 10).await?;
    let req = super::watch::request(&raw, true)?;
    let opened = open(st, headers).await?;
    let path = absolute(req.get("path").and_then(Value::as_str).unwrap_or_default())?;
    super::watch::stream(st, &opened, &path, req.get("recursive").and_then(Value::as_bool).unwrap_or(false)).await
}

async fn unary(st: &AppState, headers: &HeaderMap, method: &str, b: Body) -> Result<Value, E2bError> {
    let raw = super::read_body(st, b, 64 << 10).await?;
    let req: Value = serde_json::from_slice(&raw).map_err(|_| E2bError::invalid("the request is not JSON"))?;
    let path = |field: &str| -> Result<String, E2bError> { absolute(req.get(field).and_then(Value::as_str).unwrap_or_default()) };
    let watcher = || req.get("watcherId").and_then(Value::as_str).unwrap_or_default().to_string();
    match method {
        "CreateWatcher" => return super::watch::create(st, &open(st, headers).await?, &path("path")?, req.get("recursive").and_then(Value::as_bool).unwrap_or(false)).await,
        "GetWatcherEvents" => return super::watch::take(st, &open(st, headers).await?, &watcher()).await,
        "RemoveWatcher" => return super::watch::remove(st, &open(st, headers).await?, &watcher()).await,
        _ => {}
    }
    let args = match method {
        "Stat" => json!({"op": "stat", "path": path("path")?}),
        "ListDir" => json!({"op": "list", "path": path("path")?, "depth": req.get("depth").and_then(Value::as_u64).unwrap_or(1).clamp(1, 32)}),
        "MakeDir" => json!({"op": "mkdir", "path": path("path")?}),
        "Move" => json!({"op": "move", "path": path("source")?, "to": path("destination")?}),
        "Remove" => json!({"op": "remove", "path": path("path")?}),
        _ => return Err(E2bError::not_found(format!("filesystem.Filesystem/{method} does not exist")).with_code("unimplemented")),
    };
    let opened = open(st, headers).await?;
    let answer = run(st, &opened, &args).await?;
    Ok(match method {
        "MakeDir" if answer.get("exists").is_some() => return Err(E2bError::new(StatusCode::CONFLICT, "the path already exists").with_code("already_exists")),
        "Remove" => json!({}),
        _ => answer,
    })
}

/// Runs `fs.py` with `args` in the sandbox; its answer, or its error.
async fn run(st: &AppState, opened: &super::sandbox::Opened, args: &Value) -> Result<Value, E2bError> {
    if !opened.offers(warren_core::language::Language::Python) {
        return Err(E2bError::unsupported("the filesystem calls run Python in the sandbox, and this key's Sandbox does not offer python"));
    }
    let literal = serde_json::to_string(&args.to_string()).unwrap_or_default();
    let program = Program { code: format!("{FS_PY}\nmain({literal})\n"), language: warren_core::language::Language::Python, env: Default::default(), timeout: Some(TIMEOUT), tag: None, helper: true };
    let r = opened.finish(st, program).await?;
    let answer = r.stdout.rsplit_once(MARK).and_then(|(_, a)| serde_json::from_str::<Value>(a.trim_end()).ok());
    let Some(answer) = answer else {
        tracing::warn!(sandbox = %opened.sandbox.id, exit_code = r.exit_code, timed_out = r.timed_out, "an E2B filesystem call gave no answer");
        let why = if r.timed_out { "it ran past its timeout" } else { "no answer" };
        return Err(E2bError::new(StatusCode::SERVICE_UNAVAILABLE, format!("the filesystem call failed in the sandbox ({why})")));
    };
    if let Some(code) = answer.get("err").and_then(Value::as_str) {
        let message = answer.get("message").and_then(Value::as_str).unwrap_or_default().to_string();
        let status = if code == "not_found" { StatusCode::NOT_FOUND } else { StatusCode::BAD_REQUEST };
        return Err(E2bError::new(status, message));
    }
    Ok(answer.get("ok").cloned().unwrap_or_else(|| json!({})))
}
