//! Requests waiting for a node slot, served in the order they came.
//!
//! Every slot is taken under this queue's lock: a request finding nobody
//! waiting takes a free slot at once; otherwise it queues, and a slot that
//! frees (a lease dropped, a node healthy again or larger) goes to the
//! oldest waiter that may use that node — one for a thread waits for its
//! thread's node only, so it never holds up those that can run elsewhere.
//! A waiter that gives up, or whose request is cancelled, leaves the queue;
//! a slot handed to it in that instant goes to the next.

use std::collections::VecDeque;
use std::sync::Arc;

use tokio::sync::oneshot;

use super::{Node, Nodes};

/// Where a waiting request may run.
#[derive(Debug, Clone)]
pub(super) enum Want {
    /// On its thread's node (rendezvous, re-read at each chance).
    Home(String),
    /// Anywhere; where the image is warm when one such node has room.
    Any(Option<String>),
}

/// One waiting request; granted by sending it a node whose slot it holds.
#[derive(Debug)]
struct Waiter {
    id: u64,
    want: Want,
    grant: oneshot::Sender<Arc<Node>>,
}

/// The waiting requests, oldest first.
#[derive(Debug, Default)]
pub(super) struct Queue {
    list: VecDeque<Waiter>,
    next_id: u64,
}

impl Queue {
    /// Nobody waits.
    pub(super) fn is_empty(&self) -> bool {
        self.list.is_empty()
    }

    /// Requests waiting.
    pub(super) fn len(&self) -> usize {
        self.list.len()
    }

    /// Queues a request; its ticket's id and the receiver of its grant.
    pub(super) fn push(&mut self, want: Want) -> (u64, oneshot::Receiver<Arc<Node>>) {
        let (grant, rx) = oneshot::channel();
        self.next_id += 1;
        self.list.push_back(Waiter { id: self.next_id, want, grant });
        (self.next_id, rx)
    }

    /// Ends every wait: no node is healthy (the waiters answer 503).
    pub(super) fn fail_all(&mut self) {
        self.list.clear();
    }

    fn remove(&mut self, id: u64) {
        if let Some(at) = self.list.iter().position(|w| w.id == id) {
            self.list.remove(at);
        }
    }
}

impl Nodes {
    /// Hands free slots to waiters, oldest first; each takes a slot on a
    /// node its request may use.
    pub(super) fn dispatch(&self) {
        let mut q = self.queue();
        let mut i = 0;
        while i < q.list.len() && self.any_free() {
            if q.list[i].grant.is_closed() {
                q.list.remove(i);
                continue;
            }
            let Some(node) = self.take_for(&q.list[i].want) else {
                i += 1;
                continue;
            };
            let w = q.list.remove(i).expect("index checked above");
            if let Err(node) = w.grant.send(node) {
                // It left meanwhile: the slot is free for the next one.
                node.give_back();
            }
        }
    }

    /// A free slot's node for `want`, taken (the caller holds the queue's lock).
    pub(super) fn take_for(&self, want: &Want) -> Option<Arc<Node>> {
        match want {
            Want::Home(t) => self.home_of(t).filter(|n| n.try_take()),
            Want::Any(Some(image)) => self.take_where(|n| n.has_warm(image)).or_else(|| self.take_where(|_| true)),
            Want::Any(None) => self.take_where(|_| true),
        }
    }
}

/// A place in the queue; leaving it (given up, or the request cancelled)
/// removes it, and a slot granted meanwhile is passed on.
pub(super) struct Ticket {
    pub(super) nodes: Arc<Nodes>,
    pub(super) id: u64,
    /// `None` once granted or left.
    pub(super) rx: Option<oneshot::Receiver<Arc<Node>>>,
}

impl Ticket {
    /// Leaves the queue; the node of a slot granted in the meantime.
    pub(super) fn leave(&mut self) -> Option<Arc<Node>> {
        let mut rx = self.rx.take()?;
        self.nodes.queue().remove(self.id);
        rx.close();
        rx.try_recv().ok()
    }
}

impl Drop for Ticket {
    fn drop(&mut self) {
        if let Some(node) = self.leave() {
            node.give_back();
            self.nodes.dispatch();
        }
    }
}
