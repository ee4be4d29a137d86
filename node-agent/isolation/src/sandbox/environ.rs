//! What `/proc/<pid>/environ` of a warm interpreter shows.
//!
//! The kernel shows the environment a process was exec'd with, and a warm
//! interpreter was exec'd before its call existed; a cold start was exec'd
//! with the call's. At Go, before the interpreter reads its call, init points
//! the kernel at the call's environment: it attaches to the interpreter
//! (blocked in `read` on its control socket), has it run `mmap` (a page for
//! the new block), `brk(0)` and `prctl(PR_SET_MM, PR_SET_MM_MAP)` — which a
//! process may do to itself unprivileged, as checkpoint/restore tools do —
//! then puts its registers back and detaches; the interrupted `read`
//! restarts. Anything unexpected is an error, and the call starts cold.

use std::fs::File;
use std::io;
use std::os::unix::fs::FileExt;

use nix::sys::ptrace;
use nix::sys::wait::{waitpid, WaitPidFlag, WaitStatus};
use nix::unistd::Pid;

/// Longest environment handed over this way (a cold start's limit is the
/// kernel's argument space; a call's environment is far smaller).
const MAX_BLOCK: usize = 1 << 20;

/// Whether init may do this on this node: x86_64, and Yama's ptrace scope
/// (`/proc/sys/kernel/yama/ptrace_scope`, when present) not 3, "no attach".
/// Init attaches only to its own child, which scopes 1 and 2 allow (it holds
/// CAP_SYS_PTRACE in the sandbox's user namespace).
pub fn available(yama_scope: Option<&str>) -> Result<(), String> {
    if !arch::SUPPORTED {
        return Err(format!("handing over a warm interpreter's environment is implemented for x86_64, not {}", std::env::consts::ARCH));
    }
    match yama_scope.map(str::trim) {
        Some("3") => Err("kernel.yama.ptrace_scope is 3: a warm interpreter's environment cannot be handed over".into()),
        _ => Ok(()),
    }
}

/// The call's environment as execve lays it out: `name=value\0` each.
pub fn block(env: &[(String, String)]) -> Vec<u8> {
    let mut out = Vec::new();
    for (k, v) in env {
        out.extend_from_slice(k.as_bytes());
        out.push(b'=');
        out.extend_from_slice(v.as_bytes());
        out.push(0);
    }
    out
}

/// Makes `/proc/<pid>/environ` of init's child `pid` read `block`.
pub fn show(pid: Pid, block: &[u8]) -> io::Result<()> {
    if block.len() > MAX_BLOCK {
        return Err(io::Error::other("environment too large"));
    }
    if !arch::SUPPORTED {
        return Err(io::Error::new(io::ErrorKind::Unsupported, "only on x86_64"));
    }
    ptrace::seize(pid, ptrace::Options::PTRACE_O_EXITKILL)?;
    let r = attached(pid, block);
    // Detaching resumes it; on failure the caller kills it.
    let _ = ptrace::detach(pid, None);
    r
}

/// How often init looks for the interpreter blocked in its read (it says
/// "ready" just before it reads), and how long it lets it run in between.
const ATTEMPTS: u32 = 50;
const BETWEEN: std::time::Duration = std::time::Duration::from_micros(200);

fn attached(pid: Pid, block: &[u8]) -> io::Result<()> {
    let mem = std::fs::OpenOptions::new().read(true).write(true).open(format!("/proc/{pid}/mem"))?;
    let mut attempt = 0;
    loop {
        attempt += 1;
        ptrace::interrupt(pid)?;
        stopped(pid)?;
        let saved = arch::getregs(pid)?;
        match arch::gadget(&saved, &mem) {
            Ok(gadget) => return inject(pid, &mem, saved, gadget, block),
            Err(e) if attempt >= ATTEMPTS => return Err(e),
            Err(_) => {
                ptrace::cont(pid, None)?;
                std::thread::sleep(BETWEEN);
            }
        }
    }
}

/// Waits for `pid`'s next ptrace stop.
fn stopped(pid: Pid) -> io::Result<()> {
    loop {
        match waitpid(pid, Some(WaitPidFlag::__WALL)) {
            Ok(WaitStatus::PtraceEvent(..) | WaitStatus::Stopped(..)) => return Ok(()),
            Err(nix::errno::Errno::EINTR) => continue,
            Ok(other) => return Err(io::Error::other(format!("interpreter {other:?}"))),
            Err(e) => return Err(e.into()),
        }
    }
}

