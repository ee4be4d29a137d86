//! The execution contract on the wire: [`Spec`] ⇄ `ExecuteRequest`, both
//! directions in this one file. Reading refuses what cannot be a spec (an
//! unknown language, a port out of range) and what this side does not know
//! (a network policy or a storage provider from a newer sender): nothing is
//! silently dropped. What a node's policy allows is checked afterwards, by
//! [`Spec::check`](warren_core::contract::Spec::check).

use std::time::Duration;

use warren_core::contract::{Connector, Image, LimitRequest, Mount, Spec, SpecError, Thread};
use warren_core::egress::EgressRule;
use warren_core::secret::Credentials;
use warren_core::{Language, Network};

use crate::agent as pb;
use crate::kinds;

/// Why a wire request is not a spec.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum WireError {
    /// Malformed.
    Invalid(SpecError),
    /// A value of the contract this side does not offer.
    Unsupported(SpecError),
}

impl WireError {
    /// The refused field and why.
    pub fn spec_error(&self) -> &SpecError {
        match self {
            WireError::Invalid(e) | WireError::Unsupported(e) => e,
        }
    }
}

impl std::fmt::Display for WireError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        self.spec_error().fmt(f)
    }
}

impl std::error::Error for WireError {}

fn invalid(field: impl Into<String>, message: impl Into<String>) -> WireError {
    WireError::Invalid(SpecError::new(field, message))
}

/// `""` is "none" on the wire.
fn opt(s: String) -> Option<String> {
    (!s.is_empty()).then_some(s)
}

fn credentials(c: Credentials) -> pb::Credentials {
    pb::Credentials { values: c.0.into_iter().collect() }
}

fn read_credentials(c: Option<pb::Credentials>) -> Credentials {
    Credentials(c.map(|c| c.values.into_iter().collect()).unwrap_or_default())
}

impl From<&Spec> for pb::ExecuteRequest {
    fn from(s: &Spec) -> pb::ExecuteRequest {
        s.clone().into()
    }
}

/// By value, so the program text moves rather than being copied.
impl From<Spec> for pb::ExecuteRequest {
    fn from(s: Spec) -> pb::ExecuteRequest {
        let network = match s.network {
            Network::Blocked => pb::NetworkPolicy::Blocked,
            Network::Unrestricted => pb::NetworkPolicy::Unrestricted,
        };
        pb::ExecuteRequest {
            execution_id: s.id,
            language: pb::Language::from(s.language) as i32,
            code: s.code,
            env: s.env.into_iter().collect(),
            timeout_ms: u32::try_from(s.timeout.as_millis()).unwrap_or(u32::MAX),
            limits: Some(limits(s.limits)),
            image: s.image.reference,
            image_digest: s.image.digest.unwrap_or_default(),
            image_pull: s.image.pull.map(credentials),
            network: network as i32,
            egress: s.egress.into_iter().map(|r| pb::EgressRule { host: r.host, ports: r.ports.into_iter().map(u32::from).collect() }).collect(),
            mounts: s.mounts.into_iter().map(storage_mount).collect(),
            connectors: s.connectors.into_iter().map(connector_grant).collect(),
            thread: s.thread.map(thread_options),
            // Transport, not contract: the gateway sets it when the
            // executing agent counts the key.
            key_slot: None,
            warm_modules: s.warm_modules,
            // Transport too: the caller's queue wait.
            queue_wait_ms: 0,
            traceparent: s.trace.as_ref().map(|t| t.parent.header()).unwrap_or_default(),
            tracestate: s.trace.and_then(|t| t.state).unwrap_or_default(),
        }
    }
}

impl TryFrom<pb::ExecuteRequest> for Spec {
    type Error = WireError;

