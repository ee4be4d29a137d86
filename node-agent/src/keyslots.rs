//! Per-key concurrency counted for every gateway replica.
//!
//! Gateways pick the same agent for the same ApiKey (rendezvous hashing of
//! node names), and hold one slot here per running execution for as long as
//! the execution lasts. A slot is an RAII guard: the gRPC stream that grants
//! it owns it, so a cancelled call or a dropped connection returns it.
//!
//! A key at its limit makes a request wait, in order per key, up to the wait
//! the request carries: a returned slot goes straight to the oldest waiter
//! (its count never drops, so a newcomer cannot take it first). A waiter
//! that gives up, or whose call is cancelled, leaves the queue; a slot handed
//! to it in that instant is passed on, never lost.

use std::collections::{HashMap, VecDeque};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::sync::oneshot;

/// Highest limit a key may ask for (the CRD's own maximum is lower).
pub const MAX_LIMIT: u32 = 100_000;
/// Most slots this agent holds at once, over all keys: each is a stream on a
/// gateway's connection, and the map entry must not grow without bound.
pub const MAX_HELD: u32 = 1 << 20;
/// Most requests waiting at once, over all keys: each is a call held open.
pub const MAX_WAITING: usize = 1 << 16;
/// Longest wait a request may ask for.
pub const MAX_WAIT: Duration = Duration::from_secs(600);
/// `namespace/name` of Kubernetes objects: 63 + 1 + 253 bytes.
const MAX_KEY_LEN: usize = 317;

/// Why a slot was not granted.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum KeySlotError {
    /// The key is not `namespace/name`.
    #[error("key: must be the ApiKey's namespace/name")]
    Key,
    /// The limit is 0 or beyond [`MAX_LIMIT`].
    #[error("limit: must be 1..={MAX_LIMIT}")]
    Limit,
    /// The key held its limit of slots for the whole wait.
    #[error("the key already runs its limit of {0} concurrent executions")]
    AtLimit(u32),
    /// This agent holds [`MAX_HELD`] slots, or [`MAX_WAITING`] requests wait.
    #[error("this agent holds its maximum number of key slots")]
    Full,
}

/// The slots held on this agent, per key, and the requests waiting for one.
#[derive(Debug, Default)]
pub struct KeySlots {
    state: Mutex<State>,
}

#[derive(Debug, Default)]
struct State {
    held: HashMap<String, u32>,
    total: u32,
    /// Per key, oldest first.
    waiting: HashMap<String, VecDeque<Waiter>>,
    waiters: usize,
    next_id: u64,
}

/// A request waiting for a slot of its key; granted by sending it the
/// key's count with its slot included.
#[derive(Debug)]
struct Waiter {
    id: u64,
    limit: u32,
    grant: oneshot::Sender<u32>,
}

/// One held slot; returned on drop (to the key's oldest waiter, if any).
#[derive(Debug)]
pub struct KeySlot {
    slots: Arc<KeySlots>,
    key: String,
    held: u32,
}

impl KeySlot {
    /// Slots of this key held when this one was granted, itself included.
    pub fn held(&self) -> u32 {
        self.held
    }
}

fn valid_key(key: &str) -> bool {
    let Some((ns, name)) = key.split_once('/') else { return false };
    let part = |s: &str| !s.is_empty() && s.bytes().all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-' || b == b'.');
    key.len() <= MAX_KEY_LEN && part(ns) && part(name)
}

/// What a request gets at once: a slot, a place in the queue, or a refusal.
enum Now {
    Granted(u32),
    Queued(u64, oneshot::Receiver<u32>),
}

impl KeySlots {
    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        // Each critical section updates the maps and the totals together and
        // cannot panic in between, so a poisoned lock is still consistent.
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Takes a slot of `key` unless it holds `limit` already.
    pub fn hold(self: &Arc<Self>, key: &str, limit: u32) -> Result<KeySlot, KeySlotError> {
        match self.take_or_queue(key, limit, false)? {
            Now::Granted(held) => Ok(self.slot(key, held)),
            Now::Queued(..) => Err(KeySlotError::AtLimit(limit)),
        }
    }

    /// Takes a slot of `key` under `limit`, waiting up to `wait` (at most
    /// [`MAX_WAIT`]) behind the key's earlier requests while it is at its
    /// limit.
    pub async fn hold_within(self: &Arc<Self>, key: &str, limit: u32, wait: Duration) -> Result<KeySlot, KeySlotError> {
        let (id, rx) = match self.take_or_queue(key, limit, !wait.is_zero())? {
            Now::Granted(held) => return Ok(self.slot(key, held)),
            Now::Queued(id, rx) => (id, rx),
        };
        let mut ticket = Ticket { slots: self.clone(), key: key.to_string(), id, rx: Some(rx) };
        let granted = tokio::time::timeout(wait.min(MAX_WAIT), ticket.rx.as_mut().expect("set above")).await;
        match granted {
            Ok(Ok(held)) => {
                ticket.rx = None;
                Ok(self.slot(key, held))
            }
            // Timed out (or the queue was dropped): a grant racing the
            // timeout is still a grant.
            _ => match ticket.leave() {
                Some(held) => Ok(self.slot(key, held)),
                None => Err(KeySlotError::AtLimit(limit)),
            },
        }
    }

