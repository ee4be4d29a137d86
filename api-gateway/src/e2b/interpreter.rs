//! The code interpreter's `POST /execute` (`run_code`): the code runs as
//! Python in a fresh interpreter in the sandbox's thread, wrapped by
//! `cell.py` (beside this file) so that, as in a Jupyter cell, the value of
//! a last expression is a `text` result and an uncaught exception an
//! `error` with name, value and traceback. Output streams as NDJSON as it
//! comes. Contexts (interpreter state kept between calls) are refused.

use axum::body::{Body, Bytes};
use axum::extract::State;
use axum::http::{header, HeaderMap};
use axum::response::{IntoResponse, Response};
use serde_json::{json, Value};

use futures_util::StreamExt;

use super::sandbox::{open, Program};
use super::E2bError;
use crate::exec::live::{LiveEvent, LiveEvents};
use crate::state::AppState;

const CELL_PY: &str = include_str!("cell.py");

/// Contexts: refused with the reason.
pub async fn contexts() -> Response {
    E2bError::unsupported("code contexts keep interpreter state between calls, which Warren does not (each run_code is a fresh interpreter; files in the home persist)").into_response()
}

/// `POST /execute` `{code, context_id, language, env_vars}`.
pub async fn execute(State(st): State<AppState>, headers: HeaderMap, b: Body) -> Response {
    let run = async {
        let opened = open(&st, &headers).await?;
        let raw = super::read_body(&st, b, 2 << 20).await?;
        let req: Value = serde_json::from_slice(&raw).map_err(|_| E2bError::invalid("the body is not JSON"))?;
        if req.get("context_id").is_some_and(|c| !c.is_null()) {
            return Err(E2bError::unsupported("code contexts are not offered by Warren: each run_code is a fresh interpreter"));
        }
        match req.get("language").and_then(Value::as_str) {
            None | Some("python" | "python3") => {}
            Some(other) => return Err(E2bError::unsupported(&format!("language {other:?}: Warren's run_code runs python (use commands.run for other programs)"))),
        }
        let code = req.get("code").and_then(Value::as_str).ok_or_else(|| E2bError::invalid("code is required"))?;
        let env = super::string_entries(req.get("env_vars"));
        let mark = format!("\u{1e}warren-cell-{} ", warren_core::ids::random_id("", 16, &mut |b: &mut [u8]| rand::fill(b)));
        let program = Program {
            code: format!("{CELL_PY}\n__warren_cell({}, {})\n", py_str(code), py_str(&mark)),
            language: warren_core::language::Language::Python,
            env,
            timeout: None,
        };
        let (_, _, events) = opened.program(&st, program).await?;
        Ok::<_, E2bError>(([(header::CONTENT_TYPE, "application/x-ndjson")], Body::from_stream(lines(events, mark))).into_response())
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
fn lines(mut events: LiveEvents, mark: String) -> impl futures_util::Stream<Item = Result<Bytes, std::convert::Infallible>> {
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
    if let Some(text) = parsed.get("result").and_then(Value::as_str) {
        out.push(line(json!({"type": "result", "text": text, "is_main_result": true})));
    }
    if let Some(e) = parsed.get("error") {
        out.push(line(json!({"type": "error", "name": e["name"], "value": e["value"], "traceback": e["traceback"]})));
    } else if parsed.is_null() {
        // The program ended before its report: killed, out of memory, or it exited itself.
        let (name, value) = match (signal, code) {
            (0, 0) => (String::new(), String::new()),
            (0, code) => ("SystemExit".to_string(), code.to_string()),
            (s, _) => ("WarrenError".to_string(), format!("the code was killed by signal {s}")),
        };
        if !name.is_empty() {
            out.push(line(json!({"type": "error", "name": name, "value": value, "traceback": ""})));
        }
    }
    out.push(line(json!({"type": "number_of_executions", "execution_count": 1})));
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
