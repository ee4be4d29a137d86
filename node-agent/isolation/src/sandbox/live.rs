//! Init of a live sandbox: no program of its own. It starts processes when
//! the agent asks ([`LiveCommand::Spawn`], with their stdio passed as
//! descriptors), signals their process groups, reaps everything (orphans
//! re-parent to it) and reports each process's end. The sandbox lives until
//! the agent lets go of init's socket (or kills the supervisor): then every
//! process in it is killed and init exits.
//!
//! Init relays no data: the agent holds the other ends of every process's
//! pipes or terminal. Every process is a child of init and goes through the
//! program's privilege drop (`program::exec_process`), so it shares the
//! sandbox's namespaces, cgroup, file system and limits and nothing more.

use std::collections::{HashMap, VecDeque};
use std::io::{self, IoSliceMut, Read};
use std::os::fd::{AsFd, AsRawFd, FromRawFd, OwnedFd};
use std::os::unix::net::UnixStream;

use nix::poll::{poll, PollFd, PollFlags, PollTimeout};
use nix::sys::signal::{kill, SigSet, Signal};
use nix::sys::signalfd::{SfdFlags, SignalFd};
use nix::sys::socket::{recvmsg, ControlMessageOwned, MsgFlags};
use nix::sys::wait::{waitpid, WaitPidFlag, WaitStatus};
use nix::unistd::{ForkResult, Pid};

use super::{program, sys};
use crate::wire::{self, Go, InitEvent, LiveCommand, Spawn, LIVE_SIGNALS};

/// Most descriptors waiting for their `Spawn` frame: a sender that passes
/// more than it names is cut off rather than left to exhaust init's table.
const MAX_PENDING_FDS: usize = 48;

/// Where a live sandbox's terminals come from: a devpts of its own, mounted
/// at live start (the agent opens `ptmx` through init's root).
pub const PTS_DIR: &str = "/dev/pts";

/// Serves a live sandbox until the agent lets go; never returns.
pub fn serve(mut ctrl: UnixStream, go: &Go, bpf: &[libc::sock_filter]) -> ! {
    let mut mask = SigSet::empty();
    mask.add(Signal::SIGCHLD);
    let chld = mask.thread_block().and_then(|()| SignalFd::with_flags(&mask, SfdFlags::SFD_NONBLOCK | SfdFlags::SFD_CLOEXEC));
    let chld = match chld {
        Ok(fd) => fd,
        Err(e) => fail(&mut ctrl, "signalfd", &e),
    };
    if let Err(e) = mount_pts() {
        fail(&mut ctrl, "devpts", &e);
    }
    if wire::write_frame(&mut ctrl, &InitEvent::Live).is_err() {
        end();
    }
    let limits = (go.open_files, go.file_size_bytes, go.max_processes);
    let mut live = Live { ctrl, inbox: Inbox::default(), running: HashMap::new(), limits, bpf };
    loop {
        let mut fds = [PollFd::new(live.ctrl.as_fd(), PollFlags::POLLIN), PollFd::new(chld.as_fd(), PollFlags::POLLIN)];
        match poll(&mut fds, PollTimeout::NONE) {
            Err(nix::errno::Errno::EINTR) => continue,
            Err(_) => end(),
            Ok(_) => {}
        }
        let ready = |f: &PollFd| f.revents().is_some_and(|r| !r.is_empty());
        let (commands, children) = (ready(&fds[0]), ready(&fds[1]));
        if children {
            while let Ok(Some(_)) = chld.read_signal() {}
            live.reap();
        }
        if commands {
            live.take_commands();
        }
    }
}

/// Reports a failure before the sandbox went live, then exits.
fn fail(ctrl: &mut UnixStream, stage: &str, e: &dyn std::fmt::Display) -> ! {
    let _ = wire::write_frame(ctrl, &InitEvent::Failed { stage: stage.into(), message: e.to_string() });
    end()
}

/// Kills every process of the sandbox, reaps them and exits.
fn end() -> ! {
    let _ = kill(Pid::from_raw(-1), Signal::SIGKILL);
    while !matches!(waitpid(None, None), Err(nix::errno::Errno::ECHILD)) {}
    sys::exit_now(0)
}

