//! The supervisor: creates init in fresh namespaces, maps its ids, places it
//! in the sandbox's cgroups, then waits, killing init when told to or when the
//! agent goes away.

use std::fs;
use std::io::{self, Write};
use std::os::fd::{AsFd, FromRawFd, OwnedFd};
use std::os::unix::net::UnixStream;

use nix::poll::{poll, PollFd, PollFlags, PollTimeout};
use nix::sys::signal::{kill, Signal};
use nix::sys::wait::waitpid;
use nix::unistd::Pid;

use super::{init, sys};
use crate::wire::{self, SupervisorCommand, SupervisorConfig, SupervisorEvent};

const NAMESPACES: libc::c_int = libc::CLONE_NEWUSER
    | libc::CLONE_NEWPID
    | libc::CLONE_NEWNS
    | libc::CLONE_NEWNET
    | libc::CLONE_NEWIPC
    | libc::CLONE_NEWUTS;

/// The supervisor, in a child the spawner forked with its descriptors at 3–6.
pub(super) fn supervisor_main() -> ! {
    // SAFETY: fstat only inspects the descriptor; an invalid one yields EBADF.
    let fd3 = unsafe { std::os::fd::BorrowedFd::borrow_raw(wire::SUPERVISOR_FD) };
    if nix::sys::stat::fstat(fd3).map(|s| s.st_mode & libc::S_IFMT != libc::S_IFSOCK).unwrap_or(true) {
        eprintln!("warren-sandbox is started by warren-node-agent; it is not meant to be run by hand");
        sys::exit_now(2);
    }
    // SAFETY: the agent hands us fd 3 as our end of a socketpair; nothing else owns it.
    let mut ctrl = unsafe { UnixStream::from_raw_fd(wire::SUPERVISOR_FD) };
    match run(&mut ctrl) {
        Ok(status) => {
            let _ = wire::write_frame(&mut ctrl, &SupervisorEvent::InitExited { status });
            sys::exit_now(0)
        }
        Err((stage, e)) => {
            let event = SupervisorEvent::Failed { stage: stage.into(), message: e.to_string() };
            let _ = wire::write_frame(&mut ctrl, &event);
            sys::exit_now(1)
        }
    }
}

type StepResult<T> = Result<T, (&'static str, io::Error)>;

fn step<T, E: Into<io::Error>>(stage: &'static str, r: Result<T, E>) -> StepResult<T> {
    r.map_err(|e| (stage, e.into()))
}

fn run(ctrl: &mut UnixStream) -> StepResult<i32> {
    let cfg: SupervisorConfig = match step("read config", wire::read_frame(ctrl))? {
        Some(cfg) => cfg,
        None => return Err(("read config", io::Error::from(io::ErrorKind::UnexpectedEof))),
    };
    // Supplementary groups inherited from the agent would still grant host
    // group access inside the sandbox (they just show as "nogroup").
    step("setgroups", nix::unistd::setgroups(&[]))?;
    let (sync_r, sync_w) = step("pipe", nix::unistd::pipe2(nix::fcntl::OFlag::O_CLOEXEC))?;
    let pid = step("clone", sys::fork_into_namespaces(NAMESPACES))?;
    if pid == 0 {
        drop(sync_w);
        init::run(&cfg, sync_r)
    }
    drop(sync_r);
    let child = Pid::from_raw(pid);
    let created = |()| step("report", wire::write_frame(ctrl, &SupervisorEvent::Created { init_pid: pid }));
    if let Err(e) = prepare_init(pid, &cfg).and_then(created).and_then(|()| step("sync", write_byte(sync_w))) {
        let _ = kill(child, Signal::SIGKILL);
        let _ = waitpid(child, None);
        return Err(e);
    }
    // Init holds the program's pipes and its control socket now.
    for fd in [wire::INIT_FD, wire::STDOUT_FD, wire::STDERR_FD] {
        let _ = nix::unistd::close(fd);
    }
    supervise(ctrl, child)
}

fn write_byte(fd: OwnedFd) -> io::Result<()> {
    fs::File::from(fd).write_all(&[1])
}

/// Maps root and uid 1000 inside to two unprivileged host ids, places init in
/// the sandbox cgroups and, where allowed, shields it from the OOM killer (the
/// program is not shielded: it resets its own score).
fn prepare_init(pid: libc::pid_t, cfg: &SupervisorConfig) -> StepResult<()> {
    let proc_dir = format!("/proc/{pid}");
    let uid_map = format!("0 {} 1\n1000 {} 1\n", cfg.host_uid, cfg.host_uid + 1);
    let gid_map = format!("0 {} 1\n1000 {} 1\n", cfg.host_gid, cfg.host_gid + 1);
    step("uid_map", fs::write(format!("{proc_dir}/uid_map"), uid_map))?;
    step("setgroups", fs::write(format!("{proc_dir}/setgroups"), "deny"))?;
    step("gid_map", fs::write(format!("{proc_dir}/gid_map"), gid_map))?;
    for procs in &cfg.cgroup_procs {
        step("join cgroup", fs::write(procs, pid.to_string()))?;
    }
    // Best effort: needs CAP_SYS_RESOURCE, which some hosts withhold even from
    // root. If init is OOM-killed anyway, the pid namespace dies with it and
    // the agent reports the OOM kill; nothing leaks.
    let _ = fs::write(format!("{proc_dir}/oom_score_adj"), "-1000");
    Ok(())
}

fn supervise(ctrl: &mut UnixStream, child: Pid) -> StepResult<i32> {
    // SAFETY: pidfd_open returns a fresh descriptor that we own from here on.
    let pidfd = unsafe { OwnedFd::from_raw_fd(step("pidfd_open", sys::pidfd_open(child.as_raw()))?) };
    let mut agent_gone = false;
    loop {
        let ctrl_fd = ctrl.as_fd();
        let mut fds = vec![PollFd::new(pidfd.as_fd(), PollFlags::POLLIN)];
        if !agent_gone {
            fds.push(PollFd::new(ctrl_fd, PollFlags::POLLIN));
        }
        match poll(&mut fds, PollTimeout::NONE) {
            Err(nix::errno::Errno::EINTR) => continue,
            Err(e) => return Err(("poll", e.into())),
            Ok(_) => {}
        }
        let init_done = fds[0].revents().is_some_and(|r| !r.is_empty());
        let ctrl_ready = fds.get(1).and_then(|f| f.revents()).is_some_and(|r| !r.is_empty());
        if init_done {
            return reap(child);
        }
        if ctrl_ready {
            // Any command, EOF or garbage means the same: kill the sandbox.
            match wire::read_frame::<SupervisorCommand>(ctrl) {
                Ok(Some(SupervisorCommand::Kill)) => {}
                _ => agent_gone = true,
            }
            let _ = kill(child, Signal::SIGKILL);
        }
    }
}

fn reap(child: Pid) -> StepResult<i32> {
    let mut status: libc::c_int = 0;
    loop {
        // SAFETY: waitpid on our own child with a valid out-pointer.
        let r = unsafe { libc::waitpid(child.as_raw(), &mut status, 0) };
        if r >= 0 {
            return Ok(status);
        }
        let e = io::Error::last_os_error();
        if e.raw_os_error() != Some(libc::EINTR) {
            return Err(("waitpid", e));
        }
    }
}
