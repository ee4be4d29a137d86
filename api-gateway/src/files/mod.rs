//! The Files API: files reach a thread's saved home (or a managed volume)
//! before a call and leave it after, without a sandbox.
//!
//! ```text
//! POST /v1/files/upload_url | download_url   (Bearer key) → a signed URL
//! PUT|GET /v1/files/content/{token}          (the URL is the capability)
//! POST /v1/files/list                        (Bearer key) → {files}
//! ```
//!
//! A thread's files are served by its home node (where its saves happen);
//! a volume's by any node (volumes live in the platform store). An upload is
//! saved exactly like an execution's changes: a new layer, the thread's size
//! limit, and 409 while an execution holds the thread.


use std::time::Duration;

use axum::body::Body;
use axum::extract::{Path, State};
use axum::http::{header, HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use futures_util::StreamExt;
use serde::{Deserialize, Serialize};
use utoipa::ToSchema;
use warren_config::EffectiveKey;

use crate::error::ApiError;
use crate::state::AppState;
use crate::file_urls::token::{self, Grant, Op, Source};
pub use crate::file_urls::Settings;

mod access;
use access::{clean, place};
pub use access::{FileAccess, FileEntry, FileError, FileList};


/// `upload_url` body.
#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct UploadUrlRequest {
    /// `thread` or `volume`.
    pub source: String,
    /// Thread id, or the volume's name.
    pub id: String,
    /// Path relative to the home (`/home/<user>`) or the volume (its `/data/<mount>`).
    pub path: String,
    /// Exact size of the upload, bytes.
    pub content_length: u64,
    /// Media type (default application/octet-stream).
    pub content_type: Option<String>,
}

/// `download_url` and `list` body.
#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct FileRequest {
    /// `thread` or `volume`.
    pub source: String,
    /// Thread id, or the volume's name.
    pub id: String,
    /// Path relative to the home or the volume (optional when listing).
    #[serde(default)]
    pub path: Option<String>,
}

/// A header the URL's request must carry.
#[derive(Debug, Serialize, ToSchema)]
pub struct SignedHeader {
    /// Name.
    pub name: String,
    /// Value.
    pub value: String,
}

/// A signed, expiring, single-purpose URL.
#[derive(Debug, Serialize, ToSchema)]
pub struct SignedUrl {
    /// Absolute URL; no API key needed.
    pub url: String,
    /// `PUT` (upload) or `GET` (download).
    pub method: String,
    /// Headers to send.
    pub headers: Vec<SignedHeader>,
    /// When it stops working (RFC 3339).
    pub expires_at: String,
}

const BODY_LIMIT: usize = 64 << 10;

/// A small JSON body, bounded in size and time.
async fn body<T: serde::de::DeserializeOwned>(st: &AppState, body: Body) -> Result<T, ApiError> {
    let bytes = tokio::time::timeout(st.settings.body_timeout, axum::body::to_bytes(body, BODY_LIMIT))
        .await
        .map_err(|_| ApiError::body_timeout(st.settings.body_timeout))?
        .map_err(|_| ApiError::too_large(BODY_LIMIT))?;
    serde_json::from_slice(&bytes).map_err(|e| ApiError::invalid_json(format!("the body is not acceptable: {}", e.to_string().split(" at line").next().unwrap_or_default())))
}

/// A URL to upload one file (`PUT` it with exactly `content_length` bytes).
#[utoipa::path(post, path = "/v1/files/upload_url", tag = "files", request_body = UploadUrlRequest, security(("bearer" = [])),
    responses((status = 200, body = SignedUrl), (status = 400, body = crate::error::ErrorBody), (status = 401, body = crate::error::ErrorBody),
        (status = 403, description = "The key's mount of this volume is read-only", body = crate::error::ErrorBody), (status = 404, description = "No such volume for this key", body = crate::error::ErrorBody),
        (status = 413, description = "Larger than the gateway's or the thread's limit", body = crate::error::ErrorBody)))]
pub async fn upload_url(State(st): State<AppState>, headers: HeaderMap, b: Body) -> Response {
    let run = async {
        let key = st.keys().authenticate(&headers)?;
        let r: UploadUrlRequest = body(&st, b).await?;
        let path = clean(&r.path, false)?;
        let place = place(&key, &r.source, &r.id)?;
        if !place.writable {
            return Err(FileError::ReadOnly.into());
        }
        let max = place.max.min(st.files.max_upload);
        if r.content_length > max {
            return Err(ApiError::too_large(max as usize));
        }
        let ct = r.content_type.unwrap_or_else(|| "application/octet-stream".into());
        if ct.len() > 255 || ct.chars().any(|c| c.is_control()) {
            return Err(ApiError::invalid("content_type", "a media type of at most 255 characters"));
        }
        let g = grant(&st, &key, Op::Put, &r.source, &r.id, path, Some(r.content_length), Some(ct.clone()));
        Ok::<_, ApiError>(signed(&st, &headers, &g, "PUT", vec![SignedHeader { name: "Content-Type".into(), value: ct }]))
    };
    run.await.map_or_else(IntoResponse::into_response, |u| axum::Json(u).into_response())
}

