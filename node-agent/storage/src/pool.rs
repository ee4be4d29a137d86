//! FUSE sessions mounted ahead of calls. Mounting a FUSE filesystem costs
//! about a millisecond of the agent's time (the device, the mount, the
//! server thread); a call takes a session already mounted here and only
//! binds it under the sandbox's `/data` (tens of microseconds). The pool is
//! refilled in the background after each take; when it is empty a call
//! mounts its own, as if there were no pool.
//!
//! Sessions live in their own directory, a private mount (nothing mounted
//! there propagates anywhere) that only root may enter; an unserved session
//! answers nothing but its closed root.

use std::io;
use std::os::unix::fs::{DirBuilderExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use nix::mount::{mount, MsFlags};

use crate::fuse::{premount, Premounted};

/// Sessions mounted in advance.
pub struct FusePool {
    dir: PathBuf,
    size: usize,
    ready: Mutex<Vec<Premounted>>,
    next: AtomicU64,
    /// Refills running (at most one).
    refilling: Mutex<bool>,
    rt: tokio::runtime::Handle,
}

impl FusePool {
    /// A pool of `size` sessions under `dir`, which must hold no mounts
    /// (the agent unmounts what an earlier run left there first). It fills
    /// (in the background) once a first call takes a session: an agent
    /// whose calls never mount storage keeps no FUSE session.
    pub fn new(dir: &Path, size: usize, rt: tokio::runtime::Handle) -> io::Result<Arc<FusePool>> {
        if dir.exists() {
            std::fs::remove_dir_all(dir)?;
        }
        std::fs::DirBuilder::new().recursive(true).mode(0o700).create(dir)?;
        std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o700))?;
        // A mount of its own, private: sessions mounted here are seen by no
        // other mount namespace until a call binds one.
        mount(Some(dir), dir, None::<&str>, MsFlags::MS_BIND, None::<&str>).map_err(io::Error::from)?;
        mount(None::<&str>, dir, None::<&str>, MsFlags::MS_PRIVATE, None::<&str>).map_err(io::Error::from)?;
        Ok(Arc::new(FusePool { dir: dir.to_path_buf(), size, ready: Mutex::default(), next: AtomicU64::new(0), refilling: Mutex::new(false), rt }))
    }

    fn ready(&self) -> std::sync::MutexGuard<'_, Vec<Premounted>> {
        // A push or a pop: never half-done.
        self.ready.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// A mounted session: one from the pool, or a new one when it is empty.
    pub fn take(self: &Arc<Self>) -> io::Result<Premounted> {
        let found = self.ready().pop();
        self.clone().refill();
        match found {
            Some(p) => Ok(p),
            None => self.mount_one(),
        }
    }

    /// Sessions ready now.
    pub fn len(&self) -> usize {
        self.ready().len()
    }

    /// True when none is ready.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    fn mount_one(&self) -> io::Result<Premounted> {
        // Named by process too: what a killed agent left is told apart.
        let at = self.dir.join(format!("{}-{}", std::process::id(), self.next.fetch_add(1, Ordering::Relaxed)));
        std::fs::DirBuilder::new().mode(0o700).create(&at)?;
        premount(&at, self.rt.clone()).inspect_err(|_| {
            let _ = std::fs::remove_dir(&at);
        })
    }

    /// Tops the pool up off the request path (one refill at a time).
    fn refill(self: Arc<Self>) {
        {
            let mut busy = self.refilling.lock().unwrap_or_else(|p| p.into_inner());
            if *busy || self.len() >= self.size {
                return;
            }
            *busy = true;
        }
        let rt = self.rt.clone();
        rt.spawn_blocking(move || {
            while self.len() < self.size {
                match self.mount_one() {
                    Ok(p) => self.ready().push(p),
                    Err(e) => {
                        tracing::warn!(error = %e, "could not mount a FUSE session ahead of calls; calls mount their own");
                        break;
                    }
                }
            }
            *self.refilling.lock().unwrap_or_else(|p| p.into_inner()) = false;
        });
    }

    /// Unmounts every session not taken (at shutdown).
    pub fn drain(&self) {
        let sessions = std::mem::take(&mut *self.ready());
        for p in sessions {
            let _ = p.discard();
        }
    }
}
