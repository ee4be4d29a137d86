//! The gateway's memory for execution output.
//!
//! A result holds the program's output until it is sent: as text, and again
//! JSON-encoded (the streamed final line repeats it too), so each byte kept
//! costs [`HELD_PER_OUTPUT_BYTE`]. One execution may print up to its key's
//! `maxOutputBytes` on each of stdout and stderr, and a few large outputs at
//! once could exhaust a shared gateway; so output memory comes from a global
//! budget, of which one key may hold at most half (a single tenant cannot
//! take all of it).
//!
//! An execution reserves it as its output arrives, not its worst case up
//! front: [`STEP`] at admission, then more in steps of [`STEP`] as each
//! stream's kept output grows (`exec::output`). Every reservation and every
//! step waits in order (first come, first served: the key's share first,
//! then the global budget) for memory others give back, up to a deadline.
//! A reservation is returned whole when its response is done.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::sync::Semaphore;
use tokio::time::Instant;

use crate::exec_error::ExecError;

/// Reserved bytes are counted in units of this many bytes.
const UNIT: u64 = 1024;

/// What an execution reserves at admission, and the least each growth
/// adds: small outputs never grow, large ones grow in few steps.
pub const STEP: u64 = 64 * 1024;

/// Bytes one stream of an execution may hold, per byte of its output:
/// its text and that text JSON-encoded, together (see [`fit_encoded`]).
/// Ordinary output — JSON documents with their quotes and escapes included
/// — fits well within it; only text dominated by control characters or
/// invalid UTF-8 (escapes of 6 bytes, replacement characters of 3) would
/// need more, and is cut instead.
pub const HELD_PER_OUTPUT_BYTE: u64 = 3;

/// Bytes one execution may hold at most: stdout and stderr, each as text
/// and encoded, at the output cap.
pub fn worst_case(max_output_bytes: u64) -> u64 {
    max_output_bytes.saturating_mul(2 * HELD_PER_OUTPUT_BYTE)
}

/// Bytes one stream that kept `kept` bytes of output may hold: its text
/// and encoding (and the encoding's quotes), never beyond its cap's share.
pub fn stream_share(kept: u64, max_output_bytes: u64) -> u64 {
    kept.saturating_mul(HELD_PER_OUTPUT_BYTE).saturating_add(2).min(max_output_bytes.saturating_mul(HELD_PER_OUTPUT_BYTE))
}

/// What a run's output streams may hold, and which the gateway cut for
/// want of memory (`exec::output`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Holding {
    /// Per stream (stdout, stderr): bytes its text and encoding may take.
    pub shares: [u64; 2],
    /// Per stream: cut because the gateway's output memory stayed taken.
    pub cut: [bool; 2],
}

/// Cuts `text` (at a character boundary) where its bytes plus the bytes of
/// its JSON encoding would pass `limit`; true when it cut. This counts what
/// a response actually holds, not what the program printed.
pub fn fit_encoded(text: &mut String, limit: u64) -> bool {
    let mut used = 2u64; // the encoding's quotes
    for (i, c) in text.char_indices() {
        let encoded = match c {
            '"' | '\\' | '\n' | '\r' | '\t' | '\u{8}' | '\u{c}' => 2,
            c if (c as u32) < 0x20 => 6,
            c => c.len_utf8(),
        };
        used += (c.len_utf8() + encoded) as u64;
        if used > limit {
            text.truncate(i);
            return true;
        }
    }
    false
}

/// The global budget and each key's share of it.
#[derive(Debug)]
pub struct OutputBudget {
    global: Arc<Semaphore>,
    total_units: u64,
    keys: Mutex<HashMap<String, KeyShare>>,
}

/// One key's share: a FIFO semaphore of half the budget, kept while some
/// reservation of the key (held or waiting) uses it.
#[derive(Debug)]
struct KeyShare {
    units: Arc<Semaphore>,
    users: usize,
}

/// One execution's reservation; returned whole on drop.
#[derive(Debug)]
pub struct Reservation {
    budget: Arc<OutputBudget>,
    key: String,
    share: Arc<Semaphore>,
    /// Units taken from the key's share, and from the global budget (the
    /// first may run ahead of the second while a growth waits).
    from_share: u64,
    from_global: u64,
}

/// Which wait a reservation or growth ran out of time in.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Short {
    /// The key's executions held its share.
    KeyShare,
    /// Other keys' executions held the rest of the budget.
    Global,
}

impl Short {
    /// As the refusal of a new execution.
    pub fn refusal(self) -> ExecError {
        ExecError::Busy(match self {
            Short::KeyShare => "this key's executions held its share of the gateway's output memory",
            Short::Global => "the gateway's output memory was in use by other executions",
        })
    }
}

