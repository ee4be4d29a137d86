//! The recorder: writes leave the request path through a bounded channel to
//! one task that commits them in batches, so an execution never waits for
//! the database (an async submit waits for its own insert, which its 202
//! promises).

use std::time::Duration;

use tokio::sync::{mpsc, oneshot};

use super::model::{Finished, NewRecord};
use super::batch::Write;
use super::store::Store;

/// Queued writes before senders wait (each is small; output is capped).
const QUEUE: usize = 8192;
/// Most writes committed in one transaction.
const BATCH: usize = 512;
/// Under load, commits begin at most this often, so that the writes of many
/// calls share one: a commit's fixed cost (its transaction's round trips,
/// its WAL frame) was paid per call's insert and per call's end at
/// saturation, most of what records cost the gateway. A write arriving
/// when no commit began within it is committed at once.
const GATHER: std::time::Duration = std::time::Duration::from_millis(10);
/// Bytes of writes waiting beyond a full queue (a slow or stalled
/// database); past it writes are dropped and counted, never held without
/// bound. An async submit whose insert is dropped is refused (503).
const SPILL_MAX_BYTES: usize = 64 << 20;

enum Op {
    Write(Write, Option<oneshot::Sender<bool>>),
    Flush(oneshot::Sender<()>),
}

/// Handle to the recording task; cheap to clone.
#[derive(Debug, Clone)]
pub struct Recorder {
    tx: mpsc::Sender<Op>,
    /// Bytes of writes waiting for room in the queue.
    spilled: std::sync::Arc<std::sync::atomic::AtomicUsize>,
    /// Writes dropped because the spill was full.
    pub dropped: std::sync::Arc<std::sync::atomic::AtomicU64>,
    store: Store,
    /// This gateway instance's id (`gw_…`): the owner of what it runs.
    pub owner: std::sync::Arc<str>,
    /// Most bytes of stdout (and of stderr) a record keeps.
    pub output_max: usize,
}

impl std::fmt::Debug for Op {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Op::Write(..) => "Write",
            Op::Flush(_) => "Flush",
        })
    }
}

impl Recorder {
    /// Starts the recording task for `store`, as gateway `owner`.
    pub fn start(store: Store, owner: &str, output_max: usize) -> Recorder {
        let (tx, rx) = mpsc::channel(QUEUE);
        tokio::spawn(run(store.clone(), rx));
        Recorder { tx, spilled: Default::default(), dropped: Default::default(), store, owner: owner.into(), output_max }
    }

    /// The database, for reads.
    pub fn store(&self) -> &Store {
        &self.store
    }

    /// Queues a new record; the receiver says whether it was committed.
    pub fn insert(&self, r: NewRecord) -> oneshot::Receiver<bool> {
        let (ack, done) = oneshot::channel();
        self.send(Op::Write(Write::Insert(Box::new(r)), Some(ack)));
        done
    }

    /// Queues the end of a record.
    pub fn finish(&self, trace_id: &str, f: Finished) {
        self.send(Op::Write(Write::Finish(trace_id.to_string(), Box::new(f)), None));
    }

    /// Queues one stream line (`seq` increasing per record).
    pub fn line(&self, trace_id: &str, seq: u64, line: String) {
        self.send(Op::Write(Write::Line(trace_id.to_string(), seq, line), None));
    }

    /// Queues a webhook delivery's state.
    pub fn webhook(&self, trace_id: &str, status: &'static str, attempts: u32) {
        self.send(Op::Write(Write::Webhook(trace_id.to_string(), status, attempts), None));
    }

    /// Queues an entry of the activity log (what a user or key did to an object).
    pub fn action(&self, a: super::model::Action) {
        self.send(Op::Write(Write::Action(Box::new(a)), None));
    }

    /// Resolves once everything queued before it is committed (or failed).
    pub async fn flush(&self) {
        let (ack, done) = oneshot::channel();
        if self.tx.send(Op::Flush(ack)).await.is_ok() {
            let _ = done.await;
        }
    }

