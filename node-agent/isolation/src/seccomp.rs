//! The sandbox's syscall allowlist.
//!
//! Default action: `EPERM`. Syscalls from a foreign ABI (i386 via `int 0x80`,
//! x32) kill the process. The policy is compiled once per agent with libseccomp
//! and exported as classic BPF: compiling per execution would cost ~0.35 ms on
//! the hot path.
//!
//! It reaches a program as two stacked filters ([`Programs`]), because the
//! kernel compiles (JITs) every filter a process loads: ~67 µs of CPU for the
//! whole policy's ~475 instructions on a 2-core VM. The spawner loads the
//! *base* once (the allowlist, the few refused calls the sandbox's own
//! processes make, [`SETUP`], and `clone` with any flags), so every
//! supervisor it forks, their inits and their programs inherit it already
//! compiled; each program then loads only the small *lockdown*, which
//! refuses those calls and the namespace flags again. The kernel runs both
//! on every syscall and the stricter answer wins, so what a program may do
//! is the policy exactly ([`compile`]; a test checks the two against it for
//! every syscall number). The agent hands both to each spawner once (see
//! `crate::launch`); the lockdown is kept for the programs ([`handed`]).

use libseccomp::{ScmpAction, ScmpArgCompare, ScmpCompareOp, ScmpFilterContext, ScmpSyscall};

/// Failure to build the filter.
#[derive(Debug, thiserror::Error)]
pub enum SeccompError {
    /// libseccomp refused an operation.
    #[error("seccomp {step}: {source}")]
    Libseccomp {
        /// What was being done.
        step: String,
        /// The cause.
        #[source]
        source: libseccomp::error::SeccompError,
    },
    /// Exporting the BPF program failed.
    #[error("seccomp export: {0}")]
    Export(#[from] std::io::Error),
}

/// The lockdown this process was handed to load into its programs: a
/// spawner's, from its agent's second message, kept as aligned
/// instructions. Forked supervisors inherit it, where sending it in each
/// supervisor's config was ~8 KB of hex written, read and decoded per
/// sandbox.
static HANDED: std::sync::OnceLock<Vec<libc::sock_filter>> = std::sync::OnceLock::new();

/// Keeps `filters` as this process's program; false when one was kept already.
pub(crate) fn hand(filters: Vec<libc::sock_filter>) -> bool {
    HANDED.set(filters).is_ok()
}

/// The program handed to this process; empty before, which fails every
/// program's start (the kernel refuses an empty filter, never skips it).
pub(crate) fn handed() -> &'static [libc::sock_filter] {
    HANDED.get().map_or(&[], Vec::as_slice)
}

