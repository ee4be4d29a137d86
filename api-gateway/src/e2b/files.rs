//! envd's `GET|POST /files`: a file of the sandbox's home, through the same
//! node calls as Warren's Files API (the thread's size limit, 409 while a
//! command holds the thread). Uploads are `application/octet-stream` (one
//! file, `?path=`) or `multipart/form-data` (each part's filename is its
//! path); both answer `[{name, type, path}]`. An octet-stream upload of
//! known length streams to the node; a multipart form or a body without
//! `Content-Length` is held in memory, up to [`BUFFERED`] bytes.

use axum::body::Body;
use axum::extract::{Query, State};
use axum::http::{header, HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use futures_util::StreamExt;
use serde::Deserialize;
use serde_json::json;

use super::paths::{relative, reported};
use super::sandbox::{open, Opened};
use super::E2bError;
use crate::files::FileAccess;
use crate::uploads::body::{self, BodyError, Pace};
use crate::uploads::Hold;
use crate::state::AppState;

/// `?path=&username=`.
#[derive(Debug, Deserialize)]
pub struct FileQuery {
    path: Option<String>,
    username: Option<String>,
}

fn access<'a>(st: &'a AppState, o: &'a Opened) -> Result<FileAccess<'a>, E2bError> {
    Ok(FileAccess::new(st, &o.key, "thread", &o.sandbox.id)?)
}

/// The file path a query names (a file, not the home itself).
fn file_path(p: Option<&str>) -> Result<String, E2bError> {
    let rel = relative(p.unwrap_or_default())?;
    if rel.is_empty() {
        return Err(E2bError::invalid("path: a file in the home is required"));
    }
    Ok(rel)
}

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
fn written_info(rel: &str) -> serde_json::Value {
    json!({"name": rel.rsplit('/').next().unwrap_or(rel), "type": "file", "path": reported(rel)})
}

/// A refusal of the Files API as envd's error (404 stays 404).
fn refused(e: crate::files::FileError) -> E2bError {
    E2bError::from(e)
}

/// `GET /files?path=`: the file's bytes.
pub async fn download(State(st): State<AppState>, headers: HeaderMap, Query(q): Query<FileQuery>) -> Response {
    let run = async {
        let o = open(&st, &headers).await?;
        super::sandbox::user_is_default(q.username.as_deref())?;
        let rel = file_path(q.path.as_deref())?;
        let stream = access(&st, &o)?.read(&rel, crate::request_id::of(&headers)).await.map_err(refused)?;
        let body = Body::from_stream(stream.map(|c| c.map_err(|s| std::io::Error::other(s.message().to_string()))));
        Ok::<_, E2bError>(([(header::CONTENT_TYPE, "application/octet-stream")], body).into_response())
    };
    run.await.unwrap_or_else(IntoResponse::into_response)
}

/// `POST /files`: stores one file (octet-stream) or each part (multipart).
pub async fn upload(State(st): State<AppState>, headers: HeaderMap, Query(q): Query<FileQuery>, b: Body) -> Response {
    let run = async {
        let o = open(&st, &headers).await?;
        super::sandbox::user_is_default(q.username.as_deref())?;
        let files = access(&st, &o)?;
        let trace = crate::request_id::of(&headers);
        if headers.get(header::CONTENT_ENCODING).is_some_and(|v| v != "identity") {
            return Err(E2bError::invalid("compressed uploads are not accepted (write without gzip)"));
        }
        let ct = headers.get(header::CONTENT_TYPE).and_then(|v| v.to_str().ok()).unwrap_or_default();
        let max = files.max_upload();
        let too_large = || E2bError::new(StatusCode::PAYLOAD_TOO_LARGE, format!("the upload exceeds the largest file this sandbox stores ({max} bytes)"));
        let boundary = crate::multipart::boundary(ct);
        let declared = headers.get(header::CONTENT_LENGTH).and_then(|v| v.to_str().ok()).and_then(|v| v.parse::<u64>().ok());
        if let (None, Some(len)) = (&boundary, declared) {
            // One file of known size: streamed to the node, never held here.
            if len > max {
                return Err(too_large());
            }
            let rel = file_path(q.path.as_deref())?;
            files.write_stream(&rel, len, crate::files::upload_body(b, st.settings.body_timeout), trace).await.map_err(refused)?;
            return Ok(axum::Json(vec![written_info(&rel)]).into_response());
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
                files.write(&rel, part.data, trace).await.map_err(refused)?;
                written.push(rel);
            }
        } else {
            let rel = file_path(q.path.as_deref())?;
            files.write(&rel, bytes, trace).await.map_err(refused)?;
            written.push(rel);
        }
        if written.is_empty() {
            return Err(E2bError::invalid("no file in the upload"));
        }
        Ok(axum::Json(written.iter().map(|r| written_info(r)).collect::<Vec<_>>()).into_response())
    };
    run.await.unwrap_or_else(IntoResponse::into_response)
}
