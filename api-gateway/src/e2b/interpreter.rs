//! The code interpreter's `POST /execute` (`run_code`) and contexts
//! (`/contexts`): a context is a Python interpreter living in the sandbox
//! (`kernel.py`, beside this file, a process tagged `warren-context-<id>`)
//! that keeps its variables between cells, as a Jupyter kernel does. A
//! `run_code` without a context uses the sandbox's default one, started at
//! its first use. Each cell is handed over by a short process of its own,
//! which prints what the cell prints and then the cell's report: the value
//! of a last expression and what `display()` and matplotlib showed as
//! results (`text`, `html`, `png`, `json`, …), or an uncaught exception as an
//! error with name, value and traceback. Output streams as NDJSON as it
//! comes. A caller that goes away (its timeout) interrupts the cell with
//! SIGINT (`KeyboardInterrupt`); the context and its variables stay.

use axum::body::{Body, Bytes};
use axum::extract::{Path, State};
use axum::http::{header, HeaderMap, Method, StatusCode};
use axum::response::{IntoResponse, Response};
use serde_json::{json, Value};

use futures_util::StreamExt;

use super::sandbox::{open_proxied, Opened, Program};
use super::E2bError;
use crate::exec::live::{Live, LiveEvent, LiveEvents};
use crate::state::AppState;

const KERNEL_PY: &str = include_str!("kernel.py");
/// The tag of a context's interpreter process.
const TAG: &str = "warren-context-";
/// The context `run_code` uses when it names none.
const DEFAULT: &str = "default";
/// Contexts one sandbox may hold.
const MAX_CONTEXTS: usize = 16;

/// A context id: 1–64 of `[a-z0-9-]`.
fn context_id(id: &str) -> Result<&str, E2bError> {
    let ok = !id.is_empty() && id.len() <= 64 && id.bytes().all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-');
    ok.then_some(id).ok_or_else(|| E2bError::not_found(format!("context {id:?} not found")))
}

/// The contexts running in the sandbox: (id, pid, cwd).
async fn running(live: &Live) -> Result<Vec<(String, i32, String)>, E2bError> {
    Ok(live
        .list()
        .await?
        .into_iter()
        .filter_map(|p| {
            let id = p.start.tag.as_deref()?.strip_prefix(TAG)?.to_string();
            Some((id, p.pid, super::paths::shown(p.start.cwd.as_deref().unwrap_or(super::paths::HOME))))
        })
        .collect())
}

/// Starts context `id`'s interpreter in `cwd`.
async fn start_context(st: &AppState, opened: &Opened, id: &str, cwd: &str) -> Result<(), E2bError> {
    if !opened.offers(warren_core::language::Language::Python) {
        return Err(E2bError::unsupported("code contexts run Python in the sandbox, and this key's Sandbox does not offer python"));
    }
    let program = Program {
        code: format!("{KERNEL_PY}\n__warren_kernel({}, {})\n", py_str(id), py_str(cwd)),
        language: warren_core::language::Language::Python,
        env: Default::default(),
        timeout: None,
        tag: Some(format!("{TAG}{id}")),
        // The context runs the caller's code: its site-packages are needed.
        helper: false,
    };
    // Its stream is let go: the interpreter runs on until removed or restarted.
    opened.program(st, program).await.map(drop)
}

fn context(id: &str, cwd: &str) -> Value {
    json!({"id": id, "language": "python", "cwd": cwd})
}

/// `GET|POST /contexts`.
pub async fn contexts_root(State(st): State<AppState>, headers: HeaderMap, method: Method, b: Body) -> Response {
    context_call(st, headers, method, None, b).await
}

/// `DELETE /contexts/{id}`, `POST /contexts/{id}/restart`.
pub async fn contexts(State(st): State<AppState>, headers: HeaderMap, method: Method, Path(id): Path<String>, b: Body) -> Response {
    context_call(st, headers, method, Some(id), b).await
}

