//! The data plane's view of one sandbox: which sandbox a request names
//! (`E2b-Sandbox-Id`), whether its `X-Access-Token` opens it, and running
//! one execution in its thread.

use std::collections::BTreeMap;
use std::sync::Arc;

use axum::extract::State;
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use warren_config::EffectiveKey;
use warren_core::Language;

use super::E2bError;
use crate::exec::{Delivery, ExecuteRequest, Run};
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
    let id = header(headers, "e2b-sandbox-id").ok_or_else(|| E2bError::invalid("the E2b-Sandbox-Id header is required (set E2B_SANDBOX_URL to this gateway)"))?;
    if !warren_core::ids::is_thread_id(id) {
        return Err(E2bError::gone("(malformed id)"));
    }
    let token = header(headers, "x-access-token").unwrap_or_default();
    let found = st.service.records.store().sandbox(id).await?;
    let Some(sandbox) = found else { return Err(E2bError::gone(id)) };
    let key = st.keys().named(&sandbox.namespace, &sandbox.key_name);
    let signing = st.files.signing_key.current();
    let opens = super::token::verify(&signing, &sandbox.namespace, &sandbox.key_name, id, token);
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

/// One execution to run in the sandbox's thread.
pub struct Program {
    /// Program text.
    pub code: String,
    /// Interpreter.
    pub language: Language,
    /// The call's own variables (over the sandbox's).
    pub env: BTreeMap<String, String>,
    /// Seconds; capped at the key's longest.
    pub timeout: Option<u64>,
}

impl Opened {
    /// Starts `p` in the sandbox's thread; an error means nothing ran.
    pub async fn start(&self, st: &AppState, p: Program, delivery: Delivery) -> Result<Run, E2bError> {
        let mut env = self.env(st)?;
        env.extend(p.env);
        let max = u64::from(self.key.max_timeout_seconds.max(1));
        let timeout = p.timeout.map(|t| t.clamp(1, max));
        let mut req = ExecuteRequest::new(p.code, p.language);
        req.thread_id = Some(self.sandbox.id.clone());
        // A command after one the client cut off waits for its end.
        req.wait_for_thread = true;
        req.env_vars = env.into_iter().collect();
        req.timeout = timeout.map(|t| u32::try_from(t).unwrap_or(u32::MAX));
        req.metadata.insert("e2b_sandbox".into(), self.sandbox.id.clone());
        let admitted = st.service.admit(&self.key, req, delivery).await?;
        Ok(st.service.start(admitted).await?)
    }

    /// The sandbox's own environment, opened: a rotated signing key leaves
    /// it unopenable, and then nothing runs (never without its variables).
    fn env(&self, st: &AppState) -> Result<BTreeMap<String, String>, E2bError> {
        let s = &self.sandbox;
        let owner = super::sealed::Owner { namespace: &s.namespace, key: &s.key_name, id: &s.id };
        super::sealed::open(&st.files.signing_key.current(), owner, s.env.as_deref().unwrap_or_default())
            .map_err(|e| E2bError::new(StatusCode::BAD_REQUEST, e.to_string()).with_code("failed_precondition"))
    }

    /// True when the key's Sandbox offers `language`.
    pub fn offers(&self, language: Language) -> bool {
        self.key.languages.contains(&language)
    }
}
