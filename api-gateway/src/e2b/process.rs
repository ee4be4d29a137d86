//! envd's process service (`/process.Process/*`) over the sandbox's live
//! sandbox: `Start` (what `commands.run` and `pty.create` call) starts a
//! process and streams it; `Connect` re-attaches (with what it printed,
//! its last MiB); `List`, `SendInput`, `CloseStdin`, `SendSignal` and
//! `Update` (a terminal's size) act on running processes by pid or tag.
//! A stream's timeout (`Connect-Timeout-Ms`) ends the stream, not the
//! process, as in E2B: background commands and servers run on until they
//! exit or the sandbox ends.

use std::time::Duration;

use axum::body::{Body, Bytes};
use axum::extract::{Path, State};
use axum::http::{header, HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use base64::Engine;
use futures_util::StreamExt;
use serde_json::{json, Value};

use super::connect;
use super::sandbox::open;
use super::E2bError;
use crate::exec::live::{Live, LiveError, LiveEvent, LiveEvents, Start};
use crate::state::AppState;

/// Largest request message.
const MAX_REQUEST: usize = 2 << 20;

/// `POST /process.Process/{method}`.
pub async fn call(State(st): State<AppState>, headers: HeaderMap, Path(method): Path<String>, b: Body) -> Response {
    match method.as_str() {
        "Start" | "Connect" => streamed(&st, &headers, &method, b).await.unwrap_or_else(|e| connect::stream_error(&e)),
        "List" | "SendInput" | "CloseStdin" | "SendSignal" | "Update" => match unary(&st, &headers, &method, b).await {
            Ok(v) => connect::unary_ok(&v),
            Err(e) => connect::unary_error(&e),
        },
        "StreamInput" => connect::unary_error(&E2bError::unsupported("process.Process/StreamInput: send input with SendInput (what the SDKs' send_stdin calls)")),
        _ => connect::unary_error(&E2bError::not_found(format!("process.Process/{method} does not exist")).with_code("unimplemented")),
    }
}

/// A caller's W3C trace context reaches the process as `TRACEPARENT` and
/// `TRACESTATE` (over what the command's own variables said), so code using
/// an OpenTelemetry SDK continues the caller's trace.
fn traced(start: &mut Start, headers: &HeaderMap) {
    if let Some(t) = crate::traced::from_headers(headers) {
        start.env.remove("TRACESTATE");
        start.env.insert("TRACEPARENT".into(), t.parent.header());
        if let Some(state) = t.state {
            start.env.insert("TRACESTATE".into(), state);
        }
    }
}

/// The process `cmd args` in `cwd` (E2B spells the home `/home/user`).
fn start_of(req: &Value) -> Result<Start, E2bError> {
    let process = req.get("process").cloned().unwrap_or(Value::Null);
    let cmd = process.get("cmd").and_then(Value::as_str).unwrap_or_default();
    if cmd.is_empty() {
        return Err(E2bError::invalid("process.cmd is required"));
    }
    let args = process.get("args").and_then(Value::as_array).map(|a| a.iter().filter_map(Value::as_str).map(str::to_string).collect()).unwrap_or_default();
    let cwd = match process.get("cwd").and_then(Value::as_str) {
        Some(c) if !c.is_empty() => Some(super::paths::absolute(c)?),
        _ => None,
    };
    let size = req.get("pty").and_then(|p| p.get("size"));
    let pty = size.map(|s| {
        let n = |f: &str| s.get(f).and_then(Value::as_u64).map_or(0, |v| v.min(u64::from(u32::MAX)) as u32);
        (n("rows"), n("cols"))
    });
    Ok(Start {
        argv: std::iter::once(cmd.to_string()).chain::<Vec<String>>(args).collect(),
        env: super::string_entries(process.get("envs")),
        cwd,
        stdin: req.get("stdin").and_then(Value::as_bool).unwrap_or(false) && pty.is_none(),
        pty,
        tag: req.get("tag").and_then(Value::as_str).filter(|t| !t.is_empty()).map(str::to_string),
    })
}

/// `Connect-Timeout-Ms`; none or 0: no limit.
fn timeout_of(headers: &HeaderMap) -> Option<Duration> {
    let ms: u64 = headers.get("connect-timeout-ms")?.to_str().ok()?.parse().ok()?;
    (ms > 0).then(|| Duration::from_millis(ms))
}

/// `Keepalive-Ping-Interval` seconds, within 1..=60 (default 50).
fn keepalive_of(headers: &HeaderMap) -> Duration {
    let s = headers.get("keepalive-ping-interval").and_then(|v| v.to_str().ok()).and_then(|v| v.parse::<u64>().ok()).unwrap_or(50);
    Duration::from_secs(s.clamp(1, 60))
}

async fn read(st: &AppState, b: Body, streamed: bool) -> Result<Value, E2bError> {
    let raw = super::read_body(st, b, MAX_REQUEST).await?;
    let msg = if streamed { connect::single_message(&raw)? } else { &raw[..] };
    serde_json::from_slice(msg).map_err(|_| E2bError::invalid("the request is not JSON"))
}

async fn streamed(st: &AppState, headers: &HeaderMap, method: &str, b: Body) -> Result<Response, E2bError> {
    let opened = open(st, headers).await?;
    let req = read(st, b, true).await?;
    let live = opened.live(st).await?;
    let events = if method == "Start" {
        super::sandbox::user_is_default(req.get("process").and_then(|p| p.get("user")).and_then(Value::as_str))?;
        let mut start = start_of(&req)?;
        traced(&mut start, headers);
        tracing::info!(sandbox = %opened.sandbox.id, key = %opened.key.qualified_name(), program = %start.argv[0], pty = start.pty.is_some(), "e2b process started");
        let what = if start.pty.is_some() { "sandbox.terminal" } else { "sandbox.process" };
        super::activity::log(st, &opened.sandbox, &super::activity::by_key(&opened.key), what, &start.argv.join(" "));
        live.start(start).await?
    } else {
        let pid = selected(&live, &req).await?;
        live.connect(pid).await?
    };
    let body = Body::from_stream(stream(events, keepalive_of(headers), timeout_of(headers)));
    Ok(([(header::CONTENT_TYPE, connect::STREAM_CONTENT_TYPE)], body).into_response())
}

/// The pid a request's `process` selector names (`{pid}` or `{tag}`).
async fn selected(live: &Live, req: &Value) -> Result<i32, E2bError> {
    let sel = req.get("process").ok_or_else(|| E2bError::invalid("process (a pid or a tag) is required"))?;
    if let Some(pid) = sel.get("pid").and_then(Value::as_i64) {
        return i32::try_from(pid).map_err(|_| E2bError::invalid("process.pid"));
    }
    let tag = sel.get("tag").and_then(Value::as_str).ok_or_else(|| E2bError::invalid("process.pid or process.tag is required"))?;
    let listed = live.list().await?;
    let found = listed.into_iter().find(|p| p.start.tag.as_deref() == Some(tag)).ok_or_else(|| E2bError::not_found(format!("process with tag {tag} not found")))?;
    Ok(found.pid)
}

async fn unary(st: &AppState, headers: &HeaderMap, method: &str, b: Body) -> Result<Value, E2bError> {
    let opened = open(st, headers).await?;
    let req = read(st, b, false).await?;
    let live = opened.live(st).await?;
    if method == "List" {
        let processes: Vec<Value> = live.list().await?.into_iter().map(|p| listed(&p)).collect();
        return Ok(json!({"processes": processes}));
    }
    let pid = selected(&live, &req).await?;
    match method {
        "SendInput" => {
            let input = req.get("input").ok_or_else(|| E2bError::invalid("input is required"))?;
            let data = input.get("stdin").or_else(|| input.get("pty")).and_then(Value::as_str).unwrap_or_default();
            let bytes = base64::engine::general_purpose::STANDARD.decode(data).map_err(|_| E2bError::invalid("input: base64"))?;
            live.write(pid, bytes).await?;
        }
        "CloseStdin" => live.close_stdin(pid).await?,
        // A kill answers once the process is gone (a listing right after no longer shows it).
        "SendSignal" => match signal_of(req.get("signal"))? {
            crate::exec::live::SIGKILL => live.kill(pid).await?,
            signal => live.signal(pid, signal).await?,
        },
        "Update" => {
            let size = req.get("pty").and_then(|p| p.get("size")).ok_or_else(|| E2bError::invalid("pty.size is required"))?;
            let n = |f: &str| size.get(f).and_then(Value::as_u64).map_or(0, |v| v.min(u64::from(u32::MAX)) as u32);
            live.resize(pid, n("rows"), n("cols")).await?;
        }
        _ => return Err(E2bError::not_found(format!("process.Process/{method} does not exist")).with_code("unimplemented")),
    }
    Ok(json!({}))
}

/// envd's `Signal`: `SIGNAL_SIGKILL`/`SIGNAL_SIGTERM` (or their numbers).
fn signal_of(v: Option<&Value>) -> Result<i32, E2bError> {
    match v {
        Some(Value::String(s)) => match s.as_str() {
            "SIGNAL_SIGKILL" => Ok(crate::exec::live::SIGKILL),
            "SIGNAL_SIGTERM" => Ok(crate::exec::live::SIGTERM),
            "SIGNAL_SIGINT" => Ok(crate::exec::live::SIGINT),
            other => Err(E2bError::invalid(format!("signal {other:?}: SIGNAL_SIGKILL, SIGNAL_SIGTERM or SIGNAL_SIGINT"))),
        },
        Some(Value::Number(n)) => n.as_i64().and_then(|n| i32::try_from(n).ok()).ok_or_else(|| E2bError::invalid("signal")),
        _ => Err(E2bError::invalid("signal is required")),
    }
}

/// envd's `ProcessInfo`.
fn listed(p: &crate::exec::live::Listed) -> Value {
    let (cmd, args) = p.start.argv.split_first().map_or(("", &[][..]), |(c, a)| (c.as_str(), a));
    let mut config = json!({"cmd": cmd, "args": args, "envs": p.start.env});
    if let Some(cwd) = &p.start.cwd {
        config["cwd"] = json!(super::paths::shown(cwd));
    }
    let mut v = json!({"config": config, "pid": p.pid});
    if let Some(tag) = &p.start.tag {
        v["tag"] = json!(tag);
    }
    v
}

fn event(e: Value) -> Bytes {
    connect::message(&json!({"event": e}))
}

/// envd's events for one process: `start`, `data`*, `end` (or an error),
/// with `keepalive` after every `every` of silence; past `timeout` the
/// stream ends with `deadline_exceeded` (the process runs on).
fn stream(mut events: LiveEvents, every: Duration, timeout: Option<Duration>) -> impl futures_util::Stream<Item = Result<Bytes, std::convert::Infallible>> {
    let b64 = base64::engine::general_purpose::STANDARD;
    let deadline = timeout.map(|t| tokio::time::Instant::now() + t);
    async_stream::stream! {
        loop {
            let next = tokio::time::timeout(every, events.next());
            let ev = match deadline {
                Some(d) => match tokio::time::timeout_at(d, next).await {
                    Ok(ev) => ev,
                    Err(_) => {
                        yield Ok(connect::end(Some(&E2bError::new(StatusCode::GATEWAY_TIMEOUT, "the command's stream reached its timeout (the command goes on; commands.connect re-attaches)"))));
                        return;
                    }
                },
                None => next.await,
            };
            let ev = match ev {
                Err(_) => { yield Ok(event(json!({"keepalive": {}}))); continue; }
                Ok(ev) => ev,
            };
            match ev {
                Some(Ok(LiveEvent::Started(pid))) => yield Ok(event(json!({"start": {"pid": pid}}))),
                Some(Ok(LiveEvent::Stdout(c))) => yield Ok(event(json!({"data": {"stdout": b64.encode(&c)}}))),
                Some(Ok(LiveEvent::Stderr(c))) => yield Ok(event(json!({"data": {"stderr": b64.encode(&c)}}))),
                Some(Ok(LiveEvent::Pty(c))) => yield Ok(event(json!({"data": {"pty": b64.encode(&c)}}))),
                Some(Ok(LiveEvent::Ended(code, signal))) => {
                    yield Ok(ending(code, signal));
                    return;
                }
                Some(Err(e)) => {
                    yield Ok(connect::end(Some(&E2bError::from(e))));
                    return;
                }
                None => {
                    yield Ok(connect::end(Some(&E2bError::from(LiveError::NodeLost))));
                    return;
                }
            }
        }
    }
}

/// The last frames of an ended process: its `end` event and the end of the stream.
fn ending(code: i32, signal: i32) -> Bytes {
    let status = match signal {
        0 => format!("exit status {code}"),
        s => format!("signal: {}", signal_name(s)),
    };
    let end = json!({"exitCode": if signal == 0 { code } else { -1 }, "exited": signal == 0, "status": status});
    [event(json!({"end": end})), connect::end(None)].concat().into()
}

fn signal_name(s: i32) -> String {
    match s {
        2 => "interrupt".into(),
        9 => "killed".into(),
        15 => "terminated".into(),
        31 => "bad system call".into(),
        n => format!("signal {n}"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn starts_are_read_from_envd_requests() {
        let req = json!({"process": {"cmd": "/bin/bash", "args": ["-l", "-c", "echo hi"], "envs": {"A": "1"}, "cwd": "/home/user/src"}, "tag": "t", "stdin": true});
        let s = start_of(&req).unwrap();
        assert_eq!(s.argv, vec!["/bin/bash", "-l", "-c", "echo hi"]);
        assert_eq!((s.cwd.as_deref(), s.tag.as_deref(), s.stdin, s.pty), (Some("/home/sandbox/src"), Some("t"), true, None));
        assert_eq!(s.env.get("A").map(String::as_str), Some("1"));
        let pty = start_of(&json!({"process": {"cmd": "/bin/bash", "args": ["-i", "-l"]}, "pty": {"size": {"rows": 24, "cols": 80}}, "stdin": true})).unwrap();
        assert_eq!((pty.pty, pty.stdin), (Some((24, 80)), false));
        assert!(start_of(&json!({})).is_err());
        assert_eq!(start_of(&json!({"process": {"cmd": "ls", "cwd": "/tmp"}})).unwrap().cwd.as_deref(), Some("/tmp"));
    }

    #[test]
    fn signals_and_timeouts() {
        assert_eq!(signal_of(Some(&json!("SIGNAL_SIGKILL"))).unwrap(), 9);
        assert_eq!(signal_of(Some(&json!(15))).unwrap(), 15);
        assert!(signal_of(Some(&json!("SIGNAL_SIGSEGV"))).is_err() && signal_of(None).is_err());
        let mut h = HeaderMap::new();
        assert_eq!(timeout_of(&h), None);
        h.insert("connect-timeout-ms", "1500".parse().unwrap());
        assert_eq!(timeout_of(&h), Some(Duration::from_millis(1500)));
        h.insert("keepalive-ping-interval", "0".parse().unwrap());
        assert_eq!(keepalive_of(&h), Duration::from_secs(1));
    }

    #[test]
    fn an_end_says_how_it_ended() {
        let text = String::from_utf8_lossy(&ending(128 + 9, 9)).into_owned();
        assert!(text.contains("\"exited\":false") && text.contains("signal: killed"), "{text}");
        let text = String::from_utf8_lossy(&ending(3, 0)).into_owned();
        assert!(text.contains("\"exitCode\":3") && text.contains("exit status 3"), "{text}");
    }
}
