//! How an execution ended, as the gateway's adapters see it (the agent's
//! wire form becomes this in `exec::convert`).

use serde::Serialize;
use utoipa::ToSchema;

/// What went wrong besides the program.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Failure {
    /// The sandbox could not start or keep the program.
    Sandbox,
    /// The thread's home could not be restored; nothing ran.
    ThreadMount,
    /// Saving would exceed the thread's size limit.
    ThreadTooLarge,
    /// The store failed while saving.
    ThreadSave,
    /// Another execution saved the thread meanwhile.
    ThreadConflict,
    /// The call would create a thread beyond the key's limit; nothing ran.
    ThreadLimit,
    /// A storage mount could not be set up; nothing ran.
    StorageMount,
    /// Changes under /data could not all be stored (`Exit::unsynced_paths`).
    StorageSync,
    /// A connector's credentials could not be set up; nothing ran.
    CredentialMount,
}

/// How the program ended and what it used.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Exit {
    /// Exit status; 128 + signal when killed; -1 if it never ran.
    pub exit_code: i32,
    /// Signal that killed the main process, 0 if none.
    pub signal: i32,
    /// Killed at the wall-clock limit.
    pub timed_out: bool,
    /// The memory limit killed a process.
    pub oom_killed: bool,
    /// Program wall time, microseconds.
    pub wall_micros: u64,
    /// CPU time of all its processes, microseconds.
    pub cpu_micros: u64,
    /// Peak memory, bytes (`None`: the node keeps no peak).
    pub peak_memory_bytes: Option<u64>,
    /// stdout hit the cap.
    pub stdout_truncated: bool,
    /// stderr hit the cap.
    pub stderr_truncated: bool,
    /// A failure of the sandbox or the thread home.
    pub failure: Option<Failure>,
    /// With `StorageSync`: the `/data` paths whose changes were not stored.
    pub unsynced_paths: Vec<String>,
    /// Destinations the network policy refused.
    pub blocked_egress: Vec<BlockedEgress>,
}

/// One destination the network policy refused.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, ToSchema)]
pub struct BlockedEgress {
    /// The DNS name the program resolved the address from, or asked for.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub host: Option<String>,
    /// The address; absent for a name the allowlist refused to resolve.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub ip: Option<String>,
    /// Destination port (53 for a refused name).
    pub port: u16,
    /// `tcp`, `udp` or `dns`.
    pub protocol: String,
    /// Packets (or queries) refused.
    pub count: u64,
}
