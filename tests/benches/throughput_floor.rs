//! Throughput against the kernel's floor (#48): in one run, alternately,
//!
//! 1. the floor: `tests/benches/floors.py --floor`, bash `echo 1` in a loop
//!    of fork → unshare (the six namespaces a sandbox gets) → fork → exec,
//!    four drivers, 5 s: what this machine's kernel does per call before
//!    Warren does anything;
//! 2. Warren: C clients (own keep-alive connections) call bash `echo 1`
//!    through `POST /v1/sandbox/execute` of a real gateway and agent as fast
//!    as they can, for S seconds or N calls, whichever comes first;
//!
//! and reports both rates, their ratio (the goal is ≥ 0.90), and the CPU
//! each call took, by where it went:
//!
//! - gateway: the gateway process (its own cpuacct group);
//! - agent: the agent process (`/proc/<pid>/stat`, all its threads);
//! - supervisors: what the agent spawns before a sandbox's init is in its
//!   cgroups (the `warren-sandbox` exec, the clone into the namespaces, id
//!   maps, the cgroup join; the agent's cpuacct group less the agent);
//! - sandboxes: everything in the sandboxes' cgroups (init's mounts, seccomp,
//!   the program, the namespaces' teardown at exit; the agent's cpuacct
//!   parent, which keeps what removed groups used);
//! - client: this process (the 64 HTTP clients, the gateway log reader);
//! - kthreads: kernel threads (deferred work: cgroup and namespace teardown;
//!   a lower bound: what a worker that exits meanwhile used is not seen);
//! - rest: the rest of the machine's busy time (other work on the machine:
//!   a large figure says the run was disturbed).
//!
//! The floor's own CPU per call (its drivers and their children, reaped)
//! and the kernel threads' during it are given beside it. A Warren phase's
//! CPU is read from its start until the pool has refilled after it, so it
//! is the work of exactly the calls it counts.
//!
//! Needs root, release binaries (`cargo build --release --workspace --bins`)
//! and python3: `WARREN_BIN_DIR=target/release cargo bench -p warren-e2e
//! --bench throughput_floor`. Knobs: WARREN_BENCH_CLIENTS (64),
//! WARREN_BENCH_SECONDS (15), WARREN_BENCH_MAX_CALLS (20000 per phase),
//! WARREN_BENCH_ROUNDS (2), WARREN_BENCH_AGENT_ARGS.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use warren_e2e::bench::pool_settled;
use warren_e2e::gateway::{key, Gateway};
use warren_e2e::{is_root, Agent};

/// `/proc`'s clock ticks (USER_HZ: 100 on every Linux architecture Warren runs on).
const TICK_US: f64 = 10_000.0;

fn env_or(name: &str, default: u64) -> u64 {
    std::env::var(name).ok().and_then(|v| v.parse().ok()).unwrap_or(default)
}

/// Fields of `/proc/<pid>/stat` after the command name, from field 3 (state).
fn stat_fields(pid: &str) -> Option<Vec<u64>> {
    let text = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    let rest = &text[text.rfind(')')? + 2..];
    Some(rest.split_whitespace().map(|f| f.parse().unwrap_or(0)).collect())
}

/// A process's user + system CPU, all its threads, µs.
fn process_us(pid: &str) -> f64 {
    stat_fields(pid).map_or(0.0, |f| (f[11] + f[12]) as f64 * TICK_US)
}

/// CPU of each kernel thread (PF_KTHREAD) by pid, µs.
fn kthreads() -> HashMap<String, f64> {
    let Ok(entries) = std::fs::read_dir("/proc") else { return HashMap::new() };
    let pids = entries.flatten().filter_map(|e| e.file_name().to_str().filter(|n| n.bytes().all(|b| b.is_ascii_digit())).map(str::to_string));
    pids.filter_map(|p| Some((stat_fields(&p)?, p))).filter(|(f, _)| f[6] & 0x0020_0000 != 0).map(|(f, p)| (p, (f[11] + f[12]) as f64 * TICK_US)).collect()
}

/// What kernel threads used from `before` to now, µs: those that lived
/// through it and those that started meanwhile (one that exited meanwhile
/// took what it used with it: a lower bound).
fn kthreads_since(before: &HashMap<String, f64>) -> f64 {
    kthreads().iter().map(|(pid, now)| now - before.get(pid).copied().unwrap_or(0.0)).filter(|d| *d > 0.0).sum()
}

/// The machine's busy time (all CPUs, everything but idle and iowait), µs.
fn machine_busy_us() -> f64 {
    let text = std::fs::read_to_string("/proc/stat").unwrap_or_default();
    let cpu: Vec<u64> = text.lines().next().unwrap_or_default().split_whitespace().skip(1).map(|v| v.parse().unwrap_or(0)).collect();
    // user nice system idle iowait irq softirq steal (guest time is in user).
    cpu.iter().take(8).sum::<u64>().saturating_sub(cpu.get(3).copied().unwrap_or(0) + cpu.get(4).copied().unwrap_or(0)) as f64 * TICK_US
}

