//! Per-key concurrency that holds across gateway replicas.
//!
//! Every replica asks the same node-agent to count a key: the healthy agent
//! that rendezvous hashing of node names picks for the key, as for a
//! thread's home. When the execution runs on that agent anyway, the slot
//! travels in the `Execute` call and is held there until the execution has
//! ended (no extra round trip: always the case on a single machine).
//! Otherwise the slot is an open `HoldKeySlot` call on the counting agent;
//! dropping it (when the execution's agent has finished, see
//! [`super::Run`]) returns the slot, and so does a gateway that dies, when
//! its connection ends.
//!
//! A key at its limit waits at the counting agent, in order per key (over
//! every replica), until the request's deadline: the wait travels in the
//! request (`wait_ms`). An older agent ignores it and refuses at once,
//! which stays a 429.
//!
//! When the counting agent leaves, its counts are gone and the next agent
//! starts from zero: until the executions admitted before have ended, a key
//! may run up to twice its limit. Agents are a DaemonSet, so this is rare and
//! bounded; the alternative (a store every execution writes to) would put
//! an apiserver round trip on every call.

use std::sync::Arc;

use warren_proto::agent as pb;

use super::agent::HeldSlot;
use super::ExecError;
use crate::nodes::{Node, Nodes};

/// How long the counting agent may take to answer beyond the time the
/// request may wait for a slot: a map update, so an agent this slow is
/// treated as down.
const HOLD_WAIT: std::time::Duration = std::time::Duration::from_secs(5);

/// What of `deadline` is left, as the agent's `wait_ms`.
pub fn wait_ms(deadline: tokio::time::Instant) -> u32 {
    u32::try_from(deadline.saturating_duration_since(tokio::time::Instant::now()).as_millis()).unwrap_or(u32::MAX)
}

/// A key's slot for one execution.
pub enum KeySlot {
    /// Held by an open call on the counting agent; returned on drop.
    Held(HeldSlot),
    /// To be taken by the executing agent, which counts the key itself.
    WithExecution(pb::KeySlotRequest),
}

impl KeySlot {
    /// What the `Execute` call carries: the slot request when the executing
    /// agent takes it, waiting up to `deadline`.
    pub fn for_execute(&self, deadline: tokio::time::Instant) -> Option<pb::KeySlotRequest> {
        match self {
            KeySlot::Held(_) => None,
            KeySlot::WithExecution(r) => Some(pb::KeySlotRequest { wait_ms: wait_ms(deadline), ..r.clone() }),
        }
    }

    /// The key's limit (for a refusal the executing agent reports).
    pub fn limit(&self) -> u32 {
        match self {
            KeySlot::Held(_) => 0,
            KeySlot::WithExecution(r) => r.limit,
        }
    }
}

impl std::fmt::Debug for KeySlot {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            KeySlot::Held(_) => f.write_str("KeySlot::Held"),
            KeySlot::WithExecution(r) => write!(f, "KeySlot::WithExecution({})", r.key),
        }
    }
}

/// The rendezvous name a key is counted under (never a thread's: those
/// start with a namespace, which has no `:`).
pub fn counted_as(key: &str) -> String {
    format!("key:{key}")
}

/// Takes a slot of `key` (`namespace/name`) under `limit` for an execution
/// on `executing`: on its counting agent, waiting there until `deadline`
/// (429 then, 503 when no agent can count), or, when that is `executing`,
/// in the `Execute` call. A counting agent that cannot be reached is marked
/// down and the next one is asked.
pub async fn take(nodes: &Nodes, key: &str, limit: u32, executing: &Arc<Node>, deadline: tokio::time::Instant) -> Result<KeySlot, ExecError> {
    let name = counted_as(key);
    // Each failed attempt marks a node down, so each retry asks another.
    for _ in 0..3 {
        let node = nodes.home_of(&name).ok_or(ExecError::NoNode)?;
        if Arc::ptr_eq(&node, executing) {
            return Ok(KeySlot::WithExecution(pb::KeySlotRequest { key: key.to_string(), limit, wait_ms: 0 }));
        }
        let answer = tokio::time::timeout_at(deadline + HOLD_WAIT, node.agent().hold_key_slot(key, limit, wait_ms(deadline))).await;
        match answer.unwrap_or_else(|_| Err(tonic::Status::deadline_exceeded("no answer from the key's counting agent"))) {
            Ok(held) => return Ok(KeySlot::Held(held)),
            Err(status) => match super::refusal::AgentRefusal::read(&status).of_key_slot(limit) {
                Some(e) => return Err(e),
                None => {
                    tracing::warn!(node = %node.address, code = ?status.code(), "the key's counting agent failed; asking the next one");
                    node.mark_unhealthy();
                }
            },
        }
    }
    Err(ExecError::NodeRefused("no node-agent could count the key's executions"))
}
