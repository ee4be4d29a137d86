//! Messages between the node-agent and a sandbox's supervisor (`warren-sandbox`)
//! and init process, framed as `[u32 little-endian length][JSON]` on Unix
//! stream sockets. File descriptors the agent passes to the supervisor:
//!
//! | fd | what |
//! |----|------|
//! | 3  | supervisor control socket ([`SupervisorConfig`] in, [`SupervisorEvent`] out, [`SupervisorCommand`] in) |
//! | 4  | init control socket ([`InitEvent`] out, [`Go`] in), handed on to the sandbox's init |
//! | 5  | write end of the program's stdout pipe |
//! | 6  | write end of the program's stderr pipe |

use std::io::{self, Read, Write};
use std::path::PathBuf;

use serde::{de::DeserializeOwned, Deserialize, Serialize};

/// Supervisor control socket.
pub const SUPERVISOR_FD: i32 = 3;
/// Init control socket.
pub const INIT_FD: i32 = 4;
/// Program stdout (write end).
pub const STDOUT_FD: i32 = 5;
/// Program stderr (write end).
pub const STDERR_FD: i32 = 6;
/// Largest frame accepted (code is at most 1 MiB; JSON escaping can double it).
pub const MAX_FRAME: usize = 8 << 20;

/// Everything the supervisor needs to build one sandbox, sent first on fd 3.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct SupervisorConfig {
    /// Sandbox id (for diagnostics).
    pub id: String,
    /// `cgroup.procs` files the init process is written to before it starts.
    pub cgroup_procs: Vec<PathBuf>,
    /// Host uid of root inside the sandbox; the program's uid 1000 maps to `host_uid + 1`.
    pub host_uid: u32,
    /// Host gid, likewise.
    pub host_gid: u32,
    /// Empty directory the sandbox's root is mounted on (inside its own mount namespace).
    pub mount_dir: PathBuf,
    /// The prepared `host` root to bind read-only as `/` (see
    /// `rootfs::prepare_host_root`); unused with an image, which brings its own.
    pub host_root: PathBuf,
    /// A mounted OCI image root (read-only overlay with Warren's mount
    /// points) to bind as `/`; `None` builds the `host` root from `/usr`.
    #[serde(default)]
    pub image_root: Option<PathBuf>,
    /// Size of `/tmp`.
    pub tmp_bytes: u64,
    /// Host directory (holding an empty `sandbox/`) bound as the sandbox's
    /// `/home`. It stays a mount-propagation slave of the host, so a thread's
    /// home the agent mounts on `<home_dir>/sandbox` appears at
    /// `/home/sandbox` inside (see [`crate::home`]).
    pub home_dir: PathBuf,
    /// Host directory (empty, root-owned) bound read-only as `/data`, a
    /// mount-propagation slave like `/home`: storage mounts the agent makes
    /// on `<data_dir>/<name>` appear at `/data/<name>` inside.
    pub data_dir: PathBuf,
    /// Host directory the sandbox sees as `/run/warren/connectors`: the
    /// agent mounts a call's connector files there (RAM, outside the home).
    pub conn_dir: PathBuf,
    /// An interpreter to start while the sandbox waits (a warm start).
    #[serde(default)]
    pub warm: Option<WarmStart>,
    /// The size the sandbox tells its program (CPUs, memory) for the
    /// limits it is built with; see [`crate::sandbox::views`].
    #[serde(default)]
    pub view: View,
}

pub use crate::sandbox::views::View;

/// An interpreter started inside the finished sandbox before its call, as the
/// program's user under the program's filter, held just before it opens its
/// script (see `sandbox::warm`).
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct WarmStart {
    /// Which interpreter it is (how it is held and handed its call).
    pub kind: WarmKind,
    /// Absolute interpreter path inside the sandbox.
    pub interpreter: String,
    /// The script it will run, in `/run/warren/` (written at Go).
    pub script_name: String,
    /// What it starts with: the variables that shape the interpreter's
    /// startup, equal to those of every call it may serve.
    pub env: Vec<(String, String)>,
    /// Modules it loads before it says ready (the Sandbox's `spec.warm`).
    #[serde(default)]
    pub modules: Vec<String>,
}

