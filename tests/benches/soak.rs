//! Endurance: the gateway and the agent under a steady mixed load for
//! minutes, with what they hold sampled every minute.
//!
//! Beside the measured load, all the time: one client cycling through 8
//! threads (persistent homes) and 4 clients making Unrestricted python calls
//! that fetch from the network lab's host (own network namespace, unrouted;
//! their key allows 10 at once).
//!
//! 1. Capacity: 24 clients (with the 5 beside, under the agent's 32
//!    concurrent executions) call python, node and bash as fast as they can:
//!    10 s to warm up, then WARREN_SOAK_CALIBRATE_SECS (default 30) measured;
//!    executions/s is the capacity.
//! 2. Soak: WARREN_SOAK_MINUTES (default 10) at 80% of it, open loop (a
//!    ticker hands out calls at the rate; a full queue sheds and counts it).
//!    Every minute (the least of 5 looks a second apart, so executions in
//!    flight count less): resident memory and open descriptors of the agent
//!    and the gateway, sandbox cgroups, mounts below the agent's state
//!    directory, sandbox veths and per-sandbox nftables chains and sets; and
//!    once more when the load has stopped and settled.
//!
//! Prints the series, the errors (anything but a 200 with the expected
//! output) and whether each series is flat from minute 2 to the end (memory
//! within 10%, counts within a quarter or 16) and back at its start once
//! settled. Needs root.
//! `cargo bench --profile dev -p warren-e2e --bench soak`

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use warren_e2e::bench::Conn;
use warren_e2e::gateway::{key, Gateway};
use warren_e2e::netlab::NetLab;
use warren_e2e::{is_root, Agent};

/// Clients of the measured load.
const WORKERS: usize = 24;

fn env_or(name: &str, default: u64) -> u64 {
    std::env::var(name).ok().and_then(|v| v.parse().ok()).unwrap_or(default)
}

/// One call of the mix: (key, body, expected stdout).
fn call(i: u64) -> (&'static str, serde_json::Value, &'static str) {
    match i % 3 {
        0 => ("main", serde_json::json!({"code": "print(sum(range(1000)))", "language": "python"}), "499500\n"),
        1 => ("main", serde_json::json!({"code": "console.log([1,2,3].map(x => x * 2).join(','))", "language": "node"}), "2,4,6\n"),
        _ => ("main", serde_json::json!({"code": "echo $((6 * 7))", "language": "bash"}), "42\n"),
    }
}

#[derive(Default)]
struct Counts {
    ok: AtomicU64,
    errors: AtomicU64,
    shed: AtomicU64,
    first_error: Mutex<Option<String>>,
}

impl Counts {
    fn record(&self, outcome: Result<(), String>) {
        match outcome {
            Ok(()) => {
                self.ok.fetch_add(1, Ordering::Relaxed);
            }
            Err(e) => {
                self.errors.fetch_add(1, Ordering::Relaxed);
                self.first_error.lock().unwrap().get_or_insert(e);
            }
        }
    }
}

async fn run_one(conn: &mut Conn, addr: std::net::SocketAddr, key_name: &str, body: &serde_json::Value, expected: &str) -> Result<(), String> {
    let outcome = match conn.execute(&key(key_name), body.to_string().as_bytes()).await {
        Ok((200, b)) => match serde_json::from_slice::<serde_json::Value>(&b) {
            Ok(v) if v["stdout"] == expected => Ok(()),
            Ok(v) => Err(format!("{v}")),
            Err(e) => Err(e.to_string()),
        },
        other => Err(format!("{other:?}")),
    };
    if outcome.is_err() {
        if let Ok(c) = Conn::open(addr).await {
            *conn = c;
        }
    }
    outcome
}

/// What the processes hold at one moment.
#[derive(Debug, Clone, Copy, Default)]
struct Sample {
    agent_rss_kib: u64,
    agent_fds: u64,
    gateway_rss_kib: u64,
    gateway_fds: u64,
    cgroups: u64,
    mounts: u64,
    veths: u64,
    nft: u64,
}

fn rss_kib(pid: u32) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
    status.lines().find_map(|l| l.strip_prefix("VmRSS:")).and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok()).unwrap_or(0)
}

