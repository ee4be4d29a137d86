//! Init: pid 1 of the sandbox. Builds the filesystem while the sandbox sits in
//! the pool, then on `Go` writes the program, forks it, reaps every process
//! until the main one ends, kills and reaps whatever is left in the pid
//! namespace, reports, and exits.

use std::io::{self, Read};
use std::os::fd::{FromRawFd, OwnedFd};
use std::os::unix::net::UnixStream;

use nix::sys::wait::{waitpid, WaitStatus};
use nix::unistd::{ForkResult, Pid};

use super::{live, program, rootfs, stub, sys, views, warm};
use crate::wire::{self, Go, Home, InitEvent, SupervisorConfig};

/// Runs init; never returns.
pub fn run(cfg: &SupervisorConfig, sync: OwnedFd) -> ! {
    // Die with the supervisor. Had it died before this prctl, the sync read
    // below sees EOF (getppid() cannot tell: it is 0 in a new pid namespace).
    if sys::set_parent_death_signal().is_err() {
        sys::exit_now(1);
    }
    // The supervisor's control socket must not be reachable from the sandbox,
    // nor the agent's own stderr (inherited as fd 2): init reports over fd 4.
    let _ = nix::unistd::close(wire::SUPERVISOR_FD);
    if let Ok(null) = std::fs::OpenOptions::new().read(true).write(true).open("/dev/null") {
        let _ = nix::unistd::dup2_stdin(&null);
        let _ = nix::unistd::dup2_stdout(&null);
        let _ = nix::unistd::dup2_stderr(&null);
    }
    let mut byte = [0u8; 1];
    if !matches!(std::fs::File::from(sync).read(&mut byte), Ok(1)) {
        sys::exit_now(1);
    }
    // SAFETY: fd 4 is the init control socket passed down by the supervisor; only we use it.
    let mut ctrl = unsafe { UnixStream::from_raw_fd(wire::INIT_FD) };
    let facts = match setup(cfg) {
        Ok(facts) => facts,
        Err((stage, e)) => fail(&mut ctrl, stage, &e),
    };
    let (zygote, failed) = match cfg.warm.as_ref().and_then(|w| warm::start(w, crate::seccomp::handed())) {
        Some((z, failed)) => (Some(z), failed),
        None => (None, Vec::new()),
    };
    // Without a warm interpreter the program's process is forked and
    // locked down now, off the call's path.
    let stub = if zygote.is_none() { stub::start(crate::seccomp::handed()) } else { None };
    if wire::write_frame(&mut ctrl, &InitEvent::Ready { warm: zygote.is_some(), failed }).is_err() {
        sys::exit_now(1);
    }
    let go: Go = match wire::read_frame(&mut ctrl) {
        Ok(Some(go)) => go,
        // The agent discarded this sandbox.
        _ => sys::exit_now(0),
    };
    if go.live {
        go_live(ctrl, &go, cfg, Waiting { zygote, stub }, &facts)
    }
    run_program(&mut ctrl, &go, cfg, Waiting { zygote, stub }, &facts)
}

/// A live sandbox: what waited for a program is stopped, the home and the
/// size are the call's, and init serves processes (see [`live`]).
fn go_live(mut ctrl: UnixStream, go: &Go, cfg: &SupervisorConfig, waiting: Waiting, facts: &views::NodeFacts) -> ! {
    if let Home::Tmpfs { bytes } = go.home {
        if let Err(e) = rootfs::mount_home_tmpfs(bytes) {
            fail(&mut ctrl, "home", &e);
        }
    }
    if let Some(view) = &go.view {
        if let Err(e) = resize(facts, &cfg.view, view, &waiting) {
            fail(&mut ctrl, "views", &e);
        }
    }
    if let Some(z) = waiting.zygote {
        z.stop();
    }
    if let Some(s) = waiting.stub {
        s.stop();
    }
    if cfg.warm.is_some() {
        if let Err(e) = warm::remove_hook() {
            fail(&mut ctrl, "script", &e);
        }
    }
    // Every process's stdio is its own, passed by the agent.
    let _ = nix::unistd::close(wire::STDOUT_FD);
    let _ = nix::unistd::close(wire::STDERR_FD);
    live::serve(ctrl, go, crate::seccomp::handed())
}

/// What waits for the call: a warm interpreter, or the cold start's stub.
struct Waiting {
    zygote: Option<warm::Zygote>,
    stub: Option<stub::Stub>,
}

fn fail(ctrl: &mut UnixStream, stage: &str, e: &dyn std::fmt::Display) -> ! {
    let _ = wire::write_frame(ctrl, &InitEvent::Failed { stage: stage.into(), message: e.to_string() });
    sys::exit_now(1)
}

fn setup(cfg: &SupervisorConfig) -> Result<views::NodeFacts, (&'static str, io::Error)> {
    let s = |stage: &'static str| move |e: nix::Error| (stage, io::Error::from(e));
    nix::unistd::setresgid(0.into(), 0.into(), 0.into()).map_err(s("setresgid"))?;
    nix::unistd::setresuid(0.into(), 0.into(), 0.into()).map_err(s("setresuid"))?;
    // Now inside the sandbox cgroups (the supervisor moved us): root the cgroup
    // namespace here so /proc/self/cgroup shows nothing of the host.
    nix::sched::unshare(nix::sched::CloneFlags::CLONE_NEWCGROUP).map_err(s("unshare cgroup"))?;
    sys::set_dumpable(false).map_err(|e| ("dumpable", e))?;
    nix::unistd::sethostname("sandbox").map_err(s("sethostname"))?;
    sys::loopback_up().map_err(|e| ("loopback", e))?;
    // The views are written for `cfg.view` as they are built.
    let facts = rootfs::build(cfg).map_err(|e| ("rootfs", io::Error::other(e.to_string())))?;
    // What waits for the call (stub, warm interpreter) is forked after
    // this, so it runs on these CPUs too.
    views::set_affinity(&[Pid::from_raw(0)], &cfg.view.cpus).map_err(|e| ("affinity", e))?;
    Ok(facts)
}

