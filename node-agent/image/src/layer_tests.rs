//! Honest and hostile layers against a real directory (root: owners, device
//! whiteouts and trusted xattrs need it).

use std::fs;
use std::os::unix::fs::{FileTypeExt, MetadataExt, PermissionsExt};
use std::path::Path;

use tar::{EntryType, Header};

use super::*;

/// Builds tar bytes with raw headers: unlike `Builder::append_path`, nothing
/// here sanitises paths, so hostile archives can be expressed.
struct Tar(tar::Builder<Vec<u8>>);

impl Tar {
    fn new() -> Tar {
        Tar(tar::Builder::new(Vec::new()))
    }

    fn entry(&mut self, kind: EntryType, path: &str, mode: u32, data: &[u8], link: &str) -> &mut Tar {
        let mut h = Header::new_gnu();
        h.as_old_mut().name[..path.len()].copy_from_slice(path.as_bytes());
        h.as_old_mut().linkname[..link.len()].copy_from_slice(link.as_bytes());
        h.set_entry_type(kind);
        h.set_mode(mode);
        h.set_uid(0);
        h.set_gid(0);
        h.set_mtime(1_600_000_000);
        h.set_size(data.len() as u64);
        h.set_cksum();
        self.0.append(&h, data).unwrap();
        self
    }

    fn file(&mut self, path: &str, mode: u32, data: &[u8]) -> &mut Tar {
        self.entry(EntryType::Regular, path, mode, data, "")
    }

    fn dir(&mut self, path: &str) -> &mut Tar {
        self.entry(EntryType::Directory, path, 0o755, b"", "")
    }

    fn symlink(&mut self, path: &str, target: &str) -> &mut Tar {
        self.entry(EntryType::Symlink, path, 0o777, b"", target)
    }

    fn link(&mut self, path: &str, target: &str) -> &mut Tar {
        self.entry(EntryType::Link, path, 0o644, b"", target)
    }

    fn raw(&mut self, h: Header, data: &[u8]) -> &mut Tar {
        self.0.append(&h, data).unwrap();
        self
    }

    fn bytes(&mut self) -> Vec<u8> {
        std::mem::replace(&mut self.0, tar::Builder::new(Vec::new())).into_inner().unwrap()
    }
}

fn roomy() -> Budget {
    Budget { bytes: 64 << 20, entries: 10_000 }
}

/// Unpacks into a fresh layer dir inside a sandbox dir that also holds an
/// `outside/` directory the layer must never reach.
fn unpack(tar: &[u8], budget: &mut Budget) -> (tempfile::TempDir, Result<LayerStats, LayerError>) {
    let tmp = tempfile::tempdir().unwrap();
    fs::create_dir(tmp.path().join("layer")).unwrap();
    fs::create_dir(tmp.path().join("outside")).unwrap();
    let root = warren_confined::Dir::open(&tmp.path().join("layer")).unwrap();
    let result = apply(tar, &root, budget);
    (tmp, result)
}

fn is_root() -> bool {
    if rustix::process::geteuid().is_root() {
        return true;
    }
    eprintln!("SKIPPED: layer tests need root (owners, whiteout devices, trusted xattrs)");
    false
}

fn assert_outside_untouched(tmp: &Path) {
    assert_eq!(fs::read_dir(tmp.join("outside")).unwrap().count(), 0, "nothing written outside the layer");
}

#[test]
fn honest_layer_keeps_files_modes_owners_links_and_times() {
    if !is_root() {
        return;
    }
    let mut h = Header::new_gnu();
    h.set_path("usr/bin/tool").unwrap();
    h.set_entry_type(EntryType::Regular);
    h.set_mode(0o750);
    h.set_uid(1000);
    h.set_gid(50);
    h.set_mtime(1_234_567);
    h.set_size(3);
    h.set_cksum();
    let tar = Tar::new()
        .dir("./usr/")
        .raw(h, b"hi\n")
        .file("etc/deep/implied/parents.conf", 0o644, b"x")
        .symlink("bin", "usr/bin")
        .symlink("usr/bin/abs", "/etc/passwd")
        .link("usr/bin/tool2", "usr/bin/tool")
        .bytes();
    let (tmp, stats) = unpack(&tar, &mut roomy());
    let stats = stats.unwrap();
    assert_eq!(stats, LayerStats { entries: 6, neutralised: 0 });
    let layer = tmp.path().join("layer");
    let tool = fs::metadata(layer.join("usr/bin/tool")).unwrap();
    assert_eq!((tool.mode() & 0o7777, tool.uid(), tool.gid(), tool.mtime()), (0o750, 1000, 50, 1_234_567));
    assert_eq!(fs::read(layer.join("usr/bin/tool2")).unwrap(), b"hi\n");
    assert_eq!(tool.ino(), fs::metadata(layer.join("usr/bin/tool2")).unwrap().ino(), "a real hard link");
    assert_eq!(fs::read_link(layer.join("bin")).unwrap(), Path::new("usr/bin"));
    assert_eq!(fs::read_link(layer.join("usr/bin/abs")).unwrap(), Path::new("/etc/passwd"), "stored, never followed");
    assert_eq!(fs::metadata(layer.join("etc/deep/implied")).unwrap().permissions().mode() & 0o777, 0o755);
}