async fn context_call(st: AppState, headers: HeaderMap, method: Method, id: Option<String>, b: Body) -> Response {
    let run = async {
        let opened = open_proxied(&st, &headers).await?;
        let live = opened.live(&st).await?;
        let found = running(&live).await?;
        match (method, id) {
            (Method::GET, None) => Ok(axum::Json(found.iter().map(|(id, _, cwd)| context(id, cwd)).collect::<Vec<_>>()).into_response()),
            (Method::POST, None) => {
                let raw = super::read_body(&st, b, 64 << 10).await?;
                let req: Value = if raw.is_empty() { json!({}) } else { serde_json::from_slice(&raw).map_err(|_| E2bError::invalid("the body is not JSON"))? };
                match req.get("language").and_then(Value::as_str) {
                    None | Some("python" | "python3") => {}
                    Some(other) => return Err(E2bError::unsupported(&format!("language {other:?}: Warren's contexts run python"))),
                }
                if found.len() >= MAX_CONTEXTS {
                    return Err(E2bError::new(StatusCode::TOO_MANY_REQUESTS, format!("the sandbox holds {MAX_CONTEXTS} contexts, its most; remove one first")));
                }
                let cwd = super::paths::absolute(req.get("cwd").and_then(Value::as_str).unwrap_or(super::paths::E2B_HOME))?;
                let id = warren_core::ids::random_id("", 16, &mut |b: &mut [u8]| rand::fill(b)).to_ascii_lowercase();
                start_context(&st, &opened, &id, &cwd).await?;
                Ok(axum::Json(context(&id, &super::paths::shown(&cwd))).into_response())
            }
            (method, Some(id)) => {
                let id = context_id(&id)?;
                let (_, pid, cwd) = found.iter().find(|(i, ..)| i == id).ok_or_else(|| E2bError::not_found(format!("context {id:?} not found")))?;
                live.kill(*pid).await?;
                if method == Method::POST {
                    // Its socket is taken over by the new interpreter.
                    start_context(&st, &opened, id, &super::paths::absolute(cwd)?).await?;
                }
                Ok(StatusCode::NO_CONTENT.into_response())
            }
            _ => Err(E2bError::not_found("no such contexts call")),
        }
    };
    run.await.unwrap_or_else(IntoResponse::into_response)
}

/// Interrupts the cell of a run whose caller went away (its timeout).
struct Interrupt {
    live: Option<(Live, i32)>,
}

impl Interrupt {
    /// The cell ended: nothing to interrupt.
    fn disarm(&mut self) {
        self.live = None;
    }
}

impl Drop for Interrupt {
    fn drop(&mut self) {
        let Some((live, pid)) = self.live.take() else { return };
        if let Ok(rt) = tokio::runtime::Handle::try_current() {
            rt.spawn(async move {
                let _ = live.signal(pid, crate::exec::live::SIGINT).await;
            });
        }
    }
}

/// `POST /execute` `{code, context_id, language, env_vars}`.
pub async fn execute(State(st): State<AppState>, headers: HeaderMap, b: Body) -> Response {
    let run = async {
        let opened = open_proxied(&st, &headers).await?;
        let raw = super::read_body(&st, b, 2 << 20).await?;
        let req: Value = serde_json::from_slice(&raw).map_err(|_| E2bError::invalid("the body is not JSON"))?;
        match req.get("language").and_then(Value::as_str) {
            None | Some("python" | "python3") => {}
            Some(other) => return Err(E2bError::unsupported(&format!("language {other:?}: Warren's run_code runs python (use commands.run for other programs)"))),
        }
        let code = req.get("code").and_then(Value::as_str).ok_or_else(|| E2bError::invalid("code is required"))?;
        let live = opened.live(&st).await?;
        let asked = req.get("context_id").and_then(Value::as_str);
        let id = context_id(asked.unwrap_or(DEFAULT))?;
        let kernel = match running(&live).await?.into_iter().find(|(i, ..)| i == id) {
            Some((_, pid, _)) => pid,
            None if asked.is_none() => {
                start_context(&st, &opened, id, super::paths::HOME).await?;
                running(&live).await?.into_iter().find(|(i, ..)| i == id).map(|(_, pid, _)| pid).ok_or_else(|| E2bError::new(StatusCode::SERVICE_UNAVAILABLE, "the default context did not start"))?
            }
            None => return Err(E2bError::not_found(format!("context {id:?} not found"))),
        };
        let env = super::string_entries(req.get("env_vars"));
        let mark = format!("\u{1e}warren-cell-{} ", warren_core::ids::random_id("", 16, &mut |b: &mut [u8]| rand::fill(b)));
        let program = Program {
            code: format!("{KERNEL_PY}\n__warren_cell({}, {}, {}, {})\n", py_str(id), py_str(code), serde_json::to_string(&env).unwrap_or_default(), py_str(&mark)),
            language: warren_core::language::Language::Python,
            env: Default::default(),
            timeout: None,
            tag: None,
            helper: true,
        };
        let (_, _, events) = opened.program(&st, program).await?;
        let interrupt = Interrupt { live: Some((live, kernel)) };
        Ok::<_, E2bError>(([(header::CONTENT_TYPE, "application/x-ndjson")], Body::from_stream(lines(events, mark, interrupt))).into_response())
    };
    run.await.unwrap_or_else(IntoResponse::into_response)
}

