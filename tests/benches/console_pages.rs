//! The console's pages over 10,000 execution records (SQLite, as on one
//! machine): the audit log's first page, a filtered page (status and a
//! metadata pair), a deep page, and the overview's aggregates (last hour
//! and day: per minute, outcomes, p50/p99), each timed as the console
//! serves it over loopback (a session cookie, keep-alive off). The same
//! filter through the JSON audit API, in the same run, is the baseline.
//! Budgets (issue #29): list and filter p50 ≤ 50 ms, overview ≤ 100 ms.
//!
//! `cargo bench -p warren-e2e --bench console_pages` (no root needed;
//! WARREN_BENCH_RUNS default 100, WARREN_BENCH_RECORDS default 10000).

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::time::{Duration, Instant};

use warren_api_gateway::records::{now_ms, Finished, Mode, NewRecord, Recorder, Store};
use warren_e2e::bench::{ms, percentile};
use warren_e2e::gateway::{key, Gateway};
use warren_e2e::http;

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() {
    let runs: usize = std::env::var("WARREN_BENCH_RUNS").ok().and_then(|v| v.parse().ok()).unwrap_or(100);
    let count: usize = std::env::var("WARREN_BENCH_RECORDS").ok().and_then(|v| v.parse().ok()).unwrap_or(10_000);
    let dir = tempfile::tempdir().unwrap();
    let url = format!("sqlite://{}/records.db", dir.path().display());
    fill(&url, count).await;
    let port = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
    let console: SocketAddr = format!("127.0.0.1:{port}").parse().unwrap();
    let link_file = dir.path().join("link");
    let gw = Gateway::start(&[], &["--records", &url, "--console-listen", &console.to_string(), "--console-link-file", link_file.to_str().unwrap()], false).await.unwrap();
    let cookie = sign_in(console, &link_file);
    let first = get(console, "/executions", &cookie);
    let deep = first.split("href=\"/executions?cursor=").nth(1).and_then(|s| s.split('"').next()).expect("a next page").to_string();
    println!("Console pages over {count} records, {runs} requests each (ms):");
    println!("{:<34} {:>8} {:>8}", "", "p50", "p99");
    let api = time(runs, || {
        let r = http::raw(gw.addr, format!("GET /v1/executions?status=failed&metadata.run=8&limit=50 HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {}\r\nConnection: close\r\n\r\n", key("main")).as_bytes()).unwrap();
        assert_eq!(r.status, 200, "{}", r.text());
    });
    report("baseline: JSON audit API, filtered", &api, None);
    for (name, path) in [
        ("audit log, first page", "/executions".to_string()),
        ("audit log, filtered", "/executions?status=failed&metadata=run%3D8".to_string()),
        ("audit log, second page", format!("/executions?cursor={deep}")),
        ("overview (hour + day aggregates)", "/".to_string()),
    ] {
        let d = time(runs, || {
            get(console, &path, &cookie);
        });
        report(name, &d, Some(&api));
    }
}

/// `count` ended records over the last day, in the manifests' namespace.
async fn fill(url: &str, count: usize) {
    let store = Store::open(url).await.unwrap();
    let recorder = Recorder::start(store, "gw_bench", 4096);
    let now = now_ms();
    let statuses = ["success", "success", "success", "failed", "timeout"];
    for i in 0..count {
        let trace_id = format!("trc_bench{i:08}");
        let metadata: BTreeMap<String, String> = [("run".to_string(), (i % 100).to_string())].into();
        let created_ms = now - (i as i64 * 86_400_000 / count as i64);
        let language = ["python", "node", "bash"][i % 3];
        let key_name = if i % 2 == 0 { "main" } else { "short" };
        let r = NewRecord { trace_id: trace_id.clone(), namespace: "default".into(), key_name: key_name.into(), sandbox: "sb".into(), language, thread_id: None, otel_trace_id: None, metadata, mode: Mode::Inline, node: "node-a".into(), owner: "gw_bench".into(), timeout_secs: 30, webhook_url: None, created_ms };
        let _ = recorder.insert(r);
        let status = statuses[i % statuses.len()];
        recorder.finish(&trace_id, Finished { status, exit_code: Some(i32::from(status != "success")), duration_ms: 20 + (i % 200) as u64, stdout: Some(format!("line {i}\n")), completed_ms: created_ms + 50, ..Finished::default() });
    }
    recorder.flush().await;
}

fn sign_in(console: SocketAddr, link_file: &std::path::Path) -> String {
    let start = Instant::now();
    while !link_file.exists() && start.elapsed() < Duration::from_secs(20) {
        std::thread::sleep(Duration::from_millis(20));
    }
    let link = std::fs::read_to_string(link_file).unwrap();
    let path = link.trim().split_once(&console.to_string()).unwrap().1.to_string();
    let mut r = http::get(console, &path);
    while r.status == 0 {
        r = http::get(console, &path);
    }
    assert_eq!(r.status, 303, "{}", r.text());
    r.header("set-cookie").unwrap().split(';').next().unwrap().to_string()
}

fn get(console: SocketAddr, path: &str, cookie: &str) -> String {
    let r = http::raw(console, format!("GET {path} HTTP/1.1\r\nHost: x\r\nCookie: {cookie}\r\nConnection: close\r\n\r\n").as_bytes()).unwrap();
    assert_eq!(r.status, 200, "{path}: {}", r.text());
    r.text()
}

fn time(runs: usize, mut f: impl FnMut()) -> Vec<Duration> {
    for _ in 0..5 {
        f();
    }
    let mut d: Vec<Duration> = (0..runs)
        .map(|_| {
            let t = Instant::now();
            f();
            t.elapsed()
        })
        .collect();
    d.sort();
    d
}

fn report(name: &str, d: &[Duration], baseline: Option<&[Duration]>) {
    let (p50, p99) = (ms(percentile(d, 0.5)), ms(percentile(d, 0.99)));
    match baseline {
        Some(b) => println!("{name:<34} {p50:>8.2} {p99:>8.2}   ×{:.2} of the baseline's p50", p50 / ms(percentile(b, 0.5))),
        None => println!("{name:<34} {p50:>8.2} {p99:>8.2}"),
    }
}
