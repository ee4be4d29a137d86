//! The gateway side of the agent contract: spec → wire request, wire
//! events → domain events, wire refusals → domain errors. One module, so the
//! contract is converted exactly once on this edge.

use warren_proto::agent::{self as pb, execute_event::Event as Wire};

use super::spec::{ExecutionSpec, Tenant};
use warren_core::exit::Exit;

impl From<ExecutionSpec> for pb::ExecuteRequest {
    fn from(s: ExecutionSpec) -> pb::ExecuteRequest {
        let l = s.limits;
        let network = match s.network {
            warren_core::Network::Blocked => pb::NetworkPolicy::Blocked,
            warren_core::Network::Unrestricted => pb::NetworkPolicy::Unrestricted,
        };
        pb::ExecuteRequest {
            thread: s.thread.map(|t| pb::ThreadOptions {
                r#ref: Some(thread_ref(&s.tenant, &t.id)),
                retention_seconds: t.retention.map_or(0, |d| d.as_secs()),
                max_bytes: t.max_bytes,
                max_threads: t.max_threads,
            }),
            execution_id: s.id,
            language: pb::Language::from(s.language) as i32,
            code: s.code,
            env: s.env.into_iter().collect(),
            timeout_ms: u32::try_from(s.timeout.as_millis()).unwrap_or(u32::MAX),
            limits: Some(pb::Limits {
                cpu_millis: l.cpu_millis,
                memory_bytes: l.memory_bytes,
                pids: l.pids,
                tmp_bytes: l.tmp_bytes,
                home_bytes: l.home_bytes,
                max_output_bytes: l.max_output_bytes,
                open_files: l.open_files,
                file_size_bytes: l.file_size_bytes,
            }),
            image: s.image.reference,
            image_digest: s.image.digest.unwrap_or_default(),
            network: network as i32,
            mounts: s.mounts.into_iter().map(storage_mount).collect(),
            egress: s.egress.into_iter().map(|r| pb::EgressRule { host: r.host, ports: r.ports.into_iter().map(u32::from).collect() }).collect(),
            connectors: s.connectors.into_iter().map(connector_grant).collect(),
            // Set by the service when the executing agent counts the key.
            key_slot: None,
            image_pull: s.image.pull.map(|c| pb::Credentials { values: c.0.into_iter().collect() }),
        }
    }
}

/// A key's connector as the agent receives it.
fn connector_grant(c: warren_config::connector::EffectiveConnector) -> pb::ConnectorGrant {
    pb::ConnectorGrant {
        name: c.name,
        host: c.host.unwrap_or_default(),
        credentials: Some(pb::Credentials { values: c.credentials.0.into_iter().collect() }),
        kind: c.kind.as_str().into(),
        kind_enum: pb::ConnectorKind::from(c.kind) as i32,
        port: c.port.map_or(0, u32::from),
        database: c.database.unwrap_or_default(),
        username: c.username.unwrap_or_default(),
        project: c.project.unwrap_or_default(),
        endpoint: c.endpoint.unwrap_or_default(),
        region: c.region.unwrap_or_default(),
        custody: c.custody,
        tls_disabled: c.tls_disabled,
        tls_ca_pem: c.tls_ca_pem.unwrap_or_default(),
        tls_server_name: c.tls_server_name.unwrap_or_default(),
        weak_auth: c.weak_auth,
    }
}

/// A key's mount as the agent receives it.
fn storage_mount(m: warren_config::storage::EffectiveMount) -> pb::StorageMount {
    pb::StorageMount {
        mount_path: format!("/data/{}", m.name),
        provider: m.provider.as_str().into(),
        provider_kind: pb::StorageProvider::from(m.provider) as i32,
        bucket: m.bucket,
        prefix: m.prefix,
        mode: if m.read_only { pb::MountMode::ReadOnly } else { pb::MountMode::ReadWrite } as i32,
        endpoint: m.endpoint.unwrap_or_default(),
        region: m.region.unwrap_or_default(),
        credentials: (!m.credentials.0.is_empty()).then(|| pb::Credentials { values: m.credentials.0.into_iter().collect() }),
        max_write_bytes: m.max_write_bytes,
        ambient_identity: m.ambient_identity,
    }
}

/// The agent's reference to thread `id` of `tenant`.
pub fn thread_ref(tenant: &Tenant, id: &str) -> pb::ThreadRef {
    pb::ThreadRef { namespace: tenant.namespace.clone(), key_name: tenant.key_name.clone(), thread_id: id.to_string() }
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
