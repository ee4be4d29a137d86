//! Where threads are durable: a local directory (single machine) or an
//! S3-compatible bucket (cluster). Both publish atomically — an object is
//! either absent or complete, never partly written — and both are durable
//! when a put returns.

use std::io::{self, Read, Write};
use std::path::{Component, Path, PathBuf};
use std::sync::Arc;
use std::time::SystemTime;

use bytes::Bytes;
use futures_util::future::BoxFuture;
use futures_util::{FutureExt, StreamExt};
use object_store::{ObjectStore, PutPayload};

/// One stored object.
#[derive(Debug, Clone)]
pub struct Listed {
    /// Its key.
    pub key: String,
    /// When it was written.
    pub modified: SystemTime,
}

/// Version of a stored object, as compare-and-swap needs it: its ETag in
/// S3, a content hash in a directory store.
pub type Version = String;

/// A store of immutable-once-written objects.
pub trait BlobStore: Send + Sync {
    /// The object, or `None` when there is none.
    fn get(&self, key: &str) -> BoxFuture<'_, io::Result<Option<Bytes>>>;
    /// The object and its version.
    fn get_versioned(&self, key: &str) -> BoxFuture<'_, io::Result<Option<(Bytes, Version)>>>;
    /// Writes `data` under `key` only if the object is still at `expected`
    /// (`None`: only if there is none). `Ok(false)`: someone else changed it
    /// and nothing was written. Durable on `Ok(true)`.
    fn put_if(&self, key: &str, data: Bytes, expected: Option<Version>) -> BoxFuture<'_, io::Result<bool>>;
    /// Moves the file at `path` (a spool file the caller no longer needs)
    /// under `key`; durable on return.
    fn put_file(&self, key: &str, path: &Path) -> BoxFuture<'_, io::Result<()>>;
    /// Makes the object readable as a local file without holding it in
    /// memory: the stored file itself for a local store, else a download
    /// into `spool` (which the caller removes). `None` when absent.
    fn fetch(&self, key: &str, spool: &Path) -> BoxFuture<'_, io::Result<Option<PathBuf>>>;
    /// Removes `key` (absent is fine).
    fn delete(&self, key: &str) -> BoxFuture<'_, io::Result<()>>;
    /// Every object whose key starts with `prefix` (a `/`-terminated folder).
    fn list(&self, prefix: &str) -> BoxFuture<'_, io::Result<Vec<Listed>>>;
    /// The names of the folders directly under `prefix` (`/`-terminated),
    /// without listing what they hold.
    fn list_folders(&self, prefix: &str) -> BoxFuture<'_, io::Result<Vec<String>>>;
    /// A directory on the same filesystem as the store, if it is local:
    /// spooling there makes `put_file` a rename.
    fn spool_dir(&self) -> Option<PathBuf> {
        None
    }
    /// Short description for logs.
    fn describe(&self) -> String;
}

/// Objects as files under a root directory.
pub struct DirStore {
    root: PathBuf,
}

fn key_path(root: &Path, key: &str) -> io::Result<PathBuf> {
    let rel = Path::new(key);
    if key.is_empty() || !rel.components().all(|c| matches!(c, Component::Normal(_))) {
        return Err(io::Error::new(io::ErrorKind::InvalidInput, format!("bad object key {key:?}")));
    }
    Ok(root.join(rel))
}

fn fsync_dir(dir: &Path) -> io::Result<()> {
    std::fs::File::open(dir)?.sync_all()
}

impl DirStore {
    /// A store rooted at `root` (created 0700).
    pub fn open(root: &Path) -> io::Result<DirStore> {
        use std::os::unix::fs::DirBuilderExt;
        std::fs::DirBuilder::new().recursive(true).mode(0o700).create(root.join(".spool"))?;
        Ok(DirStore { root: root.to_path_buf() })
    }

    /// `fsync`s `tmp` and renames it to `key`, then makes the rename durable.
    fn publish(&self, key: &str, tmp: &Path) -> io::Result<()> {
        let dst = key_path(&self.root, key)?;
        let parent = dst.parent().unwrap_or(&self.root).to_path_buf();
        std::fs::create_dir_all(&parent)?;
        std::fs::File::open(tmp)?.sync_all()?;
        std::fs::rename(tmp, &dst)?;
        fsync_dir(&parent)
    }

