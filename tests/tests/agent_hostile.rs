//! Hostile-code suite: untrusted programs that try to escape, starve or read
//! the host, each with the outcome it must get. Runs against the real
//! node-agent, with no warm pool and with one: after every case nothing of
//! the sandbox may remain (no process, cgroup, mount or directory) beyond
//! the pool's idle sandboxes.
//!
//! Written so a failed containment cannot harm this machine: global files are
//! probed by *opening* them for writing, never by writing, and the resource
//! bombs run only after `limits_are_in_place` has shown that the agent applies
//! the execution's cgroup limits.

use std::time::Duration;

use warren_e2e::{skip_unless_root, Agent, Run};
use warren_proto::agent::{ExecuteRequest, Language, Limits};

const MIB: u64 = 1 << 20;

/// Python prelude: raw syscalls through libc, reporting BLOCKED/ALLOWED.
const PY: &str = r#"
import ctypes, errno, os, socket, sys
libc = ctypes.CDLL(None, use_errno=True)
libc.syscall.restype = ctypes.c_long
def sc(nr, *a):
    r = libc.syscall(ctypes.c_long(nr), *[ctypes.c_long(x) for x in a])
    return r, ctypes.get_errno()
def deny(name, nr, *a, errnos=(errno.EPERM,)):
    r, e = sc(nr, *a)
    print(name, "BLOCKED" if r == -1 and e in errnos else "ALLOWED r=%d errno=%d" % (r, e))
def no_write(path):
    try:
        f = open(path, "r+b"); f.close(); print(path, "ALLOWED")
    except OSError as e:
        print(path, "BLOCKED", errno.errorcode.get(e.errno))
def no_read(path):
    try:
        data = open(path, "rb").read(64); print(path, "ALLOWED", data[:20])
    except OSError as e:
        print(path, "BLOCKED", errno.errorcode.get(e.errno))
"#;

struct Case {
    name: &'static str,
    language: Language,
    code: String,
    timeout: Duration,
    limits: Option<Limits>,
    check: fn(&Run) -> Result<(), String>,
}

fn py(name: &'static str, body: &str, check: fn(&Run) -> Result<(), String>) -> Case {
    Case { name, language: Language::Python, code: format!("{PY}\n{body}"), timeout: Duration::from_secs(20), limits: None, check }
}

fn bash(name: &'static str, body: &str, check: fn(&Run) -> Result<(), String>) -> Case {
    Case { name, language: Language::Bash, code: body.to_string(), timeout: Duration::from_secs(20), limits: None, check }
}

/// Every probe line says BLOCKED, none ALLOWED, and the program finished.
fn all_blocked(r: &Run) -> Result<(), String> {
    let blocked = r.stdout.matches("BLOCKED").count();
    if r.stdout.contains("ALLOWED") || blocked == 0 || r.exited.exit_code != 0 {
        return Err(format!("expected only BLOCKED, exit 0; got exit {} stdout={:?} stderr={:?}", r.exited.exit_code, r.stdout, r.stderr));
    }
    Ok(())
}

fn ensure(cond: bool, what: &str, r: &Run) -> Result<(), String> {
    if cond { Ok(()) } else { Err(format!("{what}; exited={:?} stdout={:?} stderr={:?}", r.exited, trim(&r.stdout), trim(&r.stderr))) }
}

fn trim(s: &str) -> &str {
    &s[..s.len().min(600)]
}

fn with_limits(mut c: Case, limits: Limits, timeout: Duration) -> Case {
    c.limits = Some(limits);
    c.timeout = timeout;
    c
}

