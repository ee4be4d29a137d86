//! The gateway's memory for execution output.
//!
//! A result holds the program's output until it is sent: as text, and again
//! JSON-encoded (the streamed final line repeats it too). One execution may
//! print up to its key's `maxOutputBytes` on each of stdout and stderr, so a
//! few large outputs at once could exhaust a shared gateway. Each admitted
//! execution therefore reserves its worst case from a global budget before
//! it runs; one key may hold at most half of it, so a single tenant cannot
//! take all of it. Reservations are released when the response is done.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::sync::{OwnedSemaphorePermit, Semaphore};

use crate::exec_error::ExecError;

/// Reserved bytes are counted in units of this many bytes.
const UNIT: u64 = 1024;

/// Bytes one stream of an execution may hold, per byte of its output cap:
/// its text and that text JSON-encoded, together (see [`fit_encoded`]).
/// Ordinary output — JSON documents with their quotes and escapes included
/// — fits well within it; only text dominated by control characters or
/// invalid UTF-8 (escapes of 6 bytes, replacement characters of 3) would
/// need more, and is cut instead.
pub const HELD_PER_OUTPUT_BYTE: u64 = 3;

/// Bytes one execution may hold: stdout and stderr, each as text and encoded.
pub fn worst_case(max_output_bytes: u64) -> u64 {
    max_output_bytes.saturating_mul(2 * HELD_PER_OUTPUT_BYTE)
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

/// The global budget and what each key holds of it.
#[derive(Debug)]
pub struct OutputBudget {
    units: Arc<Semaphore>,
    total_units: u64,
    per_key: Mutex<HashMap<String, u64>>,
}

/// One execution's reservation; released on drop.
#[derive(Debug)]
pub struct Reservation {
    budget: Arc<OutputBudget>,
    key: String,
    units: u64,
    _permit: Option<OwnedSemaphorePermit>,
}

fn units_of(bytes: u64) -> u64 {
    bytes.div_ceil(UNIT)
}

impl OutputBudget {
    /// A budget of `bytes` in total.
    pub fn new(bytes: u64) -> Arc<OutputBudget> {
        // A semaphore holds at most usize::MAX >> 3 permits; budgets are far below.
        let total_units = units_of(bytes).min(u64::from(u32::MAX));
        Arc::new(OutputBudget { units: Arc::new(Semaphore::new(total_units as usize)), total_units, per_key: Mutex::default() })
    }

    /// Most one key may hold.
    fn key_units(&self) -> u64 {
        self.total_units / 2
    }

    /// Reserves `bytes` for an execution of `key`, waiting up to `wait` for
    /// other executions to give budget back. A reservation that could never
    /// fit, or a key already holding its share, is refused at once.
    pub async fn reserve(self: &Arc<Self>, key: &str, bytes: u64, wait: Duration) -> Result<Reservation, ExecError> {
        let units = units_of(bytes);
        if units > self.key_units() {
            return Err(ExecError::OutputBudget(format!(
                "this key's output limit needs {} MiB of gateway memory, more than one key may hold ({} MiB); lower maxOutputBytes",
                bytes >> 20,
                (self.key_units() * UNIT) >> 20
            )));
        }
        {
            let mut held = self.lock();
            let mine = held.entry(key.to_string()).or_default();
            if *mine + units > self.key_units() {
                return Err(ExecError::OutputBudget("this key's executions hold its share of the gateway's output memory; retry after one finishes".into()));
            }
            *mine += units;
        }
        // From here the key's count includes this reservation; dropping it undoes that.
        let mut r = Reservation { budget: self.clone(), key: key.to_string(), units, _permit: None };
        let acquire = self.units.clone().acquire_many_owned(units as u32);
        match tokio::time::timeout(wait, acquire).await {
            Ok(Ok(permit)) => {
                r._permit = Some(permit);
                Ok(r)
            }
            _ => Err(ExecError::OutputBudget("the gateway's output memory is in use by other executions; retry shortly".into())),
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<String, u64>> {
        self.per_key.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Bytes reserved now (for metrics and tests).
    pub fn reserved_bytes(&self) -> u64 {
        (self.total_units - self.units.available_permits() as u64) * UNIT
    }
}

impl Drop for Reservation {
    fn drop(&mut self) {
        let mut held = self.budget.lock();
        if let Some(n) = held.get_mut(&self.key) {
            *n = n.saturating_sub(self.units);
            if *n == 0 {
                held.remove(&self.key);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The attack: a program printing its output cap of bytes that encode
    /// worst (control characters: 6 bytes of JSON each; invalid UTF-8: 3
    /// bytes of text each) made a body of ~14× the cap against a
    /// reservation of 4×. What a result holds now stays within its share.
    #[test]
    fn what_a_result_holds_stays_within_its_reservation_whatever_was_printed() {
        let cap = 64 * 1024u64;
        let share = cap * HELD_PER_OUTPUT_BYTE;
        let control = "\u{1}".repeat(cap as usize);
        let invalid = String::from_utf8_lossy(&vec![0xffu8; cap as usize]).into_owned();
        for printed in [control, invalid] {
            let mut text = printed.clone();
            assert!(fit_encoded(&mut text, share), "worst-case output is cut");
            let held = text.len() + serde_json::to_string(&text).unwrap().len();
            assert!(held as u64 <= share, "{held} > {share}");
        }
        // Ordinary output, a JSON document with its quotes, is never cut.
        let doc = r#"{"id": 1, "name": "ada", "tags": ["a", "b"], "path": "C:\\tmp"}"#.repeat((cap / 32) as usize);
        let mut text = doc[..cap as usize].to_string();
        assert!(!fit_encoded(&mut text, share));
        assert_eq!(text.len() as u64, cap);
        assert_eq!(worst_case(cap), 2 * share);
    }

    const MIB: u64 = 1 << 20;
    const NOW: Duration = Duration::ZERO;

    #[tokio::test]
    async fn reservations_are_bounded_globally_and_per_key_and_returned() {
        let b = OutputBudget::new(100 * MIB);
        let a1 = b.reserve("a", 30 * MIB, NOW).await.unwrap();
        assert_eq!(b.reserved_bytes(), 30 * MIB);
        let e = b.reserve("a", 30 * MIB, NOW).await.unwrap_err();
        assert!(matches!(&e, ExecError::OutputBudget(m) if m.contains("its share")), "{e:?}");
        let b1 = b.reserve("b", 50 * MIB, NOW).await.unwrap();
        let e = b.reserve("c", 40 * MIB, NOW).await.unwrap_err();
        assert!(e.to_string().contains("in use by other executions"), "{e:?}");
        assert_eq!(b.reserved_bytes(), 80 * MIB, "a refused reservation holds nothing");
        assert!(b.reserve("c", 51 * MIB, NOW).await.unwrap_err().to_string().contains("lower maxOutputBytes"));
        drop(a1);
        drop(b1);
        assert_eq!(b.reserved_bytes(), 0);
        let _c = b.reserve("c", 40 * MIB, NOW).await.unwrap();
        let _a = b.reserve("a", 50 * MIB, NOW).await.unwrap();
    }

    #[tokio::test(start_paused = true)]
    async fn a_reservation_waits_for_budget_to_come_back() {
        let b = OutputBudget::new(100 * MIB);
        let first = b.reserve("a", 50 * MIB, NOW).await.unwrap();
        let _second = b.reserve("b", 40 * MIB, NOW).await.unwrap();
        let b2 = b.clone();
        let waiting = tokio::spawn(async move { b2.reserve("c", 20 * MIB, Duration::from_secs(5)).await.map(drop) });
        tokio::time::sleep(Duration::from_secs(1)).await;
        drop(first);
        assert!(waiting.await.unwrap().is_ok());
    }
}
