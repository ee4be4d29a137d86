//! Storage mounts as a per-execution resource: served (FUSE, by this agent)
//! on the sandbox's `/data/<name>` before the program, synced before the
//! answer, unmounted after it.

use std::path::PathBuf;

use tonic::async_trait;
use tracing::{debug, warn};
use std::sync::Arc;

use warren_storage::session::Served;
use warren_storage::stores::Stores;
use warren_storage::MountSpec;

use super::{Resource, SandboxView};
use crate::sandbox::{Failure, Outcome};

/// How long the final sync may take before what is left is reported as
/// not stored (a stuck store must not hold the answer forever).
const SYNC_WAIT: std::time::Duration = std::time::Duration::from_secs(60);
/// How far past the call's timeout a mount's store requests (the program's
/// and the final sync's) may run: changes made at the last moment still get
/// stored, and a hung store holds the answer no longer than this.
const SYNC_GRACE: std::time::Duration = std::time::Duration::from_secs(5);

/// One call's mounts.
pub struct StorageResource {
    specs: Vec<MountSpec>,
    stores: Arc<Stores>,
    spool_root: PathBuf,
    served: Vec<Served>,
}

impl StorageResource {
    /// Mounts `specs`, staging writes under `spool_root`.
    pub fn new(specs: Vec<MountSpec>, stores: Arc<Stores>, spool_root: PathBuf) -> StorageResource {
        StorageResource { specs, stores, spool_root, served: Vec::new() }
    }
}

#[async_trait]
impl Resource for StorageResource {
    async fn prepare(&mut self, sandbox: &SandboxView<'_>) -> Result<(), Failure> {
        let rt = tokio::runtime::Handle::current();
        let t0 = std::time::Instant::now();
        // Store requests (the program's, and the final sync's) give up here.
        let deadline = t0 + sandbox.spec.timeout + SYNC_GRACE;
        for spec in &self.specs {
            let target = sandbox.data_dir.join(&spec.name);
            let spool = self.spool_root.join(format!("{}-{}", sandbox.id, spec.name));
            // The program's uid inside is its slot's second host id.
            let served = Served::start(spec, &self.stores, &target, spool, sandbox.host_id + 1, deadline, rt.clone()).map_err(|why| {
                warn!(execution_id = %sandbox.spec.id, mount = %spec.name, error = %why, "a storage mount could not be set up; nothing ran");
                Failure::StorageMount(why)
            })?;
            self.served.push(served);
        }
        debug!(execution_id = %sandbox.spec.id, mounts = self.served.len(), mount_us = t0.elapsed().as_micros() as u64, "storage mounted");
        Ok(())
    }

    async fn finish(&mut self, outcome: &mut Outcome) {
        let mut unsynced = Vec::new();
        for s in &self.served {
            // Each file's upload stops at the call's deadline (reported by
            // path); this bounds the whole sync besides.
            match tokio::time::timeout(SYNC_WAIT, s.sync()).await {
                Ok(paths) => unsynced.extend(paths),
                Err(_) => unsynced.push("(the store did not answer in time)".to_string()),
            }
        }
        if !unsynced.is_empty() {
            warn!(paths = unsynced.len(), "changes under /data could not all be stored");
            if outcome.failure.is_none() {
                outcome.failure = Some(Failure::StorageSync(unsynced));
            }
        }
    }

    async fn release(self: Box<Self>) {
        let served = self.served;
        // Unmounting joins each server thread: off the runtime.
        let _ = tokio::task::spawn_blocking(move || {
            for s in served {
                if let Err(e) = s.release() {
                    warn!(error = %e, "unmounting a storage mount failed");
                }
            }
        })
        .await;
    }
}
