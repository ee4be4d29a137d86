//! Warm interpreters: a Python or Node process started inside the finished
//! sandbox while it waits in the pool, as the program's user under the
//! program's filter, and held just before it opens its script. At Go init
//! writes the script, sets the call's limits on it and sends it the call's
//! working directory and environment; the interpreter's hook
//! (`warm_python.py`, `warm_node.js`) applies them and lets the interpreter
//! run the script exactly as a cold start would. One interpreter serves one
//! call: it is the sandbox's program.

use std::io::{self, Read, Write};
use std::os::fd::{AsFd, AsRawFd, RawFd};
use std::os::unix::fs::{symlink, DirBuilderExt, PermissionsExt};
use std::os::unix::net::UnixStream;
use std::path::Path;

use nix::poll::{poll, PollFd, PollFlags, PollTimeout};
use nix::sys::signal::{kill, Signal};
use nix::sys::wait::waitpid;
use nix::unistd::{ForkResult, Pid};

use super::rootfs::HOME;
use super::{program, sys};
use crate::wire::{Go, WarmKind, WarmStart};

/// The interpreter's channel to init, and the call's stdout and stderr
/// (Python's are held apart from fds 1 and 2 until Go); the hooks know
/// them. High, so the interpreter's own descriptors get the numbers they get
/// in a cold start, and the hooks close them before the program runs.
pub const CTRL_FD: RawFd = 500;
const OUT_FD: RawFd = 501;
const ERR_FD: RawFd = 502;
/// Open-files limit while warm (the call's is set at Go).
pub const WARM_OPEN_FILES: u64 = 1024;
/// Where the hooks live while warm (Python's `PYTHONUSERBASE`). Removed at Go.
const WARM_DIR: &str = "/run/warren/.warm";
const PYTHON_HOOK: &str = include_str!("warm_python.py");
const NODE_HOOK: &str = include_str!("warm_node.js");
/// Python versions whose user site (`lib/python3.N`) finds the hook.
const MINORS: std::ops::RangeInclusive<u32> = 6..=20;
/// How long an interpreter may take to start (imports included).
const READY_TIMEOUT_MS: u16 = 10_000;

/// A started interpreter waiting for its call.
pub struct Zygote {
    pid: Pid,
    ctrl: UnixStream,
}

/// Starts `w` in this (finished) sandbox. `None` when it is not waiting
/// ready in time: the sandbox then starts its program cold.
pub fn start(w: &WarmStart, bpf: &[u8]) -> Option<Zygote> {
    let hook_env = install_hook(w.kind).ok()?;
    let (ours, theirs) = UnixStream::pair().ok()?;
    let launch = program::Launch::warm(w, hook_env, theirs.as_raw_fd()).ok()?;
    let (status_r, status_w) = nix::unistd::pipe2(nix::fcntl::OFlag::O_CLOEXEC).ok()?;
    // SAFETY: init is single-threaded, so the child may run arbitrary code.
    let pid = match unsafe { nix::unistd::fork() } {
        Ok(ForkResult::Child) => {
            drop(status_r);
            program::exec(&launch, bpf, status_w)
        }
        Ok(ForkResult::Parent { child }) => child,
        Err(_) => return None,
    };
    drop((theirs, status_w));
    let zygote = Zygote { pid, ctrl: ours };
    let mut errno = [0u8; 4];
    let exec_failed = matches!(std::fs::File::from(status_r).read(&mut errno), Ok(4));
    if exec_failed || !zygote.ready() {
        zygote.stop();
        return None;
    }
    Some(zygote)
}

impl Zygote {
    /// Waits (bounded) for the interpreter's "ready": it reached its script.
    fn ready(&self) -> bool {
        let mut fds = [PollFd::new(self.ctrl.as_fd(), PollFlags::POLLIN)];
        if !matches!(poll(&mut fds, PollTimeout::from(READY_TIMEOUT_MS)), Ok(1)) {
            return false;
        }
        let mut byte = [0u8; 1];
        matches!((&self.ctrl).read(&mut byte), Ok(1)) && byte[0] == b'R'
    }

