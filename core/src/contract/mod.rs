//! The per-execution contract: everything one execution may do, as the
//! gateway resolves it from a key and a request, the wire carries it
//! (`warren_proto::spec`, both directions in one file) and the node-agent
//! checks it against its [`NodePolicy`] before any syscall.
//!
//! Adding a per-execution field means one field here, one protobuf field
//! and one line in each direction of the wire edge.

mod check;
mod resources;

use std::collections::BTreeMap;
use std::time::Duration;

pub use check::{check_env, NodePolicy, SpecError};
pub use resources::{Connector, Mount};

use crate::egress::EgressRule;
use crate::secret::Credentials;
use crate::{Language, Limits, Network};

/// One execution, resolved by the control plane.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Spec {
    /// Execution id (`[a-zA-Z0-9_-]{1,64}`); empty: the node-agent picks one.
    pub id: String,
    /// Interpreter.
    pub language: Language,
    /// Program text (1 byte to 1 MiB of UTF-8, no NUL).
    pub code: String,
    /// Sandbox < ApiKey < request, merged (most specific wins).
    pub env: BTreeMap<String, String>,
    /// Wall-clock limit.
    pub timeout: Duration,
    /// Resource limits; an unset field takes the node's default.
    pub limits: LimitRequest,
    /// Root filesystem.
    pub image: Image,
    /// Outbound network policy.
    pub network: Network,
    /// With `Unrestricted`: when non-empty, the only destinations allowed.
    pub egress: Vec<EgressRule>,
    /// Storage under `/data`.
    pub mounts: Vec<Mount>,
    /// Credentials injected for outbound calls.
    pub connectors: Vec<Connector>,
    /// The saved home, when the call runs in a thread.
    pub thread: Option<Thread>,
    /// Modules the Sandbox warms for this language (see [`crate::warm`]).
    pub warm_modules: Vec<String>,
    /// The trace the call continues (W3C Trace Context): its program gets
    /// `TRACEPARENT`/`TRACESTATE`, and the node's spans join it.
    pub trace: Option<crate::trace::Trace>,
}

impl Spec {
    /// `code` in `language` with nothing else: no id yet, the node's
    /// default limits, the host image, no network, mounts, connectors or
    /// thread.
    pub fn new(language: Language, code: impl Into<String>, timeout: Duration) -> Spec {
        Spec {
            id: String::new(),
            language,
            code: code.into(),
            env: BTreeMap::new(),
            timeout,
            limits: LimitRequest::default(),
            image: Image::default(),
            network: Network::Blocked,
            egress: Vec::new(),
            mounts: Vec::new(),
            connectors: Vec::new(),
            thread: None,
            warm_modules: Vec::new(),
            trace: None,
        }
    }
}

/// Limits as requested: `None` takes the node's default.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct LimitRequest {
    /// See [`Limits::cpu_millis`].
    pub cpu_millis: Option<u32>,
    /// See [`Limits::memory_bytes`].
    pub memory_bytes: Option<u64>,
    /// See [`Limits::pids`].
    pub pids: Option<u32>,
    /// See [`Limits::tmp_bytes`].
    pub tmp_bytes: Option<u64>,
    /// See [`Limits::home_bytes`].
    pub home_bytes: Option<u64>,
    /// See [`Limits::max_output_bytes`].
    pub max_output_bytes: Option<u64>,
    /// See [`Limits::open_files`].
    pub open_files: Option<u32>,
    /// See [`Limits::file_size_bytes`].
    pub file_size_bytes: Option<u64>,
}

impl From<Limits> for LimitRequest {
    /// Every field set (what a published key carries).
    fn from(l: Limits) -> LimitRequest {
        LimitRequest {
            cpu_millis: Some(l.cpu_millis),
            memory_bytes: Some(l.memory_bytes),
            pids: Some(l.pids),
            tmp_bytes: Some(l.tmp_bytes),
            home_bytes: Some(l.home_bytes),
            max_output_bytes: Some(l.max_output_bytes),
            open_files: Some(l.open_files),
            file_size_bytes: Some(l.file_size_bytes),
        }
    }
}

/// The root filesystem.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Image {
    /// `host` (or empty: the same) or an OCI reference.
    pub reference: String,
    /// The digest the reference was pinned to; `None` for `host` or a tag
    /// the node resolves.
    pub digest: Option<String>,
    /// Registry credentials for the node's pull (`username`, `password`).
    pub pull: Option<Credentials>,
}

impl Image {
    /// The node's own `/usr`.
    pub fn is_host(&self) -> bool {
        matches!(self.reference.as_str(), "" | "host")
    }

    /// What nodes report warm for this image: its digest, or its reference
    /// when none was pinned; `None` for `host` (warm everywhere).
    pub fn warm_key(&self) -> Option<&str> {
        match (self.is_host(), &self.digest) {
            (true, _) => None,
            (false, Some(digest)) => Some(digest),
            (false, None) => Some(&self.reference),
        }
    }
}

/// A thread's saved home: `/home/sandbox` restored before the program and
/// saved after it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Thread {
    /// Namespace of the ApiKey the thread belongs to.
    pub namespace: String,
    /// Name of that ApiKey (threads of different keys never mix).
    pub key_name: String,
    /// The caller's thread id.
    pub id: String,
    /// How long it is kept after its last save; `None`: forever.
    pub retention: Option<Duration>,
    /// Largest charged size of the saved home (> 0).
    pub max_bytes: u64,
    /// Most live threads of the key; `None`: no limit.
    pub max_threads: Option<u32>,
    /// Most versions its history keeps (1..=1000).
    pub history: u32,
}

#[cfg(test)]
mod tests;
