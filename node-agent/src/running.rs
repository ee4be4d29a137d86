//! The executions running on this agent, by id, so `Cancel` can kill one
//! and answer once it has ended.
//!
//! An execution registers when its task starts and its [`Registration`]
//! drops when the task has finished (sandbox gone, output sent or
//! abandoned); that drop is what a waiting `Cancel` hears.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use tokio::sync::{watch, Notify};

/// Running executions by id.
#[derive(Debug, Default)]
pub struct Running {
    by_id: Mutex<HashMap<String, Entry>>,
    /// Executions registered since the agent started.
    total: std::sync::atomic::AtomicU64,
}

#[derive(Debug, Clone)]
struct Entry {
    cancel: Arc<Notify>,
    // Never sent on: the sender's drop ends every wait.
    ended: watch::Receiver<()>,
}

/// One execution's place in [`Running`]; leaves it on drop.
#[derive(Debug)]
pub struct Registration {
    running: Arc<Running>,
    id: String,
    cancel: Arc<Notify>,
    _ended: watch::Sender<()>,
}

impl Registration {
    /// Resolves when `Cancel` asks this execution to stop.
    pub async fn cancelled(&self) {
        self.cancel.notified().await
    }
}

/// Another execution of this id runs here.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct IdInUse;

impl Running {
    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<String, Entry>> {
        // Inserts and removes are single map operations: never half-done.
        self.by_id.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Registers execution `id`.
    pub fn register(self: &Arc<Self>, id: &str) -> Result<Registration, IdInUse> {
        let mut map = self.lock();
        if map.contains_key(id) {
            return Err(IdInUse);
        }
        let cancel = Arc::new(Notify::new());
        let (tx, rx) = watch::channel(());
        map.insert(id.to_string(), Entry { cancel: cancel.clone(), ended: rx });
        self.total.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        Ok(Registration { running: self.clone(), id: id.to_string(), cancel, _ended: tx })
    }

    /// Executions registered since the agent started.
    pub fn total(&self) -> u64 {
        self.total.load(std::sync::atomic::Ordering::Relaxed)
    }

    /// Asks `id` to stop and waits until it has ended; false when nothing by
    /// that id runs here.
    pub async fn cancel(&self, id: &str) -> bool {
        let Some(mut entry) = self.lock().get(id).cloned() else { return false };
        // A stored permit: the execution sees it even if it is not waiting yet.
        entry.cancel.notify_one();
        // Err once the sender dropped: the execution has ended.
        while entry.ended.changed().await.is_ok() {}
        true
    }

    /// Asks every execution to stop (the agent's shutdown deadline); the
    /// caller waits for them to end.
    pub fn cancel_all(&self) {
        for entry in self.lock().values() {
            entry.cancel.notify_one();
        }
    }

    /// Executions registered now.
    pub fn len(&self) -> usize {
        self.lock().len()
    }

    /// True when none is registered.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

impl Drop for Registration {
    fn drop(&mut self) {
        self.running.lock().remove(&self.id);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn cancel_signals_the_execution_and_returns_when_it_has_ended() {
        let running = Arc::new(Running::default());
        let reg = running.register("e1").unwrap();
        assert_eq!(running.register("e1").unwrap_err(), IdInUse, "one id, one execution");
        let (seen_tx, seen_rx) = tokio::sync::oneshot::channel();
        let (done_tx, done_rx) = tokio::sync::oneshot::channel::<()>();
        let execution = tokio::spawn(async move {
            reg.cancelled().await;
            seen_tx.send(()).unwrap();
            // Cleaning up until told to finish.
            let _ = done_rx.await;
            drop(reg);
        });
        let r = running.clone();
        let cancel = tokio::spawn(async move { r.cancel("e1").await });
        seen_rx.await.unwrap();
        for _ in 0..10 {
            tokio::task::yield_now().await;
        }
        assert!(!cancel.is_finished(), "Cancel answers only once the execution has ended");
        done_tx.send(()).unwrap();
        assert!(cancel.await.unwrap(), "it was running");
        execution.await.unwrap();
        assert!(running.is_empty());
        assert!(!running.cancel("e1").await, "a finished execution is not running");
        assert!(running.register("e1").is_ok(), "the id is free again");
    }
}