fn units_of(bytes: u64) -> u64 {
    bytes.div_ceil(UNIT)
}

impl OutputBudget {
    /// A budget of `bytes` in total.
    pub fn new(bytes: u64) -> Arc<OutputBudget> {
        // A semaphore holds at most usize::MAX >> 3 permits; budgets are far below.
        let total_units = units_of(bytes).min(u64::from(u32::MAX));
        Arc::new(OutputBudget { global: Arc::new(Semaphore::new(total_units as usize)), total_units, keys: Mutex::default() })
    }

    /// Most one key may hold.
    fn key_units(&self) -> u64 {
        self.total_units / 2
    }

    /// Refuses an execution whose worst case (`bytes`) one key could never
    /// hold: waiting would not help, its key's configuration must change.
    pub fn fits(&self, bytes: u64) -> Result<(), ExecError> {
        if units_of(bytes) > self.key_units() {
            return Err(ExecError::OutputBudget(format!(
                "this key's output limit needs {} MiB of gateway memory, more than one key may hold ({} MiB); lower maxOutputBytes",
                bytes >> 20,
                (self.key_units() * UNIT) >> 20
            )));
        }
        Ok(())
    }

    /// Reserves `bytes` for an execution of `key`, waiting up to `wait` in
    /// order for other executions to give budget back.
    pub async fn reserve(self: &Arc<Self>, key: &str, bytes: u64, wait: Duration) -> Result<Reservation, ExecError> {
        self.reserve_until(key, bytes, Instant::now() + wait).await
    }

    /// [`OutputBudget::reserve`] with a deadline: the key's share first,
    /// then the global budget; a refused reservation holds nothing.
    pub async fn reserve_until(self: &Arc<Self>, key: &str, bytes: u64, deadline: Instant) -> Result<Reservation, ExecError> {
        self.fits(bytes)?;
        let mut r = self.open(key);
        r.grow_until(bytes, deadline).await.map_err(Short::refusal)?;
        Ok(r)
    }

    /// An empty reservation of `key`, counted as a user of its share.
    fn open(self: &Arc<Self>, key: &str) -> Reservation {
        let mut keys = self.lock();
        let share = keys.entry(key.to_string()).or_insert_with(|| KeyShare { units: Arc::new(Semaphore::new(self.key_units() as usize)), users: 0 });
        share.users += 1;
        Reservation { budget: self.clone(), key: key.to_string(), share: share.units.clone(), from_share: 0, from_global: 0 }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<String, KeyShare>> {
        self.keys.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Bytes reserved now (for metrics and tests).
    pub fn reserved_bytes(&self) -> u64 {
        (self.total_units - self.global.available_permits() as u64) * UNIT
    }
}

impl Reservation {
    /// Bytes held in full (from both the key's share and the budget).
    pub fn bytes(&self) -> u64 {
        self.from_share.min(self.from_global) * UNIT
    }

    /// Grows the reservation to `bytes` in all, waiting in order until
    /// `deadline`. Cancel-safe: what was taken stays in the reservation.
    pub async fn grow_until(&mut self, bytes: u64, deadline: Instant) -> Result<(), Short> {
        let units = units_of(bytes);
        if units > self.budget.key_units() {
            return Err(Short::KeyShare);
        }
        if self.from_share < units {
            let need = (units - self.from_share) as u32;
            match tokio::time::timeout_at(deadline, self.share.acquire_many(need)).await {
                Ok(Ok(p)) => p.forget(),
                _ => return Err(Short::KeyShare),
            }
            self.from_share = units;
        }
        if self.from_global < units {
            let need = (units - self.from_global) as u32;
            match tokio::time::timeout_at(deadline, self.budget.global.acquire_many(need)).await {
                Ok(Ok(p)) => p.forget(),
                _ => {
                    // The share taken for this growth goes back to the key's
                    // other executions: only what is held in full stays.
                    self.share.add_permits((self.from_share - self.from_global) as usize);
                    self.from_share = self.from_global;
                    return Err(Short::Global);
                }
            }
            self.from_global = units;
        }
        Ok(())
    }
}

impl Drop for Reservation {
    fn drop(&mut self) {
        self.share.add_permits(self.from_share as usize);
        self.budget.global.add_permits(self.from_global as usize);
        let mut keys = self.budget.lock();
        if let Some(share) = keys.get_mut(&self.key) {
            share.users -= 1;
            if share.users == 0 {
                keys.remove(&self.key);
            }
        }
    }
}

#[cfg(test)]
mod tests;
