//! Per-key concurrency and the one-execution-per-thread rule.
//!
//! State lives outside the configuration so a reload never resets counts of
//! executions already running. Both are held by RAII guards: however a
//! request ends (finished, failed, client gone), its slot is returned.

use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Mutex};

use crate::exec::ExecError;

/// Counters and locks shared by all requests of this gateway.
#[derive(Debug, Default)]
pub struct Admission {
    running: Mutex<HashMap<String, u32>>,
    threads: Mutex<HashSet<(String, String)>>,
}

/// A running execution of one key.
#[derive(Debug)]
pub struct KeySlot {
    admission: Arc<Admission>,
    key: String,
}

/// Exclusive use of one thread.
#[derive(Debug)]
pub struct ThreadLock {
    admission: Arc<Admission>,
    id: (String, String),
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    // A panic while holding these short critical sections cannot leave the
    // maps half-updated, so a poisoned lock is still consistent.
    m.lock().unwrap_or_else(|p| p.into_inner())
}

impl Admission {
    /// Takes a slot for `key` (its `namespace/name`), or 429 at `limit`.
    pub fn key_slot(self: &Arc<Self>, key: &str, limit: u32) -> Result<KeySlot, ExecError> {
        let mut running = lock(&self.running);
        let n = running.entry(key.to_string()).or_default();
        if *n >= limit {
            return Err(ExecError::KeyConcurrency(limit));
        }
        *n += 1;
        Ok(KeySlot { admission: self.clone(), key: key.to_string() })
    }

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

impl Drop for KeySlot {
    fn drop(&mut self) {
        let mut running = lock(&self.admission.running);
        if let Some(n) = running.get_mut(&self.key) {
            *n -= 1;
            if *n == 0 {
                running.remove(&self.key);
            }
        }
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
    fn key_slots_are_counted_and_returned() {
        let a = Arc::new(Admission::default());
        let s1 = a.key_slot("ns/k", 2).unwrap();
        let _s2 = a.key_slot("ns/k", 2).unwrap();
        assert_eq!(a.key_slot("ns/k", 2).unwrap_err(), ExecError::KeyConcurrency(2));
        assert!(a.key_slot("ns/other", 2).is_ok(), "keys are counted separately");
        drop(s1);
        assert!(a.key_slot("ns/k", 2).is_ok());
    }

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
