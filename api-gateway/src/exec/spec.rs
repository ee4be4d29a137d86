//! The execution spec: everything one execution may do, built once from the
//! caller's key and request. The agent call is its wire form
//! (`exec::convert`); nothing downstream copies fields by hand.

use std::collections::BTreeMap;
use std::time::Duration;

use warren_config::EffectiveKey;
use warren_core::bounds::TIMEOUT_SECS;
use warren_core::{path, Language, Limits, Network};

use super::ExecError;
use crate::request::ExecuteRequest;

/// The tenant an execution runs for: the ApiKey that authenticated it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Tenant {
    /// Namespace of the ApiKey.
    pub namespace: String,
    /// Name of the ApiKey.
    pub key_name: String,
}

/// A thread's saved home for this execution.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ThreadSpec {
    /// The caller's thread id (scoped to the tenant).
    pub id: String,
    /// How long it is kept after its last save; `None` forever.
    pub retention: Option<Duration>,
    /// Largest charged size of the saved home.
    pub max_bytes: u64,
    /// Most live threads of the key (0: no limit).
    pub max_threads: u32,
}

/// The root filesystem.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ImageRef {
    /// `host` or an OCI reference.
    pub reference: String,
    /// The digest the reference was pinned to; `None` for `host` (or an
    /// image not resolved yet: the agent resolves the tag).
    pub digest: Option<String>,
    /// Registry credentials for the agent's pull.
    pub pull: Option<warren_core::secret::Credentials>,
}

impl ImageRef {
    /// What nodes report warm for this image: its digest, or its reference
    /// when the control plane pinned none; `None` for `host` (warm everywhere).
    pub fn warm_key(&self) -> Option<&str> {
        match (self.reference.as_str(), &self.digest) {
            ("host", _) => None,
            (_, Some(digest)) => Some(digest),
            (reference, None) => Some(reference),
        }
    }
}

/// How the caller receives the result.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Delivery {
    /// One JSON result when it ends.
    Collected,
    /// NDJSON events as they happen.
    Streamed,
    /// 202 now; the events are recorded for status, output and webhook.
    Async,
    /// An MCP tool call: one result.
    Mcp,
}

impl Delivery {
    /// The record's delivery mode.
    pub fn mode(self) -> crate::records::Mode {
        match self {
            Delivery::Collected => crate::records::Mode::Inline,
            Delivery::Streamed => crate::records::Mode::Stream,
            Delivery::Async => crate::records::Mode::Async,
            Delivery::Mcp => crate::records::Mode::Mcp,
        }
    }
}

/// One execution, fully resolved.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ExecutionSpec {
    /// Execution id (`trc_…`): the trace id in logs, headers and the agent.
    pub id: String,
    /// Who runs it.
    pub tenant: Tenant,
    /// Interpreter.
    pub language: Language,
    /// Program text.
    pub code: String,
    /// Sandbox < ApiKey < request, most specific last-wins, sorted by name.
    pub env: Vec<(String, String)>,
    /// Wall-clock limit.
    pub timeout: Duration,
    /// Resource limits.
    pub limits: Limits,
    /// Root filesystem.
    pub image: ImageRef,
    /// Outbound network policy (the key's, after narrowing).
    pub network: Network,
    /// With `Unrestricted`: the only destinations allowed (the key's).
    pub egress: Vec<warren_core::egress::EgressRule>,
    /// Connectors whose credentials the call gets (the key's).
    pub connectors: Vec<warren_config::connector::EffectiveConnector>,
    /// The saved home, when the request names a thread.
    pub thread: Option<ThreadSpec>,
    /// How the result is delivered.
    pub delivery: Delivery,
    /// Storage under `/data`, narrowed by the request's `sub_paths`.
    pub mounts: Vec<warren_config::storage::EffectiveMount>,
}

impl ExecutionSpec {
    /// Checks `req` against what `key` allows and resolves everything; the
    /// request's code and env move into the spec (up to 1 MiB not copied).
    pub fn new(id: String, key: &EffectiveKey, req: &mut ExecuteRequest, delivery: Delivery) -> Result<ExecutionSpec, ExecError> {
        if !key.languages.contains(&req.language) {
            let offered: Vec<&str> = key.languages.iter().map(|l| l.as_str()).collect();
            return Err(ExecError::invalid("language", format!("this sandbox offers {}", offered.join(", "))));
        }
        let timeout = match req.timeout {
            Some(t) if t > key.max_timeout_seconds => {
                return Err(ExecError::invalid("timeout", format!("at most {} seconds for this API key", key.max_timeout_seconds)))
            }
            Some(t) => t,
            None => TIMEOUT_SECS.default.min(key.max_timeout_seconds),
        };
        let mounts = mounts(key, &req.sub_paths)?;
        let mut env: BTreeMap<String, String> = key.env.iter().cloned().collect();
        env.extend(std::mem::take(&mut req.env_vars));
        Ok(ExecutionSpec {
            id,
            tenant: Tenant { namespace: key.namespace.clone(), key_name: key.name.clone() },
            language: req.language,
            code: std::mem::take(&mut req.code),
            env: env.into_iter().collect(),
            timeout: Duration::from_secs(timeout.into()),
            limits: key.limits,
            image: ImageRef { reference: key.image.clone(), digest: key.image_digest.clone(), pull: key.image_pull.clone() },
            network: key.network,
            egress: key.egress.clone().unwrap_or_default(),
            connectors: key.connectors.clone(),
            thread: req.thread_id.clone().map(|id| ThreadSpec {
                id,
                retention: key.thread_retention.duration(),
                max_bytes: key.thread_max_bytes,
                max_threads: key.max_threads,
            }),
            delivery,
            mounts,
        })
    }

    /// What rendezvous placement hashes: threads of different keys are
    /// different threads, even with the same id.
    pub fn placement(&self) -> Option<String> {
        self.thread.as_ref().map(|t| placement_key(&self.tenant, &t.id))
    }
}

/// The placement key of thread `id` of `tenant`.
pub fn placement_key(tenant: &Tenant, id: &str) -> String {
    format!("{}/{}/{id}", tenant.namespace, tenant.key_name)
}

/// The key's mounts, each narrowed by at most one `sub_paths` entry: the
/// mount then shows `<its prefix>/<the path below /data/<mount>/>`.
fn mounts(key: &EffectiveKey, sub_paths: &[String]) -> Result<Vec<warren_config::storage::EffectiveMount>, ExecError> {
    let mut narrowed: BTreeMap<&str, &str> = BTreeMap::new();
    for (i, p) in sub_paths.iter().enumerate() {
        let field = format!("sub_paths[{i}]");
        let (mount, below) = path::data_sub_path(p).map_err(|why| ExecError::invalid(&field, why))?;
        if !key.storage.iter().any(|m| m.name == mount) {
            let shown: String = mount.chars().take(64).collect();
            return Err(ExecError::invalid(&field, format!("this API key has no storage mount named {shown:?}")));
        }
        if narrowed.insert(mount, below).is_some() {
            return Err(ExecError::invalid(&field, format!("a second sub_path for mount {mount:?}; give one per mount")));
        }
    }
    Ok(key
        .storage
        .iter()
        .map(|m| {
            let mut m = m.clone();
            if let Some(below) = narrowed.get(m.name.as_str()) {
                m.prefix = path::join(&m.prefix, below);
            }
            m
        })
        .collect())
}

impl Tenant {
    /// The tenant `key` authenticates.
    pub fn of(key: &EffectiveKey) -> Tenant {
        Tenant { namespace: key.namespace.clone(), key_name: key.name.clone() }
    }
}
