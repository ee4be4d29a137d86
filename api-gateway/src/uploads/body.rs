//! Reading an upload whole under the budget, while it keeps arriving.
//!
//! A fixed window (the old 120 s) lets a stalled upload hold its memory for
//! the whole window, and cuts a slow but honest one. Instead an upload must
//! keep moving: it is cut when nothing arrives for the body timeout, or when
//! it falls below the minimum rate — after the body timeout's grace, each
//! byte buys `1 / min_rate` seconds. Either way its reservation is returned.

use std::time::Duration;

use axum::body::{Body, Bytes};
use futures_util::StreamExt;
use tokio::time::Instant;

use super::{Hold, Refused, HELD_PER_BYTE};

/// How an upload must keep arriving.
#[derive(Debug, Clone, Copy)]
pub struct Pace {
    /// Longest silence, and the grace before the rate counts.
    pub idle: Duration,
    /// Least average rate after the grace, bytes per second.
    pub min_rate: u64,
}

impl Pace {
    /// When the upload is cut unless more arrives: `idle` from now, and no
    /// later than the rate allows for what arrived since `start`.
    pub fn deadline(&self, start: Instant, now: Instant, received: u64) -> Instant {
        let earned = Duration::from_millis(received.saturating_mul(1000) / self.min_rate.max(1));
        let by_rate = start.checked_add(self.idle.saturating_add(earned));
        let by_idle = now + self.idle;
        by_rate.map_or(by_idle, |r| r.min(by_idle))
    }
}

/// Why an upload was not read whole.
#[derive(Debug, PartialEq, Eq, thiserror::Error)]
pub enum BodyError {
    /// More than the limit.
    #[error("the upload exceeds {0} bytes")]
    TooLarge(usize),
    /// The budget refused its next bytes.
    #[error(transparent)]
    Refused(#[from] Refused),
    /// It stopped arriving, or arrived too slowly.
    #[error("the upload stopped arriving (or arrived slower than the gateway's minimum rate)")]
    Stalled,
    /// The connection failed.
    #[error("the upload's connection failed")]
    Failed,
}

/// The whole of `body`, at most `limit` bytes, each reserved in `hold` as
/// it arrives, while it keeps to `pace`.
pub async fn collect(body: Body, limit: usize, hold: &mut Hold, pace: Pace) -> Result<Bytes, BodyError> {
    let start = Instant::now();
    let mut stream = body.into_data_stream();
    let mut chunks: Vec<Bytes> = Vec::new();
    let mut received = 0usize;
    loop {
        let deadline = pace.deadline(start, Instant::now(), received as u64);
        let Some(chunk) = tokio::time::timeout_at(deadline, stream.next()).await.map_err(|_| BodyError::Stalled)? else { break };
        let chunk = chunk.map_err(|_| BodyError::Failed)?;
        received = received.saturating_add(chunk.len());
        if received > limit {
            return Err(BodyError::TooLarge(limit));
        }
        hold.grow(chunk.len() as u64 * HELD_PER_BYTE)?;
        chunks.push(chunk);
    }
    Ok(join(chunks, received))
}

/// One contiguous buffer (the parser reads a slice); one chunk is kept as it is.
fn join(mut chunks: Vec<Bytes>, len: usize) -> Bytes {
    if chunks.len() == 1 {
        return chunks.pop().unwrap_or_default();
    }
    let mut out = bytes::BytesMut::with_capacity(len);
    for c in chunks {
        out.extend_from_slice(&c);
    }
    out.freeze()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::uploads::UploadBudget;

    const PACE: Pace = Pace { idle: Duration::from_secs(10), min_rate: 1000 };

    #[test]
    fn the_deadline_is_the_idle_bound_or_the_rate_whichever_comes_first() {
        let t0 = Instant::now();
        let s = Duration::from_secs;
        assert_eq!(PACE.deadline(t0, t0, 0), t0 + s(10), "a silent start: the idle bound");
        assert_eq!(PACE.deadline(t0, t0 + s(5), 1_000_000), t0 + s(15), "fast: idle from now");
        assert_eq!(PACE.deadline(t0, t0 + s(30), 5_000), t0 + s(15), "too slow: the rate cuts, already passed");
        assert_eq!(PACE.deadline(t0, t0 + s(30), 30_000), t0 + s(40), "at the rate: it goes on");
    }

    fn chunks(parts: Vec<&'static [u8]>) -> Body {
        Body::from_stream(futures_util::stream::iter(parts.into_iter().map(|p| Ok::<_, std::io::Error>(Bytes::from_static(p)))))
    }

    #[tokio::test]
    async fn a_body_is_read_whole_and_reserved_as_it_arrives() {
        let budget = UploadBudget::new(1 << 20);
        let mut hold = budget.hold("k");
        let got = collect(chunks(vec![b"ab", b"cd"]), 10, &mut hold, PACE).await.unwrap();
        assert_eq!(&got[..], b"abcd");
        assert_eq!(budget.held_bytes(), 4 * HELD_PER_BYTE);
        drop(hold);
        assert_eq!(budget.held_bytes(), 0);
        let mut hold = budget.hold("k");
        assert_eq!(collect(chunks(vec![b"abcdef", b"ghijk"]), 10, &mut hold, PACE).await, Err(BodyError::TooLarge(10)));
    }

    #[tokio::test]
    async fn bytes_past_the_budget_are_refused() {
        let budget = UploadBudget::new(32);
        let mut other = budget.hold("other");
        other.grow(10).unwrap();
        let mut hold = budget.hold("k");
        let e = collect(chunks(vec![b"0123456789", b"0123456789"]), 100, &mut hold, PACE).await.unwrap_err();
        assert_eq!(e, BodyError::Refused(Refused::KeyShare(0)));
    }

    /// The attack: an upload that sends a little, then nothing. It is cut at
    /// the idle bound, and its reservation is returned.
    #[tokio::test(start_paused = true)]
    async fn a_stalled_upload_is_cut_and_its_memory_returned() {
        let budget = UploadBudget::new(1 << 20);
        let (tx, rx) = tokio::sync::mpsc::channel::<Result<Bytes, std::io::Error>>(1);
        tx.send(Ok(Bytes::from_static(b"first bytes"))).await.unwrap();
        let body = Body::from_stream(tokio_stream::wrappers::ReceiverStream::new(rx));
        let mut hold = budget.hold("k");
        let read = collect(body, 1 << 20, &mut hold, PACE);
        assert_eq!(read.await, Err(BodyError::Stalled));
        drop(hold);
        assert_eq!(budget.held_bytes(), 0);
        drop(tx);
    }
}
