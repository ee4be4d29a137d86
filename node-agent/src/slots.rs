//! Host uid/gid slots: each live sandbox gets two host ids of its own (root
//! inside and the program's uid 1000), so two sandboxes never share a host
//! identity, and RLIMIT_NPROC counts one sandbox only.

use std::sync::{Arc, Mutex};

/// A fixed set of slots.
#[derive(Clone)]
pub struct Slots {
    used: Arc<Mutex<Vec<bool>>>,
    uid_base: u32,
}

impl Slots {
    /// `count` slots with host ids from `uid_base` up (two per slot).
    pub fn new(count: usize, uid_base: u32) -> Slots {
        Slots { used: Arc::new(Mutex::new(vec![false; count])), uid_base }
    }

    /// Takes a free slot, if any.
    pub fn acquire(&self) -> Option<Slot> {
        let mut used = self.used.lock().unwrap_or_else(|p| p.into_inner());
        let index = used.iter().position(|u| !u)?;
        used[index] = true;
        Some(Slot { index, host_id: self.uid_base + 2 * index as u32, used: self.used.clone() })
    }

    /// Slots in use.
    pub fn in_use(&self) -> usize {
        self.used.lock().unwrap_or_else(|p| p.into_inner()).iter().filter(|u| **u).count()
    }
}

/// One taken slot; released on drop.
pub struct Slot {
    index: usize,
    host_id: u32,
    used: Arc<Mutex<Vec<bool>>>,
}

impl Slot {
    /// Slot number.
    pub fn index(&self) -> usize {
        self.index
    }

    /// Host uid/gid of root inside the sandbox; the program's is this + 1.
    pub fn host_id(&self) -> u32 {
        self.host_id
    }
}

impl Drop for Slot {
    fn drop(&mut self) {
        let mut used = self.used.lock().unwrap_or_else(|p| p.into_inner());
        used[self.index] = false;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn slots_are_exclusive_and_released_on_drop() {
        let slots = Slots::new(2, 1_000_000);
        let a = slots.acquire().unwrap();
        let b = slots.acquire().unwrap();
        assert!(slots.acquire().is_none());
        assert_eq!((a.host_id(), b.host_id()), (1_000_000, 1_000_002));
        drop(a);
        assert_eq!(slots.in_use(), 1);
        assert_eq!(slots.acquire().unwrap().host_id(), 1_000_000);
    }
}
