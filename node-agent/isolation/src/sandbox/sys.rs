//! Thin wrappers over syscalls that nix does not cover. Each `unsafe` block
//! states why it is sound.

use std::io;
use std::os::fd::RawFd;

fn check(ret: libc::c_long) -> io::Result<libc::c_long> {
    if ret < 0 { Err(io::Error::last_os_error()) } else { Ok(ret) }
}

/// `clone(2)` used like `fork(2)` with extra namespace flags. Returns 0 in the
/// child and the child's pid in the parent.
///
/// Only call from a single-threaded process (the supervisor is one).
pub fn fork_into_namespaces(ns_flags: libc::c_int) -> io::Result<libc::pid_t> {
    let flags = (ns_flags | libc::SIGCHLD) as libc::c_ulong;
    // SAFETY: with a null stack pointer clone() behaves like fork(): the child
    // gets a copy of the address space and resumes here. The caller is
    // single-threaded, so no lock can be held by a thread that does not exist
    // in the child.
    let ret = unsafe { libc::syscall(libc::SYS_clone, flags, 0usize, 0usize, 0usize, 0usize) };
    check(ret).map(|pid| pid as libc::pid_t)
}

/// `fork(2)` returning, in the parent, a pidfd of the child made with it
/// (`CLONE_PIDFD`, Linux 5.2): nothing can reap the child and reuse its pid
/// before the pidfd exists. Returns `(0, None)` in the child.
///
/// Only call from a single-threaded process (the spawner is one).
pub fn fork_with_pidfd() -> io::Result<(libc::pid_t, Option<std::os::fd::OwnedFd>)> {
    let flags = (libc::CLONE_PIDFD | libc::SIGCHLD) as libc::c_ulong;
    let mut pidfd: libc::c_int = -1;
    // SAFETY: as in `fork_into_namespaces` (a null stack: fork semantics in
    // a single-threaded caller). With CLONE_PIDFD the kernel writes the
    // pidfd to the third argument (parent_tid on every architecture), which
    // points at `pidfd`, alive for the call.
    let ret = unsafe { libc::syscall(libc::SYS_clone, flags, 0usize, &mut pidfd as *mut libc::c_int, 0usize, 0usize) };
    let pid = check(ret)? as libc::pid_t;
    if pid == 0 {
        return Ok((0, None));
    }
    // SAFETY: the kernel made `pidfd` for us; nothing else owns it.
    Ok((pid, Some(unsafe { <std::os::fd::OwnedFd as std::os::fd::FromRawFd>::from_raw_fd(pidfd) })))
}

/// Closes every descriptor from `first` up (`close_range`, Linux 5.9;
/// before it, each one listed in /proc/self/fd). Allocates in the fallback:
/// call only single-threaded.
pub fn close_from(first: u32) -> io::Result<()> {
    close_between(first, u32::MAX)
}

/// Closes every descriptor numbered `first..=last`, as [`close_from`].
pub fn close_between(first: u32, last: u32) -> io::Result<()> {
    range_or(first, last, 0, || {
        each_listed(first, last, |fd| {
            // SAFETY: close only closes a descriptor of this process, which the
            // caller owns; the directory's own (closed since listed) gives EBADF.
            unsafe { libc::close(fd) };
            Ok(())
        })
    })
}

/// `close_range(first, last, flags)`; `fallback` where the kernel lacks it
/// or the flag (ENOSYS, EINVAL).
fn range_or(first: u32, last: u32, flags: libc::c_uint, fallback: impl FnOnce() -> io::Result<()>) -> io::Result<()> {
    if first > last {
        return Ok(());
    }
    // SAFETY: close_range only closes, or changes the flags of, descriptors
    // of this process; the caller owns every one in the range.
    let ret = unsafe { libc::syscall(libc::SYS_close_range, first, last, flags) };
    match check(ret) {
        Ok(_) => Ok(()),
        Err(e) if matches!(e.raw_os_error(), Some(libc::ENOSYS | libc::EINVAL)) => fallback(),
        Err(e) => Err(e),
    }
}