/// Syscalls a normal interpreter workload needs. Anything else is refused.
pub const ALLOWED: &[&str] = &[
    "accept", "accept4", "access", "alarm", "arch_prctl", "bind", "brk", "cachestat", "capget", "capset",
    "chdir", "chmod", "chown", "clock_getres", "clock_gettime", "clock_nanosleep", "close", "close_range",
    "connect", "copy_file_range", "creat", "dup", "dup2", "dup3", "epoll_create", "epoll_create1",
    "epoll_ctl", "epoll_pwait", "epoll_pwait2", "epoll_wait", "eventfd", "eventfd2", "execve", "execveat",
    "exit", "exit_group", "faccessat", "faccessat2", "fadvise64", "fallocate", "fchdir", "fchmod", "fchmodat",
    "fchmodat2", "fchown", "fchownat", "fcntl", "fdatasync", "fgetxattr", "flistxattr", "flock", "fork",
    "fremovexattr", "fsetxattr", "fstat", "fstatfs", "fsync", "ftruncate", "futex", "futex_waitv",
    "futimesat", "get_robust_list", "get_thread_area", "getcpu", "getcwd", "getdents", "getdents64",
    "getegid", "geteuid", "getgid", "getgroups", "getitimer", "getpeername", "getpgid", "getpgrp", "getpid",
    "getppid", "getpriority", "getrandom", "getresgid", "getresuid", "getrlimit", "getrusage", "getsid",
    "getsockname", "getsockopt", "gettid", "gettimeofday", "getuid", "getxattr", "inotify_add_watch",
    "inotify_init", "inotify_init1", "inotify_rm_watch", "io_cancel", "io_destroy", "io_getevents",
    "io_pgetevents", "io_setup", "io_submit", "ioctl", "ioprio_get", "kill", "landlock_add_rule",
    "landlock_create_ruleset", "landlock_restrict_self", "lchown", "lgetxattr", "link", "linkat", "listen",
    "listxattr", "llistxattr", "lremovexattr", "lseek", "lsetxattr", "lstat", "madvise", "membarrier",
    "memfd_create", "mincore", "mkdir", "mkdirat", "mknod", "mknodat", "mlock", "mlock2", "mlockall", "mmap",
    "mprotect", "mq_getsetattr", "mq_notify", "mq_open", "mq_timedreceive", "mq_timedsend", "mq_unlink",
    "mremap", "msgctl", "msgget", "msgrcv", "msgsnd", "msync", "munlock", "munlockall", "munmap",
    "nanosleep", "newfstatat", "open", "openat", "openat2", "pause", "pidfd_open", "pidfd_send_signal",
    "pipe", "pipe2", "pkey_alloc", "pkey_free", "pkey_mprotect", "poll", "ppoll", "prctl", "pread64",
    "preadv", "preadv2", "prlimit64", "pselect6", "pwrite64", "pwritev", "pwritev2", "read", "readahead",
    "readlink", "readlinkat", "readv", "recvfrom", "recvmmsg", "recvmsg", "remap_file_pages", "removexattr",
    "rename", "renameat", "renameat2", "restart_syscall", "rmdir", "rseq", "rt_sigaction", "rt_sigpending",
    "rt_sigprocmask", "rt_sigqueueinfo", "rt_sigreturn", "rt_sigsuspend", "rt_sigtimedwait",
    "rt_tgsigqueueinfo", "sched_get_priority_max", "sched_get_priority_min", "sched_getaffinity",
    "sched_getattr", "sched_getparam", "sched_getscheduler", "sched_rr_get_interval", "sched_setaffinity",
    "sched_setattr", "sched_setparam", "sched_setscheduler", "sched_yield", "seccomp", "select", "semctl",
    "semget", "semop", "semtimedop", "sendfile", "sendmmsg", "sendmsg", "sendto", "set_robust_list",
    "set_thread_area", "set_tid_address", "setfsgid", "setfsuid", "setgid", "setgroups", "setitimer",
    "setpgid", "setpriority", "setregid", "setresgid", "setresuid", "setreuid", "setrlimit", "setsid",
    "setsockopt", "setuid", "setxattr", "shmat", "shmctl", "shmdt", "shmget", "shutdown", "sigaltstack",
    "signalfd", "signalfd4", "splice", "stat", "statfs", "statx", "symlink", "symlinkat",
    "sync_file_range", "sysinfo", "tee", "tgkill", "time", "timer_create", "timer_delete",
    "timer_getoverrun", "timer_gettime", "timer_settime", "timerfd_create", "timerfd_gettime",
    "timerfd_settime", "times", "tkill", "truncate", "umask", "uname", "unlink", "unlinkat", "utime",
    "utimensat", "utimes", "vfork", "wait4", "waitid", "write", "writev",
];

/// Syscalls that must never be allowed (checked by a test against [`ALLOWED`];
/// the default action refuses them).
pub const DENIED: &[&str] = &[
    "mount", "umount2", "pivot_root", "chroot", "unshare", "setns", "ptrace", "process_vm_readv",
    "process_vm_writev", "keyctl", "add_key", "request_key", "bpf", "perf_event_open", "userfaultfd",
    "io_uring_setup", "io_uring_enter", "io_uring_register", "kexec_load", "kexec_file_load",
    "init_module", "finit_module", "delete_module", "reboot", "swapon", "swapoff", "acct", "syslog",
    "open_by_handle_at", "name_to_handle_at", "iopl", "ioperm", "settimeofday", "clock_settime",
    "clock_adjtime", "adjtimex", "sethostname", "setdomainname", "fsopen", "fsmount", "fsconfig", "fspick",
    "move_mount", "open_tree", "mount_setattr", "quotactl", "lookup_dcookie", "vhangup", "uselib", "kcmp",
    "pidfd_getfd", "fanotify_init", "modify_ldt", "move_pages", "migrate_pages", "process_madvise",
    "clone3",
];

