//! The program process: drops every privilege, then execs the interpreter.
//!
//! Order matters and is the usual one (youki, runc): stdio and cwd first
//! (need nothing), rlimits, OOM score, then capabilities: the bounding set is
//! dropped while we still hold CAP_SETPCAP, ids change (which empties the
//! permitted set), leftovers are cleared, `no_new_privs` is set (required for
//! an unprivileged seccomp filter and blocks setuid binaries), inherited
//! descriptors are marked close-on-exec, and the seccomp filter goes last so
//! that nothing above needs a syscall the filter refuses.

use std::ffi::CString;
use std::io;
use std::os::fd::{OwnedFd, RawFd};
use std::path::Path;

use nix::sys::resource::{setrlimit, Resource};

use super::rootfs::{HOME, SANDBOX_UID, SCRIPT_DIR};
use super::sys;
use crate::wire::{self, Go, WarmKind, WarmStart};

/// Everything `execve` needs, allocated before fork.
pub struct Launch {
    interpreter: CString,
    argv: Vec<CString>,
    env: Vec<CString>,
    open_files: u64,
    file_size: u64,
    max_processes: u64,
    /// A warm interpreter's kind and channel to init (see [`Launch::warm`]).
    warm: Option<(WarmKind, RawFd)>,
}

impl Launch {
    /// Prepares the argument and environment vectors.
    pub fn new(go: &Go) -> io::Result<Launch> {
        let c = |s: &str| CString::new(s).map_err(|_| io::Error::new(io::ErrorKind::InvalidInput, "NUL byte"));
        let script = script_path(go)?;
        let script = script.as_str();
        Ok(Launch {
            interpreter: c(&go.interpreter)?,
            argv: vec![c(&go.interpreter)?, c(script)?],
            env: go.env.iter().map(|(k, v)| c(&format!("{k}={v}"))).collect::<io::Result<_>>()?,
            open_files: go.open_files,
            file_size: go.file_size_bytes,
            max_processes: go.max_processes,
            warm: None,
        })
    }

    /// The warm interpreter's start: its script does not exist yet, the
    /// per-call limits come at Go (`warm::Zygote::deliver`), `hook` makes it
    /// load its hook, and `ctrl` is its channel to init (kept as fd
    /// [`warm::CTRL_FD`](super::warm::CTRL_FD)).
    pub fn warm(w: &WarmStart, hook: (String, String), ctrl: RawFd) -> io::Result<Launch> {
        let mut env = w.env.clone();
        env.push(hook);
        let go = Go {
            interpreter: w.interpreter.clone(),
            script_name: w.script_name.clone(),
            code: String::new(),
            env,
            open_files: 0,
            file_size_bytes: 0,
            max_processes: 0,
            home: wire::Home::Mounted,
            warm: true,
            view: None,
            live: false,
        };
        Ok(Launch { warm: Some((w.kind, ctrl)), ..Launch::new(&go)? })
    }

}

/// Sets up the process and execs; on failure reports errno on `status` and exits 127.
pub fn exec(launch: &Launch, bpf: &[libc::sock_filter], status: OwnedFd) -> ! {
    let err = setup_and_exec(launch, bpf);
    let errno = err.raw_os_error().unwrap_or(libc::EIO);
    let _ = nix::unistd::write(&status, &errno.to_ne_bytes());
    sys::exit_now(127)
}

fn setup_and_exec(l: &Launch, bpf: &[libc::sock_filter]) -> io::Error {
    match prepare(l, bpf) {
        Err(e) => e,
        Ok(()) => match nix::unistd::execve(&l.interpreter, &l.argv, &l.env) {
            Err(e) => e.into(),
        },
    }
}

/// `RLIMIT_MEMLOCK` of every program.
const MEMLOCK_BYTES: u64 = 64 * 1024;

