//! The data plane's view of one sandbox: which sandbox a request names
//! (`E2b-Sandbox-Id`), whether its `X-Access-Token` opens it, and the live
//! sandbox that runs it (see `crate::exec::live`).

use std::collections::BTreeMap;
use std::sync::Arc;

use axum::extract::State;
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use warren_config::EffectiveKey;
use warren_core::Language;

use futures_util::StreamExt;

use super::token::Scope;
use super::E2bError;
use crate::exec::live::{Live, LiveError, LiveEvent, LiveEvents, Start};
use crate::records::E2bSandbox;
use crate::state::AppState;

/// A sandbox a data-plane request may use, with its key.
pub struct Opened {
    /// The owning key, as configured now.
    pub key: Arc<EffectiveKey>,
    /// The sandbox's record.
    pub sandbox: E2bSandbox,
}

fn header<'h>(headers: &'h HeaderMap, name: &str) -> Option<&'h str> {
    headers.get(name).and_then(|v| v.to_str().ok())
}

/// The sandbox `E2b-Sandbox-Id` names, when `X-Access-Token` opens it and
/// it is running. Unknown ids, wrong tokens and ended sandboxes are all
/// "not found" (502, as E2B's proxy answers), so nothing tells them apart.
pub async fn open(st: &AppState, headers: &HeaderMap) -> Result<Opened, E2bError> {
    open_with(st, headers, &[Scope::Envd]).await
}

/// Like [`open`], for what E2B reaches through its proxy (the code
/// interpreter): its traffic token (`E2B-Traffic-Access-Token`) or its envd token opens it.
pub async fn open_proxied(st: &AppState, headers: &HeaderMap) -> Result<Opened, E2bError> {
    open_with(st, headers, &[Scope::Envd, Scope::Traffic]).await
}

async fn open_with(st: &AppState, headers: &HeaderMap, scopes: &[Scope]) -> Result<Opened, E2bError> {
    let id = header(headers, "e2b-sandbox-id").ok_or_else(|| E2bError::invalid("the E2b-Sandbox-Id header is required (set E2B_SANDBOX_URL to this gateway)"))?;
    if !warren_core::ids::is_thread_id(id) {
        return Err(E2bError::gone("(malformed id)"));
    }
    let found = st.service.records.store().sandbox(id).await?;
    let Some(sandbox) = found else { return Err(E2bError::gone(id)) };
    let key = st.keys().named(&sandbox.namespace, &sandbox.key_name);
    let signing = st.files.signing_key.current();
    let opens = scopes.iter().any(|&scope| {
        let token = match scope {
            Scope::Envd => header(headers, "x-access-token"),
            Scope::Traffic => header(headers, "e2b-traffic-access-token"),
            Scope::Port(_) | Scope::Terminal => None,
        };
        super::token::verify_for(scope, &signing, &sandbox.namespace, &sandbox.key_name, id, token.unwrap_or_default())
    });
    let Some(key) = key.filter(|_| opens) else { return Err(E2bError::gone(id)) };
    if key.disabled {
        return Err(E2bError::new(StatusCode::FORBIDDEN, "the sandbox's API key is disabled"));
    }
    if sandbox.end_ms <= crate::records::now_ms() {
        super::lifecycle::expire(st, &key, &sandbox);
        return Err(E2bError::gone(id));
    }
    user_is_default(basic_user(headers).as_deref())?;
    if sandbox.state == "paused" {
        return Err(E2bError::new(StatusCode::BAD_GATEWAY, format!("The sandbox {id} is paused; Sandbox.connect() resumes it")));
    }
    Ok(Opened { key, sandbox })
}

/// The user envd's `Authorization: Basic base64("<user>:")` names.
fn basic_user(headers: &HeaderMap) -> Option<String> {
    use base64::Engine;
    let v = header(headers, "authorization")?.strip_prefix("Basic ")?;
    let raw = base64::engine::general_purpose::STANDARD.decode(v.trim()).ok()?;
    let text = String::from_utf8(raw).ok()?;
    Some(text.split(':').next().unwrap_or_default().to_string())
}

