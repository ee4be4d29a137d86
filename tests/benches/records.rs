//! What execution records cost and how fast async results arrive.
//!
//! 1. Synchronous execute latency with records (this build) against a
//!    gateway built without them (`WARREN_BENCH_BASELINE_GATEWAY`: a
//!    `warren-gateway` from before execution records, e.g. commit 190319a),
//!    both in front of the same node-agent, calls interleaved on one
//!    keep-alive connection each; p50/p99 and the difference. Without the
//!    baseline only this build is measured.
//! 2. Async submit → webhook delivered, on loopback: `Prefer: respond-async`
//!    with a `webhook_url` to a receiver in this process (an allowed host,
//!    plain http), from sending the request to the delivery arriving.
//!
//! Needs root and release binaries: `cargo bench -p warren-e2e --bench records`
//! (WARREN_BENCH_RUNS default 200).

use std::time::{Duration, Instant};

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use warren_e2e::bench::{ms, percentile, Conn};
use warren_e2e::gateway::{key, Gateway};
use warren_e2e::{is_root, Agent};

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() {
    if !is_root() {
        eprintln!("SKIPPED records: needs root");
        return;
    }
    let runs = std::env::var("WARREN_BENCH_RUNS").ok().and_then(|v| v.parse().ok()).unwrap_or(200usize);
    let agent = Agent::start(&[]).await.expect("agent starts");
    let gw = Gateway::start(&[agent.address()], &["--webhook-allow-host", "127.0.0.1"], true).await.expect("gateway starts");
    let baseline = match std::env::var("WARREN_BENCH_BASELINE_GATEWAY") {
        Ok(bin) => Some(Gateway::start_binary(std::path::Path::new(&bin), false, &[agent.address()], &[], &[], true).await.expect("baseline gateway starts")),
        Err(_) => {
            println!("(no WARREN_BENCH_BASELINE_GATEWAY: measuring this build only)");
            None
        }
    };
    sync_latency(&gw, baseline.as_ref(), runs).await;
    webhook_latency(&gw, runs.min(100)).await;
}

async fn sync_latency(gw: &Gateway, baseline: Option<&Gateway>, runs: usize) {
    let k = key("main");
    let body = serde_json::json!({"code": "echo 1", "language": "bash"}).to_string();
    let mut with = Conn::open(gw.addr).await.unwrap();
    let mut without = match baseline {
        Some(b) => Some(Conn::open(b.addr).await.unwrap()),
        None => None,
    };
    let (mut a, mut b) = (Vec::new(), Vec::new());
    for i in 0..runs + 5 {
        let t = Instant::now();
        let (status, _) = with.execute(&k, body.as_bytes()).await.unwrap();
        let d = t.elapsed();
        assert_eq!(status, 200);
        let base = match without.as_mut() {
            Some(c) => {
                let t = Instant::now();
                let (status, _) = c.execute(&k, body.as_bytes()).await.unwrap();
                assert_eq!(status, 200);
                Some(t.elapsed())
            }
            None => None,
        };
        if i >= 5 {
            a.push(d);
            b.extend(base);
        }
    }
    a.sort();
    b.sort();
    println!("Synchronous execute (bash `echo 1`), {runs} calls each, interleaved:");
    println!("{:<22} {:>10} {:>10}", "", "p50 ms", "p99 ms");
    if !b.is_empty() {
        println!("{:<22} {:>10.2} {:>10.2}", "without records", ms(percentile(&b, 0.5)), ms(percentile(&b, 0.99)));
    }
    println!("{:<22} {:>10.2} {:>10.2}", "with records", ms(percentile(&a, 0.5)), ms(percentile(&a, 0.99)));
    if !b.is_empty() {
        let d50 = ms(percentile(&a, 0.5)) - ms(percentile(&b, 0.5));
        let d99 = ms(percentile(&a, 0.99)) - ms(percentile(&b, 0.99));
        println!("{:<22} {:>+10.2} {:>+10.2}", "Δ (records)", d50, d99);
    }
}

/// Accepts webhook deliveries on loopback and reports when each arrives.
async fn receiver() -> (u16, tokio::sync::mpsc::UnboundedReceiver<Instant>) {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = listener.local_addr().unwrap().port();
    let (tx, rx) = tokio::sync::mpsc::unbounded_channel();
    tokio::spawn(async move {
        loop {
            let Ok((mut s, _)) = listener.accept().await else { return };
            let tx = tx.clone();
            tokio::spawn(async move {
                let mut buf = vec![0u8; 64 << 10];
                let mut seen = Vec::new();
                // Headers, then Content-Length bytes of body.
                loop {
                    let Ok(n) = s.read(&mut buf).await else { return };
                    if n == 0 {
                        return;
                    }
                    seen.extend_from_slice(&buf[..n]);
                    let text = String::from_utf8_lossy(&seen);
                    if let Some(end) = text.find("\r\n\r\n") {
                        let len = text[..end].lines().find_map(|l| l.to_ascii_lowercase().strip_prefix("content-length:").map(|v| v.trim().parse::<usize>().unwrap_or(0))).unwrap_or(0);
                        if seen.len() >= end + 4 + len {
                            break;
                        }
                    }
                }
                let _ = tx.send(Instant::now());
                let _ = s.write_all(b"HTTP/1.1 200 OK\r\ncontent-length: 0\r\nconnection: close\r\n\r\n").await;
            });
        }
    });
    (port, rx)
}

async fn webhook_latency(gw: &Gateway, runs: usize) {
    let (port, mut arrived) = receiver().await;
    let k = key("main");
    let body = serde_json::json!({"code": "echo 1", "language": "bash", "webhook_url": format!("http://127.0.0.1:{port}/hook")}).to_string();
    let mut conn = Conn::open(gw.addr).await.unwrap();
    let (mut accepted, mut delivered) = (Vec::new(), Vec::new());
    for _ in 0..runs {
        let t = Instant::now();
        let (status, _) = conn.execute_with(&k, body.as_bytes(), &[("prefer", "respond-async")]).await.unwrap();
        assert_eq!(status, 202);
        accepted.push(t.elapsed());
        let at = tokio::time::timeout(Duration::from_secs(30), arrived.recv()).await.expect("delivered within 30 s").unwrap();
        delivered.push(at - t);
    }
    accepted.sort();
    delivered.sort();
    println!("Async execute with a webhook on loopback, {runs} calls one after another:");
    println!("{:<22} {:>10} {:>10}", "", "p50 ms", "p99 ms");
    println!("{:<22} {:>10.2} {:>10.2}", "submit → 202", ms(percentile(&accepted, 0.5)), ms(percentile(&accepted, 0.99)));
    println!("{:<22} {:>10.2} {:>10.2}", "submit → delivered", ms(percentile(&delivered, 0.5)), ms(percentile(&delivered, 0.99)));
}
