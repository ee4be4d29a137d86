//! Isolation overhead of the node-agent against a bare process, in one run.
//!
//! For each language, N round trips of `Execute` (request sent → `Exited`
//! received, through gRPC on a Unix socket, warm pool as deployed) are
//! interleaved with N spawns of the same interpreter on the same program with
//! a minimal environment, stdout piped and waited for. Prints p50/p99 of both
//! and the difference. This is the cold path: the agent runs without warm
//! interpreters (`benches/warm_start.rs` measures those). Needs root (CI and
//! the README command run it as root).
//!
//! `cargo bench -p warren-e2e --bench agent_overhead` (N from WARREN_BENCH_RUNS, default 200).

use std::io::Write;
use std::time::{Duration, Instant};

use warren_e2e::bench::{bare, ms, percentile, pool_refilled, pool_settled};
use warren_e2e::{is_root, request, Agent};
use warren_proto::agent::Language;

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() {
    if !is_root() {
        eprintln!("SKIPPED agent_overhead: needs root");
        return;
    }
    let runs: usize = std::env::var("WARREN_BENCH_RUNS").ok().and_then(|v| v.parse().ok()).unwrap_or(200);
    let agent = Agent::start(&["--warm-interpreters", "false"]).await.expect("agent starts");
    let mut client = agent.client().await.expect("client");
    let dir = tempfile::tempdir().unwrap();
    println!("agent overhead benchmark: {runs} runs per language, interleaved with bare spawns");
    println!("{:<8} {:>10} {:>10} {:>10} {:>10} {:>10} {:>10} {:>12}", "lang", "bare p50", "bare p99", "warren p50", "warren p99", "Δ p50", "Δ p99", "agent setup");
    for (lang, interp, code) in [
        (Language::Python, "/usr/bin/python3", "print(1)"),
        (Language::Node, "/usr/bin/node", "console.log(1)"),
        (Language::Bash, "/bin/bash", "echo 1"),
    ] {
        let script = dir.path().join(format!("bench-{}", lang.as_str_name()));
        std::fs::File::create(&script).unwrap().write_all(code.as_bytes()).unwrap();
        let (mut b, mut w, mut setup) = (Vec::new(), Vec::new(), Vec::new());
        // Warm-up: page cache and the pool.
        for _ in 0..5 {
            bare(interp, &script);
            agent.run(lang, code, Duration::from_secs(30)).await.unwrap();
        }
        let (pooled, _) = pool_settled(&agent).await;
        for _ in 0..runs {
            b.push(bare(interp, &script));
            let t = Instant::now();
            let mut stream = client.execute(request(lang, code, Duration::from_secs(30))).await.unwrap().into_inner();
            let mut out = Vec::new();
            while let Some(ev) = stream.message().await.unwrap() {
                use warren_proto::agent::execute_event::Event;
                match ev.event {
                    Some(Event::Stdout(c)) => out.extend(c.data),
                    Some(Event::Started(s)) => setup.push(Duration::from_micros(s.setup_micros)),
                    Some(Event::Exited(e)) => assert_eq!(e.exit_code, 0),
                    _ => {}
                }
            }
            w.push(t.elapsed());
            assert_eq!(out, b"1\n");
            // Let the pool refill between calls, as between an agent's tool
            // calls: the bare process runs on an idle machine too.
            pool_refilled(&agent, pooled).await;
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        b.sort();
        w.sort();
        setup.sort();
        let (bp50, bp99, wp50, wp99) = (percentile(&b, 0.5), percentile(&b, 0.99), percentile(&w, 0.5), percentile(&w, 0.99));
        println!(
            "{:<8} {:>8.2}ms {:>8.2}ms {:>8.2}ms {:>8.2}ms {:>+8.2}ms {:>+8.2}ms {:>8.3}ms p50",
            lang.as_str_name().trim_start_matches("LANGUAGE_").to_lowercase(),
            ms(bp50),
            ms(bp99),
            ms(wp50),
            ms(wp99),
            ms(wp50) - ms(bp50),
            ms(wp99) - ms(bp99),
            ms(percentile(&setup, 0.5)),
        );
    }
}
