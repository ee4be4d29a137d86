//! The one-execution-per-thread rule within this gateway.
//!
//! Across replicas the thread's home agent holds the same rule (a second
//! execution there is refused with THREAD_BUSY); this lock answers 409 here
//! without a round trip and serialises an execute with a delete of the same
//! thread. Per-key concurrency is counted on an agent: see
//! [`crate::exec::keyslot`].

use std::collections::HashSet;
use std::sync::{Arc, Mutex};

use crate::exec_error::ExecError;

/// Threads running through this gateway.
#[derive(Debug, Default)]
pub struct Admission {
    threads: Mutex<HashSet<(String, String)>>,
}

/// Exclusive use of one thread.
#[derive(Debug)]
pub struct ThreadLock {
    admission: Arc<Admission>,
    id: (String, String),
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    // A panic while holding this short critical section cannot leave the
    // set half-updated, so a poisoned lock is still consistent.
    m.lock().unwrap_or_else(|p| p.into_inner())
}

impl Admission {
    /// Locks `thread_id` of `key`, or 409 when another execution holds it.
    /// Threads are scoped to their key: two keys never share one.
    pub fn thread(self: &Arc<Self>, key: &str, thread_id: &str) -> Result<ThreadLock, ExecError> {
        let id = (key.to_string(), thread_id.to_string());
        if !lock(&self.threads).insert(id.clone()) {
            return Err(ExecError::ThreadBusy(thread_id.to_string()));
        }
        Ok(ThreadLock { admission: self.clone(), id })
    }
}

impl Drop for ThreadLock {
    fn drop(&mut self) {
        lock(&self.admission.threads).remove(&self.id);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn threads_are_exclusive_per_key() {
        let a = Arc::new(Admission::default());
        let t = a.thread("ns/k", "t1").unwrap();
        assert_eq!(a.thread("ns/k", "t1").unwrap_err(), ExecError::ThreadBusy("t1".into()));
        assert!(a.thread("ns/k2", "t1").is_ok(), "another key's thread of the same name is separate");
        drop(t);
        assert!(a.thread("ns/k", "t1").is_ok());
    }
}
