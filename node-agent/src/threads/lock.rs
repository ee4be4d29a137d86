//! Who holds a thread on this node.
//!
//! Two kinds of holders meet here: calls (an execution or a delete, which the
//! caller sees) and the collector (housekeeping, which the caller must never
//! see). A call that finds another call gets "busy" at once — that is the
//! API's 409. A call that finds the collector waits for it: the collector
//! holds a thread only to look at one warm copy or bury an expired thread,
//! and a user's call must not fail because housekeeping happened to run.
//! The collector never waits: it skips what is held and comes back next pass.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::sync::Notify;

use super::ThreadKey;

/// How long a call waits for the collector before it reports the thread busy
/// (removing one large idle warm copy is the longest the collector holds).
pub const COLLECTOR_WAIT: Duration = Duration::from_secs(10);

/// Who holds a thread.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Holder {
    Call,
    Collector,
}

#[derive(Default)]
struct Table {
    held: Mutex<HashMap<ThreadKey, Holder>>,
    released: Notify,
}

/// The node's thread locks (in memory: they die with the process, so a
/// crashed agent never leaves a thread locked).
#[derive(Clone, Default)]
pub struct Locks(Arc<Table>);

/// A thread held; released on drop.
pub struct ThreadLock {
    key: ThreadKey,
    table: Arc<Table>,
}

impl Drop for ThreadLock {
    fn drop(&mut self) {
        self.table.held.lock().unwrap_or_else(|p| p.into_inner()).remove(&self.key);
        self.table.released.notify_waiters();
    }
}

impl Locks {
    /// Takes `key` for a call: `None` when another call holds it; waits up
    /// to `wait` while the collector does.
    pub async fn for_call(&self, key: &ThreadKey, wait: Duration) -> Option<ThreadLock> {
        let deadline = tokio::time::Instant::now() + wait;
        loop {
            // Registered before looking, so a release between the look and
            // the wait is not missed.
            let released = self.0.released.notified();
            tokio::pin!(released);
            released.as_mut().enable();
            match self.try_take(key, Holder::Call) {
                Ok(lock) => return Some(lock),
                Err(Holder::Call) => return None,
                Err(Holder::Collector) => {}
            }
            tokio::time::timeout_at(deadline, released).await.ok()?;
        }
    }

    /// Takes `key` for the collector, or `None` if anyone holds it.
    pub fn for_collector(&self, key: &ThreadKey) -> Option<ThreadLock> {
        self.try_take(key, Holder::Collector).ok()
    }

    fn try_take(&self, key: &ThreadKey, holder: Holder) -> Result<ThreadLock, Holder> {
        let mut held = self.0.held.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(h) = held.get(key) {
            return Err(*h);
        }
        held.insert(key.clone(), holder);
        Ok(ThreadLock { key: key.clone(), table: self.0.clone() })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key() -> ThreadKey {
        ThreadKey::new("team", "agent", "t1").unwrap()
    }

    #[tokio::test]
    async fn a_call_finding_a_call_is_busy_at_once() {
        let locks = Locks::default();
        let _first = locks.for_call(&key(), COLLECTOR_WAIT).await.unwrap();
        // No paused clock: an immediate answer is the point.
        assert!(locks.for_call(&key(), Duration::from_secs(3600)).await.is_none());
        assert!(locks.for_collector(&key()).is_none(), "the collector skips held threads");
    }

    #[tokio::test]
    async fn a_call_waits_for_the_collector_and_then_runs() {
        let locks = Locks::default();
        let collecting = locks.for_collector(&key()).unwrap();
        let waiter = {
            let locks = locks.clone();
            tokio::spawn(async move { locks.for_call(&key(), Duration::from_secs(3600)).await.is_some() })
        };
        tokio::task::yield_now().await;
        assert!(!waiter.is_finished(), "the call waits while the collector holds the thread");
        drop(collecting);
        assert!(waiter.await.unwrap(), "the call gets the thread once the collector lets go");
        assert!(locks.for_collector(&key()).is_some(), "and releases it when done");
    }

    #[tokio::test(start_paused = true)]
    async fn a_collector_that_never_lets_go_makes_the_call_busy_after_the_wait() {
        let locks = Locks::default();
        let _stuck = locks.for_collector(&key()).unwrap();
        assert!(locks.for_call(&key(), COLLECTOR_WAIT).await.is_none());
    }
}
