//! Per-key concurrency counted for every gateway replica.
//!
//! Gateways pick the same agent for the same ApiKey (rendezvous hashing of
//! node names), and hold one slot here per running execution for as long as
//! the execution lasts. A slot is an RAII guard: the gRPC stream that grants
//! it owns it, so a cancelled call or a dropped connection returns it.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

/// Highest limit a key may ask for (the CRD's own maximum is lower).
pub const MAX_LIMIT: u32 = 100_000;
/// Most slots this agent holds at once, over all keys: each is a stream on a
/// gateway's connection, and the map entry must not grow without bound.
pub const MAX_HELD: u32 = 1 << 20;
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
    /// The key holds its limit of slots.
    #[error("the key already runs its limit of {0} concurrent executions")]
    AtLimit(u32),
    /// This agent holds [`MAX_HELD`] slots.
    #[error("this agent holds its maximum number of key slots")]
    Full,
}

/// The slots held on this agent, per key.
#[derive(Debug, Default)]
pub struct KeySlots {
    state: Mutex<State>,
}

#[derive(Debug, Default)]
struct State {
    held: HashMap<String, u32>,
    total: u32,
}

/// One held slot; returned on drop.
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

impl KeySlots {
    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        // Each critical section updates the map and the total together and
        // cannot panic in between, so a poisoned lock is still consistent.
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Takes a slot of `key` unless it holds `limit` already.
    pub fn hold(self: &Arc<Self>, key: &str, limit: u32) -> Result<KeySlot, KeySlotError> {
        if !valid_key(key) {
            return Err(KeySlotError::Key);
        }
        if limit == 0 || limit > MAX_LIMIT {
            return Err(KeySlotError::Limit);
        }
        let mut s = self.lock();
        if s.total >= MAX_HELD {
            return Err(KeySlotError::Full);
        }
        let n = s.held.get(key).copied().unwrap_or(0);
        if n >= limit {
            return Err(KeySlotError::AtLimit(limit));
        }
        s.held.insert(key.to_string(), n + 1);
        s.total += 1;
        Ok(KeySlot { slots: self.clone(), key: key.to_string(), held: n + 1 })
    }

    /// Slots `key` holds now.
    pub fn held(&self, key: &str) -> u32 {
        self.lock().held.get(key).copied().unwrap_or(0)
    }

    /// Slots held over all keys.
    pub fn total(&self) -> u32 {
        self.lock().total
    }
}

impl Drop for KeySlot {
    fn drop(&mut self) {
        let mut s = self.slots.lock();
        s.total = s.total.saturating_sub(1);
        if let Some(n) = s.held.get_mut(&self.key) {
            *n -= 1;
            if *n == 0 {
                s.held.remove(&self.key);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_key_gets_its_limit_and_each_slot_returns_on_drop() {
        let slots = Arc::new(KeySlots::default());
        let a = slots.hold("team/k", 2).unwrap();
        let b = slots.hold("team/k", 2).unwrap();
        assert_eq!((a.held(), b.held()), (1, 2));
        assert_eq!(slots.hold("team/k", 2).unwrap_err(), KeySlotError::AtLimit(2));
        assert!(slots.hold("team/other", 1).is_ok(), "keys are counted apart");
        drop(a);
        let c = slots.hold("team/k", 2).unwrap();
        drop((b, c));
        assert_eq!((slots.held("team/k"), slots.total()), (0, 0), "nothing is left behind");
    }

    #[test]
    fn a_lowered_limit_refuses_new_slots_until_enough_returned() {
        let slots = Arc::new(KeySlots::default());
        let held: Vec<_> = (0..3).map(|_| slots.hold("team/k", 3).unwrap()).collect();
        assert_eq!(slots.hold("team/k", 1).unwrap_err(), KeySlotError::AtLimit(1));
        drop(held);
        assert!(slots.hold("team/k", 1).is_ok());
    }

    #[test]
    fn malformed_requests_hold_nothing() {
        let slots = Arc::new(KeySlots::default());
        for key in ["", "k", "/k", "team/", "Team/k", "team/k/x", "team/k\n", &format!("team/{}", "a".repeat(400))] {
            assert_eq!(slots.hold(key, 1).unwrap_err(), KeySlotError::Key, "{key:?}");
        }
        assert_eq!(slots.hold("team/k", 0).unwrap_err(), KeySlotError::Limit);
        assert_eq!(slots.hold("team/k", MAX_LIMIT + 1).unwrap_err(), KeySlotError::Limit);
        assert_eq!(slots.total(), 0);
    }
}
