//! The execution spec: everything one execution may do, built once from the
//! caller's key and request. Its contract part travels to the agent through
//! the one wire edge (`warren_proto::spec`); nothing copies fields by hand.

use std::collections::BTreeMap;
use std::time::Duration;

use warren_config::EffectiveKey;
use warren_core::bounds::TIMEOUT_SECS;
use warren_core::contract::{Image, Mount, Spec, Thread};
use warren_core::path;

use super::ExecError;
use super::request::ExecuteRequest;

/// The tenant an execution runs for: the ApiKey that authenticated it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Tenant {
    /// Namespace of the ApiKey.
    pub namespace: String,
    /// Name of the ApiKey.
    pub key_name: String,
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
    /// The console's playground: runs on like an async execution, its
    /// lines recorded; read on the execution's page.
    Console,
}

impl Delivery {
    /// The record's delivery mode.
    pub fn mode(self) -> crate::records::Mode {
        match self {
            Delivery::Collected => crate::records::Mode::Inline,
            Delivery::Streamed => crate::records::Mode::Stream,
            Delivery::Async => crate::records::Mode::Async,
            Delivery::Mcp => crate::records::Mode::Mcp,
            Delivery::Console => crate::records::Mode::Console,
        }
    }
}

/// One execution, fully resolved: the contract the agent receives, and
/// what only the gateway needs (whose it is, how its result travels).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ExecutionSpec {
    /// The per-execution contract; its id is the trace id (`trc_…`) in
    /// logs, headers and the agent.
    pub contract: Spec,
    /// Who runs it.
    pub tenant: Tenant,
    /// How the result is delivered.
    pub delivery: Delivery,
}

impl ExecutionSpec {
    /// Checks `req` (its own rules, then what `key` allows) and resolves everything; the
    /// request's code and env move into the spec (up to 1 MiB not copied).
    pub fn new(id: String, key: &EffectiveKey, req: &mut ExecuteRequest, delivery: Delivery) -> Result<ExecutionSpec, ExecError> {
        req.check()?;
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
        let tenant = Tenant::of(key);
        let contract = Spec {
            id,
            language: req.language,
            code: std::mem::take(&mut req.code),
            env,
            timeout: Duration::from_secs(timeout.into()),
            limits: key.limits.into(),
            image: Image { reference: key.image.clone(), digest: key.image_digest.clone(), pull: key.image_pull.clone() },
            network: key.network,
            egress: key.egress.clone().unwrap_or_default(),
            mounts,
            connectors: key.connectors.clone(),
            thread: req.thread_id.clone().map(|id| Thread {
                namespace: tenant.namespace.clone(),
                key_name: tenant.key_name.clone(),
                id,
                retention: key.thread_retention.duration(),
                max_bytes: key.thread_max_bytes,
                max_threads: (key.max_threads > 0).then_some(key.max_threads),
                history: key.thread_history,
            }),
            warm_modules: key.warm.of(req.language).to_vec(),
            trace: None,
        };
        Ok(ExecutionSpec { contract, tenant, delivery })
    }

    /// What rendezvous placement hashes: threads of different keys are
    /// different threads, even with the same id.
    pub fn placement(&self) -> Option<String> {
        self.contract.thread.as_ref().map(|t| placement_key(&self.tenant, &t.id))
    }

    /// The per-stream output cap the execution runs with.
    pub fn max_output_bytes(&self) -> u64 {
        self.contract.limits.max_output_bytes.unwrap_or(warren_core::bounds::OUTPUT_BYTES.default)
    }
}

/// The placement key of thread `id` of `tenant`.
pub fn placement_key(tenant: &Tenant, id: &str) -> String {
    format!("{}/{}/{id}", tenant.namespace, tenant.key_name)
}

/// The key's mounts, each narrowed by at most one `sub_paths` entry: the
/// mount then shows `<its prefix>/<the path below /data/<mount>/>`.
fn mounts(key: &EffectiveKey, sub_paths: &[String]) -> Result<Vec<Mount>, ExecError> {
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
