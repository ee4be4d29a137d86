//! A process in a live sandbox against a bare process, in one run: N round
//! trips of `LiveStart` of `bash -c 'echo 1'` (request sent → `ended`
//! received, gRPC on the agent's Unix socket, the sandbox made once) are
//! interleaved with N bare spawns of the same command, stdout piped and
//! waited for. Prints p50/p99 of both and the difference: what running a
//! command in a sandbox that stays up costs over running it on the node.
//! Then the same with a login shell (`bash -l -c`, what E2B's
//! `commands.run` sends). Needs root.
//!
//! `cargo bench -p warren-e2e --bench live_overhead` (N from WARREN_BENCH_RUNS, default 200).

use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use warren_e2e::bench::{ms, percentile};
use warren_e2e::{is_root, request, Agent};
use warren_proto::agent::{self as pb, live_event::Event as Ev, Language};

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() {
    if !is_root() {
        eprintln!("SKIPPED live_overhead: needs root");
        return;
    }
    let runs: usize = std::env::var("WARREN_BENCH_RUNS").ok().and_then(|v| v.parse().ok()).unwrap_or(200);
    let agent = Agent::start(&[]).await.expect("agent starts");
    let mut client = agent.client().await.expect("client");
    let live = pb::LiveRef { r#ref: Some(pb::ThreadRef { namespace: "default".into(), key_name: "bench".into(), thread_id: "live-bench".into() }) };
    let mut sandbox = request(Language::Bash, ":", Duration::from_secs(30));
    sandbox.thread = Some(pb::ThreadOptions { r#ref: live.r#ref.clone(), retention_seconds: 0, max_bytes: 64 << 20, max_threads: 0, history_versions: 0 });
    client.live_create(pb::LiveCreateRequest { live: Some(live.clone()), sandbox: Some(sandbox), lifetime_ms: 3_600_000 }).await.expect("live sandbox");
    println!("live sandbox overhead: {runs} runs, interleaved with bare spawns");
    println!("{:<16} {:>10} {:>10} {:>10} {:>10} {:>10} {:>10}", "command", "bare p50", "bare p99", "live p50", "live p99", "Δ p50", "Δ p99");
    for (name, args) in [("bash -c", vec!["-c", "echo 1"]), ("bash -l -c", vec!["-l", "-c", "echo 1"])] {
        let (mut b, mut w) = (Vec::new(), Vec::new());
        for i in 0..runs + 5 {
            let t = Instant::now();
            let out = Command::new("/bin/bash").args(&args).stdin(Stdio::null()).stderr(Stdio::null()).output().unwrap();
            let bare = t.elapsed();
            assert_eq!(out.stdout, b"1\n");
            let argv = std::iter::once("/bin/bash").chain(args.iter().copied()).map(str::to_string).collect();
            let t = Instant::now();
            let mut s = client.live_start(pb::LiveStartRequest { live: Some(live.clone()), argv, ..Default::default() }).await.unwrap().into_inner();
            let mut got = Vec::new();
            while let Some(ev) = s.message().await.unwrap() {
                match ev.event {
                    Some(Ev::Stdout(d)) => got.extend(d),
                    Some(Ev::Ended(e)) => assert_eq!(e.exit_code, 0),
                    _ => {}
                }
            }
            let lived = t.elapsed();
            assert_eq!(got, b"1\n");
            if i >= 5 {
                b.push(bare);
                w.push(lived);
            }
        }
        b.sort();
        w.sort();
        let (bp50, bp99, wp50, wp99) = (percentile(&b, 0.5), percentile(&b, 0.99), percentile(&w, 0.5), percentile(&w, 0.99));
        println!("{name:<16} {:>8.2}ms {:>8.2}ms {:>8.2}ms {:>8.2}ms {:>+8.2}ms {:>+8.2}ms", ms(bp50), ms(bp99), ms(wp50), ms(wp99), ms(wp50) - ms(bp50), ms(wp99) - ms(bp99));
    }
    client.live_end(live).await.expect("ended");
}
