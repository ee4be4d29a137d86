//! The node's image store:
//!
//! ```text
//! <dir>/layers/<hex>/        one unpacked layer (an overlay lower dir), keyed by its blob digest
//! <dir>/layers/<hex>.json    its record (uncompressed bytes, entries); written before the dir is renamed in
//! <dir>/layers/.tmp-*        layers being unpacked (cleared at start)
//! <dir>/images/<hex>/        one image, keyed by its manifest digest:
//!     image.json             record (reference, layers, env, languages)
//!     top/                   the Warren layer
//!     root/                  the read-only overlay sandboxes bind as `/`
//! ```
//!
//! An image handed out as `Arc<Image>` is in use until every clone is
//! dropped; the collector never removes an image in use, and removes a
//! layer only when no image left needs it.

use std::collections::{HashMap, HashSet};
use std::fs;
use std::io;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{SystemTime, UNIX_EPOCH};

use serde::{Deserialize, Serialize};
use tracing::{info, warn};

use crate::rootfs;

/// Bounds on what one image may bring to the node.
#[derive(Debug, Clone, Copy)]
pub struct Limits {
    /// Layers per image.
    pub max_layers: usize,
    /// Compressed bytes per layer blob.
    pub max_layer_bytes: u64,
    /// Uncompressed bytes per image (all layers' tar streams).
    pub max_image_bytes: u64,
    /// Files, directories and links per image.
    pub max_entries: u64,
}

impl Default for Limits {
    fn default() -> Limits {
        Limits { max_layers: 40, max_layer_bytes: 4 << 30, max_image_bytes: 16 << 30, max_entries: 1_000_000 }
    }
}

/// An interpreter found in an image.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Interpreter {
    /// `python`, `node` or `bash`.
    pub language: String,
    /// Path inside the image.
    pub path: String,
    /// What it reported (`3.11.2`).
    pub version: String,
}

/// What `image.json` holds.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub(crate) struct ImageRecord {
    pub reference: String,
    pub digest: String,
    /// Layer blob hexes, base first.
    pub layers: Vec<String>,
    pub env: Vec<(String, String)>,
    /// Uncompressed bytes of all layers.
    pub bytes: u64,
    /// Found once after the pull; `None` until then.
    pub interpreters: Option<Vec<Interpreter>>,
}

/// What `layers/<hex>.json` holds.
#[derive(Debug, Clone, Copy, Serialize, Deserialize)]
pub(crate) struct LayerRecord {
    pub bytes: u64,
    pub entries: u64,
}

/// A warm image: its root is mounted and ready to bind.
#[derive(Debug)]
pub struct Image {
    record: Mutex<ImageRecord>,
    root: PathBuf,
    dir: PathBuf,
    last_used: AtomicU64,
}

impl Image {
    /// `sha256:…` of the manifest.
    pub fn digest(&self) -> String {
        self.lock().digest.clone()
    }

    /// The reference it was pulled by.
    pub fn reference(&self) -> String {
        self.lock().reference.clone()
    }

    /// The mounted read-only root.
    pub fn root(&self) -> &Path {
        &self.root
    }

    /// Environment from the image's config (filtered, see [`crate::config`]).
    pub fn env(&self) -> Vec<(String, String)> {
        self.lock().env.clone()
    }

    /// Uncompressed size of its layers.
    pub fn bytes(&self) -> u64 {
        self.lock().bytes
    }

    /// Interpreters found (None until discovery ran).
    pub fn interpreters(&self) -> Option<Vec<Interpreter>> {
        self.lock().interpreters.clone()
    }

    /// Records the interpreters found (persisted, so a restart does not probe again).
    pub fn set_interpreters(&self, found: Vec<Interpreter>) -> io::Result<()> {
        let mut record = self.lock();
        record.interpreters = Some(found);
        write_json(&self.dir.join("image.json"), &*record)
    }

    /// Time since it was last used.
    pub fn idle_for(&self) -> std::time::Duration {
        std::time::Duration::from_secs(now().saturating_sub(self.last_used.load(Ordering::Relaxed)))
    }

