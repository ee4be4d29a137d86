//! How an execution ended: the contract's answer, the same value on the
//! node (where the sandbox produces it), on the wire (`warren-proto`'s
//! `exit` edge, the only conversion) and in the gateway (which renders it).

use std::net::IpAddr;
use std::time::Duration;

/// Most `/data` paths a [`Failure::StorageSync`] names.
pub const MAX_UNSYNCED_PATHS: usize = 100;
/// Most refused destinations an exit reports.
pub const MAX_BLOCKED: usize = 64;

/// How the program ended and what it used.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Exit {
    /// Exit status or 128 + signal; -1 when the program never ran.
    pub exit_code: i32,
    /// The signal that killed the main process, or 0.
    pub signal: i32,
    /// Killed at the wall-clock limit.
    pub timed_out: bool,
    /// The memory limit was hit.
    pub oom_killed: bool,
    /// The caller went away (or cancelled) and the execution was killed.
    pub cancelled: bool,
    /// Program wall time (whole microseconds on the wire).
    pub wall: Duration,
    /// CPU time of every process, microseconds.
    pub cpu_micros: u64,
    /// Peak memory (`None`: the kernel keeps no peak for the group).
    pub peak_memory_bytes: Option<u64>,
    /// stdout went past the cap.
    pub stdout_truncated: bool,
    /// stderr went past the cap.
    pub stderr_truncated: bool,
    /// What went wrong besides the program itself.
    pub failure: Option<Failure>,
    /// Destinations the network policy refused, most frequent first
    /// (at most [`MAX_BLOCKED`]).
    pub blocked: Vec<Blocked>,
}

impl Exit {
    /// The program never ran because of `failure`.
    pub fn never_ran(failure: Failure) -> Exit {
        Exit { exit_code: -1, failure: Some(failure), ..Exit::default() }
    }

    /// With [`Failure::StorageSync`]: the `/data` paths whose changes were
    /// not stored.
    pub fn unsynced_paths(&self) -> &[String] {
        match &self.failure {
            Some(Failure::StorageSync(paths)) => paths,
            _ => &[],
        }
    }
}

/// A failure of the sandbox, the thread home, a mount or a connector (never
/// of the program). The strings are for logs: the failing step, never data.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Failure {
    /// The program could not be started; the init's failing step.
    Start(String),
    /// The sandbox broke while the program ran; what broke.
    Sandbox(String),
    /// The thread's home could not be restored; nothing ran.
    ThreadMount,
    /// Saving the home would exceed the thread's size limit.
    ThreadTooLarge,
    /// The store failed while saving.
    ThreadSave,
    /// Another execution saved the thread meanwhile.
    ThreadConflict,
    /// The call would create a thread beyond the key's limit; nothing ran.
    ThreadLimit,
    /// A storage mount could not be set up (why, for the log); nothing ran.
    StorageMount(String),
    /// Changes under these `/data` paths could not be stored (at most
    /// [`MAX_UNSYNCED_PATHS`]).
    StorageSync(Vec<String>),
    /// A connector's files, forwarder or names could not be set up (the
    /// failing step, for the log); nothing ran.
    CredentialMount(String),
}

/// One destination the network policy refused.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Blocked {
    /// The DNS name the program resolved the address from, or asked for.
    pub host: Option<String>,
    /// The address; `None` for a name the allowlist refused to resolve.
    pub ip: Option<IpAddr>,
    /// Destination port (53 for a refused name).
    pub port: u16,
    /// `tcp`, `udp` or `dns`.
    pub protocol: String,
    /// Packets (or queries) refused.
    pub count: u64,
}
