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
use super::{environ, program, sys};
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

/// Longest "ready" message (the modules that failed, with their errors).
const MAX_READY: usize = 64 * 1024;
/// Longest reason kept for one module that failed, in characters.
const MAX_WHY: usize = 300;

/// A started interpreter waiting for its call.
pub struct Zygote {
    pid: Pid,
    ctrl: UnixStream,
    /// It loaded modules, so at Go it answers whether the call's home
    /// shadows one of them (then the call starts cold).
    asks: bool,
}

/// What failed to load: (module, what the interpreter said).
pub type Failed = Vec<(String, String)>;

/// Starts `w` in this (finished) sandbox. `None` when it is not waiting
/// ready in time: the sandbox then starts its program cold.
pub fn start(w: &WarmStart, bpf: &[libc::sock_filter]) -> Option<(Zygote, Failed)> {
    let hook_env = install_hook(w.kind, &w.modules).ok()?;
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
    let zygote = Zygote { pid, ctrl: ours, asks: !w.modules.is_empty() };
    let mut errno = [0u8; 4];
    let exec_failed = matches!(std::fs::File::from(status_r).read(&mut errno), Ok(4));
    match (exec_failed, zygote.ready()) {
        (false, Some(failed)) => Some((zygote, failed)),
        _ => {
            zygote.stop();
            None
        }
    }
}

impl Zygote {
    /// Waits (bounded) for the interpreter's "ready" line: it reached its
    /// script. It lists the modules that failed to load.
    fn ready(&self) -> Option<Failed> {
        let deadline = std::time::Instant::now() + std::time::Duration::from_millis(READY_TIMEOUT_MS.into());
        let mut line = Vec::new();
        let mut buf = [0u8; 4096];
        while !line.ends_with(b"\n") {
            let left = deadline.saturating_duration_since(std::time::Instant::now()).as_millis().min(u16::MAX.into()) as u16;
            let mut fds = [PollFd::new(self.ctrl.as_fd(), PollFlags::POLLIN)];
            if left == 0 || !matches!(poll(&mut fds, PollTimeout::from(left)), Ok(1)) {
                return None;
            }
            match (&self.ctrl).read(&mut buf) {
                Ok(n) if n > 0 && line.len() + n <= MAX_READY => line.extend_from_slice(&buf[..n]),
                _ => return None,
            }
        }
        parse_ready(&line)
    }

    /// Gives the interpreter its call: the call's limits and the kernel's
    /// view of its environment, then its working directory and environment.
    /// Returns its pid (the program's now), or `Err` when it died while
    /// waiting or could not be handed the environment — stopped and reaped,
    /// Its pid.
    pub fn pid(&self) -> Pid {
        self.pid
    }

    /// so the caller can start the program cold.
    pub fn deliver(mut self, go: &Go) -> Result<Pid, ()> {
        let limits = set_call_limits(self.pid.as_raw(), go.open_files, go.file_size_bytes, go.max_processes);
        let environ = limits.and_then(|()| environ::show(self.pid, &environ::block(&go.env)));
        let sent = environ.and_then(|()| self.ctrl.write_all(&message(go))).and_then(|()| self.ctrl.shutdown(std::net::Shutdown::Write));
        // With modules loaded, it says whether the call's home (mounted
        // now) shadows one of them: 'G' runs warm, anything else cold.
        let go_on = sent.is_ok() && (!self.asks || self.answer() == Some(b'G'));
        match go_on {
            true => Ok(self.pid),
            false => {
                self.stop();
                Err(())
            }
        }
    }

    fn answer(&mut self) -> Option<u8> {
        let mut byte = [0u8; 1];
        matches!(self.ctrl.read(&mut byte), Ok(1)).then_some(byte[0])
    }

    /// Kills and reaps the interpreter (a call it cannot serve).
    pub fn stop(self) {
        let _ = kill(self.pid, Signal::SIGKILL);
        let _ = waitpid(self.pid, None);
    }
}

/// `R` then (module SOH message) entries separated by NUL, then a newline.
fn parse_ready(line: &[u8]) -> Option<Failed> {
    let body = line.strip_prefix(b"R")?.strip_suffix(b"\n")?;
    let text = String::from_utf8_lossy(body);
    // What an image's modules say ends on a Sandbox's status: one short line each.
    let short = |why: &str| why.chars().filter(|c| !c.is_control()).take(MAX_WHY).collect::<String>();
    let failed = text.split('\0').filter(|e| !e.is_empty()).filter_map(|e| e.split_once('\u{1}')).map(|(m, why)| (m.to_string(), short(why))).collect();
    Some(failed)
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
fn install_hook(kind: WarmKind, modules: &[String]) -> io::Result<(String, String)> {
    let base = Path::new(WARM_DIR);
    std::fs::DirBuilder::new().mode(0o755).create(base)?;
    write_readonly(&base.join("modules"), &modules.iter().map(|m| format!("{m}\n")).collect::<String>())?;
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

#[cfg(test)]
mod tests {
    #[test]
    fn the_ready_line_lists_what_failed() {
        assert_eq!(super::parse_ready(b"R\n"), Some(vec![]));
        let line = "R\0numpy\u{1}ModuleNotFoundError: No module named 'numpy'\0x.y\u{1}ImportError: nope\n";
        assert_eq!(
            super::parse_ready(line.as_bytes()),
            Some(vec![("numpy".into(), "ModuleNotFoundError: No module named 'numpy'".into()), ("x.y".into(), "ImportError: nope".into())])
        );
        let long = format!("R\0m\u{1}{}\u{7}\n", "x".repeat(1000));
        assert_eq!(super::parse_ready(long.as_bytes()), Some(vec![("m".into(), "x".repeat(super::MAX_WHY))]));
        assert_eq!(super::parse_ready(b"X\n"), None);
        assert_eq!(super::parse_ready(b"R"), None);
    }
}
