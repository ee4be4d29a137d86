//! Starting `warren-sandbox` with its four descriptors.
//!
//! The descriptors are inherited at whatever numbers they have, named in
//! [`FDS_ENV`], and the supervisor moves them to 3–6 itself. That keeps the
//! spawn free of `pre_exec`, so the standard library can use `posix_spawn`
//! (vfork semantics) instead of `fork`: copying the multi-threaded agent's
//! page tables for every sandbox was about a tenth of the node's CPU under load.

use std::os::fd::{AsRawFd, OwnedFd};
use std::path::Path;
use std::process::{Command, Stdio};
use std::sync::Mutex;

use crate::wire;

/// Environment variable naming the inherited descriptors, in fd order 3–6.
pub const FDS_ENV: &str = "WARREN_SANDBOX_FDS";

/// The agent's ends handed to one supervisor, in fd order 3, 4, 5, 6.
pub struct SupervisorFds {
    /// Becomes fd 3.
    pub supervisor: OwnedFd,
    /// Becomes fd 4.
    pub init: OwnedFd,
    /// Becomes fd 5.
    pub stdout: OwnedFd,
    /// Becomes fd 6.
    pub stderr: OwnedFd,
}

impl SupervisorFds {
    fn raw(&self) -> [i32; 4] {
        [self.supervisor.as_raw_fd(), self.init.as_raw_fd(), self.stdout.as_raw_fd(), self.stderr.as_raw_fd()]
    }
}

/// A command that starts `binary` with an environment holding only
/// [`FDS_ENV`], stdin/stdout on /dev/null and stderr inherited (so a crash of
/// the supervisor lands in the agent's log, never in the program's output).
/// Spawn it inside [`with_fds_inherited`].
pub fn supervisor_command(binary: &Path, fds: &SupervisorFds) -> Command {
    let names: Vec<String> = fds.raw().iter().map(i32::to_string).collect();
    let mut cmd = Command::new(binary);
    cmd.env_clear().env(FDS_ENV, names.join(",")).stdin(Stdio::null()).stdout(Stdio::null()).stderr(Stdio::inherit());
    cmd
}

/// Only one spawn at a time may have descriptors marked inheritable, or a
/// concurrent spawn would receive another sandbox's pipes.
static SPAWN: Mutex<()> = Mutex::new(());

/// Runs `spawn` with the four descriptors inheritable across exec, then marks
/// them close-on-exec again.
pub fn with_fds_inherited<R>(fds: &SupervisorFds, spawn: impl FnOnce() -> R) -> std::io::Result<R> {
    let _guard = SPAWN.lock().unwrap_or_else(|p| p.into_inner());
    let raw = fds.raw();
    let set = |flags| -> std::io::Result<()> {
        for fd in raw {
            nix::fcntl::fcntl(
                // SAFETY: `fds` owns these descriptors for the whole call.
                unsafe { std::os::fd::BorrowedFd::borrow_raw(fd) },
                nix::fcntl::FcntlArg::F_SETFD(flags),
            )?;
        }
        Ok(())
    };
    set(nix::fcntl::FdFlag::empty())?;
    let r = spawn();
    set(nix::fcntl::FdFlag::FD_CLOEXEC)?;
    Ok(r)
}

/// In the supervisor, first thing: moves the inherited descriptors named in
/// [`FDS_ENV`] to 3–6. Single-threaded, before anything else is opened.
pub fn adopt_fds() -> std::io::Result<()> {
    let bad = || std::io::Error::new(std::io::ErrorKind::InvalidInput, format!("{FDS_ENV} must name four descriptors"));
    let value = std::env::var(FDS_ENV).map_err(|_| bad())?;
    std::env::remove_var(FDS_ENV);
    let parsed: Vec<i32> = value.split(',').map(|s| s.parse().map_err(|_| bad())).collect::<Result<_, _>>()?;
    let sources: [i32; 4] = parsed.try_into().map_err(|_| bad())?;
    let targets = [wire::SUPERVISOR_FD, wire::INIT_FD, wire::STDOUT_FD, wire::STDERR_FD];
    // Move every source above the targets first, so a source that already
    // sits on 3..=6 is not clobbered by an earlier dup2.
    let mut high = [0; 4];
    for (slot, src) in high.iter_mut().zip(sources) {
        // SAFETY: fcntl on a descriptor number; an invalid one yields EBADF.
        let fd = unsafe { libc::fcntl(src, libc::F_DUPFD_CLOEXEC, 64) };
        if fd < 0 {
            return Err(std::io::Error::last_os_error());
        }
        *slot = fd;
    }
    for src in sources.into_iter().filter(|s| !targets.contains(s)) {
        // SAFETY: closing an inherited descriptor nothing else refers to.
        unsafe { libc::close(src) };
    }
    for (target, src) in targets.into_iter().zip(high) {
        // SAFETY: dup2 onto a fixed number, then close the temporary copy.
        if unsafe { libc::dup2(src, target) } < 0 {
            return Err(std::io::Error::last_os_error());
        }
        // SAFETY: `src` is our temporary copy.
        unsafe { libc::close(src) };
    }
    Ok(())
}
