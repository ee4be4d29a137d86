//! The gateway's reading of the agent's stream: wire events → domain
//! events (the request itself is `warren_proto::spec`'s, the refusals
//! `exec::refusal`'s).

use warren_proto::agent::{self as pb, execute_event::Event as Wire};

use super::spec::Tenant;
use warren_core::exit::Exit;

/// The agent's reference to thread `id` of `tenant`.
pub fn thread_ref(tenant: &Tenant, id: &str) -> pb::ThreadRef {
    pb::ThreadRef { namespace: tenant.namespace.clone(), key_name: tenant.key_name.clone(), thread_id: id.to_string() }
}

/// The agent's options for thread `id` of `key`: the key's Sandbox settings.
pub fn thread_options(tenant: &Tenant, key: &warren_config::EffectiveKey, id: &str) -> pb::ThreadOptions {
    pb::ThreadOptions {
        r#ref: Some(thread_ref(tenant, id)),
        retention_seconds: key.thread_retention.duration().map_or(0, |d| d.as_secs()),
        max_bytes: key.thread_max_bytes,
        max_threads: key.max_threads,
        history_versions: key.thread_history,
    }
}

/// One thing that happened to a running execution.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum RunEvent {
    /// The sandbox is ready and the program starts.
    Started,
    /// Output on stdout.
    Stdout(Vec<u8>),
    /// Output on stderr.
    Stderr(Vec<u8>),
    /// The end.
    Exited(Exit),
}

/// A wire event as a domain event; `None` for an empty message.
pub fn run_event(e: pb::ExecuteEvent) -> Option<RunEvent> {
    Some(match e.event? {
        Wire::Started(_) => RunEvent::Started,
        Wire::Stdout(c) => RunEvent::Stdout(c.data),
        Wire::Stderr(c) => RunEvent::Stderr(c.data),
        Wire::Exited(x) => RunEvent::Exited(x.into()),
    })
}