/// `each` on every open descriptor numbered `first..=last`, listed in
/// /proc/self/fd first (the listing directory's own descriptor is among them).
fn each_listed(first: u32, last: u32, each: impl FnMut(RawFd) -> io::Result<()>) -> io::Result<()> {
    let fds: Vec<RawFd> = std::fs::read_dir("/proc/self/fd")?
        .flatten()
        .filter_map(|e| e.file_name().to_str()?.parse().ok())
        .filter(|fd: &RawFd| u32::try_from(*fd).is_ok_and(|fd| (first..=last).contains(&fd)))
        .collect();
    fds.into_iter().try_for_each(each)
}

/// Every signal back to its default action and none blocked: what a shell
/// would hand a program. A disposition of "ignore" survives `execve`, and
/// `warren-sandbox` (a Rust binary) ignores SIGPIPE from its start, so
/// without this `yes | head -1` would print "Broken pipe" instead of ending
/// quietly. Raw `rt_sigaction`, as the C library refuses the signals it
/// reserves for itself (32 and 33), which were ignored too.
pub fn reset_signals() -> io::Result<()> {
    // The kernel's `struct sigaction`, all zero: SIG_DFL, no flags, no
    // restorer, an empty mask (its size on every 64-bit architecture).
    let action = [0u64; 4];
    for signal in 1..=64 {
        if signal == libc::SIGKILL || signal == libc::SIGSTOP {
            continue;
        }
        // SAFETY: rt_sigaction with a valid, zeroed action that outlives the
        // call, no old action asked for, and the kernel's sigset size (8).
        let ret = unsafe { libc::syscall(libc::SYS_rt_sigaction, signal, action.as_ptr(), std::ptr::null_mut::<u8>(), 8usize) };
        check(ret)?;
    }
    nix::sys::signal::SigSet::empty().thread_set_mask().map_err(io::Error::from)
}

/// `pivot_root(new_root, put_old)`.
pub fn pivot_root(new_root: &std::ffi::CStr, put_old: &std::ffi::CStr) -> io::Result<()> {
    // SAFETY: both arguments are valid NUL-terminated strings that outlive the call.
    let ret = unsafe { libc::syscall(libc::SYS_pivot_root, new_root.as_ptr(), put_old.as_ptr()) };
    check(ret).map(drop)
}

/// Marks every descriptor from `first` up as close-on-exec.
///
/// `close_range(CLOSE_RANGE_CLOEXEC)` is Linux 5.11+; before it (5.10:
/// Debian 11, Amazon Linux 2) the call fails with ENOSYS or EINVAL and each
/// open descriptor listed in /proc/self/fd is marked one by one. Allocates
/// in that case: call only where that is safe (the program process is
/// single-threaded).
pub fn cloexec_from(first: u32) -> io::Result<()> {
    const CLOSE_RANGE_CLOEXEC: libc::c_uint = 1 << 2;
    range_or(first, u32::MAX, CLOSE_RANGE_CLOEXEC, || cloexec_listed(first))
}

fn cloexec_listed(first: u32) -> io::Result<()> {
    each_listed(first, u32::MAX, |fd| {
        // SAFETY: F_SETFD only changes the flags of a descriptor of this
        // process; one that closed since it was listed gives EBADF.
        let ret = unsafe { libc::fcntl(fd, libc::F_SETFD, libc::FD_CLOEXEC) };
        if ret < 0 && io::Error::last_os_error().raw_os_error() != Some(libc::EBADF) {
            return Err(io::Error::last_os_error());
        }
        Ok(())
    })
}

/// `bpf` (`struct sock_filter[]` bytes) as aligned filter instructions.
pub fn seccomp_filters(bpf: &[u8]) -> io::Result<Vec<libc::sock_filter>> {
    if bpf.is_empty() || !bpf.len().is_multiple_of(std::mem::size_of::<libc::sock_filter>()) {
        return Err(io::Error::new(io::ErrorKind::InvalidInput, "malformed BPF program"));
    }
    // Copy into properly aligned storage: the byte buffer has alignment 1.
    Ok(bpf
        .chunks_exact(8)
        .map(|c| libc::sock_filter {
            code: u16::from_ne_bytes([c[0], c[1]]),
            jt: c[2],
            jf: c[3],
            k: u32::from_ne_bytes([c[4], c[5], c[6], c[7]]),
        })
        .collect())
}

