//! `Local` storage: a directory of the node, which only an admin may grant.
//!
//! A tenant names the directory in its StorageConnection, so the agent
//! serves one only when it lies beneath a root the platform allowed
//! (`--local-storage-root`, chart `nodeAgent.localStorageRoots`), and no
//! allowed root may overlap the agent's own state or the system's
//! directories. Inside the directory nothing is resolved the usual way:
//! every key is checked with `openat2(RESOLVE_BENEATH | RESOLVE_NO_SYMLINKS |
//! RESOLVE_NO_XDEV)` from a descriptor of the mount's directory
//! ([`warren_confined::Dir::lookup`]) before the file store touches it, and listings drop whatever is reached through a
//! symlink. Files written through a mount are plain files and directories,
//! so a symlink there was put by someone on the node itself.

use std::fmt;
use std::path::{Component, Path as FsPath, PathBuf};
use std::sync::Arc;

use futures_util::stream::{BoxStream, StreamExt};
use warren_confined::Dir;
use object_store::local::LocalFileSystem;
use object_store::path::Path;
use object_store::{GetOptions, GetResult, ListResult, MultipartUpload, ObjectMeta, ObjectStore, PutMultipartOptions, PutOptions, PutPayload, PutResult, Result};

/// Paths no allowed root may equal, hold or lie inside, whatever the
/// agent's configuration ("/" itself only may not be a root).
pub const SYSTEM_PATHS: &[&str] = &["/etc", "/proc", "/sys", "/dev", "/run", "/var/run", "/boot", "/root", "/usr", "/bin", "/sbin", "/lib", "/lib64", "/var/lib/kubelet"];

/// The roots an admin allowed Local mounts beneath.
#[derive(Debug, Clone, Default)]
pub struct LocalRoots {
    roots: Vec<PathBuf>,
}

/// Segment-wise containment: `a/b` holds `a/b/c`, not `a/bc`.
fn within(inner: &FsPath, outer: &FsPath) -> bool {
    inner.starts_with(outer)
}

/// `/a/b`: absolute, no empty, `.` or `..` segment, no trailing slash
/// (checked on the bytes: `Path::components` hides `.` and `//`).
fn plain_absolute(p: &FsPath) -> bool {
    use std::os::unix::ffi::OsStrExt;
    let b = p.as_os_str().as_bytes();
    b == b"/" || (b.first() == Some(&b'/') && b[1..].split(|c| *c == b'/').all(|s| !s.is_empty() && s != b"." && s != b".."))
}

impl LocalRoots {
    /// No Local mount is allowed (the default).
    pub fn none() -> LocalRoots {
        LocalRoots::default()
    }

    /// Checks the roots an admin allowed: each an existing directory named
    /// by its real path (no symlink, no `..`), not `/`, and neither holding
    /// nor inside any of [`SYSTEM_PATHS`] or `reserved` (the agent's state,
    /// image and thread stores, its token and run directories).
    pub fn new(roots: &[PathBuf], reserved: &[PathBuf]) -> std::result::Result<LocalRoots, String> {
        let mut kept = Vec::new();
        for root in roots {
            let shown = root.display();
            if !plain_absolute(root) || root.as_os_str() == "/" {
                return Err(format!("local storage root {shown}: must be an absolute directory other than / with no . or .. segments"));
            }
            let real = std::fs::canonicalize(root).map_err(|e| format!("local storage root {shown}: {e}"))?;
            if real != *root || !real.is_dir() {
                return Err(format!("local storage root {shown}: must be a directory named by its real path (it resolves to {})", real.display()));
            }
            let system = SYSTEM_PATHS.iter().map(PathBuf::from);
            // Reserved paths are compared by their real paths too (they may not exist yet).
            let reserved = reserved.iter().map(|p| std::fs::canonicalize(p).unwrap_or_else(|_| p.clone()));
            if let Some(clash) = system.chain(reserved).find(|p| within(&real, p) || within(p, &real)) {
                return Err(format!("local storage root {shown}: overlaps {}, which sandboxes must never reach", clash.display()));
            }
            kept.push(real);
        }
        Ok(LocalRoots { roots: kept })
    }

    /// True when no root is allowed.
    pub fn is_empty(&self) -> bool {
        self.roots.is_empty()
    }