    fn slot(self: &Arc<Self>, key: &str, held: u32) -> KeySlot {
        KeySlot { slots: self.clone(), key: key.to_string(), held }
    }

    fn take_or_queue(&self, key: &str, limit: u32, may_wait: bool) -> Result<Now, KeySlotError> {
        if !valid_key(key) {
            return Err(KeySlotError::Key);
        }
        if limit == 0 || limit > MAX_LIMIT {
            return Err(KeySlotError::Limit);
        }
        let mut s = self.lock();
        let n = s.held.get(key).copied().unwrap_or(0);
        // Someone already waits: a newcomer queues behind them, free slot or not.
        let queued = s.waiting.get(key).is_some_and(|q| !q.is_empty());
        if n < limit && !queued {
            if s.total >= MAX_HELD {
                return Err(KeySlotError::Full);
            }
            s.held.insert(key.to_string(), n + 1);
            s.total += 1;
            return Ok(Now::Granted(n + 1));
        }
        if !may_wait {
            return Err(KeySlotError::AtLimit(limit));
        }
        if s.waiters >= MAX_WAITING {
            return Err(KeySlotError::Full);
        }
        let (grant, rx) = oneshot::channel();
        s.next_id += 1;
        let id = s.next_id;
        s.waiters += 1;
        s.waiting.entry(key.to_string()).or_default().push_back(Waiter { id, limit, grant });
        drop(s);
        // A slot may have been free (under a waiter's lower limit): serve in order.
        self.serve(key);
        Ok(Now::Queued(id, rx))
    }

    /// Hands the free slots of `key` to its waiters, oldest first, and stops
    /// at the first whose limit the key's count has reached.
    fn serve(&self, key: &str) {
        let mut s = self.lock();
        loop {
            let n = s.held.get(key).copied().unwrap_or(0);
            let Some(q) = s.waiting.get_mut(key) else { return };
            let Some(first) = q.front() else {
                s.waiting.remove(key);
                return;
            };
            if n >= first.limit {
                return;
            }
            let w = q.pop_front().expect("front exists");
            s.waiters -= 1;
            // A waiter that already left takes nothing; the next is asked.
            if w.grant.send(n + 1).is_ok() {
                s.held.insert(key.to_string(), n + 1);
                s.total += 1;
            }
        }
    }

    /// Returns one slot of `key` and serves its waiters.
    fn release(&self, key: &str) {
        {
            let mut s = self.lock();
            s.total = s.total.saturating_sub(1);
            if let Some(n) = s.held.get_mut(key) {
                *n -= 1;
                if *n == 0 {
                    s.held.remove(key);
                }
            }
        }
        self.serve(key);
    }

    /// Slots `key` holds now.
    pub fn held(&self, key: &str) -> u32 {
        self.lock().held.get(key).copied().unwrap_or(0)
    }

    /// Slots held over all keys.
    pub fn total(&self) -> u32 {
        self.lock().total
    }

    /// Requests waiting now, over all keys.
    pub fn waiting(&self) -> usize {
        self.lock().waiters
    }
}

/// A place in a key's queue; leaving it (given up, or the call cancelled)
/// removes it, and a slot granted meanwhile is returned.
struct Ticket {
    slots: Arc<KeySlots>,
    key: String,
    id: u64,
    /// `None` once granted.
    rx: Option<oneshot::Receiver<u32>>,
}

impl Ticket {
    /// Leaves the queue; `Some(held)` when a grant came first after all.
    fn leave(&mut self) -> Option<u32> {
        let mut rx = self.rx.take()?;
        {
            let mut s = self.slots.lock();
            if let Some(q) = s.waiting.get_mut(&self.key) {
                if let Some(at) = q.iter().position(|w| w.id == self.id) {
                    q.remove(at);
                    s.waiters -= 1;
                }
            }
        }
        // Out of the queue, nothing more is sent; one sent before is read here.
        rx.close();
        rx.try_recv().ok()
    }
}

impl Drop for Ticket {
    fn drop(&mut self) {
        if self.leave().is_some() {
            // Granted to a call that is gone: the slot goes to the next one.
            self.slots.release(&self.key);
        }
    }
}

impl Drop for KeySlot {
    fn drop(&mut self) {
        self.slots.release(&self.key);
    }
}

#[cfg(test)]
mod tests;