/// Installs filter instructions; allocates nothing (callable after fork in a
/// multi-threaded process). `no_new_privs` must already be set.
pub fn install_seccomp(filters: &[libc::sock_filter]) -> io::Result<()> {
    let len = u16::try_from(filters.len()).map_err(|_| io::Error::from_raw_os_error(libc::E2BIG))?;
    let prog = libc::sock_fprog { len, filter: filters.as_ptr() as *mut libc::sock_filter };
    const SECCOMP_SET_MODE_FILTER: libc::c_ulong = 1;
    // SAFETY: `prog` points at `filters`, which lives until after the call; the
    // kernel copies the program.
    let ret = unsafe { libc::syscall(libc::SYS_seccomp, SECCOMP_SET_MODE_FILTER, 0usize, &prog as *const libc::sock_fprog) };
    check(ret).map(drop)
}

/// `pidfd_open(pid, 0)`.
pub fn pidfd_open(pid: libc::pid_t) -> io::Result<RawFd> {
    // SAFETY: plain syscall with integer arguments.
    let ret = unsafe { libc::syscall(libc::SYS_pidfd_open, pid, 0) };
    check(ret).map(|fd| fd as RawFd)
}

/// Drops every capability from the bounding set (needs CAP_SETPCAP in the namespace).
pub fn drop_bounding_set() -> io::Result<()> {
    for cap in 0..=63 {
        // SAFETY: prctl with integer arguments only.
        let ret = unsafe { libc::prctl(libc::PR_CAPBSET_DROP, cap, 0, 0, 0) };
        if ret < 0 {
            let err = io::Error::last_os_error();
            // EINVAL: past the last capability this kernel knows.
            if err.raw_os_error() == Some(libc::EINVAL) {
                break;
            }
            return Err(err);
        }
    }
    Ok(())
}

/// Clears the effective, permitted and inheritable capability sets.
pub fn clear_capabilities() -> io::Result<()> {
    #[repr(C)]
    struct Header {
        version: u32,
        pid: i32,
    }
    #[repr(C)]
    #[derive(Clone, Copy)]
    struct Data {
        effective: u32,
        permitted: u32,
        inheritable: u32,
    }
    const LINUX_CAPABILITY_VERSION_3: u32 = 0x2008_0522;
    let header = Header { version: LINUX_CAPABILITY_VERSION_3, pid: 0 };
    let data = [Data { effective: 0, permitted: 0, inheritable: 0 }; 2];
    // SAFETY: header and data match the kernel's v3 layout and outlive the call.
    let ret = unsafe { libc::syscall(libc::SYS_capset, &header as *const Header, data.as_ptr()) };
    check(ret)?;
    // SAFETY: prctl with integer arguments only.
    let ret = unsafe { libc::prctl(libc::PR_CAP_AMBIENT, libc::PR_CAP_AMBIENT_CLEAR_ALL, 0, 0, 0) };
    check(ret as libc::c_long).map(drop)
}

/// Sets `no_new_privs`, so setuid/file-capability binaries cannot raise privileges.
pub fn set_no_new_privs() -> io::Result<()> {
    // SAFETY: prctl with integer arguments only.
    let ret = unsafe { libc::prctl(libc::PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) };
    check(ret as libc::c_long).map(drop)
}

/// Sets whether this process is dumpable. A non-dumpable process cannot be
/// ptraced by, and its /proc files are not readable to, processes of the same uid.
pub fn set_dumpable(dumpable: bool) -> io::Result<()> {
    // SAFETY: prctl with integer arguments only.
    let ret = unsafe { libc::prctl(libc::PR_SET_DUMPABLE, libc::c_ulong::from(dumpable), 0, 0, 0) };
    check(ret as libc::c_long).map(drop)
}