fn cpuacct_us(group: &Path) -> f64 {
    std::fs::read_to_string(group.join("cpuacct.usage")).ok().and_then(|s| s.trim().parse::<f64>().ok()).map_or(0.0, |ns| ns / 1000.0)
}

/// The cpuacct hierarchy's mount point (cgroup v1).
const CPUACCT: &str = "/sys/fs/cgroup/cpuacct";

/// cpuacct groups of its own for the gateway and the agent, so that what
/// they and their children use is counted to the nanosecond (v1 charges a
/// group and all its ancestors, so a parent keeps what removed children
/// used). Removed on drop.
struct Groups {
    base: PathBuf,
    gateway: PathBuf,
    agent: PathBuf,
    /// The agent's sandboxes' parent group.
    sandboxes: PathBuf,
}

impl Groups {
    fn new(gateway_pid: u32, agent: &Agent) -> Groups {
        let base = Path::new(CPUACCT).join(format!("warren-bench-{}", std::process::id()));
        let (gateway, agent_group) = (base.join("gateway"), base.join("agent"));
        for (dir, pid) in [(&gateway, gateway_pid), (&agent_group, agent.pid())] {
            std::fs::create_dir_all(dir).expect("a cpuacct group (cgroup v1 with cpuacct mounted at /sys/fs/cgroup/cpuacct)");
            std::fs::write(dir.join("cgroup.procs"), pid.to_string()).expect("moving a process into its cpuacct group");
        }
        // The agent found its sandboxes' parent where it was started: in this process's group.
        let sandboxes = warren_e2e::cgroup_parents(&agent.cgroup_name).into_iter().find(|p| p.starts_with(CPUACCT)).expect("the agent's cpuacct parent");
        Groups { base, gateway, agent: agent_group, sandboxes }
    }
}

impl Drop for Groups {
    fn drop(&mut self) {
        for dir in [&self.gateway, &self.agent] {
            let procs = std::fs::read_to_string(dir.join("cgroup.procs")).unwrap_or_default();
            for pid in procs.lines() {
                let _ = std::fs::write(Path::new(CPUACCT).join("cgroup.procs"), pid);
            }
            let _ = std::fs::remove_dir(dir);
        }
        let _ = std::fs::remove_dir(&self.base);
    }
}

/// CPU used so far by each component, µs (kernel threads: each one's).
#[derive(Clone, Default)]
struct Cpu {
    gateway: f64,
    agent: f64,
    agent_group: f64,
    sandboxes: f64,
    client: f64,
    kthreads: HashMap<String, f64>,
    machine: f64,
}

impl Cpu {
    fn now(groups: &Groups, agent_pid: u32) -> Cpu {
        Cpu {
            gateway: cpuacct_us(&groups.gateway),
            agent: process_us(&agent_pid.to_string()),
            agent_group: cpuacct_us(&groups.agent),
            sandboxes: cpuacct_us(&groups.sandboxes),
            client: process_us("self"),
            kthreads: kthreads(),
            machine: machine_busy_us(),
        }
    }

    /// Per call from `self` to now, in the order of [`COMPONENTS`].
    fn per_call(&self, groups: &Groups, agent_pid: u32, calls: u64) -> [f64; 7] {
        let kthreads = kthreads_since(&self.kthreads);
        let later = Cpu::now(groups, agent_pid);
        let d = |a: f64, b: f64| (b - a) / calls.max(1) as f64;
        let (gw, agent, sup, sbx, client, kth) = (
            d(self.gateway, later.gateway),
            d(self.agent, later.agent),
            d(self.agent_group - self.agent, later.agent_group - later.agent),
            d(self.sandboxes, later.sandboxes),
            d(self.client, later.client),
            kthreads / calls.max(1) as f64,
        );
        let rest = d(self.machine, later.machine) - (gw + agent + sup + sbx + client + kth);
        [gw, agent, sup, sbx, client, kth, rest]
    }
}

const COMPONENTS: [&str; 7] = ["gateway", "agent", "supervisors", "sandboxes", "client", "kthreads", "rest"];

/// One floor phase: calls/s, the floor's own CPU per call, its kernel threads' per call.
fn floor() -> (f64, f64, f64) {
    // WARREN_FLOORS_PY: where this binary runs away from its checkout
    // (scripts/device-bench.sh, on a node that has no build).
    let script = std::env::var_os("WARREN_FLOORS_PY").map(PathBuf::from).unwrap_or_else(|| Path::new(env!("CARGO_MANIFEST_DIR")).join("benches/floors.py"));
    let k0 = kthreads();
    let out = std::process::Command::new("python3").arg("-S").arg(&script).arg("--floor").output().expect("python3 runs floors.py");
    let k = kthreads_since(&k0);
    let text = String::from_utf8_lossy(&out.stdout);
    let line = text.lines().find_map(|l| l.strip_prefix("floor ")).unwrap_or_else(|| panic!("floors.py --floor printed {text:?}, {}", String::from_utf8_lossy(&out.stderr)));
    let mut v = line.split_whitespace().map(|f| f.parse::<f64>().unwrap());
    let (rate, cpu) = (v.next().unwrap(), v.next().unwrap());
    (rate, cpu, k / (rate * 5.0).max(1.0))
}

