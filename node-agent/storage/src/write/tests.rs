use std::sync::atomic::AtomicBool;
use std::sync::Arc;

use futures_util::stream::BoxStream;
use object_store::memory::InMemory;
use object_store::{GetOptions, ListResult, MultipartUpload, ObjectMeta, ObjectStore, PutMultipartOptions, PutOptions, PutResult, Result};

use super::*;
use crate::{MountOptions, ROOT};

/// In-memory store whose uploads fail while `down` is set, and never
/// answer while `hung` is.
#[derive(Debug, Default)]
struct Flaky {
    inner: InMemory,
    down: AtomicBool,
    hung: AtomicBool,
}

impl std::fmt::Display for Flaky {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Flaky")
    }
}

impl Flaky {
    fn check(&self) -> Result<()> {
        if self.down.load(Ordering::Relaxed) {
            return Err(object_store::Error::Generic { store: "Flaky", source: "down".into() });
        }
        Ok(())
    }
}

#[async_trait::async_trait]
impl ObjectStore for Flaky {
    async fn put_opts(&self, location: &Path, payload: PutPayload, opts: PutOptions) -> Result<PutResult> {
        if self.hung.load(Ordering::Relaxed) {
            std::future::pending::<()>().await;
        }
        self.check()?;
        self.inner.put_opts(location, payload, opts).await
    }
    async fn put_multipart_opts(&self, location: &Path, opts: PutMultipartOptions) -> Result<Box<dyn MultipartUpload>> {
        self.check()?;
        self.inner.put_multipart_opts(location, opts).await
    }
    async fn get_opts(&self, location: &Path, options: GetOptions) -> Result<object_store::GetResult> {
        self.inner.get_opts(location, options).await
    }
    async fn delete(&self, location: &Path) -> Result<()> {
        self.inner.delete(location).await
    }
    fn list(&self, prefix: Option<&Path>) -> BoxStream<'static, Result<ObjectMeta>> {
        self.inner.list(prefix)
    }
    async fn list_with_delimiter(&self, prefix: Option<&Path>) -> Result<ListResult> {
        self.inner.list_with_delimiter(prefix).await
    }
    async fn copy(&self, from: &Path, to: &Path) -> Result<()> {
        self.inner.copy(from, to).await
    }
    async fn copy_if_not_exists(&self, from: &Path, to: &Path) -> Result<()> {
        self.inner.copy_if_not_exists(from, to).await
    }
}

struct Mount {
    store: Arc<Flaky>,
    tree: ObjectTree,
    _spool: tempfile::TempDir,
}

async fn mount(objects: &[(&str, &str)], read_only: bool, write_limit: u64) -> Mount {
    let store = Arc::new(Flaky::default());
    for (k, v) in objects {
        store.inner.put(&Path::from(*k), PutPayload::from(v.to_string())).await.unwrap();
    }
    let spool = tempfile::tempdir().unwrap();
    let options = MountOptions { read_only, spool: spool.path().to_path_buf(), write_limit, deadline: None, disk_reserve: 0 };
    let tree = ObjectTree::with_options(store.clone(), Path::from("scope"), options);
    Mount { store, tree, _spool: spool }
}

async fn stored(m: &Mount, key: &str) -> Option<String> {
    match m.store.inner.get(&Path::from(key)).await {
        Ok(r) => Some(String::from_utf8(r.bytes().await.unwrap().to_vec()).unwrap()),
        Err(_) => None,
    }
}

#[tokio::test]
async fn a_new_file_reaches_the_store_when_flushed_and_reads_back_meanwhile() {
    let m = mount(&[], false, 1 << 20).await;
    let f = m.tree.create(ROOT, b"report.txt").await.unwrap();
    assert_eq!(m.tree.write(f.ino, 0, b"hello ").unwrap(), 6);
    m.tree.write(f.ino, 6, b"world").unwrap();
    assert_eq!(m.tree.read(f.ino, 0, 100).await.unwrap(), Bytes::from_static(b"hello world"), "reads see the staged content");
    assert_eq!(stored(&m, "scope/report.txt").await, None, "nothing is stored before the flush");
    m.tree.flush(f.ino).await.unwrap();
    assert_eq!(stored(&m, "scope/report.txt").await.as_deref(), Some("hello world"));
    assert!(m.tree.sync().await.is_empty(), "nothing left to sync");
    assert_eq!(m.tree.create(ROOT, b"report.txt").await.unwrap_err(), FsError::Exists);
}

