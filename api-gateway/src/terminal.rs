//! A live sandbox's terminal over a WebSocket (`terminalUrl`), for browser
//! terminals (xterm.js) and any WebSocket client: `GET
//! /sandboxes/{id}/terminal?warren_token=…&rows=&cols=` starts an
//! interactive login shell on a terminal of the sandbox and carries it.
//!
//! ```text
//! server → client   binary frames: what the terminal shows
//! client → server   binary frames: keystrokes;
//!                   text frames: JSON {"input": "…"} or {"resize": [rows, cols]}
//! ```
//!
//! The socket's end hangs the shell up (SIGHUP to its group); the shell's
//! end closes the socket (code 1000, reason `exit <code>`). The token is
//! the sandbox's terminal token (create and connect answer `terminalUrl`
//! with it) or its traffic token; each session is logged with the sandbox
//! and key. An adapter over `crate::exec::live`, like every front end.

use axum::extract::ws::{CloseFrame, Message, WebSocket, WebSocketUpgrade};
use axum::extract::{Path, Query, State};
use axum::http::HeaderMap;
use axum::response::{IntoResponse, Response};
use futures_util::{SinkExt, StreamExt};
use serde::Deserialize;

use crate::e2b::token::Scope;
use crate::e2b::E2bError;
use crate::exec::live::{Live, LiveEvent, Start};
use crate::state::AppState;

/// SIGHUP.
const SIGHUP: i32 = 1;
/// Largest frame a client may send.
const MAX_FRAME: usize = 64 << 10;

/// `?warren_token=&rows=&cols=`.
#[derive(Debug, Deserialize)]
pub struct TerminalQuery {
    warren_token: Option<String>,
    rows: Option<u32>,
    cols: Option<u32>,
}

/// `GET /sandboxes/{id}/terminal` (a WebSocket upgrade).
pub async fn terminal(State(st): State<AppState>, headers: HeaderMap, Path(id): Path<String>, Query(q): Query<TerminalQuery>, ws: WebSocketUpgrade) -> Response {
    let run = async {
        let s = st.service.records.store().sandbox(&id).await?.ok_or_else(|| E2bError::gone(&id))?;
        let signing = st.files.signing_key.current();
        let token = q.warren_token.as_deref().unwrap_or_default();
        let traffic = headers.get("e2b-traffic-access-token").and_then(|v| v.to_str().ok()).unwrap_or(token);
        let verify = |scope, t: &str| crate::e2b::token::verify_for(scope, &signing, &s.namespace, &s.key_name, &id, t);
        let opens = verify(Scope::Terminal, token) || verify(Scope::Traffic, traffic);
        let key = st.keys().named(&s.namespace, &s.key_name).filter(|k| opens && !k.disabled).ok_or_else(|| E2bError::gone(&id))?;
        if s.state != "running" || s.end_ms <= crate::records::now_ms() {
            return Err(E2bError::gone(&id));
        }
        let node = s.node.as_deref().ok_or_else(|| E2bError::gone(&id))?;
        let live = st.service.live(&key, &id, node)?;
        let size = (q.rows.unwrap_or(24).clamp(1, 1000), q.cols.unwrap_or(80).clamp(1, 1000));
        tracing::info!(sandbox = %id, key = %key.qualified_name(), "terminal session opened");
        crate::e2b::activity::log(&st, &s, &crate::e2b::activity::by_key(&key), "sandbox.terminal", "WebSocket terminal");
        Ok::<_, E2bError>(ws.max_frame_size(MAX_FRAME).max_message_size(MAX_FRAME).on_upgrade(move |socket| session(socket, live, size)))
    };
    run.await.unwrap_or_else(IntoResponse::into_response)
}

/// A control message of a text frame.
#[derive(Debug, Deserialize)]
struct Control {
    input: Option<String>,
    resize: Option<(u32, u32)>,
}

/// Carries one shell until either end goes.
pub(crate) async fn session(socket: WebSocket, live: Live, (rows, cols): (u32, u32)) {
    let (mut tx, mut rx) = socket.split();
    let start = Start { argv: vec!["/bin/bash".into(), "-i".into(), "-l".into()], pty: Some((rows, cols)), ..Start::default() };
    let mut events = match live.start(start).await {
        Ok(e) => e,
        Err(e) => {
            let _ = tx.send(Message::Close(Some(CloseFrame { code: 1011, reason: e.to_string().into() }))).await;
            return;
        }
    };
    let pid = match events.next().await {
        Some(Ok(LiveEvent::Started(pid))) => pid,
        _ => return,
    };
    loop {
        tokio::select! {
            ev = events.next() => match ev {
                Some(Ok(LiveEvent::Pty(b) | LiveEvent::Stdout(b) | LiveEvent::Stderr(b))) => {
                    if tx.send(Message::Binary(b)).await.is_err() {
                        break;
                    }
                }
                Some(Ok(LiveEvent::Ended(code, _))) => {
                    let _ = tx.send(Message::Close(Some(CloseFrame { code: 1000, reason: format!("exit {code}").into() }))).await;
                    return;
                }
                Some(Ok(LiveEvent::Started(_))) => {}
                Some(Err(_)) | None => {
                    let _ = tx.send(Message::Close(Some(CloseFrame { code: 1011, reason: "the sandbox ended".into() }))).await;
                    return;
                }
            },
            msg = rx.next() => match msg {
                Some(Ok(Message::Binary(b))) => {
                    if live.write(pid, b.to_vec()).await.is_err() {
                        break;
                    }
                }
                Some(Ok(Message::Text(t))) => {
                    let Ok(c) = serde_json::from_str::<Control>(t.as_str()) else { continue };
                    if let Some(input) = c.input {
                        let _ = live.write(pid, input.into_bytes()).await;
                    }
                    if let Some((r, c)) = c.resize {
                        let _ = live.resize(pid, r.clamp(1, 1000), c.clamp(1, 1000)).await;
                    }
                }
                Some(Ok(_)) => {}
                Some(Err(_)) | None => break,
            },
        }
    }
    // The socket went: hang the shell up.
    let _ = live.signal(pid, SIGHUP).await;
}
