//! The E2B API in process: creates racing the key's limit, environments
//! sealed in the records, uploads held within the gateway's budget.

use axum::body::{Body, Bytes};
use axum::http::Request;
use serde_json::{json, Value};

use super::*;

fn alias(key: &str) -> String {
    warren_config::key::e2b_alias(key)
}

fn create_request(key: &str, body: &Value) -> Request<Body> {
    Request::post("/v2/sandboxes").header("x-api-key", alias(key)).header("content-type", "application/json").body(Body::from(body.to_string())).unwrap()
}

/// A sandbox of `key`: (id, access token).
async fn create(g: &Gateway, key: &str, body: Value) -> (String, String) {
    let a = g.send(create_request(key, &body)).await;
    assert_eq!(a.status.as_u16(), 201, "{}", String::from_utf8_lossy(&a.body));
    let v = a.json();
    (v["sandboxID"].as_str().unwrap().to_string(), v["envdAccessToken"].as_str().unwrap().to_string())
}

/// A held upload (no Content-Length) of sandbox `id`, its body fed by the returned sender.
fn held_upload(id: &str, token: &str) -> (Request<Body>, tokio::sync::mpsc::Sender<Result<Bytes, std::io::Error>>) {
    let (tx, rx) = tokio::sync::mpsc::channel(4);
    let body = Body::from_stream(tokio_stream::wrappers::ReceiverStream::new(rx));
    let req = Request::post("/files?path=up.bin")
        .header("e2b-sandbox-id", id)
        .header("x-access-token", token)
        .header("content-type", "application/octet-stream")
        .body(body)
        .unwrap();
    (req, tx)
}

const MIB: usize = 1 << 20;

/// The attack: creates fired at once against a key allowed 2 sandboxes of
/// which 1 running, each counting before any is stored. Exactly 1 is made
/// (the running limit); the rest are told the limit. Paused, it lets a
/// second run; a third is past maxThreads; resuming the first is past
/// maxLiveSandboxes. A lifetime past the key's maxLiveSeconds is refused.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn racing_creates_never_pass_the_keys_sandbox_limits() {
    let g = gateway().await;
    // Every connection of the pool open first, so the creates really run at once.
    let list = || Request::get("/v2/sandboxes").header("x-api-key", alias(FEW)).body(Body::empty()).unwrap();
    futures_util::future::join_all((0..8).map(|_| g.send(list()))).await;
    let sends = (0..16).map(|_| g.send(create_request(FEW, &json!({"templateID": "base"}))));
    let answers = futures_util::future::join_all(sends).await;
    let created: Vec<_> = answers.iter().filter(|a| a.status.as_u16() == 201).collect();
    assert_eq!(created.len(), 1, "{:?}", answers.iter().map(|a| a.status).collect::<Vec<_>>());
    for a in answers.iter().filter(|a| a.status.as_u16() != 201) {
        assert_eq!(a.status.as_u16(), 429);
        assert!(a.json()["message"].as_str().unwrap().contains("maxLiveSandboxes"), "{}", a.json());
    }
    let first = created[0].json()["sandboxID"].as_str().unwrap().to_string();
    let control = |method: &str, path: String, body: Value| Request::builder().method(method).uri(path).header("x-api-key", alias(FEW)).header("content-type", "application/json").body(Body::from(body.to_string())).unwrap();
    assert_eq!(g.send(control("POST", format!("/sandboxes/{first}/pause"), json!({}))).await.status.as_u16(), 204);
    let (second, _) = create(&g, FEW, json!({"templateID": "base"})).await;
    let third = g.send(create_request(FEW, &json!({"templateID": "base"}))).await;
    assert_eq!(third.status.as_u16(), 429);
    assert!(third.json()["message"].as_str().unwrap().contains("maxThreads"), "{}", third.json());
    let resumed = g.send(control("POST", format!("/sandboxes/{first}/resume"), json!({}))).await;
    assert_eq!(resumed.status.as_u16(), 429, "{}", String::from_utf8_lossy(&resumed.body));
    assert!(resumed.json()["message"].as_str().unwrap().contains("maxLiveSandboxes"), "{}", resumed.json());
    let long = g.send(control("POST", format!("/sandboxes/{second}/timeout"), json!({"timeout": 601}))).await;
    assert_eq!(long.status.as_u16(), 400);
    assert!(long.json()["message"].as_str().unwrap().contains("maxLiveSeconds"), "{}", long.json());
    assert_eq!(g.send(control("POST", format!("/sandboxes/{second}/timeout"), json!({"timeout": 600}))).await.status.as_u16(), 204);
}