    /// The allowed root `dir` lies at or beneath (checked by path segments;
    /// `dir` must be a plain absolute path) and `dir` relative to it.
    fn root_of<'d>(&self, dir: &'d FsPath) -> Option<(&FsPath, &'d FsPath)> {
        if !plain_absolute(dir) {
            return None;
        }
        self.roots.iter().find_map(|r| dir.strip_prefix(r).ok().map(|rel| (r.as_path(), rel)))
    }

    /// Whether a mount of `dir` is allowed on this node.
    pub fn admits(&self, dir: &str) -> bool {
        self.root_of(FsPath::new(dir)).is_some()
    }

    /// A store serving `dir` (which must be admitted). The directory is
    /// opened from its root without following any symlink.
    pub fn store(&self, dir: &str) -> std::result::Result<BeneathLocal, String> {
        let refused = || format!("the local directory {dir} is not beneath a root this node allows for local storage");
        let (root, rel) = self.root_of(FsPath::new(dir)).ok_or_else(refused)?;
        let unusable = |_| format!("the local directory {dir} is not usable (missing, or reached through a symlink)");
        let opened = Dir::open(root).and_then(|r| r.dir(rel)).map_err(unusable)?;
        let inner = LocalFileSystem::new_with_prefix(dir).map_err(|_| format!("the local directory {dir} is not usable"))?;
        Ok(BeneathLocal { dir: PathBuf::from(dir), opened: Arc::new(opened), inner: Arc::new(inner) })
    }
}

/// A local directory as an object store that never leaves the directory:
/// every key is checked beneath it first.
#[derive(Clone)]
pub struct BeneathLocal {
    dir: PathBuf,
    opened: Arc<Dir>,
    inner: Arc<LocalFileSystem>,
}

impl fmt::Debug for BeneathLocal {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "BeneathLocal({})", self.dir.display())
    }
}

impl fmt::Display for BeneathLocal {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Debug::fmt(self, f)
    }
}

fn denied(location: &Path) -> object_store::Error {
    object_store::Error::PermissionDenied { path: location.to_string(), source: "reached through a symlink or outside the mount's directory".into() }
}

impl BeneathLocal {
    /// `location`'s file and every directory above it are real entries of
    /// the mount's directory (what does not exist yet is fine: the store
    /// creates plain directories and files).
    fn check(&self, location: &Path) -> Result<()> {
        let full = self.inner.path_to_filesystem(location)?;
        let rel = full.strip_prefix(&self.dir).map_err(|_| denied(location))?;
        if rel.components().any(|c| !matches!(c, Component::Normal(_))) {
            return Err(denied(location));
        }
        let mut at = rel;
        loop {
            if at.as_os_str().is_empty() {
                return Ok(());
            }
            match self.opened.lookup(at) {
                Ok(()) => return Ok(()),
                // Not there yet: the nearest existing ancestor decides.
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => at = at.parent().unwrap_or(FsPath::new("")),
                Err(_) => return Err(denied(location)),
            }
        }
    }

    fn keep(&self, location: &Path) -> bool {
        self.check(location).is_ok()
    }
}

