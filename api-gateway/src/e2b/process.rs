//! envd's process service (`/process.Process/*`). `Start` — what
//! `commands.run` calls — is one execution of the command in the sandbox's
//! thread, its output streamed as envd's events. Nothing runs between
//! calls, so there is no process to list, re-attach to, signal or feed
//! input to afterwards: those answer `unimplemented` naming the limit.

use std::time::Duration;

use axum::body::{Body, Bytes};
use axum::extract::{Path, State};
use axum::http::{header, HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use base64::Engine;
use serde_json::{json, Value};

use super::connect;
use super::sandbox::{open, Program};
use super::E2bError;
use crate::exec::{Delivery, Lost, Run, RunEvent};
use crate::result::{ExecuteResult, Outcome};
use crate::state::AppState;

/// The pid every command reports (each runs alone in its own sandbox).
const PID: u32 = 1;
/// Largest request message.
const MAX_REQUEST: usize = 2 << 20;

/// `POST /process.Process/{method}`.
pub async fn call(State(st): State<AppState>, headers: HeaderMap, Path(method): Path<String>, b: Body) -> Response {
    match method.as_str() {
        "Start" => start(st, headers, b).await.unwrap_or_else(|e| connect::stream_error(&e)),
        "List" => match open(&st, &headers).await {
            Ok(_) => connect::unary_ok(&json!({"processes": []})),
            Err(e) => connect::unary_error(&e),
        },
        "Connect" => connect::stream_error(&nothing_running("re-attaching to a command (commands.connect)")),
        "SendInput" | "StreamInput" | "CloseStdin" => connect::unary_error(&nothing_running("stdin for a running command")),
        "SendSignal" => connect::unary_error(&nothing_running("signalling a command (kill a command by its timeout instead)")),
        "Update" => connect::unary_error(&E2bError::unsupported("terminals (PTY) are not offered by Warren")),
        _ => connect::unary_error(&E2bError::not_found(format!("process.Process/{method} does not exist")).with_code("unimplemented")),
    }
}

fn nothing_running(what: &str) -> E2bError {
    E2bError::unsupported(&format!("{what}: in Warren a command ends with its call (background commands, stdin and signals to running commands are not offered)"))
}

/// The bash program of envd's `ProcessConfig`.
fn program_of(process: &Value) -> Result<String, E2bError> {
    let cmd = process.get("cmd").and_then(Value::as_str).unwrap_or_default();
    let args: Vec<&str> = process.get("args").and_then(Value::as_array).map(|a| a.iter().filter_map(Value::as_str).collect()).unwrap_or_default();
    if cmd.is_empty() {
        return Err(E2bError::invalid("process.cmd is required"));
    }
    let bash = matches!(cmd, "/bin/bash" | "bash" | "/usr/bin/bash" | "/bin/sh" | "sh");
    let body = match args.as_slice() {
        ["-l", "-c", script] | ["-c", script] if bash => script.to_string(),
        _ => format!("exec {}", std::iter::once(cmd).chain(args.iter().copied()).map(quote).collect::<Vec<_>>().join(" ")),
    };
    let cwd = match process.get("cwd").and_then(Value::as_str) {
        Some(c) if !c.is_empty() => format!("cd {} || exit 1\n", quote(&super::paths::in_sandbox(&super::paths::relative(c)?))),
        _ => String::new(),
    };
    Ok(format!("{cwd}{body}"))
}

/// Single-quoted for bash.
fn quote(s: &str) -> String {
    format!("'{}'", s.replace('\'', r"'\''"))
}

/// `Connect-Timeout-Ms` as whole seconds (rounded up); none or 0: the key's default.
fn timeout_of(headers: &HeaderMap) -> Option<u64> {
    let ms: u64 = headers.get("connect-timeout-ms")?.to_str().ok()?.parse().ok()?;
    (ms > 0).then(|| ms.div_ceil(1000))
}

/// `Keepalive-Ping-Interval` seconds, within 1..=60 (default 50).
fn keepalive_of(headers: &HeaderMap) -> Duration {
    let s = headers.get("keepalive-ping-interval").and_then(|v| v.to_str().ok()).and_then(|v| v.parse::<u64>().ok()).unwrap_or(50);
    Duration::from_secs(s.clamp(1, 60))
}

async fn start(st: AppState, headers: HeaderMap, b: Body) -> Result<Response, E2bError> {
    let opened = open(&st, &headers).await?;
    let raw = super::read_body(&st, b, MAX_REQUEST).await?;
    let req: Value = serde_json::from_slice(connect::single_message(&raw)?).map_err(|_| E2bError::invalid("the StartRequest is not JSON"))?;
    if req.get("pty").is_some_and(|p| !p.is_null()) {
        return Err(E2bError::unsupported("terminals (PTY) are not offered by Warren"));
    }
    if req.get("stdin").and_then(Value::as_bool) == Some(true) {
        return Err(nothing_running("stdin for a running command (pass stdin=False)"));
    }
    let process = req.get("process").cloned().unwrap_or(Value::Null);
    let program = Program { code: program_of(&process)?, language: warren_core::language::Language::Bash, env: super::string_entries(process.get("envs")), timeout: timeout_of(&headers) };
    let run = opened.start(&st, program, Delivery::Streamed).await?;
    let events = stream(run, keepalive_of(&headers));
    Ok(([(header::CONTENT_TYPE, connect::STREAM_CONTENT_TYPE)], Body::from_stream(events)).into_response())
}

fn event(e: Value) -> Bytes {
    connect::message(&json!({"event": e}))
}

/// envd's events for one run: `start`, `data`*, `end` (or an error), with
/// `keepalive` after every `every` of silence.
fn stream(mut run: Run, every: Duration) -> impl futures_util::Stream<Item = Result<Bytes, std::convert::Infallible>> {
    let b64 = base64::engine::general_purpose::STANDARD;
    async_stream::stream! {
        yield Ok(event(json!({"start": {"pid": PID}})));
        let (mut out, mut err) = (Vec::new(), Vec::new());
        loop {
            let ev = match tokio::time::timeout(every, run.next()).await {
                Err(_) => { yield Ok(event(json!({"keepalive": {}}))); continue; }
                Ok(ev) => ev,
            };
            match ev {
                Ok(RunEvent::Started) => {}
                Ok(RunEvent::Stdout(c)) => { yield Ok(event(json!({"data": {"stdout": b64.encode(&c)}}))); out.extend_from_slice(&c); }
                Ok(RunEvent::Stderr(c)) => { yield Ok(event(json!({"data": {"stderr": b64.encode(&c)}}))); err.extend_from_slice(&c); }
                Ok(RunEvent::Exited(x)) => {
                    let text = |raw: Vec<u8>| String::from_utf8_lossy(&raw).into_owned();
                    let (result, outcome) = run.end(&x, text(std::mem::take(&mut out)), text(std::mem::take(&mut err)));
                    yield Ok(ending(&result, outcome));
                    return;
                }
                Err(Lost) => {
                    let e = E2bError::from(run.lost());
                    yield Ok(connect::end(Some(&E2bError::new(StatusCode::BAD_GATEWAY, e.message))));
                    return;
                }
            }
        }
    }
}

/// The last frames of a finished command: its `end` event and the end of
/// the stream; a command killed at its timeout ends with `deadline_exceeded`
/// (what the SDKs raise as a timeout).
fn ending(r: &ExecuteResult, outcome: Outcome) -> Bytes {
    if r.timed_out {
        return connect::end(Some(&E2bError::new(StatusCode::GATEWAY_TIMEOUT, "the command ran past its timeout and was killed")));
    }
    let status = match r.signal {
        Some(s) => format!("signal: {}", signal_name(s)),
        None => format!("exit status {}", r.exit_code),
    };
    let mut end = json!({"exitCode": r.exit_code, "exited": r.signal.is_none(), "status": status});
    if let Some(code) = outcome.error_code() {
        end["error"] = json!(code);
    }
    [event(json!({"end": end})), connect::end(None)].concat().into()
}

fn signal_name(s: i32) -> String {
    match s {
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
    fn commands_become_bash_programs() {
        let p = json!({"cmd": "/bin/bash", "args": ["-l", "-c", "echo hi"], "cwd": "/home/user/src"});
        assert_eq!(program_of(&p).unwrap(), "cd '/home/sandbox/src' || exit 1\necho hi");
        let p = json!({"cmd": "ls", "args": ["-la", "it's"]});
        assert_eq!(program_of(&p).unwrap(), r"exec 'ls' '-la' 'it'\''s'");
        assert!(program_of(&json!({"cmd": "x", "args": [], "cwd": "/etc"})).is_err());
        assert!(program_of(&json!({})).is_err());
    }

    #[test]
    fn timeouts_and_keepalives_come_from_the_headers() {
        let mut h = HeaderMap::new();
        assert_eq!(timeout_of(&h), None);
        h.insert("connect-timeout-ms", "1500".parse().unwrap());
        assert_eq!(timeout_of(&h), Some(2));
        h.insert("connect-timeout-ms", "0".parse().unwrap());
        assert_eq!(timeout_of(&h), None);
        assert_eq!(keepalive_of(&h), Duration::from_secs(50));
        h.insert("keepalive-ping-interval", "0".parse().unwrap());
        assert_eq!(keepalive_of(&h), Duration::from_secs(1));
    }
}
