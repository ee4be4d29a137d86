//! A live sandbox's ports through the gateway, HTTP and WebSocket, three
//! ways to name one:
//!
//! ```text
//! Host: <port>-<sandbox id>.<--sandbox-domain>      E2B's get_host(port), wildcard DNS
//! E2b-Sandbox-Id + E2b-Sandbox-Port headers          E2B's header routing, on the one sandbox URL
//! /sandboxes/<id>/ports/<port>/<path>                 a path on the gateway itself
//! ```
//!
//! Private: a request carries the sandbox's traffic token
//! (`E2B-Traffic-Access-Token`, from create) or a token of that one port
//! (`X-Warren-Port-Token`, or `?warren_token=`, from
//! `GET /sandboxes/<id>/ports/<port>` with the key). The connection is made
//! by the sandbox's node inside the sandbox's network namespace to its
//! loopback only (`LivePort`): no Host header, path or port number can lead
//! to the node, the agent, a link-local address or another sandbox. A
//! paused or killed sandbox's ports stop answering at once (its record
//! says so before any byte moves).

use axum::body::Body;
use axum::extract::{Path, Request, State};
use axum::http::{HeaderMap, HeaderValue, StatusCode, Uri};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use hyper_util::rt::TokioIo;
use serde_json::json;

use super::token::Scope;
use super::E2bError;
use crate::exec::live::LiveError;
use crate::records::E2bSandbox;
use crate::state::AppState;

/// envd's port and the code interpreter's: Warren serves those itself.
const SERVED: [u16; 2] = [49983, 49999];
/// The query parameter a port token may travel in (a browser's first visit).
const TOKEN_PARAM: &str = "warren_token";
/// The header a port token travels in.
const TOKEN_HEADER: &str = "x-warren-port-token";
/// The traffic token's header (E2B's).
const TRAFFIC_HEADER: &str = "e2b-traffic-access-token";

/// The sandbox and port a request names by its Host or E2B's headers.
pub fn target(domain: Option<&str>, headers: &HeaderMap) -> Option<(String, u16)> {
    let text = |n: &str| headers.get(n).and_then(|v| v.to_str().ok());
    if let (Some(domain), Some(host)) = (domain, text("host")) {
        let host = host.rsplit_once(':').filter(|(_, p)| p.bytes().all(|b| b.is_ascii_digit())).map_or(host, |(h, _)| h).to_ascii_lowercase();
        if let Some((port, id)) = host.strip_suffix(domain).and_then(|l| l.strip_suffix('.')).and_then(|l| l.split_once('-')) {
            let port = port.parse::<u16>().ok().filter(|p| *p > 0)?;
            return warren_core::ids::is_thread_id(id).then(|| (id.to_string(), port));
        }
    }
    let port = text("e2b-sandbox-port")?.parse::<u16>().ok().filter(|p| *p > 0 && !SERVED.contains(p))?;
    let id = text("e2b-sandbox-id").filter(|id| warren_core::ids::is_thread_id(id))?;
    Some((id.to_string(), port))
}

/// Middleware: a request naming a sandbox's port by Host or headers goes
/// to the port; any other goes on to the routes.
pub async fn route(State(st): State<AppState>, req: Request, next: Next) -> Response {
    match target(st.settings.sandbox_domain.as_deref(), req.headers()) {
        Some((id, port)) => {
            let path = req.uri().path_and_query().map_or("/".to_string(), |p| p.as_str().to_string());
            proxy(&st, &id, port, path, req).await.unwrap_or_else(IntoResponse::into_response)
        }
        None => next.run(req).await,
    }
}

/// `ANY /sandboxes/{id}/ports/{port}/{*path}`.
pub async fn by_path(State(st): State<AppState>, Path((id, port, rest)): Path<(String, u16, String)>, req: Request) -> Response {
    let query = req.uri().query().map(|q| format!("?{q}")).unwrap_or_default();
    proxy(&st, &id, port, format!("/{rest}{query}"), req).await.unwrap_or_else(IntoResponse::into_response)
}

/// `ANY /sandboxes/{id}/ports/{port}/`.
pub async fn by_path_root(State(st): State<AppState>, Path((id, port)): Path<(String, u16)>, req: Request) -> Response {
    let query = req.uri().query().map(|q| format!("?{q}")).unwrap_or_default();
    proxy(&st, &id, port, format!("/{query}"), req).await.unwrap_or_else(IntoResponse::into_response)
}