/// The calls of [`DENIED`] the sandbox's own processes make (the supervisor's
/// `clone` with namespace flags aside): init's setup, and its `ptrace` of a
/// warm interpreter to hand it the call's environment (`sandbox::environ`).
/// Allowed by the base filter, refused again by the lockdown every program
/// loads.
pub const SETUP: &[&str] = &["mount", "umount2", "pivot_root", "unshare", "sethostname", "ptrace"];

/// Namespace-creating `clone` flags (the sandbox may fork, never unshare).
pub const NAMESPACE_FLAGS: u64 = (libc::CLONE_NEWNS
    | libc::CLONE_NEWUTS
    | libc::CLONE_NEWIPC
    | libc::CLONE_NEWUSER
    | libc::CLONE_NEWPID
    | libc::CLONE_NEWNET
    | libc::CLONE_NEWCGROUP) as u64
    | 0x80; // CLONE_NEWTIME

/// `personality(2)` values a program may set (Linux defaults and queries only).
pub const PERSONALITIES: &[u64] = &[0x0, 0x0008, 0x20000, 0x20008, 0xffff_ffff];

/// Sockets a program may open, as (domain, type, protocol); `SOCK_NONBLOCK`
/// and `SOCK_CLOEXEC` may be added to the type. Anything else (raw and
/// packet sockets, ICMP, SCTP, vsock, other netlink families) is refused.
/// `NETLINK_ROUTE` is there so interface listings work (Node's
/// `os.networkInterfaces()`, Python's `socket.if_nameindex()`); without
/// `CAP_NET_ADMIN` it can only read the sandbox's own network namespace.
pub const SOCKETS: &[(i32, i32, i32)] = &[
    (libc::AF_UNIX, libc::SOCK_STREAM, 0),
    (libc::AF_UNIX, libc::SOCK_DGRAM, 0),
    (libc::AF_UNIX, libc::SOCK_SEQPACKET, 0),
    (libc::AF_INET, libc::SOCK_STREAM, 0),
    (libc::AF_INET, libc::SOCK_STREAM, libc::IPPROTO_TCP),
    (libc::AF_INET, libc::SOCK_DGRAM, 0),
    (libc::AF_INET, libc::SOCK_DGRAM, libc::IPPROTO_UDP),
    (libc::AF_INET6, libc::SOCK_STREAM, 0),
    (libc::AF_INET6, libc::SOCK_STREAM, libc::IPPROTO_TCP),
    (libc::AF_INET6, libc::SOCK_DGRAM, 0),
    (libc::AF_INET6, libc::SOCK_DGRAM, libc::IPPROTO_UDP),
    (libc::AF_NETLINK, libc::SOCK_RAW, libc::NETLINK_ROUTE),
    (libc::AF_NETLINK, libc::SOCK_DGRAM, libc::NETLINK_ROUTE),
];
const SOCK_TYPE_MASK: u64 = 0xf;

/// Syscalls that succeed without doing anything: `sync(2)` and `syncfs(2)`
/// would make one sandbox flush every dirty page of the host's filesystems
/// (a cheap way to stall its neighbours); a program's own files are made
/// durable by `fsync`, which stays.
pub const NO_OPS: &[&str] = &["sync", "syncfs"];

fn lib(step: impl Into<String>) -> impl FnOnce(libseccomp::error::SeccompError) -> SeccompError {
    let step = step.into();
    move |source| SeccompError::Libseccomp { step, source }
}

/// The two filters a program runs under (classic BPF, `struct
/// sock_filter[]` bytes each): together, the policy.
#[derive(Debug, Clone)]
pub struct Programs {
    /// Loaded once by each spawner: the allowlist, [`SETUP`] and any `clone`.
    pub base: Vec<u8>,
    /// Loaded by each program over the base: [`SETUP`] and namespace-creating
    /// `clone` refused, everything else left to the base.
    pub lockdown: Vec<u8>,
}

/// Builds the base and the lockdown.
pub fn compile_programs() -> Result<Programs, SeccompError> {
    Ok(Programs { base: allowlist(Stage::Base)?, lockdown: lockdown()? })
}

