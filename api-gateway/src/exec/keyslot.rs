//! Per-key concurrency that holds across gateway replicas.
//!
//! Every replica asks the same node-agent to count a key: the healthy agent
//! that rendezvous hashing of node names picks for the key, as for a
//! thread's home. The slot is an open call on that agent; dropping it (when
//! the execution's agent has finished, see [`super::Run`]) returns the slot,
//! and so does a gateway that dies, when its connection ends.
//!
//! When the counting agent leaves, its counts are gone and the next agent
//! starts from zero: until the executions admitted before have ended, a key
//! may run up to twice its limit. Agents are a DaemonSet, so this is rare and
//! bounded; the alternative (a store every execution writes to) would put
//! an apiserver round trip on every call.

use tonic::Code;
use warren_proto::agent::RefusalReason as Reason;
use warren_proto::refusal::refusal_of;

use super::agent::HeldSlot;
use super::ExecError;
use crate::nodes::Nodes;

/// A held slot; returned on drop.
pub struct KeySlot {
    _held: HeldSlot,
}

impl std::fmt::Debug for KeySlot {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("KeySlot")
    }
}

/// The rendezvous name a key is counted under (never a thread's: those
/// start with a namespace, which has no `:`).
fn counted_as(key: &str) -> String {
    format!("key:{key}")
}

/// Takes a slot of `key` (`namespace/name`) under `limit` on its counting
/// agent: 429 at the limit, 503 when no agent can count. A counting agent
/// that cannot be reached is marked down and the next one is asked.
pub async fn hold(nodes: &Nodes, key: &str, limit: u32) -> Result<KeySlot, ExecError> {
    let name = counted_as(key);
    // Each failed attempt marks a node down, so each retry asks another.
    for _ in 0..3 {
        let node = nodes.home_of(&name).ok_or(ExecError::NoNode)?;
        match node.agent().hold_key_slot(key, limit).await {
            Ok(held) => return Ok(KeySlot { _held: held }),
            Err(status) => match refused(&status, limit) {
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

/// A refusal that decides the request; `None` when the agent failed and
/// another may answer.
fn refused(status: &tonic::Status, limit: u32) -> Option<ExecError> {
    match (status.code(), refusal_of(status).0) {
        (Code::ResourceExhausted, Reason::KeyConcurrency) => Some(ExecError::KeyConcurrency(limit)),
        (Code::ResourceExhausted, Reason::NodeBusy) => Some(ExecError::NodeRefused("the key's counting agent holds its maximum of slots")),
        (Code::InvalidArgument, _) => Some(ExecError::invalid("key", status.message())),
        // Mid-upgrade, an agent older than the gateway: retryable, and the
        // node is not down.
        (Code::Unimplemented, _) => Some(ExecError::NodeRefused("the key's counting agent is older than this gateway")),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use warren_proto::refusal::refuse;

    #[test]
    fn only_transport_failures_ask_the_next_agent() {
        let at_limit = refuse(Code::ResourceExhausted, Reason::KeyConcurrency, "", "at limit");
        assert_eq!(refused(&at_limit, 4), Some(ExecError::KeyConcurrency(4)));
        assert!(matches!(refused(&refuse(Code::ResourceExhausted, Reason::NodeBusy, "", "full"), 4), Some(ExecError::NodeRefused(_))));
        assert!(matches!(refused(&refuse(Code::InvalidArgument, Reason::InvalidField, "key", "bad"), 4), Some(ExecError::Invalid { .. })));
        assert_eq!(refused(&tonic::Status::unavailable("connection refused"), 4), None);
        assert!(matches!(refused(&tonic::Status::unimplemented("an older agent"), 4), Some(ExecError::NodeRefused(_))), "an older agent is not marked down");
    }
}
