//! Starting a sandbox's supervisor: the agent hands its four descriptors to
//! a spawner, a `warren-sandbox` it started once, which forks the
//! supervisor (see `sandbox::spawner`). A spawner's first two messages are
//! the compiled seccomp filters: the base, which it loads on itself (every
//! supervisor it forks inherits it, already compiled by the kernel), and the
//! lockdown each program loads, which its supervisors inherit with the rest
//! of its memory.
//!
//! A fork of that small single-threaded process instead of an exec of
//! `warren-sandbox` per sandbox: the exec (loading and relocating the
//! binary, the C library's start, its CPUID probes that trap on a VM, the
//! page faults of a fresh process) was about 1 ms of CPU per sandbox on a
//! 2-core VM, an eighth of all a call cost. The spawner never runs in a
//! thread of the agent, so no fork copies the agent's page tables either.
//!
//! The descriptors travel over a socket (`SCM_RIGHTS`), so they are never
//! inheritable in the agent: no other process the agent starts meanwhile
//! can receive them. A spawner serves [`SPAWNS_PER_SPAWNER`] supervisors,
//! then the next is started: supervisors share their spawner's address
//! layout, and so do their inits, so a layout is never shared by more than
//! that many sandboxes (what runs the untrusted code is exec'd, with a
//! layout of its own).

use std::io::{self, IoSlice, IoSliceMut};
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, FromRawFd, OwnedFd, RawFd};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::Mutex;

use nix::sys::socket::{self, ControlMessage, ControlMessageOwned, MsgFlags};

use crate::seccomp::Programs;

/// Set (to `1`) in the environment of a `warren-sandbox` started as the
/// spawner; its stdin is then its socket to the agent.
pub const SPAWNER_ENV: &str = "WARREN_SANDBOX_SPAWNER";

/// Supervisors one spawner forks before the next spawner is started.
pub const SPAWNS_PER_SPAWNER: u32 = 64;

/// How long a spawner may take to answer (a fork: well under a millisecond).
const ANSWER_WITHIN: std::time::Duration = std::time::Duration::from_secs(10);

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
    fn raw(&self) -> [RawFd; 4] {
        [self.supervisor.as_raw_fd(), self.init.as_raw_fd(), self.stdout.as_raw_fd(), self.stderr.as_raw_fd()]
    }
}

/// A supervisor the spawner forked. Its pidfd becomes readable when it has
/// exited (its spawner reaps it). Dropping it kills it, and with it its
/// sandbox (init dies with its parent).
#[derive(Debug)]
pub struct Supervisor {
    pid: i32,
    pidfd: OwnedFd,
}

impl Supervisor {
    /// Its pid (host view).
    pub fn pid(&self) -> i32 {
        self.pid
    }

    /// Whether it has exited (a poll of its pidfd that does not wait).
    pub fn has_exited(&self) -> bool {
        let mut fds = [nix::poll::PollFd::new(self.pidfd.as_fd(), nix::poll::PollFlags::POLLIN)];
        matches!(nix::poll::poll(&mut fds, nix::poll::PollTimeout::ZERO), Ok(n) if n > 0)
    }

    /// SIGKILLs it (nothing when it is gone: its pidfd names it, never a
    /// process that reused its pid).
    pub fn kill(&self) -> io::Result<()> {
        // SAFETY: pidfd_send_signal with a pidfd we own, a signal number, no
        // siginfo and no flags.
        let ret = unsafe { libc::syscall(libc::SYS_pidfd_send_signal, self.pidfd.as_raw_fd(), libc::SIGKILL, std::ptr::null::<libc::siginfo_t>(), 0) };
        if ret < 0 {
            let e = io::Error::last_os_error();
            return if e.raw_os_error() == Some(libc::ESRCH) { Ok(()) } else { Err(e) };
        }
        Ok(())
    }
}

/// Its pidfd (to wait for its exit with a reactor).
impl AsRawFd for Supervisor {
    fn as_raw_fd(&self) -> RawFd {
        self.pidfd.as_raw_fd()
    }
}

impl Drop for Supervisor {
    fn drop(&mut self) {
        let _ = self.kill();
    }
}

/// The agent's side of the spawners: one at a time serves, those it
/// replaced are reaped once they exit (each waits for its supervisors
/// first, so none is left to the pid namespace's init).
pub struct Spawner {
    binary: PathBuf,
    programs: Programs,
    state: Mutex<State>,
}