fn fds(pid: u32) -> u64 {
    std::fs::read_dir(format!("/proc/{pid}/fd")).map_or(0, |d| d.count() as u64)
}

/// Directories named `name` below /sys/fs/cgroup (the agent's parents).
fn cgroup_parents(name: &str) -> Vec<std::path::PathBuf> {
    fn walk(dir: &std::path::Path, name: &str, depth: u32, out: &mut Vec<std::path::PathBuf>) {
        let Ok(entries) = std::fs::read_dir(dir) else { return };
        for e in entries.flatten() {
            if !e.file_type().is_ok_and(|t| t.is_dir()) {
                continue;
            }
            if e.file_name() == name {
                out.push(e.path());
            } else if depth < 8 && !e.file_name().to_string_lossy().starts_with("sbx-") {
                walk(&e.path(), name, depth + 1, out);
            }
        }
    }
    let mut out = Vec::new();
    walk(std::path::Path::new("/sys/fs/cgroup"), name, 0, &mut out);
    out
}

fn sample(agent: &Agent, gw: &Gateway, lab: &NetLab, parents: &[std::path::PathBuf]) -> Sample {
    let state = agent.state_dir();
    let mounts = std::fs::read_to_string("/proc/self/mountinfo").unwrap_or_default();
    Sample {
        agent_rss_kib: rss_kib(agent.pid()),
        agent_fds: fds(agent.pid()),
        gateway_rss_kib: rss_kib(gw.pid()),
        gateway_fds: fds(gw.pid()),
        cgroups: parents.iter().map(|p| std::fs::read_dir(p).map_or(0, |d| d.flatten().filter(|e| e.file_name().to_string_lossy().starts_with("sbx-")).count() as u64)).sum(),
        mounts: mounts.lines().filter(|l| l.split(' ').nth(4).is_some_and(|m| m.starts_with(state.to_str().unwrap()))).count() as u64,
        veths: lab.sandbox_links().len() as u64,
        nft: lab.sandbox_rules().len() as u64,
    }
}

/// Workers pulling call numbers from `rx` until it closes.
fn workers(n: usize, addr: std::net::SocketAddr, rx: Arc<tokio::sync::Mutex<tokio::sync::mpsc::Receiver<u64>>>, counts: Arc<Counts>) -> Vec<tokio::task::JoinHandle<()>> {
    (0..n)
        .map(|_| {
            let (rx, counts) = (rx.clone(), counts.clone());
            tokio::spawn(async move {
                let mut conn = Conn::open(addr).await.expect("connect");
                loop {
                    let Some(i) = rx.lock().await.recv().await else { return };
                    let (k, body, expected) = call(i);
                    counts.record(run_one(&mut conn, addr, k, &body, expected).await);
                }
            })
        })
        .collect()
}

/// Runs the mix for `duration`: as fast as possible without `rate`, else
/// `rate` calls/s open loop. Returns the counts.
async fn drive(addr: std::net::SocketAddr, duration: Duration, rate: Option<f64>, minutes: tokio::sync::mpsc::UnboundedSender<u64>) -> Arc<Counts> {
    let counts = Arc::new(Counts::default());
    let (tx, rx) = tokio::sync::mpsc::channel::<u64>(256);
    let handles = workers(WORKERS, addr, Arc::new(tokio::sync::Mutex::new(rx)), counts.clone());
    let started = Instant::now();
    let mut next_minute = 1;
    let mut i = 0u64;
    while started.elapsed() < duration {
        match rate {
            None => {
                if tx.send(i).await.is_err() {
                    break;
                }
            }
            Some(r) => {
                let due = started + Duration::from_secs_f64(i as f64 / r);
                tokio::time::sleep_until(due.into()).await;
                if tx.try_send(i).is_err() {
                    counts.shed.fetch_add(1, Ordering::Relaxed);
                }
            }
        }
        i += 1;
        if started.elapsed() >= Duration::from_secs(60 * next_minute) {
            let _ = minutes.send(next_minute);
            next_minute += 1;
        }
    }
    drop(tx);
    for h in handles {
        let _ = h.await;
    }
    counts
}

