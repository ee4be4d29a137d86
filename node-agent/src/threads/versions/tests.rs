//! Forks, restores and the collector over a directory store, with a fork
//! stopped (a crash) or raced at each of its steps.

use std::sync::Mutex;

use futures_util::FutureExt;

use super::*;
use crate::threads::history::{Keep, Kind};
use crate::threads::store::DirStore;

struct Lab {
    dir: tempfile::TempDir,
    store: Arc<dyn BlobStore>,
}

impl Lab {
    fn new() -> Lab {
        let dir = tempfile::tempdir().unwrap();
        let store: Arc<dyn BlobStore> = Arc::new(DirStore::open(&dir.path().join("store")).unwrap());
        Lab { dir, store }
    }

    fn threads(&self) -> Threads {
        Threads::new(self.store.clone(), &self.dir.path().join("cache")).unwrap()
    }

    fn path(&self, key: &str) -> std::path::PathBuf {
        self.dir.path().join("store").join(key)
    }

    fn exists(&self, key: &str) -> bool {
        self.path(key).exists()
    }

    /// Makes every stored object look two hours old (older than the grace).
    fn age_all(&self) {
        let old = std::time::SystemTime::now() - Duration::from_secs(7200);
        for e in walk(&self.dir.path().join("store")) {
            std::fs::File::options().write(true).open(&e).unwrap().set_modified(old).unwrap();
        }
    }

    async fn layer(&self, thread: &str) -> LayerRef {
        let key = tk(thread).layer_key(&new_id());
        assert!(self.store.put_if(&key, Bytes::from_static(b"layer"), None).await.unwrap());
        LayerRef { key, size: 5 }
    }

    async fn publish(&self, thread: &str, m: &Manifest) {
        let key = tk(thread).manifest_key();
        let version = self.store.get_versioned(&key).await.unwrap().map(|(_, v)| v);
        assert!(self.store.put_if(&key, Bytes::from(serde_json::to_vec(m).unwrap()), version).await.unwrap());
    }

    async fn manifest(&self, thread: &str) -> Option<Manifest> {
        let (bytes, _) = self.store.get_versioned(&tk(thread).manifest_key()).await.unwrap()?;
        Some(Manifest::parse(&bytes, &tk(thread)).unwrap()).filter(|m| !m.is_tombstone())
    }

    /// Every layer of every live manifest is still stored.
    async fn all_named_layers_exist(&self, threads: &[&str]) {
        for t in threads {
            if let Some(m) = self.manifest(t).await {
                for l in m.all_layers() {
                    assert!(self.exists(&l.key), "{t} names {} which is gone", l.key);
                }
            }
        }
    }
}

fn walk(dir: &Path) -> Vec<std::path::PathBuf> {
    let mut out = Vec::new();
    for e in std::fs::read_dir(dir).into_iter().flatten().flatten() {
        let p = e.path();
        if p.is_dir() {
            out.extend(walk(&p));
        } else {
            out.push(p);
        }
    }
    out
}

fn tk(id: &str) -> ThreadKey {
    ThreadKey::new("team", "agent", id).unwrap()
}

fn opts(id: &str) -> ThreadOptions {
    ThreadOptions { key: tk(id), retention: None, max_bytes: 1 << 30, max_threads: None, history: 50 }
}

fn run(trace: &str) -> Option<Produced> {
    Some(Produced { trace_id: trace.into(), kind: Kind::Execution, exit: Some(0) })
}

const KEEP: Keep = Keep { count: 50, max_age: None };

/// A source thread of two versions: `trc_1` (layer a), `trc_2` (a, b).
async fn source(lab: &Lab) -> (Manifest, LayerRef, LayerRef) {
    let (a, b) = (lab.layer("src").await, lab.layer("src").await);
    let one = history::advance(None, Manifest { layers: vec![a.clone()], bytes: 5, ..Manifest::empty(1) }, run("trc_1"), KEEP);
    let two = history::advance(Some(&one), Manifest { layers: vec![a.clone(), b.clone()], bytes: 10, ..Manifest::empty(2) }, run("trc_2"), KEEP);
    lab.publish("src", &two).await;
    (two, a, b)
}

fn keys(ids: &[&str]) -> Vec<ThreadKey> {
    ids.iter().map(|i| tk(i)).collect()
}

