//! Thread identity and the manifest that says which layers make a thread's
//! home. Pure; unit-tested.

use std::time::Duration;

use serde::{Deserialize, Serialize};

/// Most layers a thread keeps before the next save writes one full layer.
pub const MAX_LAYERS: usize = 32;

/// A thread as its owner sees it: scoped to one ApiKey.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct ThreadKey {
    /// Namespace of the owning ApiKey.
    pub namespace: String,
    /// Name of the owning ApiKey.
    pub key_name: String,
    /// The caller's thread id.
    pub thread_id: String,
}

/// A field of a thread reference that is not acceptable.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("thread.{field}: {message}")]
pub struct KeyError {
    /// Offending field.
    pub field: &'static str,
    /// Why.
    pub message: &'static str,
}

use warren_core::ids::{is_object_name as dns_name, is_thread_id as thread_id};

impl ThreadKey {
    /// Validates the parts: they become path segments and object keys.
    pub fn new(namespace: &str, key_name: &str, id: &str) -> Result<ThreadKey, KeyError> {
        if !dns_name(namespace) {
            return Err(KeyError { field: "namespace", message: "must be a Kubernetes object name" });
        }
        if !dns_name(key_name) {
            return Err(KeyError { field: "key_name", message: "must be a Kubernetes object name" });
        }
        if !thread_id(id) {
            return Err(KeyError { field: "thread_id", message: warren_core::ids::THREAD_ID_RULE });
        }
        Ok(ThreadKey { namespace: namespace.into(), key_name: key_name.into(), thread_id: id.into() })
    }

    /// Relative path (and object-key folder) of the thread: `ns/name/thread`.
    pub fn rel(&self) -> String {
        format!("{}/{}/{}", self.namespace, self.key_name, self.thread_id)
    }

    /// Folder holding every thread of this thread's ApiKey.
    pub fn key_prefix(&self) -> String {
        format!("threads/{}/{}/", self.namespace, self.key_name)
    }

    /// Object key of the manifest.
    pub fn manifest_key(&self) -> String {
        format!("threads/{}/manifest.json", self.rel())
    }

    /// Object key of a layer.
    pub fn layer_key(&self, id: &str) -> String {
        format!("threads/{}/layers/{id}.tar", self.rel())
    }

    /// True when `key` is a layer key (as [`ThreadKey::layer_key`] makes
    /// them, from a [`new_id`]) of any thread of this thread's ApiKey: a
    /// fork names its source's layers, never another key's.
    pub fn may_name_layer(&self, key: &str) -> bool {
        let Some((thread, file)) = key.strip_prefix(&self.key_prefix()).and_then(|rest| rest.split_once("/layers/")) else { return false };
        warren_core::ids::is_thread_id(thread)
            && file.strip_suffix(".tar").is_some_and(|id| id.len() == 32 && id.bytes().all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f')))
    }

    /// Folder of the key's fork leases (see `super::gc`).
    pub fn lease_prefix(&self) -> String {
        format!("leases/{}/{}/", self.namespace, self.key_name)
    }
}

/// How one call may use a thread.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ThreadOptions {
    /// Which thread.
    pub key: ThreadKey,
    /// Kept this long after its last use; `None` keeps it forever.
    pub retention: Option<Duration>,
    /// Largest charged size of the saved home.
    pub max_bytes: u64,
    /// Most live threads the key keeps; a call creating one more is refused.
    pub max_threads: Option<u32>,
    /// Most versions the thread's history keeps (≥ 1).
    pub history: u32,
}

impl ThreadOptions {
    /// How many versions the thread keeps, and for how long.
    pub fn keep(&self) -> Keep {
        Keep { count: self.history, max_age: self.retention.map(|d| d.as_secs()) }
    }
}

/// One layer of a manifest.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct LayerRef {
    /// Object key.
    pub key: String,
    /// Size of the object.
    pub size: u64,
}