/// A Python string literal (JSON's escapes are Python's).
fn py_str(s: &str) -> String {
    serde_json::to_string(s).unwrap_or_default()
}

fn line(v: Value) -> Bytes {
    let mut b = serde_json::to_vec(&v).unwrap_or_default();
    b.push(b'\n');
    b.into()
}

fn now_micros() -> i64 {
    crate::records::now_ms() * 1000
}

/// Splits stdout into what to show now and what may be the start of the
/// report (held until more arrives); after the mark, everything is report.
#[derive(Default)]
struct Stdout {
    pending: Vec<u8>,
    report: Option<Vec<u8>>,
}

impl Stdout {
    fn push(&mut self, chunk: &[u8], mark: &[u8]) -> Vec<u8> {
        if let Some(r) = self.report.as_mut() {
            r.extend_from_slice(chunk);
            return Vec::new();
        }
        self.pending.extend_from_slice(chunk);
        if let Some(at) = memchr::memmem::find(&self.pending, mark) {
            let rest = self.pending.split_off(at);
            self.report = Some(rest[mark.len()..].to_vec());
            return std::mem::take(&mut self.pending);
        }
        // Keep the longest tail that could begin the mark.
        let keep = (1..mark.len().min(self.pending.len() + 1)).rev().find(|&n| self.pending.ends_with(&mark[..n])).unwrap_or(0);
        let shown = self.pending.len() - keep;
        let rest = self.pending.split_off(shown);
        std::mem::replace(&mut self.pending, rest)
    }
}

/// Whole lines, as a Jupyter kernel sends its streams: a partial line waits
/// for its end (or the end of the run), unless it grows past `MAX_PARTIAL`.
#[derive(Default)]
struct WholeLines(Vec<u8>);

const MAX_PARTIAL: usize = 64 << 10;

impl WholeLines {
    fn push(&mut self, chunk: &[u8]) -> Vec<u8> {
        self.0.extend_from_slice(chunk);
        let cut = if self.0.len() > MAX_PARTIAL { self.0.len() } else { self.0.iter().rposition(|&b| b == b'\n').map_or(0, |i| i + 1) };
        let rest = self.0.split_off(cut);
        std::mem::replace(&mut self.0, rest)
    }

    fn rest(&mut self) -> Vec<u8> {
        std::mem::take(&mut self.0)
    }
}

fn text_line(kind: &str, bytes: &[u8]) -> Option<Bytes> {
    (!bytes.is_empty()).then(|| line(json!({"type": kind, "text": String::from_utf8_lossy(bytes), "timestamp": now_micros()})))
}

