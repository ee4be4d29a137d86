//! envd's `GET|POST /files`: a file of the live sandbox, read and written
//! by a process in it as its user (`cat`), so a path means what it means
//! to the sandbox's own commands and a link leads only where they could go.
//! Uploads are `application/octet-stream` (one file, `?path=`) or
//! `multipart/form-data` (each part's filename is its path); both answer
//! `[{name, type, path}]`. An octet-stream upload of known length streams
//! to the node; a multipart form or a body without `Content-Length` is held
//! in memory, up to [`BUFFERED`] bytes.

use axum::body::{Body, Bytes};
use axum::extract::{Query, State};
use axum::http::{header, HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use futures_util::StreamExt;
use serde::Deserialize;
use serde_json::json;

use super::paths::{absolute, shown};
use super::sandbox::open;
use super::E2bError;
use crate::exec::live::{Live, LiveEvent, LiveEvents, Start};
use crate::uploads::body::{self, BodyError, Pace};
use crate::uploads::Hold;
use crate::state::AppState;

/// `?path=&username=`.
#[derive(Debug, Deserialize)]
pub struct FileQuery {
    path: Option<String>,
    username: Option<String>,
}

/// The file a query names (absolute in the sandbox; the home is not a file).
fn file_path(p: Option<&str>) -> Result<String, E2bError> {
    let abs = absolute(p.unwrap_or_default())?;
    if abs == super::paths::HOME || abs == "/" {
        return Err(E2bError::invalid("path: a file is required"));
    }
    Ok(abs)
}

/// Largest file one upload stores.
const MAX_UPLOAD: u64 = 4 << 30;

/// Most bytes of an upload held in the gateway's memory (multipart forms,
/// bodies without Content-Length); octet-stream uploads of known size stream.
const BUFFERED: u64 = 32 << 20;

/// Reads an upload held whole: refusals the SDKs show sensibly — 413 past
/// `limit`, 429 "retry" (not 503: the SDKs take that for a dead sandbox)
/// when the gateway's upload memory is spent, 408 when it stopped arriving.
async fn held(st: &AppState, b: Body, limit: usize, hold: &mut Hold) -> Result<axum::body::Bytes, E2bError> {
    let pace = Pace { idle: st.settings.body_timeout, min_rate: st.settings.upload_min_rate };
    // A form's boundaries and headers come on top of the file.
    body::collect(b, limit.saturating_add(64 << 10), hold, pace).await.map_err(|e| match e {
        BodyError::TooLarge(_) => E2bError::new(StatusCode::PAYLOAD_TOO_LARGE, format!("an upload without Content-Length, or in a multipart form, holds at most {limit} bytes; send larger files as application/octet-stream with a Content-Length (a binary file object)")),
        BodyError::Refused(why) => E2bError::new(StatusCode::TOO_MANY_REQUESTS, format!("{why}; retry shortly, or send the file as application/octet-stream with a Content-Length, which streams")).retry_after(1),
        BodyError::Stalled => E2bError::new(StatusCode::REQUEST_TIMEOUT, format!("{e}; the upload was cut")),
        BodyError::Failed => E2bError::invalid(e.to_string()),
    })
}

/// envd's `WriteInfo` of a stored file.
fn written_info(abs: &str) -> serde_json::Value {
    json!({"name": abs.rsplit('/').next().unwrap_or(abs), "type": "file", "path": shown(abs)})
}

/// A process of the file calls: `sh -c script sh path`, as the sandbox's user.
fn file_process(script: &str, path: &str, stdin: bool) -> Start {
    Start { argv: vec!["/bin/sh".into(), "-c".into(), script.into(), "sh".into(), path.into()], stdin, ..Start::default() }
}

/// What a failed file process said, as envd's error: 404 for a missing file.
fn failed(path: &str, stderr: &[u8]) -> E2bError {
    let said = String::from_utf8_lossy(stderr);
    let said = said.lines().next().unwrap_or("failed").trim();
    if said.contains("No such file") || said.contains("Not a directory") {
        return E2bError::not_found(format!("{}: no such file", shown(path)));
    }
    if said.contains("Is a directory") {
        return E2bError::invalid(format!("{}: is a directory", shown(path)));
    }
    E2bError::invalid(format!("{}: {}", shown(path), said.rsplit(": ").next().unwrap_or(said)))
}

/// The file's bytes, streamed once `cat` has shown it can read it.
pub(crate) async fn read_file(live: &Live, path: &str) -> Result<Body, E2bError> {
    let mut events = live.start(file_process("exec cat -- \"$1\"", path, false)).await?;
    let mut first = Vec::new();
    let mut err = Vec::new();
    // Until the first bytes (or the end): a missing file answers 404, not an empty 200.
    loop {
        match events.next().await {
            Some(Ok(LiveEvent::Stdout(b))) => {
                first.push(b);
                break;
            }
            Some(Ok(LiveEvent::Stderr(b))) => err.extend_from_slice(&b),
            Some(Ok(LiveEvent::Ended(0, _))) => return Ok(Body::empty()),
            Some(Ok(LiveEvent::Ended(..))) => return Err(failed(path, &err)),
            Some(Ok(_)) => {}
            Some(Err(e)) => return Err(e.into()),
            None => return Err(crate::exec::live::LiveError::NodeLost.into()),
        }
    }
    let rest = events.filter_map(|e| async move {
        match e {
            Ok(LiveEvent::Stdout(b)) => Some(Ok(b)),
            Ok(LiveEvent::Ended(0, _)) | Ok(_) => None,
            Err(e) => Some(Err(std::io::Error::other(e.to_string()))),
        }
    });
    Ok(Body::from_stream(futures_util::stream::iter(first.into_iter().map(Ok)).chain(rest)))
}

/// Stores `data` at `path` (its directories made), by a process in the sandbox.
pub(crate) async fn write_file<S>(live: &Live, path: &str, data: S) -> Result<(), E2bError>
where
    S: futures_util::Stream<Item = Result<Bytes, E2bError>> + Send,
{
    let script = "d=$(dirname -- \"$1\") && mkdir -p -- \"$d\" && exec cat > \"$1\"";
    let mut events = live.start(file_process(script, path, true)).await?;
    let pid = match events.next().await {
        Some(Ok(LiveEvent::Started(pid))) => pid,
        Some(Err(e)) => return Err(e.into()),
        _ => return Err(crate::exec::live::LiveError::NodeLost.into()),
    };
    let fed = async {
        let mut data = std::pin::pin!(data);
        while let Some(chunk) = data.next().await {
            for piece in chunk?.chunks(1 << 20) {
                live.write(pid, piece.to_vec()).await?;
            }
        }
        live.close_stdin(pid).await?;
        Ok::<_, E2bError>(())
    };
    let fed = fed.await;
    if fed.is_err() {
        let _ = live.signal(pid, crate::exec::live::SIGKILL).await;
    }
    let (code, err) = ended(events).await?;
    fed?;
    if code != 0 {
        return Err(failed(path, &err));
    }
    Ok(())
}

/// A process's exit code and stderr.
async fn ended(mut events: LiveEvents) -> Result<(i32, Vec<u8>), E2bError> {
    let mut err = Vec::new();
    while let Some(e) = events.next().await {
        match e? {
            LiveEvent::Stderr(b) if err.len() < 4096 => err.extend_from_slice(&b),
            LiveEvent::Ended(code, _) => return Ok((code, err)),
            _ => {}
        }
    }
    Err(crate::exec::live::LiveError::NodeLost.into())
}

/// `GET /files?path=`: the file's bytes.
pub async fn download(State(st): State<AppState>, headers: HeaderMap, Query(q): Query<FileQuery>) -> Response {
    let run = async {
        let o = open(&st, &headers).await?;
        super::sandbox::user_is_default(q.username.as_deref())?;
        let path = file_path(q.path.as_deref())?;
        let body = read_file(&o.live(&st).await?, &path).await?;
        Ok::<_, E2bError>(([(header::CONTENT_TYPE, "application/octet-stream")], body).into_response())
    };
    run.await.unwrap_or_else(IntoResponse::into_response)
}

/// `POST /files`: stores one file (octet-stream) or each part (multipart).
pub async fn upload(State(st): State<AppState>, headers: HeaderMap, Query(q): Query<FileQuery>, b: Body) -> Response {
    let run = async {
        let o = open(&st, &headers).await?;
        super::sandbox::user_is_default(q.username.as_deref())?;
        let live = o.live(&st).await?;
        if headers.get(header::CONTENT_ENCODING).is_some_and(|v| v != "identity") {
            return Err(E2bError::invalid("compressed uploads are not accepted (write without gzip)"));
        }
        let ct = headers.get(header::CONTENT_TYPE).and_then(|v| v.to_str().ok()).unwrap_or_default();
        let max = MAX_UPLOAD;
        let too_large = || E2bError::new(StatusCode::PAYLOAD_TOO_LARGE, format!("the upload exceeds the largest file this sandbox stores ({max} bytes)"));
        let boundary = crate::multipart::boundary(ct);
        let declared = headers.get(header::CONTENT_LENGTH).and_then(|v| v.to_str().ok()).and_then(|v| v.parse::<u64>().ok());
        if let (None, Some(len)) = (&boundary, declared) {
            // One file of known size: streamed to the node, never held here.
            if len > max {
                return Err(too_large());
            }
            let path = file_path(q.path.as_deref())?;
            write_file(&live, &path, sized(b, len, st.settings.body_timeout)).await?;
            return Ok(axum::Json(vec![written_info(&path)]).into_response());
        }
        // Multipart, or a body of unknown length: held, up to BUFFERED bytes,
        // reserved from the gateway's upload budget as they arrive.
        let limit = max.min(BUFFERED) as usize;
        let mut hold = st.uploads.hold(&o.key.qualified_name());
        let bytes = held(&st, b, limit, &mut hold).await?;
        let mut written = Vec::new();
        if let Some(boundary) = boundary {
            let parts = crate::multipart::parse(&bytes, &boundary).map_err(|why| E2bError::invalid(format!("the multipart body: {why}")))?;
            for part in parts.into_iter().filter(|p| p.filename.is_some() || q.path.is_some()) {
                let rel = match (&q.path, &part.filename) {
                    (Some(p), _) if written.is_empty() => file_path(Some(p))?,
                    (_, Some(f)) => file_path(Some(f))?,
                    _ => return Err(E2bError::invalid("each file part needs a filename (its path)")),
                };
                if part.data.len() as u64 > max {
                    return Err(too_large());
                }
                write_file(&live, &rel, futures_util::stream::iter([Ok(part.data)])).await?;
                written.push(rel);
            }
        } else {
            let rel = file_path(q.path.as_deref())?;
            write_file(&live, &rel, futures_util::stream::iter([Ok(bytes)])).await?;
            written.push(rel);
        }
        if written.is_empty() {
            return Err(E2bError::invalid("no file in the upload"));
        }
        Ok(axum::Json(written.iter().map(|r| written_info(r)).collect::<Vec<_>>()).into_response())
    };
    run.await.unwrap_or_else(IntoResponse::into_response)
}

/// An upload body of `len` bytes, each piece arriving within `idle`:
/// shorter or longer is refused.
fn sized(b: Body, len: u64, idle: std::time::Duration) -> impl futures_util::Stream<Item = Result<Bytes, E2bError>> + Send {
    let mut data = b.into_data_stream();
    async_stream::stream! {
        let mut seen = 0u64;
        loop {
            match tokio::time::timeout(idle, data.next()).await {
                Err(_) => { yield Err(E2bError::new(StatusCode::REQUEST_TIMEOUT, "the upload stopped arriving")); return; }
                Ok(None) => break,
                Ok(Some(Err(_))) => { yield Err(E2bError::invalid("the upload was cut")); return; }
                Ok(Some(Ok(chunk))) => {
                    seen += chunk.len() as u64;
                    if seen > len {
                        yield Err(E2bError::invalid("the upload is longer than its Content-Length"));
                        return;
                    }
                    yield Ok(chunk);
                }
            }
        }
        if seen != len {
            yield Err(E2bError::invalid("the upload is shorter than its Content-Length"));
        }
    }
}
