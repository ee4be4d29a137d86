//! What one key may do with one thread or volume: the Files API's calls to
//! the node, shared by the Files API's HTTP handlers, MCP's tools, E2B's
//! envd and the console. Its refusals are [`FileError`]s, which each of
//! those edges maps to its own wire once.

use futures_util::StreamExt;
use serde::Serialize;
use utoipa::ToSchema;
use warren_config::EffectiveKey;
use warren_proto::agent as pb;

use crate::exec::spec::{placement_key, Tenant};
use crate::state::AppState;

/// Why a file operation was refused; nothing changed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum FileError {
    /// A field is invalid (`source`, `id`, `path`).
    #[error("{field}: {message}")]
    Invalid {
        /// The field.
        field: &'static str,
        /// What to fix.
        message: String,
    },
    /// No such thread, volume or file for this key.
    #[error("{0}")]
    NotFound(&'static str),
    /// An execution holds the thread.
    #[error("the thread is running an execution; retry when it finishes")]
    ThreadBusy,
    /// The thread's saved home would pass its size limit.
    #[error("the thread's saved home would exceed its size limit (threadMaxSize)")]
    TooLarge,
    /// The file would make a new thread beyond the key's `maxThreads`.
    #[error("a new thread beyond the key's maxThreads")]
    ThreadLimit,
    /// A write through a read-only mount of the volume.
    #[error("this API key's mount of the volume is ReadOnly")]
    ReadOnly,
    /// No node can serve it now; retry shortly.
    #[error("{0}")]
    Unavailable(&'static str),
}

impl FileError {
    fn invalid(field: &'static str, message: impl Into<String>) -> Self {
        FileError::Invalid { field, message: message.into() }
    }
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
pub(super) struct Place {
    target: pb::files_request::Target,
    /// Thread: its home node's placement key.
    thread: Option<String>,
    pub(super) writable: bool,
    /// Largest upload here.
    pub(super) max: u64,
}

/// What one key may do with one thread or volume.
pub struct FileAccess<'a> {
    st: &'a AppState,
    pub(super) key: &'a EffectiveKey,
    pub(super) source: String,
    pub(super) id: String,
    place: Place,
}

impl<'a> FileAccess<'a> {
    /// `source` (`thread`|`volume`) `id` of `key`; 400/404 when it has none.
    pub fn new(st: &'a AppState, key: &'a EffectiveKey, source: &str, id: &str) -> Result<FileAccess<'a>, FileError> {
        Ok(FileAccess { st, key, source: source.to_string(), id: id.to_string(), place: place(key, source, id)? })
    }

    fn node(&self) -> Result<std::sync::Arc<crate::nodes::Node>, FileError> {
        node_for(self.st, &self.place)
    }

    fn request(&self, path: String) -> pb::FilesRequest {
        pb::FilesRequest { target: Some(self.place.target.clone()), path }
    }

    /// Regular files at or below `path`.
    pub async fn list(&self, path: &str, trace: &str) -> Result<FileList, FileError> {
        let req = self.request(clean(path, true)?);
        let node = self.node()?;
        let got = node.agent().files().ok_or_else(no_files)?.list_files(req, trace).await.map_err(|s| refused(&s))?;
        let files = got.files.into_iter().map(|f| FileEntry { path: f.path, size: f.size, modified: (f.modified > 0).then(|| crate::records::rfc3339(f.modified * 1000)) }).collect();
        Ok(FileList { files, truncated: got.truncated })
    }

    /// The file's bytes as they arrive.
    pub async fn read(&self, path: &str, trace: &str) -> Result<crate::exec::agent::FileStream, FileError> {
        let req = self.request(clean(path, false)?);
        let node = self.node()?;
        node.agent().files().ok_or_else(no_files)?.read_file(req, trace).await.map_err(|s| refused(&s))
    }

    /// The whole file when it is at most `max` bytes; `None` when larger.
    pub async fn read_small(&self, path: &str, max: u64, trace: &str) -> Result<Option<Vec<u8>>, FileError> {
        let listed = self.list(path, trace).await?;
        let clean_path = clean(path, false)?;
        let Some(f) = listed.files.iter().find(|f| f.path == clean_path) else { return Err(FileError::NotFound("no such file")) };
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
    pub async fn write_stream(&self, path: &str, size: u64, data: futures_util::stream::BoxStream<'static, bytes::Bytes>, trace: &str) -> Result<(), FileError> {
        self.writable()?;
        let req = self.request(clean(path, false)?);
        let node = self.node()?;
        node.agent().files().ok_or_else(no_files)?.write_file(req, size, data, trace).await.map_err(|s| refused(&s))
    }

    /// Refuses a write through a read-only mount of the volume.
    fn writable(&self) -> Result<(), FileError> {
        if self.place.writable { Ok(()) } else { Err(FileError::ReadOnly) }
    }

    /// Removes the file at `path` (a write: refused on a read-only mount).
    pub async fn delete(&self, path: &str, trace: &str) -> Result<(), FileError> {
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
    pub async fn write(&self, path: &str, data: bytes::Bytes, trace: &str) -> Result<(), FileError> {
        let size = data.len() as u64;
        let slices: Vec<bytes::Bytes> = if data.is_empty() { vec![data] } else { data.chunks(WRITE_CHUNK).map(|c| data.slice_ref(c)).collect() };
        self.write_stream(path, size, futures_util::stream::iter(slices).boxed(), trace).await
    }

}

/// Most bytes of one message of a write held in memory.
const WRITE_CHUNK: usize = 1 << 20;

/// Where `source`/`id` is for `key`, or 400/404.
pub(super) fn place(key: &EffectiveKey, source: &str, id: &str) -> Result<Place, FileError> {
    match source {
        "thread" => {
            if !warren_core::ids::is_thread_id(id) {
                return Err(FileError::invalid("id", warren_core::ids::THREAD_ID_RULE));
            }
            let tenant = Tenant::of(key);
            let options = crate::exec::convert::thread_options(&tenant, key, id);
            Ok(Place { target: pb::files_request::Target::Thread(options), thread: Some(placement_key(&tenant, id)), writable: true, max: key.thread_max_bytes })
        }
        "volume" => {
            let mounts = key.storage.iter().filter(|m| m.provider == warren_core::kinds::Provider::Volume && m.prefix.split('/').nth(2) == Some(id));
            let best = mounts.min_by_key(|m| m.read_only).ok_or_else(|| FileError::NotFound("no such volume for this API key"))?;
            Ok(Place { target: pb::files_request::Target::VolumePrefix(best.prefix.clone()), thread: None, writable: !best.read_only, max: u64::MAX })
        }
        _ => Err(FileError::invalid("source", "thread or volume")),
    }
}

/// The node serving `place`: a thread's home, any healthy node for a volume.
fn node_for(st: &AppState, place: &Place) -> Result<std::sync::Arc<crate::nodes::Node>, FileError> {
    let node = match &place.thread {
        Some(k) => st.service.nodes.home_of(k),
        None => st.service.nodes.healthy_nodes().into_iter().next(),
    };
    node.ok_or(FileError::Unavailable("no node-agent is reachable right now; retry shortly"))
}

fn no_files() -> FileError {
    FileError::Unavailable("this node-agent does not serve files")
}

/// A path of plain names, relative (a leading `/` is dropped); empty only when listing.
pub(super) fn clean(path: &str, empty_ok: bool) -> Result<String, FileError> {
    let p = path.trim_start_matches('/');
    let bad = |why: &str| FileError::invalid("path", why);
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

/// The refusal an agent's status means.
fn refused(s: &tonic::Status) -> FileError {
    use crate::exec::refusal::{AgentRefusal, FileRefusal};
    match AgentRefusal::read(s).of_files() {
        FileRefusal::NotFound => FileError::NotFound("no such file or thread for this API key"),
        FileRefusal::ThreadBusy => FileError::ThreadBusy,
        FileRefusal::Invalid => FileError::invalid("path", s.message()),
        FileRefusal::TooLarge => FileError::TooLarge,
        FileRefusal::ThreadLimit => FileError::ThreadLimit,
        FileRefusal::Unavailable => {
            tracing::warn!(code = ?s.code(), reason = s.message(), "a file operation failed on the node");
            FileError::Unavailable("the node could not serve the file right now; retry shortly")
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
