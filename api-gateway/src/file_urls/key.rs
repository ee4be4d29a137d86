//! The key file URLs are signed with. It lives outside the record database
//! (a leaked records file must not mint URLs): in a file — the chart's
//! Secret, mounted into every replica, or one the gateway creates (0600) in
//! single-machine mode — re-read whenever the file changes, so a rotated
//! key ends every URL signed with the old one. Without a file, one random
//! key for this process (URLs end with it and are not shared by replicas).
//! The key also signs the E2B access tokens and seals E2B environments, so
//! a file others may read or change is refused, at start and on every
//! re-read ([`private_enough`]).

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
/// volume swaps in a new file), and mode and group (a `chmod` changes
/// whether it may be used).
type Stamp = (SystemTime, u64, u64, u32, u32);

fn stamp(meta: &std::fs::Metadata) -> Option<Stamp> {
    use std::os::unix::fs::MetadataExt as _;
    Some((meta.modified().ok()?, meta.len(), meta.ino(), meta.mode(), meta.gid()))
}

/// Refuses a key file anyone but the gateway's user may read or change:
/// no write by its group, nothing for others, and group read only when the
/// group is the gateway's own. That one exception is Kubernetes': with a
/// pod `fsGroup` the kubelet gives every file of a Secret volume group read
/// whatever its `defaultMode`, and the chart's `fsGroup` is the gateway's
/// own group, which no other process of the pod has.
fn private_enough(path: &Path, meta: &std::fs::Metadata) -> io::Result<()> {
    use std::os::unix::fs::MetadataExt as _;
    let mode = meta.mode() & 0o7777;
    let own_group = meta.gid() == nix::unistd::getegid().as_raw();
    if mode & 0o027 == 0 && (mode & 0o040 == 0 || own_group) {
        return Ok(());
    }
    let p = path.display();
    Err(io::Error::new(
        io::ErrorKind::PermissionDenied,
        format!("the signing key file {p} has mode {mode:04o}: users other than the gateway's may read or change it (it signs file URLs and E2B access tokens); run `chmod 600 {p}`"),
    ))
}

fn random_key() -> String {
    warren_core::ids::random_id("", 64, &mut |b: &mut [u8]| rand::fill(b))
}

fn read_key(path: &Path) -> io::Result<(Stamp, Vec<u8>)> {
    use std::io::Read as _;
    // The mode and the bytes of the same file (a rotation may swap it between).
    let mut file = std::fs::File::open(path)?;
    let meta = file.metadata()?;
    private_enough(path, &meta)?;
    let mut text = String::new();
    file.read_to_string(&mut text)?;
    let key = text.trim().as_bytes().to_vec();
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
    /// that cannot be used (unreadable, too short, readable by others) keeps
    /// the last key, and says so once per change of the file.
    pub fn current(&self) -> Arc<Vec<u8>> {
        let mut cached = self.cached.lock().unwrap_or_else(|p| p.into_inner());
        let Some(path) = &self.file else { return cached.1.clone() };
        let now = std::fs::metadata(path).ok().and_then(|m| stamp(&m));
        if now.is_some() && now != cached.0 {
            cached.0 = now;
            match read_key(path) {
                Ok((_, key)) if key == *cached.1 => {}
                Ok((_, key)) => {
                    tracing::info!(file = %path.display(), "the file URL signing key changed: URLs signed with the old one no longer work");
                    cached.1 = Arc::new(key);
                }
                Err(e) => tracing::warn!(file = %path.display(), error = %e, "the file URL signing key cannot be used; keeping the last one"),
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

    fn chmod(path: &Path, mode: u32) {
        std::fs::set_permissions(path, std::os::unix::fs::PermissionsExt::from_mode(mode)).unwrap();
    }

    /// The attack: a key file others may read or change (0644, 0604, 0620,
    /// 0660, or group-readable by a group that is not the gateway's) hands
    /// them every file URL and every E2B sandbox's access token. Refused at
    /// start, naming the file, its mode and the fix; loosened later, the
    /// file is not read again until it is private.
    #[test]
    fn a_key_file_others_may_read_or_change_is_refused_at_start_and_on_reread() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("signing.key");
        std::fs::write(&path, "a".repeat(64)).unwrap();
        for mode in [0o644, 0o604, 0o620, 0o660, 0o602] {
            chmod(&path, mode);
            let e = SigningKey::from_file(&path).unwrap_err();
            let text = e.to_string();
            assert_eq!(e.kind(), io::ErrorKind::PermissionDenied, "{text}");
            assert!(text.contains(&path.display().to_string()) && text.contains(&format!("{mode:04o}")) && text.contains("chmod 600"), "{text}");
        }
        if nix::unistd::geteuid().is_root() {
            // Group read by another group than the gateway's.
            nix::unistd::chown(&path, None, Some(nix::unistd::Gid::from_raw(nix::unistd::getegid().as_raw() + 4242))).unwrap();
            chmod(&path, 0o640);
            assert!(SigningKey::from_file(&path).is_err(), "another group may not read it");
            nix::unistd::chown(&path, None, Some(nix::unistd::getegid())).unwrap();
        }
        // Group read by the gateway's own group (a Kubernetes Secret volume with fsGroup) is private.
        chmod(&path, 0o440);
        let key = SigningKey::from_file(&path).unwrap();
        assert_eq!(key.current().as_slice(), "a".repeat(64).as_bytes());
        chmod(&path, 0o600);
        std::fs::write(&path, "b".repeat(64)).unwrap();
        chmod(&path, 0o644);
        assert_eq!(key.current().as_slice(), "a".repeat(64).as_bytes(), "a loosened file is not used");
        chmod(&path, 0o600);
        assert_eq!(key.current().as_slice(), "b".repeat(64).as_bytes(), "once private again, it is");
    }
}