/// Supervisor → agent.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum SupervisorEvent {
    /// Init exists with its id maps written (sent before init builds the
    /// filesystem). The agent uses its user namespace to id-map a thread's
    /// home.
    Created {
        /// Host pid of init.
        init_pid: i32,
    },
    /// The sandbox's init process (and so every process of the sandbox) is gone.
    InitExited {
        /// Raw wait status of init.
        status: i32,
    },
    /// The sandbox could not be created.
    Failed {
        /// Step that failed.
        stage: String,
        /// Cause.
        message: String,
    },
}

/// Agent → supervisor.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum SupervisorCommand {
    /// Kill every process of the sandbox now (timeout, cancellation).
    Kill,
}

/// The interpreters that can start warm.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum WarmKind {
    /// CPython 3.8+ (its audit hooks hold it).
    Python,
    /// Node.js (a `--require` preload holds it).
    Node,
}

/// Agent → init: run this program now.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Go {
    /// Absolute interpreter path inside the sandbox.
    pub interpreter: String,
    /// Script file name, written to `/run/warren/`.
    pub script_name: String,
    /// Program text.
    pub code: String,
    /// Full environment of the program (`NAME`, `value`).
    pub env: Vec<(String, String)>,
    /// RLIMIT_NOFILE.
    pub open_files: u64,
    /// RLIMIT_FSIZE.
    pub file_size_bytes: u64,
    /// RLIMIT_NPROC (host uids are per-sandbox, so this is per-sandbox too).
    pub max_processes: u64,
    /// What `/home/sandbox` is.
    pub home: Home,
    /// Hand the program to the warm interpreter (the agent checked that it
    /// is the same interpreter with the same startup environment); false
    /// stops it and starts the program cold.
    #[serde(default)]
    pub warm: bool,
    /// The size to tell the program when the call's limits differ from
    /// those the sandbox was built with (`None`: as built).
    #[serde(default)]
    pub view: Option<View>,
    /// A live sandbox: init runs no program; it answers [`InitEvent::Live`]
    /// and then starts processes on [`LiveCommand`]s until the agent lets go
    /// (see `sandbox::live`). `interpreter`, `script_name` and `code` are unused.
    #[serde(default)]
    pub live: bool,
}

/// Agent → init of a live sandbox.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum LiveCommand {
    /// Start a process. Its stdin, stdout and stderr travel with the frame
    /// as `SCM_RIGHTS`, in that order (a terminal's one end three times).
    Spawn(Spawn),
    /// Sends `signal` to the process group of process `id` (each process
    /// leads its own group: a command and what it started).
    Signal {
        /// The agent's id of the process.
        id: u64,
        /// Signal number (SIGINT, SIGTERM, SIGKILL, SIGHUP, SIGQUIT, SIGCONT, SIGSTOP, SIGWINCH, SIGUSR1/2).
        signal: i32,
    },
}

/// One process of a live sandbox.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Spawn {
    /// The agent's id of it (unique in the sandbox).
    pub id: u64,
    /// Program and arguments; a program without `/` is looked up in `PATH` of `env`.
    pub argv: Vec<String>,
    /// Its whole environment.
    pub env: Vec<(String, String)>,
    /// Absolute working directory inside the sandbox.
    pub cwd: String,
    /// Its stdio is a terminal: it leads a new session with it as the controlling terminal.
    pub tty: bool,
}

/// The signals a live sandbox's process may be sent.
pub const LIVE_SIGNALS: &[i32] = &[libc::SIGHUP, libc::SIGINT, libc::SIGQUIT, libc::SIGKILL, libc::SIGUSR1, libc::SIGUSR2, libc::SIGTERM, libc::SIGCONT, libc::SIGSTOP, libc::SIGWINCH];