#[test]
fn whiteouts_become_overlay_whiteouts_and_opaque_dirs() {
    if !is_root() {
        return;
    }
    let tar = Tar::new().file("etc/.wh.motd", 0o644, b"").file("var/cache/.wh..wh..opq", 0o644, b"").file(".wh..wh.plnk", 0o644, b"").bytes();
    let (tmp, stats) = unpack(&tar, &mut roomy());
    assert_eq!(stats.unwrap().entries, 2);
    let layer = tmp.path().join("layer");
    let motd = fs::symlink_metadata(layer.join("etc/motd")).unwrap();
    assert!(motd.file_type().is_char_device() && motd.rdev() == 0, "0/0 char device");
    let opaque = xattr_get(&layer.join("var/cache"), "trusted.overlay.opaque");
    assert_eq!(opaque.as_deref(), Some(&b"y"[..]));
    assert!(!layer.join(".wh..wh.plnk").exists());
}

fn xattr_get(path: &Path, name: &str) -> Option<Vec<u8>> {
    let mut buf = vec![0u8; 16];
    let n = rustix::fs::getxattr(path, name, &mut buf[..]).ok()?;
    buf.truncate(n);
    Some(buf)
}

#[test]
fn paths_that_escape_are_refused_and_write_nothing_outside() {
    if !is_root() {
        return;
    }
    let cases: Vec<(&str, Vec<u8>)> = vec![
        ("dot-dot", Tar::new().file("../outside/pwned", 0o644, b"x").bytes()),
        ("dot-dot deep", Tar::new().file("a/../../outside/pwned", 0o644, b"x").bytes()),
        ("through a symlink to an absolute dir", Tar::new().symlink("evil", "/").file("evil/tmp/pwned", 0o644, b"x").bytes()),
        ("through a symlink upwards", Tar::new().symlink("up", "../outside").file("up/pwned", 0o644, b"x").bytes()),
        ("dir through a symlink", Tar::new().symlink("up", "../outside").dir("up/sub").bytes()),
        ("whiteout through a symlink", Tar::new().symlink("up", "../outside").file("up/.wh.x", 0o644, b"").bytes()),
        ("hard link out of the layer", Tar::new().link("passwd", "/etc/passwd").bytes()),
        ("hard link climbing", Tar::new().link("passwd", "../outside/x").bytes()),
        ("hard link through a symlink", Tar::new().symlink("up", "..").link("passwd", "up/outside").bytes()),
        ("hard link to a symlink", Tar::new().symlink("s", "/etc/shadow").link("l", "s").bytes()),
        ("file replacing a full dir", Tar::new().file("d/f", 0o644, b"x").file("d", 0o644, b"y").bytes()),
    ];
    for (name, tar) in cases {
        let (tmp, result) = unpack(&tar, &mut roomy());
        assert!(matches!(result, Err(LayerError::Refused(_))), "{name}: {result:?}");
        assert_outside_untouched(tmp.path());
    }
    // An absolute path is anchored in the layer, not the host.
    let (tmp, result) = unpack(&Tar::new().file("/outside/anchored", 0o644, b"x").bytes(), &mut roomy());
    result.unwrap();
    assert!(tmp.path().join("layer/outside/anchored").exists());
    assert_outside_untouched(tmp.path());
}

