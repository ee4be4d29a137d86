//! The cold start's stub: while a sandbox waits in the pool, init forks the
//! program's process ahead of the call and it drops every privilege exactly
//! as a cold program does (ids, capabilities, `no_new_privs`, limits,
//! seccomp), then waits. At Go init sets the call's limits on it and hands
//! it the call; it execs the interpreter. Fork, privilege drop and the
//! seccomp filter's load (~0.5 ms together) leave the caller's path; what a
//! program sees is the same process it would have been.

use std::io::{self, Read, Write};

use nix::sys::signal::{kill, Signal};
use nix::sys::wait::waitpid;
use nix::unistd::{ForkResult, Pid};

use super::program;
use crate::wire::Go;

/// A locked-down process waiting for its call.
pub struct Stub {
    pid: Pid,
    go: std::fs::File,
    status: std::fs::File,
}

/// Why a stub did not take its call.
pub enum Handoff {
    /// It was gone before the call reached it: start the program cold.
    Lost,
    /// The call reached it and its exec failed.
    Exec(io::Error),
}

/// Forks the stub; `None` when the fork failed (calls then start cold).
pub fn start(bpf: &[libc::sock_filter]) -> Option<Stub> {
    let (go_r, go_w) = nix::unistd::pipe2(nix::fcntl::OFlag::O_CLOEXEC).ok()?;
    let (status_r, status_w) = nix::unistd::pipe2(nix::fcntl::OFlag::O_CLOEXEC).ok()?;
    // SAFETY: init is single-threaded, so the child may run arbitrary code.
    match unsafe { nix::unistd::fork() } {
        Ok(ForkResult::Child) => {
            drop((go_w, status_r));
            program::stub(bpf, go_r, status_w)
        }
        Ok(ForkResult::Parent { child }) => Some(Stub { pid: child, go: std::fs::File::from(go_w), status: std::fs::File::from(status_r) }),
        Err(_) => None,
    }
}

impl Stub {
    /// Its pid.
    pub fn pid(&self) -> Pid {
        self.pid
    }

    /// Gives the stub its call: the call's limits, then the call itself.
    /// Returns its pid (the program's now) once it exec'd.
    pub fn go(mut self, go: &Go) -> Result<Pid, Handoff> {
        let call = match program::stub_call(go) {
            Ok(call) => call,
            Err(e) => {
                self.stop();
                return Err(Handoff::Exec(e));
            }
        };
        let limits = super::warm::set_call_limits(self.pid.as_raw(), go.open_files, go.file_size_bytes, go.max_processes);
        if limits.and_then(|()| self.go.write_all(&call)).is_err() {
            self.stop();
            return Err(Handoff::Lost);
        }
        drop(self.go);
        // Close-on-exec: the status pipe ends empty once it exec'd.
        let mut errno = [0u8; 4];
        match self.status.read(&mut errno) {
            Ok(4) => Err(Handoff::Exec(io::Error::from_raw_os_error(i32::from_ne_bytes(errno)))),
            _ => Ok(self.pid),
        }
    }

    /// Kills and reaps the stub (it could not take the call).
    pub fn stop(self) {
        let _ = kill(self.pid, Signal::SIGKILL);
        let _ = waitpid(self.pid, None);
    }
}