#[derive(Default)]
struct State {
    current: Option<Serving>,
    retired: Vec<Child>,
}

struct Serving {
    socket: OwnedFd,
    child: Child,
    served: u32,
}

impl State {
    /// Closes the serving spawner's socket: it forks nothing more.
    fn retire(&mut self) {
        if let Some(s) = self.current.take() {
            self.put_away(s);
        }
    }

    fn put_away(&mut self, s: Serving) {
        drop(s.socket);
        self.retired.push(s.child);
    }

    /// The spawner that serves, a new one when there is none or it is used up.
    fn serving(&mut self, binary: &Path, programs: &Programs) -> io::Result<&mut Serving> {
        match self.current.take() {
            Some(s) if s.served < SPAWNS_PER_SPAWNER => Ok(self.current.insert(s)),
            used_up => {
                if let Some(s) = used_up {
                    self.put_away(s);
                }
                Ok(self.current.insert(start(binary, programs)?))
            }
        }
    }

    /// Sends `fds` to the serving spawner; the answer is still to be read.
    fn ask(&mut self, binary: &Path, programs: &Programs, fds: &SupervisorFds) -> io::Result<&mut Serving> {
        let serving = self.serving(binary, programs)?;
        request(serving.socket.as_fd(), fds)?;
        serving.served += 1;
        Ok(serving)
    }
}

impl Spawner {
    /// Spawners of `binary` (`warren-sandbox`), the first started at the
    /// first call, each handed `programs` (the compiled seccomp filters: the
    /// base the spawner loads, the lockdown every program loads over it; see
    /// [`crate::seccomp`]).
    pub fn new(binary: &Path, programs: Programs) -> Spawner {
        Spawner { binary: binary.to_path_buf(), programs, state: Mutex::default() }
    }

    /// Starts a supervisor holding `fds` at 3–6. Blocks for a round trip to
    /// the spawner (its fork); one call at a time.
    pub fn spawn(&self, fds: &SupervisorFds) -> io::Result<Supervisor> {
        let mut state = self.state.lock().unwrap_or_else(|p| p.into_inner());
        state.retired.retain_mut(|c| matches!(c.try_wait(), Ok(None)));
        let serving = match state.ask(&self.binary, &self.programs, fds) {
            Ok(serving) => serving,
            // It was gone before the request (nothing was forked): once more with a new one.
            Err(_) => {
                state.retire();
                state.ask(&self.binary, &self.programs, fds)?
            }
        };
        match answer(serving.socket.as_fd()) {
            // A fork the kernel refused (pids or memory short): the spawner
            // is fine, and starting another would take more of what is short.
            Ok(forked) => forked,
            // Never asked twice: a spawner that died after its fork may have started it.
            Err(e) => {
                state.retire();
                Err(e)
            }
        }
    }

    /// Forks no more: each spawner exits once its supervisors are gone (at
    /// a clean stop, they are). Waits up to `limit` for that, then kills
    /// what is left (their supervisors still end with the agent: their
    /// sockets close). Blocks; a later [`Spawner::spawn`] starts a new one.
    pub fn stop(&self, limit: std::time::Duration) {
        let mut state = self.state.lock().unwrap_or_else(|p| p.into_inner());
        state.retire();
        let deadline = std::time::Instant::now() + limit;
        loop {
            state.retired.retain_mut(|c| matches!(c.try_wait(), Ok(None)));
            if state.retired.is_empty() {
                return;
            }
            if std::time::Instant::now() >= deadline {
                for c in &mut state.retired {
                    let _ = c.kill();
                    let _ = c.wait();
                }
                state.retired.clear();
                return;
            }
            std::thread::sleep(std::time::Duration::from_millis(2));
        }
    }
}