/// The NDJSON lines of one run.
fn lines(mut events: LiveEvents, mark: String, mut interrupt: Interrupt) -> impl futures_util::Stream<Item = Result<Bytes, std::convert::Infallible>> {
    async_stream::stream! {
        let mut stdout = Stdout::default();
        let (mut out_lines, mut err_lines) = (WholeLines::default(), WholeLines::default());
        loop {
            match events.next().await {
                Some(Ok(LiveEvent::Stdout(c) | LiveEvent::Pty(c))) => {
                    let shown = out_lines.push(&stdout.push(&c, mark.as_bytes()));
                    if let Some(l) = text_line("stdout", &shown) { yield Ok(l); }
                }
                Some(Ok(LiveEvent::Stderr(c))) => {
                    let shown = err_lines.push(&c);
                    if let Some(l) = text_line("stderr", &shown) { yield Ok(l); }
                }
                Some(Ok(LiveEvent::Started(_))) => {}
                Some(Ok(LiveEvent::Ended(code, signal))) => {
                    let report = stdout.report.take();
                    // Without a report, what was held as its possible start is output.
                    let mut rest = out_lines.push(&std::mem::take(&mut stdout.pending));
                    rest.extend(out_lines.rest());
                    if let Some(l) = text_line("stdout", &rest) { yield Ok(l); }
                    let rest = err_lines.rest();
                    if let Some(l) = text_line("stderr", &rest) { yield Ok(l); }
                    interrupt.disarm();
                    for l in ending(report.as_deref(), code, signal) { yield Ok(l); }
                    return;
                }
                Some(Err(e)) => {
                    yield Ok(line(json!({"type": "error", "name": "WarrenNodeLost", "value": e.to_string(), "traceback": ""})));
                    yield Ok(line(json!({"type": "unexpected_end_of_execution"})));
                    return;
                }
                None => {
                    yield Ok(line(json!({"type": "unexpected_end_of_execution"})));
                    return;
                }
            }
        }
    }
}

/// The closing lines: the cell's result or error (or, when the program
/// never reported, what ended it), then the end of the execution.
fn ending(report: Option<&[u8]>, code: i32, signal: i32) -> Vec<Bytes> {
    let mut out = Vec::new();
    let parsed: Value = report.and_then(|b| serde_json::from_slice(b).ok()).unwrap_or(Value::Null);
    for r in parsed.get("results").and_then(Value::as_array).into_iter().flatten() {
        let mut result = r.clone();
        result["type"] = json!("result");
        out.push(line(result));
    }
    if let Some(e) = parsed.get("error") {
        out.push(line(json!({"type": "error", "name": e["name"], "value": e["value"], "traceback": e["traceback"]})));
    } else if parsed.is_null() {
        // The program ended before its report: killed, or it exited itself.
        let (name, value) = match (signal, code) {
            (0, 0) => (String::new(), String::new()),
            (0, code) => ("SystemExit".to_string(), code.to_string()),
            (s, _) => ("WarrenError".to_string(), format!("the cell's process was killed by signal {s}")),
        };
        if !name.is_empty() {
            out.push(line(json!({"type": "error", "name": name, "value": value, "traceback": ""})));
        }
    }
    let count = parsed.get("execution_count").and_then(Value::as_u64).unwrap_or(1);
    out.push(line(json!({"type": "number_of_executions", "execution_count": count})));
    out.push(line(json!({"type": "end_of_execution"})));
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_report_is_cut_from_stdout_wherever_chunks_split_it() {
        let mark = b"\x1eMARK ";
        let full = b"hello\nworld\x1eMARK {\"result\": \"1\"}\n";
        for split in 0..full.len() {
            let mut s = Stdout::default();
            let mut shown = s.push(&full[..split], mark);
            shown.extend(s.push(&full[split..], mark));
            assert_eq!(shown, b"hello\nworld", "split at {split}");
            assert_eq!(s.report.as_deref(), Some(&b"{\"result\": \"1\"}\n"[..]), "split at {split}");
        }
        let mut s = Stdout::default();
        assert_eq!(s.push(b"no mark here\x1e", mark), b"no mark here");
        assert_eq!(s.pending, b"\x1e");
    }

    #[test]
    fn streams_go_out_in_whole_lines() {
        let mut l = WholeLines::default();
        assert_eq!(l.push(b"hi"), b"");
        assert_eq!(l.push(b"\nthere"), b"hi\n");
        assert_eq!(l.rest(), b"there");
        assert_eq!(l.push(&vec![b'x'; MAX_PARTIAL + 1]).len(), MAX_PARTIAL + 1);
    }

    #[test]
    fn python_literals_hold_any_text() {
        assert_eq!(py_str("a\"b\\c\n\u{1e}"), "\"a\\\"b\\\\c\\n\\u001e\"");
    }
}