fn prepare(l: &Launch, bpf: &[libc::sock_filter]) -> io::Result<()> {
    use nix::unistd::{dup2_stderr, dup2_stdout};
    match l.warm {
        // What Python prints while it starts is nobody's output; it takes
        // the call's pipes at Go. (Node cannot move descriptors: it holds
        // them from the start, and its startup prints nothing.)
        Some((WarmKind::Python, _)) => {
            let devnull = std::fs::OpenOptions::new().read(true).write(true).open("/dev/null")?;
            nix::unistd::dup2_stdin(&devnull)?;
            dup2_stdout(&devnull)?;
            dup2_stderr(&devnull)?;
        }
        Some((WarmKind::Node, _)) | None => call_stdio()?,
    }
    std::env::set_current_dir(HOME)?;
    match l.warm {
        None => super::warm::set_call_limits(0, l.open_files, l.file_size, l.max_processes)?,
        // Room for the hooks' descriptors; the call's limit comes at Go.
        Some(_) => sys::set_rlimit_of(0, libc::RLIMIT_NOFILE, super::warm::WARM_OPEN_FILES)?,
    }
    lock_down(bpf, l.warm.map(|(_, ctrl)| ctrl))
}

/// stdin from /dev/null, stdout and stderr the call's pipes.
fn call_stdio() -> io::Result<()> {
    let devnull = std::fs::OpenOptions::new().read(true).write(true).open("/dev/null")?;
    nix::unistd::dup2_stdin(&devnull)?;
    nix::unistd::dup2_stdout(unsafe_borrow(wire::STDOUT_FD))?;
    nix::unistd::dup2_stderr(unsafe_borrow(wire::STDERR_FD))?;
    Ok(())
}

/// The privilege drop in its one safe order (see the module comment), after
/// stdio, working directory and the call's limits; `keep` stays open past
/// exec (a warm interpreter's channel to init).
fn lock_down(bpf: &[libc::sock_filter], keep: Option<RawFd>) -> io::Result<()> {
    setrlimit(Resource::RLIMIT_CORE, 0, 0)?;
    // No real-time scheduling and no raised priority, whatever the host's
    // defaults: a sandbox must not starve its neighbours' CPU.
    setrlimit(Resource::RLIMIT_RTPRIO, 0, 0)?;
    setrlimit(Resource::RLIMIT_NICE, 0, 0)?;
    // Locked memory is unswappable host memory: the classic 64 KiB (enough
    // for crypto libraries that lock a key page), not the host's default.
    setrlimit(Resource::RLIMIT_MEMLOCK, MEMLOCK_BYTES, MEMLOCK_BYTES)?;
    // Init is non-dumpable (its /proc files are root's); the program needs its
    // own /proc files to reset the OOM score it inherited from init, which may
    // be shielded. execve recomputes dumpability anyway.
    sys::set_dumpable(true)?;
    std::fs::write("/proc/self/oom_score_adj", "0")?;
    sys::drop_bounding_set()?;
    let id = SANDBOX_UID.into();
    nix::unistd::setresgid(id, id, id)?;
    let id = SANDBOX_UID.into();
    nix::unistd::setresuid(id, id, id)?;
    sys::clear_capabilities()?;
    sys::set_no_new_privs()?;
    sys::reset_signals()?;
    sys::cloexec_from(3)?;
    if let Some(ctrl) = keep {
        super::warm::keep_fds(ctrl)?;
    }
    sys::install_seccomp(bpf)
}

/// A live sandbox's process (see [`super::live`]), allocated before fork.
pub struct Process {
    /// Where to look for the program, first to last (one entry when its name has a `/`).
    candidates: Vec<CString>,
    argv: Vec<CString>,
    env: Vec<CString>,
    cwd: CString,
    tty: bool,
}

