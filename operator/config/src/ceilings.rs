//! Admin-set ceilings per namespace: the most any ApiKey in a namespace may
//! get, whatever its Sandbox declares. They live as annotations on the
//! Namespace object, which tenants with the usual namespace-scoped roles
//! cannot edit. A key over a ceiling is refused (never silently clamped),
//! with the annotation and the value in its status.

use std::collections::BTreeMap;

use warren_core::quantity;

use crate::effective::EffectiveKey;

/// CPU per execution (`500m`, `2`).
pub const MAX_CPU: &str = "warren.dev/max-cpu";
/// Memory per execution (`512Mi`, `4Gi`).
pub const MAX_MEMORY: &str = "warren.dev/max-memory";
/// Concurrent executions per key.
pub const MAX_CONCURRENCY: &str = "warren.dev/max-concurrency";
/// Saved home of one thread (`1Gi`).
pub const MAX_THREAD_SIZE: &str = "warren.dev/max-thread-size";
/// Live threads per key.
pub const MAX_THREADS: &str = "warren.dev/max-threads";
/// Most live sandboxes one key of the namespace may hold at once.
pub const MAX_LIVE_SANDBOXES: &str = "warren.dev/max-live-sandboxes";
/// Longest life a key of the namespace may give a live sandbox, seconds.
pub const MAX_LIVE_SECONDS: &str = "warren.dev/max-live-seconds";
/// Bytes one storage mount may stage on the node in one call
/// (`maxWriteBytes`; `1Gi`): what a namespace's calls can spool.
pub const MAX_STORAGE_WRITE: &str = "warren.dev/max-storage-write";
/// `"true"`: storage connections of the namespace that name no credentials
/// Secret may sign with the node's cloud identity (instance role, workload
/// identity, managed identity). Without it they make unsigned requests.
pub const AMBIENT_IDENTITY: &str = "warren.dev/ambient-identity";

/// The ceilings of one namespace; `None` leaves a dimension to the Sandbox.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Ceilings {
    /// Thousandths of a core.
    pub cpu_millis: Option<u64>,
    /// Bytes.
    pub memory_bytes: Option<u64>,
    /// Executions at once, per key.
    pub concurrency: Option<u64>,
    /// Bytes of one thread's saved home.
    pub thread_bytes: Option<u64>,
    /// Live threads per key.
    pub threads: Option<u64>,
    /// Live sandboxes at once, per key.
    pub live_sandboxes: Option<u64>,
    /// Longest life of a live sandbox at a time, seconds.
    pub live_seconds: Option<u64>,
    /// Bytes one mount may stage per call.
    pub storage_write_bytes: Option<u64>,
    /// The admin lent the node's cloud identity to the namespace's storage
    /// connections without credentials ([`AMBIENT_IDENTITY`]).
    pub ambient_identity: bool,
}

impl Ceilings {
    /// Reads the `warren.dev/max-*` annotations; other annotations are
    /// ignored, a malformed ceiling is an error naming it (keys in the
    /// namespace are then refused: a typo must not lift a limit).
    pub fn from_annotations(annotations: &BTreeMap<String, String>) -> Result<Ceilings, String> {
        let read = |name: &str, parse: fn(&str) -> Option<u64>, example: &str| -> Result<Option<u64>, String> {
            annotations
                .get(name)
                .map(|v| parse(v).ok_or_else(|| format!("namespace annotation {name}: {v:?} is not a valid value (e.g. {example})")))
                .transpose()
        };
        Ok(Ceilings {
            cpu_millis: read(MAX_CPU, quantity::cpu_millis, "500m or 2")?,
            memory_bytes: read(MAX_MEMORY, quantity::bytes, "512Mi")?,
            concurrency: read(MAX_CONCURRENCY, |s| s.trim().parse().ok(), "10")?,
            thread_bytes: read(MAX_THREAD_SIZE, quantity::bytes, "1Gi")?,
            threads: read(MAX_THREADS, |s| s.trim().parse().ok(), "1000")?,
            live_sandboxes: read(MAX_LIVE_SANDBOXES, |s| s.trim().parse().ok(), "100")?,
            live_seconds: read(MAX_LIVE_SECONDS, |s| s.trim().parse().ok(), "3600")?,
            storage_write_bytes: read(MAX_STORAGE_WRITE, quantity::bytes, "1Gi")?,
            ambient_identity: match annotations.get(AMBIENT_IDENTITY).map(|v| v.trim()) {
                None | Some("false") => false,
                Some("true") => true,
                Some(v) => return Err(format!("namespace annotation {AMBIENT_IDENTITY}: {v:?} is not \"true\" or \"false\"")),
            },
        })
    }