    fn try_from(r: pb::ExecuteRequest) -> Result<Spec, WireError> {
        let network = match pb::NetworkPolicy::try_from(r.network) {
            Ok(pb::NetworkPolicy::Unspecified | pb::NetworkPolicy::Blocked) => Network::Blocked,
            Ok(pb::NetworkPolicy::Unrestricted) => Network::Unrestricted,
            Err(_) => return Err(WireError::Unsupported(SpecError::new("network", "not offered by this node-agent"))),
        };
        let language = pb::Language::try_from(r.language).ok().and_then(|l| Language::try_from(l).ok());
        Ok(Spec {
            id: r.execution_id,
            language: language.ok_or_else(|| invalid("language", "must be python, node or bash"))?,
            code: r.code,
            env: r.env.into_iter().collect(),
            timeout: Duration::from_millis(r.timeout_ms.into()),
            limits: read_limits(r.limits.unwrap_or_default()),
            image: Image { reference: r.image, digest: opt(r.image_digest), pull: r.image_pull.filter(|c| !c.values.is_empty()).map(|c| read_credentials(Some(c))) },
            network,
            egress: r.egress.into_iter().map(egress_rule).collect::<Result<_, _>>()?,
            mounts: r.mounts.into_iter().enumerate().map(|(i, m)| read_mount(i, m)).collect::<Result<_, _>>()?,
            connectors: r.connectors.into_iter().map(read_connector).collect::<Result<_, _>>()?,
            thread: r.thread.map(Thread::try_from).transpose()?,
            warm_modules: r.warm_modules,
            trace: warren_core::trace::Trace::from_headers(&r.traceparent, &r.tracestate),
        })
    }
}

fn limits(l: LimitRequest) -> pb::Limits {
    pb::Limits {
        cpu_millis: l.cpu_millis.unwrap_or(0),
        memory_bytes: l.memory_bytes.unwrap_or(0),
        pids: l.pids.unwrap_or(0),
        tmp_bytes: l.tmp_bytes.unwrap_or(0),
        home_bytes: l.home_bytes.unwrap_or(0),
        max_output_bytes: l.max_output_bytes.unwrap_or(0),
        open_files: l.open_files.unwrap_or(0),
        file_size_bytes: l.file_size_bytes.unwrap_or(0),
    }
}

/// Zero fields take the node's defaults.
fn read_limits(l: pb::Limits) -> LimitRequest {
    let nz32 = |v: u32| (v != 0).then_some(v);
    let nz64 = |v: u64| (v != 0).then_some(v);
    LimitRequest {
        cpu_millis: nz32(l.cpu_millis),
        memory_bytes: nz64(l.memory_bytes),
        pids: nz32(l.pids),
        tmp_bytes: nz64(l.tmp_bytes),
        home_bytes: nz64(l.home_bytes),
        max_output_bytes: nz64(l.max_output_bytes),
        open_files: nz32(l.open_files),
        file_size_bytes: nz64(l.file_size_bytes),
    }
}

fn egress_rule(r: pb::EgressRule) -> Result<EgressRule, WireError> {
    let ports = r.ports.iter().map(|p| u16::try_from(*p).map_err(|_| invalid("egress", format!("{:?}: port {p} is out of range", r.host))));
    Ok(EgressRule { ports: ports.collect::<Result<_, _>>()?, host: r.host })
}

fn storage_mount(m: Mount) -> pb::StorageMount {
    pb::StorageMount {
        mount_path: format!("/data/{}", m.name),
        provider: m.provider.as_str().into(),
        provider_kind: pb::StorageProvider::from(m.provider) as i32,
        bucket: m.bucket,
        prefix: m.prefix,
        mode: if m.read_only { pb::MountMode::ReadOnly } else { pb::MountMode::ReadWrite } as i32,
        endpoint: m.endpoint.unwrap_or_default(),
        region: m.region.unwrap_or_default(),
        credentials: (!m.credentials.0.is_empty()).then(|| credentials(m.credentials)),
        max_write_bytes: m.max_write_bytes,
        ambient_identity: m.ambient_identity,
    }
}