/// C clients call bash `echo 1` until `duration` or `max_calls`; the calls
/// answered right, the phase's seconds, and the first wrong answer.
async fn warren(gw: &Gateway, clients: usize, duration: Duration, max_calls: u64) -> (u64, f64, u64, Option<String>) {
    let s = warren_e2e::bench::saturate(gw.addr, &key("main"), clients, duration, max_calls).await;
    (s.ok, s.seconds, s.errors, s.first_error)
}

/// Waits until nothing runs and the pool has refilled (bounded).
async fn quiet(agent: &Agent) {
    let t = Instant::now();
    while warren_e2e::gateway::agent_running(agent).await > 0 && t.elapsed() < Duration::from_secs(30) {
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    pool_settled(agent).await;
}

fn print_cpu(name: &str, v: &[f64; 7]) {
    let cells: Vec<String> = v.iter().map(|us| format!("{:>8.0}", us)).collect();
    println!("  {name:<22} {}  {:>8.0}", cells.join(" "), v[..4].iter().sum::<f64>());
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() {
    if !is_root() {
        eprintln!("SKIPPED throughput_floor: needs root");
        return;
    }
    let (clients, seconds) = (env_or("WARREN_BENCH_CLIENTS", 64) as usize, env_or("WARREN_BENCH_SECONDS", 15));
    let (max_calls, rounds) = (env_or("WARREN_BENCH_MAX_CALLS", 20_000), env_or("WARREN_BENCH_ROUNDS", 2));
    let agent_args = std::env::var("WARREN_BENCH_AGENT_ARGS").unwrap_or_default();
    let agent = Agent::start(&agent_args.split_whitespace().collect::<Vec<_>>()).await.expect("agent starts");
    let gw = Gateway::start(&[agent.address()], &[], true).await.expect("gateway starts");
    let groups = Groups::new(gw.pid(), &agent);
    println!("throughput against the floor: bash `echo 1`; floor 4 drivers 5 s; Warren {clients} clients, {seconds} s or {max_calls} calls (binaries from {})", warren_e2e::bin_dir().display());
    // Warm up: the pool's shapes, the connections, the page cache.
    warren(&gw, clients, Duration::from_secs(2), max_calls).await;
    quiet(&agent).await;
    let mut rows = Vec::new();
    for round in 1..=rounds {
        let (floor_rate, floor_cpu, floor_kthreads) = floor();
        quiet(&agent).await;
        let before = Cpu::now(&groups, agent.pid());
        let (calls, secs, errors, first_error) = warren(&gw, clients, Duration::from_secs(seconds), max_calls).await;
        quiet(&agent).await;
        let cpu = before.per_call(&groups, agent.pid(), calls);
        let rate = calls as f64 / secs;
        println!("round {round}: floor {floor_rate:.0}/s (CPU {floor_cpu:.0} µs/call, kthreads {floor_kthreads:.0})  Warren {rate:.0}/s ({calls} calls, {errors} errors)  ratio {:.3}", rate / floor_rate);
        if let Some(e) = first_error {
            println!("  first error: {e}");
        }
        rows.push((floor_rate, floor_cpu, floor_kthreads, rate, cpu));
    }
    let n = rows.len() as f64;
    let (floor_rate, rate) = (rows.iter().map(|r| r.0).sum::<f64>() / n, rows.iter().map(|r| r.3).sum::<f64>() / n);
    println!();
    println!("floor {floor_rate:.0}/s  Warren {rate:.0}/s  ratio {:.3}  (means of {rounds} alternated rounds)", rate / floor_rate);
    // "Warren": gateway, agent, supervisors and sandboxes together.
    println!("CPU per call, µs:        {}  {:>8}", COMPONENTS.iter().map(|c| format!("{c:>8}")).collect::<Vec<_>>().join(" "), "Warren");
    for (i, r) in rows.iter().enumerate() {
        print_cpu(&format!("Warren, round {}", i + 1), &r.4);
    }
    for (i, r) in rows.iter().enumerate() {
        println!("  floor, round {}          floor's own {:>8.0}  kthreads {:>8.0}", i + 1, r.1, r.2);
    }
    // Warren is CPU-bound at saturation (the floor is not: its drivers wait
    // on the kernel), so what the rest of a busy machine takes lowers its
    // rate: the CPU its calls took says what the whole machine would sustain.
    let cores = std::thread::available_parallelism().map_or(1, |n| n.get()) as f64;
    let per_call = rows.iter().map(|r| r.4[..6].iter().sum::<f64>()).sum::<f64>() / n;
    println!(
        "Warren's calls took {per_call:.0} µs of CPU each (its kernel threads and the clients included): {cores:.0} cores to itself would sustain {:.0}/s, {:.3} of the floor",
        cores * 1e6 / per_call,
        cores * 1e6 / per_call / floor_rate
    );
    drop(groups);
}
