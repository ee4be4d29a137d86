//! Thread versions through the gateway: fork, restore and history, asked
//! of the node that holds the thread (the typed half; `crate::threads` is
//! the HTTP adapter, the E2B fork another caller).

use warren_config::EffectiveKey;
use warren_proto::agent as pb;

use super::convert;
use super::refusal::AgentRefusal;
use super::spec::{placement_key, Tenant};
use super::{ExecError, ExecutionService};
use crate::admission::ThreadLock;
use crate::nodes::agent::VersionAgent;
use crate::nodes::Node;

/// Most threads one fork makes (the agent's bound too).
pub const MAX_FORKS: u32 = 32;

/// Which threads a fork makes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Targets {
    /// These ids.
    Named(Vec<String>),
    /// This many, with ids Warren picks.
    Count(u32),
}

/// One version of a thread.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ThreadVersion {
    /// The execution (or restore) that produced it; empty when unknown.
    pub trace_id: String,
    /// `execution`, `files` or `restore`.
    pub kind: String,
    /// When, Unix seconds.
    pub at_unix: u64,
    /// Charged size of the home.
    pub bytes: u64,
    /// An execution's exit code.
    pub exit_code: Option<i32>,
    /// Layers that make it.
    pub layers: u32,
    /// The thread's current state.
    pub current: bool,
}

impl From<pb::ThreadVersion> for ThreadVersion {
    fn from(v: pb::ThreadVersion) -> ThreadVersion {
        ThreadVersion { trace_id: v.trace_id, kind: v.kind, at_unix: v.at_unix, bytes: v.bytes, exit_code: v.exit_code, layers: v.layers, current: v.current }
    }
}

/// A new thread id for a fork: `fork_` + 20 base62 characters.
pub fn new_thread_id() -> String {
    warren_core::ids::random_id("fork_", 20, &mut |b: &mut [u8]| rand::fill(b))
}

fn check_thread_id(field: &str, id: &str) -> Result<(), ExecError> {
    match warren_core::ids::is_thread_id(id) {
        true => Ok(()),
        false => Err(ExecError::invalid(field, warren_core::ids::THREAD_ID_RULE)),
    }
}

/// The ids `targets` names, checked: 1..=[`MAX_FORKS`], distinct, none the source.
pub fn target_ids(source: &str, targets: Targets) -> Result<Vec<String>, ExecError> {
    let ids = match targets {
        Targets::Count(n) if n == 0 || n > MAX_FORKS => return Err(ExecError::invalid("count", format!("from 1 to {MAX_FORKS}"))),
        Targets::Count(n) => (0..n).map(|_| new_thread_id()).collect(),
        Targets::Named(ids) => ids,
    };
    for id in &ids {
        check_thread_id("thread_id", id)?;
    }
    let distinct: std::collections::BTreeSet<&String> = ids.iter().collect();
    if ids.is_empty() || distinct.len() != ids.len() || distinct.contains(&source.to_string()) {
        return Err(ExecError::invalid("thread_id", "a new thread id, not the source's"));
    }
    Ok(ids)
}

impl ExecutionService {
    /// The node holding `thread_id` of `key`, and its version calls.
    fn version_home(&self, key: &EffectiveKey, thread_id: &str) -> Result<(std::sync::Arc<Node>, Tenant), ExecError> {
        check_thread_id("thread_id", thread_id)?;
        let tenant = Tenant::of(key);
        let home = self.nodes.home_of(&placement_key(&tenant, thread_id)).ok_or(ExecError::NoNode)?;
        if home.agent().versions().is_none() {
            return Err(ExecError::NodeRefused("the thread's node does not keep versions"));
        }
        Ok((home, tenant))
    }

    /// Forks `thread_id` of `key` (at the version `at` produced, or its
    /// current state) into new threads of the key; their ids.
    pub async fn fork_thread(&self, key: &EffectiveKey, thread_id: &str, targets: Targets, at: Option<&str>, trace_id: &str) -> Result<Vec<String>, ExecError> {
        let (home, tenant) = self.version_home(key, thread_id)?;
        let ids = target_ids(thread_id, targets)?;
        // Held for the call: an execute on a new id through this gateway
        // cannot create it meanwhile.
        let _locks: Vec<ThreadLock> = ids.iter().map(|t| self.admission.thread(&key.qualified_name(), t)).collect::<Result<_, _>>()?;
        let req = pb::ForkThreadRequest { source: Some(convert::thread_options(&tenant, key, thread_id)), targets: ids.clone(), at: at.unwrap_or_default().to_string() };
        let versions: &dyn VersionAgent = home.agent().versions().ok_or(ExecError::NodeRefused("the thread's node does not keep versions"))?;
        versions.fork(req, trace_id).await.map_err(|s| {
            tracing::info!(node = %home.address, code = ?s.code(), reason = s.message(), "a fork was refused");
            AgentRefusal::read(&s).of_version(thread_id, &ids[0])
        })?;
        tracing::info!(key = %key.qualified_name(), thread_id, forks = ids.len(), "thread forked");
        Ok(ids)
    }

    /// Sets `thread_id` of `key` back to the version `at` produced; the
    /// version the restore made. 409 while an execution runs on it.
    pub async fn restore_thread(&self, key: &EffectiveKey, thread_id: &str, at: &str, trace_id: &str) -> Result<ThreadVersion, ExecError> {
        let (home, tenant) = self.version_home(key, thread_id)?;
        let _lock = self.admission.thread(&key.qualified_name(), thread_id)?;
        let req = pb::RestoreThreadRequest { thread: Some(convert::thread_options(&tenant, key, thread_id)), at: at.to_string(), trace_id: trace_id.to_string() };
        let versions = home.agent().versions().ok_or(ExecError::NodeRefused("the thread's node does not keep versions"))?;
        let v = versions.restore(req, trace_id).await.map_err(|s| AgentRefusal::read(&s).of_version(thread_id, thread_id))?;
        tracing::info!(key = %key.qualified_name(), thread_id, at, "thread restored");
        Ok(v.into())
    }

    /// The versions `thread_id` of `key` keeps, newest first.
    pub async fn thread_history(&self, key: &EffectiveKey, thread_id: &str, trace_id: &str) -> Result<Vec<ThreadVersion>, ExecError> {
        let (home, tenant) = self.version_home(key, thread_id)?;
        let req = pb::ThreadHistoryRequest { thread: Some(convert::thread_ref(&tenant, thread_id)) };
        let versions = home.agent().versions().ok_or(ExecError::NodeRefused("the thread's node does not keep versions"))?;
        let list = versions.history(req, trace_id).await.map_err(|s| AgentRefusal::read(&s).of_version(thread_id, thread_id))?;
        Ok(list.into_iter().map(ThreadVersion::from).collect())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fork_targets_are_checked() {
        let ids = target_ids("src", Targets::Count(3)).unwrap();
        assert_eq!(ids.len(), 3);
        assert!(ids.iter().all(|i| i.starts_with("fork_") && warren_core::ids::is_thread_id(i)));
        assert_eq!(target_ids("src", Targets::Named(vec!["a".into()])).unwrap(), ["a"]);
        for bad in [Targets::Count(0), Targets::Count(MAX_FORKS + 1), Targets::Named(vec![]), Targets::Named(vec!["src".into()]), Targets::Named(vec!["a".into(), "a".into()]), Targets::Named(vec!["../x".into()])] {
            assert!(matches!(target_ids("src", bad.clone()), Err(ExecError::Invalid { .. })), "{bad:?}");
        }
    }
}
