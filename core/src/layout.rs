//! The sandbox's file system as a program expects a Linux machine's to be:
//! the places it may write besides its home, shared by the image store
//! (which gives an image the mount points it lacks) and the sandbox
//! builder (which mounts them).

/// A place a program may write.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Writable {
    /// Path below `/`.
    pub path: &'static str,
    /// Its mode.
    pub mode: u32,
    /// Owned by the sandbox user (else root's, world-writable and sticky).
    pub owned: bool,
    /// On an image, only where the image has none (an empty directory, or
    /// nothing): never over what the image ships there (`/var/lib/dpkg`).
    pub only_where_missing: bool,
}

const fn tmp(path: &'static str) -> Writable {
    Writable { path, mode: 0o1777, owned: false, only_where_missing: false }
}

const fn owned(path: &'static str) -> Writable {
    Writable { path, mode: 0o755, owned: true, only_where_missing: true }
}

/// `/workspace`, where some platforms' programs keep their files (Sandbase's
/// examples write `/workspace/data.csv`): a link to the home, added to a
/// root that has none.
pub const WORKSPACE: (&str, &str) = ("workspace", "/home/sandbox");

/// Every writable place; all of them share one tmpfs of the sandbox's tmp
/// size, gone with the sandbox. `/var/run` and `/var/lock` link to `/run`
/// and `/run/lock` as on Debian.
pub const WRITABLE: [Writable; 10] = [
    tmp("tmp"),
    tmp("var/tmp"),
    tmp("run/lock"),
    owned("var/cache"),
    owned("var/lib"),
    owned("var/log"),
    owned("var/spool"),
    owned("var/mail"),
    owned("var/opt"),
    owned("var/local"),
];

/// The environment every program gets besides `PATH`, `HOME` and `LANG`:
/// who it runs as, as a login would set it (reserved names, see
/// [`crate::env`]).
pub const IDENTITY_ENV: [(&str, &str); 3] = [("USER", "sandbox"), ("LOGNAME", "sandbox"), ("SHELL", "/bin/bash")];

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn writable_places_are_relative_unique_and_reserved_names_cover_the_identity() {
        let mut seen = std::collections::BTreeSet::new();
        for w in WRITABLE {
            assert!(!w.path.starts_with('/') && !w.path.contains(".."), "{}", w.path);
            assert!(seen.insert(w.path), "{} twice", w.path);
        }
        for (name, _) in IDENTITY_ENV {
            assert!(crate::env::is_reserved(name), "{name} must be reserved: the sandbox sets it");
        }
    }
}