    fn spool_file(&self) -> PathBuf {
        self.root.join(".spool").join(format!("{:032x}", rand::random::<u128>()))
    }
}

/// A directory store's object version: the SHA-256 of its content.
fn content_version(data: &[u8]) -> Version {
    use sha2::Digest;
    sha2::Sha256::digest(data).iter().map(|b| format!("{b:02x}")).collect()
}

fn blocking<T: Send + 'static>(f: impl FnOnce() -> io::Result<T> + Send + 'static) -> BoxFuture<'static, io::Result<T>> {
    async move { tokio::task::spawn_blocking(f).await.map_err(io::Error::other)? }.boxed()
}

impl BlobStore for DirStore {
    fn get(&self, key: &str) -> BoxFuture<'_, io::Result<Option<Bytes>>> {
        let path = key_path(&self.root, key);
        blocking(move || match std::fs::read(path?) {
            Ok(b) => Ok(Some(Bytes::from(b))),
            Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(None),
            Err(e) => Err(e),
        })
    }

    fn get_versioned(&self, key: &str) -> BoxFuture<'_, io::Result<Option<(Bytes, Version)>>> {
        let get = self.get(key);
        async move { Ok(get.await?.map(|b| { let v = content_version(&b); (b, v) })) }.boxed()
    }

    fn put_if(&self, key: &str, data: Bytes, expected: Option<Version>) -> BoxFuture<'_, io::Result<bool>> {
        let (key, tmp, lock) = (key.to_string(), self.spool_file(), self.root.join(".spool/.publish.lock"));
        let dst = key_path(&self.root, &key);
        let root = self.root.clone();
        blocking(move || {
            let dst = dst?;
            let mut f = std::fs::File::create(&tmp)?;
            f.write_all(&data)?;
            f.sync_all()?;
            // One writer at a time between reading the current version and
            // renaming over it, across every process sharing the directory.
            let lock = std::fs::OpenOptions::new().create(true).truncate(false).write(true).open(lock)?;
            let _held = nix::fcntl::Flock::lock(lock, nix::fcntl::FlockArg::LockExclusive).map_err(|(_, e)| io::Error::from(e))?;
            let current = match std::fs::read(&dst) {
                Ok(b) => Some(content_version(&b)),
                Err(e) if e.kind() == io::ErrorKind::NotFound => None,
                Err(e) => return Err(e),
            };
            if current != expected {
                let _ = std::fs::remove_file(&tmp);
                return Ok(false);
            }
            let parent = dst.parent().unwrap_or(&root).to_path_buf();
            std::fs::create_dir_all(&parent)?;
            std::fs::rename(&tmp, &dst)?;
            fsync_dir(&parent)?;
            Ok(true)
        })
    }

    fn fetch(&self, key: &str, _spool: &Path) -> BoxFuture<'_, io::Result<Option<PathBuf>>> {
        let path = key_path(&self.root, key);
        async move {
            let path = path?;
            Ok(path.is_file().then_some(path))
        }
        .boxed()
    }

    fn put_file(&self, key: &str, path: &Path) -> BoxFuture<'_, io::Result<()>> {
        let (key, path) = (key.to_string(), path.to_path_buf());
        async move {
            let tmp = self.spool_file();
            // Same filesystem (the caller spooled in spool_dir): a rename.
            if std::fs::rename(&path, &tmp).is_err() {
                std::fs::copy(&path, &tmp)?;
                let _ = std::fs::remove_file(&path);
            }
            let r = self.publish(&key, &tmp);
            if r.is_err() {
                let _ = std::fs::remove_file(&tmp);
            }
            r
        }
        .boxed()
    }

    fn delete(&self, key: &str) -> BoxFuture<'_, io::Result<()>> {
        let path = key_path(&self.root, key);
        blocking(move || match std::fs::remove_file(path?) {
            Err(e) if e.kind() != io::ErrorKind::NotFound => Err(e),
            _ => Ok(()),
        })
    }

    fn list(&self, prefix: &str) -> BoxFuture<'_, io::Result<Vec<Listed>>> {
        let (root, prefix) = (self.root.clone(), prefix.trim_end_matches('/').to_string());
        blocking(move || {
            let mut out = Vec::new();
            let start = key_path(&root, &prefix)?;
            walk(&root, &start, &mut out)?;
            Ok(out)
        })
    }

    fn list_folders(&self, prefix: &str) -> BoxFuture<'_, io::Result<Vec<String>>> {
        let (root, prefix) = (self.root.clone(), prefix.trim_end_matches('/').to_string());
        blocking(move || {
            let entries = match std::fs::read_dir(key_path(&root, &prefix)?) {
                Ok(e) => e,
                Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(Vec::new()),
                Err(e) => return Err(e),
            };
            let mut out = Vec::new();
            for entry in entries {
                let entry = entry?;
                // Not following links: the store only ever makes directories.
                if entry.file_type()?.is_dir() {
                    out.extend(entry.file_name().to_str().map(str::to_string));
                }
            }
            Ok(out)
        })
    }

    fn spool_dir(&self) -> Option<PathBuf> {
        Some(self.root.join(".spool"))
    }

    fn describe(&self) -> String {
        format!("dir:{}", self.root.display())
    }
}

