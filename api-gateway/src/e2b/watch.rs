//! envd's directory watching (`files.watch_dir`) in the live sandbox: a
//! process of the sandbox (`watch.py`, beside this file: inotify as the
//! sandbox's user) per watcher. `WatchDir` streams its events while the
//! call lasts (the process ends with the stream); `CreateWatcher` starts one
//! tagged `warren-watch-<id>` that keeps events until `GetWatcherEvents`
//! takes them, and `RemoveWatcher` ends it.

use axum::body::{Body, Bytes};
use axum::http::{header, StatusCode};
use axum::response::{IntoResponse, Response};
use futures_util::StreamExt;
use serde_json::{json, Value};

use super::connect;
use super::sandbox::{Opened, Program};
use super::E2bError;
use crate::exec::live::{Live, LiveEvent, LiveEvents, SIGKILL};
use crate::state::AppState;

const WATCH_PY: &str = include_str!("watch.py");
const TAG: &str = "warren-watch-";
/// Watchers one sandbox may keep.
const MAX_WATCHERS: usize = 32;
/// What precedes a take's answer on stdout.
const MARK: &str = "\u{1e}warren-e2b-watch ";

fn py_str(s: &str) -> String {
    serde_json::to_string(s).unwrap_or_default()
}

fn program(code: String, tag: Option<String>) -> Program {
    Program { code: format!("{WATCH_PY}\n{code}\n"), language: warren_core::language::Language::Python, env: Default::default(), timeout: Some(30), tag, helper: true }
}

fn python(opened: &Opened) -> Result<(), E2bError> {
    match opened.offers(warren_core::language::Language::Python) {
        true => Ok(()),
        false => Err(E2bError::unsupported("watching runs Python in the sandbox, and this key's Sandbox does not offer python")),
    }
}

/// The first line a watcher prints, or why it ended without one.
async fn first_line(events: &mut LiveEvents) -> Result<String, E2bError> {
    let (mut out, mut err) = (Vec::new(), Vec::new());
    while !out.contains(&b'\n') {
        match events.next().await {
            Some(Ok(LiveEvent::Stdout(b))) => out.extend_from_slice(&b),
            Some(Ok(LiveEvent::Stderr(b))) if err.len() < 8192 => err.extend_from_slice(&b),
            Some(Ok(LiveEvent::Ended(..))) | None => {
                let said = String::from_utf8_lossy(&err);
                let last = said.lines().last().unwrap_or("the watcher ended").to_string();
                let status = if last.contains("FileNotFoundError") || last.contains("NotADirectoryError") { StatusCode::NOT_FOUND } else { StatusCode::BAD_REQUEST };
                return Err(E2bError::new(status, last));
            }
            Some(Err(e)) => return Err(e.into()),
            Some(Ok(_)) => {}
        }
    }
    let text = String::from_utf8_lossy(&out);
    Ok(text.lines().next().unwrap_or_default().to_string())
}

/// The watchers kept in the sandbox: (id, pid).
async fn kept(live: &Live) -> Result<Vec<(String, i32)>, E2bError> {
    Ok(live.list().await?.into_iter().filter_map(|p| Some((p.start.tag.as_deref()?.strip_prefix(TAG)?.to_string(), p.pid))).collect())
}

/// `CreateWatcher` `{path, recursive}` → `{watcherId}`.
pub async fn create(st: &AppState, opened: &Opened, path: &str, recursive: bool) -> Result<Value, E2bError> {
    python(opened)?;
    let live = opened.live(st).await?;
    if kept(&live).await?.len() >= MAX_WATCHERS {
        return Err(E2bError::new(StatusCode::TOO_MANY_REQUESTS, format!("the sandbox keeps {MAX_WATCHERS} watchers, its most; remove one first")));
    }
    let id = warren_core::ids::random_id("", 16, &mut |b: &mut [u8]| rand::fill(b)).to_ascii_lowercase();
    let code = format!("__warren_watch_serve({}, {}, {})", py_str(&id), py_str(path), if recursive { "True" } else { "False" });
    let (_, _, mut events) = opened.program(st, program(code, Some(format!("{TAG}{id}")))).await?;
    first_line(&mut events).await?;
    Ok(json!({"watcherId": id}))
}