#[tokio::test]
async fn appends_and_truncates_keep_what_was_there() {
    let m = mount(&[("scope/log", "one\n"), ("scope/cut", "0123456789")], false, 1 << 20).await;
    let log = m.tree.lookup(ROOT, b"log").await.unwrap();
    m.tree.open_write(log.ino, false).await.unwrap();
    m.tree.write(log.ino, 4, b"two\n").unwrap();
    let cut = m.tree.lookup(ROOT, b"cut").await.unwrap();
    m.tree.open_write(cut.ino, false).await.unwrap();
    assert_eq!(m.tree.truncate(cut.ino, 4).unwrap().size, 4);
    let fresh = m.tree.lookup(ROOT, b"cut").await.unwrap();
    assert_eq!(fresh.size, 4);
    assert!(m.tree.sync().await.is_empty());
    assert_eq!(stored(&m, "scope/log").await.as_deref(), Some("one\ntwo\n"));
    assert_eq!(stored(&m, "scope/cut").await.as_deref(), Some("0123"));
    // Opening with O_TRUNC downloads nothing and empties the object.
    m.tree.open_write(log.ino, true).await.unwrap();
    m.tree.sync().await;
    assert_eq!(stored(&m, "scope/log").await.as_deref(), Some(""));
}

#[tokio::test]
async fn large_files_upload_in_parts() {
    let m = mount(&[], false, 64 << 20).await;
    let f = m.tree.create(ROOT, b"big.bin").await.unwrap();
    let chunk: Vec<u8> = (0..1 << 20).map(|i| (i % 251) as u8).collect();
    for i in 0..20u64 {
        m.tree.write(f.ino, i << 20, &chunk).unwrap();
    }
    m.tree.flush(f.ino).await.unwrap();
    let body = m.store.inner.get(&Path::from("scope/big.bin")).await.unwrap().bytes().await.unwrap();
    assert_eq!(body.len(), 20 << 20);
    assert!(body.chunks(1 << 20).all(|c| c == chunk.as_slice()));
}

#[tokio::test]
async fn the_write_limit_holds_and_deleting_frees_it() {
    let m = mount(&[("scope/existing", "0123456789")], false, 16).await;
    let f = m.tree.create(ROOT, b"a").await.unwrap();
    m.tree.write(f.ino, 0, &[1; 12]).unwrap();
    assert_eq!(m.tree.write(f.ino, 12, &[1; 5]).unwrap_err(), FsError::NoSpace);
    let e = m.tree.lookup(ROOT, b"existing").await.unwrap();
    assert_eq!(m.tree.open_write(e.ino, false).await.unwrap_err(), FsError::NoSpace, "copying the object in counts too");
    m.tree.unlink(ROOT, b"a").await.unwrap();
    m.tree.open_write(e.ino, false).await.unwrap();
    assert_eq!(m.tree.write(f.ino, 0, b"x").unwrap_err(), FsError::NotFound, "the unlinked file is gone");
}

/// #26: every mount of every sandbox spools on the agent's state disk, and
/// the per-mount write limits summed past its reserve. A write that would
/// dig into the reserve now fails with ENOSPC whatever the mount's limit.
#[tokio::test]
async fn spooling_never_digs_into_the_state_disks_reserve() {
    // A disk whose free space only this test changes: the state disk of a
    // machine with other writers moves between the reading and the write.
    let Some(spool) = PrivateDisk::new("spooling_never_digs_into_the_state_disks_reserve") else { return };
    let free = {
        let s = nix::sys::statvfs::statvfs(spool.path()).unwrap();
        s.blocks_available() as u64 * s.fragment_size() as u64
    };
    let store = Arc::new(Flaky::default());
    // A reserve just above what is free: not one byte may be spooled.
    let options = MountOptions { read_only: false, spool: spool.path().to_path_buf(), write_limit: 1 << 30, deadline: None, disk_reserve: free + 1 };
    let tree = ObjectTree::with_options(store.clone(), Path::from("scope"), options);
    let f = tree.create(ROOT, b"a").await.unwrap();
    assert_eq!(tree.write(f.ino, 0, b"x").unwrap_err(), FsError::NoSpace);
    let options = MountOptions { read_only: false, spool: spool.path().to_path_buf(), write_limit: 1 << 30, deadline: None, disk_reserve: free / 2 };
    let tree = ObjectTree::with_options(store, Path::from("scope"), options);
    let f = tree.create(ROOT, b"a").await.unwrap();
    assert_eq!(tree.write(f.ino, 0, b"x").unwrap(), 1, "room above the reserve");
}

/// A 16 MiB tmpfs in a temporary directory, unmounted when dropped (also
/// when the test fails); `None`, with a printed reason, when not root.
struct PrivateDisk(tempfile::TempDir);