fn cases() -> Vec<Case> {
    vec![
        // --- resource bombs (limits verified first, in `limits_are_in_place`) ---
        with_limits(
            bash("fork_bomb", "ulimit -u; f(){ f|f& }; f; sleep 2; echo survived", |r| {
                // RLIMIT_NPROC mirrors the pids limit; the bomb runs into both and the
                // call ends by itself or at its timeout, leaving nothing behind.
                ensure(r.stdout.starts_with("64\n") && (r.exited.timed_out || r.exited.exit_code == 0), "fork bomb must be contained", r)
            }),
            Limits { pids: 64, ..Default::default() },
            Duration::from_secs(4),
        ),
        with_limits(
            py("memory_bomb", "a = []\nwhile True: a.append(bytearray(16 << 20))", |r| {
                ensure(r.exited.oom_killed && r.exited.signal == 9, "memory bomb must be OOM-killed", r)
            }),
            Limits { memory_bytes: 128 * MIB, ..Default::default() },
            Duration::from_secs(20),
        ),
        with_limits(
            bash("tmp_fill", "dd if=/dev/zero of=/tmp/fill bs=1M count=64 2>&1 | grep -o 'No space left'; du -k /tmp/fill | cut -f1", |r| {
                ensure(r.stdout == "No space left\n8192\n" && r.exited.exit_code == 0, "/tmp must fill at its size", r)
            }),
            Limits { tmp_bytes: 8 * MIB, ..Default::default() },
            Duration::from_secs(20),
        ),
        with_limits(
            bash("home_fill", "cd ~ && dd if=/dev/zero of=fill bs=1M count=64 2>&1 | grep -o 'No space left'; du -k fill | cut -f1", |r| {
                ensure(r.stdout == "No space left\n8192\n", "/home/sandbox must fill at its size", r)
            }),
            Limits { home_bytes: 8 * MIB, ..Default::default() },
            Duration::from_secs(20),
        ),
        with_limits(
            bash("file_size_limit", "dd if=/dev/zero of=/tmp/big bs=1M count=8 2>/dev/null; echo rc=$?; du -k /tmp/big | cut -f1", |r| {
                // SIGXFSZ (25) stops the writer at the limit.
                ensure(r.stdout == "rc=153\n2048\n", "RLIMIT_FSIZE must stop big files", r)
            }),
            Limits { file_size_bytes: 2 * MIB, ..Default::default() },
            Duration::from_secs(20),
        ),
        with_limits(
            py("output_flood", "import sys\nfor _ in range(200): sys.stdout.write('x' * 65536)\nprint('done', file=sys.stderr)", |r| {
                ensure(
                    r.exited.stdout_truncated && r.stdout.len() == 65536 && r.exited.exit_code == 0 && r.stderr == "done\n",
                    "flood is capped, drained and flagged",
                    r,
                )
            }),
            Limits { max_output_bytes: 65536, ..Default::default() },
            Duration::from_secs(20),
        ),
        with_limits(
            py("busy_loop_timeout", "print('spinning', flush=True)\nwhile True: pass", |r| {
                ensure(r.exited.timed_out && r.stdout == "spinning\n" && r.exited.signal == 9, "busy loop is killed at the timeout with its output", r)
            }),
            Limits::default(),
            Duration::from_secs(1),
        ),
        with_limits(
            bash("sleep_timeout_partial_output", "echo before; echo err >&2; sleep 60; echo after", |r| {
                ensure(r.exited.timed_out && r.stdout == "before\n" && r.stderr == "err\n", "partial output survives the timeout", r)
            }),
            Limits::default(),
            Duration::from_secs(1),
        ),
        // --- processes outliving the main one ---
        bash("outliving_processes", "setsid sleep 300 & nohup sleep 300 >/dev/null 2>&1 & (sleep 300 &) ; disown -a; echo main-done", |r| {
            ensure(r.stdout == "main-done\n" && r.exited.exit_code == 0 && !r.exited.timed_out, "main exits; stragglers are killed", r)
        }),
        py("double_fork", "import os, time\nif os.fork() == 0:\n    if os.fork() == 0:\n        os.setsid(); time.sleep(300)\n    os._exit(0)\nos.wait()\nprint('parent-done')", |r| {
            ensure(r.stdout == "parent-done\n" && !r.exited.timed_out, "double-forked daemon does not hold the call", r)
        }),
        // --- reading host secrets ---
        py("host_secrets", "no_read('/etc/shadow'); no_read('/root/.bash_history'); no_read('/proc/1/environ'); no_read('/proc/1/root/etc/hostname'); no_read('/var/lib/warren'); no_read('/sys/fs/cgroup/cgroup.procs')", all_blocked),
        // /var is the sandbox's own (#45): empty places a program may write,
        // nothing of the node's (its logs, the agent's state under /var/lib).
        bash("agent_state_invisible", "ls -A /tmp; ls / | tr '\\n' ' '; echo; ls /var | tr '\\n' ' '; ls -A /var/lib /var/log /var/cache /var/tmp | grep -v ':$' | grep -c .", |r| {
            let var = "cache lib local lock log mail opt run spool tmp ";
            ensure(!r.stdout.contains("warren-e2e") && r.stdout.contains("home") && !r.stdout.contains("root ") && r.stdout.ends_with(&format!("\n{var}0\n")), "no host /tmp, /root or /var", r)
        }),
        bash("other_executions_tmp_is_fresh", "ls -A /tmp /home/sandbox | grep -v ':$' | grep -c . ; echo secret > /tmp/leak", |r| {
            ensure(r.stdout == "0\n", "each execution starts with empty /tmp and home", r)
        }),
        // --- writes outside the writable zones ---
        py("readonly_rootfs", "no_write('/usr/bin/python3'); no_write('/etc/passwd'); no_write('/run/warren/main.py'); no_write('/proc/sys/kernel/hostname'); no_write('/proc/sysrq-trigger'); no_write('/proc/sys/vm/drop_caches')\nfor d in ['/', '/usr', '/etc', '/run/warren', '/dev']:\n    try:\n        open(d + '/x', 'w'); print(d, 'ALLOWED')\n    except OSError as e:\n        print(d, 'BLOCKED')", all_blocked),
        py("proc_self_exe_overwrite", "no_write('/proc/self/exe'); no_write(os.path.realpath('/proc/self/exe'))", all_blocked),
        // --- kernel attack surface through syscalls ---
        py("ptrace", "deny('traceme', 101, 0, 0, 0, 0); deny('attach_init', 101, 16, 1, 0, 0); deny('process_vm_readv', 310, 1, 0, 0, 0, 0, 0)", all_blocked),
        py("mount_unshare_setns", "deny('mount', 165, 0, 0, 0, 0, 0); deny('umount2', 166, 0, 0); deny('unshare_user', 272, 0x10000000); deny('unshare_ns', 272, 0x00020000); deny('setns', 308, 0, 0); deny('pivot_root', 155, 0, 0); deny('chroot', 161, 0)", all_blocked),
        py("clone_namespaces", "deny('clone_newuser', 56, 0x10000000 | 17, 0, 0, 0, 0); deny('clone_newnet', 56, 0x40000000 | 17, 0, 0, 0, 0); deny('clone3', 435, 0, 0, errnos=(errno.ENOSYS,))", all_blocked),
        py("keyring", "deny('keyctl', 250, 0, 0, 0, 0, 0); deny('add_key', 248, 0, 0, 0, 0, 0); deny('request_key', 249, 0, 0, 0, 0)", all_blocked),
        py("bpf_perf_userfaultfd_io_uring", "deny('bpf', 321, 0, 0, 0); deny('perf_event_open', 298, 0, 0, 0, 0, 0); deny('userfaultfd', 323, 0); deny('io_uring_setup', 425, 1, 0); deny('io_uring_enter', 426, 0, 0, 0, 0, 0, 0); deny('io_uring_register', 427, 0, 0, 0, 0)", all_blocked),
        py("modules_kexec_reboot", "deny('init_module', 175, 0, 0, 0); deny('finit_module', 313, 0, 0, 0); deny('delete_module', 176, 0, 0); deny('kexec_load', 246, 0, 0, 0, 0); deny('reboot', 169, 0, 0, 0, 0); deny('swapon', 167, 0, 0); deny('swapoff', 168, 0); deny('acct', 163, 0); deny('syslog', 103, 3, 0, 0)", all_blocked),
        py("handles_and_io_ports", "deny('open_by_handle_at', 304, 0, 0, 0); deny('name_to_handle_at', 303, 0, 0, 0, 0, 0); deny('iopl', 172, 3); deny('ioperm', 173, 0, 1024, 1)", all_blocked),
        py("clock_and_hostname", "deny('settimeofday', 164, 0, 0); deny('clock_settime', 227, 0, 0); deny('adjtimex', 159, 0); deny('sethostname', 170, 0, 0); deny('setdomainname', 171, 0, 0)\nimport subprocess\nr = subprocess.run(['date', '-s', '2000-01-01'], capture_output=True)\nprint('date', 'BLOCKED' if r.returncode else 'ALLOWED')\nr = subprocess.run(['hostname', 'evil'], capture_output=True)\nprint('hostname', 'BLOCKED' if r.returncode else 'ALLOWED')\nprint('hostname-now', 'BLOCKED' if socket.gethostname() == 'sandbox' else 'ALLOWED')", all_blocked),
        py("personality", "deny('addr_no_randomize', 135, 0x0040000); deny('read_implies_exec', 135, 0x0400000)\nr, e = sc(135, 0xffffffff)\nprint('query', 'BLOCKED' if r >= 0 else 'ALLOWED-broken')", all_blocked),
        py("sockets", "for name, fam, typ, proto in [('raw', socket.AF_INET, socket.SOCK_RAW, 1), ('packet', socket.AF_PACKET, socket.SOCK_RAW, 0), ('netlink_audit', socket.AF_NETLINK, socket.SOCK_RAW, 9), ('netlink_netfilter', socket.AF_NETLINK, socket.SOCK_RAW, 12), ('icmp_dgram', socket.AF_INET, socket.SOCK_DGRAM, 1), ('sctp', socket.AF_INET, socket.SOCK_STREAM, 132), ('vsock', 40, socket.SOCK_STREAM, 0), ('raw6', socket.AF_INET6, socket.SOCK_RAW, 58)]:\n    try:\n        socket.socket(fam, typ, proto); print(name, 'ALLOWED')\n    except OSError as e:\n        print(name, 'BLOCKED', e.errno)\nsocket.socket(socket.AF_INET, socket.SOCK_STREAM).close(); socket.socket(socket.AF_UNIX).close()", all_blocked),
        py("network_only_loopback", "ifaces = [l.split(':')[0].strip() for l in open('/proc/net/dev').readlines()[2:]]\nprint('ifaces', ifaces)\nprint('only-lo', 'BLOCKED' if ifaces == ['lo'] else 'ALLOWED')\ns = socket.socket(); s.settimeout(2)\ntry:\n    s.connect(('127.0.0.1', 9)); print('lo-connect ALLOWED')\nexcept OSError as e:\n    print('lo-closed-port BLOCKED', e.errno)\ntry:\n    socket.getaddrinfo('example.com', 443); print('dns ALLOWED')\nexcept OSError:\n    print('dns BLOCKED')", all_blocked),
        bash("setuid_binaries", "su root -c 'id -u' </dev/null >/dev/null 2>&1; echo su=$?; ping -c1 -W1 127.0.0.1 >/dev/null 2>&1; echo ping=$?; id -u; grep -E '^(NoNewPrivs|Seccomp):' /proc/self/status | tr -s '\\t ' ' '", |r| {
            ensure(!r.stdout.contains("su=0") && !r.stdout.contains("ping=0") && r.stdout.contains("\n1000\n") && r.stdout.contains("NoNewPrivs: 1") && r.stdout.contains("Seccomp: 2"), "setuid binaries gain nothing", r)
        }),
        py("signals_stay_inside", "import signal\nr, e = sc(62, 1, 9)\nprint('pid1', 'BLOCKED' if (r, e) == (-1, errno.EPERM) else 'ALLOWED r=%d errno=%d' % (r, e))\nprint('agent', 'BLOCKED' if sc(62, int(os.environ['AGENT_PID']), 0)[1] == errno.ESRCH else 'ALLOWED')\npids = [p for p in os.listdir('/proc') if p.isdigit()]\nprint('visible-processes', 'BLOCKED' if len(pids) <= 3 else 'ALLOWED %r' % pids)", all_blocked),
        py("cgroup_escape", "no_write('/sys/fs/cgroup/pids/cgroup.procs'); no_write('/proc/self/cgroup')\nprint('cgroup-view', 'BLOCKED' if all(l.rstrip().endswith(':/') for l in open('/proc/self/cgroup')) else 'ALLOWED ' + open('/proc/self/cgroup').read())\ndeny('mount_cgroup', 165, 0, 0, 0, 0, 0)", all_blocked),
        py("raw_devices", "for d in ['/dev/mem', '/dev/kmem', '/dev/port', '/dev/kmsg', '/dev/sda', '/dev/vda', '/dev/nvme0n1', '/dev/tty', '/dev/console']:\n    no_read(d)\ntry:\n    os.mknod('/tmp/mem', 0o600 | 0o020000, os.makedev(1, 1)); print('mknod ALLOWED')\nexcept OSError:\n    print('mknod BLOCKED')", all_blocked),
        bash("symlink_tricks", "ln -s /proc/1/root /tmp/r; ls /tmp/r/ >/dev/null 2>&1 && echo root-ALLOWED || echo root-BLOCKED; ln -s /etc/shadow /tmp/s; cat /tmp/s >/dev/null 2>&1 && echo shadow-ALLOWED || echo shadow-BLOCKED; ln -s /proc/1/cwd /tmp/c; ls /tmp/c >/dev/null 2>&1 && echo cwd-ALLOWED || echo cwd-BLOCKED", all_blocked),
        py("huge_argv_env", "import subprocess\ntry:\n    subprocess.run(['/bin/true'] + ['x' * 4096] * 100000); print('argv ALLOWED')\nexcept OSError as e:\n    print('argv BLOCKED', e.errno)\ntry:\n    subprocess.run(['/bin/true'], env={'K%d' % i: 'v' * 4096 for i in range(100000)}); print('env ALLOWED')\nexcept OSError as e:\n    print('env BLOCKED', e.errno)", all_blocked),
        py("foreign_abi_x32", "print('before-x32', flush=True)\nr, e = sc(0x40000000 | 39)\nprint('x32-getpid ALLOWED', r, e)", |r| {
            // An x32 syscall hits the filter's bad-arch action: SIGSYS, nothing after it runs.
            ensure(r.stdout == "before-x32\n" && r.exited.signal == 31, "an x32 syscall kills the process", r)
        }),
        py("foreign_abi_i386", "import mmap\nbuf = mmap.mmap(-1, 4096, prot=mmap.PROT_READ | mmap.PROT_WRITE | mmap.PROT_EXEC)\nbuf.write(b'\\xb8\\x14\\x00\\x00\\x00\\xcd\\x80\\xc3')\nfn = ctypes.CFUNCTYPE(ctypes.c_int)(ctypes.addressof(ctypes.c_char.from_buffer(buf)))\nprint('before-i386', flush=True)\nprint('i386-getpid ALLOWED', fn())", |r| {
            // Only `int 0x80` runs here (the probe is reached: its marker is printed).
            ensure(r.stdout == "before-i386\n" && r.exited.signal == 31, "an i386 syscall kills the process", r)
        }),
        // --- sandbox hygiene ---
        py("netlink_route_reads_interfaces", "print(socket.if_nameindex())\nimport subprocess\nr = subprocess.run(['node', '-e', 'console.log(Object.keys(require(\"os\").networkInterfaces()).join(\",\"))'], capture_output=True, text=True)\nprint('node', r.stdout.strip(), r.returncode)\ns = socket.socket(socket.AF_NETLINK, socket.SOCK_RAW, 0)\nreq = bytes.fromhex('28000000100005060100000000000000') + bytes(24)\ntry:\n    s.send(req); print('link-add', 'BLOCKED' if b'\\xff\\xff\\xff' in s.recv(4096)[16:20] else 'ALLOWED?')\nexcept OSError as e:\n    print('link-add BLOCKED', e.errno)", |r| {
            // RTM_NEWLINK without CAP_NET_ADMIN gets a negative errno back.
            ensure(r.stdout.starts_with("[(1, 'lo')]\nnode lo 0\nlink-add BLOCKED"), "interfaces can be listed, not changed", r)
        }),
        bash("rlimits_pinned", "ulimit -r; ulimit -e; ulimit -l; ulimit -Hr; ulimit -He; ulimit -Hl; python3 -c 'import os\ntry:\n    os.setpriority(os.PRIO_PROCESS, 0, -1); print(\"nice-ALLOWED\")\nexcept OSError:\n    print(\"nice-BLOCKED\")\ntry:\n    os.sched_setscheduler(0, os.SCHED_FIFO, os.sched_param(1)); print(\"rt-ALLOWED\")\nexcept OSError:\n    print(\"rt-BLOCKED\")'", |r| {
            ensure(r.stdout == "0\n0\n64\n0\n0\n64\nnice-BLOCKED\nrt-BLOCKED\n", "real-time, nice and locked memory are pinned", r)
        }),
        py("proc_masked", "for f in ['/proc/kallsyms', '/proc/kcore', '/proc/modules', '/proc/interrupts', '/proc/iomem', '/proc/timer_list', '/proc/sched_debug', '/proc/slabinfo', '/proc/partitions']:\n    if os.path.exists(f):\n        print(f, 'BLOCKED' if open(f, 'rb').read(4096) == b'' else 'ALLOWED')\nfor d in ['/proc/acpi', '/proc/scsi', '/proc/asound', '/proc/driver', '/proc/tty']:\n    if os.path.isdir(d):\n        print(d, 'BLOCKED' if os.listdir(d) == [] else 'ALLOWED %r' % os.listdir(d)[:3])\n        try:\n            open(d + '/x', 'w'); print(d, 'write ALLOWED')\n        except OSError:\n            print(d, 'write BLOCKED')", |r| {
            ensure(r.stdout.contains("/proc/kallsyms BLOCKED") && r.stdout.contains("/proc/driver BLOCKED"), "host kernel details are masked", r).and_then(|()| all_blocked(r))
        }),
        bash("sync_is_harmless", "sync; echo sync=$?; python3 -c 'import os; os.sync(); f = os.open(\"/tmp/x\", os.O_CREAT | os.O_WRONLY); os.write(f, b\"x\"); os.fsync(f); print(\"fsync ok\")'", |r| {
            ensure(r.stdout == "sync=0\nfsync ok\n", "sync is a no-op that succeeds; fsync of own files works", r)
        }),
        // --- what the program is and has ---
        bash("identity_and_capabilities", "id; grep -E '^Cap(Inh|Prm|Eff|Bnd|Amb):' /proc/self/status | tr -s '\\t ' ' '; cat /proc/self/uid_map | tr -s ' ' ' '; ls /proc/self/fd | tr '\\n' ' '", |r| {
            let ok = r.stdout.contains("uid=1000(sandbox) gid=1000(sandbox) groups=1000(sandbox)")
                && ["CapInh", "CapPrm", "CapEff", "CapBnd", "CapAmb"].iter().all(|c| r.stdout.contains(&format!("{c}: 0000000000000000")))
                && r.stdout.lines().filter(|l| l.trim_start().starts_with(|c: char| c.is_ascii_digit()) && l.split_whitespace().count() == 3).all(|l| {
                    l.split_whitespace().nth(1).and_then(|h| h.parse::<u64>().ok()).is_some_and(|h| h >= 1_000_000)
                })
                && r.stdout.trim_end().ends_with("0 1 2 3");
            ensure(ok, "uid 1000, no capabilities, unprivileged host ids, only stdio open", r)
        }),
        bash("minimal_environment", "env | cut -d= -f1 | sort | tr '\\n' ' '", |r| {
            ensure(r.stdout == "HOME LANG LOGNAME PATH PWD SHELL SHLVL USER _ " || r.stdout == "HOME LANG LOGNAME OLDPWD PATH PWD SHELL SHLVL USER _ ", "only the spec's variables", r)
        }),
        // `pts` is where a live sandbox mounts its own terminals: empty here
        // (`ptmx` leads nowhere), so a call has no terminal to open.
        py("dev_is_minimal", "print(sorted(os.listdir('/dev')), os.listdir('/dev/pts'), os.path.exists('/dev/ptmx'))\nopen('/dev/null', 'w').write('x'); print(len(open('/dev/urandom', 'rb').read(16)))", |r| {
            ensure(r.stdout.starts_with("['fd', 'full', 'null', 'ptmx', 'pts', 'random', 'shm', 'stderr', 'stdin', 'stdout', 'urandom', 'zero'] [] False\n16"), "/dev has exactly the safe devices", r)
        }),
    ]
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hostile_programs_are_contained_and_leave_nothing_behind() {
    if skip_unless_root("hostile_programs_are_contained_and_leave_nothing_behind") {
        return;
    }
    run_suite(0).await;
}

/// The same programs on sandboxes prepared ahead of demand (the default
/// mode): a warm sandbox must be exactly as contained as a cold one.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hostile_programs_are_contained_with_the_warm_pool() {
    if skip_unless_root("hostile_programs_are_contained_with_the_warm_pool") {
        return;
    }
    run_suite(2).await;
}