/// Builds the whole policy as one program: what a program may do under the
/// base and the lockdown stacked (the reference they are tested against).
pub fn compile() -> Result<Vec<u8>, SeccompError> {
    allowlist(Stage::Program)
}

/// Who an allowlist is for: the program alone, or the base every process a
/// spawner forks runs under (setup included).
#[derive(Clone, Copy, PartialEq)]
enum Stage {
    Program,
    Base,
}

fn allowlist(stage: Stage) -> Result<Vec<u8>, SeccompError> {
    let mut ctx = ScmpFilterContext::new(ScmpAction::Errno(libc::EPERM)).map_err(lib("init"))?;
    ctx.set_act_badarch(ScmpAction::KillProcess).map_err(lib("badarch"))?;
    // A binary tree over syscall numbers: a handful of comparisons per syscall
    // instead of a linear walk over ~300 rules (interpreters make thousands of
    // syscalls at start-up).
    ctx.set_ctl_optimize(2).map_err(lib("optimize"))?;
    let setup = if stage == Stage::Base { SETUP } else { &[] };
    // The native arch (x86_64 here) only: i386 and x32 entry points hit badarch.
    for name in ALLOWED.iter().chain(setup) {
        // Names unknown to this architecture (e.g. `open` on arm64) are skipped.
        let Ok(call) = ScmpSyscall::from_name(name) else { continue };
        ctx.add_rule(ScmpAction::Allow, call).map_err(lib(format!("allow {name}")))?;
    }
    add_conditional_rules(&mut ctx, stage)?;
    export(&ctx)
}

/// Everything allowed (the base decides) but [`SETUP`] and `clone` with any
/// namespace flag, refused as the policy refuses them.
fn lockdown() -> Result<Vec<u8>, SeccompError> {
    let mut ctx = ScmpFilterContext::new(ScmpAction::Allow).map_err(lib("init"))?;
    ctx.set_act_badarch(ScmpAction::KillProcess).map_err(lib("badarch"))?;
    let refuse = ScmpAction::Errno(libc::EPERM);
    for name in SETUP {
        let call = ScmpSyscall::from_name(name).map_err(lib(format!("resolve {name}")))?;
        ctx.add_rule(refuse, call).map_err(lib(format!("refuse {name}")))?;
    }
    let clone = ScmpSyscall::from_name("clone").map_err(lib("resolve clone"))?;
    // One rule per flag: any of them set is refused.
    for bit in (0..64).map(|b| 1u64 << b).filter(|bit| NAMESPACE_FLAGS & bit != 0) {
        let set = ScmpArgCompare::new(0, ScmpCompareOp::MaskedEqual(bit), bit);
        ctx.add_rule_conditional(refuse, clone, &[set]).map_err(lib("clone"))?;
    }
    export(&ctx)
}

fn add_conditional_rules(ctx: &mut ScmpFilterContext, stage: Stage) -> Result<(), SeccompError> {
    let sys = |n: &str| ScmpSyscall::from_name(n).map_err(lib(format!("resolve {n}")));
    // fork/threads yes, new namespaces no (the base lets the supervisor make
    // them; the lockdown refuses them again).
    match stage {
        Stage::Program => {
            let no_ns = ScmpArgCompare::new(0, ScmpCompareOp::MaskedEqual(NAMESPACE_FLAGS), 0);
            ctx.add_rule_conditional(ScmpAction::Allow, sys("clone")?, &[no_ns]).map_err(lib("clone"))?;
        }
        Stage::Base => {
            ctx.add_rule(ScmpAction::Allow, sys("clone")?).map_err(lib("clone"))?;
        }
    }
    // clone3 passes flags behind a pointer a filter cannot read: ENOSYS makes
    // libc fall back to clone(2), where the flags are checked.
    ctx.add_rule(ScmpAction::Errno(libc::ENOSYS), sys("clone3")?).map_err(lib("clone3"))?;
    for p in PERSONALITIES {
        let cmp = ScmpArgCompare::new(0, ScmpCompareOp::Equal, *p);
        ctx.add_rule_conditional(ScmpAction::Allow, sys("personality")?, &[cmp]).map_err(lib("personality"))?;
    }
    for &(domain, ty, protocol) in SOCKETS {
        let d = ScmpArgCompare::new(0, ScmpCompareOp::Equal, domain as u64);
        let t = ScmpArgCompare::new(1, ScmpCompareOp::MaskedEqual(SOCK_TYPE_MASK), ty as u64);
        let p = ScmpArgCompare::new(2, ScmpCompareOp::Equal, protocol as u64);
        ctx.add_rule_conditional(ScmpAction::Allow, sys("socket")?, &[d, t, p]).map_err(lib("socket"))?;
    }
    for name in NO_OPS {
        ctx.add_rule(ScmpAction::Errno(0), sys(name)?).map_err(lib(format!("no-op {name}")))?;
    }
    let unix = ScmpArgCompare::new(0, ScmpCompareOp::Equal, libc::AF_UNIX as u64);
    ctx.add_rule_conditional(ScmpAction::Allow, sys("socketpair")?, &[unix]).map_err(lib("socketpair"))?;
    Ok(())
}