/// The sandbox's own devpts instance: terminals numbered from 0 that no
/// other sandbox (or the node) sees, owned by the sandbox's user.
fn mount_pts() -> io::Result<()> {
    use nix::mount::{mount, MsFlags};
    let opts = "newinstance,ptmxmode=0666,mode=0620,uid=1000,gid=1000,max=64";
    mount(Some("devpts"), PTS_DIR, Some("devpts"), MsFlags::MS_NOSUID | MsFlags::MS_NOEXEC, Some(opts)).map_err(io::Error::from)
}

struct Live<'a> {
    ctrl: UnixStream,
    inbox: Inbox,
    /// pid → the agent's id, of the processes it started and that still run.
    running: HashMap<i32, u64>,
    /// open files, file size, processes (the sandbox's per-process limits).
    limits: (u64, u64, u64),
    bpf: &'a [libc::sock_filter],
}

impl Live<'_> {
    fn send(&mut self, ev: &InitEvent) {
        if wire::write_frame(&mut self.ctrl, ev).is_err() {
            end();
        }
    }

    /// Reaps every child that ended; reports those the agent started.
    fn reap(&mut self) {
        loop {
            let (pid, code, signal) = match waitpid(None, Some(WaitPidFlag::WNOHANG)) {
                Ok(WaitStatus::Exited(pid, code)) => (pid, code, 0),
                Ok(WaitStatus::Signaled(pid, sig, _)) => (pid, 128 + sig as i32, sig as i32),
                Ok(WaitStatus::StillAlive) | Err(_) => return,
                Ok(_) => continue,
            };
            if let Some(id) = self.running.remove(&pid.as_raw()) {
                self.send(&InitEvent::ProcessExited { id, code, signal });
            }
        }
    }

    /// Reads what the agent sent and acts on every whole command; the
    /// agent's end of the socket closing ends the sandbox.
    fn take_commands(&mut self) {
        match self.inbox.receive(&self.ctrl) {
            Ok(0) | Err(_) => end(),
            Ok(_) => {}
        }
        loop {
            match self.inbox.next() {
                Ok(Some(LiveCommand::Spawn(s))) => self.spawn(s),
                Ok(Some(LiveCommand::Signal { id, signal })) => self.signal(id, signal),
                Ok(None) => return,
                // Garbage from the agent: nothing sane can follow.
                Err(_) => end(),
            }
        }
    }

    fn signal(&self, id: u64, signal: i32) {
        let Some((&pid, _)) = self.running.iter().find(|(_, &i)| i == id) else { return };
        if !LIVE_SIGNALS.contains(&signal) {
            return;
        }
        let Ok(sig) = Signal::try_from(signal) else { return };
        // Its group: the command and what it started; the process alone if
        // it left its group.
        if kill(Pid::from_raw(-pid), sig).is_err() {
            let _ = kill(Pid::from_raw(pid), sig);
        }
    }

    fn spawn(&mut self, s: Spawn) {
        let stdio = match self.inbox.take_fds() {
            Some(fds) => fds,
            None => {
                self.send(&InitEvent::SpawnFailed { id: s.id, message: "the process's stdio did not arrive".into() });
                return;
            }
        };
        let id = s.id;
        match self.start(&s, stdio) {
            Ok(pid) => {
                self.running.insert(pid, id);
                self.send(&InitEvent::Spawned { id, pid });
            }
            Err(e) => {
                let program = s.argv.first().map(String::as_str).unwrap_or_default();
                let message = match e.raw_os_error() {
                    Some(libc::ENOENT) => format!("{program}: command not found"),
                    _ => format!("{program}: {e}"),
                };
                self.send(&InitEvent::SpawnFailed { id, message });
            }
        }
    }

    /// Forks the process and waits until it exec'd (or failed to).
    fn start(&self, s: &Spawn, stdio: [OwnedFd; 3]) -> io::Result<i32> {
        let process = program::Process::new(s)?;
        let (status_r, status_w) = nix::unistd::pipe2(nix::fcntl::OFlag::O_CLOEXEC)?;
        // SAFETY: init is single-threaded, so the child may run arbitrary code.
        let child = match unsafe { nix::unistd::fork() }? {
            ForkResult::Child => {
                drop(status_r);
                program::exec_process(&process, stdio, self.limits, self.bpf, status_w)
            }
            ForkResult::Parent { child } => child,
        };
        drop((stdio, status_w));
        let mut errno = [0u8; 4];
        if let Ok(4) = std::fs::File::from(status_r).read(&mut errno) {
            let _ = waitpid(child, None);
            return Err(io::Error::from_raw_os_error(i32::from_ne_bytes(errno)));
        }
        Ok(child.as_raw())
    }
}