async fn run_suite(pool: usize) {
    let mut agent = Agent::start(&["--pool-size", &pool.to_string()]).await.expect("agent starts");
    limits_are_in_place(&agent).await;
    // The shapes kept warm from the start: plain sandboxes and ones
    // holding a Python interpreter, `pool` each.
    settled(&agent, 2 * pool).await.expect("the pool fills");
    let mounts_before = host_mount_count(&agent);
    let cases = cases();
    assert!(cases.len() >= 30, "the suite covers at least 30 programs");
    let mut failures = Vec::new();
    for case in cases {
        let mut req = warren_e2e::request(case.language, &case.code, case.timeout);
        req.limits = case.limits;
        if case.name == "signals_stay_inside" {
            req.env.insert("AGENT_PID".into(), agent.pid().to_string());
        }
        match agent.run_request(req).await {
            Ok(run) => {
                if let Err(e) = (case.check)(&run) {
                    failures.push(format!("{}: {e}", case.name));
                }
            }
            Err(e) => failures.push(format!("{}: request failed: {e:#}", case.name)),
        }
        if let Err(e) = nothing_left_behind(&mut agent, mounts_before).await {
            failures.push(format!("{} left something behind: {e}", case.name));
        }
    }
    assert!(failures.is_empty(), "{} hostile cases failed (pool {pool}):\n{}", failures.len(), failures.join("\n"));
}

