//! Start-time probe of what the kernel offers thread homes: the same
//! id-mapped bind and overlay a call makes ([`crate::home::ThreadHome`]),
//! once, on the state directory's own filesystem.
//!
//! They need id-mapped mounts (Linux 5.12; tmpfs 6.3) under overlayfs (5.19),
//! which kernels of real clusters do not all have (Debian 11's and Amazon
//! Linux 2's 5.10, Ubuntu 22.04's 5.15). Version numbers lie both ways
//! (backports), so the agent asks the kernel and reports the answer at start
//! rather than on a tenant's first call.

use std::fs;
use std::io;
use std::os::fd::{AsRawFd, OwnedFd};
use std::path::Path;

use crate::home::{ThreadHome, ThreadHomeSpec};

/// Mounts and releases one thread home below `dir` (created, then removed),
/// with a user namespace made for the purpose. `Err` says why thread homes
/// cannot work on this node.
pub fn thread_homes(dir: &Path) -> io::Result<()> {
    let (state, work, target) = (dir.join("state"), dir.join("work"), dir.join("target"));
    for d in [dir, &state, &work, &target] {
        fs::create_dir_all(d)?;
    }
    let outcome = HeldUserns::new().and_then(|userns| {
        let spec = ThreadHomeSpec { state: &state, work: &work, target: &target, userns: &userns.fd, owner: 0, bytes: 1 << 20 };
        ThreadHome::mount(&spec)?.release()
    });
    let _ = fs::remove_dir_all(dir);
    outcome
}

/// A descriptor of a user namespace (with a one-id map) that a parked
/// child process keeps alive.
struct HeldUserns {
    fd: OwnedFd,
    _child: Parked,
}

/// A child blocked reading a pipe; dropping this closes the pipe (the
/// child's read ends, it exits) and reaps it.
struct Parked {
    pid: libc::pid_t,
    release: Option<OwnedFd>,
}

impl Drop for Parked {
    fn drop(&mut self) {
        drop(self.release.take());
        let _ = nix::sys::wait::waitpid(nix::unistd::Pid::from_raw(self.pid), None);
    }
}

impl HeldUserns {
    fn new() -> io::Result<HeldUserns> {
        // Close-on-exec: a process another thread starts meanwhile must not
        // keep a write end open (the child's read would never end).
        let (ready_r, ready_w) = nix::unistd::pipe2(nix::fcntl::OFlag::O_CLOEXEC)?;
        let (release_r, release_w) = nix::unistd::pipe2(nix::fcntl::OFlag::O_CLOEXEC)?;
        // SAFETY: the child runs only async-signal-safe calls (unshare, write,
        // read, _exit) on descriptors it inherited, so the agent's other
        // threads, absent in the child, cannot hold anything it needs.
        let pid = unsafe { libc::fork() };
        if pid < 0 {
            return Err(io::Error::last_os_error());
        }
        if pid == 0 {
            // SAFETY: see above; every call is async-signal-safe and the
            // buffers live on this stack.
            unsafe {
                // Its copy of the write end would keep its own read waiting.
                libc::close(release_w.as_raw_fd());
                let byte = [u8::from(libc::unshare(libc::CLONE_NEWUSER) == 0)];
                libc::write(ready_w.as_raw_fd(), byte.as_ptr().cast(), 1);
                let mut buf = [0u8; 1];
                libc::read(release_r.as_raw_fd(), buf.as_mut_ptr().cast(), 1);
                libc::_exit(0);
            }
        }
        drop((ready_w, release_r));
        let child = Parked { pid, release: Some(release_w) };
        let mut byte = [0u8; 1];
        if nix::unistd::read(&ready_r, &mut byte)? != 1 || byte[0] != 1 {
            return Err(io::Error::other("creating a user namespace failed"));
        }
        fs::write(format!("/proc/{pid}/uid_map"), "0 0 1")?;
        fs::write(format!("/proc/{pid}/gid_map"), "0 0 1")?;
        let fd = OwnedFd::from(fs::File::open(format!("/proc/{pid}/ns/user"))?);
        Ok(HeldUserns { fd, _child: child })
    }
}