#[tokio::test]
async fn a_fork_names_the_source_s_layers_and_copies_no_bytes() {
    let lab = Lab::new();
    let threads = lab.threads();
    let (_, a, b) = source(&lab).await;
    threads.fork(&opts("src"), &keys(&["f1", "f2"]), None).await.unwrap();
    for f in ["f1", "f2"] {
        let m = lab.manifest(f).await.unwrap();
        assert_eq!((m.layers.clone(), m.bytes), (vec![a.clone(), b.clone()], 10));
        assert_eq!(m.history.len(), 2, "the fork keeps the source's history");
        let own: Vec<_> = walk(&lab.path(&format!("threads/team/agent/{f}")));
        assert_eq!(own.len(), 1, "only a manifest was written for {f}: {own:?}");
    }
    threads.fork(&opts("src"), &keys(&["early"]), Some("trc_1")).await.unwrap();
    assert_eq!(lab.manifest("early").await.unwrap().layers, vec![a.clone()]);
    // A fork of a fork, and the restore of a fork, work the same way.
    threads.fork(&opts("f1"), &keys(&["f1-1"]), Some("trc_1")).await.unwrap();
    assert_eq!(lab.manifest("f1-1").await.unwrap().layers, vec![a.clone()]);
    let v = threads.restore_version(&opts("f2"), "trc_1", Produced { trace_id: "trc_r".into(), kind: Kind::Restore, exit: None }).await.unwrap();
    assert_eq!((v.kind, v.bytes), (Kind::Restore, 5));
    let f2 = lab.manifest("f2").await.unwrap();
    assert_eq!((f2.layers.clone(), f2.history.len()), (vec![a.clone()], 3));
    assert_eq!(lab.manifest("src").await.unwrap().layers, vec![a, b], "the source is untouched");
    let listed = threads.history(&tk("f2")).await.unwrap();
    let traces: Vec<(&str, bool)> = listed.iter().map(|l| (l.version.trace_id.as_str(), l.current)).collect();
    assert_eq!(traces, [("trc_r", true), ("trc_2", false), ("trc_1", false)]);
}

#[tokio::test]
async fn bad_forks_are_refused_and_leave_nothing_made() {
    let lab = Lab::new();
    let threads = lab.threads();
    source(&lab).await;
    threads.fork(&opts("src"), &keys(&["taken"]), None).await.unwrap();
    let err = threads.fork(&opts("src"), &keys(&["new", "taken"]), None).await.unwrap_err();
    assert!(matches!(err, ThreadError::Exists), "{err}");
    assert!(lab.manifest("new").await.is_none(), "the fork made before the refusal is undone");
    assert!(matches!(threads.fork(&opts("nope"), &keys(&["x"]), None).await, Err(ThreadError::NotFound)));
    assert!(matches!(threads.fork(&opts("src"), &keys(&["x"]), Some("trc_9")).await, Err(ThreadError::VersionNotFound)));
    let limited = ThreadOptions { max_threads: Some(2), ..opts("src") };
    assert!(matches!(threads.fork(&limited, &keys(&["x"]), None).await, Err(ThreadError::Limit { max: 2 })), "src and taken are live");
    let small = ThreadOptions { max_bytes: 9, ..opts("src") };
    assert!(matches!(threads.fork(&small, &keys(&["x"]), None).await, Err(ThreadError::TooLarge { bytes: 10, limit: 9 })));
    assert!(lab.manifest("x").await.is_none());
    assert!(matches!(threads.restore_version(&opts("src"), "trc_9", Produced::files()).await, Err(ThreadError::VersionNotFound)));
    assert!(matches!(threads.restore_version(&opts("nope"), "trc_1", Produced::files()).await, Err(ThreadError::NotFound)));
    let _held = threads.lock(&tk("src")).await.unwrap();
    assert!(matches!(threads.restore_version(&opts("src"), "trc_1", Produced::files()).await, Err(ThreadError::Busy)), "a restore waits for no running call");
}

#[tokio::test]
async fn deleting_the_source_leaves_its_forks_whole_and_the_last_name_frees_a_layer() {
    let lab = Lab::new();
    let threads = lab.threads();
    let (_, a, b) = source(&lab).await;
    threads.fork(&opts("src"), &keys(&["f"]), None).await.unwrap();
    lab.age_all(); // the fork's lease is long gone
    threads.collect(Duration::from_secs(3600)).await.unwrap();
    threads.delete(&tk("src")).await.unwrap();
    assert!(lab.exists(&a.key) && lab.exists(&b.key), "the fork still names them");
    lab.all_named_layers_exist(&["f"]).await;
    threads.delete(&tk("f")).await.unwrap();
    assert!(!lab.exists(&a.key) && !lab.exists(&b.key), "nothing names them now");
}