    /// Never blocks the caller: a full queue hands the write to a task that
    /// waits, as long as what waits stays under [`SPILL_MAX_BYTES`].
    fn send(&self, op: Op) {
        use std::sync::atomic::Ordering;
        let Err(mpsc::error::TrySendError::Full(op)) = self.tx.try_send(op) else { return };
        let size = match &op {
            Op::Write(w, _) => w.bytes(),
            Op::Flush(_) => 0,
        };
        if self.spilled.fetch_add(size, Ordering::Relaxed) + size > SPILL_MAX_BYTES {
            self.spilled.fetch_sub(size, Ordering::Relaxed);
            if self.dropped.fetch_add(1, Ordering::Relaxed) % 1000 == 0 {
                tracing::error!(dropped = self.dropped.load(Ordering::Relaxed), "the record database is not keeping up; execution records are being dropped");
            }
            // Dropping `op` drops its ack: an async submit hears "not recorded".
            return;
        }
        let (tx, spilled) = (self.tx.clone(), self.spilled.clone());
        tokio::spawn(async move {
            let _ = tx.send(op).await;
            spilled.fetch_sub(size, Ordering::Relaxed);
        });
    }
}

async fn run(store: Store, mut rx: mpsc::Receiver<Op>) {
    let mut batch = Vec::with_capacity(BATCH);
    let mut last: Option<tokio::time::Instant> = None;
    while rx.recv_many(&mut batch, BATCH).await > 0 {
        if let Some(until) = last.map(|t| t + GATHER).filter(|u| *u > tokio::time::Instant::now()) {
            tokio::time::sleep_until(until).await;
            while batch.len() < BATCH {
                match rx.try_recv() {
                    Ok(op) => batch.push(op),
                    Err(_) => break,
                }
            }
        }
        last = Some(tokio::time::Instant::now());
        let mut writes = Vec::with_capacity(batch.len());
        let mut acks = Vec::with_capacity(batch.len());
        let mut flushes = Vec::new();
        for op in batch.drain(..) {
            match op {
                Op::Write(w, ack) => {
                    writes.push(w);
                    acks.push(ack);
                }
                Op::Flush(f) => flushes.push(f),
            }
        }
        let done = commit(&store, &writes).await;
        for (ack, ok) in acks.into_iter().zip(done) {
            if let Some(a) = ack {
                let _ = a.send(ok);
            }
        }
        for f in flushes {
            let _ = f.send(());
        }
    }
}

/// Commits `writes` together; when the batch fails, each alone (one bad
/// write must not lose the others), retrying a failing database once.
/// Whether each was committed.
async fn commit(store: &Store, writes: &[Write]) -> Vec<bool> {
    if writes.is_empty() || store.apply(writes).await.is_ok() {
        return vec![true; writes.len()];
    }
    let mut done = Vec::with_capacity(writes.len());
    for w in writes {
        let one = std::slice::from_ref(w);
        let mut ok = store.apply(one).await.is_ok();
        if !ok {
            tokio::time::sleep(Duration::from_millis(200)).await;
            match store.apply(one).await {
                Ok(()) => ok = true,
                Err(e) => tracing::error!(error = %e, "an execution record could not be written"),
            }
        }
        done.push(ok);
    }
    done
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::Ordering;

    use super::*;

    /// A database that stops taking writes (its one connection held by a
    /// transaction that never ends) while lines keep coming: what waits is
    /// bounded, the rest is dropped and counted.
    #[tokio::test]
    async fn a_stalled_database_never_holds_more_than_the_spill_bound() {
        let t = tempfile::tempdir().unwrap();
        let store = Store::open(&format!("sqlite://{}", t.path().join("r.db").display())).await.unwrap();
        let rec = Recorder::start(store, "gw_test", 1 << 20);
        // The writer task is parked: fill the queue and far beyond.
        let (tx, rx) = mpsc::channel::<Op>(1);
        let stalled = Recorder { tx, ..rec.clone() };
        let line = "x".repeat(1 << 20);
        for seq in 0..(2 * SPILL_MAX_BYTES / line.len() as usize + 10) {
            stalled.line("trc_x", seq as u64, line.clone());
        }
        tokio::task::yield_now().await;
        assert!(stalled.spilled.load(Ordering::Relaxed) <= SPILL_MAX_BYTES, "waiting writes exceed the bound");
        assert!(stalled.dropped.load(Ordering::Relaxed) > 0, "the overflow is dropped and counted");
        drop(rx);
    }
}
