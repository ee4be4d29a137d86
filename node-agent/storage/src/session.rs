//! One mount for one call: its store client, tree and FUSE server, from
//! serving to the final sync and the unmount.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use crate::stores::Stores;
use crate::{fuse, MountOptions, MountSpec, ObjectTree};

/// A served mount.
pub struct Served {
    name: String,
    tree: Arc<ObjectTree>,
    mounted: Option<fuse::Mounted>,
    target: PathBuf,
    spool: PathBuf,
}

impl Served {
    /// Serves `spec` at `target` (created here, an empty directory under the
    /// sandbox's `/data`) for files owned by host `uid`, staging writes in
    /// `spool` (created here; unique to this sandbox and mount); store
    /// requests give up at `deadline`.
    pub fn start(spec: &MountSpec, stores: &Stores, target: &Path, spool: PathBuf, uid: u32, deadline: std::time::Instant, rt: tokio::runtime::Handle) -> Result<Served, String> {
        let backend = stores.get(spec)?;
        std::fs::create_dir_all(&spool).map_err(|e| format!("creating the write spool: {e}"))?;
        let options = MountOptions { read_only: spec.read_only, spool: spool.clone(), write_limit: spec.max_write_bytes, deadline: Some(deadline), disk_reserve: stores.disk_reserve() };
        let mut tree = ObjectTree::with_options(backend.store.clone(), spec.root(), options);
        if let Some(pager) = backend.pager {
            tree = tree.with_pager(pager);
        }
        // A local directory is already on this node: nothing to keep.
        if let (Some(cache), true) = (stores.cache(), backend.cacheable) {
            tree = tree.with_cache(cache.clone(), backend.id);
        }
        let tree = Arc::new(tree);
        let cleanup = |e: String| {
            let _ = std::fs::remove_dir_all(&spool);
            let _ = std::fs::remove_dir(target);
            e
        };
        std::fs::create_dir(target).map_err(|e| cleanup(format!("creating the mount point: {e}")))?;
        let mounted = match stores.fuse_pool() {
            Some(pool) => pool.take().and_then(|p| p.serve(tree.clone(), uid, uid, Some(target))),
            None => fuse::mount_tree(tree.clone(), target, uid, uid, rt),
        };
        let mounted = mounted.map_err(|e| cleanup(format!("mounting: {e}")))?;
        Ok(Served { name: spec.name.clone(), tree, mounted: Some(mounted), target: target.to_path_buf(), spool })
    }

    /// Stores every change still pending; the sandbox paths
    /// (`/data/<name>/…`) that could not be stored.
    pub async fn sync(&self) -> Vec<String> {
        self.tree.sync().await.into_iter().map(|f| format!("/data/{}/{}", self.name, f.path)).collect()
    }

    /// Unmounts (blocking: waits for the server thread) and removes the
    /// mount point and the spool.
    pub fn release(mut self) -> std::io::Result<()> {
        let unmounted = self.mounted.take().map_or(Ok(()), fuse::Mounted::unmount);
        let _ = std::fs::remove_dir_all(&self.spool);
        let _ = std::fs::remove_dir(&self.target);
        unmounted
    }
}

impl Drop for Served {
    fn drop(&mut self) {
        // `Mounted` unmounts on its own drop; the spool goes with it.
        drop(self.mounted.take());
        let _ = std::fs::remove_dir_all(&self.spool);
        let _ = std::fs::remove_dir(&self.target);
    }
}