/// Only `READ_WRITE` writes.
fn read_mount(i: usize, m: pb::StorageMount) -> Result<Mount, WireError> {
    let read_only = m.mode() != pb::MountMode::ReadWrite;
    let name = m.mount_path.strip_prefix("/data/").ok_or_else(|| invalid(format!("mounts[{i}].mount_path"), "must be /data/<name> with one plain path segment"))?;
    let provider = kinds::provider(m.provider_kind, &m.provider)
        .ok_or_else(|| WireError::Unsupported(SpecError::new(format!("mounts[{i}].provider"), "this agent serves s3, gcs, azure, local and volume mounts")))?;
    Ok(Mount {
        name: name.to_string(),
        provider,
        bucket: m.bucket,
        prefix: m.prefix,
        read_only,
        endpoint: opt(m.endpoint),
        region: opt(m.region),
        credentials: read_credentials(m.credentials),
        max_write_bytes: m.max_write_bytes,
        ambient_identity: m.ambient_identity,
    })
}

fn connector_grant(c: Connector) -> pb::ConnectorGrant {
    pb::ConnectorGrant {
        name: c.name,
        kind: c.kind.as_str().into(),
        kind_enum: pb::ConnectorKind::from(c.kind) as i32,
        host: c.host.unwrap_or_default(),
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
        credentials: Some(credentials(c.credentials)),
    }
}

fn read_connector(c: pb::ConnectorGrant) -> Result<Connector, WireError> {
    let Some(kind) = kinds::connector_kind(c.kind_enum, &c.kind) else {
        return Err(invalid("connectors", format!("{:?}: a kind this node-agent does not know", c.name)));
    };
    let port = match c.port {
        0 => None,
        p => Some(u16::try_from(p).map_err(|_| invalid("connectors", format!("{:?}: port {p} is out of range", c.name)))?),
    };
    Ok(Connector {
        name: c.name,
        kind,
        host: opt(c.host),
        port,
        database: opt(c.database),
        username: opt(c.username),
        project: opt(c.project),
        endpoint: opt(c.endpoint),
        region: opt(c.region),
        custody: c.custody,
        tls_disabled: c.tls_disabled,
        tls_ca_pem: opt(c.tls_ca_pem),
        tls_server_name: opt(c.tls_server_name),
        weak_auth: c.weak_auth,
        credentials: read_credentials(c.credentials),
    })
}

fn thread_options(t: Thread) -> pb::ThreadOptions {
    pb::ThreadOptions {
        r#ref: Some(pb::ThreadRef { namespace: t.namespace, key_name: t.key_name, thread_id: t.id }),
        retention_seconds: t.retention.map_or(0, |d| d.as_secs()),
        max_bytes: t.max_bytes,
        max_threads: t.max_threads.unwrap_or(0),
        history_versions: t.history,
    }
}

impl TryFrom<pb::ThreadOptions> for Thread {
    type Error = WireError;

    fn try_from(t: pb::ThreadOptions) -> Result<Thread, WireError> {
        let r = t.r#ref.ok_or_else(|| invalid("thread.ref", "required"))?;
        if t.max_bytes == 0 {
            return Err(invalid("thread.max_bytes", "must be > 0"));
        }
        Ok(Thread {
            namespace: r.namespace,
            key_name: r.key_name,
            id: r.thread_id,
            retention: (t.retention_seconds > 0).then(|| Duration::from_secs(t.retention_seconds)),
            max_bytes: t.max_bytes,
            max_threads: (t.max_threads > 0).then_some(t.max_threads),
            history: match t.history_versions {
                0 => DEFAULT_HISTORY,
                n if n > MAX_HISTORY => return Err(invalid("thread.history_versions", "must be at most 1000")),
                n => n,
            },
        })
    }
}

/// Versions a thread keeps when the request does not say.
pub const DEFAULT_HISTORY: u32 = 50;
/// Most versions a thread may keep.
pub const MAX_HISTORY: u32 = 1000;

#[cfg(test)]
mod tests;
