//! Thread forks and restores through the gateway (#47), against a bare
//! process in the same run:
//!
//! 1. fork p50/p99 of a thread of 1 layer and of one of 32 layers (the
//!    most before a compaction), `POST /v1/threads/{id}/fork` round trip;
//! 2. fork + first execution on the fork (a cold rebuild of its home on
//!    the node: the fork has no warm copy yet), round trip of both;
//! 3. restore p50/p99 (`POST /v1/threads/{id}/restore` of the version
//!    before the current one: two states alternate);
//!
//! each interleaved with a bare `bash -c 'echo 1'` spawn. Every fork made
//! is deleted as it goes (the key's `maxThreads` is not in the way).
//!
//! Needs root and release binaries (`cargo build --release --workspace --bins`):
//! `cargo bench -p warren-e2e --bench thread_versions` (WARREN_BENCH_RUNS default 200).

use std::time::{Duration, Instant};

use warren_e2e::bench::{bare, print_rows, Conn};
use warren_e2e::gateway::{key, Gateway};
use warren_e2e::{is_root, Agent};

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() {
    if !is_root() {
        eprintln!("SKIPPED thread_versions: needs root");
        return;
    }
    let runs: usize = std::env::var("WARREN_BENCH_RUNS").ok().and_then(|v| v.parse().ok()).unwrap_or(200);
    let agent = Agent::start(&[]).await.expect("agent starts");
    let gw = Gateway::start(&[agent.address()], &[], true).await.expect("gateway starts");
    let dir = tempfile::tempdir().unwrap();
    let script = dir.path().join("bench-bare");
    std::fs::write(&script, "echo 1").unwrap();
    let mut conn = Conn::open(gw.addr).await.unwrap();
    let k = key("thr");
    prepare(&mut conn, &k, "one-layer", 1).await;
    prepare(&mut conn, &k, "many-layers", 32).await;
    let mut two = prepare(&mut conn, &k, "restored", 2).await;
    println!("thread versions: {runs} calls each, interleaved with bare `bash -c 'echo 1'`");
    let mut rows: Vec<(String, Vec<Duration>)> = vec![("bare".into(), vec![])];
    let add = |name: &str, d: Duration, rows: &mut Vec<(String, Vec<Duration>)>| match rows.iter_mut().find(|(n, _)| n == name) {
        Some((_, v)) => v.push(d),
        None => rows.push((name.to_string(), vec![d])),
    };
    for i in 0..runs {
        add("bare", bare("/bin/bash", &script), &mut rows);
        for (label, thread) in [("fork, 1 layer", "one-layer"), ("fork, 32 layers", "many-layers")] {
            let id = format!("f-{i}");
            let t = Instant::now();
            fork(&mut conn, &k, thread, &id).await;
            add(label, t.elapsed(), &mut rows);
            delete(&gw, &k, &id);
        }
        let id = format!("g-{i}");
        let t = Instant::now();
        fork(&mut conn, &k, "many-layers", &id).await;
        let out = exec(&mut conn, &k, &id, "cat ~/f31").await;
        add("fork + first execution, 32 layers", t.elapsed(), &mut rows);
        assert_eq!(out, "31\n");
        delete(&gw, &k, &id);
        // The version before the current one: the two states alternate.
        let at = two[0].clone();
        let t = Instant::now();
        let (status, body) = conn.post(&k, "/v1/threads/restored/restore", serde_json::json!({"at": at}).to_string().as_bytes(), &[]).await.unwrap();
        add("restore", t.elapsed(), &mut rows);
        assert_eq!(status, 200, "{}", String::from_utf8_lossy(&body));
        let made: serde_json::Value = serde_json::from_slice(&body).unwrap();
        two = vec![two[1].clone(), made["trace_id"].as_str().unwrap().to_string()];
    }
    print_rows(&rows, 36);
}

/// Runs bash `code` on `thread`; its stdout and trace id.
async fn exec_traced(conn: &mut Conn, k: &str, thread: &str, code: &str) -> (String, String) {
    let body = serde_json::json!({"code": code, "language": "bash", "thread_id": thread}).to_string();
    let (status, resp) = conn.execute(k, body.as_bytes()).await.unwrap();
    let v: serde_json::Value = serde_json::from_slice(&resp).unwrap();
    assert_eq!((status, v["exit_code"].as_i64()), (200, Some(0)), "{v}");
    (v["stdout"].as_str().unwrap().to_string(), v["trace_id"].as_str().unwrap().to_string())
}

async fn exec(conn: &mut Conn, k: &str, thread: &str, code: &str) -> String {
    exec_traced(conn, k, thread, code).await.0
}

/// A thread of `layers` layers (one file each, each a version); their trace ids.
async fn prepare(conn: &mut Conn, k: &str, thread: &str, layers: usize) -> Vec<String> {
    let mut traces = Vec::new();
    for n in 0..layers {
        traces.push(exec_traced(conn, k, thread, &format!("echo {n} > ~/f{n}")).await.1);
    }
    traces
}

async fn fork(conn: &mut Conn, k: &str, thread: &str, id: &str) {
    let body = serde_json::json!({"thread_id": id}).to_string();
    let (status, resp) = conn.post(k, &format!("/v1/threads/{thread}/fork"), body.as_bytes(), &[]).await.unwrap();
    assert_eq!(status, 201, "{}", String::from_utf8_lossy(&resp));
}

fn delete(gw: &Gateway, k: &str, id: &str) {
    let r = gw.delete(k, &format!("/v1/threads/{id}"));
    assert_eq!(r.status, 204, "{}", r.text());
}