/// Starts a sleeping execution with explicit limits and reads its cgroup from
/// the host: the bombs above are only safe to run if this holds.
async fn limits_are_in_place(agent: &Agent) {
    let mut client = agent.client().await.unwrap();
    let req = ExecuteRequest {
        limits: Some(Limits { memory_bytes: 96 * MIB, pids: 48, cpu_millis: 500, ..Default::default() }),
        ..warren_e2e::request(Language::Bash, "echo up; sleep 30", Duration::from_secs(60))
    };
    let mut stream = client.execute(req).await.unwrap().into_inner();
    // Wait for the first output: the program runs, so limits were applied.
    while let Some(ev) = stream.message().await.unwrap() {
        if matches!(ev.event, Some(warren_proto::agent::execute_event::Event::Stdout(_))) {
            break;
        }
    }
    // The execution's group is the one holding `sleep` (others are the pool's idle sandboxes).
    let runs_sleep = |g: &std::path::PathBuf| {
        std::fs::read_to_string(g.join("cgroup.procs"))
            .unwrap_or_default()
            .lines()
            .any(|pid| std::fs::read_to_string(format!("/proc/{pid}/comm")).is_ok_and(|c| c.trim() == "sleep"))
    };
    let mut all = Vec::new();
    let found = warren_e2e::gateway::wait_for(Duration::from_secs(10), || {
        all = agent.leftover_cgroups();
        all.iter().any(runs_sleep)
    });
    assert!(found, "the execution's cgroup holds its program");
    let name = all.iter().find(|g| runs_sleep(g)).and_then(|g| g.file_name()).expect("the execution's cgroup exists").to_owned();
    let groups: Vec<_> = all.into_iter().filter(|g| g.file_name() == Some(&name)).collect();
    let read = |controller: &str, file: &str| -> String {
        let dir = groups.iter().find(|g| g.to_string_lossy().contains(&format!("/{controller}/"))).expect("sandbox cgroup exists");
        std::fs::read_to_string(dir.join(file)).unwrap().trim().to_string()
    };
    assert_eq!(read("memory", "memory.limit_in_bytes"), (96 * MIB).to_string());
    // Swap is off either way: memory+swap equal to memory where swap is
    // accounted, swappiness 0 where it is not.
    if groups.iter().any(|g| g.join("memory.memsw.limit_in_bytes").exists()) {
        assert_eq!(read("memory", "memory.memsw.limit_in_bytes"), (96 * MIB).to_string(), "swap is off");
    } else {
        assert_eq!(read("memory", "memory.swappiness"), "0", "swap is off");
    }
    assert_eq!(read("pids", "pids.max"), "48");
    assert_eq!(read("cpu", "cpu.cfs_quota_us"), "50000");
    // Cancelling the call must kill the execution and clean up.
    drop(stream);
    drop(client);
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    while groups.iter().any(|g| g.exists()) {
        assert!(std::time::Instant::now() < deadline, "cancelled execution was not cleaned up");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// Host mounts, leaving out other test agents' state dirs (each agent keeps
/// a shared bind of its homes dir; tests run in parallel) but counting this
/// agent's.
fn host_mount_count(agent: &Agent) -> usize {
    let own = agent.state_dir().display().to_string();
    std::fs::read_to_string("/proc/self/mountinfo")
        .unwrap()
        .lines()
        .filter_map(|l| l.split(' ').nth(4))
        // Other tests' agents (their state directories) and network labs
        // (`ip netns add` mounts under /run/netns) run beside this one.
        .filter(|m| m.starts_with(&own) || !(m.contains("/warren-e2e-") || m.starts_with("/run/netns/")))
        .count()
}

/// Waits (bounded) until only the pool's idle sandboxes exist — as many as
/// the agent reports, and at least `least`: one cgroup and one process (its
/// init) each, plus at most one waiting interpreter each, nothing else. The
/// mount count is taken once the pool is full, so pooled sandboxes do not
/// change it.
async fn settled(agent: &Agent, least: usize) -> Result<(), String> {
    let mut client = agent.client().await.map_err(|e| e.to_string())?;
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    loop {
        let pooled = client.status(warren_proto::agent::StatusRequest {}).await.map_err(|e| e.to_string())?.into_inner().warm_sandboxes as usize;
        let mut groups: Vec<String> = agent.leftover_cgroups().iter().filter_map(|g| g.file_name().map(|n| n.to_string_lossy().into_owned())).collect();
        groups.sort();
        groups.dedup();
        let procs = agent.sandbox_processes();
        let interpreters = agent.waiting_interpreters().len();
        let stubs = agent.waiting_stubs().len();
        let inits = procs.len().saturating_sub(interpreters + stubs);
        // Each pooled sandbox: its init, and one process waiting for the
        // call (a warm interpreter or a cold start's stub) at most.
        if pooled >= least && groups.len() == pooled && inits == pooled && interpreters + stubs <= pooled {
            return Ok(());
        }
        if std::time::Instant::now() > deadline {
            return Err(format!(
                "{} sandbox cgroups, {inits} inits, {interpreters} waiting interpreters and {stubs} stubs for {pooled} pooled sandboxes (at least {least}); processes: {procs:?}",
                groups.len()
            ));
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}

async fn nothing_left_behind(agent: &mut Agent, mounts_before: usize) -> Result<(), String> {
    if !agent.is_running() {
        return Err("the agent died".into());
    }
    // An execution counts as running until its teardown is complete; wait for
    // that state (not for a time), then nothing may remain.
    let mut client = agent.client().await.map_err(|e| e.to_string())?;
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    loop {
        let status = client.status(warren_proto::agent::StatusRequest {}).await.map_err(|e| e.to_string())?.into_inner();
        if status.running_executions == 0 {
            break;
        }
        if std::time::Instant::now() > deadline {
            return Err(format!("{} executions still running after 10 s", status.running_executions));
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    // Only the pool's idle sandboxes remain (none without a pool).
    settled(agent, 0).await?;
    let mounts = host_mount_count(agent);
    if mounts != mounts_before {
        return Err(format!("host mount count changed from {mounts_before} to {mounts}"));
    }
    let mnt = agent.state_dir().join("mnt");
    let entries = std::fs::read_dir(&mnt).map_err(|e| e.to_string())?.count();
    if entries != 0 {
        return Err(format!("{} entries left in {}", entries, mnt.display()));
    }
    Ok(())
}

/// A pooled sandbox's cold-start stub (its program's process, forked and
/// locked down before the call) holds nothing a program would not: the
/// program's uid, no capability in any set, `no_new_privs`, the seccomp
/// filters. At the call it becomes the program.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_waiting_stub_holds_no_privilege_and_becomes_the_program() {
    if skip_unless_root("a_waiting_stub_holds_no_privilege_and_becomes_the_program") {
        return;
    }
    let agent = Agent::start(&["--pool-size", "1", "--warm-interpreters", "false"]).await.expect("agent starts");
    let ready = warren_e2e::gateway::wait_for(Duration::from_secs(10), || !agent.waiting_stubs().is_empty());
    assert!(ready, "no stub waits in the pool: {:?}", agent.sandbox_processes());
    let stub = agent.waiting_stubs()[0];
    let status = std::fs::read_to_string(format!("/proc/{stub}/status")).expect("the stub's status");
    let field = |name: &str| status.lines().find_map(|l| l.strip_prefix(name)).map(str::trim).unwrap_or_default().to_string();
    for caps in ["CapInh:", "CapPrm:", "CapEff:", "CapBnd:", "CapAmb:"] {
        assert_eq!(field(caps), "0000000000000000", "{caps} of the stub:\n{status}");
    }
    assert_eq!(field("NoNewPrivs:"), "1");
    assert_eq!(field("Seccomp:"), "2", "the filter is loaded before the call");
    // Two stacked: the base its spawner loaded once, the lockdown it loaded
    // itself (kernels from 5.9 say how many; older ones say nothing).
    let filters = field("Seccomp_filters:");
    assert!(filters.is_empty() || filters == "2", "Seccomp_filters: {filters}");
    let uid = agent.sandbox_processes().into_iter().find(|(p, _)| *p == stub).map(|(_, u)| u).expect("the stub's uid");
    assert_eq!((uid - agent.uid_base) % 2, 1, "the program's uid, not init's");
    // The call: its program is the stub's process.
    let mut client = agent.client().await.expect("client");
    let call = tokio::spawn(async move {
        let req = warren_e2e::request(Language::Bash, "sleep 1; echo done", Duration::from_secs(20));
        let mut stream = client.execute(req).await.expect("execute").into_inner();
        while stream.message().await.expect("stream").is_some() {}
    });
    let became = warren_e2e::gateway::wait_for(Duration::from_secs(10), || {
        std::fs::read(format!("/proc/{stub}/cmdline")).is_ok_and(|c| c.ends_with(b"/run/warren/main.sh\0"))
    });
    call.await.expect("the call");
    assert!(became, "the stub did not become the program");
}

/// Processes whose parent is `parent` and whose binary is `warren-sandbox`.
fn sandbox_binaries_under(parent: u32) -> Vec<u32> {
    let mut out = Vec::new();
    for e in std::fs::read_dir("/proc").into_iter().flatten().flatten() {
        let Ok(pid) = e.file_name().to_string_lossy().parse::<u32>() else { continue };
        let Ok(stat) = std::fs::read_to_string(format!("/proc/{pid}/stat")) else { continue };
        // The fields after the name, which may hold spaces: state, ppid, …
        let ppid = stat.rsplit_once(") ").and_then(|(_, rest)| rest.split(' ').nth(1)).and_then(|p| p.parse::<u32>().ok());
        let exe = std::fs::read_link(format!("/proc/{pid}/exe")).unwrap_or_default();
        if ppid == Some(parent) && exe.file_name().is_some_and(|n| n == "warren-sandbox") {
            out.push(pid);
        }
    }
    out
}

/// The descriptors `pid` holds, by number, each with what it names.
fn fds_of(pid: u32) -> Vec<(u32, String)> {
    let mut fds: Vec<(u32, String)> = std::fs::read_dir(format!("/proc/{pid}/fd"))
        .map(|d| d.flatten().filter_map(|e| e.file_name().to_string_lossy().parse().ok()).collect::<Vec<u32>>())
        .unwrap_or_default()
        .into_iter()
        .map(|fd| (fd, std::fs::read_link(format!("/proc/{pid}/fd/{fd}")).unwrap_or_default().to_string_lossy().into_owned()))
        .collect();
    fds.sort();
    fds
}

/// Supervisors are forked by a spawner the agent starts, not exec'd per
/// sandbox. What that must not cost: the spawner keeps no sandbox's
/// descriptors (it holds its stdio and its socket to the agent, nothing
/// else); each supervisor holds its stdio, its control socket and its
/// init's pidfd, nothing of the agent's or another sandbox's; a spawner
/// killed from outside is replaced at the next sandbox; one serves at most
/// 64 supervisors (they share its address layout), and a replaced one exits
/// once its supervisors are gone.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_spawner_keeps_no_sandboxs_descriptors_and_is_replaced_when_lost_or_used_up() {
    if skip_unless_root("the_spawner_keeps_no_sandboxs_descriptors_and_is_replaced_when_lost_or_used_up") {
        return;
    }
    let mut agent = Agent::start(&["--pool-size", "1", "--warm-interpreters", "false"]).await.expect("agent starts");
    let t = Duration::from_secs(20);
    let ok = |r: &Run| r.stdout == "ok\n" && r.exited.exit_code == 0;
    let run = agent.run(Language::Bash, "echo ok", t).await.expect("a call");
    assert!(ok(&run), "{run:?}");
    settled(&agent, 1).await.expect("the pool refills");
    let spawners = sandbox_binaries_under(agent.pid());
    assert_eq!(spawners.len(), 1, "one spawner serves: {spawners:?}");
    let first = spawners[0];
    let fds = fds_of(first);
    let numbers: Vec<u32> = fds.iter().map(|(fd, _)| *fd).collect();
    assert!(numbers.len() == 4 && numbers[..3] == [0, 1, 2] && fds[3].1.starts_with("socket:"), "the spawner holds its stdio and its socket only: {fds:?}");
    let supervisors = sandbox_binaries_under(first);
    assert!(!supervisors.is_empty(), "the pooled sandbox's supervisor is the spawner's child");
    for s in &supervisors {
        // Once init runs: stdio (in and out on /dev/null), the control socket, init's pidfd.
        let held: Vec<String> = fds_of(*s).into_iter().map(|(_, name)| name).collect();
        let expected = held.len() == 5 && held[0] == "/dev/null" && held[1] == "/dev/null" && held[3].starts_with("socket:") && held[4].contains("pidfd");
        assert!(expected, "supervisor {s} holds its stdio, its control socket and init's pidfd only: {held:?}");
    }

    // Lost: the next sandbox comes from a new spawner, and calls go on.
    // SAFETY: SIGKILL to the spawner this test just found under its own agent.
    #[allow(unsafe_code)]
    unsafe {
        libc::kill(first as i32, libc::SIGKILL);
    }
    for _ in 0..3 {
        let run = agent.run(Language::Bash, "echo ok", t).await.expect("a call after the spawner was lost");
        assert!(ok(&run), "{run:?}");
    }
    settled(&agent, 1).await.expect("the pool refills");
    let second = sandbox_binaries_under(agent.pid());
    assert!(second.len() == 1 && second[0] != first, "a new spawner serves: {second:?} (the lost one was {first})");

    // Used up: after 64 supervisors the next spawner serves, and the old one
    // leaves once its last supervisor has.
    for i in 0..70 {
        let run = agent.run(Language::Bash, "echo ok", t).await.expect("a call");
        assert!(ok(&run), "call {i}: {run:?}");
    }
    settled(&agent, 1).await.expect("the pool refills");
    let replaced = warren_e2e::gateway::wait_for(Duration::from_secs(10), || {
        let now = sandbox_binaries_under(agent.pid());
        now.len() == 1 && now[0] != second[0]
    });
    assert!(replaced, "the used-up spawner {} was replaced and left: {:?}", second[0], sandbox_binaries_under(agent.pid()));
    let last = sandbox_binaries_under(agent.pid());

    // Stopping the agent ends its spawner.
    agent.stop();
    let gone = warren_e2e::gateway::wait_for(Duration::from_secs(10), || !std::fs::read_link(format!("/proc/{}/exe", last[0])).is_ok_and(|e| e.ends_with("warren-sandbox")));
    assert!(gone, "the spawner {} outlived its agent", last[0]);
}
