//! What a live process printed, kept for whoever reads it: the client that
//! started it and any that connect later. The last [`REPLAY_BYTES`] are
//! kept (older chunks are dropped, and a reader that fell behind skips
//! them); the process never waits for a reader. Pure apart from the wakeup;
//! unit-tested.

use std::collections::VecDeque;
use std::sync::Mutex;

use bytes::Bytes;
use tokio::sync::watch;

use crate::sandbox::Ended;

/// Output kept per process for readers that connect late or fall behind.
pub const REPLAY_BYTES: usize = 1 << 20;

/// One piece of output.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Chunk {
    /// From stdout.
    Stdout(Bytes),
    /// From stderr.
    Stderr(Bytes),
    /// From a terminal (both streams at once).
    Pty(Bytes),
}

impl Chunk {
    fn len(&self) -> usize {
        match self {
            Chunk::Stdout(b) | Chunk::Stderr(b) | Chunk::Pty(b) => b.len(),
        }
    }
}

/// What a reader gets next.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Item {
    /// Output.
    Data(Chunk),
    /// The process ended and everything it printed was read.
    End(Ended),
}

#[derive(Default)]
struct State {
    chunks: VecDeque<Chunk>,
    /// Sequence number of `chunks[0]`.
    first: u64,
    bytes: usize,
    end: Option<Ended>,
    /// Output streams not at their end yet.
    open: u8,
}

/// One process's output.
pub struct Output {
    state: Mutex<State>,
    tick: watch::Sender<u64>,
}

impl Output {
    /// Output of a process with `streams` streams (2 pipes, or 1 terminal).
    pub fn new(streams: u8) -> Output {
        Output { state: Mutex::new(State { open: streams, ..State::default() }), tick: watch::Sender::new(0) }
    }

    fn change(&self, f: impl FnOnce(&mut State)) {
        f(&mut self.state.lock().unwrap_or_else(|p| p.into_inner()));
        self.tick.send_modify(|t| *t = t.wrapping_add(1));
    }

    /// Keeps `c`, dropping the oldest chunks past [`REPLAY_BYTES`].
    pub fn push(&self, c: Chunk) {
        if c.len() == 0 {
            return;
        }
        self.change(|s| {
            s.bytes += c.len();
            s.chunks.push_back(c);
            while s.bytes > REPLAY_BYTES && s.chunks.len() > 1 {
                let old = s.chunks.pop_front().map_or(0, |c| c.len());
                s.bytes -= old;
                s.first += 1;
            }
        });
    }

    /// One stream reached its end.
    pub fn close_stream(&self) {
        self.change(|s| s.open = s.open.saturating_sub(1));
    }

    /// The process ended.
    pub fn exit(&self, e: Ended) {
        self.change(|s| s.end = Some(e));
    }

    /// How it ended, once it did.
    pub fn ended(&self) -> Option<Ended> {
        self.state.lock().unwrap_or_else(|p| p.into_inner()).end
    }

    /// A receiver that changes when the process exits (or anything else does).
    pub fn watch(&self) -> watch::Receiver<u64> {
        self.tick.subscribe()
    }

    /// The item after `cursor` (a sequence number; start at 0 to replay
    /// what is kept), waiting for one. A cursor older than what is kept
    /// moves to the oldest chunk kept.
    pub async fn next(&self, cursor: &mut u64) -> Item {
        let mut tick = self.tick.subscribe();
        loop {
            if let Some(item) = self.take(cursor) {
                return item;
            }
            if tick.changed().await.is_err() {
                // Never: `self` holds the sender.
                std::future::pending::<()>().await;
            }
        }
    }

    fn take(&self, cursor: &mut u64) -> Option<Item> {
        let s = self.state.lock().unwrap_or_else(|p| p.into_inner());
        *cursor = (*cursor).max(s.first);
        let i = usize::try_from(*cursor - s.first).unwrap_or(usize::MAX);
        if let Some(c) = s.chunks.get(i) {
            *cursor += 1;
            return Some(Item::Data(c.clone()));
        }
        match (s.end, s.open) {
            (Some(e), 0) => Some(Item::End(e)),
            _ => None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn out(s: &str) -> Chunk {
        Chunk::Stdout(Bytes::copy_from_slice(s.as_bytes()))
    }

    #[tokio::test]
    async fn readers_get_everything_then_the_end() {
        let o = Output::new(2);
        o.push(out("a"));
        o.push(Chunk::Stderr(Bytes::from_static(b"b")));
        let mut c = 0;
        assert_eq!(o.next(&mut c).await, Item::Data(out("a")));
        assert_eq!(o.next(&mut c).await, Item::Data(Chunk::Stderr(Bytes::from_static(b"b"))));
        let end = Ended { code: 3, signal: 0 };
        o.exit(end);
        o.close_stream();
        assert!(o.take(&mut c).is_none(), "one stream is still open");
        o.close_stream();
        assert_eq!(o.next(&mut c).await, Item::End(end));
        let mut late = 0;
        assert_eq!(o.next(&mut late).await, Item::Data(out("a")), "a late reader gets the replay");
    }

    #[tokio::test]
    async fn a_waiting_reader_wakes_on_output() {
        let o = std::sync::Arc::new(Output::new(1));
        let reader = {
            let o = o.clone();
            tokio::spawn(async move { o.next(&mut 0).await })
        };
        tokio::task::yield_now().await;
        o.push(out("x"));
        assert_eq!(reader.await.unwrap(), Item::Data(out("x")));
    }

    #[test]
    fn the_replay_is_bounded_and_a_late_reader_skips_what_was_dropped() {
        let o = Output::new(1);
        let big = "x".repeat(REPLAY_BYTES / 2 + 1);
        o.push(out("first"));
        o.push(out(&big));
        o.push(out(&big));
        let s = o.state.lock().unwrap();
        assert!(s.bytes <= REPLAY_BYTES && s.first == 2, "kept {} from {}", s.bytes, s.first);
        drop(s);
        let mut c = 0;
        assert_eq!(o.take(&mut c), Some(Item::Data(out(&big))));
        assert_eq!(c, 3);
    }
}
