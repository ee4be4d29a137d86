//! The execute path with tracing off and on (#47), against a bare process
//! in the same run: bash `echo 1` through the HTTP API on one keep-alive
//! connection, interleaved —
//!
//! - bare `bash -c 'echo 1'`;
//! - a gateway and agent without `--otlp-endpoint`, no header (what every
//!   call costs when tracing is off);
//! - the same with a `traceparent` header (passed through to the program);
//! - a gateway and agent exporting to a real OTLP receiver on loopback
//!   (`warren_e2e::otlp`), with a `traceparent` (six spans per call).
//!
//! Needs root and release binaries (`cargo build --release --workspace --bins`):
//! `cargo bench -p warren-e2e --bench tracing` (WARREN_BENCH_RUNS default 300).

use std::time::Duration;

use warren_e2e::bench::{bare, pool_refilled, pool_settled, print_rows, Conn};
use warren_e2e::gateway::{key, Gateway};
use warren_e2e::otlp::Receiver;
use warren_e2e::{is_root, Agent};

const TRACEPARENT: &str = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() {
    if !is_root() {
        eprintln!("SKIPPED tracing: needs root");
        return;
    }
    let runs: usize = std::env::var("WARREN_BENCH_RUNS").ok().and_then(|v| v.parse().ok()).unwrap_or(300);
    let receiver = Receiver::start().await.unwrap();
    let endpoint = receiver.endpoint();
    let plain = Agent::start(&[]).await.unwrap();
    let plain_gw = Gateway::start(&[plain.address()], &[], true).await.unwrap();
    let traced = Agent::start(&["--otlp-endpoint", &endpoint]).await.unwrap();
    let traced_gw = Gateway::start(&[traced.address()], &["--otlp-endpoint", &endpoint], true).await.unwrap();
    let dir = tempfile::tempdir().unwrap();
    let script = dir.path().join("bench-bare");
    std::fs::write(&script, "echo 1").unwrap();
    let (mut off, mut on) = (Conn::open(plain_gw.addr).await.unwrap(), Conn::open(traced_gw.addr).await.unwrap());
    let (k, body) = (key("main"), serde_json::json!({"code": "echo 1", "language": "bash"}).to_string());
    let (full_off, full_on) = (pool_settled(&plain).await.0, pool_settled(&traced).await.0);
    let mut rows: [(&str, Vec<Duration>); 4] = [("bare", vec![]), ("tracing off", vec![]), ("off, with traceparent", vec![]), ("on (OTLP), with traceparent", vec![])];
    for i in 0..runs + 5 {
        pool_refilled(&plain, full_off).await;
        pool_refilled(&traced, full_on).await;
        let times = [
            bare("/bin/bash", &script),
            off.timed(&k, &body, &[]).await,
            off.timed(&k, &body, &[("traceparent", TRACEPARENT)]).await,
            on.timed(&k, &body, &[("traceparent", TRACEPARENT)]).await,
        ];
        if i >= 5 {
            rows.iter_mut().zip(times).for_each(|((_, v), t)| v.push(t));
        }
    }
    println!("tracing: bash `echo 1`, {runs} calls each, interleaved");
    print_rows(&rows, 28);
    let spans = receiver.spans_when("4bf92f3577b34da6a3ce929d0e0e4736", Duration::from_secs(30), |s| s.len() >= 6 * (runs + 5)).await;
    println!("spans received for the traced calls: {} (6 per call without a thread: {})", spans.len(), 6 * (runs + 5));
}