#[async_trait::async_trait]
impl ObjectStore for BeneathLocal {
    async fn put_opts(&self, location: &Path, payload: PutPayload, opts: PutOptions) -> Result<PutResult> {
        self.check(location)?;
        self.inner.put_opts(location, payload, opts).await
    }
    async fn put_multipart_opts(&self, location: &Path, opts: PutMultipartOptions) -> Result<Box<dyn MultipartUpload>> {
        self.check(location)?;
        self.inner.put_multipart_opts(location, opts).await
    }
    async fn get_opts(&self, location: &Path, options: GetOptions) -> Result<GetResult> {
        self.check(location)?;
        self.inner.get_opts(location, options).await
    }
    async fn delete(&self, location: &Path) -> Result<()> {
        self.check(location)?;
        self.inner.delete(location).await
    }
    fn list(&self, prefix: Option<&Path>) -> BoxStream<'static, Result<ObjectMeta>> {
        if let Some(p) = prefix {
            if let Err(e) = self.check(p) {
                return futures_util::stream::once(async move { Err(e) }).boxed();
            }
        }
        let me = self.clone();
        self.inner.list(prefix).filter(move |m| std::future::ready(m.as_ref().map_or(true, |m| me.keep(&m.location)))).boxed()
    }
    async fn list_with_delimiter(&self, prefix: Option<&Path>) -> Result<ListResult> {
        if let Some(p) = prefix {
            self.check(p)?;
        }
        let mut listed = self.inner.list_with_delimiter(prefix).await?;
        listed.objects.retain(|m| self.keep(&m.location));
        listed.common_prefixes.retain(|p| self.keep(p));
        Ok(listed)
    }
    async fn copy(&self, from: &Path, to: &Path) -> Result<()> {
        self.check(from)?;
        self.check(to)?;
        self.inner.copy(from, to).await
    }
    async fn rename(&self, from: &Path, to: &Path) -> Result<()> {
        self.check(from)?;
        self.check(to)?;
        self.inner.rename(from, to).await
    }
    async fn copy_if_not_exists(&self, from: &Path, to: &Path) -> Result<()> {
        self.check(from)?;
        self.check(to)?;
        self.inner.copy_if_not_exists(from, to).await
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tmp() -> (tempfile::TempDir, PathBuf) {
        let t = tempfile::tempdir().unwrap();
        let real = std::fs::canonicalize(t.path()).unwrap();
        (t, real)
    }

    #[test]
    fn roots_are_real_directories_away_from_the_system_and_the_agents_state() {
        let (_t, base) = tmp();
        let ok = base.join("shared");
        std::fs::create_dir(&ok).unwrap();
        assert!(LocalRoots::new(&[ok.clone()], &[base.join("state")]).is_ok());
        let err = |roots: &[PathBuf], reserved: &[PathBuf]| LocalRoots::new(roots, reserved).unwrap_err();
        assert!(err(&[PathBuf::from("/")], &[]).contains("other than /"));
        assert!(err(&[PathBuf::from("/etc")], &[]).contains("overlaps /etc"));
        assert!(err(&[PathBuf::from("/etc/ssl")], &[]).contains("overlaps /etc"));
        assert!(err(&[PathBuf::from("relative")], &[]).contains("absolute"));
        assert!(err(&[ok.join("..").join("shared")], &[]).contains(".."));
        assert!(err(&[base.clone()], &[base.join("state")]).contains("overlaps"), "a root holding the agent's state");
        assert!(err(&[ok.clone()], &[base.clone()]).contains("overlaps"), "a root inside the agent's state");
        std::os::unix::fs::symlink(&ok, base.join("link")).unwrap();
        assert!(err(&[base.join("link")], &[]).contains("real path"));
        assert!(err(&[base.join("missing")], &[]).contains("missing"));
    }

    #[test]
    fn only_directories_beneath_an_allowed_root_are_admitted() {
        let (_t, base) = tmp();
        let roots = LocalRoots::new(&[base.clone()], &[]).unwrap();
        let b = base.to_string_lossy();
        assert!(roots.admits(&b) && roots.admits(&format!("{b}/team-a")));
        for bad in ["/", "/etc", "/var/lib/warren", &format!("{b}-other"), &format!("{b}/../x"), &format!("{b}/./x"), "relative"] {
            assert!(!roots.admits(bad), "{bad}");
        }
        assert!(!LocalRoots::none().admits(&b), "nothing without an admin's grant");
    }

    #[tokio::test]
    async fn symlinks_in_the_directory_lead_nowhere() {
        let (_t, base) = tmp();
        let (_o, outside) = tmp();
        std::fs::write(outside.join("secret"), "hunter2").unwrap();
        let dir = base.join("data");
        std::fs::create_dir_all(dir.join("real")).unwrap();
        std::fs::write(dir.join("real/ok.txt"), "fine").unwrap();
        std::os::unix::fs::symlink(&outside, dir.join("out")).unwrap();
        std::os::unix::fs::symlink(outside.join("secret"), dir.join("real/secret")).unwrap();
        let roots = LocalRoots::new(&[base.clone()], &[]).unwrap();
        let store = roots.store(&dir.to_string_lossy()).unwrap();
        assert_eq!(&store.get(&Path::from("real/ok.txt")).await.unwrap().bytes().await.unwrap()[..], b"fine");
        for key in ["out/secret", "real/secret"] {
            assert!(store.get(&Path::from(key)).await.is_err(), "{key} is read through a symlink");
        }
        assert!(store.put(&Path::from("out/planted"), PutPayload::from_static(b"x")).await.is_err());
        assert!(!outside.join("planted").exists(), "nothing is written through a symlinked directory");
        let listed: Vec<String> = store.list(None).filter_map(|m| async move { m.ok().map(|m| m.location.to_string()) }).collect().await;
        assert_eq!(listed, vec!["real/ok.txt".to_string()], "listings drop what symlinks reach");
        let top = store.list_with_delimiter(None).await.unwrap();
        assert_eq!(top.common_prefixes, vec![Path::from("real")]);
        store.put(&Path::from("new/dir/file"), PutPayload::from_static(b"y")).await.unwrap();
        assert!(dir.join("new/dir/file").is_file(), "new directories are fine");
        // The mount's directory itself reached through a symlink below the root.
        std::os::unix::fs::symlink(&outside, base.join("alias")).unwrap();
        assert!(roots.store(&base.join("alias").to_string_lossy()).is_err());
    }
}