/// A URL to download one file.
#[utoipa::path(post, path = "/v1/files/download_url", tag = "files", request_body = FileRequest, security(("bearer" = [])),
    responses((status = 200, body = SignedUrl), (status = 400, body = crate::error::ErrorBody), (status = 401, body = crate::error::ErrorBody), (status = 404, body = crate::error::ErrorBody)))]
pub async fn download_url(State(st): State<AppState>, headers: HeaderMap, b: Body) -> Response {
    let run = async {
        let key = st.keys().authenticate(&headers)?;
        let r: FileRequest = body(&st, b).await?;
        let path = clean(r.path.as_deref().unwrap_or_default(), false)?;
        place(&key, &r.source, &r.id)?;
        let g = grant(&st, &key, Op::Get, &r.source, &r.id, path, None, None);
        Ok::<_, ApiError>(signed(&st, &headers, &g, "GET", Vec::new()))
    };
    run.await.map_or_else(IntoResponse::into_response, |u| axum::Json(u).into_response())
}

/// Lists the regular files at or below `path`.
#[utoipa::path(post, path = "/v1/files/list", tag = "files", request_body = FileRequest, security(("bearer" = [])),
    responses((status = 200, body = FileList), (status = 400, body = crate::error::ErrorBody), (status = 401, body = crate::error::ErrorBody),
        (status = 404, description = "No such thread or volume for this key", body = crate::error::ErrorBody), (status = 409, description = "The thread runs an execution", body = crate::error::ErrorBody),
        (status = 503, body = crate::error::ErrorBody)))]
pub async fn list(State(st): State<AppState>, headers: HeaderMap, b: Body) -> Response {
    let run = async {
        let key = st.keys().authenticate(&headers)?;
        let r: FileRequest = body(&st, b).await?;
        Ok::<_, ApiError>(FileAccess::new(&st, &key, &r.source, &r.id)?.list(r.path.as_deref().unwrap_or_default(), crate::request_id::of(&headers)).await?)
    };
    run.await.map_or_else(IntoResponse::into_response, |l| axum::Json(l).into_response())
}

/// Uploads the file a signed URL names: exactly its `content_length` bytes.
#[utoipa::path(put, path = "/v1/files/content/{token}", tag = "files", params(("token" = String, Path, description = "From upload_url")),
    request_body(content = Vec<u8>, content_type = "application/octet-stream"),
    responses((status = 201, description = "Stored"), (status = 400, body = crate::error::ErrorBody), (status = 403, description = "Invalid or expired URL", body = crate::error::ErrorBody),
        (status = 409, description = "The thread runs an execution", body = crate::error::ErrorBody), (status = 411, description = "Content-Length missing", body = crate::error::ErrorBody),
        (status = 413, body = crate::error::ErrorBody), (status = 503, body = crate::error::ErrorBody)))]
pub async fn put_content(State(st): State<AppState>, headers: HeaderMap, Path(tok): Path<String>, b: Body) -> Response {
    let run = async {
        let (g, key) = open(&st, &tok, Op::Put)?;
        let want = g.len.unwrap_or(0);
        let declared = headers.get(header::CONTENT_LENGTH).and_then(|v| v.to_str().ok()).and_then(|v| v.parse::<u64>().ok());
        match declared {
            None => return Err(ApiError::length_required()),
            Some(n) if n != want => return Err(ApiError::invalid("Content-Length", format!("this URL takes exactly {want} bytes"))),
            Some(_) => {}
        }
        let access = FileAccess::new(&st, &key, source_name(g.source), &g.id)?;
        // The body as it arrives; a broken or stalled body (nothing for the
        // body timeout) ends the stream early and the agent refuses the short upload.
        let data = upload_body(b, st.settings.body_timeout);
        access.write_stream(&g.path, want, data, crate::request_id::of(&headers)).await?;
        tracing::info!(key = %key.qualified_name(), source = source_name(g.source), bytes = want, "file uploaded");
        Ok::<_, ApiError>(())
    };
    match run.await {
        Ok(()) => StatusCode::CREATED.into_response(),
        Err(e) => e.into_response(),
    }
}

/// Downloads the file a signed URL names.
#[utoipa::path(get, path = "/v1/files/content/{token}", tag = "files", params(("token" = String, Path, description = "From download_url")),
    responses((status = 200, content_type = "application/octet-stream", body = Vec<u8>), (status = 403, description = "Invalid or expired URL", body = crate::error::ErrorBody),
        (status = 404, body = crate::error::ErrorBody), (status = 409, body = crate::error::ErrorBody), (status = 503, body = crate::error::ErrorBody)))]
