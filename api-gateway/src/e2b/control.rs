//! The E2B control plane (`E2B_API_URL`, `X-API-KEY`): a sandbox is a
//! record of the caller's key and a live sandbox on a node (see
//! `crate::exec::live`) whose home is the thread of the same id. Creating
//! one makes it live; pausing ends the live sandbox with its home saved
//! (memory is not kept), resuming makes a new one from that home; its
//! timeout ends it (paused with `autoPause`, else deleted with its thread).

use std::collections::BTreeMap;
use std::sync::Arc;

use axum::body::Body;
use axum::extract::{Path, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use serde_json::{json, Value};
use warren_config::EffectiveKey;

use super::E2bError;
use crate::records::{now_ms, rfc3339, E2bSandbox};
use crate::state::AppState;

/// The E2B SDKs' default templates (and Sandbase's): all name the key's own Sandbox.
const DEFAULT_TEMPLATES: &[&str] = &["base", "code-interpreter-v1", "code_interpreter"];
/// A sandbox's timeout when `create` names none (E2B's default), seconds.
pub(super) const DEFAULT_TIMEOUT: i64 = 300;
/// The longest timeout, seconds (a day).
const MAX_TIMEOUT: i64 = 86_400;
/// Live sandboxes of a key whose ApiKey sets no `maxThreads`.
const DEFAULT_MAX_SANDBOXES: u64 = 1000;
/// The caller's key: E2B's `X-API-KEY` (its alias or the key), or the
/// key as `Authorization: Bearer` (what Sandbase's clients send).
pub(crate) fn key(st: &AppState, headers: &HeaderMap) -> Result<Arc<EffectiveKey>, E2bError> {
    match headers.contains_key("x-api-key") {
        true => Ok(st.keys().authenticate_e2b(headers)?),
        false => Ok(st.keys().authenticate(headers)?),
    }
}

/// A small JSON body (64 KiB at most, bounded in time); empty is `{}`.
pub(super) async fn body(st: &AppState, b: Body) -> Result<Value, E2bError> {
    const LIMIT: usize = 64 << 10;
    let bytes = super::read_body(st, b, LIMIT).await?;
    if bytes.iter().all(u8::is_ascii_whitespace) {
        return Ok(json!({}));
    }
    let v: Value = serde_json::from_slice(&bytes).map_err(|_| E2bError::invalid("the body is not JSON"))?;
    if !v.is_object() {
        return Err(E2bError::invalid("the body must be a JSON object"));
    }
    Ok(v)
}

/// `timeout` in seconds from a body, within 0..=a day.
fn timeout_of(v: &Value, default: i64) -> Result<i64, E2bError> {
    match v.get("timeout") {
        None | Some(Value::Null) => Ok(default),
        Some(t) => t.as_i64().filter(|t| (0..=MAX_TIMEOUT).contains(t)).ok_or_else(|| E2bError::invalid(format!("timeout: whole seconds from 0 to {MAX_TIMEOUT}"))),
    }
}

/// A timeout `key` may give a sandbox (its `maxLiveSeconds`); a negative one (none asked) passes.
fn within_key(key: &EffectiveKey, t: i64) -> Result<i64, E2bError> {
    let most = i64::from(key.live_seconds());
    match t > most {
        true => Err(E2bError::invalid(format!("timeout: at most {most} seconds for this API key (its maxLiveSeconds)"))),
        false => Ok(t),
    }
}

fn too_many_running(most: u64) -> E2bError {
    E2bError::new(StatusCode::TOO_MANY_REQUESTS, format!("this API key has {most} running sandboxes, its most (maxLiveSandboxes); pause or kill one first"))
}

fn strings(v: &Value, field: &str) -> Result<BTreeMap<String, String>, E2bError> {
    match v.get(field) {
        None | Some(Value::Null) => Ok(BTreeMap::new()),
        Some(Value::Object(m)) => m
            .iter()
            .map(|(k, v)| v.as_str().map(|s| (k.clone(), s.to_string())).ok_or_else(|| E2bError::invalid(format!("{field}.{k}: a string"))))
            .collect(),
        Some(_) => Err(E2bError::invalid(format!("{field}: an object of strings"))),
    }
}

/// Refuses what `create` asks that Warren cannot give: a network other than
/// the Sandbox's (a key's policy is only narrowed by its manifests; of
/// `network`, only `allowPublicTraffic` is taken), MCP servers, volume
/// mounts and IAM inside the sandbox.
fn refuse_unsupported(v: &Value, key: &EffectiveKey) -> Result<(), E2bError> {
    let present = |f: &str| v.get(f).is_some_and(|x| !x.is_null() && x != &json!({}) && x != &json!([]));
    for (field, what) in [("mcp", "MCP servers inside a sandbox"), ("volumeMounts", "volume mounts chosen at create (declare storage on the Sandbox)"), ("iam", "IAM workload tokens")] {
        if present(field) {
            return Err(E2bError::unsupported(&format!("{field}: {what} are not offered by Warren")));
        }
    }
    if let Some(n) = v.get("network").filter(|_| present("network")) {
        let fields = n.as_object().ok_or_else(|| E2bError::invalid("network: an object"))?;
        let chosen = |(k, x): (&String, &Value)| k != "allowPublicTraffic" && !x.is_null() && x != &json!([]) && x != &json!({});
        if fields.iter().any(chosen) {
            return Err(E2bError::unsupported("network: the network policy is the Sandbox's (spec.network, spec.egress), not chosen per sandbox; only allowPublicTraffic is taken"));
        }
    }
    // Asking for no internet where the Sandbox allows it must not be ignored;
    // `true` is E2B's default (older SDKs always send it): the Sandbox's
    // policy stands, Blocked or not.
    let blocked = key.network == warren_core::network::Network::Blocked;
    match v.get("allow_internet_access").and_then(Value::as_bool) {
        Some(false) if !blocked => Err(E2bError::invalid("allow_internet_access=false: this key's Sandbox has network Unrestricted; use a key whose Sandbox is Blocked")),
        _ => Ok(()),
    }
}

/// A new sandbox id: 20 lowercase letters and digits, like E2B's.
pub(super) fn new_id() -> String {
    const ALPHABET: &[u8] = b"abcdefghijklmnopqrstuvwxyz0123456789";
    let mut out = String::with_capacity(20);
    while out.len() < 20 {
        let mut b = [0u8; 32];
        rand::fill(&mut b);
        // 252 = 7 × 36: rejection keeps every character uniform.
        out.extend(b.iter().filter(|&&x| x < 252).map(|&x| ALPHABET[usize::from(x % 36)] as char).take(20 - out.len()));
    }
    out
}

/// `Sandbox` (create, connect, resume).
pub(super) fn created(st: &AppState, s: &E2bSandbox) -> Value {
    let signing = st.files.signing_key.current();
    let token = super::token::sign(&signing, &s.namespace, &s.key_name, &s.id);
    let traffic = super::token::sign_for(super::token::Scope::Traffic, &signing, &s.namespace, &s.key_name, &s.id);
    let mut v = json!({
        "templateID": s.template,
        "sandboxID": s.id,
        "clientID": "warren",
        "envdVersion": super::ENVD_VERSION,
        "envdAccessToken": token,
        "trafficAccessToken": traffic,
        "alias": s.template,
    });
    // A browser terminal's WebSocket (Banata's `terminalUrl`), a path on this gateway.
    v["terminalUrl"] = json!(super::token::terminal_url(&signing, &s.namespace, &s.key_name, &s.id));
    // Where `get_host(port)` points: `<port>-<id>.<domain>`.
    if let Some(d) = &st.settings.sandbox_domain {
        v["domain"] = json!(d);
    }
    v
}

/// `ListedSandbox` (and, with the token, `SandboxDetail`), with the
/// lifecycle's name (`status`, Banata's) and, when Warren paused it or it
/// failed, why (`statusReason`).
pub(super) fn listed(st: &AppState, key: &EffectiveKey, s: &E2bSandbox) -> Value {
    let mut v = json!({
        "templateID": s.template,
        "sandboxID": s.id,
        "clientID": "warren",
        "alias": s.template,
        "startedAt": rfc3339(s.started_ms),
        "endAt": rfc3339(s.end_ms),
        "cpuCount": key.limits.cpu_millis.div_ceil(1000).max(1),
        "memoryMB": key.limits.memory_bytes >> 20,
        "diskSizeMB": key.limits.home_bytes.max(key.thread_max_bytes) >> 20,
        "state": s.state,
        "status": super::reconcile::status(st, s).as_str(),
        "envdVersion": super::ENVD_VERSION,
        "metadata": s.metadata,
    });
    if !s.reason.is_empty() {
        v["statusReason"] = json!(s.reason);
    }
    v
}

/// Whether create's body `v` asks for public ports (`network.allowPublicTraffic`),
/// which only a key whose ApiKey sets `publicPorts` may; unset is private.
fn public_ports(key: &EffectiveKey, v: &Value) -> Result<bool, E2bError> {
    let asked = match v.get("network").and_then(|n| n.get("allowPublicTraffic")) {
        None | Some(Value::Null) => false,
        Some(Value::Bool(b)) => *b,
        Some(_) => return Err(E2bError::invalid("network.allowPublicTraffic: true or false")),
    };
    if asked && !key.public_ports {
        return Err(E2bError::invalid("network.allowPublicTraffic: this API key's sandbox ports are private (its ApiKey does not set publicPorts); use the traffic token"));
    }
    Ok(asked)
}

/// The record of new sandbox `id` of `key` as `create`'s body `v` asks,
/// checked by the execute request's rules, its environment sealed.
fn record(st: &AppState, key: &EffectiveKey, v: &Value, template: &str, id: String) -> Result<E2bSandbox, E2bError> {
    let (metadata, env) = (strings(v, "metadata")?, strings(v, "envVars")?);
    // The execute request's own rules (names, sizes, reserved variables).
    crate::exec::request::check_metadata(&metadata)?;
    crate::exec::request::check_env(env.iter().map(|(k, v)| (k.as_str(), v.as_str())))?;
    let timeout = within_key(key, timeout_of(v, DEFAULT_TIMEOUT.min(i64::from(key.live_seconds())))?)?;
    let now = now_ms();
    let owner = super::sealed::Owner { namespace: &key.namespace, key: &key.name, id: &id };
    let env = super::sealed::seal(&st.files.signing_key.current(), owner, &env).ok_or_else(|| E2bError::new(StatusCode::SERVICE_UNAVAILABLE, "the sandbox's environment could not be sealed; retry"))?;
    Ok(E2bSandbox {
        id,
        namespace: key.namespace.clone(),
        key_name: key.name.clone(),
        template: template.to_string(),
        metadata,
        env: Some(env),
        state: "running".into(),
        started_ms: now,
        end_ms: now + timeout * 1000,
        auto_pause: v.get("autoPause").and_then(Value::as_bool).unwrap_or(false),
        node: None,
        status: String::new(),
        reason: String::new(),
        live_ms: 0,
        public_ports: public_ports(key, v)?,
    })
}

/// `POST /sandboxes` (SDK ≤ 2.50) and `POST /v2/sandboxes`; with an
/// `Idempotency-Key` (as E2B's SDKs send it), a retry of the same create
/// within 24 h answers the first one's sandbox instead of making another.
pub async fn create(State(st): State<AppState>, headers: HeaderMap, b: Body) -> Response {
    let run = async {
        let key = key(&st, &headers)?;
        let v = body(&st, b).await?;
        let trace = crate::request_id::of(&headers);
        match crate::execute::idempotent::key_of(&headers).map_err(E2bError::invalid)? {
            Some(idem) => create_once(&st, &key, &v, &idem, trace).await,
            None => {
                let s = create_sandbox(&st, &key, &v, trace).await?;
                Ok((StatusCode::CREATED, axum::Json(created(&st, &s))).into_response())
            }
        }
    };
    run.await.unwrap_or_else(IntoResponse::into_response)
}

/// A create with idempotency key `idem`: claimed before anything is made
/// (one of racing retries makes the sandbox), its answer stored with it.
async fn create_once(st: &AppState, key: &Arc<EffectiveKey>, v: &Value, idem: &str, trace: &str) -> Result<Response, E2bError> {
    use crate::records::Claimed;
    let k = crate::records::IdemKey { namespace: &key.namespace, key_name: &key.name, scope: "e2b-create", key: idem };
    let store = st.service.records.store();
    let id = new_id();
    match store.claim_idempotency(&k, &crate::execute::idempotent::request_hash("e2b-create", v.to_string().as_bytes()), &id, now_ms()).await? {
        Claimed::Different => Err(E2bError::new(StatusCode::UNPROCESSABLE_ENTITY, "this Idempotency-Key was used with another create request in the last 24 hours")),
        Claimed::Same { answer: Some(a), .. } => Ok(crate::execute::idempotent::stored(&a)),
        Claimed::Same { answer: None, .. } => Err(E2bError::new(StatusCode::CONFLICT, "a create with this Idempotency-Key is still running; retry").retry_after(1)),
        Claimed::New => match create_sandbox_as(st, key, v, trace, id).await {
            Ok(s) => {
                let body = created(st, &s);
                let _ = store.answer_idempotency(&k, &crate::execute::idempotent::answer(StatusCode::CREATED, &body.to_string())).await;
                Ok((StatusCode::CREATED, axum::Json(body)).into_response())
            }
            Err(e) => {
                // Nothing was made: the retry makes it.
                let _ = store.release_idempotency(&k).await;
                Err(e)
            }
        },
    }
}

/// Makes a sandbox of `key` as the create body `v` asks (`templateID`,
/// `timeout`, `metadata`, `envVars`, `autoPause`): counted against the key's
/// limits, recorded, live on a node. What every front end's create calls.
pub(crate) async fn create_sandbox(st: &AppState, key: &Arc<EffectiveKey>, v: &Value, trace: &str) -> Result<E2bSandbox, E2bError> {
    create_sandbox_as(st, key, v, trace, new_id()).await
}

/// [`create_sandbox`] with id `id`.
pub(super) async fn create_sandbox_as(st: &AppState, key: &Arc<EffectiveKey>, v: &Value, trace: &str, id: String) -> Result<E2bSandbox, E2bError> {
    let template = v.get("templateID").and_then(Value::as_str).ok_or_else(|| E2bError::invalid("templateID is required"))?;
    if template != key.sandbox && !DEFAULT_TEMPLATES.contains(&template) {
        return Err(E2bError::not_found(format!("template {template:?}: this API key runs its Sandbox {:?} (or the defaults base, code-interpreter-v1)", key.sandbox)));
    }
    refuse_unsupported(v, key)?;
    let mut s = record(st, key, v, template, id)?;
    // Counted and stored in one step: creates racing each other, on any
    // replica, never pass the key's limits.
    let most = if key.max_threads > 0 { u64::from(key.max_threads) } else { DEFAULT_MAX_SANDBOXES };
    let running = u64::from(key.live_sandboxes());
    match st.service.records.store().insert_sandbox_within(&s, most, running).await? {
        crate::records::Inserted::Yes => {}
        crate::records::Inserted::TooMany => return Err(E2bError::new(StatusCode::TOO_MANY_REQUESTS, format!("this API key has {most} sandboxes, its most (maxThreads); kill one first"))),
        crate::records::Inserted::TooManyRunning => return Err(too_many_running(running)),
    }
    match super::sandbox::make_live(st, key, &s).await {
        Ok(node) => s.node = Some(node),
        Err(e) => {
            // Nothing of it runs: it is forgotten, its (empty) thread with it.
            let _ = st.service.records.store().delete_sandbox(&s.id).await;
            super::lifecycle::delete_thread(st, key, &s.id, trace).await;
            return Err(e);
        }
    }
    tracing::info!(key = %key.qualified_name(), sandbox = %s.id, node = ?s.node, "sandbox created");
    super::activity::log(st, &s, &super::activity::by_key(key), "sandbox.create", &format!("on {}", s.node.as_deref().unwrap_or("?")));
    Ok(s)
}

/// The caller's sandbox `id` while it lives; an ended one is deleted now.
pub(crate) async fn owned(st: &AppState, key: &Arc<EffectiveKey>, id: &str) -> Result<E2bSandbox, E2bError> {
    let missing = || E2bError::not_found(format!("sandbox {id} not found"));
    if !warren_core::ids::is_thread_id(id) {
        return Err(missing());
    }
    let s = st.service.records.store().sandbox(id).await?.filter(|s| s.namespace == key.namespace && s.key_name == key.name).ok_or_else(missing)?;
    if s.end_ms <= now_ms() {
        super::lifecycle::expire(st, key, &s);
        return Err(missing());
    }
    Ok(s)
}

/// `GET /sandboxes/{id}`.
pub async fn get_info(State(st): State<AppState>, headers: HeaderMap, Path(id): Path<String>) -> Response {
    let run = async {
        let key = key(&st, &headers)?;
        let s = owned(&st, &key, &id).await?;
        let mut v = listed(&st, &key, &s);
        v["envdAccessToken"] = created(&st, &s)["envdAccessToken"].clone();
        v["network"] = json!({"allowPublicTraffic": s.public_ports && key.public_ports});
        Ok::<_, E2bError>(axum::Json(v))
    };
    run.await.map_or_else(IntoResponse::into_response, IntoResponse::into_response)
}

/// `DELETE /sandboxes/{id}`: forgotten at once; its thread (home) is deleted
/// right after, in the background.
pub async fn kill(State(st): State<AppState>, headers: HeaderMap, Path(id): Path<String>) -> Response {
    let run = async {
        let key = key(&st, &headers)?;
        let s = owned(&st, &key, &id).await?;
        st.service.records.store().delete_sandbox(&s.id).await?;
        // The id is unusable from here on; its processes and home go in the
        // background (the caller does not wait for the node).
        let (st2, key2, trace) = (st.clone(), key.clone(), crate::request_id::of(&headers).to_string());
        tracing::info!(key = %key.qualified_name(), sandbox = %s.id, "e2b sandbox killed");
        super::activity::log(&st, &s, &super::activity::by_key(&key), "sandbox.kill", "");
        tokio::spawn(async move { super::lifecycle::forget(&st2, &key2, &s, &trace).await });
        Ok::<_, E2bError>(StatusCode::NO_CONTENT)
    };
    run.await.map_or_else(IntoResponse::into_response, IntoResponse::into_response)
}

/// `POST /sandboxes/{id}/timeout` `{timeout}`: it ends that many seconds from now.
pub async fn set_timeout(State(st): State<AppState>, headers: HeaderMap, Path(id): Path<String>, b: Body) -> Response {
    let run = async {
        let key = key(&st, &headers)?;
        let s = owned(&st, &key, &id).await?;
        let t = within_key(&key, timeout_of(&body(&st, b).await?, DEFAULT_TIMEOUT.min(i64::from(key.live_seconds())))?)?;
        st.service.records.store().update_sandbox(&s.id, now_ms() + t * 1000, &s.state).await?;
        super::lifecycle::extend(&st, &key, &s, now_ms() + t * 1000).await;
        Ok::<_, E2bError>(StatusCode::NO_CONTENT)
    };
    run.await.map_or_else(IntoResponse::into_response, IntoResponse::into_response)
}

/// `POST /sandboxes/{id}/refreshes` `{duration}`: at least that many more seconds.
pub async fn refresh(State(st): State<AppState>, headers: HeaderMap, Path(id): Path<String>, b: Body) -> Response {
    let run = async {
        let key = key(&st, &headers)?;
        let s = owned(&st, &key, &id).await?;
        let v = body(&st, b).await?;
        let d = v.get("duration").and_then(Value::as_i64).unwrap_or(60).clamp(0, i64::from(key.live_seconds()));
        let end = s.end_ms.max(now_ms() + d * 1000);
        st.service.records.store().update_sandbox(&s.id, end, &s.state).await?;
        super::lifecycle::extend(&st, &key, &s, end).await;
        Ok::<_, E2bError>(StatusCode::NO_CONTENT)
    };
    run.await.map_or_else(IntoResponse::into_response, IntoResponse::into_response)
}

/// Moves the sandbox to `state`. Paused, its live sandbox ends with its
/// home saved and it is kept like a sandbox paused at its timeout;
/// resumed from a pause, it is made live again from that home and runs for
/// the body's timeout (E2B's default without one); connected while
/// running, a longer timeout extends it and a shorter one changes nothing.
async fn mark(st: &AppState, headers: &HeaderMap, id: &str, state: &str, b: Option<Body>) -> Result<(Arc<EffectiveKey>, E2bSandbox), E2bError> {
    let key = key(st, headers)?;
    let mut s = owned(st, &key, id).await?;
    let asked = match b {
        Some(b) => Some(within_key(&key, timeout_of(&body(st, b).await?, -1)?)?).filter(|t| *t >= 0),
        None => None,
    };
    let now = now_ms();
    let was = s.state.clone();
    s.end_ms = match (state, was.as_str(), asked) {
        ("paused", _, _) => now + super::lifecycle::paused_kept(&key).as_millis() as i64,
        (_, "paused", t) => now + t.unwrap_or(DEFAULT_TIMEOUT.min(i64::from(key.live_seconds()))) * 1000,
        (_, _, Some(t)) => s.end_ms.max(now + t * 1000),
        (_, _, None) => s.end_ms,
    };
    match (state, was.as_str()) {
        ("paused", "running") => super::lifecycle::pause(st, &key, &s).await?,
        ("running", "paused") => {
            let most = key.live_sandboxes();
            if st.service.records.store().running_sandboxes(&key.namespace, &key.name, now).await? >= u64::from(most) {
                return Err(too_many_running(u64::from(most)));
            }
            s.node = Some(super::sandbox::make_live(st, &key, &s).await?);
        }
        ("running", _) => super::lifecycle::extend(st, &key, &s, s.end_ms).await,
        _ => {}
    }
    if state != was {
        let action = if state == "paused" { "sandbox.pause" } else { "sandbox.resume" };
        super::activity::log(st, &s, &super::activity::by_key(&key), action, s.node.as_deref().map(|n| format!("on {n}")).as_deref().unwrap_or(""));
    }
    s.state = state.to_string();
    st.service.records.store().update_sandbox(&s.id, s.end_ms, state).await?;
    Ok((key, s))
}

/// `POST /sandboxes/{id}/connect` and `/v2/…/connect`: resumes it when
/// paused; answers as `create`.
pub async fn connect(State(st): State<AppState>, headers: HeaderMap, Path(id): Path<String>, b: Body) -> Response {
    match mark(&st, &headers, &id, "running", Some(b)).await {
        Ok((_, s)) => (StatusCode::OK, axum::Json(created(&st, &s))).into_response(),
        Err(e) => e.into_response(),
    }
}

/// `POST /sandboxes/{id}/resume`.
pub async fn resume(State(st): State<AppState>, headers: HeaderMap, Path(id): Path<String>, b: Body) -> Response {
    match mark(&st, &headers, &id, "running", Some(b)).await {
        Ok((_, s)) => (StatusCode::CREATED, axum::Json(created(&st, &s))).into_response(),
        Err(e) => e.into_response(),
    }
}

/// `POST /sandboxes/{id}/pause`: its processes end and its home is saved;
/// the data plane refuses it until it is resumed (or connected to).
pub async fn pause(State(st): State<AppState>, headers: HeaderMap, Path(id): Path<String>) -> Response {
    match mark(&st, &headers, &id, "paused", None).await {
        Ok(_) => StatusCode::NO_CONTENT.into_response(),
        Err(e) => e.into_response(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ids_are_lowercase_thread_ids() {
        let a = new_id();
        assert_eq!(a.len(), 20);
        assert!(a.bytes().all(|b| b.is_ascii_lowercase() || b.is_ascii_digit()));
        assert!(warren_core::ids::is_thread_id(&a));
        assert_ne!(a, new_id());
    }

    fn compiled_key(extra: &str) -> EffectiveKey {
        let text = format!(
            "apiVersion: warren.dev/v1alpha1\nkind: Sandbox\nmetadata: {{name: a}}\nspec: {{image: host}}\n---\n\
             apiVersion: warren.dev/v1alpha1\nkind: ApiKey\nmetadata: {{name: k}}\nspec: {{sandboxRef: {{name: a}}{extra}}}\n---\n\
             apiVersion: v1\nkind: Secret\nmetadata: {{name: k-key}}\nstringData: {{key: sk-wrn-AAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA}}\n"
        );
        let c = warren_config::compile(&[warren_config::Source { file: "t.yaml", text: &text }]);
        assert!(c.errors.is_empty(), "{:?}", c.errors);
        c.keys.into_iter().next().unwrap()
    }

    #[test]
    fn public_ports_need_the_key_and_of_network_nothing_else_is_taken() {
        let (private, public) = (compiled_key(""), compiled_key(", publicPorts: true"));
        assert!(!public_ports(&private, &json!({})).unwrap(), "private unless asked");
        assert!(!public_ports(&private, &json!({"network": {"allowPublicTraffic": false}})).unwrap());
        assert!(public_ports(&private, &json!({"network": {"allowPublicTraffic": true}})).unwrap_err().message.contains("publicPorts"));
        assert!(public_ports(&public, &json!({"network": {"allowPublicTraffic": true}})).unwrap());
        assert!(public_ports(&public, &json!({"network": {"allowPublicTraffic": "yes"}})).is_err());
        assert!(refuse_unsupported(&json!({"network": {"allowPublicTraffic": true}}), &public).is_ok());
        assert!(refuse_unsupported(&json!({"network": {"allowPublicTraffic": null, "allowOut": []}}), &public).is_ok(), "empty is unset");
        assert!(refuse_unsupported(&json!({"network": {"allowPublicTraffic": true, "denyOut": ["0.0.0.0/0"]}}), &public).is_err());
        assert!(refuse_unsupported(&json!({"network": "open"}), &public).is_err());
    }

    #[test]
    fn timeouts_are_bounded() {
        assert_eq!(timeout_of(&json!({}), 300).unwrap(), 300);
        assert_eq!(timeout_of(&json!({"timeout": 60}), 300).unwrap(), 60);
        assert!(timeout_of(&json!({"timeout": -1}), 300).is_err());
        assert!(timeout_of(&json!({"timeout": MAX_TIMEOUT + 1}), 300).is_err());
        assert!(timeout_of(&json!({"timeout": "1"}), 300).is_err());
    }
}