/// Clients beside the measured load until `stop`: one cycling through 8
/// threads, four making Unrestricted calls.
fn side_clients(addr: std::net::SocketAddr, stop: Arc<std::sync::atomic::AtomicBool>, counts: Arc<Counts>) -> Vec<tokio::task::JoinHandle<()>> {
    let thread_call = |i: u64| ("thr", serde_json::json!({"code": "echo x >> ~/log; test -s ~/log && echo ok", "language": "bash", "thread_id": format!("soak-{}", i % 8)}), "ok\n");
    let net_call = |_: u64| {
        let code = "import urllib.request\nprint(urllib.request.urlopen('http://public.test/', timeout=10).read().decode().strip())";
        ("net", serde_json::json!({"code": code, "language": "python"}), "warren-lab\n")
    };
    let kinds: [fn(u64) -> (&'static str, serde_json::Value, &'static str); 5] = [thread_call, net_call, net_call, net_call, net_call];
    kinds
        .into_iter()
        .map(|make| {
            let (stop, counts) = (stop.clone(), counts.clone());
            tokio::spawn(async move {
                let mut conn = Conn::open(addr).await.expect("connect");
                let mut i = 0u64;
                while !stop.load(Ordering::Relaxed) {
                    let (k, body, expected) = make(i);
                    counts.record(run_one(&mut conn, addr, k, &body, expected).await);
                    i += 1;
                }
            })
        })
        .collect()
}

/// The least of each count over 5 looks a second apart.
async fn settled_sample(agent: &Agent, gw: &Gateway, lab: &NetLab, parents: &[std::path::PathBuf]) -> Sample {
    let mut best = sample(agent, gw, lab, parents);
    for _ in 0..4 {
        tokio::time::sleep(Duration::from_secs(1)).await;
        let s = sample(agent, gw, lab, parents);
        best = Sample {
            agent_rss_kib: best.agent_rss_kib.min(s.agent_rss_kib),
            agent_fds: best.agent_fds.min(s.agent_fds),
            gateway_rss_kib: best.gateway_rss_kib.min(s.gateway_rss_kib),
            gateway_fds: best.gateway_fds.min(s.gateway_fds),
            cgroups: best.cgroups.min(s.cgroups),
            mounts: best.mounts.min(s.mounts),
            veths: best.veths.min(s.veths),
            nft: best.nft.min(s.nft),
        };
    }
    best
}

