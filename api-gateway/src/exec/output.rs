//! The output one run keeps, and the gateway memory reserved for it.
//!
//! Every chunk of output passes here before any adapter sees it (plain,
//! streamed, async, MCP and E2B results alike): the run's reservation grows
//! to cover what its streams will hold (text and JSON encoding, see
//! `budget::stream_share`) before the chunk is kept. When the gateway's
//! output memory stays taken for [`GROW_WAIT`], that stream is cut there:
//! the rest of it is read from the agent and discarded, and the result says
//! the stream was truncated. What a response holds stays within what was
//! reserved.

use std::time::Duration;

use tokio::time::Instant;

use crate::budget::{self, Reservation};
pub use crate::budget::Holding;

/// Longest a chunk waits for more output memory before its stream is cut:
/// well under the agent's output stall (30 s), which a wait here could
/// otherwise trip.
pub const GROW_WAIT: Duration = Duration::from_secs(5);

/// Stream names, for the log.
const NAMES: [&str; 2] = ["stdout", "stderr"];

/// One run's kept output and its reservation.
#[derive(Debug)]
pub struct Output {
    reservation: Reservation,
    max_output_bytes: u64,
    kept: [u64; 2],
    cut: [bool; 2],
    wait: Duration,
    /// Set while a chunk waits for memory (kept across a cancelled wait).
    deadline: Option<Instant>,
}

impl Output {
    /// Output of an execution capped at `max_output_bytes` per stream,
    /// reserved in `reservation`; a growth waits up to `wait`.
    pub fn new(reservation: Reservation, max_output_bytes: u64, wait: Duration) -> Output {
        Output { reservation, max_output_bytes, kept: [0; 2], cut: [false; 2], wait: wait.min(GROW_WAIT), deadline: None }
    }

    /// Makes room for `n` more bytes of stream `i` (0 stdout, 1 stderr);
    /// false when that stream is cut (now or earlier). Cancel-safe.
    pub async fn room(&mut self, i: usize, n: usize, id: &str) -> bool {
        if self.cut[i] {
            return false;
        }
        let mut kept = self.kept;
        kept[i] = kept[i].saturating_add(n as u64);
        let deadline = *self.deadline.get_or_insert_with(|| Instant::now() + self.wait);
        let grown = self.reservation.grow_until(self.target(kept), deadline).await;
        self.deadline = None;
        match grown {
            Ok(()) => {
                self.kept = kept;
                true
            }
            Err(short) => {
                tracing::info!(execution_id = %id, stream = NAMES[i], kept = self.kept[i], reserved = self.reservation.bytes(), ?short, "the gateway's output memory stayed taken: the stream is cut here");
                self.cut[i] = true;
                false
            }
        }
    }

    /// The reservation streams that kept `kept` need: their shares, in
    /// steps, never beyond the execution's worst case.
    fn target(&self, kept: [u64; 2]) -> u64 {
        // Each share is at most its cap's, so the sum never passes the worst case.
        let need: u64 = kept.iter().map(|k| budget::stream_share(*k, self.max_output_bytes)).sum();
        need.div_ceil(budget::STEP).saturating_mul(budget::STEP).min(budget::worst_case(self.max_output_bytes))
    }

    /// What each stream may hold, and which were cut: its share of what
    /// it kept, and half of what the reservation holds beyond both shares
    /// (so a short output with a few replacement characters is not cut for
    /// want of a byte the reservation has anyway).
    pub fn holding(&self) -> Holding {
        let need = self.kept.map(|k| budget::stream_share(k, self.max_output_bytes));
        let slack = self.reservation.bytes().saturating_sub(need[0] + need[1]);
        let cap = self.max_output_bytes.saturating_mul(budget::HELD_PER_OUTPUT_BYTE);
        let shares = [(need[0] + slack / 2).min(cap), (need[1] + slack - slack / 2).min(cap)];
        Holding { shares, cut: self.cut }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::budget::OutputBudget;

    const MIB: u64 = 1 << 20;

    #[tokio::test(start_paused = true)]
    async fn output_is_reserved_as_it_arrives_and_cut_when_memory_stays_taken() {
        let b = OutputBudget::new(8 * MIB);
        let r = b.reserve("a", budget::STEP, Duration::ZERO).await.unwrap();
        let mut out = Output::new(r, MIB, Duration::from_secs(30));
        assert!(out.room(0, 1000, "t").await && out.room(1, 10, "t").await);
        assert_eq!(b.reserved_bytes(), budget::STEP, "small output stays within the first step");
        assert!(out.room(0, 512 * 1024, "t").await);
        assert!(b.reserved_bytes() >= 3 * 513 * 1024, "grown to cover the text and its encoding: {}", b.reserved_bytes());
        // Other keys take the rest of the budget: the next growth waits, then cuts.
        let free = 8 * MIB - b.reserved_bytes();
        let _b = b.reserve("b", 4 * MIB, Duration::ZERO).await.unwrap();
        let _c = b.reserve("c", free - 4 * MIB, Duration::ZERO).await.unwrap();
        let t = Instant::now();
        assert!(!out.room(0, 512 * 1024, "t").await);
        assert_eq!(t.elapsed(), GROW_WAIT, "it waited, bounded");
        assert!(!out.room(0, 1, "t").await, "a cut stream stays cut");
        let h = out.holding();
        assert_eq!(h.cut, [true, false]);
        assert!(h.shares.iter().sum::<u64>() <= 8 * MIB - free, "the shares stay within what this run reserved");
        assert!(h.shares[0] >= 3 * (1000 + 512 * 1024) && h.shares[1] >= 3 * 10 + 2, "{h:?}");
    }

    #[tokio::test]
    async fn the_target_is_stepped_and_capped_at_the_worst_case() {
        let b = OutputBudget::new(16 * MIB);
        let out = Output::new(b.reserve("a", 1024, Duration::ZERO).await.unwrap(), 64 * 1024, Duration::ZERO);
        assert_eq!(out.target([1, 0]), budget::STEP);
        assert_eq!(out.target([u64::MAX, u64::MAX]), budget::worst_case(64 * 1024));
    }
}