impl Process {
    /// The exec of `spawn`: its program looked up in its own `PATH`.
    pub fn new(spawn: &wire::Spawn) -> io::Result<Process> {
        let c = |s: &str| CString::new(s).map_err(|_| io::Error::new(io::ErrorKind::InvalidInput, "NUL byte"));
        let program = spawn.argv.first().filter(|p| !p.is_empty()).ok_or_else(|| io::Error::new(io::ErrorKind::InvalidInput, "no program"))?;
        let path = spawn.env.iter().rev().find(|(k, _)| k == "PATH").map_or("/usr/local/bin:/usr/bin:/bin", |(_, v)| v.as_str());
        let candidates = match program.contains('/') {
            true => vec![c(program)?],
            false => path.split(':').filter(|d| d.starts_with('/')).map(|d| c(&format!("{}/{program}", d.trim_end_matches('/')))).collect::<io::Result<_>>()?,
        };
        Ok(Process {
            candidates,
            argv: spawn.argv.iter().map(|a| c(a)).collect::<io::Result<_>>()?,
            env: spawn.env.iter().map(|(k, v)| c(&format!("{k}={v}"))).collect::<io::Result<_>>()?,
            cwd: c(&spawn.cwd)?,
            tty: spawn.tty,
        })
    }
}

/// In a live sandbox's forked child: takes `stdio` as 0, 1 and 2, leads
/// its own process group (or session, on a terminal), enters its working
/// directory, takes the sandbox's per-process limits, drops every
/// privilege exactly as a program does and execs; a failure is reported
/// on `status` (errno) and exits 127.
pub fn exec_process(p: &Process, stdio: [OwnedFd; 3], limits: (u64, u64, u64), bpf: &[libc::sock_filter], status: OwnedFd) -> ! {
    let err = match prepare_process(p, stdio, limits, bpf) {
        Err(e) => e,
        Ok(()) => {
            let mut last = io::Error::from_raw_os_error(libc::ENOENT);
            for candidate in &p.candidates {
                let Err(e) = nix::unistd::execve(candidate, &p.argv, &p.env);
                last = e.into();
                // Keep looking only past a missing or unreadable candidate.
                if !matches!(last.raw_os_error(), Some(libc::ENOENT | libc::ENOTDIR | libc::EACCES)) {
                    break;
                }
            }
            last
        }
    };
    let errno = err.raw_os_error().unwrap_or(libc::EIO);
    let _ = nix::unistd::write(&status, &errno.to_ne_bytes());
    sys::exit_now(127)
}

fn prepare_process(p: &Process, stdio: [OwnedFd; 3], (open_files, file_size, processes): (u64, u64, u64), bpf: &[libc::sock_filter]) -> io::Result<()> {
    let [stdin, stdout, stderr] = stdio;
    nix::unistd::dup2_stdin(&stdin)?;
    nix::unistd::dup2_stdout(&stdout)?;
    nix::unistd::dup2_stderr(&stderr)?;
    drop((stdin, stdout, stderr));
    // Init waits for SIGCHLD on a signalfd: the signal is blocked there.
    nix::sys::signal::SigSet::empty().thread_set_mask()?;
    if p.tty {
        nix::unistd::setsid()?;
        // SAFETY: TIOCSCTTY on fd 0 (the terminal just installed), argument 0.
        if unsafe { libc::ioctl(0, libc::TIOCSCTTY, 0) } < 0 {
            return Err(io::Error::last_os_error());
        }
    } else {
        nix::unistd::setpgid(nix::unistd::Pid::from_raw(0), nix::unistd::Pid::from_raw(0))?;
    }
    nix::unistd::chdir(p.cwd.as_c_str())?;
    super::warm::set_call_limits(0, open_files, file_size, processes)?;
    lock_down(bpf, None)
}

/// The cold start's stub (see [`super::stub`]): locks itself down exactly as
/// a cold program does, waits for the call on `go`, then takes its working
/// directory (the call's home is mounted by then) and execs. A failure
/// before the call ends the stub (init then starts the program the usual
/// way); one after it is reported on `status` like a failed exec.
pub fn stub(bpf: &[libc::sock_filter], go: OwnedFd, status: OwnedFd) -> ! {
    if call_stdio().and_then(|()| lock_down(bpf, None)).is_err() {
        sys::exit_now(127);
    }
    let mut call = Vec::new();
    if std::io::Read::read_to_end(&mut std::fs::File::from(go), &mut call).is_err() || call.is_empty() {
        sys::exit_now(0);
    }
    let err = match stub_launch(&call).and_then(|l| std::env::set_current_dir(HOME).map(|()| l)) {
        Err(e) => e,
        Ok((interpreter, argv, env)) => match nix::unistd::execve(&interpreter, &argv, &env) {
            Err(e) => e.into(),
        },
    };
    let errno = err.raw_os_error().unwrap_or(libc::EIO);
    let _ = nix::unistd::write(&status, &errno.to_ne_bytes());
    sys::exit_now(127)
}