/// `GetWatcherEvents` `{watcherId}` → `{events}` gathered since the last call.
pub async fn take(st: &AppState, opened: &Opened, id: &str) -> Result<Value, E2bError> {
    python(opened)?;
    if id.is_empty() || id.len() > 64 || !id.bytes().all(|b| b.is_ascii_alphanumeric()) {
        return Err(E2bError::not_found(format!("watcher {id:?} not found")));
    }
    let r = opened.finish(st, program(format!("__warren_watch_take({}, {})", py_str(id), py_str(MARK)), None)).await?;
    let answer: Value = r.stdout.rsplit_once(MARK).and_then(|(_, a)| serde_json::from_str(a.trim_end()).ok()).unwrap_or(Value::Null);
    match answer.get("events") {
        Some(events) => Ok(json!({"events": events})),
        None => Err(E2bError::not_found(format!("watcher {id:?} not found"))),
    }
}

/// `RemoveWatcher` `{watcherId}`.
pub async fn remove(st: &AppState, opened: &Opened, id: &str) -> Result<Value, E2bError> {
    let live = opened.live(st).await?;
    let (_, pid) = kept(&live).await?.into_iter().find(|(i, _)| i == id).ok_or_else(|| E2bError::not_found(format!("watcher {id:?} not found")))?;
    live.kill(pid).await?;
    Ok(json!({}))
}

/// Ends a streaming watcher when its stream is let go.
struct Stop(Option<(Live, i32)>);

impl Drop for Stop {
    fn drop(&mut self) {
        let Some((live, pid)) = self.0.take() else { return };
        if let Ok(rt) = tokio::runtime::Handle::try_current() {
            rt.spawn(async move {
                let _ = live.signal(pid, SIGKILL).await;
            });
        }
    }
}

/// `WatchDir` `{path, recursive}`: envd's stream, `start` then a
/// `filesystem` event per change, while the caller listens.
pub async fn stream(st: &AppState, opened: &Opened, path: &str, recursive: bool) -> Result<Response, E2bError> {
    python(opened)?;
    let code = format!("__warren_watch_stream({}, {})", py_str(path), if recursive { "True" } else { "False" });
    let mut p = program(code, None);
    p.timeout = None;
    let (live, pid, mut events) = opened.program(st, p).await?;
    let stop = Stop(Some((live, pid)));
    first_line(&mut events).await?;
    let body = async_stream::stream! {
        let _stop = stop;
        yield Ok::<Bytes, std::convert::Infallible>(connect::message(&json!({"start": {}})));
        let mut pending = Vec::new();
        loop {
            let ev = match tokio::time::timeout(std::time::Duration::from_secs(50), events.next()).await {
                Err(_) => { yield Ok(connect::message(&json!({"keepalive": {}}))); continue; }
                Ok(ev) => ev,
            };
            match ev {
                Some(Ok(LiveEvent::Stdout(b))) => {
                    pending.extend_from_slice(&b);
                    while let Some(at) = pending.iter().position(|&c| c == b'\n') {
                        let line: Vec<u8> = pending.drain(..=at).collect();
                        if let Ok(e) = serde_json::from_slice::<Value>(&line) {
                            yield Ok(connect::message(&json!({"filesystem": e})));
                        }
                    }
                }
                Some(Ok(LiveEvent::Ended(..))) | None => { yield Ok(connect::end(None)); return; }
                Some(Err(e)) => { yield Ok(connect::end(Some(&E2bError::from(e)))); return; }
                Some(Ok(_)) => {}
            }
        }
    };
    Ok(([(header::CONTENT_TYPE, connect::STREAM_CONTENT_TYPE)], Body::from_stream(body)).into_response())
}

/// The Connect request of a watch call (`WatchDir` is a server stream).
pub fn request(raw: &[u8], streamed: bool) -> Result<Value, E2bError> {
    let msg = if streamed { connect::single_message(raw)? } else { raw };
    serde_json::from_slice(msg).map_err(|_| E2bError::invalid("the request is not JSON"))
}
