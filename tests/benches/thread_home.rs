//! Cost of thread homes, measured against the same call without a thread in
//! the same run (end to end over gRPC, warm pool as deployed):
//!
//! - warm repeat: a call on a thread whose state this node already holds,
//!   against a call without thread_id (target: ≤ 1 ms extra at p50);
//! - save: a call that writes N MB into its home (1, 10, 100), against the
//!   same program writing to a thread-less home — the diff is written, made
//!   durable in the store and applied to the node's warm copy;
//! - cold restore: the first call of an N MB thread on a node that does not
//!   hold it (its warm copy removed), against a thread-less call — the layers
//!   are read from the store and unpacked (target: 10 MB save + restore ≤ 50 ms).
//!
//! Stores: the local directory store (single machine) and, when s3s-fs is
//! installed, S3 on loopback. Needs root.
//!
//! `cargo bench -p warren-e2e --bench thread_home` (WARREN_BENCH_RUNS: warm runs, default 200).

use warren_proto::agent::Failure;
use std::time::{Duration, Instant};

use warren_e2e::bench::{ms, percentile};
use warren_e2e::s3::S3Server;
use warren_e2e::{is_root, request, Agent};
use warren_proto::agent as pb;

fn call(code: &str, thread: Option<&str>) -> pb::ExecuteRequest {
    let mut req = request(pb::Language::Bash, code, Duration::from_secs(120));
    req.limits = Some(pb::Limits { home_bytes: 256 << 20, tmp_bytes: 256 << 20, ..Default::default() });
    req.thread = thread.map(|t| pb::ThreadOptions {
        r#ref: Some(pb::ThreadRef { namespace: "bench".into(), key_name: "key".into(), thread_id: t.into() }),
        retention_seconds: 0,
        max_bytes: 4 << 30,
        max_threads: 0,
        history_versions: 0,
    });
    req
}

async fn timed(agent: &Agent, req: pb::ExecuteRequest) -> Duration {
    let t = Instant::now();
    let run = agent.run_request(req).await.unwrap();
    let took = t.elapsed();
    assert_eq!((run.exited.exit_code, run.exited.failure()), (0, Failure::Unspecified), "{run:?}");
    took
}

fn p50(mut v: Vec<Duration>) -> Duration {
    v.sort();
    percentile(&v, 0.5)
}

async fn bench_store(label: &str, agent: &Agent, runs: usize) {
    // Warm repeat: a thread holding a small venv, as an agent's session would.
    timed(agent, call("python3 -m venv --without-pip ~/venv && echo 1", Some("warm"))).await;
    let (mut plain, mut warm) = (Vec::new(), Vec::new());
    for _ in 0..runs {
        plain.push(timed(agent, call("echo 1", None)).await);
        warm.push(timed(agent, call("echo 1", Some("warm"))).await);
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    plain.sort();
    warm.sort();
    println!(
        "{label:<7} warm repeat     no thread p50 {:>7.2} ms p99 {:>7.2} ms | thread p50 {:>7.2} ms p99 {:>7.2} ms | Δ p50 {:>+6.2} ms",
        ms(percentile(&plain, 0.5)),
        ms(percentile(&plain, 0.99)),
        ms(percentile(&warm, 0.5)),
        ms(percentile(&warm, 0.99)),
        ms(percentile(&warm, 0.5)) - ms(percentile(&plain, 0.5)),
    );
    let warm_dir = agent.state_dir().join("threads/bench/key");
    for mb in [1u64, 10, 100] {
        let reps = if mb == 100 { 5 } else { 9 };
        // Random data: nothing on the way may get it for free by compressing.
        let write = format!("head -c {} /dev/urandom > ~/data && echo 1", mb << 20);
        let (mut base, mut saved, mut base_read, mut restored) = (Vec::new(), Vec::new(), Vec::new(), Vec::new());
        for rep in 0..reps {
            // A new thread each time: one diff of exactly N MB to save and restore.
            let thread = format!("size-{mb}-{rep}");
            base.push(timed(agent, call(&write, None)).await);
            saved.push(timed(agent, call(&write, Some(&thread))).await);
            // Cold restore: this node forgets its copy, as another node never had it.
            std::fs::remove_dir_all(warm_dir.join(&thread)).unwrap();
            base_read.push(timed(agent, call("echo 1", None)).await);
            restored.push(timed(agent, call("echo 1", Some(&thread))).await);
        }
        let save = ms(p50(saved)) - ms(p50(base));
        let restore = ms(p50(restored)) - ms(p50(base_read));
        println!("{label:<7} {mb:>3} MB diff      save Δ p50 {save:>8.2} ms | cold restore Δ p50 {restore:>8.2} ms | save + restore {:>8.2} ms", save + restore);
    }
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() {
    if !is_root() {
        eprintln!("SKIPPED thread_home: needs root");
        return;
    }
    let runs: usize = std::env::var("WARREN_BENCH_RUNS").ok().and_then(|v| v.parse().ok()).unwrap_or(200);
    println!("thread home benchmark: {runs} warm runs interleaved; sizes 1/10/100 MB of random data (p50 of 9/9/5)");
    let local = Agent::start(&[]).await.expect("agent starts");
    bench_store("dir", &local, runs).await;
    drop(local);
    match S3Server::start() {
        Ok(s3) => {
            let url = s3.store_url();
            let env_owned = s3.env();
            let env: Vec<(&str, &str)> = env_owned.iter().map(|(k, v)| (*k, v.as_str())).collect();
            // s3s-fs answers reused keep-alive connections ~40 ms late (no
            // TCP_NODELAY on its side): measure both ways.
            let agent = Agent::start_with(&["--thread-store", url.as_str()], &env, None).await.expect("agent starts");
            bench_store("s3", &agent, runs).await;
            drop(agent);
            let agent = Agent::start_with(&["--thread-store", url.as_str(), "--s3-pool-max-idle", "0"], &env, None).await.expect("agent starts");
            bench_store("s3/new", &agent, runs).await;
        }
        Err(e) => println!("s3     SKIPPED: {e}"),
    }
}