/// Where the call's program file is, as the interpreter's argument.
fn script_path(go: &Go) -> io::Result<String> {
    Path::new(SCRIPT_DIR).join(&go.script_name).into_os_string().into_string().map_err(|_| io::Error::from(io::ErrorKind::InvalidInput))
}

/// What a stub is handed: the interpreter, the script's path, then the
/// environment's `name=value` entries, each ended by a NUL.
pub fn stub_call(go: &Go) -> io::Result<Vec<u8>> {
    let script = script_path(go)?;
    let script = script.as_str();
    let mut msg = Vec::with_capacity(256);
    let mut field = |parts: &[&str]| -> io::Result<()> {
        for p in parts {
            if p.contains('\0') {
                return Err(io::Error::new(io::ErrorKind::InvalidInput, "NUL byte"));
            }
            msg.extend_from_slice(p.as_bytes());
        }
        msg.push(0);
        Ok(())
    };
    field(&[&go.interpreter])?;
    field(&[script])?;
    for (k, v) in &go.env {
        field(&[k, "=", v])?;
    }
    Ok(msg)
}

type Exec = (CString, Vec<CString>, Vec<CString>);

fn stub_launch(call: &[u8]) -> io::Result<Exec> {
    let mut fields = call.strip_suffix(&[0]).unwrap_or(call).split(|b| *b == 0).map(|f| CString::new(f).map_err(|_| io::Error::from(io::ErrorKind::InvalidInput)));
    let interpreter = fields.next().ok_or_else(|| io::Error::from(io::ErrorKind::InvalidInput))??;
    let script = fields.next().ok_or_else(|| io::Error::from(io::ErrorKind::InvalidInput))??;
    let env = fields.collect::<io::Result<Vec<CString>>>()?;
    Ok((interpreter.clone(), vec![interpreter, script], env))
}

fn unsafe_borrow(fd: i32) -> std::os::fd::BorrowedFd<'static> {
    // SAFETY: fds 5 and 6 were installed by the agent for exactly this process
    // tree and stay open until exec (they are then replaced by 1 and 2).
    unsafe { std::os::fd::BorrowedFd::borrow_raw(fd) }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn go(env: Vec<(String, String)>) -> Go {
        Go {
            interpreter: "/bin/bash".into(),
            script_name: "main.sh".into(),
            code: "echo 1".into(),
            env,
            open_files: 1024,
            file_size_bytes: 1 << 20,
            max_processes: 64,
            home: wire::Home::Mounted,
            warm: false,
            view: None,
            live: false,
        }
    }

    #[test]
    fn a_stub_gets_the_exec_a_cold_start_would_make() {
        let g = go(vec![("HOME".into(), "/home/sandbox".into()), ("X".into(), "a=b c".into())]);
        let (interpreter, argv, env) = stub_launch(&stub_call(&g).unwrap()).unwrap();
        let cold = Launch::new(&g).unwrap();
        assert_eq!((interpreter, argv, env), (cold.interpreter, cold.argv, cold.env));
        assert!(stub_call(&go(vec![])).is_ok_and(|c| !c.is_empty()), "no environment is still a call");
    }

    #[test]
    fn a_nul_byte_fails_as_the_cold_start_does() {
        for env in [vec![("X".to_string(), "a\0b".to_string())], vec![("X\0Y".to_string(), "v".to_string())]] {
            let g = go(env);
            assert_eq!(stub_call(&g).unwrap_err().kind(), io::ErrorKind::InvalidInput);
            assert!(Launch::new(&g).is_err());
        }
    }
}
