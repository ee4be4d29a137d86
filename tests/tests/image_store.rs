//! The node's image store against a real registry (Debian's docker-registry
//! on loopback): layered read-only roots, shared layers, digest and hostile
//! layer refusals, and the LRU collector. Root: overlay mounts, whiteouts.

use std::path::Path;
use std::sync::Arc;

use warren_e2e::registry::{tar_entries, tar_of, Registry, TestImage};
use warren_e2e::skip_unless_root;
use warren_image::{LayerError, Limits, PullAuth, PullError, Store};

/// The test registry listens on loopback: these stores allow it, as an
/// admin would for a registry on the node (`--allow-endpoint`).
fn loopback() -> warren_image::Registries {
    let policy = warren_core::reach::EndpointPolicy::new(&["127.0.0.0/8".into()], vec![]).unwrap();
    warren_image::Registries { insecure: vec![], endpoints: Arc::new(policy) }
}

/// A store in a temp dir whose image roots are unmounted even when a test fails.
struct TestStore {
    store: Arc<Store>,
    dir: tempfile::TempDir,
}

impl TestStore {
    fn open(limits: Limits, budget: u64) -> TestStore {
        let dir = tempfile::Builder::new().prefix("warren-images-").tempdir().unwrap();
        let store = Arc::new(Store::open(dir.path(), limits, budget, loopback()).unwrap());
        TestStore { store, dir }
    }

    fn layer_dirs(&self) -> Vec<String> {
        let mut names: Vec<String> =
            std::fs::read_dir(self.dir.path().join("layers")).unwrap().map(|e| e.unwrap().file_name().to_string_lossy().into_owned()).filter(|n| !n.ends_with(".json")).collect();
        names.sort();
        names
    }

    fn image_dirs(&self) -> usize {
        std::fs::read_dir(self.dir.path().join("images")).unwrap().count()
    }
}

impl Drop for TestStore {
    fn drop(&mut self) {
        self.store.unmount_all();
    }
}

fn base_layer() -> Vec<u8> {
    tar_of(&[
        ("etc/", b""),
        ("etc/passwd", b"root:x:0:0:root:/root:/bin/sh\nnode:x:1000:1000::/home/node:/bin/sh\n"),
        ("etc/os-release", b"ID=test\n"),
        ("usr/bin/x", b"x"),
        ("var/cache/old", b"old"),
    ])
}

fn image_a() -> TestImage {
    let top = tar_of(&[("etc/.wh.os-release", b""), ("var/cache/.wh..wh..opq", b""), ("var/cache/new", b"new"), ("usr/bin/y", b"y")]);
    TestImage { layers: vec![base_layer(), top], env: vec!["PATH=/opt/bin:/usr/bin".into(), "LD_PRELOAD=/evil.so".into()], ..TestImage::default() }
}

fn image_b() -> TestImage {
    TestImage { layers: vec![base_layer(), tar_of(&[("usr/bin/z", b"z")])], ..TestImage::default() }
}

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().unwrap()
}

#[test]
fn pulled_images_are_layered_read_only_roots_sharing_their_base() {
    if skip_unless_root("pulled_images_are_layered_read_only_roots_sharing_their_base") {
        return;
    }
    let rt = runtime();
    let registry = Registry::start().unwrap();
    let t = TestStore::open(Limits::default(), 1 << 30);
    let (a_ref, b_ref) = (registry.reference("team/a:v1"), registry.reference("team/b:v1"));
    let a_digest = rt.block_on(image_a().push(&a_ref)).unwrap();
    rt.block_on(image_b().push(&b_ref)).unwrap();

    let a = rt.block_on(t.store.pull(&a_ref, &PullAuth::Anonymous)).map(|p| p.image).unwrap();
    assert_eq!(a.digest(), a_digest);
    let root = a.root();
    assert_eq!(std::fs::read(root.join("usr/bin/x")).unwrap(), b"x", "base layer visible");
    assert_eq!(std::fs::read(root.join("usr/bin/y")).unwrap(), b"y", "top layer visible");
    assert!(!root.join("etc/os-release").exists(), "whiteout hides the base's file");
    assert!(!root.join("var/cache/old").exists() && root.join("var/cache/new").exists(), "opaque dir hides the base's contents");
    let passwd = std::fs::read_to_string(root.join("etc/passwd")).unwrap();
    assert!(passwd.contains("root:x:0:0") && passwd.contains("sandbox:x:1000:1000") && !passwd.contains("node:x:1000"), "{passwd}");
    for zone in ["proc", "dev", "tmp", "home", "data", "run/warren"] {
        assert!(root.join(zone).is_dir(), "zone mount point /{zone}");
    }
    let write = std::fs::write(root.join("usr/bin/pwned"), b"x").unwrap_err();
    assert_eq!(write.raw_os_error(), Some(libc::EROFS), "the root is read-only");
    assert_eq!(a.env(), [("PATH".to_string(), "/opt/bin:/usr/bin".to_string())], "image env filtered (no LD_PRELOAD)");

    let b = rt.block_on(t.store.pull(&b_ref, &PullAuth::Anonymous)).map(|p| p.image).unwrap();
    assert_eq!(std::fs::read(b.root().join("usr/bin/z")).unwrap(), b"z");
    assert!(!b.root().join("usr/bin/y").exists(), "images do not see each other's layers");
    assert_eq!(t.layer_dirs().len(), 3, "two images of two layers sharing a base keep three layers");
    assert!(t.store.bytes() < a.bytes() + b.bytes(), "shared base stored once");

    // Warm by digest: no registry needed.
    let pinned = format!("{}/team/a@{a_digest}", registry.addr);
    drop(registry);
    let again = rt.block_on(t.store.pull(&pinned, &PullAuth::Anonymous)).unwrap();
    assert!(Arc::ptr_eq(&a, &again.image), "warm image returned without a pull");
    assert!(!again.proven, "a warm digest taken without the registry proves nothing about the caller");

    // A restart remounts what is on disk.
    t.store.unmount_all();
    let reopened = TestStore { store: Arc::new(Store::open(t.dir.path(), Limits::default(), 1 << 30, loopback()).unwrap()), dir: tempfile::tempdir().unwrap() };
    let a2 = reopened.store.get(&a_digest).expect("image survives a restart");
    assert_eq!(std::fs::read(a2.root().join("usr/bin/y")).unwrap(), b"y");
}