/// `GET /sandboxes/{id}/ports/{port}` with the key (`X-API-KEY`): the
/// port's token and where to reach it.
pub async fn port_url(State(st): State<AppState>, headers: HeaderMap, Path((id, port)): Path<(String, u16)>) -> Response {
    let run = async {
        let key = super::control::key(&st, &headers)?;
        let s = super::control::owned(&st, &key, &id).await?;
        if port == 0 || SERVED.contains(&port) {
            return Err(E2bError::invalid(format!("port {port}: from 1 to 65535, not Warren's own {SERVED:?}")));
        }
        let token = super::token::sign_for(Scope::Port(port), &st.files.signing_key.current(), &s.namespace, &s.key_name, &s.id);
        let host = st.settings.sandbox_domain.as_ref().map(|d| format!("{port}-{}.{d}", s.id));
        Ok::<_, E2bError>(axum::Json(json!({"path": format!("/sandboxes/{}/ports/{port}/", s.id), "host": host, "token": token})))
    };
    run.await.map_or_else(IntoResponse::into_response, IntoResponse::into_response)
}

/// The sandbox `id` when `headers` (or the query) carry a token that opens
/// `port` of it and it is running: its traffic token or that port's token.
async fn opened(st: &AppState, headers: &HeaderMap, query: Option<&str>, id: &str, port: u16) -> Result<(std::sync::Arc<warren_config::EffectiveKey>, E2bSandbox), E2bError> {
    let gone = || E2bError::gone(id);
    let s = st.service.records.store().sandbox(id).await?.ok_or_else(gone)?;
    let signing = st.files.signing_key.current();
    let text = |n: &str| headers.get(n).and_then(|v| v.to_str().ok()).unwrap_or_default();
    let from_query = query.and_then(|q| url::form_urlencoded::parse(q.as_bytes()).find(|(k, _)| k == TOKEN_PARAM).map(|(_, v)| v.into_owned())).unwrap_or_default();
    let verify = |scope, token: &str| super::token::verify_for(scope, &signing, &s.namespace, &s.key_name, id, token);
    let opens = verify(Scope::Traffic, text(TRAFFIC_HEADER)) || verify(Scope::Port(port), text(TOKEN_HEADER)) || verify(Scope::Port(port), &from_query);
    // Public ports need no token while the key still allows them.
    let key = st.keys().named(&s.namespace, &s.key_name).filter(|k| (opens || (s.public_ports && k.public_ports)) && !k.disabled).ok_or_else(gone)?;
    if s.end_ms <= crate::records::now_ms() || s.state != "running" {
        return Err(gone());
    }
    Ok((key, s))
}

/// Logs a port's use in the activity log, once a minute per sandbox and
/// port on each gateway at most (a page loads many resources).
fn log_use(st: &AppState, key: &warren_config::EffectiveKey, s: &E2bSandbox, port: u16) {
    use std::collections::HashMap;
    use std::time::{Duration, Instant};
    static RECENT: std::sync::Mutex<Option<HashMap<(String, u16), Instant>>> = std::sync::Mutex::new(None);
    {
        let mut recent = RECENT.lock().unwrap_or_else(|p| p.into_inner());
        let recent = recent.get_or_insert_with(HashMap::new);
        if recent.get(&(s.id.clone(), port)).is_some_and(|at| at.elapsed() < Duration::from_secs(60)) {
            return;
        }
        // Bounded: the stale entries go when it grows.
        if recent.len() >= 10_000 {
            recent.retain(|_, at| at.elapsed() < Duration::from_secs(60));
            if recent.len() >= 10_000 {
                recent.clear();
            }
        }
        recent.insert((s.id.clone(), port), Instant::now());
    }
    super::activity::log(st, s, &format!("{} (port URL)", super::activity::by_key(key)), "sandbox.port", &format!("port {port}"));
}

