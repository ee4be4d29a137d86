//! Why an execution (or a thread operation) was refused or failed, as domain
//! values. The HTTP adapter maps them to status codes in one place
//! (`crate::error`); later adapters (async, MCP) map the same values.

/// A refusal or failure of the execution service.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ExecError {
    /// No `Authorization: Bearer` key was sent.
    #[error("send the API key as Authorization: Bearer sk-wrn-…")]
    MissingKey,
    /// The header is malformed or names no key.
    #[error("{0}")]
    InvalidKey(&'static str),
    /// The key exists but is disabled.
    #[error("this API key is disabled")]
    KeyDisabled,
    /// A request field is invalid; nothing ran.
    #[error("{field}: {message}")]
    Invalid {
        /// Offending field, e.g. `timeout` or `env_vars.PATH`.
        field: String,
        /// What to fix.
        message: String,
    },
    /// The key ran as many executions as it may for the whole queue wait.
    #[error("this API key ran {0} executions, its limit, for the whole queue wait; nothing ran, retry after one finishes")]
    KeyConcurrency(u32),
    /// Another execution holds the thread.
    #[error("thread {0:?} is running another execution; retry when it finishes")]
    ThreadBusy(String),
    /// No such thread for this key.
    #[error("thread {0:?} does not exist for this key")]
    ThreadNotFound(String),
    /// The thread keeps no version produced by that execution.
    #[error("thread {0:?} keeps no version produced by that execution")]
    VersionNotFound(String),
    /// A fork's new thread id is taken.
    #[error("thread {0:?} already exists; fork into a new id")]
    ThreadExists(String),
    /// A new thread would give the key more than its `maxThreads`.
    #[error("the key keeps its maximum of threads (maxThreads); delete one before making another")]
    ThreadLimit,
    /// The thread's home is larger than its key's `threadMaxSize`.
    #[error("the thread's home is larger than this key's threadMaxSize")]
    ThreadTooLarge,
    /// The key's output cap needs more of the gateway's output memory than
    /// one key may ever hold (a configuration to fix, not a moment's load).
    #[error("{0}")]
    OutputBudget(String),
    /// No node-agent answers.
    #[error("no node-agent is reachable right now; nothing ran, retry shortly")]
    NoNode,
    /// Capacity that frees as executions end (a node's slots, the gateway's
    /// output memory, a record database connection) stayed taken for the
    /// whole queue wait; the call waited its turn and nothing ran.
    #[error("{0} for the whole queue wait; nothing ran, retry shortly")]
    Busy(&'static str),
    /// The chosen node cannot run it (capacity, isolation, a capability it
    /// lacks, unreachable); nothing ran.
    #[error("{0}; nothing ran, retry shortly")]
    NodeRefused(&'static str),
    /// The thread store could not be reached.
    #[error("the thread store is unavailable; retry shortly")]
    ThreadStore,
    /// The node died mid-execution; the code may have partly run.
    #[error("the node running this execution stopped before it finished; the code may have partly run")]
    NodeLost,
    /// The sandbox's image is being pulled to the chosen node; nothing ran.
    #[error("the sandbox image is being pulled to the node; nothing ran, retry shortly")]
    ImagePulling,
    /// The node could not pull the sandbox's image (registry or image refused); nothing ran.
    #[error("the sandbox image is unavailable on the node: {0}")]
    ImageUnavailable(String),
    /// The execution record could not be written (an async execution needs it); nothing ran.
    #[error("the execution record store is unavailable; nothing ran, retry shortly")]
    RecordStore,
    /// A documented option this server does not offer yet.
    #[error("{0}")]
    NotImplemented(&'static str),
}

impl ExecError {
    /// An invalid field.
    pub fn invalid(field: impl Into<String>, message: impl Into<String>) -> Self {
        ExecError::Invalid { field: field.into(), message: message.into() }
    }
}
