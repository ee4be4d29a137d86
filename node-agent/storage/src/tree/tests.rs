use std::sync::atomic::{AtomicUsize, Ordering};

use futures_util::stream::BoxStream;
use object_store::memory::InMemory;
use object_store::{ListResult, MultipartUpload, PutMultipartOptions, PutOptions, PutPayload, PutResult, Result};

use super::*;

/// An in-memory store that counts what the tree asks of it.
#[derive(Debug, Default)]
struct Counting {
    inner: InMemory,
    heads: AtomicUsize,
    gets: AtomicUsize,
    /// Objects yielded by `list` streams (what a listing transferred).
    listed: Arc<AtomicUsize>,
    delimited: AtomicUsize,
}

impl std::fmt::Display for Counting {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Counting")
    }
}

#[async_trait::async_trait]
impl ObjectStore for Counting {
    async fn put_opts(&self, location: &Path, payload: PutPayload, opts: PutOptions) -> Result<PutResult> {
        self.inner.put_opts(location, payload, opts).await
    }
    async fn put_multipart_opts(&self, location: &Path, opts: PutMultipartOptions) -> Result<Box<dyn MultipartUpload>> {
        self.inner.put_multipart_opts(location, opts).await
    }
    async fn get_opts(&self, location: &Path, options: GetOptions) -> Result<object_store::GetResult> {
        if options.head {
            self.heads.fetch_add(1, Ordering::Relaxed);
        } else {
            self.gets.fetch_add(1, Ordering::Relaxed);
        }
        self.inner.get_opts(location, options).await
    }
    async fn head(&self, location: &Path) -> Result<ObjectMeta> {
        self.heads.fetch_add(1, Ordering::Relaxed);
        self.inner.head(location).await
    }
    async fn delete(&self, location: &Path) -> Result<()> {
        self.inner.delete(location).await
    }
    fn list(&self, prefix: Option<&Path>) -> BoxStream<'static, Result<ObjectMeta>> {
        let listed = self.listed.clone();
        self.inner
            .list(prefix)
            .map(move |m| {
                listed.fetch_add(1, Ordering::Relaxed);
                m
            })
            .boxed()
    }
    async fn list_with_delimiter(&self, prefix: Option<&Path>) -> Result<ListResult> {
        self.delimited.fetch_add(1, Ordering::Relaxed);
        self.inner.list_with_delimiter(prefix).await
    }
    async fn copy(&self, from: &Path, to: &Path) -> Result<()> {
        self.inner.copy(from, to).await
    }
    async fn copy_if_not_exists(&self, from: &Path, to: &Path) -> Result<()> {
        self.inner.copy_if_not_exists(from, to).await
    }
}

async fn store_with(keys: &[(&str, &str)]) -> Arc<Counting> {
    let s = Arc::new(Counting::default());
    for (k, v) in keys {
        s.inner.put(&Path::from(*k), PutPayload::from(v.to_string())).await.unwrap();
    }
    s
}

fn tree(store: &Arc<Counting>, root: &str) -> ObjectTree {
    ObjectTree::new(store.clone(), Path::from(root))
}

#[tokio::test]
async fn reading_one_file_of_a_big_prefix_lists_and_fetches_nothing_else() {
    let s = Arc::new(Counting::default());
    for i in 0..10_000 {
        s.inner.put(&Path::from(format!("data/reports/r{i:05}.csv")), PutPayload::from_static(b"x")).await.unwrap();
    }
    s.inner.put(&Path::from("data/reports/customers.csv"), PutPayload::from_static(b"id,name\n1,ada\n")).await.unwrap();
    let t = tree(&s, "data");
    let dir = t.lookup(ROOT, b"reports").await.unwrap();
    assert_eq!(dir.kind, Kind::Dir);
    let f = t.lookup(dir.ino, b"customers.csv").await.unwrap();
    assert_eq!((f.kind, f.size), (Kind::File, 14));
    assert_eq!(t.read(f.ino, 3, 4).await.unwrap(), Bytes::from_static(b"name"));
    assert_eq!(s.delimited.load(Ordering::Relaxed), 0, "no directory was listed");
    // Finding that `reports` is a directory stops at its first object; the
    // file's own (empty) prefix yields none.
    assert!(s.listed.load(Ordering::Relaxed) <= 1, "{} objects listed", s.listed.load(Ordering::Relaxed));
    assert_eq!(s.gets.load(Ordering::Relaxed), 1, "one ranged GET");
}