    /// Marks the image used now (for the LRU collector).
    pub fn touch(&self) {
        self.last_used.store(now(), Ordering::Relaxed);
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, ImageRecord> {
        self.record.lock().unwrap_or_else(|p| p.into_inner())
    }
}

fn now() -> u64 {
    SystemTime::now().duration_since(UNIX_EPOCH).map(|d| d.as_secs()).unwrap_or(0)
}

pub(crate) fn write_json<T: Serialize>(path: &Path, value: &T) -> io::Result<()> {
    let tmp = path.with_extension("json.tmp");
    fs::write(&tmp, serde_json::to_vec(value).map_err(io::Error::other)?)?;
    fs::rename(tmp, path)
}

fn read_json<T: for<'de> Deserialize<'de>>(path: &Path) -> io::Result<T> {
    serde_json::from_slice(&fs::read(path)?).map_err(io::Error::other)
}

/// How registries are reached.
#[derive(Debug, Clone, Default)]
pub struct Registries {
    /// `host:port` registries reached over plain HTTP (loopback registries
    /// always are, where the policy lets them be reached at all).
    pub insecure: Vec<String>,
    /// The agent's endpoint policy, applied to every registry, token realm
    /// and redirect: by default not the node itself (loopback included).
    pub endpoints: Arc<warren_core::reach::EndpointPolicy>,
}

/// The store.
pub struct Store {
    dir: PathBuf,
    pub(crate) limits: Limits,
    budget: u64,
    pub(crate) insecure: Vec<String>,
    /// Where registries may be (the agent's endpoint policy).
    pub(crate) endpoints: Arc<warren_core::reach::EndpointPolicy>,
    images: Mutex<HashMap<String, Arc<Image>>>,
    /// One pull per reference at a time; the others wait and find it warm.
    pub(crate) pulls: Mutex<HashMap<String, Arc<tokio::sync::Mutex<()>>>>,
    /// (registry/repository, layer digest, credentials) that were shown a
    /// layer's bytes: whom a warm layer may serve.
    pub(crate) proofs: Mutex<std::collections::HashSet<(String, String, [u8; 32])>>,
    /// Bytes of committed layers plus bytes being unpacked now, by every
    /// pull: what `--image-disk` bounds while layers stream in.
    pub(crate) used: AtomicU64,
}

/// What a collector pass removed.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct CollectReport {
    /// Images removed.
    pub images: usize,
    /// Layers removed.
    pub layers: usize,
    /// Bytes the store holds afterwards.
    pub bytes: u64,
}