fn inject(pid: Pid, mem: &File, saved: arch::Regs, gadget: u64, block: &[u8]) -> io::Result<()> {
    let r = set_environ(pid, mem, &saved, gadget, block);
    // Its registers as they were: the interrupted read restarts on resume.
    arch::setregs(pid, saved)?;
    r
}

fn set_environ(pid: Pid, mem: &File, saved: &arch::Regs, gadget: u64, block: &[u8]) -> io::Result<()> {
    let call = |nr: libc::c_long, args: [u64; 6]| arch::syscall(pid, saved, gadget, nr as u64, args);
    let map_at = block.len().next_multiple_of(8);
    let len = (map_at + MM_MAP_SIZE).next_multiple_of(4096) as u64;
    let prot = (libc::PROT_READ | libc::PROT_WRITE) as u64;
    let flags = (libc::MAP_PRIVATE | libc::MAP_ANONYMOUS) as u64;
    // Never unmapped: the kernel reads the block for as long as it lives.
    let page = errno(call(libc::SYS_mmap, [0, len, prot, flags, u64::MAX, 0])?)?;
    let brk = call(libc::SYS_brk, [0; 6])?;
    let fields = StatFields::read(pid)?;
    let env = (page, page + block.len() as u64);
    mem.write_all_at(block, page)?;
    mem.write_all_at(&fields.mm_map(brk, env), page + map_at as u64)?;
    let args = [libc::PR_SET_MM as u64, libc::PR_SET_MM_MAP as u64, page + map_at as u64, MM_MAP_SIZE as u64, 0, 0];
    errno(call(libc::SYS_prctl, args)?).map(drop)
}

/// A raw syscall's return: -4095..-1 is an errno.
fn errno(ret: u64) -> io::Result<u64> {
    match ret as i64 {
        e @ -4095..=-1 => Err(io::Error::from_raw_os_error(-e as i32)),
        _ => Ok(ret),
    }
}

/// `struct prctl_mm_map`: eleven addresses, the auxv pointer, its size and
/// `exe_fd` (u32 each).
const MM_MAP_SIZE: usize = 12 * 8 + 4 + 4;

/// The address-space fields `PR_SET_MM_MAP` must be given back unchanged,
/// from `/proc/<pid>/stat` (proc(5) fields 26–28 and 45–49).
struct StatFields {
    start_code: u64,
    end_code: u64,
    start_stack: u64,
    start_data: u64,
    end_data: u64,
    start_brk: u64,
    arg_start: u64,
    arg_end: u64,
}

impl StatFields {
    fn read(pid: Pid) -> io::Result<Self> {
        let stat = std::fs::read(format!("/proc/{pid}/stat"))?;
        let after_name = stat.iter().rposition(|&b| b == b')').map(|i| &stat[i + 1..]).ok_or_else(|| io::Error::other("stat"))?;
        let fields: Vec<&[u8]> = after_name.split(|&b| b == b' ').filter(|f| !f.is_empty()).collect();
        // fields[0] is proc(5)'s field 3.
        let field = |n: usize| -> io::Result<u64> {
            let text = fields.get(n - 3).and_then(|f| std::str::from_utf8(f).ok()).ok_or_else(|| io::Error::other("stat"))?;
            text.trim().parse().map_err(|_| io::Error::other("stat"))
        };
        Ok(Self {
            start_code: field(26)?,
            end_code: field(27)?,
            start_stack: field(28)?,
            start_data: field(45)?,
            end_data: field(46)?,
            start_brk: field(47)?,
            arg_start: field(48)?,
            arg_end: field(49)?,
        })
    }

    fn mm_map(&self, brk: u64, (env_start, env_end): (u64, u64)) -> Vec<u8> {
        let addrs = [
            self.start_code,
            self.end_code,
            self.start_data,
            self.end_data,
            self.start_brk,
            brk,
            self.start_stack,
            self.arg_start,
            self.arg_end,
            env_start,
            env_end,
            0, // auxv: unchanged (auxv_size 0)
        ];
        let mut out: Vec<u8> = addrs.iter().flat_map(|a| a.to_ne_bytes()).collect();
        out.extend_from_slice(&0u32.to_ne_bytes());
        // exe_fd -1: /proc/<pid>/exe unchanged.
        out.extend_from_slice(&u32::MAX.to_ne_bytes());
        out
    }
}