/// Whether `series` (minute 0, 1, …) stays flat from minute 2 to its end
/// and, for counts (`back` set), the settled value is back at minute 0's:
/// within `percent` plus `slack`.
fn flat(name: &str, series: &[u64], settled: u64, back: bool, percent: u64, slack: u64) -> bool {
    let (first, start, end) = (series[0], series[2.min(series.len() - 1)], *series.last().unwrap());
    let within = |base: u64, x: u64| x <= base + base * percent / 100 + slack;
    let ok = within(start, end) && (!back || within(first, settled));
    println!("  {name:<16} minute 2: {start:>8}  end: {end:>8}  settled: {settled:>8} (minute 0: {first})  {}", if ok { "flat" } else { "GROWING" });
    ok
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() {
    if !is_root() {
        eprintln!("SKIPPED soak: needs root");
        return;
    }
    let minutes = env_or("WARREN_SOAK_MINUTES", 10);
    let calibrate = Duration::from_secs(env_or("WARREN_SOAK_CALIBRATE_SECS", 30));
    let lab = NetLab::start().expect("network lab");
    let args = lab.agent_args();
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let agent = Agent::start(&args).await.expect("agent starts");
    let gw = Gateway::start(&[agent.address()], &[], true).await.expect("gateway starts");
    let parents = cgroup_parents(&agent.cgroup_name);

    let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let side_counts = Arc::new(Counts::default());
    let side = side_clients(gw.addr, stop.clone(), side_counts.clone());
    let (ignored, _rx) = tokio::sync::mpsc::unbounded_channel();
    drive(gw.addr, Duration::from_secs(10), None, ignored.clone()).await;
    let c = drive(gw.addr, calibrate, None, ignored).await;
    let capacity = c.ok.load(Ordering::Relaxed) as f64 / calibrate.as_secs_f64();
    let rate = capacity * 0.8;
    println!("capacity: {capacity:.1} executions/s ({WORKERS} clients, {} s, {} errors); soak at {rate:.1}/s for {minutes} min", calibrate.as_secs(), c.errors.load(Ordering::Relaxed));

    let mut series = vec![settled_sample(&agent, &gw, &lab, &parents).await];
    let side_before = (side_counts.ok.load(Ordering::Relaxed), side_counts.errors.load(Ordering::Relaxed));
    let (tick, mut minute) = tokio::sync::mpsc::unbounded_channel();
    let load = drive(gw.addr, Duration::from_secs(60 * minutes), Some(rate), tick);
    tokio::pin!(load);
    let counts = loop {
        tokio::select! {
            counts = &mut load => break counts,
            Some(_) = minute.recv() => series.push(settled_sample(&agent, &gw, &lab, &parents).await),
        }
    };
    stop.store(true, Ordering::Relaxed);
    for h in side {
        let _ = h.await;
    }
    tokio::time::sleep(Duration::from_secs(5)).await;
    let settled = settled_sample(&agent, &gw, &lab, &parents).await;
    let thread_counts = Counts::default();
    thread_counts.ok.store(side_counts.ok.load(Ordering::Relaxed) - side_before.0, Ordering::Relaxed);
    thread_counts.errors.store(side_counts.errors.load(Ordering::Relaxed) - side_before.1, Ordering::Relaxed);
    *thread_counts.first_error.lock().unwrap() = side_counts.first_error.lock().unwrap().clone();
    println!("{:>6} {:>12} {:>9} {:>12} {:>9} {:>8} {:>7} {:>6} {:>5}", "minute", "agent RSS", "agent fd", "gateway RSS", "gw fd", "cgroups", "mounts", "veths", "nft");
    let rows = series.iter().enumerate().map(|(m, x)| (m.to_string(), x)).chain(std::iter::once(("settled".to_string(), &settled)));
    for (m, x) in rows {
        println!(
            "{m:>7} {:>8} KiB {:>9} {:>8} KiB {:>9} {:>8} {:>7} {:>6} {:>5}",
            x.agent_rss_kib, x.agent_fds, x.gateway_rss_kib, x.gateway_fds, x.cgroups, x.mounts, x.veths, x.nft
        );
    }
    let errors = counts.errors.load(Ordering::Relaxed) + thread_counts.errors.load(Ordering::Relaxed);
    println!(
        "executions: {} at {rate:.1}/s + {} thread and network calls beside; errors: {errors}; shed by a full queue: {}",
        counts.ok.load(Ordering::Relaxed),
        thread_counts.ok.load(Ordering::Relaxed),
        counts.shed.load(Ordering::Relaxed)
    );
    for e in [&counts, &thread_counts].iter().filter_map(|c| c.first_error.lock().unwrap().clone()) {
        println!("  first error: {}", e.chars().take(300).collect::<String>());
    }
    if series.len() >= 3 {
        let col = |f: fn(&Sample) -> u64| (series.iter().map(f).collect::<Vec<u64>>(), f(&settled));
        let checks: [(&str, fn(&Sample) -> u64, u64, u64); 8] = [
            ("agent RSS KiB", |x| x.agent_rss_kib, 10, 0),
            ("agent fds", |x| x.agent_fds, 25, 16),
            ("gateway RSS KiB", |x| x.gateway_rss_kib, 10, 0),
            ("gateway fds", |x| x.gateway_fds, 25, 16),
            ("cgroups", |x| x.cgroups, 25, 16),
            ("mounts", |x| x.mounts, 25, 16),
            ("veths", |x| x.veths, 25, 16),
            ("nft", |x| x.nft, 25, 16),
        ];
        // Memory stays at its working set after the load (allocator
        // caches), not at the idle start: only counts must come back.
        let all_flat = checks
            .into_iter()
            .map(|(name, f, pct, slack)| {
                let (s, settled) = col(f);
                flat(name, &s, settled, slack > 0, pct, slack)
            })
            .collect::<Vec<_>>()
            .into_iter()
            .all(|f| f);
        println!("verdict: {} errors, {}", errors, if all_flat { "every series flat from minute 2" } else { "a series grew" });
    }
}
