//! Single-machine mode: keys come from manifest files in directories,
//! compiled by `warren-config` and reloaded when the files change.
//!
//! A reload that hits a YAML syntax error keeps the previous configuration
//! (a half-saved file must not revoke every key); object-level errors drop
//! only the objects concerned. Requests in flight keep the generation they
//! authenticated with, so a reload never disturbs them.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use tokio::sync::watch;
use tracing::{error, info, warn};

use crate::auth::KeyStore;

/// Largest manifest file read (a bigger one is an error, not a hang).
const MAX_FILE_BYTES: u64 = 1 << 20;

/// Files of one snapshot: path, text.
type Files = Vec<(String, String)>;

/// What identifies a directory's state cheaply: names, sizes, mtimes.
type Fingerprint = Vec<(PathBuf, u64, Option<SystemTime>)>;

fn manifest_paths(dirs: &[PathBuf]) -> Vec<PathBuf> {
    let mut paths = Vec::new();
    for dir in dirs {
        let Ok(entries) = std::fs::read_dir(dir) else { continue };
        for e in entries.flatten() {
            let p = e.path();
            let name = e.file_name();
            let name = name.to_string_lossy();
            let yaml = name.ends_with(".yaml") || name.ends_with(".yml");
            if yaml && !name.starts_with('.') && p.is_file() {
                paths.push(p);
            }
        }
    }
    paths.sort();
    paths
}

fn fingerprint(dirs: &[PathBuf]) -> Fingerprint {
    manifest_paths(dirs)
        .into_iter()
        .map(|p| {
            let m = std::fs::metadata(&p).ok();
            let len = m.as_ref().map(|m| m.len()).unwrap_or(0);
            let mtime = m.and_then(|m| m.modified().ok());
            (p, len, mtime)
        })
        .collect()
}

fn read(dirs: &[PathBuf]) -> (Files, Vec<String>) {
    let mut files = Vec::new();
    let mut errors = Vec::new();
    for p in manifest_paths(dirs) {
        let shown = p.display().to_string();
        match std::fs::metadata(&p) {
            Ok(m) if m.len() > MAX_FILE_BYTES => errors.push(format!("{shown}: larger than 1 MiB; skipped")),
            _ => match std::fs::read_to_string(&p) {
                Ok(t) => files.push((shown, t)),
                Err(e) => errors.push(format!("{shown}: {e}")),
            },
        }
    }
    (files, errors)
}

fn compile(dirs: &[PathBuf]) -> (warren_config::Compiled, Vec<String>) {
    let (files, problems) = read(dirs);
    let sources: Vec<warren_config::Source> = files.iter().map(|(f, t)| warren_config::Source { file: f, text: t }).collect();
    (warren_config::compile(&sources), problems)
}

/// Reads and compiles the directories once; `Err` when nothing usable could
/// be built because some file is unreadable YAML.
pub fn load(dirs: &[PathBuf]) -> Result<KeyStore, Vec<String>> {
    let (compiled, mut problems) = compile(dirs);
    let syntax = compiled.has_syntax_errors() || !problems.is_empty();
    problems.extend(compiled.errors.iter().map(ToString::to_string));
    if syntax {
        return Err(problems);
    }
    for p in &problems {
        warn!(problem = %p, "configuration object skipped");
    }
    Ok(KeyStore::new(compiled.keys))
}

/// Loads at start (object errors are logged; the rest is served).
pub fn initial(dirs: &[PathBuf]) -> KeyStore {
    for d in dirs.iter().filter(|d| !d.is_dir()) {
        warn!(dir = %d.display(), "manifest directory does not exist");
    }
    match load(dirs) {
        Ok(store) => {
            info!(keys = store.key_count(), dirs = ?dirs, "configuration loaded");
            store
        }
        Err(problems) => {
            for p in &problems {
                error!(problem = %p, "configuration error");
            }
            error!("configuration has unreadable files; starting with no keys until they are fixed");
            KeyStore::new(Vec::new())
        }
    }
}

/// Polls the directories and publishes a new [`KeyStore`] after each change.
pub async fn watch_loop(dirs: Vec<PathBuf>, period: Duration, tx: watch::Sender<Arc<KeyStore>>) {
    let mut last = fingerprint(&dirs);
    loop {
        tokio::time::sleep(period).await;
        let now = fingerprint(&dirs);
        if now == last {
            continue;
        }
        last = now;
        match load(&dirs) {
            Ok(store) => {
                info!(keys = store.key_count(), "configuration reloaded");
                tx.send_replace(Arc::new(store));
            }
            Err(problems) => {
                for p in &problems {
                    error!(problem = %p, "configuration error");
                }
                warn!("configuration not reloaded: fix the files above; the previous configuration stays in force");
            }
        }
    }
}

/// Checks the directories, printing every problem; for `warren-gateway check`.
pub fn check(dirs: &[PathBuf]) -> bool {
    let (compiled, problems) = compile(dirs);
    for p in problems.iter().cloned().chain(compiled.errors.iter().map(ToString::to_string)) {
        eprintln!("error: {p}");
    }
    for k in &compiled.keys {
        println!("ok: ApiKey {}/{} → Sandbox {} (key {})", k.namespace, k.name, k.sandbox, k.display_prefix);
    }
    problems.is_empty() && compiled.errors.is_empty()
}

