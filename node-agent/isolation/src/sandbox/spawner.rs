//! The spawner: a `warren-sandbox` the agent starts (see `crate::launch`)
//! that forks one supervisor per sandbox. Single-threaded.
//!
//! On its socket (its stdin when started; a SOCK_SEQPACKET pair) the agent
//! first sends the compiled seccomp program, which the spawner keeps (see
//! [`crate::seccomp::handed`]) and its forks inherit; then, per supervisor,
//! one byte with four descriptors (`SCM_RIGHTS`, in fd
//! order 3–6); the spawner forks, the child puts them at 3–6, closes every
//! other descriptor from 7 up (its end of this socket too) and becomes the
//! supervisor, exactly as an exec'd one would start; the spawner answers the
//! child's pid (i32, little-endian) with a pidfd made by the fork itself
//! (`CLONE_PIDFD`), or a negative errno. The kernel reaps the children
//! (`SA_NOCLDWAIT`; the agent waits on the pidfd). At the socket's end the
//! spawner forks no more, waits until its children are gone (none is left
//! to the pid namespace's init, which may be the agent) and exits.

use std::io::{self, IoSlice, IoSliceMut};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};

use nix::sys::signal::{sigaction, SaFlags, SigAction, SigHandler, SigSet, Signal};
use nix::sys::socket::{self, ControlMessage, MsgFlags};

use super::sys;
use crate::wire;

/// Entry point of `warren-sandbox` started as the spawner.
pub fn spawner_main() -> ! {
    let socket = match take_socket() {
        Ok(s) => s,
        Err(e) => {
            eprintln!("warren-sandbox is started by warren-node-agent; it is not meant to be run by hand ({e})");
            sys::exit_now(2)
        }
    };
    // SAFETY: single-threaded; SIG_IGN installs no handler.
    let ignored = unsafe { sigaction(Signal::SIGCHLD, &SigAction::new(SigHandler::SigIgn, SaFlags::SA_NOCLDWAIT, SigSet::empty())) };
    if ignored.is_err() {
        sys::exit_now(2);
    }
    if let Err(e) = take_filters(&socket) {
        eprintln!("warren-sandbox: the spawner was handed no valid seccomp programs ({e})");
        sys::exit_now(2)
    }
    super::views::NodeFacts::read_once(std::path::Path::new("/proc"));
    loop {
        match receive(&socket) {
            Ok(Some(fds)) => {
                let answer = fork_supervisor(fds);
                if reply(&socket, answer).is_err() {
                    break;
                }
            }
            Ok(None) => break,
            Err(e) if e.raw_os_error() == Some(libc::EINTR) => continue,
            Err(_) => break,
        }
    }
    drop(socket);
    // With SA_NOCLDWAIT, wait blocks until every child is gone, then fails.
    loop {
        match nix::sys::wait::wait() {
            Ok(_) | Err(nix::errno::Errno::EINTR) => continue,
            Err(_) => sys::exit_now(0),
        }
    }
}

/// The socket, moved off stdin (which becomes /dev/null, as the
/// supervisors' stdin always was).
fn take_socket() -> io::Result<OwnedFd> {
    if std::env::var_os(crate::launch::SPAWNER_ENV).is_none() {
        return Err(io::Error::new(io::ErrorKind::InvalidInput, "not started as the spawner"));
    }
    // SAFETY: fstat only inspects the descriptor; an invalid one yields EBADF.
    let stdin = unsafe { std::os::fd::BorrowedFd::borrow_raw(0) };
    if nix::sys::stat::fstat(stdin).map(|s| s.st_mode & libc::S_IFMT != libc::S_IFSOCK).unwrap_or(true) {
        return Err(io::Error::new(io::ErrorKind::InvalidInput, "stdin is not its socket"));
    }
    // SAFETY: a fresh duplicate, owned from here on.
    let socket = unsafe { OwnedFd::from_raw_fd(sys::dup_above(0, 10)?) };
    let null = std::fs::OpenOptions::new().read(true).open("/dev/null")?;
    sys::dup_to(null.as_raw_fd(), 0)?;
    drop(null);
    // Whatever the agent was started with and did not mark close-on-exec
    // is not the spawner's to hold (nor, through it, a supervisor's).
    let kept = socket.as_raw_fd() as u32;
    sys::close_between(3, kept - 1)?;
    sys::close_from(kept + 1)?;
    std::env::remove_var(crate::launch::SPAWNER_ENV);
    Ok(socket)
}

/// The first two messages: the base filter, loaded here (every process
/// forked from now on inherits it, compiled once), and the lockdown, kept
/// for the programs ([`crate::seccomp::handed`]). Any failure leaves the
/// spawner to exit: it never forks a supervisor without both.
fn take_filters(socket: &OwnedFd) -> io::Result<()> {
    let base = receive_filter(socket)?;
    let lockdown = receive_filter(socket)?;
    // SAFETY: prctl with integer arguments only.
    if unsafe { libc::prctl(libc::PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) } != 0 {
        return Err(io::Error::last_os_error());
    }
    sys::install_seccomp(&base)?;
    if !crate::seccomp::hand(lockdown) {
        return Err(io::Error::other("a lockdown was kept already"));
    }
    Ok(())
}