fn walk(root: &Path, dir: &Path, out: &mut Vec<Listed>) -> io::Result<()> {
    let entries = match std::fs::read_dir(dir) {
        Ok(e) => e,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(()),
        Err(e) => return Err(e),
    };
    for entry in entries {
        let entry = entry?;
        let meta = entry.metadata()?;
        if meta.is_dir() {
            walk(root, &entry.path(), out)?;
        } else if let Ok(rel) = entry.path().strip_prefix(root) {
            out.push(Listed { key: rel.to_string_lossy().into_owned(), modified: meta.modified()? });
        }
    }
    // Empty folders left by deletes go away with the walk.
    if dir != root {
        let _ = std::fs::remove_dir(dir);
    }
    Ok(())
}

/// Objects in an S3-compatible bucket (through `object_store`).
pub struct S3Store {
    inner: Arc<dyn ObjectStore>,
    url: String,
}

/// Above this, uploads go in parts.
const SINGLE_PUT_MAX: u64 = 32 << 20;
const PART: usize = 16 << 20;

impl S3Store {
    /// A store for `s3://bucket`, configured from the standard `AWS_*`
    /// variables (`AWS_ENDPOINT`, `AWS_REGION`, `AWS_ACCESS_KEY_ID`,
    /// `AWS_SECRET_ACCESS_KEY`, `AWS_ALLOW_HTTP`, …). `pool_max_idle`
    /// caps idle keep-alive connections (0: a fresh connection per request,
    /// for servers that answer reused connections slowly).
    pub fn from_env(url: &str, pool_max_idle: Option<usize>) -> io::Result<S3Store> {
        Ok(S3Store { inner: Arc::new(s3_client(url, pool_max_idle)?), url: url.to_string() })
    }
}

fn s3_client(url: &str, pool_max_idle: Option<usize>) -> io::Result<object_store::aws::AmazonS3> {
    use object_store::aws::AmazonS3ConfigKey;
    use object_store::ClientConfigKey;
    // A store outage must fail a call within seconds (thread_mount_error,
    // or thread_save_error keeping the old state), not hold it for the
    // client's default three minutes of retries.
    let retry = object_store::RetryConfig { backoff: Default::default(), max_retries: 3, retry_timeout: std::time::Duration::from_secs(15) };
    let mut builder = object_store::aws::AmazonS3Builder::from_env().with_url(url).with_retry(retry);
    if let Some(n) = pool_max_idle {
        builder = builder.with_config(AmazonS3ConfigKey::Client(ClientConfigKey::PoolMaxIdlePerHost), n.to_string());
    }
    builder.build().map_err(io::Error::other)
}