/// The published state of a thread: replacing this one object is what makes
/// a save visible, so a save is all or nothing.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Manifest {
    /// Format version (1).
    pub version: u32,
    /// Random id of this save; warm copies on nodes are tagged with it.
    pub id: String,
    /// Layers to replay in order onto an empty home.
    pub layers: Vec<LayerRef>,
    /// Charged size of the home (see `layer::ENTRY_CHARGE`).
    pub bytes: u64,
    /// Last save, Unix seconds.
    pub updated_at: u64,
    /// Retention in seconds counted from `updated_at`; `None` is forever.
    pub retention_secs: Option<u64>,
    /// The versions a restore or fork may return to, oldest first; the last
    /// is the current one (see [`super::history`]). Empty in a manifest
    /// written before histories existed.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub history: Vec<Version>,
    /// Layers that only past versions name.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub pool: Vec<LayerRef>,
}

impl Manifest {
    /// The thread is past its retention at `now` (Unix seconds).
    pub fn expired(&self, now: u64) -> bool {
        self.retention_secs.is_some_and(|r| self.updated_at.saturating_add(r) <= now)
    }

    /// The manifest of a deleted thread: no layers, expired at once (a real
    /// retention is never 0). It keeps a slot for compare-and-swap, so a save
    /// racing the deletion fails instead of resurrecting half a thread.
    pub fn tombstone(now: u64) -> Manifest {
        Manifest { retention_secs: Some(0), ..Manifest::empty(now) }
    }

    /// A manifest of no layers and no history, kept forever.
    pub fn empty(now: u64) -> Manifest {
        Manifest { version: 1, id: new_id(), layers: Vec::new(), bytes: 0, updated_at: now, retention_secs: None, history: Vec::new(), pool: Vec::new() }
    }

    /// Every layer the manifest keeps: the current ones, then the pool.
    pub fn all_layers(&self) -> impl Iterator<Item = &LayerRef> {
        self.layers.iter().chain(self.pool.iter())
    }

    /// This is a deleted thread's tombstone.
    pub fn is_tombstone(&self) -> bool {
        self.layers.is_empty() && self.retention_secs == Some(0)
    }

    /// Parses the stored manifest of thread `owner`. Every layer it names
    /// must be one of the owner's ApiKey's: the agent reads them, so a
    /// manifest naming another key's objects would hand them over.
    pub fn parse(bytes: &[u8], owner: &ThreadKey) -> Result<Manifest, String> {
        let m: Manifest = serde_json::from_slice(bytes).map_err(|e| e.to_string())?;
        if m.version != 1 {
            return Err(format!("manifest version {} is not supported", m.version));
        }
        if let Some(l) = m.all_layers().find(|l| !owner.may_name_layer(&l.key)) {
            return Err(format!("the manifest names layer {:?}, which is not this key's", l.key));
        }
        check_history(&m)?;
        Ok(m)
    }
}

/// What produced a version.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Kind {
    /// An execution's save.
    Execution,
    /// A Files API write (upload, remove).
    Files,
    /// A restore to an earlier version.
    Restore,
    /// A fork of a live sandbox's home as it was then.
    Fork,
}

impl Kind {
    /// The name the API shows.
    pub fn as_str(self) -> &'static str {
        match self {
            Kind::Execution => "execution",
            Kind::Files => "files",
            Kind::Restore => "restore",
            Kind::Fork => "fork",
        }
    }
}

/// One saved state of a thread.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Version {
    /// The call that produced it (an execution's trace id); empty when unknown.
    #[serde(default)]
    pub trace_id: String,
    /// What produced it.
    pub kind: Kind,
    /// When, Unix seconds.
    pub at: u64,
    /// Charged size of the home in this version.
    pub bytes: u64,
    /// The execution's exit code, when an execution produced it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub exit: Option<i32>,
    /// Its layers, in order, as indices into the manifest's layers + pool.
    pub layers: Vec<u32>,
}

/// How many versions a thread keeps, and for how long.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Keep {
    /// Most versions (≥ 1; the current one counts).
    pub count: u32,
    /// Versions older than this go (seconds); `None`: no age limit. The
    /// current version always stays.
    pub max_age: Option<u64>,
}

