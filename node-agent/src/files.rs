//! The Files API on the node: a thread's saved home (through the thread
//! service, so writes are saves like any execution's) or a managed volume
//! (objects below `volumes/<namespace>/<name>` in the platform store).
//! Paths are relative and made of plain names; nothing reaches outside the
//! home or the volume.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use bytes::Bytes;
use futures_util::stream::BoxStream;
use futures_util::{Stream, StreamExt, TryStreamExt};
use object_store::ObjectStore;
use tokio::io::AsyncWriteExt;

use crate::threads::files::{is_plain, HomeFile};
use crate::threads::{ThreadError, ThreadOptions, Threads};

/// Most files one listing returns.
pub const MAX_LISTED: usize = 10_000;

/// Where a file operation works.
#[derive(Debug, Clone)]
pub enum Target {
    /// A thread's saved home.
    Thread(ThreadOptions),
    /// A managed volume: its prefix in the platform store.
    Volume(String),
}

/// Why a file operation failed.
#[derive(Debug, thiserror::Error)]
pub enum FilesError {
    /// The path is not a relative path of plain names, or the prefix is not a volume's.
    #[error("{0}")]
    Invalid(&'static str),
    /// Nothing there.
    #[error("no such file")]
    NotFound,
    /// The upload's bytes did not match its declared size.
    #[error("the upload sent {got} bytes, not the {want} it declared")]
    Size {
        /// Declared.
        want: u64,
        /// Received (at least).
        got: u64,
    },
    /// The thread failed (busy, not found, too large, store down).
    #[error(transparent)]
    Thread(#[from] ThreadError),
    /// The platform store failed or is absent.
    #[error("the platform store failed: {0}")]
    Store(String),
}

/// Files over the node's threads and platform store; cheap to clone.
#[derive(Clone)]
pub struct Files {
    threads: Arc<Threads>,
    platform: Option<Arc<dyn ObjectStore>>,
}

fn check(rel: &str) -> Result<PathBuf, FilesError> {
    let p = PathBuf::from(rel);
    if rel.len() > 1024 || !is_plain(&p) {
        return Err(FilesError::Invalid("path: a relative path of plain names"));
    }
    Ok(p)
}

impl Files {
    /// Files over `threads` and `platform`.
    pub fn new(threads: Arc<Threads>, platform: Option<Arc<dyn ObjectStore>>) -> Files {
        Files { threads, platform }
    }

    fn volume(&self, prefix: &str, rel: &Path) -> Result<(Arc<dyn ObjectStore>, object_store::path::Path), FilesError> {
        let parts: Vec<&str> = prefix.trim_end_matches('/').split('/').collect();
        if parts.len() < 3 || parts[0] != "volumes" || !is_plain(Path::new(prefix.trim_end_matches('/'))) {
            return Err(FilesError::Invalid("volume_prefix: volumes/<namespace>/<name>[/…]"));
        }
        let store = self.platform.clone().ok_or_else(|| FilesError::Store("this node has no platform store".into()))?;
        let full = Path::new(prefix.trim_end_matches('/')).join(rel);
        Ok((store, object_store::path::Path::from(full.to_string_lossy().as_ref())))
    }

    /// Regular files at or below `rel`, sorted, at most [`MAX_LISTED`].
    pub async fn list(&self, target: &Target, rel: &str) -> Result<(Vec<HomeFile>, bool), FilesError> {
        let rel = if rel.is_empty() { PathBuf::new() } else { check(rel)? };
        match target {
            Target::Thread(o) => Ok(self.threads.list_files(o.clone(), &rel, MAX_LISTED).await?),
            Target::Volume(prefix) => {
                let (store, base) = self.volume(prefix, Path::new(""))?;
                let (_, at) = self.volume(prefix, &rel)?;
                let mut out = Vec::new();
                let mut listing = store.list(Some(&at));
                while let Some(meta) = listing.next().await {
                    let meta = meta.map_err(|e| FilesError::Store(e.to_string()))?;
                    if out.len() >= MAX_LISTED {
                        return Ok((out, true));
                    }
                    let path = meta.location.prefix_match(&base).map(|p| p.map(|s| s.as_ref().to_string()).collect::<Vec<_>>().join("/")).unwrap_or_default();
                    out.push(HomeFile { path, size: meta.size, modified: meta.last_modified.timestamp() });
                }
                // A single object named by the path itself.
                if out.is_empty() && !rel.as_os_str().is_empty() {
                    if let Ok(meta) = store.head(&at).await {
                        out.push(HomeFile { path: rel.to_string_lossy().into_owned(), size: meta.size, modified: meta.last_modified.timestamp() });
                    }
                }
                out.sort_by(|a, b| a.path.cmp(&b.path));
                Ok((out, false))
            }
        }
    }

    /// The file's bytes as a stream.
    pub async fn read(&self, target: &Target, rel: &str) -> Result<BoxStream<'static, std::io::Result<Bytes>>, FilesError> {
        let rel = check(rel)?;
        match target {
            Target::Thread(o) => {
                let file = self.threads.open_file(o.clone(), &rel).await?;
                Ok(tokio_util::io::ReaderStream::with_capacity(tokio::fs::File::from_std(file), 256 << 10).boxed())
            }
            Target::Volume(prefix) => {
                let (store, at) = self.volume(prefix, &rel)?;
                match store.get(&at).await {
                    Ok(r) => Ok(r.into_stream().map_err(std::io::Error::other).boxed()),
                    Err(object_store::Error::NotFound { .. }) => Err(FilesError::NotFound),
                    Err(e) => Err(FilesError::Store(e.to_string())),
                }
            }
        }
    }

    /// Removes the regular file at `rel`.
    pub async fn delete(&self, target: &Target, rel: &str) -> Result<(), FilesError> {
        let rel = check(rel)?;
        if rel.as_os_str().is_empty() {
            return Err(FilesError::Invalid("path: required"));
        }
        match target {
            Target::Thread(o) => self.threads.delete_file(o.clone(), &rel).await.map(drop).map_err(FilesError::from),
            Target::Volume(prefix) => {
                let (store, at) = self.volume(prefix, &rel)?;
                match store.head(&at).await {
                    Ok(_) => store.delete(&at).await.map_err(|e| FilesError::Store(e.to_string())),
                    Err(object_store::Error::NotFound { .. }) => Err(FilesError::NotFound),
                    Err(e) => Err(FilesError::Store(e.to_string())),
                }
            }
        }
    }

    /// Stores exactly `size` bytes from `chunks` at `rel`.
    pub async fn write(&self, target: &Target, rel: &str, size: u64, chunks: impl Stream<Item = Result<Bytes, FilesError>> + Send + Unpin) -> Result<(), FilesError> {
        let rel = check(rel)?;
        if rel.as_os_str().is_empty() {
            return Err(FilesError::Invalid("path: required"));
        }
        match target {
            Target::Thread(o) => {
                let staged = self.threads.stage(&rel)?;
                let file = staged.file.try_clone().map_err(|e| FilesError::Store(e.to_string()))?;
                let mut out = tokio::fs::File::from_std(file);
                copy_exact(chunks, size, &mut out).await?;
                out.flush().await.map_err(|e| FilesError::Store(e.to_string()))?;
                drop(out);
                staged.file.sync_all().map_err(|e| FilesError::Store(e.to_string()))?;
                self.threads.save_staged(o.clone(), staged).await?;
                Ok(())
            }
            Target::Volume(prefix) => {
                let (store, at) = self.volume(prefix, &rel)?;
                let mut out = object_store::buffered::BufWriter::new(store, at);
                match copy_exact(chunks, size, &mut out).await {
                    Ok(()) => out.shutdown().await.map_err(|e| FilesError::Store(e.to_string())),
                    Err(e) => {
                        // Nothing partial is published.
                        let _ = out.abort().await;
                        Err(e)
                    }
                }
            }
        }
    }
}

/// Copies `chunks` into `out`, refusing more or fewer than `size` bytes.
async fn copy_exact(mut chunks: impl Stream<Item = Result<Bytes, FilesError>> + Unpin, size: u64, out: &mut (impl tokio::io::AsyncWrite + Unpin)) -> Result<(), FilesError> {
    let mut got = 0u64;
    while let Some(chunk) = chunks.next().await {
        let chunk = chunk?;
        got += chunk.len() as u64;
        if got > size {
            return Err(FilesError::Size { want: size, got });
        }
        out.write_all(&chunk).await.map_err(|e| FilesError::Store(e.to_string()))?;
    }
    if got != size {
        return Err(FilesError::Size { want: size, got });
    }
    Ok(())
}
