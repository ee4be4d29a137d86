use std::os::unix::fs::{symlink, MetadataExt};

use super::*;

fn root() -> bool {
    rustix::process::geteuid().is_root()
}

/// A host directory with a secret, and a tree holding ways towards it.
fn hostile() -> (tempfile::TempDir, tempfile::TempDir) {
    let host = tempfile::tempdir().unwrap();
    std::fs::create_dir(host.path().join("etc")).unwrap();
    std::fs::write(host.path().join("etc/secret"), vec![7u8; 10_000]).unwrap();
    let tree = tempfile::tempdir().unwrap();
    symlink(host.path(), tree.path().join("out")).unwrap();
    symlink("../../../../../../..", tree.path().join("up")).unwrap();
    symlink("/proc/self/root", tree.path().join("magic")).unwrap();
    std::fs::create_dir(tree.path().join("d")).unwrap();
    std::fs::write(tree.path().join("d/f"), b"12345").unwrap();
    (host, tree)
}

#[test]
fn no_path_leaves_the_tree() {
    let (host, tree) = hostile();
    let t = Dir::open(tree.path()).unwrap();
    for rel in ["out", "out/etc", "up", "up/etc", "magic", "magic/etc", "d/../out", "../", "/etc", "d/../../x"] {
        assert!(t.dir(Path::new(rel)).is_err(), "{rel}");
    }
    assert!(t.lookup(Path::new("out/etc/secret")).is_err() && t.lookup(Path::new("out")).is_err(), "a final symlink is refused too");
    assert!(t.lookup(Path::new("d/f")).is_ok());
    assert!(t.stat_path(Path::new("out/etc/secret")).unwrap().is_none(), "nothing of the tree is below a symlink");
    assert_eq!(t.stat_path(Path::new("out")).unwrap().unwrap().kind, Kind::Symlink);
    assert!(t.open_file(OsStr::new("out")).is_err(), "a symlink does not open as a file");
    // A symlink is charged for itself, not for its target.
    let link_len = host.path().as_os_str().len() as u64;
    assert_eq!(t.charge(OsStr::new("out"), 100).unwrap(), 100 + link_len);
    assert_eq!(t.charge(OsStr::new("d"), 100).unwrap(), 200 + 5);
}

#[test]
fn writes_never_go_through_what_is_planted() {
    let (host, tree) = hostile();
    let t = Dir::open(tree.path()).unwrap();
    // A file written over a symlink replaces the link, not its target.
    t.write_file(OsStr::new("out"), &mut &b"mine"[..], Mode::from_raw_mode(0o644), (rustix::process::getuid().as_raw(), rustix::process::getgid().as_raw()), 0).unwrap();
    assert_eq!(std::fs::read(tree.path().join("out")).unwrap(), b"mine");
    assert!(host.path().join("etc/secret").exists() && std::fs::metadata(host.path().join("etc/secret")).unwrap().len() == 10_000);
    // Directories are made through real directories only.
    assert!(t.make_dirs(&RelPath::parse(b"up/x").unwrap()).is_err());
    assert!(t.make_dirs(&RelPath::parse(b"new/deeper").unwrap()).is_ok() && tree.path().join("new/deeper").is_dir());
    // A non-empty directory is not silently replaced by a file.
    std::fs::create_dir(tree.path().join("full")).unwrap();
    std::fs::write(tree.path().join("full/x"), b"x").unwrap();
    let err = t.write_file(OsStr::new("full"), &mut &b""[..], Mode::from_raw_mode(0o644), (0, 0), 0).unwrap_err();
    assert_eq!(Errno::from_io_error(&err), Some(Errno::NOTEMPTY));
}

#[test]
fn hard_links_stay_in_the_tree() {
    let (_host, tree) = hostile();
    let t = Dir::open(tree.path()).unwrap();
    let d = t.dir(Path::new("d")).unwrap();
    if root() {
        t.hard_link(&RelPath::parse(b"d/f").unwrap(), &d, OsStr::new("g")).unwrap();
        assert_eq!(std::fs::metadata(tree.path().join("d/g")).unwrap().ino(), std::fs::metadata(tree.path().join("d/f")).unwrap().ino());
    }
    for outside in ["out/etc/secret", "up/etc/passwd", "magic/etc/passwd", "missing"] {
        assert!(t.hard_link(&RelPath::parse(outside.as_bytes()).unwrap(), &d, OsStr::new("h")).is_err(), "{outside}");
    }
    let err = t.hard_link(&RelPath::parse(b"d").unwrap(), &d, OsStr::new("h")).unwrap_err();
    assert_eq!(err.kind(), io::ErrorKind::InvalidInput, "a directory is no hard link target");
}

#[test]
fn removal_stays_in_the_tree() {
    let (host, tree) = hostile();
    std::os::unix::fs::symlink(host.path(), tree.path().join("d/link")).unwrap();
    let t = Dir::open(tree.path()).unwrap();
    t.remove_all(OsStr::new("d")).unwrap();
    assert!(!tree.path().join("d").exists());
    assert!(host.path().join("etc/secret").exists(), "the symlink went, not its target");
    t.remove_all(OsStr::new("absent")).unwrap();
    let mut names = t.names().unwrap();
    names.sort();
    assert_eq!(names, ["magic", "out", "up"]);
}

/// The attack: while the agent resolves a path of the tree, the sandbox
/// (still running, or a racing writer) swaps a directory on it for a
/// symlink to the host, thousands of times. No resolution ever lands
/// outside the tree.
#[test]
fn a_directory_swapped_for_a_symlink_mid_resolution_leads_nowhere() {
    let (host, tree) = hostile();
    std::fs::write(host.path().join("etc/marker"), b"host").unwrap();
    std::fs::create_dir(tree.path().join("a")).unwrap();
    std::fs::create_dir(tree.path().join("a/etc")).unwrap();
    std::fs::write(tree.path().join("a/etc/marker"), b"tree").unwrap();
    let t = Dir::open(tree.path()).unwrap();
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let swapper = {
        let (stop, base) = (stop.clone(), tree.path().to_path_buf());
        let host = host.path().to_path_buf();
        std::thread::spawn(move || {
            while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                let _ = std::fs::rename(base.join("a"), base.join("a.real"));
                let _ = symlink(&host, base.join("a"));
                let _ = std::fs::remove_file(base.join("a"));
                let _ = std::fs::rename(base.join("a.real"), base.join("a"));
            }
        })
    };
    let mut reached = 0;
    for _ in 0..20_000 {
        if let Ok(d) = t.dir(Path::new("a/etc")) {
            let mut text = String::new();
            d.open_file(OsStr::new("marker")).unwrap().read_to_string(&mut text).unwrap();
            assert_eq!(text, "tree", "resolved through the swapped-in symlink");
            reached += 1;
        }
    }
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    swapper.join().unwrap();
    assert!(reached > 0, "the real directory was never reached: the test proves nothing");
}