/// Carries `req` to `port` of sandbox `id` as `path`, and its answer back
/// (a WebSocket's upgrade included).
async fn proxy(st: &AppState, id: &str, port: u16, path: String, mut req: Request) -> Result<Response, E2bError> {
    let (key, s) = opened(st, req.headers(), req.uri().query(), id, port).await?;
    let node = s.node.as_deref().ok_or_else(|| E2bError::gone(id))?;
    let io = st.service.live(&key, id, node)?.port(port).await.map_err(|e| match e {
        LiveError::Refused(_) | LiveError::Invalid(_) => E2bError::new(StatusCode::BAD_GATEWAY, format!("nothing listens on port {port} in the sandbox")),
        other => other.into(),
    })?;
    tracing::info!(sandbox = %id, key = %key.qualified_name(), port, "e2b port used");
    log_use(st, &key, &s, port);
    let (mut sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(io)).await.map_err(|e| upstream(port, &e))?;
    tokio::spawn(async move {
        let _ = conn.with_upgrades().await;
    });
    *req.uri_mut() = without_token(&path).parse::<Uri>().map_err(|_| E2bError::invalid("the path is not a URI path"))?;
    for h in ["x-access-token", TRAFFIC_HEADER, TOKEN_HEADER, "e2b-sandbox-id", "e2b-sandbox-port"] {
        req.headers_mut().remove(h);
    }
    let upgrade = req.extensions_mut().remove::<hyper::upgrade::OnUpgrade>();
    let mut resp = sender.send_request(req).await.map_err(|e| upstream(port, &e))?;
    if resp.status() == StatusCode::SWITCHING_PROTOCOLS {
        let theirs = hyper::upgrade::on(&mut resp);
        if let Some(ours) = upgrade {
            tokio::spawn(async move {
                if let (Ok(a), Ok(b)) = (ours.await, theirs.await) {
                    let _ = tokio::io::copy_bidirectional(&mut TokioIo::new(a), &mut TokioIo::new(b)).await;
                }
            });
        }
    }
    let (mut parts, body) = resp.into_parts();
    parts.headers.insert("x-warren-sandbox", HeaderValue::from_str(id).unwrap_or(HeaderValue::from_static("")));
    Ok(Response::from_parts(parts, Body::new(body)))
}

/// `path` without the port token parameter (the server never sees it).
fn without_token(path: &str) -> String {
    let Some((p, q)) = path.split_once('?') else { return path.to_string() };
    let kept: Vec<&str> = q.split('&').filter(|kv| kv.split('=').next() != Some(TOKEN_PARAM)).collect();
    if kept.is_empty() { p.to_string() } else { format!("{p}?{}", kept.join("&")) }
}

fn upstream(port: u16, e: &hyper::Error) -> E2bError {
    E2bError::new(StatusCode::BAD_GATEWAY, format!("the server on port {port} did not answer as HTTP: {e}"))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn headers(pairs: &[(&str, &str)]) -> HeaderMap {
        pairs.iter().map(|(k, v)| (k.parse::<axum::http::HeaderName>().unwrap(), v.parse().unwrap())).collect()
    }

    #[test]
    fn hosts_and_headers_name_a_port() {
        let id = "abcdefghij0123456789";
        let d = Some("sbx.example.com");
        assert_eq!(target(d, &headers(&[("host", &format!("8000-{id}.sbx.example.com"))])), Some((id.into(), 8000)));
        assert_eq!(target(d, &headers(&[("host", &format!("8000-{id}.SBX.example.com:443"))])), Some((id.into(), 8000)));
        for bad in [format!("0-{id}.sbx.example.com"), format!("99999-{id}.sbx.example.com"), format!("8000-{id}.other.com"), format!("8000-{id}/x.sbx.example.com"), format!("8000-{id}@evil.sbx.example.com"), format!("8000-../{id}.sbx.example.com"), "sbx.example.com".into()] {
            assert_eq!(target(d, &headers(&[("host", &bad)])), None, "{bad}");
        }
        assert_eq!(target(None, &headers(&[("host", &format!("8000-{id}.sbx.example.com"))])), None, "no domain, no Host routing");
        assert_eq!(target(None, &headers(&[("e2b-sandbox-id", id), ("e2b-sandbox-port", "3000")])), Some((id.into(), 3000)));
        for port in ["49983", "49999", "0", "-1", "1e3", "65536"] {
            assert_eq!(target(None, &headers(&[("e2b-sandbox-id", id), ("e2b-sandbox-port", port)])), None, "{port}");
        }
    }

    #[test]
    fn the_port_token_never_reaches_the_server() {
        assert_eq!(without_token("/a?warren_token=x"), "/a");
        assert_eq!(without_token("/a?b=1&warren_token=x&c=2"), "/a?b=1&c=2");
        assert_eq!(without_token("/a"), "/a");
    }
}