impl Store {
    /// Opens (creating) the store at `dir`: clears unfinished pulls and
    /// remounts every complete image. `budget` is the disk the collector
    /// keeps the store within; `registries` says which are reached over
    /// plain HTTP and which addresses any may have.
    pub fn open(dir: &Path, limits: Limits, budget: u64, registries: Registries) -> io::Result<Store> {
        let Registries { insecure, endpoints } = registries;
        for sub in ["layers", "images"] {
            fs::create_dir_all(dir.join(sub))?;
        }
        fs::set_permissions(dir, std::os::unix::fs::PermissionsExt::from_mode(0o711))?;
        let store = Store { dir: dir.to_path_buf(), limits, budget, insecure, endpoints, images: Mutex::default(), pulls: Mutex::default(), proofs: Mutex::default(), used: AtomicU64::new(0) };
        store.clear_unfinished()?;
        store.used.store(store.bytes(), Ordering::Relaxed);
        for entry in fs::read_dir(dir.join("images"))? {
            let path = entry?.path();
            match store.remount(&path) {
                Ok(image) => {
                    let hex = file_name(&path);
                    store.lock().insert(hex, Arc::new(image));
                }
                Err(e) => {
                    warn!(image = %path.display(), error = %e, "dropping an image that cannot be mounted");
                    let _ = rootfs::unmount(&path.join("root"));
                    let _ = fs::remove_dir_all(&path);
                }
            }
        }
        Ok(store)
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<String, Arc<Image>>> {
        self.images.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn clear_unfinished(&self) -> io::Result<()> {
        let layers = self.dir.join("layers");
        for entry in fs::read_dir(&layers)? {
            let path = entry?.path();
            let name = file_name(&path);
            let orphan_record = name.ends_with(".json") && !layers.join(name.trim_end_matches(".json")).is_dir();
            let orphan_dir = path.is_dir() && !layers.join(format!("{name}.json")).exists();
            if name.starts_with(".tmp-") || orphan_record || orphan_dir {
                remove_any(&path)?;
            }
        }
        Ok(())
    }

    fn remount(&self, dir: &Path) -> io::Result<Image> {
        let record: ImageRecord = read_json(&dir.join("image.json"))?;
        let root = dir.join("root");
        rootfs::unmount(&root)?;
        rootfs::mount_overlay(&self.lowers(dir, &record.layers)?, &root)?;
        let used = fs::metadata(dir.join("image.json"))?.modified().ok().and_then(|t| t.duration_since(UNIX_EPOCH).ok()).map_or(0, |d| d.as_secs());
        Ok(Image { record: Mutex::new(record), root, dir: dir.to_path_buf(), last_used: AtomicU64::new(used) })
    }

    /// The overlay lower dirs of an image: its top, then its layers top-down.
    fn lowers(&self, image_dir: &Path, layers: &[String]) -> io::Result<Vec<PathBuf>> {
        let mut lowers = vec![image_dir.join("top")];
        for hex in layers.iter().rev() {
            let dir = self.layer_dir(hex);
            if !dir.is_dir() {
                return Err(io::Error::other(format!("layer {hex} is missing")));
            }
            lowers.push(dir);
        }
        Ok(lowers)
    }

    pub(crate) fn layer_dir(&self, hex: &str) -> PathBuf {
        self.dir.join("layers").join(hex)
    }

    pub(crate) fn layer_record(&self, hex: &str) -> Option<LayerRecord> {
        self.layer_dir(hex).is_dir().then(|| read_json(&self.dir.join("layers").join(format!("{hex}.json"))).ok()).flatten()
    }

    pub(crate) fn tmp_dir(&self, hex: &str) -> PathBuf {
        self.dir.join("layers").join(format!(".tmp-{hex}-{}", rand_suffix()))
    }

    /// Moves an unpacked layer into place; a concurrent pull that got there
    /// first wins and this copy is dropped.
    /// Whether this one was kept (`false`: the other pull's copy is).
    pub(crate) fn commit_layer(&self, tmp: &Path, hex: &str, record: LayerRecord) -> io::Result<bool> {
        write_json(&self.dir.join("layers").join(format!("{hex}.json")), &record)?;
        match fs::rename(tmp, self.layer_dir(hex)) {
            Ok(()) => Ok(true),
            Err(_) if self.layer_dir(hex).is_dir() => fs::remove_dir_all(tmp).map(|()| false),
            Err(e) => Err(e),
        }
    }

    /// Builds and mounts an image whose layers are all in place.
    pub(crate) fn commit_image(&self, record: ImageRecord) -> io::Result<Arc<Image>> {
        let hex = record.digest.trim_start_matches("sha256:").to_string();
        if let Some(image) = self.lock().get(&hex) {
            return Ok(image.clone());
        }
        let dir = self.dir.join("images").join(&hex);
        let _ = rootfs::unmount(&dir.join("root"));
        if dir.exists() {
            fs::remove_dir_all(&dir)?;
        }
        let (top, root) = (dir.join("top"), dir.join("root"));
        fs::create_dir_all(&top)?;
        fs::create_dir_all(&root)?;
        let built = (|| {
            // Mounted once without the Warren layer to read the image's users.
            let lowers = self.lowers(&dir, &record.layers)?;
            rootfs::mount_overlay(&lowers, &root)?;
            let top_built = rootfs::build_top(&top, &root);
            rootfs::unmount(&root)?;
            top_built?;
            write_json(&dir.join("image.json"), &record)?;
            rootfs::mount_overlay(&lowers, &root)
        })();
        if let Err(e) = built {
            let _ = rootfs::unmount(&root);
            let _ = fs::remove_dir_all(&dir);
            return Err(e);
        }
        let image = Arc::new(Image { record: Mutex::new(record), root, dir, last_used: AtomicU64::new(now()) });
        self.lock().insert(hex, image.clone());
        Ok(image)
    }

    /// Gives back `bytes` of the disk budget.
    pub(crate) fn release(&self, bytes: u64) {
        let _ = self.used.fetch_update(Ordering::Relaxed, Ordering::Relaxed, |u| Some(u.saturating_sub(bytes)));
    }

    /// The disk budget (`--image-disk`).
    pub(crate) fn budget(&self) -> u64 {
        self.budget
    }

    /// The warm image with this manifest digest.
    pub fn get(&self, digest: &str) -> Option<Arc<Image>> {
        self.lock().get(digest.trim_start_matches("sha256:")).cloned()
    }

    /// Every warm image.
    pub fn images(&self) -> Vec<Arc<Image>> {
        self.lock().values().cloned().collect()
    }

    /// Bytes the store holds (layers, uncompressed).
    pub fn bytes(&self) -> u64 {
        let Ok(entries) = fs::read_dir(self.dir.join("layers")) else { return 0 };
        entries
            .filter_map(|e| e.ok())
            .filter_map(|e| e.file_name().to_str().and_then(|n| n.strip_suffix(".json")).and_then(|hex| self.layer_record(hex)))
            .map(|r| r.bytes)
            .sum()
    }

    /// Removes least-recently-used images not in use until the store fits
    /// its budget with `room` to spare, then every layer no image needs.
    pub fn collect(&self, room: u64) -> CollectReport {
        let mut report = CollectReport::default();
        let mut candidates: Vec<(u64, String)> = self.lock().iter().map(|(hex, i)| (i.last_used.load(Ordering::Relaxed), hex.clone())).collect();
        candidates.sort();
        // Read once, and again only after a removal changed it.
        let mut bytes = self.bytes();
        for (_, hex) in candidates {
            if bytes.saturating_add(room) <= self.budget {
                break;
            }
            let removed = {
                let mut images = self.lock();
                // In use: a sandbox or a caller holds a clone.
                match images.get(&hex) {
                    Some(image) if Arc::strong_count(image) == 1 => images.remove(&hex),
                    _ => None,
                }
            };
            if let Some(image) = removed {
                info!(digest = %image.digest(), reference = %image.reference(), "collecting an unused image");
                let _ = rootfs::unmount(&image.root);
                if let Err(e) = fs::remove_dir_all(&image.dir) {
                    warn!(dir = %image.dir.display(), error = %e, "removing an image");
                }
                report.images += 1;
                report.layers += self.collect_layers();
                bytes = self.bytes();
            }
        }
        report.bytes = bytes;
        report
    }

    /// Removes layers no image (warm or being committed) references.
    fn collect_layers(&self) -> usize {
        let needed: HashSet<String> = self.lock().values().flat_map(|i| i.lock().layers.clone()).collect();
        let layers = self.dir.join("layers");
        let Ok(entries) = fs::read_dir(&layers) else { return 0 };
        let mut removed = 0;
        // Pulls in flight hold their layers in `.tmp-` dirs or have not
        // committed their image yet: skip while any pull runs.
        if !self.pulls.lock().unwrap_or_else(|p| p.into_inner()).is_empty() {
            return 0;
        }
        for entry in entries.filter_map(|e| e.ok()) {
            let name = entry.file_name().to_string_lossy().into_owned();
            if name.starts_with(".tmp-") || name.ends_with(".json") || needed.contains(&name) {
                continue;
            }
            let bytes = self.layer_record(&name).map_or(0, |r| r.bytes);
            let _ = fs::remove_file(layers.join(format!("{name}.json")));
            if fs::remove_dir_all(entry.path()).is_ok() {
                removed += 1;
                self.release(bytes);
            }
        }
        removed
    }

    /// Unmounts every image root (agent shutdown); the store stays on disk.
    pub fn unmount_all(&self) {
        for image in self.lock().values() {
            if let Err(e) = rootfs::unmount(&image.root) {
                warn!(root = %image.root.display(), error = %e, "unmounting an image root");
            }
        }
    }
}

fn file_name(path: &Path) -> String {
    path.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default()
}

fn remove_any(path: &Path) -> io::Result<()> {
    if path.is_dir() {
        fs::remove_dir_all(path)
    } else {
        fs::remove_file(path)
    }
}

fn rand_suffix() -> String {
    let nanos = SystemTime::now().duration_since(UNIX_EPOCH).map(|d| d.subsec_nanos()).unwrap_or(0);
    format!("{}-{nanos}", std::process::id())
}
