//! Warm interpreters against cold starts and the bare process, in one run.
//!
//! Two agents on this machine: one as deployed (warm interpreters on) and
//! one with `--warm-interpreters false`. For python `print(1)`, node
//! `console.log(1)` and python importing the heaviest library here (boto3,
//! warmed with `warm_modules` on the warm agent), N calls on each agent
//! (gRPC, request sent → `Exited`) are interleaved with N bare spawns; each
//! warm call waits until the pool has refilled, as between an agent's tool
//! calls. Prints p50/p99 and the ratios; then the memory one idle warm
//! interpreter holds (the pool's charge, per shape, from the agents' status).
//!
//! `cargo bench -p warren-e2e --bench warm_start` (WARREN_BENCH_RUNS default
//! 100; WARREN_BIN_DIR=target/release for release figures).

use std::io::Write;
use std::time::{Duration, Instant};

use warren_e2e::bench::{bare_output, ms, percentile, pool_refilled as refilled, pool_settled as settled, pool_status as status};
use warren_e2e::{is_root, request, Agent};
use warren_proto::agent::{ExecuteRequest, Language};

struct Case {
    name: &'static str,
    language: Language,
    interpreter: &'static str,
    code: &'static str,
    modules: &'static [&'static str],
}

const CASES: &[Case] = &[
    Case { name: "python print(1)", language: Language::Python, interpreter: "/usr/bin/python3", code: "print(1)", modules: &[] },
    Case { name: "node log(1)", language: Language::Node, interpreter: "/usr/bin/node", code: "console.log(1)", modules: &[] },
    Case { name: "python boto3", language: Language::Python, interpreter: "/usr/bin/python3", code: "import boto3; print(boto3.__version__)", modules: &["boto3"] },
];

fn req(c: &Case) -> ExecuteRequest {
    let mut r = request(c.language, c.code, Duration::from_secs(60));
    r.warm_modules = c.modules.iter().map(|m| m.to_string()).collect();
    r
}

/// One call; its wall time and stdout.
async fn call(agent: &Agent, r: ExecuteRequest) -> (Duration, String) {
    let t = Instant::now();
    let run = agent.run_request(r).await.expect("call");
    assert_eq!(run.exited.exit_code, 0, "{}", run.stderr);
    (t.elapsed(), run.stdout)
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() {
    if !is_root() {
        eprintln!("SKIPPED warm_start: needs root");
        return;
    }
    let runs: usize = std::env::var("WARREN_BENCH_RUNS").ok().and_then(|v| v.parse().ok()).unwrap_or(100);
    let warm = Agent::start(&[]).await.expect("agent starts");
    let cold = Agent::start(&["--warm-interpreters", "false"]).await.expect("agent starts");
    let dir = tempfile::tempdir().unwrap();
    // Idle memory: the cold agent pools plain sandboxes only (2); the warm
    // one adds a shape per interpreter (2 each).
    let (_, plain) = settled(&cold).await;
    let (_, with_python) = settled(&warm).await;
    let mut memory = vec![("plain sandbox", plain / 2), ("python print(1)", with_python.saturating_sub(plain) / 2)];
    println!("warm start benchmark: {runs} calls per case and agent, interleaved with bare spawns");
    println!("{:<16} {:>9} {:>9} {:>9} {:>9} {:>9} {:>9} {:>11} {:>10}", "case", "bare p50", "bare p99", "cold p50", "cold p99", "warm p50", "warm p99", "warm/bare", "warm hits");
    let mut print1_warm = Duration::ZERO;
    for c in CASES {
        let script = dir.path().join(c.name.replace(' ', "-"));
        std::fs::File::create(&script).unwrap().write_all(c.code.as_bytes()).unwrap();
        // A new shape: its first call starts cold and makes the demand.
        let (count, before) = settled(&warm).await;
        call(&warm, req(c)).await;
        let (mut pool, after) = settled(&warm).await;
        if pool == count + 2 {
            memory.push((c.name, after.saturating_sub(before) / 2));
        }
        let (mut b, mut k, mut w) = (Vec::new(), Vec::new(), Vec::new());
        let hits_before = status(&warm).await.2;
        for i in 0..runs + 3 {
            let (bd, bout) = bare_output(c.interpreter, &script);
            let (kd, kout) = call(&cold, req(c)).await;
            if !refilled(&warm, pool).await {
                pool = settled(&warm).await.0;
            }
            let (wd, wout) = call(&warm, req(c)).await;
            assert_eq!((kout.as_bytes(), wout.as_bytes()), (&bout[..], &bout[..]));
            if i >= 3 {
                b.push(bd);
                k.push(kd);
                w.push(wd);
            }
        }
        let hits = status(&warm).await.2 - hits_before;
        for v in [&mut b, &mut k, &mut w] {
            v.sort();
        }
        let p = |v: &[Duration], q| ms(percentile(v, q));
        if c.name == "python print(1)" {
            print1_warm = percentile(&w, 0.5);
        }
        println!(
            "{:<16} {:>7.2}ms {:>7.2}ms {:>7.2}ms {:>7.2}ms {:>7.2}ms {:>7.2}ms {:>10.2}x {:>6}/{}",
            c.name,
            p(&b, 0.5),
            p(&b, 0.99),
            p(&k, 0.5),
            p(&k, 0.99),
            p(&w, 0.5),
            p(&w, 0.99),
            p(&w, 0.5) / p(&b, 0.5),
            hits,
            runs + 3
        );
        if !c.modules.is_empty() {
            println!("{:<16} warm p50 is {:.2}x the warm python print(1) p50", "", ms(percentile(&w, 0.5)) / ms(print1_warm));
        }
    }
    println!();
    println!("Idle memory per pooled sandbox (cgroup charge, from the agents' status), and its interpreter's share:");
    let mib = |b: u64| b as f64 / (1 << 20) as f64;
    let base = memory[0].1;
    for (what, bytes) in memory {
        println!("  {what:<20} {:>8.1} MiB  interpreter {:>6.1} MiB", mib(bytes), mib(bytes.saturating_sub(base)));
    }
}
