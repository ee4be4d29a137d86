//! Sandbase's REST shape over the same live sandboxes as the E2B API, so
//! its users' code runs unchanged: `POST /sandboxes` (`templateID`,
//! `timeout` → `sandboxID`; served by the E2B control plane, which takes
//! the key as `Authorization: Bearer` too), `POST /sandboxes/{id}/processes`
//! (`cmd`, `args` → `stdout`, `stderr`, `exitCode`, run to completion),
//! `GET|POST /sandboxes/{id}/files` (download or list by `?path=`; upload a
//! multipart form whose `path` field names the target), `POST
//! /sandboxes/{id}/pause` and `/resume`, `DELETE /sandboxes/{id}`. An adapter
//! over `crate::exec::live`, like the E2B one.

use axum::body::{Body, Bytes};
use axum::extract::{Path, Query, State};
use axum::http::{header, HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use futures_util::StreamExt;
use serde::Deserialize;
use serde_json::{json, Value};

use crate::e2b::sandbox::Opened;
use crate::e2b::E2bError;
use crate::exec::live::{LiveEvent, Start, SIGKILL};
use crate::state::AppState;

/// Sandbase's own routes (its create, pause, resume and delete are the E2B control plane's).
pub fn router() -> axum::Router<AppState> {
    use axum::routing::{get, post};
    axum::Router::new()
        .route("/sandboxes/{id}/processes", post(run_process))
        .route("/sandboxes/{id}/files", get(download).post(upload))
}

/// Largest request (a process's arguments).
const MAX_REQUEST: usize = 2 << 20;
/// Most output a synchronous process returns per stream (the rest is cut, and said so).
const MAX_OUTPUT: usize = 8 << 20;
/// Largest upload held (a multipart form).
const MAX_UPLOAD: usize = 64 << 20;

/// The caller's running sandbox `id`.
async fn sandbox(st: &AppState, headers: &HeaderMap, id: &str) -> Result<Opened, E2bError> {
    let key = crate::e2b::control::key(st, headers)?;
    let sandbox = crate::e2b::control::owned(st, &key, id).await?;
    if sandbox.state != "running" {
        return Err(E2bError::new(StatusCode::CONFLICT, format!("sandbox {id} is paused; POST /sandboxes/{id}/resume first")));
    }
    Ok(Opened { key, sandbox })
}

/// `POST /sandboxes/{id}/processes` `{cmd, args, env, cwd, timeout}`: runs
/// to completion; `{stdout, stderr, exitCode}`.
pub async fn run_process(State(st): State<AppState>, headers: HeaderMap, Path(id): Path<String>, b: Body) -> Response {
    let run = async {
        let opened = sandbox(&st, &headers, &id).await?;
        let raw = crate::e2b::read_body(&st, b, MAX_REQUEST).await?;
        let req: Value = serde_json::from_slice(&raw).map_err(|_| E2bError::invalid("the body is not JSON"))?;
        let cmd = req.get("cmd").and_then(Value::as_str).filter(|c| !c.is_empty()).ok_or_else(|| E2bError::invalid("cmd is required"))?;
        let args: Vec<String> = req.get("args").and_then(Value::as_array).map(|a| a.iter().filter_map(Value::as_str).map(str::to_string).collect()).unwrap_or_default();
        let cwd = req.get("cwd").and_then(Value::as_str).map(crate::e2b::paths::absolute).transpose()?;
        let max = u64::from(opened.key.max_timeout_seconds.max(1));
        let timeout = std::time::Duration::from_secs(req.get("timeout").and_then(Value::as_u64).unwrap_or(max).clamp(1, max));
        let start = Start { argv: std::iter::once(cmd.to_string()).chain(args).collect(), env: crate::e2b::string_entries(req.get("env")), cwd, ..Start::default() };
        let live = opened.live(&st).await?;
        tracing::info!(sandbox = %id, key = %opened.key.qualified_name(), program = %cmd, "sandbase process started");
        crate::e2b::activity::log(&st, &opened.sandbox, &crate::e2b::activity::by_key(&opened.key), "sandbox.process", &start.argv.join(" "));
        let mut events = live.start(start).await?;
        let (mut out, mut err, mut cut) = (Vec::new(), Vec::new(), false);
        let mut keep = |buf: &mut Vec<u8>, b: &Bytes| {
            let room = MAX_OUTPUT.saturating_sub(buf.len()).min(b.len());
            cut |= room < b.len();
            buf.extend_from_slice(&b[..room]);
        };
        let (mut pid, mut timed_out) = (0, false);
        let deadline = tokio::time::Instant::now() + timeout;
        let (code, signal) = loop {
            let ev = match tokio::time::timeout_at(deadline, events.next()).await {
                Ok(ev) => ev,
                Err(_) if !timed_out => {
                    timed_out = true;
                    live.signal(pid, SIGKILL).await?;
                    continue;
                }
                Err(_) => return Err(E2bError::new(StatusCode::GATEWAY_TIMEOUT, "the process did not end after it was killed")),
            };
            match ev {
                Some(Ok(LiveEvent::Started(p))) => pid = p,
                Some(Ok(LiveEvent::Stdout(b) | LiveEvent::Pty(b))) => keep(&mut out, &b),
                Some(Ok(LiveEvent::Stderr(b))) => keep(&mut err, &b),
                Some(Ok(LiveEvent::Ended(code, signal))) => break (code, signal),
                Some(Err(e)) => return Err(e.into()),
                None => return Err(crate::exec::live::LiveError::NodeLost.into()),
            }
        };
        let text = |b: Vec<u8>| String::from_utf8_lossy(&b).into_owned();
        Ok::<_, E2bError>(axum::Json(json!({
            "pid": pid,
            "stdout": text(out),
            "stderr": text(err),
            "exitCode": code,
            "signal": (signal != 0).then_some(signal),
            "timedOut": timed_out,
            "truncated": cut,
        })))
    };
    run.await.map_or_else(IntoResponse::into_response, IntoResponse::into_response)
}

/// `?path=`.
#[derive(Debug, Deserialize)]
pub struct PathQuery {
    path: Option<String>,
}

/// `GET /sandboxes/{id}/files?path=`: a file's bytes, or a directory's entries (`[{name, path, type, size}]`).
pub async fn download(State(st): State<AppState>, headers: HeaderMap, Path(id): Path<String>, Query(q): Query<PathQuery>) -> Response {
    let run = async {
        let opened = sandbox(&st, &headers, &id).await?;
        let path = crate::e2b::paths::absolute(q.path.as_deref().unwrap_or_default())?;
        let live = opened.live(&st).await?;
        // A directory lists; anything else is read.
        let script = "if [ -d \"$1\" ]; then cd -- \"$1\" && for f in * .[!.]* ..?*; do [ -e \"$f\" ] || [ -L \"$f\" ] || continue; if [ -d \"$f\" ]; then t=dir; else t=file; fi; printf '%s\\t%s\\t%s\\n' \"$t\" \"$(stat -c %s -- \"$f\")\" \"$f\"; done; else exit 3; fi";
        let listing = Start { argv: vec!["/bin/sh".into(), "-c".into(), script.into(), "sh".into(), path.clone()], ..Start::default() };
        let mut events = live.start(listing).await?;
        let (mut out, mut code) = (Vec::new(), -1);
        while let Some(e) = events.next().await {
            match e? {
                LiveEvent::Stdout(b) if out.len() < MAX_OUTPUT => out.extend_from_slice(&b),
                LiveEvent::Ended(c, _) => code = c,
                _ => {}
            }
        }
        if code == 0 {
            let shown = crate::e2b::paths::shown(&path);
            let entries: Vec<Value> = String::from_utf8_lossy(&out)
                .lines()
                .filter_map(|l| {
                    let mut f = l.splitn(3, '\t');
                    let (kind, size, name) = (f.next()?, f.next()?, f.next()?);
                    Some(json!({"name": name, "path": format!("{}/{name}", shown.trim_end_matches('/')), "type": kind, "size": size.parse::<u64>().unwrap_or(0)}))
                })
                .collect();
            return Ok(axum::Json(entries).into_response());
        }
        let body = crate::e2b::files::read_file(&live, &path).await?;
        Ok::<_, E2bError>(([(header::CONTENT_TYPE, "application/octet-stream")], body).into_response())
    };
    run.await.unwrap_or_else(IntoResponse::into_response)
}

/// `POST /sandboxes/{id}/files`: a multipart form of one `file` and its
/// target `path` (or `?path=`; without either, the file's name in the home).
pub async fn upload(State(st): State<AppState>, headers: HeaderMap, Path(id): Path<String>, Query(q): Query<PathQuery>, b: Body) -> Response {
    let run = async {
        let opened = sandbox(&st, &headers, &id).await?;
        let ct = headers.get(header::CONTENT_TYPE).and_then(|v| v.to_str().ok()).unwrap_or_default();
        let boundary = crate::multipart::boundary(ct).ok_or_else(|| E2bError::invalid("a multipart/form-data body is required (a `file` part and a `path` field)"))?;
        let raw = crate::e2b::read_body(&st, b, MAX_UPLOAD).await?;
        let parts = crate::multipart::parse(&raw, &boundary).map_err(|why| E2bError::invalid(format!("the multipart body: {why}")))?;
        let file = parts.iter().find(|p| p.filename.is_some()).ok_or_else(|| E2bError::invalid("no file part"))?;
        let field = parts.iter().find(|p| p.name == "path" && p.filename.is_none()).map(|p| String::from_utf8_lossy(&p.data).into_owned());
        let target = field.or(q.path).or_else(|| file.filename.clone()).unwrap_or_default();
        let path = crate::e2b::paths::absolute(&target)?;
        let live = opened.live(&st).await?;
        crate::e2b::files::write_file(&live, &path, futures_util::stream::iter([Ok(file.data.clone())])).await?;
        Ok::<_, E2bError>(axum::Json(json!({"path": crate::e2b::paths::shown(&path), "size": file.data.len()})))
    };
    run.await.map_or_else(IntoResponse::into_response, IntoResponse::into_response)
}
