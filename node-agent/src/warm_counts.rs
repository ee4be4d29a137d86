//! How warm interpreters fare at their calls: how many served one, and
//! whether they keep failing to (then the node likely forbids what a warm
//! start needs, e.g. an LSM rule against attaching to a child process);
//! and what the pool costs that no key pays for: the CPU its sandboxes use
//! before their calls (setup, warm imports, anything left running), and the
//! idle sandboxes discarded for using too much of it.

use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering};

/// Calls that asked for their warm interpreter and started cold, in a row,
/// before the agent warns once.
const WARN_AFTER: u32 = 16;

/// Shared by every sandbox of the agent.
#[derive(Debug, Default)]
pub struct WarmCounts {
    served: AtomicU64,
    cold_in_a_row: AtomicU32,
    warned: AtomicBool,
    idle_cpu_micros: AtomicU64,
    idle_discards: AtomicU64,
}

impl WarmCounts {
    /// Calls warm interpreters served since the agent started.
    pub fn served(&self) -> u64 {
        self.served.load(Ordering::Relaxed)
    }

    /// Adds CPU a sandbox used before a call.
    pub fn add_idle_cpu(&self, micros: u64) {
        self.idle_cpu_micros.fetch_add(micros, Ordering::Relaxed);
    }

    /// Counts an idle sandbox discarded for the CPU it used.
    pub fn add_idle_discard(&self) {
        self.idle_discards.fetch_add(1, Ordering::Relaxed);
    }

    /// CPU (µs) pooled sandboxes used before their calls, and idle ones
    /// discarded for it, since the agent started.
    pub fn idle(&self) -> (u64, u64) {
        (self.idle_cpu_micros.load(Ordering::Relaxed), self.idle_discards.load(Ordering::Relaxed))
    }

    /// Records one call's start: `asked` when its sandbox held a matching
    /// warm interpreter, `served` when that interpreter took the call.
    /// True exactly once: when [`WARN_AFTER`] asking calls in a row started
    /// cold (a shadowed warm module or an interpreter that died are single
    /// events; a row of them is the node).
    pub fn record(&self, asked: bool, served: bool) -> bool {
        if served {
            self.served.fetch_add(1, Ordering::Relaxed);
            self.cold_in_a_row.store(0, Ordering::Relaxed);
            return false;
        }
        if !asked {
            return false;
        }
        let row = self.cold_in_a_row.fetch_add(1, Ordering::Relaxed) + 1;
        row >= WARN_AFTER && !self.warned.swap(true, Ordering::Relaxed)
    }
}

#[cfg(test)]
mod tests {
    use super::{WarmCounts, WARN_AFTER};

    #[test]
    fn a_row_of_cold_starts_warns_once_and_a_served_call_breaks_the_row() {
        let c = WarmCounts::default();
        for _ in 0..WARN_AFTER - 1 {
            assert!(!c.record(true, false));
        }
        assert!(!c.record(true, true), "served: the row starts again");
        assert_eq!(c.served(), 1);
        for _ in 0..WARN_AFTER - 1 {
            assert!(!c.record(true, false));
        }
        assert!(!c.record(false, false), "a call without a warm interpreter says nothing");
        assert!(c.record(true, false), "the sixteenth in a row warns");
        assert!(!c.record(true, false), "once");
    }
}
