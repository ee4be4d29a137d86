//! A storage mount through the kernel: the FUSE server over an object
//! store, used with plain file I/O from another thread, as a sandbox's
//! program would. (The sandbox wiring comes with the agent's mounts.)

use std::io::{Read, Seek, SeekFrom, Write};
use std::path::PathBuf;
use std::sync::Arc;

use object_store::memory::InMemory;
use object_store::path::Path;
use object_store::{ObjectStore, PutPayload};
use warren_e2e::skip_unless_root;
use warren_storage::{fuse, MountOptions, ObjectTree};

struct Fixture {
    store: Arc<InMemory>,
    tree: Arc<ObjectTree>,
    at: PathBuf,
    mounted: Option<fuse::Mounted>,
    _dir: tempfile::TempDir,
}

async fn mounted(read_only: bool) -> Fixture {
    mounted_with_reserve(read_only, 0).await
}

async fn mounted_with_reserve(read_only: bool, disk_reserve: u64) -> Fixture {
    let store = Arc::new(InMemory::new());
    for (k, v) in [("tenants/a/in/customers.csv", "id,name\n1,ada\n2,bob\n"), ("tenants/a/in/notes.txt", "hello"), ("tenants/ab/secret", "sibling"), ("tenants/top", "above")] {
        store.put(&Path::from(k), PutPayload::from(v)).await.unwrap();
    }
    let dir = tempfile::tempdir().unwrap();
    let (at, spool) = (dir.path().join("mnt"), dir.path().join("spool"));
    std::fs::create_dir_all(&at).unwrap();
    std::fs::create_dir_all(&spool).unwrap();
    let options = MountOptions { read_only, spool, write_limit: 256 << 20, deadline: None, disk_reserve };
    let tree = Arc::new(ObjectTree::with_options(store.clone(), Path::from("tenants/a"), options));
    let mounted = fuse::mount_tree(tree.clone(), &at, 0, 0, tokio::runtime::Handle::current()).unwrap();
    Fixture { store, tree, at, mounted: Some(mounted), _dir: dir }
}

async fn stored(store: &InMemory, key: &str) -> Option<Vec<u8>> {
    Some(store.get(&Path::from(key)).await.ok()?.bytes().await.ok()?.to_vec())
}