/// Commands and files act as the sandbox's one unprivileged user; asking
/// for another (`user="root"`) is refused rather than silently ignored.
pub fn user_is_default(user: Option<&str>) -> Result<(), E2bError> {
    match user {
        None | Some("" | "user" | "sandbox") => Ok(()),
        Some(other) => Err(E2bError::unsupported(&format!("user {other:?}: everything in a Warren sandbox runs as its one unprivileged user (\"user\")"))),
    }
}

/// envd's `GET /health`: 204 while the sandbox runs, 502 otherwise.
pub async fn health(State(st): State<AppState>, headers: HeaderMap) -> Response {
    match open(&st, &headers).await {
        Ok(_) => StatusCode::NO_CONTENT.into_response(),
        Err(e) => e.into_response(),
    }
}

/// A program Warren runs in the sandbox for a call (the filesystem
/// calls, `run_code`): its text goes to the interpreter on stdin.
pub struct Program {
    /// Program text.
    pub code: String,
    /// Interpreter.
    pub language: Language,
    /// The call's own variables (over the sandbox's).
    pub env: BTreeMap<String, String>,
    /// Seconds; it is killed past them.
    pub timeout: Option<u64>,
    /// Its tag (a process that outlives the call is found by it).
    pub tag: Option<String>,
    /// One of Warren's own helpers (a cell's hand-over, a file call, a
    /// watcher), which needs only the standard library: Python starts it
    /// isolated and without `site` (no user site-packages, no `PYTHON*`
    /// variables, no `.pth` files), half its start-up time.
    pub helper: bool,
}

/// What a finished program printed and how it ended.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct Finished {
    /// Its stdout (lossy UTF-8).
    pub stdout: String,
    /// Its stderr (lossy UTF-8).
    pub stderr: String,
    /// Exit code (128 + signal when killed).
    pub exit_code: i32,
    /// It ran past its timeout and was killed.
    pub timed_out: bool,
}

/// The interpreter's arguments that run the program text it reads on stdin
/// (for a Python `helper`, isolated and without `site`).
fn reads_stdin(language: Language, helper: bool) -> Vec<String> {
    const PY: &str = "import sys; __warren_src = sys.stdin.read(); sys.stdin = open('/dev/null'); exec(compile(__warren_src, '<string>', 'exec'))";
    let argv: &[&str] = match language {
        Language::Python if helper => &["python3", "-I", "-S", "-c", PY],
        Language::Python => &["python3", "-c", PY],
        Language::Node => &["node", "-e", "const s = require('fs').readFileSync(0, 'utf8'); require('vm').runInThisContext(s)"],
        Language::Bash => &["/bin/bash", "-c", "eval \"$(cat)\" </dev/null"],
    };
    argv.iter().map(|a| a.to_string()).collect()
}

impl From<LiveError> for E2bError {
    fn from(e: LiveError) -> E2bError {
        match e {
            LiveError::Gone | LiveError::NodeLost => E2bError::new(StatusCode::BAD_GATEWAY, "the sandbox is not running"),
            LiveError::NoProcess(pid) => E2bError::not_found(format!("process with pid {pid} not found")),
            LiveError::Invalid(m) => E2bError::invalid(m),
            LiveError::Refused(m) => E2bError::invalid(m).with_code("failed_precondition"),
            LiveError::Busy(m) => E2bError::new(StatusCode::TOO_MANY_REQUESTS, m).retry_after(1),
        }
    }
}

/// Makes `s` live (created, resumed, or a record of an earlier release
/// that names no node): on the home node of its thread, with its
/// environment, until its end. Returns the node's name, recorded.
pub async fn make_live(st: &AppState, key: &EffectiveKey, s: &E2bSandbox) -> Result<String, E2bError> {
    let env = sandbox_env(st, s)?;
    let left = (s.end_ms - crate::records::now_ms()).max(1000) as u64;
    let node = st.service.live_create(key, &s.id, env, std::time::Duration::from_millis(left)).await?;
    st.service.records.store().set_sandbox_node(&s.id, Some(&node)).await?;
    Ok(node)
}

