//! Output on its way from a sandbox to its caller.
//!
//! The sandbox's deadline must never wait for the caller: a client that
//! stops reading (a stalled NDJSON stream, a stuck gateway) may slow the
//! delivery down, but not the kill. So the drive loop never awaits a send:
//! events go into a small queue bounded in bytes, a separate branch moves
//! them to the caller as it takes them, and reading the sandbox's pipes
//! pauses while the queue is full (the program then blocks on its own pipe,
//! its timer still running). A caller that takes nothing for
//! `stall` gets its execution killed.

use std::collections::VecDeque;
use std::time::Duration;

use tokio::sync::mpsc;
use tokio::time::Instant;

/// Output and progress of a running execution.
#[derive(Debug)]
pub enum Event {
    /// The program was handed to the sandbox.
    Started {
        /// Request-to-handoff time.
        setup: Duration,
    },
    /// A chunk of stdout.
    Stdout(Vec<u8>),
    /// A chunk of stderr.
    Stderr(Vec<u8>),
}

/// Most output bytes queued for one execution before its pipes stop being read.
pub const QUEUE_BYTES: usize = 256 * 1024;

/// Events not yet taken by the caller.
#[derive(Debug)]
pub struct Queue {
    pending: VecDeque<Event>,
    bytes: usize,
    /// When the caller last took something while we were waiting on it.
    waiting_since: Option<Instant>,
    stall: Duration,
}

fn size(ev: &Event) -> usize {
    match ev {
        Event::Stdout(d) | Event::Stderr(d) => d.len(),
        Event::Started { .. } => 0,
    }
}

impl Queue {
    /// An empty queue whose caller may take nothing for at most `stall`.
    pub fn new(stall: Duration) -> Queue {
        Queue { pending: VecDeque::new(), bytes: 0, waiting_since: None, stall }
    }

    /// Hands `ev` to the caller now if it has room, else queues it.
    pub fn push(&mut self, tx: &mpsc::Sender<Event>, ev: Event) {
        if !self.pending.is_empty() {
            return self.queue(ev);
        }
        match tx.try_send(ev) {
            // Gone: the caller's own branch notices; nothing to deliver to.
            Ok(()) | Err(mpsc::error::TrySendError::Closed(_)) => {}
            Err(mpsc::error::TrySendError::Full(ev)) => {
                self.waiting_since = Some(Instant::now());
                self.queue(ev);
            }
        }
    }

    /// Like [`Queue::push`], but drops output that does not fit (setting
    /// `truncated`): after the kill the pipes are drained regardless.
    pub fn push_or_drop(&mut self, tx: &mpsc::Sender<Event>, ev: Event, truncated: &mut bool) {
        if self.has_room() {
            self.push(tx, ev);
        } else {
            *truncated = true;
        }
    }

    /// Forgets everything queued (the caller is gone).
    pub fn clear(&mut self) {
        self.pending.clear();
        self.bytes = 0;
        self.waiting_since = None;
    }

    fn queue(&mut self, ev: Event) {
        self.bytes += size(&ev);
        self.pending.push_back(ev);
    }

    /// True while more output may be read from the sandbox.
    pub fn has_room(&self) -> bool {
        self.bytes < QUEUE_BYTES
    }

    /// True when events wait for the caller.
    pub fn is_waiting(&self) -> bool {
        !self.pending.is_empty()
    }

    /// Sends the oldest queued event through a slot the caller made.
    pub fn send_one(&mut self, permit: mpsc::Permit<'_, Event>) {
        if let Some(ev) = self.pending.pop_front() {
            self.bytes -= size(&ev);
            permit.send(ev);
        }
        self.waiting_since = self.is_waiting().then(Instant::now);
    }

    /// When the caller will have taken nothing for too long (far away when
    /// nothing waits).
    pub fn stall_deadline(&self) -> Instant {
        match self.waiting_since {
            Some(t) if self.is_waiting() => t + self.stall,
            _ => Instant::now() + Duration::from_secs(86_400 * 365),
        }
    }

    /// After the sandbox is gone: delivers what is queued, giving up (and
    /// returning false) when the caller takes nothing for `stall` or left.
    pub async fn flush(&mut self, tx: &mpsc::Sender<Event>) -> bool {
        while let Some(ev) = self.pending.pop_front() {
            self.bytes -= size(&ev);
            if !matches!(tokio::time::timeout(self.stall, tx.send(ev)).await, Ok(Ok(()))) {
                self.clear();
                return false;
            }
        }
        true
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test(start_paused = true)]
    async fn a_full_caller_queues_bounded_and_reports_a_stall() {
        let (tx, mut rx) = mpsc::channel(1);
        let mut q = Queue::new(Duration::from_secs(5));
        q.push(&tx, Event::Stdout(vec![0; 10]));
        assert!(!q.is_waiting(), "the caller had room");
        q.push(&tx, Event::Stdout(vec![0; QUEUE_BYTES]));
        assert!(q.is_waiting() && !q.has_room(), "queued, and reading must pause");
        let stall = q.stall_deadline();
        assert_eq!(stall - Instant::now(), Duration::from_secs(5));
        assert!(rx.recv().await.is_some());
        let permit = tx.reserve().await.unwrap();
        q.send_one(permit);
        assert!(!q.is_waiting() && q.has_room());
        assert!(q.stall_deadline() > Instant::now() + Duration::from_secs(86_400), "nothing waits: no stall");
    }

    #[tokio::test(start_paused = true)]
    async fn flush_gives_up_on_a_caller_that_takes_nothing() {
        let (tx, _rx) = mpsc::channel(1);
        let mut q = Queue::new(Duration::from_secs(5));
        q.push(&tx, Event::Stdout(vec![1]));
        q.push(&tx, Event::Stdout(vec![2]));
        let t = Instant::now();
        assert!(!q.flush(&tx).await, "a stalled caller is given up on");
        assert_eq!(t.elapsed(), Duration::from_secs(5));
        assert!(!q.is_waiting());
        let (tx, mut rx) = mpsc::channel(4);
        let mut q = Queue::new(Duration::from_secs(5));
        let reader = tokio::spawn(async move { while rx.recv().await.is_some() {} });
        for _ in 0..10 {
            q.queue(Event::Stderr(vec![0; 100]));
        }
        assert!(q.flush(&tx).await, "a reading caller gets everything");
        drop(tx);
        reader.await.unwrap();
    }
}