/// Checks that every version's indices point into the manifest.
fn check_history(m: &Manifest) -> Result<(), String> {
    let n = (m.layers.len() + m.pool.len()) as u64;
    match m.history.iter().find(|v| v.layers.iter().any(|&i| u64::from(i) >= n)) {
        Some(v) => Err(format!("the history's version of {:?} names a layer the manifest does not keep", v.trace_id)),
        None => Ok(()),
    }
}

/// A random 128-bit id in hex.
pub fn new_id() -> String {
    format!("{:032x}", rand::random::<u128>())
}

/// Now in Unix seconds.
pub fn unix_now() -> u64 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_secs())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_become_safe_object_keys() {
        let k = ThreadKey::new("team-a", "agent.key", "sess-1_x").unwrap();
        assert_eq!(k.manifest_key(), "threads/team-a/agent.key/sess-1_x/manifest.json");
        assert_eq!(k.layer_key("ab"), "threads/team-a/agent.key/sess-1_x/layers/ab.tar");
        for (ns, name, id) in [("..", "k", "t"), ("a", "k/..", "t"), ("a", "k", "../x"), ("a", "k", "-t"), ("A", "k", "t"), ("a", "", "t"), ("a.", "k", "t")] {
            assert!(ThreadKey::new(ns, name, id).is_err(), "{ns}/{name}/{id}");
        }
        assert!(ThreadKey::new("a", "k", &"t".repeat(129)).is_err());
    }

    #[test]
    fn expiry_counts_from_the_last_save() {
        let m = Manifest { updated_at: 1000, retention_secs: Some(86400), ..Manifest::empty(0) };
        assert!(!m.expired(1000 + 86399));
        assert!(m.expired(1000 + 86400));
        let forever = Manifest { retention_secs: None, ..m.clone() };
        assert!(!forever.expired(u64::MAX));
        let k = ThreadKey::new("a", "k", "t").unwrap();
        let text = serde_json::to_vec(&m).unwrap();
        assert_eq!(Manifest::parse(&text, &k).unwrap(), m);
        let tomb = Manifest::tombstone(5);
        assert!(tomb.is_tombstone() && tomb.expired(5), "a tombstone is a thread that does not exist");
        assert!(!m.is_tombstone());
        assert!(Manifest::parse(br#"{"version":2,"id":"x","layers":[],"bytes":0,"updatedAt":0,"retentionSecs":null}"#, &k).is_err());
    }

    #[test]
    fn a_manifest_may_name_only_its_own_key_s_layers() {
        let k = ThreadKey::new("a", "k", "t").unwrap();
        let own = k.layer_key(&new_id());
        let with = |key: &str| {
            let m = Manifest { layers: vec![LayerRef { key: own.clone(), size: 1 }, LayerRef { key: key.into(), size: 1 }], ..Manifest::empty(0) };
            Manifest::parse(&serde_json::to_vec(&m).unwrap(), &k)
        };
        assert!(with(&k.layer_key(&new_id())).is_ok());
        assert!(with(&ThreadKey::new("a", "k", "t2").unwrap().layer_key(&new_id())).is_ok(), "a fork names its source's layers");
        let pooled = Manifest { pool: vec![LayerRef { key: ThreadKey::new("a", "other", "t").unwrap().layer_key(&new_id()), size: 1 }], ..Manifest::empty(0) };
        assert!(Manifest::parse(&serde_json::to_vec(&pooled).unwrap(), &k).unwrap_err().contains("not this key's"), "the pool is checked too");
        for foreign in [
            ThreadKey::new("a", "other", "t").unwrap().layer_key(&new_id()),
            ThreadKey::new("b", "k", "t").unwrap().layer_key(&new_id()),
            format!("threads/a/k/-t/layers/{}.tar", new_id()),
            format!("threads/a/k/t/x/layers/{}.tar", new_id()),
            "threads/a/k/t/manifest.json".to_string(),
            format!("threads/a/k/t/layers/../../t2/layers/{}.tar", new_id()),
            "threads/a/k/t/layers/ab.tar".to_string(),
            format!("threads/a/k/t/layers/{}.tar", new_id().to_uppercase()),
            format!("threads/a/k/t/layers/{}.tar.x", new_id()),
        ] {
            let err = with(&foreign).expect_err(&foreign);
            assert!(err.contains("not this key's"), "{err}");
        }
    }
}