/// One message: a seccomp program, checked to be one (whole
/// instructions, at most the kernel's number of them; the kernel checks the
/// rest when a sandbox loads it).
fn receive_filter(socket: &OwnedFd) -> io::Result<Vec<libc::sock_filter>> {
    let mut bpf = vec![0u8; crate::launch::MAX_FILTER];
    let len = loop {
        // MSG_TRUNC: the message's whole length, even past the buffer.
        match socket::recv(socket.as_raw_fd(), &mut bpf, MsgFlags::MSG_TRUNC) {
            Err(nix::errno::Errno::EINTR) => continue,
            r => break r?,
        }
    };
    if len > bpf.len() {
        return Err(io::Error::new(io::ErrorKind::InvalidData, "a seccomp program longer than the kernel takes"));
    }
    sys::seccomp_filters(&bpf[..len])
}

/// One request's four descriptors; `None` at the socket's end.
fn receive(socket: &OwnedFd) -> io::Result<Option<[OwnedFd; 4]>> {
    let mut byte = [0u8; 1];
    let mut space = nix::cmsg_space!([RawFd; 4]);
    let mut iov = [IoSliceMut::new(&mut byte)];
    let msg = socket::recvmsg::<()>(socket.as_raw_fd(), &mut iov, Some(&mut space), MsgFlags::MSG_CMSG_CLOEXEC)?;
    let fds = crate::launch::received(&msg)?;
    if msg.bytes == 0 {
        return Ok(None);
    }
    fds.try_into().map(Some).map_err(|_| io::Error::new(io::ErrorKind::InvalidInput, "a request carries four descriptors"))
}

/// Forks the supervisor; in the child, never returns.
fn fork_supervisor(fds: [OwnedFd; 4]) -> io::Result<(i32, OwnedFd)> {
    match sys::fork_with_pidfd()? {
        (0, _) => become_supervisor(fds),
        (pid, Some(pidfd)) => Ok((pid, pidfd)),
        (_, None) => Err(io::Error::other("clone gave no pidfd")),
    }
}

/// In the forked child: the state an exec'd supervisor starts with (SIGCHLD
/// at its default, so it can wait for init; only 0–6 open: this socket,
/// at 10 or above, is closed too), then the supervisor.
fn become_supervisor(fds: [OwnedFd; 4]) -> ! {
    // SAFETY: single-threaded; SIG_DFL installs no handler.
    let reset = unsafe { sigaction(Signal::SIGCHLD, &SigAction::new(SigHandler::SigDfl, SaFlags::empty(), SigSet::empty())) };
    let sources = fds.map(std::os::fd::IntoRawFd::into_raw_fd);
    if reset.is_err() || place_fds(sources).is_err() || sys::close_from(7).is_err() {
        sys::exit_now(2);
    }
    super::supervisor::supervisor_main()
}

/// Moves `sources` to 3, 4, 5, 6 (without close-on-exec), closing the sources.
fn place_fds(sources: [RawFd; 4]) -> io::Result<()> {
    let targets = [wire::SUPERVISOR_FD, wire::INIT_FD, wire::STDOUT_FD, wire::STDERR_FD];
    // Every source above the targets first, so a source that already sits
    // on 3..=6 is not clobbered by an earlier dup2.
    let mut high = [0; 4];
    for (slot, src) in high.iter_mut().zip(sources) {
        *slot = sys::dup_above(src, 64)?;
        // SAFETY: `src` was handed to us by the caller and is not used again.
        unsafe { libc::close(src) };
    }
    for (target, src) in targets.into_iter().zip(high) {
        sys::dup_to(src, target)?;
        // SAFETY: `src` is our temporary copy.
        unsafe { libc::close(src) };
    }
    Ok(())
}

/// Answers a request: the pid with its pidfd, or a negative errno.
fn reply(socket: &OwnedFd, answer: io::Result<(i32, OwnedFd)>) -> io::Result<()> {
    let (value, pidfd) = match &answer {
        Ok((pid, pidfd)) => (*pid, Some([pidfd.as_raw_fd()])),
        Err(e) => (-e.raw_os_error().unwrap_or(libc::EIO), None),
    };
    let rights = pidfd.as_ref().map(|fd| ControlMessage::ScmRights(fd));
    socket::sendmsg::<()>(socket.as_raw_fd(), &[IoSlice::new(&value.to_le_bytes())], rights.as_slice(), MsgFlags::MSG_NOSIGNAL, None)?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use nix::sys::socket::{socketpair, AddressFamily, SockFlag, SockType};

    /// What the spawner keeps of `bytes`, as the bytes its instructions are.
    fn first_message(bytes: &[u8]) -> io::Result<Vec<u8>> {
        let (agent, spawner) = socketpair(AddressFamily::Unix, SockType::SeqPacket, None, SockFlag::SOCK_CLOEXEC).unwrap();
        socket::send(agent.as_raw_fd(), bytes, MsgFlags::empty()).unwrap();
        let kept = receive_filter(&spawner)?;
        Ok(kept.iter().flat_map(|f| [&f.code.to_ne_bytes()[..], &[f.jt, f.jf], &f.k.to_ne_bytes()].concat()).collect())
    }

    #[test]
    fn the_first_message_is_kept_only_when_it_is_a_seccomp_program() {
        let policy = crate::seccomp::compile().unwrap();
        assert_eq!(first_message(&policy).unwrap(), policy, "the compiled policy, whole");
        assert!(first_message(&[]).is_err(), "no program");
        // Not whole instructions, and more than the kernel's 4096 of them.
        assert!(first_message(&policy[..policy.len() - 3]).is_err());
        assert!(first_message(&vec![0u8; crate::launch::MAX_FILTER + 8]).is_err());
    }
}