#[cfg(target_arch = "x86_64")]
mod arch {
    use std::fs::File;
    use std::io;
    use std::os::unix::fs::FileExt;

    use nix::sys::ptrace;
    use nix::unistd::Pid;

    pub type Regs = libc::user_regs_struct;
    pub const SUPPORTED: bool = true;
    pub use ptrace::{getregs, setregs};

    /// The `syscall` instruction just before the instruction pointer: the
    /// interpreter stopped on a syscall's way out (blocked in its read,
    /// normally). Its registers then say whether that syscall restarts, and
    /// restoring them keeps that so.
    pub fn gadget(regs: &Regs, mem: &File) -> io::Result<u64> {
        let at = regs.rip.checked_sub(2).ok_or_else(|| io::Error::other("no syscall"))?;
        let mut insn = [0u8; 2];
        mem.read_exact_at(&mut insn, at)?;
        match insn {
            [0x0f, 0x05] => Ok(at),
            _ => Err(io::Error::other("the interpreter is not in a syscall")),
        }
    }

    /// Runs one syscall in `pid` at `gadget`, single-stepped; its return.
    pub fn syscall(pid: Pid, saved: &Regs, gadget: u64, nr: u64, args: [u64; 6]) -> io::Result<u64> {
        let mut regs = *saved;
        regs.rip = gadget;
        regs.rax = nr;
        // Not inside a syscall: nothing to restart on resume.
        regs.orig_rax = u64::MAX;
        [regs.rdi, regs.rsi, regs.rdx, regs.r10, regs.r8, regs.r9] = args;
        ptrace::setregs(pid, regs)?;
        ptrace::step(pid, None)?;
        super::stopped(pid)?;
        let after = ptrace::getregs(pid)?;
        match after.rip == gadget + 2 {
            true => Ok(after.rax),
            false => Err(io::Error::other("the injected syscall did not return")),
        }
    }
}

#[cfg(not(target_arch = "x86_64"))]
mod arch {
    use std::fs::File;
    use std::io;

    use nix::unistd::Pid;

    pub type Regs = ();
    pub const SUPPORTED: bool = false;

    pub fn getregs(_: Pid) -> io::Result<Regs> {
        Err(io::ErrorKind::Unsupported.into())
    }

    pub fn setregs(_: Pid, _: Regs) -> io::Result<()> {
        Err(io::ErrorKind::Unsupported.into())
    }

    pub fn gadget(_: &Regs, _: &File) -> io::Result<u64> {
        Err(io::ErrorKind::Unsupported.into())
    }

