//! `POST /sandboxes/{id}/fork`: E2B's fork over Warren's thread forks.
//!
//! The sandbox's home forks — a running sandbox's as it is at that moment,
//! a paused one's as it was saved — naming its saved layers, so no bytes
//! are copied. Each fork is then a sandbox of its own, made live from its
//! home (as a resume is), with the source's template, metadata and
//! environment. Processes and memory are not forked (E2B's own fork
//! snapshots a VM's memory; Warren's sandboxes have none to copy), and the
//! source keeps running untouched. Each fork succeeds or fails alone, in
//! the list E2B's SDKs read.

use std::sync::Arc;

use axum::body::Body;
use axum::extract::{Path, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use serde_json::{json, Value};
use warren_config::EffectiveKey;

use super::control::{body, create_sandbox_as, created, key, new_id, owned};
use super::E2bError;
use crate::exec::versions::Targets;
use crate::records::E2bSandbox;
use crate::state::AppState;

/// Most forks one call makes (E2B's own bound).
pub const MAX_FORKS: u64 = 20;

/// `POST /sandboxes/{id}/fork` with `{timeout?, count?}` → 201, one
/// `{sandbox}` or `{error: {code, message}}` per fork.
pub async fn fork(State(st): State<AppState>, headers: HeaderMap, Path(id): Path<String>, b: Body) -> Response {
    let run = async {
        let key = key(&st, &headers)?;
        let v = body(&st, b).await?;
        let count = match v.get("count") {
            None | Some(Value::Null) => 1,
            Some(n) => n.as_u64().filter(|n| (1..=MAX_FORKS).contains(n)).ok_or_else(|| E2bError::invalid(format!("count: from 1 to {MAX_FORKS}")))?,
        };
        let source = owned(&st, &key, &id).await?;
        let trace = crate::request_id::of(&headers);
        let ids: Vec<String> = (0..count).map(|_| new_id()).collect();
        fork_home(&st, &key, &source, &ids, trace).await?;
        let mut results = Vec::with_capacity(ids.len());
        for fid in ids {
            results.push(make_fork(&st, &key, &source, &v, fid, trace).await);
        }
        tracing::info!(key = %key.qualified_name(), sandbox = %source.id, forks = results.len(), "sandbox forked");
        super::activity::log(&st, &source, &super::activity::by_key(&key), "sandbox.fork", &format!("{} forks", results.len()));
        Ok::<_, E2bError>((StatusCode::CREATED, axum::Json(Value::Array(results))).into_response())
    };
    run.await.unwrap_or_else(IntoResponse::into_response)
}

/// Forks the source's home into the threads `ids`, all at once.
async fn fork_home(st: &AppState, key: &Arc<EffectiveKey>, source: &E2bSandbox, ids: &[String], trace: &str) -> Result<(), E2bError> {
    match (source.state.as_str(), source.node.as_deref()) {
        ("running", Some(node)) => {
            let live = st.service.live(key, &source.id, node).map_err(E2bError::from)?;
            Ok(live.fork_home(ids.to_vec(), trace).await?)
        }
        _ => {
            st.service.fork_thread(key, &source.id, Targets::Named(ids.to_vec()), None, trace).await?;
            Ok(())
        }
    }
}

/// Makes fork `fid` a sandbox live from its home; its answer or its error.
async fn make_fork(st: &AppState, key: &Arc<EffectiveKey>, source: &E2bSandbox, v: &Value, fid: String, trace: &str) -> Value {
    let made = async {
        let env = super::sandbox::sandbox_env(st, source)?;
        let mut create = json!({"templateID": source.template, "metadata": source.metadata, "envVars": env, "autoPause": source.auto_pause});
        if let Some(t) = v.get("timeout") {
            create["timeout"] = t.clone();
        }
        if source.public_ports {
            create["network"] = json!({"allowPublicTraffic": true});
        }
        create_sandbox_as(st, key, &create, trace, fid.clone()).await
    };
    match made.await {
        Ok(s) => json!({"sandbox": created(st, &s)}),
        Err(e) => {
            // Its home goes with it (a failed create already removed it).
            super::lifecycle::delete_thread(st, key, &fid, trace).await;
            json!({"error": {"code": e.status.as_u16(), "message": e.message}})
        }
    }
}