#[tokio::test]
async fn the_collector_removes_only_what_no_version_or_fork_names() {
    let lab = Lab::new();
    let threads = lab.threads();
    let (two, a, b) = source(&lab).await;
    threads.fork(&opts("src"), &keys(&["f"]), Some("trc_1")).await.unwrap();
    // The source compacts to c keeping one version: a and b are named only
    // by the fork (a) and by nothing (b).
    let c = lab.layer("src").await;
    let three = history::advance(Some(&two), Manifest { layers: vec![c.clone()], bytes: 10, ..Manifest::empty(3) }, run("trc_3"), Keep { count: 1, max_age: None });
    lab.publish("src", &three).await;
    let crashed = lab.layer("src").await; // a save that never published
    lab.age_all();
    let report = threads.collect(Duration::from_secs(3600)).await.unwrap();
    assert_eq!(report.orphans, 2, "{report:?}");
    assert!(lab.exists(&a.key) && lab.exists(&c.key));
    assert!(!lab.exists(&b.key) && !lab.exists(&crashed.key));
    lab.all_named_layers_exist(&["src", "f"]).await;
    // Young objects wait for the grace.
    let young = lab.layer("src").await;
    threads.collect(Duration::from_secs(3600)).await.unwrap();
    assert!(lab.exists(&young.key));
}

type Steps = Arc<Mutex<Vec<Step>>>;

/// Threads whose forks run `at_step` at each step.
fn hooked(lab: &Lab, at_step: impl Fn(Step) -> io::Result<()> + Send + Sync + 'static) -> (Threads, Steps) {
    let seen: Steps = Arc::default();
    let log = seen.clone();
    let hook: Hook = Arc::new(move |s| {
        log.lock().unwrap().push(s);
        let r = at_step(s);
        async move { r }.boxed()
    });
    (lab.threads().with_hook(hook), seen)
}

#[tokio::test]
async fn a_fork_stopped_at_any_step_leaves_every_named_layer_in_place() {
    for stop in [Step::LeaseWritten, Step::SourceRead, Step::Published(0), Step::Published(1)] {
        let lab = Lab::new();
        let (_, a, b) = source(&lab).await;
        let (threads, _) = hooked(&lab, move |s| if s == stop { Err(io::Error::other("crash")) } else { Ok(()) });
        assert!(threads.fork(&opts("src"), &keys(&["f1", "f2"]), None).await.is_err(), "{stop:?}");
        // The crash left some forks, each whole (an error return after
        // publishing is a crash here: no rollback runs past the step).
        let made = [lab.manifest("f1").await.is_some(), lab.manifest("f2").await.is_some()];
        let want = match stop {
            Step::Published(0) => [true, false],
            Step::Published(_) => [true, true],
            _ => [false, false],
        };
        assert_eq!(made, want, "{stop:?}");
        // While the lease is young the collector removes nothing, not even an
        // old orphan; once it is old, only what nothing names.
        let orphan = lab.layer("src").await;
        lab.age_all();
        let now = std::time::SystemTime::now();
        for lease in walk(&lab.path("leases")) {
            std::fs::File::options().write(true).open(&lease).unwrap().set_modified(now).unwrap();
        }
        let plain = lab.threads();
        plain.collect(Duration::from_secs(3600)).await.unwrap();
        assert!(lab.exists(&orphan.key), "a young lease holds the collector off ({stop:?})");
        lab.age_all();
        plain.collect(Duration::from_secs(3600)).await.unwrap();
        assert!(!lab.exists(&orphan.key), "{stop:?}");
        assert!(lab.exists(&a.key) && lab.exists(&b.key), "{stop:?}");
        lab.all_named_layers_exist(&["src", "f1", "f2"]).await;
        assert!(walk(&lab.path("leases")).is_empty(), "the stale lease went ({stop:?})");
    }
}

#[tokio::test]
async fn a_fork_racing_a_compaction_and_a_collector_pass_loses_nothing() {
    let lab = Arc::new(Lab::new());
    let (two, a, b) = source(&lab).await;
    lab.age_all();
    // Between the fork's read of the source and its publish, the source
    // compacts away a and b (keeping no old version) and a collector pass
    // runs over objects old enough to go.
    let (l2, two2) = (lab.clone(), two.clone());
    let (threads, steps) = hooked(&lab, move |s| {
        if s == Step::SourceRead {
            let (lab, two) = (l2.clone(), two2.clone());
            std::thread::spawn(move || {
                tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap().block_on(async {
                    let c = lab.layer("src").await;
                    let three = history::advance(Some(&two), Manifest { layers: vec![c], bytes: 10, ..Manifest::empty(3) }, run("trc_3"), Keep { count: 1, max_age: None });
                    lab.publish("src", &three).await;
                    lab.threads().collect(Duration::from_secs(3600)).await.unwrap();
                })
            })
            .join()
            .unwrap();
        }
        Ok(())
    });
    threads.fork(&opts("src"), &keys(&["f"]), None).await.unwrap();
    assert!(steps.lock().unwrap().contains(&Step::SourceRead));
    assert_eq!(lab.manifest("f").await.unwrap().layers, vec![a.clone(), b.clone()]);
    assert!(lab.exists(&a.key) && lab.exists(&b.key), "the fork's lease kept the collector off");
    lab.all_named_layers_exist(&["src", "f"]).await;
}
