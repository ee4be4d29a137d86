//! The gateway's memory for uploads it must hold whole.
//!
//! Most uploads stream to the node. An E2B multipart form, or an E2B body
//! without Content-Length, is held whole before it is parsed and stored (up
//! to 32 MiB each); without a bound, uploads that stall halfway pile up
//! (16 of them took a gateway from 21 to 523 MiB). So every held upload
//! reserves its bytes, as they arrive, from one budget for the whole gateway
//! (`--upload-budget-mib`), and one key may hold at most half of it. An
//! upload whose next bytes do not fit is refused at once — the caller
//! retries shortly, or sends the file as a stream — and a reservation is
//! returned when its upload is done or cut ([`body::collect`] cuts the ones
//! that stop arriving).

pub mod body;

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

/// Bytes reserved per byte received: the chunks as they arrive, and the one
/// contiguous copy the multipart parser reads, exist together for a moment.
pub const HELD_PER_BYTE: u64 = 2;

/// The budget and what each key holds of it.
#[derive(Debug)]
pub struct UploadBudget {
    total: u64,
    held: Mutex<Held>,
}

#[derive(Debug, Default)]
struct Held {
    all: u64,
    per_key: HashMap<String, u64>,
}

/// Why an upload's next bytes were refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum Refused {
    /// The key's uploads hold half the budget, its most.
    #[error("this key's uploads in progress hold its share of the gateway's upload memory ({0} MiB)")]
    KeyShare(u64),
    /// Other uploads hold the rest.
    #[error("the gateway's upload memory ({0} MiB) is held by uploads in progress")]
    Full(u64),
}

/// One upload's reservation, grown as its bytes arrive; returned on drop.
#[derive(Debug)]
pub struct Hold {
    budget: Arc<UploadBudget>,
    key: String,
    bytes: u64,
}

impl UploadBudget {
    /// A budget of `bytes` in all.
    pub fn new(bytes: u64) -> Arc<UploadBudget> {
        Arc::new(UploadBudget { total: bytes, held: Mutex::default() })
    }

    /// An empty reservation for an upload of `key` (its qualified name).
    pub fn hold(self: &Arc<Self>, key: &str) -> Hold {
        Hold { budget: self.clone(), key: key.to_string(), bytes: 0 }
    }

    /// Bytes reserved now (for tests and metrics).
    pub fn held_bytes(&self) -> u64 {
        self.lock().all
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Held> {
        self.held.lock().unwrap_or_else(|p| p.into_inner())
    }
}

impl Hold {
    /// Reserves `bytes` more, or refuses them (the reservation is unchanged).
    pub fn grow(&mut self, bytes: u64) -> Result<(), Refused> {
        let budget = &self.budget;
        let mut held = budget.lock();
        let mine = held.per_key.get(&self.key).copied().unwrap_or(0);
        if mine.saturating_add(bytes) > budget.total / 2 {
            return Err(Refused::KeyShare((budget.total / 2) >> 20));
        }
        if held.all.saturating_add(bytes) > budget.total {
            return Err(Refused::Full(budget.total >> 20));
        }
        held.all += bytes;
        *held.per_key.entry(self.key.clone()).or_default() += bytes;
        self.bytes += bytes;
        Ok(())
    }
}

impl Drop for Hold {
    fn drop(&mut self) {
        if self.bytes == 0 {
            return;
        }
        let mut held = self.budget.lock();
        held.all = held.all.saturating_sub(self.bytes);
        if let Some(n) = held.per_key.get_mut(&self.key) {
            *n = n.saturating_sub(self.bytes);
            if *n == 0 {
                held.per_key.remove(&self.key);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MIB: u64 = 1 << 20;

    #[test]
    fn holds_are_bounded_globally_and_per_key_and_returned_on_drop() {
        let b = UploadBudget::new(100 * MIB);
        let mut a1 = b.hold("ns/a");
        a1.grow(30 * MIB).unwrap();
        let mut a2 = b.hold("ns/a");
        a2.grow(20 * MIB).unwrap();
        assert_eq!(a2.grow(MIB), Err(Refused::KeyShare(50)), "one key holds at most half");
        let mut b1 = b.hold("ns/b");
        b1.grow(40 * MIB).unwrap();
        let mut c1 = b.hold("ns/c");
        assert_eq!(c1.grow(20 * MIB), Err(Refused::Full(100)));
        assert_eq!(b.held_bytes(), 90 * MIB, "a refused reservation holds nothing");
        drop(a1);
        c1.grow(20 * MIB).unwrap();
        drop((a2, b1, c1));
        assert_eq!(b.held_bytes(), 0);
        assert!(b.lock().per_key.is_empty(), "nothing is left per key");
    }
}