fn run_program(ctrl: &mut UnixStream, go: &Go, cfg: &SupervisorConfig, waiting: Waiting, facts: &views::NodeFacts) -> ! {
    if let Home::Tmpfs { bytes } = go.home {
        if let Err(e) = rootfs::mount_home_tmpfs(bytes) {
            fail(ctrl, "home", &e);
        }
    }
    // Only a sandbox built for a warm start has the hook's files.
    if cfg.warm.is_some() {
        if let Err(e) = warm::remove_hook() {
            fail(ctrl, "script", &e);
        }
    }
    if let Err(e) = rootfs::install_script(&go.script_name, &go.code) {
        fail(ctrl, "script", &e);
    }
    if let Some(view) = &go.view {
        if let Err(e) = resize(facts, &cfg.view, view, &waiting) {
            fail(ctrl, "views", &e);
        }
    }
    let warm = match waiting.zygote {
        Some(z) if go.warm => z.deliver(go).ok(),
        Some(z) => {
            z.stop();
            None
        }
        None => None,
    };
    let child = match (warm, waiting.stub) {
        (Some(pid), _) => pid,
        (None, Some(stub)) => match stub.go(go) {
            Ok(pid) => pid,
            Err(stub::Handoff::Exec(e)) => fail(ctrl, "exec", &e),
            Err(stub::Handoff::Lost) => start_cold(ctrl, go, crate::seccomp::handed()),
        },
        // No warm interpreter (or it died waiting) and no stub: the
        // program starts cold.
        (None, None) => start_cold(ctrl, go, crate::seccomp::handed()),
    };
    let warm = warm.is_some();
    // Only the program (and what it starts) may hold the output pipes, so the
    // agent sees EOF exactly when the sandbox is done.
    let _ = nix::unistd::close(wire::STDOUT_FD);
    let _ = nix::unistd::close(wire::STDERR_FD);
    let (code, signal) = reap_until(child);
    // Everything the program left behind goes before the report, so the
    // agent can answer on the report: every output pipe is closed and the
    // cgroup's usage is final. Tearing down the namespaces (what init's own
    // exit does: a mount namespace waits for an RCU grace period) is then
    // off the caller's path.
    let _ = nix::sys::signal::kill(Pid::from_raw(-1), nix::sys::signal::Signal::SIGKILL);
    reap_all();
    let _ = wire::write_frame(ctrl, &InitEvent::Exited { code, signal, warm });
    sys::exit_now(0)
}

/// Reaps children until there are none (each was sent SIGKILL).
fn reap_all() {
    loop {
        match waitpid(None, None) {
            Ok(_) | Err(nix::errno::Errno::EINTR) => continue,
            Err(_) => return,
        }
    }
}

/// Forks the program and execs its interpreter; reports a failed exec.
fn start_cold(ctrl: &mut UnixStream, go: &Go, bpf: &[libc::sock_filter]) -> Pid {
    let launch = match program::Launch::new(go) {
        Ok(l) => l,
        Err(e) => fail(ctrl, "exec", &e),
    };
    let (status_r, status_w) = match nix::unistd::pipe2(nix::fcntl::OFlag::O_CLOEXEC) {
        Ok(p) => p,
        Err(e) => fail(ctrl, "pipe", &e),
    };
    // SAFETY: init is single-threaded, so the child may run arbitrary code.
    let child = match unsafe { nix::unistd::fork() } {
        Ok(ForkResult::Child) => {
            drop(status_r);
            program::exec(&launch, bpf, status_w)
        }
        Ok(ForkResult::Parent { child }) => child,
        Err(e) => fail(ctrl, "fork", &e),
    };
    drop(status_w);
    let mut errno = [0u8; 4];
    if let Ok(4) = std::fs::File::from(status_r).read(&mut errno) {
        let e = io::Error::from_raw_os_error(i32::from_ne_bytes(errno));
        fail(ctrl, "exec", &e);
    }
    child
}

/// Tells the program the call's size, which differs from the one the
/// sandbox was built with: the views, and the CPUs of init (a cold start
/// forks from it) and of what waits for the call (every thread of a warm
/// interpreter).
fn resize(facts: &views::NodeFacts, built: &views::View, call: &views::View, waiting: &Waiting) -> io::Result<()> {
    views::rewrite_views(facts, built, call)?;
    if call.cpus == built.cpus {
        return Ok(());
    }
    let mut tasks = vec![Pid::from_raw(0)];
    if let Some(stub) = &waiting.stub {
        tasks.push(stub.pid());
    }
    if let Some(zygote) = &waiting.zygote {
        tasks.extend(views::threads_of(zygote.pid()));
    }
    views::set_affinity(&tasks, &call.cpus)
}

/// Reaps every child (orphans re-parent to us) until `main` ends.
fn reap_until(main: Pid) -> (i32, i32) {
    loop {
        match waitpid(None, None) {
            Ok(WaitStatus::Exited(pid, code)) if pid == main => return (code, 0),
            Ok(WaitStatus::Signaled(pid, sig, _)) if pid == main => return (128 + sig as i32, sig as i32),
            Ok(_) | Err(nix::errno::Errno::EINTR) => continue,
            Err(_) => return (-1, 0),
        }
    }
}