/// What arrived on init's socket: bytes not yet a whole frame, and the
/// descriptors that came with them, in order.
#[derive(Default)]
struct Inbox {
    buf: Vec<u8>,
    fds: VecDeque<OwnedFd>,
}

impl Inbox {
    /// One `recvmsg`; the number of bytes read (0 at the end).
    fn receive(&mut self, sock: &UnixStream) -> io::Result<usize> {
        let mut data = [0u8; 16 * 1024];
        let mut space = nix::cmsg_space!([std::os::fd::RawFd; 16]);
        let (n, fds) = {
            let mut iov = [IoSliceMut::new(&mut data)];
            let msg = recvmsg::<()>(sock.as_raw_fd(), &mut iov, Some(&mut space), MsgFlags::MSG_CMSG_CLOEXEC)?;
            let mut fds = Vec::new();
            for c in msg.cmsgs()? {
                if let ControlMessageOwned::ScmRights(raw) = c {
                    // SAFETY: SCM_RIGHTS descriptors are new in this process and ours alone.
                    fds.extend(raw.into_iter().map(|fd| unsafe { OwnedFd::from_raw_fd(fd) }));
                }
            }
            (msg.bytes, fds)
        };
        self.fds.extend(fds);
        if self.fds.len() > MAX_PENDING_FDS || self.buf.len() + n > wire::MAX_FRAME + 4 {
            return Err(io::Error::new(io::ErrorKind::InvalidData, "the agent sent more than it named"));
        }
        self.buf.extend_from_slice(&data[..n]);
        Ok(n)
    }

    /// The next whole command, if one arrived.
    fn next(&mut self) -> io::Result<Option<LiveCommand>> {
        let Some(len) = self.buf.get(..4).map(|l| u32::from_le_bytes([l[0], l[1], l[2], l[3]]) as usize) else { return Ok(None) };
        if len > wire::MAX_FRAME {
            return Err(io::Error::new(io::ErrorKind::InvalidData, "frame too large"));
        }
        if self.buf.len() < 4 + len {
            return Ok(None);
        }
        let cmd = wire::decode(&self.buf[4..4 + len]);
        self.buf.drain(..4 + len);
        cmd.map(Some)
    }

    /// A process's stdin, stdout and stderr.
    fn take_fds(&mut self) -> Option<[OwnedFd; 3]> {
        if self.fds.len() < 3 {
            return None;
        }
        Some([self.fds.pop_front()?, self.fds.pop_front()?, self.fds.pop_front()?])
    }
}

/// A new terminal of the live sandbox whose init is `init_pid` (host
/// view), from the sandbox's own devpts reached through init's root:
/// (master, the process's end). Called by the agent.
pub fn open_pty(init_pid: i32) -> io::Result<(OwnedFd, OwnedFd)> {
    use std::os::unix::fs::OpenOptionsExt;
    let path = format!("/proc/{init_pid}/root{PTS_DIR}/ptmx");
    let master: OwnedFd = std::fs::OpenOptions::new().read(true).write(true).custom_flags(libc::O_NOCTTY | libc::O_CLOEXEC).open(path)?.into();
    let unlock: libc::c_int = 0;
    // SAFETY: TIOCSPTLCK on the master just opened, with a valid pointer to an int.
    if unsafe { libc::ioctl(master.as_raw_fd(), libc::TIOCSPTLCK, &unlock) } < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: TIOCGPTPEER opens the master's peer and returns a new descriptor (or -1).
    let slave = unsafe { libc::ioctl(master.as_raw_fd(), libc::TIOCGPTPEER, libc::O_RDWR | libc::O_NOCTTY | libc::O_CLOEXEC) };
    if slave < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: the descriptor was just created for us and nothing else holds it.
    Ok((master, unsafe { OwnedFd::from_raw_fd(slave) }))
}

/// Sets a terminal's size (on its master end).
pub fn set_pty_size(master: &impl AsRawFd, rows: u16, cols: u16) -> io::Result<()> {
    let ws = libc::winsize { ws_row: rows, ws_col: cols, ws_xpixel: 0, ws_ypixel: 0 };
    // SAFETY: TIOCSWINSZ with a valid pointer to a winsize.
    if unsafe { libc::ioctl(master.as_raw_fd(), libc::TIOCSWINSZ, &ws) } < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}
