//! The key file URLs are signed with. It lives outside the record database
//! (a leaked records file must not mint URLs): in a file — the chart's
//! Secret, mounted into every replica, or one the gateway creates (0600) in
//! single-machine mode — re-read whenever the file changes, so a rotated
//! key ends every URL signed with the old one. Without a file, one random
//! key for this process (URLs end with it and are not shared by replicas).

use std::io;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::SystemTime;

/// Shortest key accepted.
const MIN_KEY_BYTES: usize = 32;

/// The current signing key.
pub struct SigningKey {
    file: Option<PathBuf>,
    /// (the file's stamp when read, the key).
    cached: Mutex<(Option<Stamp>, Arc<Vec<u8>>)>,
}

impl std::fmt::Debug for SigningKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "SigningKey {{ file: {:?} }}", self.file)
    }
}

/// What tells a changed file: modification time, length, inode (a Secret
/// volume swaps in a new file).
type Stamp = (SystemTime, u64, u64);

fn stamp(meta: &std::fs::Metadata) -> Option<Stamp> {
    use std::os::unix::fs::MetadataExt as _;
    Some((meta.modified().ok()?, meta.len(), meta.ino()))
}

fn random_key() -> String {
    warren_core::ids::random_id("", 64, &mut |b: &mut [u8]| rand::fill(b))
}

fn read_key(path: &Path) -> io::Result<(Stamp, Vec<u8>)> {
    let meta = std::fs::metadata(path)?;
    let key = std::fs::read_to_string(path)?.trim().as_bytes().to_vec();
    if key.len() < MIN_KEY_BYTES {
        return Err(io::Error::new(io::ErrorKind::InvalidData, format!("the file URL signing key in {} is shorter than {MIN_KEY_BYTES} bytes", path.display())));
    }
    Ok((stamp(&meta).ok_or_else(|| io::Error::other("no modification time"))?, key))
}

impl SigningKey {
    /// The key in `path`, created there (0600, random) when the file does
    /// not exist yet.
    pub fn from_file(path: &Path) -> io::Result<SigningKey> {
        if !path.exists() {
            use std::io::Write as _;
            use std::os::unix::fs::OpenOptionsExt as _;
            match std::fs::OpenOptions::new().write(true).create_new(true).mode(0o600).open(path) {
                Ok(mut f) => f.write_all(random_key().as_bytes())?,
                Err(e) if e.kind() == io::ErrorKind::AlreadyExists => {}
                Err(e) => return Err(e),
            }
        }
        let (stamp, key) = read_key(path)?;
        Ok(SigningKey { file: Some(path.to_path_buf()), cached: Mutex::new((Some(stamp), Arc::new(key))) })
    }

    /// A random key for this process only.
    pub fn ephemeral() -> SigningKey {
        SigningKey::fixed(random_key().as_bytes())
    }

    /// This key (tests).
    pub fn fixed(key: &[u8]) -> SigningKey {
        SigningKey { file: None, cached: Mutex::new((None, Arc::new(key.to_vec()))) }
    }

    /// The key now: re-read when the file changed (a stat per use). A file
    /// that cannot be read keeps the last key, and says so.
    pub fn current(&self) -> Arc<Vec<u8>> {
        let mut cached = self.cached.lock().unwrap_or_else(|p| p.into_inner());
        let Some(path) = &self.file else { return cached.1.clone() };
        let now = std::fs::metadata(path).ok().and_then(|m| stamp(&m));
        if now.is_some() && now != cached.0 {
            match read_key(path) {
                Ok((stamp, key)) => {
                    tracing::info!(file = %path.display(), "the file URL signing key changed: URLs signed with the old one no longer work");
                    *cached = (Some(stamp), Arc::new(key));
                }
                Err(e) => tracing::warn!(file = %path.display(), error = %e, "the file URL signing key cannot be read; keeping the last one"),
            }
        }
        cached.1.clone()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_key_file_is_created_private_and_a_rotation_replaces_the_key() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("files-signing.key");
        let key = SigningKey::from_file(&path).unwrap();
        let mode = std::os::unix::fs::PermissionsExt::mode(&std::fs::metadata(&path).unwrap().permissions());
        assert_eq!(mode & 0o777, 0o600);
        let first = key.current();
        assert_eq!(first.len(), 64);
        assert_eq!(key.current(), first, "unchanged file, same key");
        std::fs::write(&path, "x".repeat(40)).unwrap();
        assert_eq!(key.current().as_slice(), "x".repeat(40).as_bytes(), "a rotated file is a new key");
        std::fs::write(&path, "short").unwrap();
        assert_eq!(key.current().as_slice(), "x".repeat(40).as_bytes(), "an unusable file keeps the last key");
        std::fs::write(dir.path().join("short"), "short").unwrap();
        assert!(SigningKey::from_file(&dir.path().join("short")).is_err());
    }
}