fn refusal(result: Result<Arc<warren_image::Image>, PullError>) -> LayerError {
    match result {
        Err(PullError::Image { source, .. }) => source,
        other => panic!("expected an image refusal, got {other:?}"),
    }
}

#[test]
fn lying_hostile_and_oversized_images_are_refused_and_leave_nothing() {
    if skip_unless_root("lying_hostile_and_oversized_images_are_refused_and_leave_nothing") {
        return;
    }
    let rt = runtime();
    let registry = Registry::start().unwrap();
    let limits = Limits { max_layers: 3, max_image_bytes: 4 << 20, ..Limits::default() };
    let t = TestStore::open(limits, 1 << 30);
    let pull = |name: &str, image: TestImage| {
        let reference = registry.reference(name);
        rt.block_on(image.push(&reference)).unwrap();
        rt.block_on(t.store.pull(&reference, &PullAuth::Anonymous)).map(|p| p.image)
    };

    let lying = TestImage { layers: vec![base_layer()], diff_ids: Some(vec![warren_e2e::registry::sha256(b"other")]), ..TestImage::default() };
    assert!(matches!(refusal(pull("lying:1", lying)), LayerError::Refused(w) if w.contains("diff id")));

    let escape = tar_entries(&[(tar::EntryType::Symlink, "up", &b"../../../../../../tmp"[..]), (tar::EntryType::Regular, "up/warren-escaped", &b"x"[..])]);
    let hostile = TestImage { layers: vec![escape], ..TestImage::default() };
    let refused = refusal(pull("hostile:1", hostile));
    assert!(matches!(&refused, LayerError::Refused(w) if w.contains("symlink")), "{refused:?}");
    assert!(!Path::new("/tmp/warren-escaped").exists(), "nothing written outside the store");

    let bomb = TestImage { layers: vec![tar_of(&[("zeros", &vec![0u8; 8 << 20])])], ..TestImage::default() };
    assert!(matches!(refusal(pull("bomb:1", bomb)), LayerError::TooLarge(w) if w.contains("uncompressed")));

    let tall = TestImage { layers: (0..4).map(|i| tar_of(&[(&format!("f{i}"), b"x")])).collect(), ..TestImage::default() };
    assert!(matches!(refusal(pull("tall:1", tall)), LayerError::TooLarge(w) if w.contains("layers")));

    let missing = rt.block_on(t.store.pull(&registry.reference("nothing:here"), &PullAuth::Anonymous)).map(|p| p.image);
    assert!(matches!(missing, Err(PullError::Registry(_))), "{missing:?}");
    let invalid = rt.block_on(t.store.pull("UPPER/case::bad", &PullAuth::Anonymous)).map(|p| p.image);
    assert!(matches!(invalid, Err(PullError::Reference(..))), "{invalid:?}");

    assert!(t.layer_dirs().is_empty(), "no layer (or unpack leftover) kept: {:?}", t.layer_dirs());
    assert_eq!(t.image_dirs(), 0);
}

#[test]
fn collector_removes_least_recently_used_images_never_those_in_use() {
    if skip_unless_root("collector_removes_least_recently_used_images_never_those_in_use") {
        return;
    }
    let rt = runtime();
    let registry = Registry::start().unwrap();
    // The disk holds both; the collector is asked for all of it as room.
    let t = TestStore::open(Limits::default(), 1 << 30);
    let (a_ref, b_ref) = (registry.reference("team/a:v1"), registry.reference("team/b:v1"));
    rt.block_on(image_a().push(&a_ref)).unwrap();
    rt.block_on(image_b().push(&b_ref)).unwrap();
    let a = rt.block_on(t.store.pull(&a_ref, &PullAuth::Anonymous)).map(|p| p.image).unwrap();
    let b_digest = rt.block_on(t.store.pull(&b_ref, &PullAuth::Anonymous)).map(|p| p.image).unwrap().digest();

    let report = t.store.collect(1 << 30);
    assert_eq!((report.images, report.layers), (1, 1), "b and its own layer go; a is in use");
    assert!(t.store.get(&b_digest).is_none() && t.store.get(&a.digest()).is_some());
    assert_eq!(t.layer_dirs().len(), 2, "a's layers (one shared with b) stay");
    assert!(a.root().join("usr/bin/y").exists(), "a still mounted");

    let a_root = a.root().to_path_buf();
    drop(a);
    let report = t.store.collect(1 << 30);
    assert_eq!((report.images, report.layers, report.bytes), (1, 2, 0));
    assert!(t.layer_dirs().is_empty() && t.image_dirs() == 0);
    assert!(!a_root.exists(), "unmounted and removed");
}