    pub fn syscall(_: Pid, _: &Regs, _: u64, _: u64, _: [u64; 6]) -> io::Result<u64> {
        Err(io::ErrorKind::Unsupported.into())
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn the_block_is_laid_out_as_execve_does() {
        let env = vec![("A".to_string(), "1".to_string()), ("B".to_string(), "x=y".to_string())];
        assert_eq!(super::block(&env), b"A=1\0B=x=y\0");
        assert_eq!(super::block(&[]), b"");
    }

    #[test]
    fn yama_scope_three_rules_it_out() {
        assert!(super::available(None).is_ok() || !super::arch::SUPPORTED);
        assert!(super::available(Some("1\n")).is_ok() || !super::arch::SUPPORTED);
        assert!(super::available(Some("3\n")).is_err());
    }

    use nix::sys::wait::{waitpid, WaitStatus};
    use nix::unistd::{fork, ForkResult, Pid};

    /// A child of this test in `body`, killed and reaped whatever happens.
    struct Child(Pid);

    impl Drop for Child {
        fn drop(&mut self) {
            let _ = nix::sys::signal::kill(self.0, nix::sys::signal::Signal::SIGKILL);
            let _ = waitpid(self.0, None);
        }
    }

    fn child(body: impl FnOnce()) -> Child {
        // SAFETY: the child runs only `body` (raw syscalls, no allocation) and _exit.
        match unsafe { fork() }.unwrap() {
            ForkResult::Child => {
                body();
                // SAFETY: leaves the forked child without running the test harness's exit.
                unsafe { libc::_exit(0) }
            }
            ForkResult::Parent { child } => Child(child),
        }
    }

    /// Waits until `pid` is blocked in syscall `nr` (a state, not a delay).
    fn wait_in_syscall(pid: Pid, nr: i64) {
        let prefix = format!("{nr} ");
        while !std::fs::read_to_string(format!("/proc/{pid}/syscall")).unwrap_or_default().starts_with(&prefix) {
            std::thread::sleep(std::time::Duration::from_millis(1));
        }
    }

    #[test]
    fn a_child_blocked_in_read_shows_the_new_environment_and_its_read_goes_on() {
        if !super::arch::SUPPORTED {
            eprintln!("skipped: the hand-over is implemented for x86_64 only");
            return;
        }
        let (r, w) = nix::unistd::pipe().unwrap();
        let (rfd, wfd) = (std::os::fd::AsRawFd::as_raw_fd(&r), std::os::fd::AsRawFd::as_raw_fd(&w));
        let kid = child(|| {
            let mut byte = [0u8; 1];
            // SAFETY: a read into a local buffer; the exit status reports what arrived.
            let n = unsafe { libc::read(rfd, byte.as_mut_ptr().cast(), 1) };
            // SAFETY: as above.
            unsafe { libc::_exit(if n == 1 && byte[0] == b'x' { 7 } else { 1 }) }
        });
        drop(r);
        wait_in_syscall(kid.0, libc::SYS_read);
        super::show(kid.0, b"A=1\0B=two words\0").unwrap();
        assert_eq!(std::fs::read(format!("/proc/{}/environ", kid.0)).unwrap(), b"A=1\0B=two words\0");
        let status = std::fs::read_to_string(format!("/proc/{}/status", kid.0)).unwrap();
        assert!(status.lines().any(|l| l.split_whitespace().eq(["TracerPid:", "0"])), "detached");
        // SAFETY: a write of one byte from a local buffer.
        assert_eq!(unsafe { libc::write(wfd, b"x".as_ptr().cast(), 1) }, 1);
        assert_eq!(waitpid(kid.0, None).unwrap(), WaitStatus::Exited(kid.0, 7), "the interrupted read restarted and got the byte");
    }

    #[test]
    fn a_child_that_never_reaches_a_syscall_is_refused_and_left_running() {
        if !super::arch::SUPPORTED {
            eprintln!("skipped: the hand-over is implemented for x86_64 only");
            return;
        }
        // A flag the spinning child keeps raising, in memory both share:
        // once it is up, the child is in its loop, which makes no syscall.
        // SAFETY: a fresh shared anonymous page, unmapped below.
        let page = unsafe { libc::mmap(std::ptr::null_mut(), 4096, libc::PROT_READ | libc::PROT_WRITE, libc::MAP_SHARED | libc::MAP_ANONYMOUS, -1, 0) };
        assert_ne!(page, libc::MAP_FAILED);
        // SAFETY: the page is mapped, aligned and lives until the munmap below.
        let flag = unsafe { &*(page as *const std::sync::atomic::AtomicU32) };
        let kid = child(|| loop {
            flag.store(1, std::sync::atomic::Ordering::SeqCst);
            std::hint::spin_loop();
        });
        while flag.load(std::sync::atomic::Ordering::SeqCst) == 0 {
            std::thread::yield_now();
        }
        assert!(super::show(kid.0, b"A=1\0").is_err());
        let stat = std::fs::read_to_string(format!("/proc/{}/stat", kid.0)).unwrap();
        let state = stat.rsplit(')').next().unwrap().split_whitespace().next().unwrap();
        assert!(state == "R" || state == "S", "running again after the refusal, not stopped: {state}");
        assert_ne!(std::fs::read(format!("/proc/{}/environ", kid.0)).unwrap(), b"A=1\0");
        drop(kid);
        // SAFETY: the child is gone; nothing else refers to the page.
        unsafe { libc::munmap(page, 4096) };
    }

    #[test]
    fn syscall_errors_are_errnos() {
        assert_eq!(super::errno(-1i64 as u64).unwrap_err().raw_os_error(), Some(1));
        assert_eq!(super::errno(0x7f00_0000_0000).unwrap(), 0x7f00_0000_0000);
    }
}