/// The store named by `--thread-store` as a storage-mount backend: managed
/// volumes live in it, below `volumes/` (threads are below `threads/`).
pub fn volume_backend(spec: &str, s3_pool_max_idle: Option<usize>) -> io::Result<warren_storage::stores::Backend> {
    use sha2::Digest;
    let id: [u8; 32] = sha2::Sha256::new().chain_update(b"platform store\0").chain_update(spec.as_bytes()).finalize().into();
    if let Some(path) = spec.strip_prefix("dir:") {
        std::fs::create_dir_all(Path::new(path).join("volumes"))?;
        let local = object_store::local::LocalFileSystem::new_with_prefix(path).map_err(io::Error::other)?;
        return Ok(warren_storage::stores::Backend { store: Arc::new(local), pager: None, id, cacheable: false });
    }
    if spec.starts_with("s3://") {
        let s3 = Arc::new(s3_client(spec, s3_pool_max_idle)?);
        return Ok(warren_storage::stores::Backend { store: s3.clone(), pager: Some(s3), id, cacheable: true });
    }
    Err(io::Error::new(io::ErrorKind::InvalidInput, format!("thread store {spec:?}: expected dir:PATH or s3://BUCKET")))
}

fn os_err(e: object_store::Error) -> io::Error {
    io::Error::other(e.to_string())
}

impl BlobStore for S3Store {
    fn get(&self, key: &str) -> BoxFuture<'_, io::Result<Option<Bytes>>> {
        let path = object_store::path::Path::from(key);
        async move {
            match self.inner.get(&path).await {
                Ok(r) => Ok(Some(r.bytes().await.map_err(os_err)?)),
                Err(object_store::Error::NotFound { .. }) => Ok(None),
                Err(e) => Err(os_err(e)),
            }
        }
        .boxed()
    }

    fn get_versioned(&self, key: &str) -> BoxFuture<'_, io::Result<Option<(Bytes, Version)>>> {
        let path = object_store::path::Path::from(key);
        async move {
            match self.inner.get(&path).await {
                Ok(r) => {
                    let etag = r.meta.e_tag.clone().ok_or_else(|| io::Error::other("the S3 store returned no ETag; conditional updates need one"))?;
                    Ok(Some((r.bytes().await.map_err(os_err)?, etag)))
                }
                Err(object_store::Error::NotFound { .. }) => Ok(None),
                Err(e) => Err(os_err(e)),
            }
        }
        .boxed()
    }

    fn put_if(&self, key: &str, data: Bytes, expected: Option<Version>) -> BoxFuture<'_, io::Result<bool>> {
        let path = object_store::path::Path::from(key);
        async move {
            let mode = match expected {
                None => object_store::PutMode::Create,
                Some(e_tag) => object_store::PutMode::Update(object_store::UpdateVersion { e_tag: Some(e_tag), version: None }),
            };
            let opts = object_store::PutOptions { mode, ..Default::default() };
            match self.inner.put_opts(&path, PutPayload::from(data), opts).await {
                Ok(_) => Ok(true),
                Err(object_store::Error::Precondition { .. } | object_store::Error::AlreadyExists { .. }) => Ok(false),
                Err(e) => Err(os_err(e)),
            }
        }
        .boxed()
    }

    fn fetch(&self, key: &str, spool: &Path) -> BoxFuture<'_, io::Result<Option<PathBuf>>> {
        let (path, spool) = (object_store::path::Path::from(key), spool.to_path_buf());
        async move {
            let mut stream = match self.inner.get(&path).await {
                Ok(r) => r.into_stream(),
                Err(object_store::Error::NotFound { .. }) => return Ok(None),
                Err(e) => return Err(os_err(e)),
            };
            let mut file = tokio::fs::File::create(&spool).await?;
            while let Some(chunk) = stream.next().await {
                tokio::io::AsyncWriteExt::write_all(&mut file, &chunk.map_err(os_err)?).await?;
            }
            tokio::io::AsyncWriteExt::flush(&mut file).await?;
            Ok(Some(spool))
        }
        .boxed()
    }

    fn put_file(&self, key: &str, file: &Path) -> BoxFuture<'_, io::Result<()>> {
        let (path, file) = (object_store::path::Path::from(key), file.to_path_buf());
        async move {
            let size = std::fs::metadata(&file)?.len();
            if size <= SINGLE_PUT_MAX {
                let data = tokio::fs::read(&file).await?;
                self.inner.put(&path, PutPayload::from(data)).await.map_err(os_err)?;
            } else {
                let upload = self.inner.put_multipart(&path).await.map_err(os_err)?;
                let mut writer = object_store::WriteMultipart::new_with_chunk_size(upload, PART);
                let mut f = std::fs::File::open(&file)?;
                let mut buf = vec![0u8; PART];
                loop {
                    let n = f.read(&mut buf)?;
                    if n == 0 {
                        break;
                    }
                    writer.wait_for_capacity(2).await.map_err(os_err)?;
                    writer.write(&buf[..n]);
                }
                writer.finish().await.map_err(os_err)?;
            }
            let _ = std::fs::remove_file(&file);
            Ok(())
        }
        .boxed()
    }

    fn delete(&self, key: &str) -> BoxFuture<'_, io::Result<()>> {
        let path = object_store::path::Path::from(key);
        async move {
            match self.inner.delete(&path).await {
                Ok(()) | Err(object_store::Error::NotFound { .. }) => Ok(()),
                Err(e) => Err(os_err(e)),
            }
        }
        .boxed()
    }

    fn list(&self, prefix: &str) -> BoxFuture<'_, io::Result<Vec<Listed>>> {
        let prefix = object_store::path::Path::from(prefix.trim_end_matches('/'));
        async move {
            let mut out = Vec::new();
            let mut stream = self.inner.list(Some(&prefix));
            while let Some(meta) = stream.next().await {
                let meta = meta.map_err(os_err)?;
                out.push(Listed { key: meta.location.to_string(), modified: meta.last_modified.into() });
            }
            Ok(out)
        }
        .boxed()
    }

    fn list_folders(&self, prefix: &str) -> BoxFuture<'_, io::Result<Vec<String>>> {
        let prefix = object_store::path::Path::from(prefix.trim_end_matches('/'));
        async move {
            let listed = self.inner.list_with_delimiter(Some(&prefix)).await.map_err(os_err)?;
            Ok(listed.common_prefixes.iter().filter_map(|p| p.filename().map(str::to_string)).collect())
        }
        .boxed()
    }

    fn describe(&self) -> String {
        self.url.clone()
    }
}