impl PrivateDisk {
    fn new(test: &str) -> Option<PrivateDisk> {
        if !nix::unistd::geteuid().is_root() {
            assert!(std::env::var("WARREN_REQUIRE_ROOT").as_deref() != Ok("1"), "{test} needs root and WARREN_REQUIRE_ROOT=1 forbids skipping it");
            eprintln!("SKIPPED {test}: needs root (mounts a tmpfs of known size); CI runs as root");
            return None;
        }
        let dir = tempfile::tempdir().unwrap();
        let flags = nix::mount::MsFlags::MS_NOSUID | nix::mount::MsFlags::MS_NODEV;
        nix::mount::mount(Some("tmpfs"), dir.path(), Some("tmpfs"), flags, Some("size=16m")).unwrap();
        Some(PrivateDisk(dir))
    }

    fn path(&self) -> &std::path::Path {
        self.0.path()
    }
}

impl Drop for PrivateDisk {
    fn drop(&mut self) {
        let _ = nix::mount::umount2(self.0.path(), nix::mount::MntFlags::MNT_DETACH);
    }
}

/// #26: 200 000 `mkdir`s added 186 MB to the agent (the tree was bounded by
/// entries only). It is bounded by memory now: past it, ENFILE, and what is
/// removed gives its share back.
#[tokio::test]
async fn the_tree_is_bounded_by_memory_not_only_entries() {
    let m = mount(&[], false, 1 << 20).await;
    let name = |i: usize| format!("{i:0>200}");
    let mut made = 0;
    let err = loop {
        match m.tree.mkdir(ROOT, name(made).as_bytes()).await {
            Ok(_) => made += 1,
            Err(e) => break e,
        }
        assert!(made < crate::tree::MAX_ENTRIES, "bounded by entries only");
    };
    assert_eq!(err, FsError::TooMany);
    assert_eq!(err.errno(), libc::ENFILE);
    assert!(m.tree.table().bytes <= crate::tree::MAX_TREE_BYTES);
    assert!(made < 100_000, "{made} entries of 200-byte names in 64 MiB");
    m.tree.rmdir(ROOT, name(0).as_bytes()).await.unwrap();
    m.tree.mkdir(ROOT, b"again").await.unwrap();
}

#[tokio::test]
async fn an_upload_cut_off_by_the_deadline_leaves_the_file_to_sync_and_report() {
    let spool = tempfile::tempdir().unwrap();
    let store = Arc::new(Flaky::default());
    let deadline = std::time::Instant::now() + std::time::Duration::from_millis(200);
    let options = MountOptions { read_only: false, spool: spool.path().to_path_buf(), write_limit: 1 << 20, deadline: Some(deadline), disk_reserve: 0 };
    let tree = ObjectTree::with_options(store.clone(), Path::from("scope"), options);
    let f = tree.create(ROOT, b"late.txt").await.unwrap();
    tree.write(f.ino, 0, b"x").unwrap();
    store.hung.store(true, Ordering::Relaxed);
    let cut = crate::error::by_deadline(Some(deadline), tree.flush(f.ino)).await;
    assert!(matches!(cut, Err(FsError::Io(_))), "{cut:?}");
    let failed = tree.sync().await;
    assert_eq!(failed.iter().map(|f| f.path.as_str()).collect::<Vec<_>>(), ["late.txt"], "still pending, named by path");
}

#[tokio::test]
async fn a_call_stages_a_bounded_number_of_files() {
    let m = mount(&[], false, 1 << 20).await;
    for i in 0..MAX_STAGES {
        m.tree.create(ROOT, format!("f{i}").as_bytes()).await.unwrap();
    }
    assert_eq!(m.tree.create(ROOT, b"one-more").await.unwrap_err(), FsError::TooMany, "ENFILE, not another file on the agent's disk");
    assert!(m.tree.lookup(ROOT, b"one-more").await.is_err(), "the refused file does not exist");
}

