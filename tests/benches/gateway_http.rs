//! HTTP round trip through the gateway and the node-agent, against a bare
//! interpreter in the same run; then throughput with concurrent clients.
//!
//! 1. Latency: for python, node and bash, N `POST /v1/sandbox/execute` calls
//!    on one keep-alive connection (request sent → JSON result read) are
//!    interleaved with N bare spawns of the interpreter; p50/p99 of both and
//!    the difference. Before each call the warm pool has refilled (warm
//!    interpreters included), as between an agent's tool calls.
//! 2. `Idempotency-Key`: bash `echo 1` without a key, with a fresh key each
//!    call and with a key already answered (a replay), interleaved with bare
//!    spawns.
//! 3. Throughput: C clients (own connections) call `echo 1` in bash as fast
//!    as they can for S seconds; executions/s and errors (anything but a 200
//!    with stdout "1\n").
//!
//! Needs root and release binaries (`cargo build --release --workspace --bins`):
//! `cargo bench -p warren-e2e --bench gateway_http`
//! (WARREN_BENCH_RUNS default 200, WARREN_BENCH_CLIENTS default 64,
//! WARREN_BENCH_SECONDS default 30; WARREN_BENCH_IDEMPOTENCY=0 skips part 2,
//! for a baseline gateway without it).

use std::io::Write;
use std::time::{Duration, Instant};

use warren_e2e::bench::{bare, ms, percentile, pool_refilled, pool_settled, print_rows, Conn};
use warren_e2e::gateway::{key, Gateway};
use warren_e2e::{is_root, Agent};

fn env_or(name: &str, default: u64) -> u64 {
    std::env::var(name).ok().and_then(|v| v.parse().ok()).unwrap_or(default)
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() {
    if !is_root() {
        eprintln!("SKIPPED gateway_http: needs root");
        return;
    }
    let agent_args = std::env::var("WARREN_BENCH_AGENT_ARGS").unwrap_or_default();
    let agent_args: Vec<&str> = agent_args.split_whitespace().collect();
    let agent = Agent::start(&agent_args).await.expect("agent starts");
    let gw = Gateway::start(&[agent.address()], &[], true).await.expect("gateway starts");
    latency(&gw, &agent, env_or("WARREN_BENCH_RUNS", 200) as usize).await;
    // A baseline gateway older than the Idempotency-Key skips it.
    if env_or("WARREN_BENCH_IDEMPOTENCY", 1) == 1 {
        idempotent(&gw, &agent, env_or("WARREN_BENCH_RUNS", 200) as usize).await;
    }
    throughput(&gw, env_or("WARREN_BENCH_CLIENTS", 64) as usize, Duration::from_secs(env_or("WARREN_BENCH_SECONDS", 30))).await;
}

async fn latency(gw: &Gateway, agent: &Agent, runs: usize) {
    let dir = tempfile::tempdir().unwrap();
    let mut conn = Conn::open(gw.addr).await.unwrap();
    let k = key("main");
    println!("HTTP round trip: {runs} calls per language on one keep-alive connection, interleaved with bare spawns");
    println!("{:<8} {:>10} {:>10} {:>10} {:>10} {:>10} {:>10}", "lang", "bare p50", "bare p99", "http p50", "http p99", "Δ p50", "Δ p99");
    for (lang, interp, code) in [("python", "/usr/bin/python3", "print(1)"), ("node", "/usr/bin/node", "console.log(1)"), ("bash", "/bin/bash", "echo 1")] {
        let script = dir.path().join(format!("bench-{lang}"));
        std::fs::File::create(&script).unwrap().write_all(code.as_bytes()).unwrap();
        let body = serde_json::json!({"code": code, "language": lang}).to_string();
        let (mut b, mut h) = (Vec::new(), Vec::new());
        let mut full = 0;
        for i in 0..runs + 5 {
            if i == 5 {
                full = pool_settled(agent).await.0;
            }
            pool_refilled(agent, full).await;
            let bd = bare(interp, &script);
            let t = Instant::now();
            let (status, resp) = conn.execute(&k, body.as_bytes()).await.unwrap();
            let hd = t.elapsed();
            let v: serde_json::Value = serde_json::from_slice(&resp).unwrap();
            assert_eq!((status, v["stdout"].as_str()), (200, Some("1\n")), "{v}");
            if i >= 5 {
                // The first five warm the page cache and the pool.
                b.push(bd);
                h.push(hd);
            }
        }
        b.sort();
        h.sort();
        let (bp50, bp99, hp50, hp99) = (percentile(&b, 0.5), percentile(&b, 0.99), percentile(&h, 0.5), percentile(&h, 0.99));
        println!(
            "{lang:<8} {:>8.2}ms {:>8.2}ms {:>8.2}ms {:>8.2}ms {:>+8.2}ms {:>+8.2}ms",
            ms(bp50),
            ms(bp99),
            ms(hp50),
            ms(hp99),
            ms(hp50) - ms(bp50),
            ms(hp99) - ms(bp99)
        );
    }
}

/// Bash `echo 1` without an Idempotency-Key, with a fresh one (claimed,
/// run, answer stored) and with one already answered (a replay: nothing
/// runs), interleaved with bare spawns.
async fn idempotent(gw: &Gateway, agent: &Agent, runs: usize) {
    let dir = tempfile::tempdir().unwrap();
    let script = dir.path().join("bench-idem");
    std::fs::write(&script, "echo 1").unwrap();
    let mut conn = Conn::open(gw.addr).await.unwrap();
    let (k, body) = (key("main"), serde_json::json!({"code": "echo 1", "language": "bash"}).to_string());
    let (_, first) = conn.execute_with(&k, body.as_bytes(), &[("idempotency-key", "bench-replayed")]).await.unwrap();
    let mut rows: [(&str, Vec<Duration>); 4] = [("bare", vec![]), ("no key", vec![]), ("fresh key", vec![]), ("replayed", vec![])];
    let full = pool_settled(agent).await.0;
    for i in 0..runs + 5 {
        pool_refilled(agent, full).await;
        let fresh = format!("bench-{i}");
        let times = [
            bare("/bin/bash", &script),
            conn.timed(&k, &body, &[]).await,
            conn.timed(&k, &body, &[("idempotency-key", &fresh)]).await,
            conn.timed(&k, &body, &[("idempotency-key", "bench-replayed")]).await,
        ];
        if i >= 5 {
            rows.iter_mut().zip(times).for_each(|((_, v), t)| v.push(t));
        }
    }
    let (_, again) = conn.execute_with(&k, body.as_bytes(), &[("idempotency-key", "bench-replayed")]).await.unwrap();
    assert_eq!(again, first, "a replay answers the first call's answer");
    println!("Idempotency-Key, bash `echo 1`, {runs} calls each, interleaved");
    print_rows(&rows, 10);
}

async fn throughput(gw: &Gateway, clients: usize, duration: Duration) {
    let s = warren_e2e::bench::saturate(gw.addr, &key("main"), clients, duration, u64::MAX).await;
    let (ok, errors, elapsed, first_error) = (s.ok, s.errors, s.seconds, s.first_error);
    println!();
    println!("Throughput: {clients} clients, {:.0} s, bash `echo 1`", duration.as_secs_f64());
    println!("  executions: {ok}  errors: {errors}  rate: {:.0} executions/s", ok as f64 / elapsed);
    if let Some(e) = first_error {
        println!("  first error: {e}");
    }
}