pub async fn get_content(State(st): State<AppState>, headers: HeaderMap, Path(tok): Path<String>) -> Response {
    let run = async {
        let (g, key) = open(&st, &tok, Op::Get)?;
        let stream = FileAccess::new(&st, &key, source_name(g.source), &g.id)?.read(&g.path, crate::request_id::of(&headers)).await?;
        Ok::<_, ApiError>((g, stream))
    };
    match run.await {
        Ok::<_, ApiError>((g, stream)) => {
            let name = g.path.rsplit('/').next().unwrap_or("file").replace(['"', '\\'], "_");
            let body = Body::from_stream(stream.map(|c| c.map_err(|s| std::io::Error::other(s.message().to_string()))));
            Response::builder()
                .header(header::CONTENT_TYPE, "application/octet-stream")
                .header(header::CONTENT_DISPOSITION, format!("attachment; filename=\"{name}\""))
                .header("x-content-type-options", "nosniff")
                .body(body)
                .unwrap_or_else(|_| ApiError::unavailable("could not start the download").into_response())
        }
        Err(e) => e.into_response(),
    }
}

/// An upload's chunks, ending at the first error or after `idle` without one.
pub(crate) fn upload_body(b: Body, idle: Duration) -> futures_util::stream::BoxStream<'static, bytes::Bytes> {
    let mut chunks = b.into_data_stream();
    async_stream::stream! {
        while let Ok(Some(Ok(chunk))) = tokio::time::timeout(idle, chunks.next()).await {
            yield chunk;
        }
    }
    .boxed()
}

fn source_name(s: Source) -> &'static str {
    match s {
        Source::Thread => "thread",
        Source::Volume => "volume",
    }
}

/// The grant of a token (and its key, still valid and enabled).
fn open(st: &AppState, tok: &str, op: Op) -> Result<(Grant, std::sync::Arc<EffectiveKey>), ApiError> {
    let denied = || ApiError::forbidden("invalid_signature", "this file URL is invalid or has expired; ask for a new one");
    let g = token::verify(&st.files.signing_key.current(), tok, crate::records::now_ms() / 1000).map_err(|_| denied())?;
    if g.op != op {
        return Err(denied());
    }
    let key = st.keys().named(&g.ns, &g.key).filter(|k| !k.disabled).ok_or_else(denied)?;
    Ok((g, key))
}

#[allow(clippy::too_many_arguments)]
fn grant(st: &AppState, key: &EffectiveKey, op: Op, source: &str, id: &str, path: String, len: Option<u64>, ct: Option<String>) -> Grant {
    let source = if source == "volume" { Source::Volume } else { Source::Thread };
    let exp = crate::records::now_ms() / 1000 + st.files.ttl.as_secs() as i64;
    Grant { op, ns: key.namespace.clone(), key: key.name.clone(), source, id: id.to_string(), path, len, ct, exp }
}

fn signed(st: &AppState, headers: &HeaderMap, g: &Grant, method: &str, extra: Vec<SignedHeader>) -> SignedUrl {
    let base = st.files.public_url.clone().unwrap_or_else(|| {
        let host = headers.get(header::HOST).and_then(|v| v.to_str().ok()).unwrap_or("localhost");
        let https = headers.get("x-forwarded-proto").and_then(|v| v.to_str().ok()).is_some_and(|p| p.eq_ignore_ascii_case("https"));
        format!("{}://{host}", if https { "https" } else { "http" })
    });
    SignedUrl {
        url: format!("{}/v1/files/content/{}", base.trim_end_matches('/'), token::sign(&st.files.signing_key.current(), g)),
        method: method.into(),
        headers: extra,
        expires_at: crate::records::rfc3339(g.exp * 1000),
    }
}


/// A signed download URL for `path` of what `access` reaches (base from
/// `--public-url`, else `headers`' Host).
pub fn download_url_of(access: &FileAccess<'_>, st: &AppState, path: &str, headers: &HeaderMap) -> Result<SignedUrl, FileError> {
    let g = grant(st, access.key, Op::Get, &access.source, &access.id, clean(path, false)?, None, None);
    Ok(signed(st, headers, &g, "GET", Vec::new()))
}

/// The Files API's one reading of a refusal as HTTP.
impl From<FileError> for ApiError {
    fn from(e: FileError) -> ApiError {
        let message = e.to_string();
        match e {
            FileError::Invalid { field, message } => ApiError::invalid(field, message),
            FileError::NotFound(_) => ApiError::not_found(message),
            FileError::ThreadBusy => ApiError::conflict("thread_busy", message),
            FileError::TooLarge => ApiError::too_large_message(message),
            FileError::ThreadLimit => ApiError::forbidden("thread_limit_reached", message),
            FileError::ReadOnly => ApiError::forbidden("read_only", message),
            FileError::Unavailable(_) => ApiError::unavailable(message),
        }
    }
}