#[tokio::test]
async fn nothing_above_or_beside_the_root_is_reachable() {
    let s = store_with(&[("tenants/a/x", "mine"), ("tenants/ab/y", "sibling"), ("tenants/secret", "above"), ("tenants/a/sub/z", "deep")]).await;
    let t = tree(&s, "tenants/a");
    let names: Vec<String> = t.readdir(ROOT).await.unwrap().into_iter().map(|(n, _)| n).collect();
    assert_eq!(names, ["sub", "x"]);
    for bad in [&b".."[..], b".", b"../ab", b"../secret", b"sub/z", b"a\\b", b"", b"\0"] {
        assert_eq!(t.lookup(ROOT, bad).await.unwrap_err(), FsError::InvalidName, "{:?}", String::from_utf8_lossy(bad));
    }
    // Names that look like escapes are plain names, and there is nothing by them.
    for plain in [&b"%2e%2e"[..], b"..%2fab", b"ab"] {
        assert_eq!(t.lookup(ROOT, plain).await.unwrap_err(), FsError::NotFound);
    }
    let sibling = tree(&s, "tenants/ab");
    assert_eq!(sibling.readdir(ROOT).await.unwrap().len(), 1, "tenants/ab sees only its own object");
}

#[tokio::test]
async fn a_listed_directory_answers_lookups_from_memory() {
    let s = store_with(&[("d/one", "1"), ("d/two", "22")]).await;
    let t = tree(&s, "d");
    let all = t.readdir(ROOT).await.unwrap();
    assert_eq!(all.iter().map(|(n, a)| (n.as_str(), a.size)).collect::<Vec<_>>(), [("one", 1), ("two", 2)]);
    let heads = s.heads.load(Ordering::Relaxed);
    assert_eq!(t.lookup(ROOT, b"two").await.unwrap().size, 2);
    assert_eq!(t.lookup(ROOT, b"three").await.unwrap_err(), FsError::NotFound);
    assert_eq!(s.heads.load(Ordering::Relaxed), heads, "no store call after the listing");
    assert_eq!(t.readdir(ROOT).await.unwrap(), all, "the same inodes on a second listing");
}

#[tokio::test]
async fn a_prefix_shadows_an_object_of_the_same_name_in_lookups_and_listings() {
    let s = store_with(&[("r/d", "file"), ("r/d/e", "below")]).await;
    let t = tree(&s, "r");
    assert_eq!(t.lookup(ROOT, b"d").await.unwrap().kind, Kind::Dir);
    let fresh = tree(&s, "r");
    let listed = fresh.readdir(ROOT).await.unwrap();
    assert_eq!(listed.len(), 1);
    assert_eq!((listed[0].0.as_str(), listed[0].1.kind), ("d", Kind::Dir), "the listing agrees with the lookup");
}

#[tokio::test]
async fn files_are_read_in_shared_chunks() {
    let body: Vec<u8> = (0..(20 << 20)).map(|i| (i % 251) as u8).collect();
    let s = Arc::new(Counting::default());
    s.inner.put(&Path::from("big"), PutPayload::from(body.clone())).await.unwrap();
    let t = tree(&s, "");
    let f = t.lookup(ROOT, b"big").await.unwrap();
    let mut got = Vec::new();
    let mut off = 0u64;
    while off < f.size {
        let chunk = t.read(f.ino, off, 128 << 10).await.unwrap();
        off += chunk.len() as u64;
        got.extend_from_slice(&chunk);
    }
    assert_eq!(got, body, "the chunks hand out exactly the file");
    // 20 MiB in 8 MiB chunks: three GETs for 160 reads of 128 KiB.
    assert_eq!(s.gets.load(Ordering::Relaxed), 3);
    // A read across a chunk boundary, from chunks still held: no GET.
    let across = t.read(f.ino, CHUNK - 2, 4).await.unwrap();
    assert_eq!(across, Bytes::copy_from_slice(&body[(CHUNK - 2) as usize..(CHUNK + 2) as usize]));
    assert_eq!(s.gets.load(Ordering::Relaxed), 3);
}