/// Kills this process when its parent dies.
pub fn set_parent_death_signal() -> io::Result<()> {
    // SAFETY: prctl with integer arguments only.
    let ret = unsafe { libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL, 0, 0, 0) };
    check(ret as libc::c_long).map(drop)
}

/// Brings the loopback interface of the current network namespace up.
pub fn loopback_up() -> io::Result<()> {
    // SAFETY: socket() with constant arguments; the fd is closed below.
    let fd = unsafe { libc::socket(libc::AF_INET, libc::SOCK_DGRAM | libc::SOCK_CLOEXEC, 0) };
    if fd < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: ifreq is plain data; all-zero is a valid value.
    let mut req: libc::ifreq = unsafe { std::mem::zeroed() };
    for (dst, src) in req.ifr_name.iter_mut().zip(b"lo\0") {
        *dst = *src as libc::c_char;
    }
    // SAFETY: `req` is a valid ifreq for SIOCGIFFLAGS/SIOCSIFFLAGS on `fd`.
    let result = unsafe {
        if libc::ioctl(fd, libc::SIOCGIFFLAGS, &mut req) < 0 {
            Err(io::Error::last_os_error())
        } else {
            req.ifr_ifru.ifru_flags |= libc::IFF_UP as libc::c_short;
            if libc::ioctl(fd, libc::SIOCSIFFLAGS, &req) < 0 { Err(io::Error::last_os_error()) } else { Ok(()) }
        }
    };
    // SAFETY: fd was opened above and is not used afterwards.
    unsafe { libc::close(fd) };
    result
}

/// `dup2(old, new)` without close-on-exec on `new`; `new` is closed first
/// if open. The caller owns `new` afterwards.
pub fn dup_to(old: RawFd, new: RawFd) -> io::Result<()> {
    // SAFETY: dup2 only changes this process's descriptor table; the caller
    // chose `new` as a number nothing else in this process uses.
    let ret = unsafe { libc::dup2(old, new) };
    check(ret as libc::c_long).map(drop)
}

/// A duplicate of `fd` numbered `min` or higher, close-on-exec.
pub fn dup_above(fd: RawFd, min: RawFd) -> io::Result<RawFd> {
    // SAFETY: F_DUPFD_CLOEXEC only adds a descriptor to this process's table.
    let ret = unsafe { libc::fcntl(fd, libc::F_DUPFD_CLOEXEC, min) };
    check(ret as libc::c_long).map(|fd| fd as RawFd)
}

/// `prlimit(2)`: sets soft and hard `resource` of `pid` (0: this process).
pub fn set_rlimit_of(pid: libc::pid_t, resource: libc::__rlimit_resource_t, value: u64) -> io::Result<()> {
    let limit = libc::rlimit64 { rlim_cur: value, rlim_max: value };
    // SAFETY: `limit` is a valid rlimit64 for the duration of the call; the
    // old-value pointer is null (not asked for).
    let ret = unsafe { libc::prlimit64(pid, resource, &limit, std::ptr::null_mut()) };
    check(ret as libc::c_long).map(drop)
}

/// `_exit(2)`: leave without running destructors or atexit handlers (used in
/// forked children, where those belong to the parent).
pub fn exit_now(code: i32) -> ! {
    // SAFETY: _exit never returns and is async-signal-safe.
    unsafe { libc::_exit(code) }
}

#[cfg(test)]
mod tests {
    use std::os::fd::AsRawFd;

    #[test]
    fn the_fallback_marks_listed_descriptors_close_on_exec() {
        // Without O_CLOEXEC: nix's open keeps exactly the flags given.
        let fd = nix::fcntl::open("/dev/null", nix::fcntl::OFlag::O_RDONLY, nix::sys::stat::Mode::empty()).unwrap();
        let flags = || nix::fcntl::fcntl(&fd, nix::fcntl::FcntlArg::F_GETFD).unwrap();
        assert_eq!(flags() & libc::FD_CLOEXEC, 0);
        super::cloexec_listed(fd.as_raw_fd() as u32).unwrap();
        assert_eq!(flags() & libc::FD_CLOEXEC, libc::FD_CLOEXEC);
    }
}
