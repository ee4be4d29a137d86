//! The error table of `POST /v1/sandbox/execute`: every refusal, its
//! status and code, and that nothing reached the node when nothing may run.

use axum::body::Body;
use axum::http::{Request, StatusCode};
use serde_json::json;

use super::*;

fn code(body: &str) -> serde_json::Value {
    json!({"code": body})
}

async fn refused(g: &Gateway, req: Request<Body>, status: u16, error: &str) -> Answer {
    let a = g.send(req).await;
    assert_eq!((a.status.as_u16(), a.error().as_str()), (status, error), "{:?}", String::from_utf8_lossy(&a.body));
    assert_eq!(g.agent_calls(), 0, "nothing may reach the node");
    a
}

#[tokio::test]
async fn missing_key_is_401() {
    let g = gateway().await;
    let req = Request::post("/v1/sandbox/execute").header("content-type", "application/json").body(Body::from("{}")).unwrap();
    refused(&g, req, 401, "missing_api_key").await;
}

#[tokio::test]
async fn unknown_key_is_401() {
    let g = gateway().await;
    refused(&g, execute_request("sk-wrn-ZZZZZZZZZZZZZZZZZZZZZZZZZZZZZZZZZZZZ", r#"{"code":"x"}"#), 401, "invalid_api_key").await;
}

#[tokio::test]
async fn malformed_authorization_is_401() {
    let g = gateway().await;
    let req = Request::post("/v1/sandbox/execute").header("authorization", GOOD).header("content-type", "application/json").body(Body::from("{}")).unwrap();
    refused(&g, req, 401, "invalid_api_key").await;
}

#[tokio::test]
async fn disabled_key_is_403() {
    let g = gateway().await;
    refused(&g, execute_request(OFF, r#"{"code":"x"}"#), 403, "api_key_disabled").await;
}

#[tokio::test]
async fn wrong_content_type_is_415() {
    let g = gateway().await;
    let req = Request::post("/v1/sandbox/execute").header("authorization", format!("Bearer {GOOD}")).header("content-type", "text/plain").body(Body::from("{}")).unwrap();
    refused(&g, req, 415, "unsupported_media_type").await;
}

#[tokio::test]
async fn oversize_body_is_413() {
    let g = gateway().await;
    let big = format!(r#"{{"code":"{}"}}"#, "x".repeat(5 << 20));
    refused(&g, execute_request(GOOD, &big), 413, "payload_too_large").await;
}

#[tokio::test]
async fn broken_json_is_400_invalid_json() {
    let g = gateway().await;
    refused(&g, execute_request(GOOD, r#"{"code": "#), 400, "invalid_json").await;
}

#[tokio::test]
async fn unknown_field_is_named() {
    let g = gateway().await;
    let a = refused(&g, execute_request(GOOD, r#"{"code":"x","timout":3}"#), 400, "invalid_request").await;
    assert_eq!(a.json()["field"], "timout");
}

#[tokio::test]
async fn language_the_sandbox_lacks_is_400() {
    let g = gateway().await;
    let a = refused(&g, execute_request(GOOD, r#"{"code":"x","language":"node"}"#), 400, "invalid_request").await;
    assert_eq!(a.json()["field"], "language");
}

#[tokio::test]
async fn timeout_beyond_the_key_is_400() {
    let g = gateway().await;
    let a = refused(&g, execute_request(GOOD, r#"{"code":"x","timeout":31}"#), 400, "invalid_request").await;
    assert_eq!(a.json()["field"], "timeout");
}

#[tokio::test]
async fn sub_path_without_a_mount_is_400() {
    let g = gateway().await;
    let a = refused(&g, execute_request(GOOD, r#"{"code":"x","sub_paths":["/data/m/x"]}"#), 400, "invalid_request").await;
    assert_eq!(a.json()["field"], "sub_paths[0]");
}

#[tokio::test]
async fn webhook_without_async_is_400() {
    let g = gateway().await;
    let a = refused(&g, execute_request(GOOD, r#"{"code":"x","webhook_url":"https://example.invalid/h"}"#), 400, "invalid_request").await;
    assert_eq!(a.json()["field"], "webhook_url");
}

#[tokio::test]
async fn key_concurrency_is_429_with_retry_after_and_frees_when_the_run_ends() {
    let g = gateway().await;
    let app = g.app.clone();
    let hold = tokio::spawn(async move { app.oneshot(execute_request(SOLO, r#"{"code":"hang"}"#)).await });
    eventually("the first execution reaches the node", || g.agent_calls() == 1).await;
    let a = g.execute(SOLO, code("x")).await;
    assert_eq!((a.status, a.error().as_str()), (StatusCode::TOO_MANY_REQUESTS, "concurrency_limit"));
    assert_eq!(a.headers["retry-after"], "1");
    // It waited its turn through this gateway for the queue wait and never
    // reached the agent (see `burst` for the agent's own wait).
    assert_eq!(g.agent.seen.lock().unwrap().key_slots.get("default/solo"), Some(&1), "the refused one took no slot");
    assert_eq!(g.agent_calls(), 1, "the refused one never reached the agent");
    hold.abort();
    let _ = hold.await;
    // The aborted request's run was cancelled at the agent, and its slot
    // returned once the agent confirmed: the key may run again.
    eventually("the slot returns", || g.agent.seen.lock().unwrap().key_slots.values().all(|n| *n == 0)).await;
    assert_eq!(g.agent.seen.lock().unwrap().cancels.len(), 1);
    assert_eq!(g.execute(SOLO, code("x")).await.status, StatusCode::OK);
}

/// Two nodes, SOLO's slots counted on the one that runs nothing (capacity
/// 0), so every execution of SOLO holds its slot by a separate call there.
async fn gateway_counting_elsewhere(runner: FakeAgent) -> Gateway {
    let names = ["node-1", "node-2"];
    let probe = gateway_of(names.iter().map(|n| FakeAgent { capacity: 8, name: Some(n), ..Default::default() }).collect()).await;
    let counting = probe.state.service.nodes.home_of(&counted_as("default/solo")).unwrap().name();
    let (counter, other) = if counting == names[0] { (names[0], names[1]) } else { (names[1], names[0]) };
    gateway_of(vec![FakeAgent { name: Some(other), ..runner }, FakeAgent { capacity: 0, name: Some(counter), ..Default::default() }]).await
}

#[tokio::test]
async fn a_key_counted_on_another_node_holds_its_slot_there() {
    let g = gateway_counting_elsewhere(FakeAgent { capacity: 8, ..Default::default() }).await;
    let app = g.app.clone();
    let hold = tokio::spawn(async move { app.oneshot(execute_request(SOLO, r#"{"code":"hang"}"#)).await });
    eventually("the first execution reaches the node", || g.agent_calls() == 1).await;
    assert_eq!(g.others[0].seen.lock().unwrap().key_slots.get("default/solo"), Some(&1), "held on the counting node");
    assert!(g.agent.seen.lock().unwrap().executes[0].key_slot.is_none(), "not taken a second time by the executing node");
    let a = g.execute(SOLO, code("x")).await;
    assert_eq!((a.status, a.error().as_str()), (StatusCode::TOO_MANY_REQUESTS, "concurrency_limit"));
    hold.abort();
    let _ = hold.await;
    eventually("the slot returns", || g.others[0].seen.lock().unwrap().key_slots.values().all(|n| *n == 0)).await;
    assert_eq!(g.execute(SOLO, code("x")).await.status, StatusCode::OK);
}

#[tokio::test]
async fn on_a_single_node_the_slot_travels_with_the_execution() {
    let g = gateway().await;
    assert_eq!(g.execute(SOLO, code("x")).await.status, StatusCode::OK);
    let slot = g.agent.seen.lock().unwrap().executes[0].key_slot.clone().expect("no separate hold call");
    assert_eq!((slot.key.as_str(), slot.limit), ("default/solo", 1));
    assert!(slot.wait_ms <= 50, "it carries what is left of the queue wait: {}", slot.wait_ms);
}

#[tokio::test]
async fn a_run_let_go_early_holds_its_key_slot_until_the_agent_confirms_its_end() {
    let gate = Arc::new(tokio::sync::Semaphore::new(0));
    let g = gateway_counting_elsewhere(FakeAgent { capacity: 8, cancel_gate: Some(gate.clone()), ..Default::default() }).await;
    let app = g.app.clone();
    let hold = tokio::spawn(async move { app.oneshot(execute_request(SOLO, r#"{"code":"hang"}"#)).await });
    eventually("the first execution reaches the node", || g.agent_calls() == 1).await;
    hold.abort();
    let _ = hold.await;
    eventually("the gateway asks the agent to cancel", || g.agent.seen.lock().unwrap().cancels.len() == 1).await;
    // The agent has not confirmed the end: the sandbox may still run.
    let a = g.execute(SOLO, code("x")).await;
    assert_eq!((a.status, a.error().as_str()), (StatusCode::TOO_MANY_REQUESTS, "concurrency_limit"), "released too early");
    gate.add_permits(1);
    eventually("the slot returns once the agent confirms", || g.others[0].seen.lock().unwrap().key_slots.values().all(|n| *n == 0)).await;
    assert_eq!(g.execute(SOLO, code("x")).await.status, StatusCode::OK);
}

#[tokio::test]
async fn a_busy_thread_is_409() {
    let g = gateway().await;
    let app = g.app.clone();
    let hold = tokio::spawn(async move { app.oneshot(execute_request(GOOD, r#"{"code":"hang","thread_id":"t1"}"#)).await });
    eventually("the first execution reaches the node", || g.agent_calls() == 1).await;
    let a = g.execute(GOOD, json!({"code": "x", "thread_id": "t1"})).await;
    assert_eq!((a.status, a.error().as_str()), (StatusCode::CONFLICT, "thread_busy"));
    assert_eq!(g.execute(GOOD, json!({"code": "x", "thread_id": "t2"})).await.status, StatusCode::OK, "other threads run");
    hold.abort();
}

#[tokio::test]
async fn no_healthy_node_is_503() {
    let g = gateway_with(FakeAgent { down: true, capacity: 8, ..Default::default() }).await;
    let a = refused(&g, execute_request(GOOD, r#"{"code":"x"}"#), 503, "unavailable").await;
    assert_eq!(a.headers["retry-after"], "1");
}

/// A node full for the whole queue wait is capacity, not an outage: 429
/// with Retry-After (503 until #45: E2B's SDKs read that as a dead sandbox).
#[tokio::test]
async fn a_full_node_is_429_after_the_queue_wait() {
    let g = gateway_with(FakeAgent { capacity: 1, ..Default::default() }).await;
    let app = g.app.clone();
    let hold = tokio::spawn(async move { app.oneshot(execute_request(GOOD, r#"{"code":"hang"}"#)).await });
    eventually("the first execution reaches the node", || g.agent_calls() == 1).await;
    let a = g.execute(GOOD, code("x")).await;
    assert_eq!((a.status, a.error().as_str()), (StatusCode::TOO_MANY_REQUESTS, "queue_timeout"));
    assert_eq!(a.headers["retry-after"], "1");
    assert!(a.json()["message"].as_str().unwrap().contains("capacity"));
    hold.abort();
}

#[tokio::test]
async fn output_memory_the_gateway_cannot_hold_is_503() {
    let g = gateway().await;
    let a = refused(&g, execute_request(BIG, r#"{"code":"x"}"#), 503, "unavailable").await;
    assert!(a.json()["message"].as_str().unwrap().contains("maxOutputBytes"), "{:?}", a.json());
}

/// The agent full past the wait the call carried (another replica's calls
/// took its slots): 429 (503 until #45), and the node stays healthy.
#[tokio::test]
async fn agent_busy_is_429_and_the_node_stays_healthy() {
    let g = gateway().await;
    let a = g.execute(GOOD, code("refuse:busy")).await;
    assert_eq!((a.status, a.error().as_str()), (StatusCode::TOO_MANY_REQUESTS, "queue_timeout"));
    assert_eq!(g.state.service.nodes.healthy(), 1);
}

#[tokio::test]
async fn agent_field_refusal_names_the_agents_field() {
    let g = gateway().await;
    let a = g.execute(GOOD, code("refuse:field")).await;
    assert_eq!((a.status, a.error().as_str()), (StatusCode::BAD_REQUEST, "invalid_request"));
    assert_eq!(a.json()["field"], "limits.pids");
}

#[tokio::test]
async fn agent_thread_busy_is_409() {
    let g = gateway().await;
    let a = g.execute(GOOD, json!({"code": "refuse:thread", "thread_id": "t"})).await;
    assert_eq!((a.status, a.error().as_str()), (StatusCode::CONFLICT, "thread_busy"));
}

#[tokio::test]
async fn agent_lacking_a_capability_is_503() {
    let g = gateway().await;
    let a = g.execute(GOOD, code("refuse:unsupported")).await;
    assert_eq!((a.status, a.error().as_str()), (StatusCode::SERVICE_UNAVAILABLE, "unavailable"));
    assert_eq!(g.state.service.nodes.healthy(), 1, "a capability refusal is not a broken node");
}

#[tokio::test]
async fn unreachable_agent_is_503_and_marks_the_node_down() {
    let g = gateway().await;
    let a = g.execute(GOOD, code("refuse:transport")).await;
    assert_eq!((a.status, a.error().as_str()), (StatusCode::SERVICE_UNAVAILABLE, "unavailable"));
    assert_eq!(g.state.service.nodes.healthy(), 0);
}

#[tokio::test]
async fn a_stream_that_breaks_is_502_node_lost_never_503() {
    for script in ["lost", "lost:error"] {
        let g = gateway().await;
        let a = g.execute(GOOD, code(script)).await;
        assert_eq!((a.status, a.error().as_str()), (StatusCode::BAD_GATEWAY, "node_lost"), "{script}");
        assert!(a.headers.get("retry-after").is_none(), "the code may have run: no automatic retry");
        assert_eq!(g.state.service.nodes.healthy(), 0, "{script}: the node is marked down");
    }
}

#[tokio::test]
async fn unknown_path_is_404_and_wrong_method_405() {
    let g = gateway().await;
    let a = g.send(Request::get("/v1/nope").body(Body::empty()).unwrap()).await;
    assert_eq!((a.status.as_u16(), a.error().as_str()), (404, "not_found"));
    let a = g.send(Request::get("/v1/sandbox/execute").body(Body::empty()).unwrap()).await;
    assert_eq!((a.status.as_u16(), a.error().as_str()), (405, "method_not_allowed"));
}

#[tokio::test]
async fn two_authorization_headers_are_refused() {
    let g = gateway().await;
    let mut req = execute_request(GOOD, r#"{"code":"x"}"#);
    req.headers_mut().append("authorization", format!("Bearer {SOLO}").parse().unwrap());
    refused(&g, req, 401, "missing_api_key").await;
}

#[tokio::test]
async fn json_with_a_charset_other_than_utf8_is_415() {
    let g = gateway().await;
    let mut req = execute_request(GOOD, r#"{"code":"x"}"#);
    req.headers_mut().insert("content-type", "application/json; charset=latin1".parse().unwrap());
    refused(&g, req, 415, "unsupported_media_type").await;
}

#[tokio::test]
async fn json_with_charset_utf8_is_accepted() {
    let g = gateway().await;
    let mut req = execute_request(GOOD, r#"{"code":"x"}"#);
    req.headers_mut().insert("content-type", "Application/JSON; charset=\"UTF-8\"".parse().unwrap());
    assert_eq!(g.send(req).await.status, StatusCode::OK);
}

#[tokio::test]
async fn a_declared_oversize_body_is_413_before_it_is_read() {
    let g = gateway().await;
    // The body stream never yields: only the declared length can refuse it.
    let body = Body::from_stream(futures_util::stream::pending::<Result<bytes::Bytes, std::io::Error>>());
    let req = Request::post("/v1/sandbox/execute")
        .header("authorization", format!("Bearer {GOOD}"))
        .header("content-type", "application/json")
        .header("content-length", (5u64 << 20).to_string())
        .body(body)
        .unwrap();
    refused(&g, req, 413, "payload_too_large").await;
}

#[tokio::test]
async fn a_body_that_never_arrives_is_408() {
    let g = gateway().await;
    tokio::time::pause();
    let body = Body::from_stream(futures_util::stream::pending::<Result<bytes::Bytes, std::io::Error>>());
    let req = Request::post("/v1/sandbox/execute")
        .header("authorization", format!("Bearer {GOOD}"))
        .header("content-type", "application/json")
        .body(body)
        .unwrap();
    // Paused time: the body timeout elapses as soon as nothing else can run.
    refused(&g, req, 408, "request_timeout").await;
}

#[tokio::test]
async fn a_body_that_is_not_an_object_is_invalid_json() {
    let g = gateway().await;
    refused(&g, execute_request(GOOD, r#"["code"]"#), 400, "invalid_json").await;
}

#[tokio::test]
async fn reserved_env_names_are_refused_by_name() {
    let g = gateway().await;
    let a = refused(&g, execute_request(GOOD, r#"{"code":"x","env_vars":{"LD_PRELOAD":"/x.so"}}"#), 400, "invalid_request").await;
    assert_eq!(a.json()["field"], "env_vars.LD_PRELOAD");
}

#[tokio::test]
async fn a_malformed_thread_id_is_refused() {
    let g = gateway().await;
    let a = refused(&g, execute_request(GOOD, r#"{"code":"x","thread_id":"../etc"}"#), 400, "invalid_request").await;
    assert_eq!(a.json()["field"], "thread_id");
}

#[tokio::test]
async fn too_much_metadata_is_refused() {
    let g = gateway().await;
    let many: serde_json::Map<String, serde_json::Value> = (0..11).map(|i| (format!("k{i}"), json!("v"))).collect();
    let a = refused(&g, execute_request(GOOD, &json!({"code": "x", "metadata": many}).to_string()), 400, "invalid_request").await;
    assert_eq!(a.json()["field"], "metadata");
}

#[tokio::test]
async fn prefer_without_respond_async_runs_normally() {
    let g = gateway().await;
    let mut req = execute_request(GOOD, r#"{"code":"x"}"#);
    req.headers_mut().insert("prefer", "return=minimal".parse().unwrap());
    assert_eq!(g.send(req).await.status, StatusCode::OK);
}