/// The attack: the records file read for a sandbox's variables (often
/// credentials). The database holds them sealed; the sandbox's commands
/// still get them.
#[tokio::test]
async fn environment_variables_are_sealed_in_the_records_and_still_reach_commands() {
    const CANARY: &str = "canary-secret-0d5e1f";
    let g = gateway().await;
    let (id, token) = create(&g, GOOD, json!({"templateID": "base", "envVars": {"API_TOKEN": CANARY}})).await;
    let start = serde_json::to_vec(&json!({"process": {"cmd": "/bin/bash", "args": ["-l", "-c", "echo $API_TOKEN"]}})).unwrap();
    let mut framed = vec![0u8];
    framed.extend_from_slice(&(start.len() as u32).to_be_bytes());
    framed.extend_from_slice(&start);
    let run = Request::post("/process.Process/Start")
        .header("content-type", "application/connect+json")
        .header("e2b-sandbox-id", &id)
        .header("x-access-token", &token)
        .body(Body::from(framed))
        .unwrap();
    assert_eq!(g.send(run).await.status.as_u16(), 200);
    let sandbox = g.last_live_create().sandbox.expect("the live sandbox's contract");
    assert_eq!(sandbox.env.get("API_TOKEN").map(String::as_str), Some(CANARY), "the sandbox's processes get the variable");
    // Every file of the database (the WAL too) is free of it.
    for entry in std::fs::read_dir(g._records.path()).unwrap() {
        let bytes = std::fs::read(entry.unwrap().path()).unwrap();
        assert!(!bytes.windows(CANARY.len()).any(|w| w == CANARY.as_bytes()), "the records hold the variable in plaintext");
    }
}

/// The attack: uploads held whole (no Content-Length) that send a little
/// and stall, to pile up in the gateway's memory. Past the budget (here one
/// key's half of 4 MiB, each byte counted twice) the next is refused with a
/// 429 and Retry-After — a "retry", which the SDKs do not read as a dead
/// sandbox — and finished or cut uploads give their share back.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn held_uploads_past_the_gateway_budget_are_refused_with_a_retry() {
    let g = gateway().await.with_upload_budget(4 * MIB as u64);
    let (id, token) = create(&g, GOOD, json!({"templateID": "base"})).await;
    let (first, tx1) = held_upload(&id, &token);
    tx1.send(Ok(Bytes::from(vec![b'a'; MIB]))).await.unwrap();
    let app = g.app.clone();
    let pending = tokio::spawn(tower::ServiceExt::oneshot(app, first));
    let uploads = g.state.uploads.clone();
    eventually("the first upload's reservation", || uploads.held_bytes() == 2 * MIB as u64).await;
    let (second, tx2) = held_upload(&id, &token);
    tx2.send(Ok(Bytes::from(vec![b'b'; MIB]))).await.unwrap();
    let refused = g.send(second).await;
    assert_eq!(refused.status.as_u16(), 429, "{}", String::from_utf8_lossy(&refused.body));
    assert_eq!(refused.headers.get("retry-after").map(|v| v.to_str().unwrap()), Some("1"));
    assert!(refused.json()["message"].as_str().unwrap().contains("upload memory"), "{}", refused.json());
    assert_eq!(uploads.held_bytes(), 2 * MIB as u64, "the refused upload holds nothing");
    drop(tx1);
    let _ = pending.await.unwrap();
    assert_eq!(uploads.held_bytes(), 0, "a finished upload gives its share back");
}

/// The attack: an upload held whole that sends its first bytes and then
/// nothing. It is cut when it stops arriving (408), not after a long fixed
/// window, and its memory is returned.
#[tokio::test]
async fn a_stalled_held_upload_is_cut_and_its_memory_returned() {
    let g = gateway().await.with_settings(|s| s.body_timeout = std::time::Duration::from_millis(300));
    let (id, token) = create(&g, GOOD, json!({"templateID": "base"})).await;
    let (req, tx) = held_upload(&id, &token);
    tx.send(Ok(Bytes::from(vec![b'a'; MIB]))).await.unwrap();
    let cut = g.send(req).await;
    assert_eq!(cut.status.as_u16(), 408, "{}", String::from_utf8_lossy(&cut.body));
    assert!(cut.json()["message"].as_str().unwrap().contains("stopped arriving"), "{}", cut.json());
    assert_eq!(g.state.uploads.held_bytes(), 0);
    drop(tx);
}