/// The program's home directory.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum Home {
    /// A fresh tmpfs of this many bytes, mounted by init (no thread).
    Tmpfs {
        /// Size limit.
        bytes: u64,
    },
    /// The agent already mounted a thread's home on the host side; it has
    /// propagated into the sandbox.
    Mounted,
}

/// Init → agent.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum InitEvent {
    /// Namespaces, mounts and filter are ready; waiting for [`Go`].
    Ready {
        /// The warm interpreter asked for is started and waiting.
        warm: bool,
        /// Its modules that did not load: (module, what it said).
        #[serde(default)]
        failed: Vec<(String, String)>,
    },
    /// The main process ended.
    Exited {
        /// Exit status, or 128 + signal.
        code: i32,
        /// Killing signal, 0 if it exited.
        signal: i32,
        /// A warm interpreter ran the program.
        #[serde(default)]
        warm: bool,
    },
    /// The live sandbox is up and takes [`LiveCommand`]s.
    Live,
    /// A live sandbox's process started.
    Spawned {
        /// The agent's id.
        id: u64,
        /// Its pid inside the sandbox.
        pid: i32,
    },
    /// A live sandbox's process could not start (nothing of it ran).
    SpawnFailed {
        /// The agent's id.
        id: u64,
        /// Why, for its caller.
        message: String,
    },
    /// A live sandbox's process ended (what it started may still run).
    ProcessExited {
        /// The agent's id.
        id: u64,
        /// Exit status, or 128 + signal.
        code: i32,
        /// Killing signal, 0 if it exited.
        signal: i32,
    },
    /// Setup or exec failed; nothing of the program ran.
    Failed {
        /// Step that failed.
        stage: String,
        /// Cause.
        message: String,
    },
}

/// Writes one frame.
pub fn write_frame<T: Serialize>(w: &mut impl Write, msg: &T) -> io::Result<()> {
    let body = serde_json::to_vec(msg).map_err(io::Error::other)?;
    let mut buf = Vec::with_capacity(4 + body.len());
    buf.extend_from_slice(&(body.len() as u32).to_le_bytes());
    buf.extend_from_slice(&body);
    w.write_all(&buf)
}

/// Reads one frame; `Ok(None)` on a clean end of stream.
pub fn read_frame<T: DeserializeOwned>(r: &mut impl Read) -> io::Result<Option<T>> {
    let mut len = [0u8; 4];
    match r.read_exact(&mut len) {
        Ok(()) => {}
        Err(e) if e.kind() == io::ErrorKind::UnexpectedEof => return Ok(None),
        Err(e) => return Err(e),
    }
    let len = u32::from_le_bytes(len) as usize;
    if len > MAX_FRAME {
        return Err(io::Error::new(io::ErrorKind::InvalidData, "frame too large"));
    }
    let mut body = vec![0u8; len];
    r.read_exact(&mut body)?;
    decode(&body).map(Some)
}

/// Decodes a frame body.
pub fn decode<T: DeserializeOwned>(body: &[u8]) -> io::Result<T> {
    serde_json::from_slice(body).map_err(|e| io::Error::new(io::ErrorKind::InvalidData, e))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn frames_round_trip() {
        let mut buf = Vec::new();
        write_frame(&mut buf, &InitEvent::Exited { code: 3, signal: 0, warm: false }).unwrap();
        write_frame(&mut buf, &SupervisorCommand::Kill).unwrap();
        let mut r = &buf[..];
        assert_eq!(read_frame::<InitEvent>(&mut r).unwrap(), Some(InitEvent::Exited { code: 3, signal: 0, warm: false }));
        assert_eq!(read_frame::<SupervisorCommand>(&mut r).unwrap(), Some(SupervisorCommand::Kill));
        assert_eq!(read_frame::<SupervisorCommand>(&mut r).unwrap(), None);
    }

    #[test]
    fn oversize_frames_are_refused() {
        let mut buf = ((MAX_FRAME + 1) as u32).to_le_bytes().to_vec();
        buf.extend_from_slice(b"{}");
        assert!(read_frame::<InitEvent>(&mut &buf[..]).is_err());
    }
}
