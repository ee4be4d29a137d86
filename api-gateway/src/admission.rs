//! The one-execution-per-thread rule within this gateway, and each key's
//! turn here.
//!
//! Across replicas the thread's home agent holds the same rule (a second
//! execution there is refused with THREAD_BUSY); this lock answers 409 here
//! without a round trip and serialises an execute with a delete of the same
//! thread. Per-key concurrency is counted on an agent (see
//! [`crate::exec::keyslot`]), where a key at its limit waits; before that,
//! a key's executions through this gateway take turns here, in order, at
//! most `maxConcurrency` at once, so those waiting for the key hold nothing
//! else (no node slot, no output memory) that other keys could use.

use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Mutex};

use tokio::sync::Semaphore;

use crate::exec_error::ExecError;

/// Threads running through this gateway, and each key's turns.
#[derive(Debug, Default)]
pub struct Admission {
    threads: Mutex<HashSet<(String, String)>>,
    /// Woken whenever a thread is let go, for callers that wait for theirs.
    freed: tokio::sync::Notify,
    /// Per key and limit (a changed limit starts afresh; the agent's count
    /// still holds the key to its limit meanwhile), with its users.
    turns: Mutex<HashMap<(String, u32), (Arc<Semaphore>, usize)>>,
}

/// One of a key's `maxConcurrency` turns through this gateway.
#[derive(Debug)]
pub struct KeyTurn {
    admission: Arc<Admission>,
    id: (String, u32),
    turn: Arc<Semaphore>,
    held: bool,
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

    /// Locks `thread_id` of `key`, waiting until `deadline` while another
    /// execution through this gateway holds it (one that was cancelled holds
    /// it until its agent confirms the end); 409 after.
    pub async fn thread_until(self: &Arc<Self>, key: &str, thread_id: &str, deadline: tokio::time::Instant) -> Result<ThreadLock, ExecError> {
        loop {
            // Registered before trying, so a release in between is not missed.
            let freed = self.freed.notified();
            tokio::pin!(freed);
            freed.as_mut().enable();
            match self.thread(key, thread_id) {
                Err(ExecError::ThreadBusy(_)) => {}
                taken => return taken,
            }
            if tokio::time::timeout_at(deadline, freed).await.is_err() {
                return Err(ExecError::ThreadBusy(thread_id.to_string()));
            }
        }
    }
}

impl Admission {
    /// A turn of `key` under `limit`, waiting in order behind the key's
    /// earlier requests until `deadline`: 429 when none came.
    pub async fn key_turn(self: &Arc<Self>, key: &str, limit: u32, deadline: tokio::time::Instant) -> Result<KeyTurn, ExecError> {
        let id = (key.to_string(), limit);
        let turn = {
            let mut turns = lock(&self.turns);
            let entry = turns.entry(id.clone()).or_insert_with(|| (Arc::new(Semaphore::new(limit.max(1) as usize)), 0));
            entry.1 += 1;
            entry.0.clone()
        };
        // From here the entry counts this request; dropping the turn undoes that.
        let mut t = KeyTurn { admission: self.clone(), id, turn, held: false };
        match tokio::time::timeout_at(deadline, t.turn.acquire()).await {
            Ok(Ok(p)) => p.forget(),
            _ => return Err(ExecError::KeyConcurrency(limit)),
        }
        t.held = true;
        Ok(t)
    }
}

impl Drop for KeyTurn {
    fn drop(&mut self) {
        if self.held {
            self.turn.add_permits(1);
        }
        let mut turns = lock(&self.admission.turns);
        if let Some(entry) = turns.get_mut(&self.id) {
            entry.1 -= 1;
            if entry.1 == 0 {
                turns.remove(&self.id);
            }
        }
    }
}

impl Drop for ThreadLock {
    fn drop(&mut self) {
        lock(&self.admission.threads).remove(&self.id);
        self.admission.freed.notify_waiters();
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

    #[tokio::test(start_paused = true)]
    async fn a_caller_that_waits_for_its_thread_gets_it_when_it_is_let_go_or_409_at_its_deadline() {
        use std::time::Duration;
        let a = Arc::new(Admission::default());
        let held = a.thread("ns/k", "t1").unwrap();
        let a1 = a.clone();
        let waiting = tokio::spawn(async move { a1.thread_until("ns/k", "t1", tokio::time::Instant::now() + Duration::from_secs(30)).await });
        tokio::time::sleep(Duration::from_secs(1)).await;
        assert!(!waiting.is_finished(), "the thread is still held");
        drop(held);
        let got = waiting.await.unwrap().expect("the waiter takes the thread once it is let go");
        let late = a.thread_until("ns/k", "t1", tokio::time::Instant::now() + Duration::from_secs(2)).await;
        assert_eq!(late.unwrap_err(), ExecError::ThreadBusy("t1".into()), "held past the deadline: 409");
        drop(got);
    }

    #[tokio::test(start_paused = true)]
    async fn a_keys_turns_are_its_limit_taken_in_order() {
        use std::time::Duration;
        let a = Arc::new(Admission::default());
        let soon = || tokio::time::Instant::now() + Duration::from_secs(60);
        let first = a.key_turn("ns/k", 1, soon()).await.unwrap();
        let (a1, a2) = (a.clone(), a.clone());
        let early = tokio::spawn(async move { a1.key_turn("ns/k", 1, soon()).await });
        tokio::time::sleep(Duration::from_millis(10)).await;
        let late = tokio::spawn(async move { a2.key_turn("ns/k", 1, soon()).await });
        tokio::time::sleep(Duration::from_millis(10)).await;
        assert!(a.key_turn("ns/other", 1, soon()).await.is_ok(), "keys take turns apart");
        drop(first);
        let turn = early.await.unwrap().unwrap();
        assert!(!late.is_finished(), "the earlier request got the turn");
        drop(turn);
        drop(late.await.unwrap().unwrap());
        let held = a.key_turn("ns/k", 1, soon()).await.unwrap();
        let t = tokio::time::Instant::now();
        let refused = a.key_turn("ns/k", 1, t + Duration::from_secs(2)).await.unwrap_err();
        assert_eq!((refused, t.elapsed()), (ExecError::KeyConcurrency(1), Duration::from_secs(2)));
        drop(held);
        assert!(lock(&a.turns).is_empty(), "no entry outlives its users");
    }
}
