//! Building the `warren-sandbox` command with its four descriptors in place.

use std::os::fd::{AsRawFd, OwnedFd};
use std::os::unix::process::CommandExt;
use std::path::Path;
use std::process::{Command, Stdio};

use crate::wire;

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

/// A command that starts `binary` with `fds` as descriptors 3–6, an empty
/// environment, stdin/stdout on /dev/null and stderr inherited (so a crash
/// of the supervisor lands in the agent's log, never in the program's output).
///
/// `fds` must stay alive until the command has been spawned.
pub fn supervisor_command(binary: &Path, fds: &SupervisorFds) -> Command {
    let sources = [fds.supervisor.as_raw_fd(), fds.init.as_raw_fd(), fds.stdout.as_raw_fd(), fds.stderr.as_raw_fd()];
    let mut cmd = Command::new(binary);
    cmd.env_clear().stdin(Stdio::null()).stdout(Stdio::null()).stderr(Stdio::inherit());
    // SAFETY: the closure runs between fork and exec and only calls fcntl and
    // dup2, which are async-signal-safe; it allocates nothing.
    unsafe {
        cmd.pre_exec(move || {
            // Move every source above the targets first, so a source that
            // already sits on 3..=6 is not clobbered by an earlier dup2.
            let mut high = [0; 4];
            for (slot, src) in high.iter_mut().zip(sources) {
                let fd = libc::fcntl(src, libc::F_DUPFD, 64);
                if fd < 0 {
                    return Err(std::io::Error::last_os_error());
                }
                *slot = fd;
            }
            for (target, src) in [wire::SUPERVISOR_FD, wire::INIT_FD, wire::STDOUT_FD, wire::STDERR_FD].into_iter().zip(high) {
                if libc::dup2(src, target) < 0 {
                    return Err(std::io::Error::last_os_error());
                }
                libc::close(src);
            }
            Ok(())
        });
    }
    cmd
}