    /// Gives the interpreter its call: the call's limits, then its working
    /// directory and environment. Returns its pid (the program's now), or
    /// `Err` when it died while waiting — stopped and reaped, so the caller
    /// can start the program cold.
    pub fn deliver(mut self, go: &Go) -> Result<Pid, ()> {
        let limits = set_call_limits(self.pid.as_raw(), go.open_files, go.file_size_bytes, go.max_processes);
        let sent = limits.and_then(|()| self.ctrl.write_all(&message(go)));
        match sent {
            Ok(()) => Ok(self.pid),
            Err(_) => {
                self.stop();
                Err(())
            }
        }
    }

    /// Kills and reaps the interpreter (a call it cannot serve).
    pub fn stop(self) {
        let _ = kill(self.pid, Signal::SIGKILL);
        let _ = waitpid(self.pid, None);
    }
}

/// `cwd NUL name=value NUL ...`, read to its end by the hook.
fn message(go: &Go) -> Vec<u8> {
    let mut msg = HOME.as_bytes().to_vec();
    for (k, v) in &go.env {
        msg.push(0);
        msg.extend_from_slice(k.as_bytes());
        msg.push(b'=');
        msg.extend_from_slice(v.as_bytes());
    }
    msg
}

/// The per-call limits of `pid` (0: this process).
pub fn set_call_limits(pid: libc::pid_t, open_files: u64, file_size: u64, max_processes: u64) -> io::Result<()> {
    sys::set_rlimit_of(pid, libc::RLIMIT_NOFILE, open_files)?;
    sys::set_rlimit_of(pid, libc::RLIMIT_FSIZE, file_size)?;
    sys::set_rlimit_of(pid, libc::RLIMIT_NPROC, max_processes)
}

/// In the interpreter's process, after every descriptor was marked
/// close-on-exec: keeps its channel and the call's output pipes open across
/// exec, at the numbers the hook expects.
pub fn keep_fds(ctrl: RawFd) -> io::Result<()> {
    // Moved above the targets first: `ctrl` may itself be one of them.
    let ctrl = sys::dup_above(ctrl, 64)?;
    sys::dup_to(ctrl, CTRL_FD)?;
    sys::dup_to(crate::wire::STDOUT_FD, OUT_FD)?;
    sys::dup_to(crate::wire::STDERR_FD, ERR_FD)
}

/// Writes `kind`'s hook; returns the variable that makes the interpreter
/// load it.
fn install_hook(kind: WarmKind) -> io::Result<(String, String)> {
    let base = Path::new(WARM_DIR);
    match kind {
        // A user site under PYTHONUSERBASE, one per Python version (links
        // to one directory); `site` runs its .pth file at startup.
        WarmKind::Python => {
            let site = base.join("lib/py/site-packages");
            std::fs::DirBuilder::new().recursive(true).mode(0o755).create(&site)?;
            write_readonly(&site.join("_warren_warm.py"), PYTHON_HOOK)?;
            write_readonly(&site.join("_warren_warm.pth"), "import _warren_warm\n")?;
            for minor in MINORS {
                symlink("py", base.join(format!("lib/python3.{minor}")))?;
            }
            Ok(("PYTHONUSERBASE".into(), WARM_DIR.into()))
        }
        WarmKind::Node => {
            std::fs::DirBuilder::new().mode(0o755).create(base)?;
            let hook = base.join("warm.js");
            write_readonly(&hook, NODE_HOOK)?;
            Ok(("NODE_OPTIONS".into(), format!("--require {}", hook.display())))
        }
    }
}

fn write_readonly(path: &Path, text: &str) -> io::Result<()> {
    std::fs::write(path, text)?;
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o444))
}

/// Removes the hook before the program's script is written (a cold start
/// has only the script in `/run/warren`).
pub fn remove_hook() -> io::Result<()> {
    match std::fs::remove_dir_all(WARM_DIR) {
        Err(e) if e.kind() != io::ErrorKind::NotFound => Err(e),
        _ => Ok(()),
    }
}