/// Starts a spawner; its stdin is its end of a SOCK_SEQPACKET pair (set
/// there by the spawn itself: never inheritable in the agent), whose first
/// two messages are the base and the lockdown.
fn start(binary: &Path, programs: &Programs) -> io::Result<Serving> {
    let (ours, theirs) = socket::socketpair(socket::AddressFamily::Unix, socket::SockType::SeqPacket, None, socket::SockFlag::SOCK_CLOEXEC)?;
    // A spawner that stopped answering fails its request (and is replaced)
    // instead of holding every sandbox's start.
    let limit = nix::sys::time::TimeVal::new(ANSWER_WITHIN.as_secs() as _, 0);
    socket::setsockopt(&ours, socket::sockopt::ReceiveTimeout, &limit)?;
    socket::setsockopt(&ours, socket::sockopt::SendTimeout, &limit)?;
    let child = Command::new(binary)
        .env_clear()
        .env(SPAWNER_ENV, "1")
        .stdin(Stdio::from(theirs))
        .stdout(Stdio::null())
        // A crash of a supervisor lands in the agent's log, never in a program's output.
        .stderr(Stdio::inherit())
        .spawn()?;
    let mut serving = Serving { socket: ours, child, served: 0 };
    let sent = send_filter(serving.socket.as_fd(), &programs.base).and_then(|()| send_filter(serving.socket.as_fd(), &programs.lockdown));
    if let Err(e) = sent {
        let _ = serving.child.kill();
        let _ = serving.child.wait();
        return Err(e);
    }
    Ok(serving)
}

/// Sends the seccomp program, as one message (at most [`MAX_FILTER`] bytes).
fn send_filter(socket: BorrowedFd<'_>, filter: &[u8]) -> io::Result<()> {
    if filter.is_empty() || filter.len() > MAX_FILTER {
        return Err(io::Error::new(io::ErrorKind::InvalidInput, "a seccomp program is 1 to 4096 instructions"));
    }
    let sent = socket::send(socket.as_raw_fd(), filter, MsgFlags::MSG_NOSIGNAL)?;
    if sent != filter.len() {
        return Err(io::Error::new(io::ErrorKind::WriteZero, "the spawner took part of its seccomp program"));
    }
    Ok(())
}

/// Most bytes of a seccomp program: the kernel's 4096 instructions
/// (`BPF_MAXINSNS`) of 8 bytes.
pub(crate) const MAX_FILTER: usize = 4096 * 8;

/// Sends the four descriptors, in fd order, with a one-byte request.
fn request(socket: BorrowedFd<'_>, fds: &SupervisorFds) -> io::Result<()> {
    let raw = fds.raw();
    let sent = socket::sendmsg::<()>(socket.as_raw_fd(), &[IoSlice::new(&[1])], &[ControlMessage::ScmRights(&raw)], MsgFlags::MSG_NOSIGNAL, None)?;
    if sent != 1 {
        return Err(io::Error::new(io::ErrorKind::WriteZero, "the spawner took no request"));
    }
    Ok(())
}

/// The spawner's answer: the supervisor's pid (i32, little-endian) with its
/// pidfd, or a negative errno without one.
/// The outer error is the exchange's (the spawner is then retired), the
/// inner one the fork's.
fn answer(socket: BorrowedFd<'_>) -> io::Result<io::Result<Supervisor>> {
    let mut pid = [0u8; 4];
    let mut space = nix::cmsg_space!([RawFd; 1]);
    let (bytes, mut fds) = loop {
        let mut iov = [IoSliceMut::new(&mut pid)];
        match socket::recvmsg::<()>(socket.as_raw_fd(), &mut iov, Some(&mut space), MsgFlags::MSG_CMSG_CLOEXEC) {
            Err(nix::errno::Errno::EINTR) => continue,
            Err(e) => return Err(e.into()),
            Ok(msg) => break (msg.bytes, received(&msg)?),
        }
    };
    let pid = i32::from_le_bytes(pid);
    match (bytes, fds.pop()) {
        (4, Some(pidfd)) if pid > 0 && fds.is_empty() => Ok(Ok(Supervisor { pid, pidfd })),
        (4, None) if pid < 0 => Ok(Err(io::Error::from_raw_os_error(-pid))),
        (0, _) => Err(io::Error::new(io::ErrorKind::UnexpectedEof, "the spawner exited")),
        _ => Err(io::Error::new(io::ErrorKind::InvalidData, "malformed answer from the spawner")),
    }
}

/// The descriptors a message carried, owned.
pub(crate) fn received<S>(msg: &socket::RecvMsg<'_, '_, S>) -> io::Result<Vec<OwnedFd>> {
    let mut fds = Vec::new();
    for c in msg.cmsgs()? {
        if let ControlMessageOwned::ScmRights(raw) = c {
            // SAFETY: the kernel installed these in this process for us; nothing else owns them.
            fds.extend(raw.into_iter().map(|fd| unsafe { OwnedFd::from_raw_fd(fd) }));
        }
    }
    Ok(fds)
}
