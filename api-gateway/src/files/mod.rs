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
use warren_proto::agent as pb;

use crate::error::ApiError;
use crate::exec::spec::{placement_key, Tenant};
use crate::state::AppState;
use crate::file_urls::token::{self, Grant, Op, Source};
pub use crate::file_urls::Settings;


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

/// One file.
#[derive(Debug, Serialize, ToSchema)]
pub struct FileEntry {
    /// Path relative to the home or volume.
    pub path: String,
    /// Bytes.
    pub size: u64,
    /// Last change (RFC 3339).
    pub modified: Option<String>,
}

/// A listing.
#[derive(Debug, Serialize, ToSchema)]
pub struct FileList {
    /// Regular files, sorted by path.
    pub files: Vec<FileEntry>,
    /// More files exist than were listed (10 000 at most).
    pub truncated: bool,
}

/// What a key may do with one file location.
#[derive(Clone)]
struct Place {
    target: pb::files_request::Target,
    /// Thread: its home node's placement key.
    thread: Option<String>,
    writable: bool,
    /// Largest upload here.
    max: u64,
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
            return Err(read_only());
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
        FileAccess::new(&st, &key, &r.source, &r.id)?.list(r.path.as_deref().unwrap_or_default(), crate::request_id::of(&headers)).await
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

/// What one key may do with one thread or volume: the Files API's calls to
/// the node, shared by the HTTP handlers and the MCP tools.
pub struct FileAccess<'a> {
    st: &'a AppState,
    key: &'a EffectiveKey,
    source: String,
    id: String,
    place: Place,
}

impl<'a> FileAccess<'a> {
    /// `source` (`thread`|`volume`) `id` of `key`; 400/404 when it has none.
    pub fn new(st: &'a AppState, key: &'a EffectiveKey, source: &str, id: &str) -> Result<FileAccess<'a>, ApiError> {
        Ok(FileAccess { st, key, source: source.to_string(), id: id.to_string(), place: place(key, source, id)? })
    }

    fn node(&self) -> Result<std::sync::Arc<crate::nodes::Node>, ApiError> {
        node_for(self.st, &self.place)
    }

    fn request(&self, path: String) -> pb::FilesRequest {
        pb::FilesRequest { target: Some(self.place.target.clone()), path }
    }

    /// Regular files at or below `path`.
    pub async fn list(&self, path: &str, trace: &str) -> Result<FileList, ApiError> {
        let req = self.request(clean(path, true)?);
        let node = self.node()?;
        let got = node.agent().files().ok_or_else(no_files)?.list_files(req, trace).await.map_err(|s| refused(&s))?;
        let files = got.files.into_iter().map(|f| FileEntry { path: f.path, size: f.size, modified: (f.modified > 0).then(|| crate::records::rfc3339(f.modified * 1000)) }).collect();
        Ok(FileList { files, truncated: got.truncated })
    }

    /// The file's bytes as they arrive.
    pub async fn read(&self, path: &str, trace: &str) -> Result<crate::exec::agent::FileStream, ApiError> {
        let req = self.request(clean(path, false)?);
        let node = self.node()?;
        node.agent().files().ok_or_else(no_files)?.read_file(req, trace).await.map_err(|s| refused(&s))
    }

    /// The whole file when it is at most `max` bytes; `None` when larger.
    pub async fn read_small(&self, path: &str, max: u64, trace: &str) -> Result<Option<Vec<u8>>, ApiError> {
        let listed = self.list(path, trace).await?;
        let clean_path = clean(path, false)?;
        let Some(f) = listed.files.iter().find(|f| f.path == clean_path) else { return Err(ApiError::not_found("no such file")) };
        if f.size > max {
            return Ok(None);
        }
        let mut out = Vec::with_capacity(f.size as usize);
        let mut stream = self.read(path, trace).await?;
        while let Some(chunk) = stream.next().await {
            out.extend_from_slice(&chunk.map_err(|s| refused(&s))?);
            if out.len() as u64 > max {
                return Ok(None);
            }
        }
        Ok(Some(out))
    }

    /// Stores `size` bytes from `data` at `path`.
    pub async fn write_stream(&self, path: &str, size: u64, data: futures_util::stream::BoxStream<'static, bytes::Bytes>, trace: &str) -> Result<(), ApiError> {
        self.writable()?;
        let req = self.request(clean(path, false)?);
        let node = self.node()?;
        node.agent().files().ok_or_else(no_files)?.write_file(req, size, data, trace).await.map_err(|s| refused(&s))
    }

    /// Refuses a write through a read-only mount of the volume.
    fn writable(&self) -> Result<(), ApiError> {
        if self.place.writable { Ok(()) } else { Err(read_only()) }
    }

    /// Removes the file at `path` (a write: refused on a read-only mount).
    pub async fn delete(&self, path: &str, trace: &str) -> Result<(), ApiError> {
        self.writable()?;
        let req = self.request(clean(path, false)?);
        let node = self.node()?;
        node.agent().files().ok_or_else(no_files)?.delete_file(req, trace).await.map_err(|s| refused(&s))
    }

    /// The largest file this key may store here, bytes.
    pub fn max_upload(&self) -> u64 {
        self.place.max.min(self.st.files.max_upload)
    }

    /// Stores `data` at `path`, sent in slices of [`WRITE_CHUNK`] (no copy):
    /// the agent takes gRPC messages of 4 MiB at most.
    pub async fn write(&self, path: &str, data: bytes::Bytes, trace: &str) -> Result<(), ApiError> {
        let size = data.len() as u64;
        let slices: Vec<bytes::Bytes> = if data.is_empty() { vec![data] } else { data.chunks(WRITE_CHUNK).map(|c| data.slice_ref(c)).collect() };
        self.write_stream(path, size, futures_util::stream::iter(slices).boxed(), trace).await
    }

    /// A signed download URL (base from `--public-url`, else `headers`' Host).
    pub fn download_url(&self, path: &str, headers: &HeaderMap) -> Result<SignedUrl, ApiError> {
        let g = grant(self.st, self.key, Op::Get, &self.source, &self.id, clean(path, false)?, None, None);
        Ok(signed(self.st, headers, &g, "GET", Vec::new()))
    }
}