#[tokio::test]
async fn a_read_only_mount_refuses_every_change() {
    let m = mount(&[("scope/f", "data"), ("scope/d/x", "1")], true, 1 << 20).await;
    let f = m.tree.lookup(ROOT, b"f").await.unwrap();
    assert_eq!(m.tree.create(ROOT, b"new").await.unwrap_err(), FsError::ReadOnly);
    assert_eq!(m.tree.open_write(f.ino, false).await.unwrap_err(), FsError::ReadOnly);
    assert_eq!(m.tree.write(f.ino, 0, b"x").unwrap_err(), FsError::ReadOnly);
    assert_eq!(m.tree.truncate(f.ino, 0).unwrap_err(), FsError::ReadOnly);
    assert_eq!(m.tree.unlink(ROOT, b"f").await.unwrap_err(), FsError::ReadOnly);
    assert_eq!(m.tree.mkdir(ROOT, b"n").await.unwrap_err(), FsError::ReadOnly);
    assert_eq!(m.tree.rmdir(ROOT, b"d").await.unwrap_err(), FsError::ReadOnly);
    assert_eq!(m.tree.rename(ROOT, b"f", ROOT, b"g").await.unwrap_err(), FsError::ReadOnly);
    assert_eq!(FsError::ReadOnly.errno(), libc::EROFS);
    assert_eq!(stored(&m, "scope/f").await.as_deref(), Some("data"));
}

#[tokio::test]
async fn directories_are_made_removed_and_renamed() {
    let m = mount(&[("scope/full/a", "1"), ("scope/full/sub/b", "2"), ("scope/fullness", "sibling")], false, 1 << 20).await;
    let d = m.tree.mkdir(ROOT, b"empty").await.unwrap();
    assert!(m.tree.readdir(d.ino).await.unwrap().is_empty());
    assert_eq!(m.tree.rmdir(ROOT, b"full").await.unwrap_err(), FsError::NotEmpty);
    m.tree.rmdir(ROOT, b"empty").await.unwrap();
    assert_eq!(m.tree.lookup(ROOT, b"empty").await.unwrap_err(), FsError::NotFound);

    let full = m.tree.lookup(ROOT, b"full").await.unwrap();
    let staged = m.tree.create(full.ino, b"new").await.unwrap();
    m.tree.write(staged.ino, 0, b"3").unwrap();
    m.tree.rename(ROOT, b"full", ROOT, b"moved").await.unwrap();
    assert_eq!(stored(&m, "scope/moved/a").await.as_deref(), Some("1"));
    assert_eq!(stored(&m, "scope/moved/sub/b").await.as_deref(), Some("2"));
    assert_eq!(stored(&m, "scope/moved/new").await.as_deref(), Some("3"), "written files move with their directory");
    assert_eq!(stored(&m, "scope/full/a").await, None);
    assert_eq!(stored(&m, "scope/fullness").await.as_deref(), Some("sibling"), "a sibling sharing the name's start stays");
    let moved = m.tree.lookup(ROOT, b"moved").await.unwrap();
    let names: Vec<String> = m.tree.readdir(moved.ino).await.unwrap().into_iter().map(|(n, _)| n).collect();
    assert_eq!(names, ["a", "new", "sub"]);
}

#[tokio::test]
async fn files_are_renamed_in_the_store_and_replace_their_target() {
    let m = mount(&[("scope/a", "A"), ("scope/b", "B")], false, 1 << 20).await;
    m.tree.rename(ROOT, b"a", ROOT, b"b").await.unwrap();
    assert_eq!((stored(&m, "scope/a").await, stored(&m, "scope/b").await.as_deref()), (None, Some("A")));
    let f = m.tree.create(ROOT, b"draft").await.unwrap();
    m.tree.write(f.ino, 0, b"D").unwrap();
    m.tree.rename(ROOT, b"draft", ROOT, b"final").await.unwrap();
    assert!(m.tree.sync().await.is_empty());
    assert_eq!((stored(&m, "scope/draft").await, stored(&m, "scope/final").await.as_deref()), (None, Some("D")));
    assert_eq!(m.tree.rename(ROOT, b"final", ROOT, b"../out").await.unwrap_err(), FsError::InvalidName);
}

#[tokio::test]
async fn a_change_the_store_refuses_is_reported_by_path_and_kept_for_a_retry() {
    let m = mount(&[], false, 1 << 20).await;
    let d = m.tree.mkdir(ROOT, b"out").await.unwrap();
    let f = m.tree.create(d.ino, b"result.csv").await.unwrap();
    m.tree.write(f.ino, 0, b"x,y\n").unwrap();
    m.store.down.store(true, Ordering::Relaxed);
    assert!(matches!(m.tree.flush(f.ino).await.unwrap_err(), FsError::Io(_)));
    let failed = m.tree.sync().await;
    assert_eq!(failed.iter().map(|f| f.path.as_str()).collect::<Vec<_>>(), ["out/result.csv"]);
    m.store.down.store(false, Ordering::Relaxed);
    assert!(m.tree.sync().await.is_empty(), "still dirty, stored on the next sync");
    assert_eq!(stored(&m, "scope/out/result.csv").await.as_deref(), Some("x,y\n"));
}