#[test]
fn devices_set_id_bits_high_owners_and_xattrs_are_neutralised() {
    if !is_root() {
        return;
    }
    let mut high = Header::new_gnu();
    high.set_path("high").unwrap();
    high.set_mode(0o644);
    high.set_uid(4_000_000);
    high.set_gid(0);
    high.set_size(0);
    high.set_cksum();
    let mut pax = tar::Builder::new(Vec::new());
    pax.append_pax_extensions([("SCHILY.xattr.security.capability", &b"\x01\x00\x00\x02"[..])]).unwrap();
    let mut pax = pax.into_inner().unwrap();
    pax.truncate(pax.len() - 1024);
    let mut tar = Tar::new()
        .entry(EntryType::Char, "dev/mem", 0o666, b"", "")
        .entry(EntryType::Block, "dev/sda", 0o666, b"", "")
        .entry(EntryType::Fifo, "fifo", 0o666, b"", "")
        .file("suid", 0o4755, b"x")
        .entry(EntryType::Directory, "sticky", 0o3777, b"", "")
        .raw(high, b"")
        .bytes();
    tar.truncate(tar.len() - 1024); // drop the end-of-archive blocks
    tar.extend_from_slice(&pax);
    tar.extend_from_slice(&Tar::new().file("capped", 0o755, b"x").bytes());
    let (tmp, stats) = unpack(&tar, &mut roomy());
    let stats = stats.unwrap();
    let layer = tmp.path().join("layer");
    assert!(!layer.join("dev/mem").exists() && !layer.join("dev/sda").exists() && !layer.join("fifo").exists());
    assert_eq!(fs::metadata(layer.join("suid")).unwrap().mode() & 0o7777, 0o755);
    assert_eq!(fs::metadata(layer.join("sticky")).unwrap().mode() & 0o7777, 0o1777, "sticky kept, setgid dropped");
    assert_eq!(fs::metadata(layer.join("high")).unwrap().uid(), 65_534);
    assert!(layer.join("capped").exists());
    assert_eq!(xattr_get(&layer.join("capped"), "security.capability"), None, "no file capabilities");
    assert_eq!(stats.neutralised, 6 + 1);
}

#[test]
fn bombs_and_floods_hit_the_budget() {
    if !is_root() {
        return;
    }
    // 64 MiB of zeros (compresses to almost nothing) against a 1 MiB budget.
    let zeros = vec![0u8; 64 << 20];
    let tar = Tar::new().file("bomb", 0o644, &zeros).bytes();
    let mut gz = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
    std::io::Write::write_all(&mut gz, &tar).unwrap();
    let gz = gz.finish().unwrap();
    assert!(gz.len() < 1 << 20);
    let mut budget = Budget { bytes: 1 << 20, entries: 10 };
    let stream = crate::digest::Metered::new(flate2::read::GzDecoder::new(&gz[..]), budget.bytes, "uncompressed bytes per image");
    let tmp = tempfile::tempdir().unwrap();
    let result = apply(stream, &warren_confined::Dir::open(tmp.path()).unwrap(), &mut budget);
    assert!(matches!(&result, Err(LayerError::TooLarge(w)) if w == "uncompressed bytes per image"), "{result:?}");

    let mut many = Tar::new();
    for i in 0..20 {
        many.file(&format!("f{i}"), 0o644, b"");
    }
    let mut budget = Budget { bytes: 1 << 20, entries: 10 };
    let (_tmp, result) = unpack(&many.bytes(), &mut budget);
    assert!(matches!(&result, Err(LayerError::TooLarge(w)) if w == "entries per image"), "{result:?}");

    // A GNU long name is read into memory: its size is bounded.
    let mut h = Header::new_gnu();
    h.as_old_mut().name[..13].copy_from_slice(b"././@LongLink");
    h.set_entry_type(EntryType::GNULongName);
    h.set_size(1 << 20);
    h.set_cksum();
    let (_tmp, result) = unpack(&Tar::new().raw(h, &vec![b'a'; 1 << 20]).bytes(), &mut roomy());
    assert!(matches!(&result, Err(LayerError::Refused(w)) if w.contains("extension header")), "{result:?}");
}

#[test]
fn long_names_and_later_entries_win() {
    if !is_root() {
        return;
    }
    let long = format!("{}/file", "d".repeat(200));
    let mut b = tar::Builder::new(Vec::new());
    let mut h = Header::new_gnu();
    h.set_mode(0o644);
    h.set_size(1);
    h.set_uid(0);
    h.set_gid(0);
    h.set_mtime(0);
    b.append_data(&mut h, &long, &b"1"[..]).unwrap(); // GNU long name record
    let mut tar = b.into_inner().unwrap();
    tar.truncate(tar.len() - 1024);
    tar.extend_from_slice(&Tar::new().file("x", 0o644, b"old").file("x", 0o600, b"new").symlink("x", "y").bytes());
    let (tmp, stats) = unpack(&tar, &mut roomy());
    stats.unwrap();
    let layer = tmp.path().join("layer");
    assert_eq!(fs::read(layer.join(&long)).unwrap(), b"1");
    assert_eq!(fs::read_link(layer.join("x")).unwrap(), Path::new("y"));
}