/// Opens the store named by `--thread-store`: `dir:PATH` or `s3://BUCKET`.
pub fn open(spec: &str, s3_pool_max_idle: Option<usize>) -> io::Result<Arc<dyn BlobStore>> {
    if let Some(path) = spec.strip_prefix("dir:") {
        return Ok(Arc::new(DirStore::open(Path::new(path))?));
    }
    if spec.starts_with("s3://") {
        return Ok(Arc::new(S3Store::from_env(spec, s3_pool_max_idle)?));
    }
    Err(io::Error::new(io::ErrorKind::InvalidInput, format!("thread store {spec:?}: expected dir:PATH or s3://BUCKET")))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn directory_store_compare_and_swap() {
        let dir = tempfile::tempdir().unwrap();
        let store = DirStore::open(dir.path()).unwrap();
        let key = "threads/ns/k/t/manifest.json";
        assert!(store.put_if(key, Bytes::from_static(b"one"), None).await.unwrap(), "create when absent");
        assert!(!store.put_if(key, Bytes::from_static(b"two"), None).await.unwrap(), "create refused when present");
        let (data, v1) = store.get_versioned(key).await.unwrap().unwrap();
        assert_eq!(&data[..], b"one");
        assert!(store.put_if(key, Bytes::from_static(b"two"), Some(v1.clone())).await.unwrap());
        assert!(!store.put_if(key, Bytes::from_static(b"three"), Some(v1)).await.unwrap(), "a stale version loses");
        assert_eq!(&store.get(key).await.unwrap().unwrap()[..], b"two");
        assert!(store.put_if("../escape", Bytes::new(), None).await.is_err());
        assert_eq!(std::fs::read_dir(dir.path().join(".spool")).unwrap().filter(|e| !e.as_ref().unwrap().file_name().to_string_lossy().starts_with(".publish")).count(), 0, "no spool left");
    }
}