    /// The first ceiling `key` exceeds: (the ApiKey or Sandbox field, message).
    pub fn exceeded_by(&self, key: &EffectiveKey) -> Option<(&'static str, String)> {
        let over = |ceiling: Option<u64>, value: u64, annotation: &str, field: &'static str, what: &str| {
            ceiling.filter(|c| value > *c).map(|c| (field, format!("{what} {value} exceeds the namespace ceiling {annotation}={c}")))
        };
        over(self.cpu_millis, u64::from(key.limits.cpu_millis), MAX_CPU, "spec.sandboxRef.name", "the Sandbox's CPU (millicores)")
            .or_else(|| over(self.memory_bytes, key.limits.memory_bytes, MAX_MEMORY, "spec.sandboxRef.name", "the Sandbox's memory (bytes)"))
            .or_else(|| over(self.concurrency, u64::from(key.max_concurrency), MAX_CONCURRENCY, "spec.maxConcurrency", "maxConcurrency"))
            .or_else(|| over(self.thread_bytes, key.thread_max_bytes, MAX_THREAD_SIZE, "spec.sandboxRef.name", "the Sandbox's threadMaxSize (bytes)"))
            .or_else(|| over(self.threads, u64::from(key.max_threads), MAX_THREADS, "spec.maxThreads", "maxThreads"))
            .or_else(|| over(self.live_sandboxes, u64::from(key.max_live_sandboxes), MAX_LIVE_SANDBOXES, "spec.maxLiveSandboxes", "maxLiveSandboxes"))
            .or_else(|| over(self.live_seconds, u64::from(key.max_live_seconds), MAX_LIVE_SECONDS, "spec.maxLiveSeconds", "maxLiveSeconds"))
            .or_else(|| {
                let widest = key.storage.iter().max_by_key(|m| m.max_write_bytes)?;
                over(self.storage_write_bytes, widest.max_write_bytes, MAX_STORAGE_WRITE, "spec.sandboxRef.name", &format!("the Sandbox's mount {} maxWriteBytes", widest.name))
            })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ann(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
        pairs.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect()
    }

    #[test]
    fn annotations_parse_and_typos_are_errors() {
        let c = Ceilings::from_annotations(&ann(&[(MAX_CPU, "500m"), (MAX_MEMORY, "1Gi"), (MAX_CONCURRENCY, "4"), (MAX_THREAD_SIZE, "2Gi"), (MAX_THREADS, "50"), (MAX_LIVE_SANDBOXES, "5"), (MAX_LIVE_SECONDS, "600"), ("other", "x")])).unwrap();
        let want = Ceilings { cpu_millis: Some(500), memory_bytes: Some(1 << 30), concurrency: Some(4), thread_bytes: Some(2 << 30), threads: Some(50), live_sandboxes: Some(5), live_seconds: Some(600), storage_write_bytes: None, ambient_identity: false };
        assert_eq!(c, want);
        assert_eq!(Ceilings::from_annotations(&ann(&[(MAX_STORAGE_WRITE, "256Mi")])).unwrap().storage_write_bytes, Some(256 << 20));
        assert!(Ceilings::from_annotations(&ann(&[(AMBIENT_IDENTITY, "true")])).unwrap().ambient_identity);
        assert!(Ceilings::from_annotations(&ann(&[(AMBIENT_IDENTITY, "yes")])).is_err(), "a typo grants nothing");
        assert_eq!(Ceilings::from_annotations(&ann(&[])).unwrap(), Ceilings::default());
        let err = Ceilings::from_annotations(&ann(&[(MAX_MEMORY, "1 GB")])).unwrap_err();
        assert!(err.contains(MAX_MEMORY) && err.contains("1 GB"), "{err}");
        assert!(Ceilings::from_annotations(&ann(&[(MAX_CONCURRENCY, "-1")])).is_err());
    }
}