/// The sandbox's own environment, opened: a rotated signing key leaves
/// it unopenable, and then nothing runs (never without its variables).
pub(super) fn sandbox_env(st: &AppState, s: &E2bSandbox) -> Result<BTreeMap<String, String>, E2bError> {
    let owner = super::sealed::Owner { namespace: &s.namespace, key: &s.key_name, id: &s.id };
    super::sealed::open(&st.files.signing_key.current(), owner, s.env.as_deref().unwrap_or_default())
        .map_err(|e| E2bError::new(StatusCode::BAD_REQUEST, e.to_string()).with_code("failed_precondition"))
}

impl Opened {
    /// The live sandbox running it.
    pub async fn live(&self, st: &AppState) -> Result<Live, E2bError> {
        let node = match &self.sandbox.node {
            Some(n) => n.clone(),
            None => make_live(st, &self.key, &self.sandbox).await?,
        };
        Ok(st.service.live(&self.key, &self.sandbox.id, &node)?)
    }

    /// Starts `p` in the sandbox; its events.
    pub async fn program(&self, st: &AppState, p: Program) -> Result<(Live, i32, LiveEvents), E2bError> {
        let live = self.live(st).await?;
        let start = Start { argv: reads_stdin(p.language, p.helper), env: p.env, stdin: true, tag: p.tag, ..Start::default() };
        let mut events = live.start(start).await?;
        let pid = match events.next().await {
            Some(Ok(LiveEvent::Started(pid))) => pid,
            Some(Err(e)) => return Err(e.into()),
            _ => return Err(LiveError::NodeLost.into()),
        };
        for piece in p.code.as_bytes().chunks(1 << 20) {
            live.write(pid, piece.to_vec()).await?;
        }
        live.close_stdin(pid).await?;
        Ok((live, pid, events))
    }

    /// Runs `p` to its end (killed past its timeout).
    pub async fn finish(&self, st: &AppState, p: Program) -> Result<Finished, E2bError> {
        let timeout = std::time::Duration::from_secs(p.timeout.unwrap_or(u64::from(self.key.max_timeout_seconds.max(1))));
        let (live, pid, mut events) = self.program(st, p).await?;
        let mut done = Finished::default();
        let (mut out, mut err) = (Vec::new(), Vec::new());
        let mut deadline = tokio::time::Instant::now() + timeout;
        loop {
            let ev = match tokio::time::timeout_at(deadline, events.next()).await {
                Ok(ev) => ev,
                Err(_) if !done.timed_out => {
                    done.timed_out = true;
                    live.signal(pid, crate::exec::live::SIGKILL).await?;
                    deadline = tokio::time::Instant::now() + std::time::Duration::from_secs(10);
                    continue;
                }
                Err(_) => return Err(LiveError::NodeLost.into()),
            };
            match ev {
                Some(Ok(LiveEvent::Stdout(b) | LiveEvent::Pty(b))) => out.extend_from_slice(&b),
                Some(Ok(LiveEvent::Stderr(b))) => err.extend_from_slice(&b),
                Some(Ok(LiveEvent::Ended(code, _))) => {
                    done.exit_code = code;
                    break;
                }
                Some(Ok(LiveEvent::Started(_))) => {}
                Some(Err(e)) => return Err(e.into()),
                None => return Err(LiveError::NodeLost.into()),
            }
        }
        done.stdout = String::from_utf8_lossy(&out).into_owned();
        done.stderr = String::from_utf8_lossy(&err).into_owned();
        Ok(done)
    }

    /// True when the key's Sandbox offers `language`.
    pub fn offers(&self, language: Language) -> bool {
        self.key.languages.contains(&language)
    }
}