#[tokio::test]
async fn reads_stop_at_the_end_and_never_mix_versions() {
    let s = store_with(&[("f", "0123456789")]).await;
    let t = tree(&s, "");
    let f = t.lookup(ROOT, b"f").await.unwrap();
    assert_eq!(t.read(f.ino, 8, 100).await.unwrap(), Bytes::from_static(b"89"));
    assert!(t.read(f.ino, 10, 4).await.unwrap().is_empty());
    assert!(t.read(f.ino, u64::MAX, 4).await.unwrap().is_empty());
    assert_eq!(t.read(ROOT, 0, 1).await.unwrap_err(), FsError::IsDir);
    assert_eq!(t.readdir(f.ino).await.unwrap_err(), FsError::NotDir);
    assert_eq!(t.lookup(f.ino, b"x").await.unwrap_err(), FsError::NotDir);
    s.inner.put(&Path::from("f"), PutPayload::from_static(b"replaced!!")).await.unwrap();
    assert_eq!(t.read(f.ino, 0, 4).await.unwrap(), Bytes::from_static(b"0123"), "the version looked up, from the chunk held");
    // Looked up before the change, fetched after it: refused, never mixed.
    let before = tree(&s, "");
    let g = before.lookup(ROOT, b"f").await.unwrap();
    s.inner.put(&Path::from("f"), PutPayload::from_static(b"third time")).await.unwrap();
    assert!(matches!(before.read(g.ino, 0, 4).await.unwrap_err(), FsError::Io(_)), "a replaced object is not read as the old one");
}

#[test]
fn store_errors_say_nothing_of_the_store() {
    let e = FsError::from(object_store::Error::Generic { store: "S3", source: "https://key:secret@host/ denied".into() });
    assert_eq!(e, FsError::Io("backend error".into()));
    assert_eq!(e.errno(), libc::EIO);
}

#[tokio::test]
async fn a_repeat_read_of_an_unchanged_object_downloads_no_body() {
    let s = store_with(&[("d/f", "version one")]).await;
    let dir = tempfile::tempdir().unwrap();
    let cache = Arc::new(BodyCache::open(dir.path().join("cache"), 1 << 20).unwrap());
    // Each call has its own tree; the node's cache outlives them.
    let call = |id: u8| tree(&s, "d").with_cache(cache.clone(), [id; 32]);
    let read_all = |t: ObjectTree| async move {
        let f = t.lookup(ROOT, b"f").await.unwrap();
        t.read(f.ino, 0, 100).await.unwrap()
    };
    assert_eq!(read_all(call(1)).await, Bytes::from_static(b"version one"));
    // The chunk is written behind the read: wait until it is kept.
    for _ in 0..10_000 {
        if cache.bytes() > 0 {
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(1)).await;
    }
    assert_eq!(cache.bytes(), 11);
    assert_eq!(read_all(call(1)).await, Bytes::from_static(b"version one"));
    assert_eq!(s.gets.load(Ordering::Relaxed), 1, "the second call read the node's copy");
    assert_eq!(read_all(call(2)).await, Bytes::from_static(b"version one"));
    assert_eq!(s.gets.load(Ordering::Relaxed), 2, "another client (other credentials) does not share it");
    s.inner.put(&Path::from("d/f"), PutPayload::from_static(b"version two")).await.unwrap();
    assert_eq!(read_all(call(1)).await, Bytes::from_static(b"version two"), "a new ETag is a new entry");
    assert_eq!(s.gets.load(Ordering::Relaxed), 3);
}