/// Runs blocking file I/O off the runtime that serves the mount.
async fn fs<T: Send + 'static>(f: impl FnOnce() -> T + Send + 'static) -> T {
    tokio::task::spawn_blocking(f).await.unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn plain_file_io_reads_and_writes_the_bucket() {
    if skip_unless_root("plain_file_io_reads_and_writes_the_bucket") {
        return;
    }
    let mut f = mounted(false).await;
    let at = f.at.clone();
    let (listing, csv, part) = fs(move || {
        let mut names: Vec<String> = std::fs::read_dir(at.join("in")).unwrap().map(|e| e.unwrap().file_name().into_string().unwrap()).collect();
        names.sort();
        let csv = std::fs::read_to_string(at.join("in/customers.csv")).unwrap();
        let mut file = std::fs::File::open(at.join("in/customers.csv")).unwrap();
        file.seek(SeekFrom::Start(8)).unwrap();
        let mut part = [0u8; 5];
        file.read_exact(&mut part).unwrap();
        (names, csv, part)
    })
    .await;
    assert_eq!(listing, ["customers.csv", "notes.txt"]);
    assert_eq!(csv, "id,name\n1,ada\n2,bob\n");
    assert_eq!(&part, b"1,ada", "seek and partial reads");

    let at = f.at.clone();
    fs(move || {
        std::fs::create_dir(at.join("out")).unwrap();
        std::fs::write(at.join("out/report.txt"), "total 2\n").unwrap();
        let mut log = std::fs::OpenOptions::new().append(true).open(at.join("in/notes.txt")).unwrap();
        log.write_all(b", world").unwrap();
        drop(log);
        std::fs::rename(at.join("out/report.txt"), at.join("out/final.txt")).unwrap();
        std::fs::remove_file(at.join("in/customers.csv")).unwrap();
        let meta = std::fs::metadata(at.join("out/final.txt")).unwrap();
        assert_eq!(meta.len(), 8, "stat sees the size");
    })
    .await;
    assert!(f.tree.sync().await.is_empty());
    assert_eq!(stored(&f.store, "tenants/a/out/final.txt").await.as_deref(), Some(&b"total 2\n"[..]));
    assert_eq!(stored(&f.store, "tenants/a/out/report.txt").await, None);
    assert_eq!(stored(&f.store, "tenants/a/in/notes.txt").await.as_deref(), Some(&b"hello, world"[..]));
    assert_eq!(stored(&f.store, "tenants/a/in/customers.csv").await, None);

    let at = f.at.clone();
    let escapes = fs(move || {
        ["../ab/secret", "../top", "in/../../ab/secret", "..%2fab/secret"]
            .iter()
            .filter(|p| std::fs::read(at.join(p)).is_ok())
            .map(|p| p.to_string())
            .collect::<Vec<_>>()
    })
    .await;
    assert!(escapes.is_empty(), "read outside the mount: {escapes:?}");
    f.mounted.take().unwrap().unmount().unwrap();
    assert!(!std::fs::read_to_string("/proc/self/mountinfo").unwrap().contains(f.at.to_str().unwrap()), "nothing left mounted");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_read_only_mount_refuses_writes_at_the_syscall() {
    if skip_unless_root("a_read_only_mount_refuses_writes_at_the_syscall") {
        return;
    }
    let f = mounted(true).await;
    let at = f.at.clone();
    let errors = fs(move || {
        let codes = |r: std::io::Result<()>| r.err().and_then(|e| e.raw_os_error());
        vec![
            codes(std::fs::write(at.join("new.txt"), "x")),
            codes(std::fs::OpenOptions::new().append(true).open(at.join("in/notes.txt")).map(|_| ())),
            codes(std::fs::remove_file(at.join("in/notes.txt"))),
            codes(std::fs::create_dir(at.join("d"))),
            codes(std::fs::rename(at.join("in/notes.txt"), at.join("in/n.txt"))),
        ]
    })
    .await;
    assert!(errors.iter().all(|e| *e == Some(libc::EROFS)), "{errors:?}");
    assert_eq!(stored(&f.store, "tenants/a/in/notes.txt").await.as_deref(), Some(&b"hello"[..]));
}

/// A disk already below the agent's reserve takes no write: the program's
/// write fails with ENOSPC, which the program sees, and no content is
/// stored. (The file is closed explicitly: CPython's finalizer drops an
/// error of an implicit close, as it does on a full local disk.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_write_past_the_disk_reserve_fails_where_the_program_sees_it() {
    if skip_unless_root("a_write_past_the_disk_reserve_fails_where_the_program_sees_it") {
        return;
    }
    let mut f = mounted_with_reserve(false, u64::MAX / 4).await;
    let target = f.at.join("out.txt");
    let out = fs(move || {
        std::process::Command::new("python3").arg("-c").arg(format!("with open({:?}, 'w') as f: f.write('2')", target.to_str().unwrap())).output().unwrap()
    })
    .await;
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("No space left on device"), "the program must see the failure: {stderr:?}");
    let stored = stored(&f.store, "tenants/a/out.txt").await;
    assert!(stored.as_deref().is_none_or(|b| b.is_empty()), "nothing of the refused write is stored: {stored:?}");
    f.mounted.take().unwrap().unmount().unwrap();
}

/// The mount point shows in the host's mountinfo: another host user must
/// not read the bucket through it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn another_host_user_reads_nothing_through_the_mount() {
    if skip_unless_root("another_host_user_reads_nothing_through_the_mount") {
        return;
    }
    let f = mounted(false).await;
    // Like the agent's homes dir (0711): others may pass, not list.
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(f.at.parent().unwrap(), std::fs::Permissions::from_mode(0o711)).unwrap();
    let file = f.at.join("in/notes.txt");
    let (ok, denied) = fs(move || {
        let as_user = |uid: u32| {
            std::process::Command::new("setpriv")
                .args(["--reuid", &uid.to_string(), "--regid", &uid.to_string(), "--clear-groups", "cat"])
                .arg(&file)
                .output()
                .unwrap()
        };
        // The test mounted it for uid 0 (owner); 65534 is anyone else.
        (as_user(0), as_user(65534))
    })
    .await;
    assert_eq!(String::from_utf8_lossy(&ok.stdout), "hello", "{ok:?}");
    assert!(!denied.status.success() && denied.stdout.is_empty(), "another user read it: {denied:?}");
}