/// Most bytes of one message of a write held in memory.
const WRITE_CHUNK: usize = 1 << 20;

/// Where `source`/`id` is for `key`, or 400/404.
fn place(key: &EffectiveKey, source: &str, id: &str) -> Result<Place, ApiError> {
    match source {
        "thread" => {
            if !warren_core::ids::is_thread_id(id) {
                return Err(ApiError::invalid("id", warren_core::ids::THREAD_ID_RULE));
            }
            let tenant = Tenant::of(key);
            let options = pb::ThreadOptions {
                r#ref: Some(crate::exec::convert::thread_ref(&tenant, id)),
                retention_seconds: key.thread_retention.duration().map_or(0, |d| d.as_secs()),
                max_bytes: key.thread_max_bytes,
                max_threads: key.max_threads,
            };
            Ok(Place { target: pb::files_request::Target::Thread(options), thread: Some(placement_key(&tenant, id)), writable: true, max: key.thread_max_bytes })
        }
        "volume" => {
            let mounts = key.storage.iter().filter(|m| m.provider == warren_core::kinds::Provider::Volume && m.prefix.split('/').nth(2) == Some(id));
            let best = mounts.min_by_key(|m| m.read_only).ok_or_else(|| ApiError::not_found("no such volume for this API key"))?;
            Ok(Place { target: pb::files_request::Target::VolumePrefix(best.prefix.clone()), thread: None, writable: !best.read_only, max: u64::MAX })
        }
        _ => Err(ApiError::invalid("source", "thread or volume")),
    }
}

/// The node serving `place`: a thread's home, any healthy node for a volume.
fn node_for(st: &AppState, place: &Place) -> Result<std::sync::Arc<crate::nodes::Node>, ApiError> {
    let node = match &place.thread {
        Some(k) => st.service.nodes.home_of(k),
        None => st.service.nodes.healthy_nodes().into_iter().next(),
    };
    node.ok_or_else(|| ApiError::unavailable("no node-agent is reachable right now; retry shortly"))
}

fn read_only() -> ApiError {
    ApiError::forbidden("read_only", "this API key's mount of the volume is ReadOnly")
}

fn no_files() -> ApiError {
    ApiError::unavailable("this node-agent does not serve files")
}

/// A path of plain names, relative (a leading `/` is dropped); empty only when listing.
fn clean(path: &str, empty_ok: bool) -> Result<String, ApiError> {
    let p = path.trim_start_matches('/');
    let bad = |why: &str| ApiError::invalid("path", why.to_string());
    if p.is_empty() {
        return if empty_ok { Ok(String::new()) } else { Err(bad("required")) };
    }
    if p.len() > 1024 || p.split('/').count() > 64 {
        return Err(bad("at most 1024 characters and 64 segments"));
    }
    for seg in p.trim_end_matches('/').split('/') {
        if seg.is_empty() || seg == "." || seg == ".." || seg.len() > 255 || seg.chars().any(|c| c.is_control() || c == '\\') {
            return Err(bad("plain names separated by '/': no '.', '..', empty segments, backslashes or control characters"));
        }
    }
    Ok(p.trim_end_matches('/').to_string())
}

/// The HTTP error of an agent's refusal.
fn refused(s: &tonic::Status) -> ApiError {
    use crate::exec::refusal::{AgentRefusal, FileRefusal};
    match AgentRefusal::read(s).of_files() {
        FileRefusal::NotFound => ApiError::not_found("no such file or thread for this API key"),
        FileRefusal::ThreadBusy => ApiError::conflict("thread_busy", "the thread is running an execution; retry when it finishes"),
        FileRefusal::Invalid => ApiError::invalid("path", s.message().to_string()),
        FileRefusal::TooLarge => ApiError::too_large_message("the thread's saved home would exceed its size limit (threadMaxSize)"),
        FileRefusal::ThreadLimit => ApiError::forbidden("thread_limit_reached", "a new thread beyond the key's maxThreads"),
        FileRefusal::Unavailable => {
            tracing::warn!(code = ?s.code(), reason = s.message(), "a file operation failed on the node");
            ApiError::unavailable("the node could not serve the file right now; retry shortly")
        }
    }
}

#[cfg(test)]
mod tests {
    use super::clean;

    #[test]
    fn paths_are_plain_and_relative() {
        assert_eq!(clean("/in/a.csv", false).unwrap(), "in/a.csv");
        assert_eq!(clean("dir/", true).unwrap(), "dir");
        assert_eq!(clean("", true).unwrap(), "");
        for bad in ["", "../etc/passwd", "a/../../b", "a//b", "./a", "a\\b", "a/\u{0}b"] {
            assert!(clean(bad, false).is_err(), "{bad:?}");
        }
    }
}