fn export(ctx: &ScmpFilterContext) -> Result<Vec<u8>, SeccompError> {
    use std::io::{Read, Seek};
    let mut file = tempfile_in_memory()?;
    ctx.export_bpf(&mut file).map_err(lib("export"))?;
    file.rewind()?;
    let mut bpf = Vec::new();
    file.read_to_end(&mut bpf)?;
    Ok(bpf)
}

fn tempfile_in_memory() -> std::io::Result<std::fs::File> {
    let fd = nix::sys::memfd::memfd_create(c"warren-seccomp", nix::sys::memfd::MFdFlags::MFD_CLOEXEC)
        .map_err(std::io::Error::from)?;
    Ok(std::fs::File::from(fd))
}

#[cfg(test)]
#[path = "seccomp_stacking_tests.rs"]
mod stacking_tests;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn allowlist_and_denylist_are_disjoint() {
        for name in DENIED {
            assert!(!ALLOWED.contains(name), "{name} is both allowed and denied");
        }
        for bad in ["personality", "socket", "socketpair", "clone"] {
            assert!(!ALLOWED.contains(&bad), "{bad} must only be allowed conditionally");
        }
    }

    #[test]
    fn namespace_mask_covers_every_namespace_flag() {
        for flag in [
            libc::CLONE_NEWNS,
            libc::CLONE_NEWUTS,
            libc::CLONE_NEWIPC,
            libc::CLONE_NEWUSER,
            libc::CLONE_NEWPID,
            libc::CLONE_NEWNET,
            libc::CLONE_NEWCGROUP,
        ] {
            assert_ne!(NAMESPACE_FLAGS & flag as u64, 0);
        }
        // A plain fork (SIGCHLD) and a thread (CLONE_VM|CLONE_THREAD|...) pass.
        let thread = (libc::CLONE_VM | libc::CLONE_FS | libc::CLONE_FILES | libc::CLONE_SIGHAND | libc::CLONE_THREAD) as u64;
        assert_eq!(thread & NAMESPACE_FLAGS, 0);
    }

    #[test]
    fn socket_policy_refuses_raw_packet_and_vsock() {
        for &(domain, ty, protocol) in SOCKETS {
            assert!(![libc::AF_PACKET, libc::AF_VSOCK].contains(&domain));
            assert!(ty != libc::SOCK_RAW || (domain == libc::AF_NETLINK && protocol == libc::NETLINK_ROUTE));
        }
        for name in NO_OPS {
            assert!(!ALLOWED.contains(name), "{name} is a no-op, not allowed");
        }
    }

    #[test]
    fn compiles_to_a_bpf_program() {
        let bpf = compile().expect("policy compiles");
        assert!(!bpf.is_empty());
        assert_eq!(bpf.len() % 8, 0, "sock_filter is 8 bytes");
    }

    /// Runs in a forked child of the (multi-threaded) test process: raw
    /// syscalls only, no allocation. Returns 0, or the number of the first
    /// probe that did not behave.
    fn probe_filter(filters: &[&[libc::sock_filter]]) -> i32 {
        fn errno() -> i32 {
            // SAFETY: reads this thread's errno.
            unsafe { *libc::__errno_location() }
        }
        fn refused(ret: libc::c_long, err: i32) -> bool {
            ret == -1 && errno() == err
        }
        // SAFETY: each call is a plain syscall with integer or null arguments;
        // a clone that unexpectedly succeeds exits at once in the new child.
        unsafe {
            if libc::prctl(libc::PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0 {
                return 100;
            }
            for f in filters {
                if crate::sandbox::sys::install_seccomp(f).is_err() {
                    return 100;
                }
            }
            let sock = |d: i32, t: i32, p: i32| libc::syscall(libc::SYS_socket, d, t, p);
            let probes: [bool; 14] = [
                refused(libc::syscall(libc::SYS_unshare, libc::CLONE_NEWUSER), libc::EPERM),
                refused(libc::syscall(libc::SYS_mount, 0usize, 0usize, 0usize, 0usize, 0usize), libc::EPERM),
                refused(libc::syscall(libc::SYS_ptrace, libc::PTRACE_TRACEME, 0, 0, 0), libc::EPERM),
                {
                    let r = libc::syscall(libc::SYS_clone, (libc::CLONE_NEWUSER | libc::SIGCHLD) as libc::c_ulong, 0usize, 0usize, 0usize, 0usize);
                    if r == 0 {
                        libc::_exit(0);
                    }
                    refused(r, libc::EPERM)
                },
                refused(libc::syscall(libc::SYS_clone3, 0usize, 0usize), libc::ENOSYS),
                refused(libc::syscall(libc::SYS_personality, 0x0040000), libc::EPERM),
                refused(sock(libc::AF_PACKET, libc::SOCK_RAW, 0), libc::EPERM),
                refused(sock(libc::AF_INET, libc::SOCK_RAW, libc::IPPROTO_ICMP), libc::EPERM),
                refused(sock(libc::AF_INET, libc::SOCK_DGRAM, libc::IPPROTO_ICMP), libc::EPERM),
                refused(sock(libc::AF_NETLINK, libc::SOCK_RAW, libc::NETLINK_AUDIT), libc::EPERM),
                sock(libc::AF_NETLINK, libc::SOCK_RAW | libc::SOCK_CLOEXEC, libc::NETLINK_ROUTE) >= 0,
                sock(libc::AF_INET6, libc::SOCK_STREAM | libc::SOCK_NONBLOCK, 0) >= 0,
                // A no-op: even a bad descriptor "succeeds" (the kernel says EBADF).
                libc::syscall(libc::SYS_syncfs, -1) == 0,
                libc::syscall(libc::SYS_getpid) > 0,
            ];
            match probes.iter().position(|ok| !ok) {
                Some(i) => i as i32 + 1,
                None => 0,
            }
        }
    }

    /// Runs [`probe_filter`] under `filters` (loaded in order) in a forked
    /// child; its wait status.
    pub(super) fn probe_in_child(filters: &[&[libc::sock_filter]]) -> i32 {
        // SAFETY: the child makes raw syscalls only and leaves with _exit, so
        // no lock another test thread held at fork time is ever needed.
        let pid = unsafe { libc::fork() };
        assert!(pid >= 0, "fork failed");
        if pid == 0 {
            let code = probe_filter(filters);
            // SAFETY: ends the forked child without running the parent's destructors.
            unsafe { libc::_exit(code) };
        }
        let mut status = 0;
        // SAFETY: waits for the child forked above.
        assert_eq!(unsafe { libc::waitpid(pid, &mut status, 0) }, pid);
        status
    }

    #[test]
    fn the_loaded_filter_refuses_what_it_must_and_allows_what_it_may() {
        let filters = crate::sandbox::sys::seccomp_filters(&compile().unwrap()).unwrap();
        let status = probe_in_child(&[&filters]);
        assert!(libc::WIFEXITED(status), "the probe child died: status {status:#x}");
        assert_eq!(libc::WEXITSTATUS(status), 0, "probe #{} behaved wrongly under the filter", libc::WEXITSTATUS(status));
    }

    #[test]
    fn an_allow_all_filter_fails_the_probes() {
        // The probes above would catch a filter that lets everything through.
        let allow_all = [libc::sock_filter { code: (libc::BPF_RET | libc::BPF_K) as u16, jt: 0, jf: 0, k: libc::SECCOMP_RET_ALLOW }];
        let status = probe_in_child(&[&allow_all]);
        assert!(libc::WIFEXITED(status) && libc::WEXITSTATUS(status) != 0, "status {status:#x}");
    }
}
