//! Executions that run: what the node receives (the spec's wire form) and
//! what the caller gets back, collected and streamed.

use axum::http::StatusCode;
use serde_json::json;
use warren_proto::agent as pb;

use super::*;

#[tokio::test]
async fn a_run_returns_output_exit_code_and_trace_id() {
    let g = gateway().await;
    let a = g.execute(GOOD, json!({"code": "exit:3"})).await;
    assert_eq!(a.status, StatusCode::OK);
    let r = a.json();
    assert_eq!((r["stdout"].as_str(), r["stderr"].as_str(), r["exit_code"].as_i64(), r["success"].as_bool()), (Some("ran exit:3\n"), Some("err\n"), Some(3), Some(false)));
    let trace = a.headers["x-trace-id"].to_str().unwrap();
    assert!(trace.starts_with("trc_") && r["trace_id"] == trace, "{trace} {r}");
    assert_eq!(g.last_execute().execution_id, trace, "the trace id is the agent's execution id");
    assert_eq!(r["duration_ms"], 2);
}

#[tokio::test]
async fn the_node_receives_the_whole_spec() {
    let g = gateway().await;
    let a = g.execute(GOOD, json!({"code": "x", "language": "bash", "timeout": 7, "env_vars": {"C": "request", "B": "request"}, "thread_id": "t-1"})).await;
    assert_eq!(a.status, StatusCode::OK);
    let w = g.last_execute();
    assert_eq!(w.language(), pb::Language::Bash);
    assert_eq!(w.timeout_ms, 7000);
    let env: Vec<(&str, &str)> = {
        let mut e: Vec<_> = w.env.iter().map(|(k, v)| (k.as_str(), v.as_str())).collect();
        e.sort();
        e
    };
    assert_eq!(env, [("A", "sandbox"), ("B", "request"), ("C", "request")], "sandbox < key < request");
    let l = w.limits.unwrap();
    assert_eq!((l.cpu_millis, l.memory_bytes, l.pids), (1000, 1 << 30, 64));
    assert!(l.open_files > 0 && l.file_size_bytes > 0, "every limit is sent, none left to node defaults");
    assert_eq!(w.network(), pb::NetworkPolicy::Blocked);
    let t = w.thread.unwrap();
    let r = t.r#ref.unwrap();
    assert_eq!((r.namespace.as_str(), r.key_name.as_str(), r.thread_id.as_str(), t.max_bytes), ("default", "good", "t-1", 1 << 30));
    assert!(w.mounts.is_empty() && w.egress.is_empty() && w.connectors.is_empty() && w.image_digest.is_empty());
}

#[tokio::test]
async fn the_default_timeout_is_capped_by_the_key() {
    let g = gateway().await;
    g.execute(GOOD, json!({"code": "x"})).await;
    assert_eq!(g.last_execute().timeout_ms, 30_000);
}

#[tokio::test]
async fn a_timeout_is_a_result_not_an_error() {
    let g = gateway().await;
    let r = g.execute(GOOD, json!({"code": "timeout"})).await.json();
    assert_eq!((r["error"].as_str(), r["timed_out"].as_bool(), r["signal"].as_i64()), (Some("timeout"), Some(true), Some(9)));
}

#[tokio::test]
async fn failures_from_the_wire_become_result_codes() {
    let g = gateway().await;
    let r = g.execute(GOOD, json!({"code": "thread-mount", "thread_id": "t"})).await.json();
    assert_eq!((r["error"].as_str(), r["exit_code"].as_i64()), (Some("thread_mount_error"), Some(-1)));
    let r = g.execute(GOOD, json!({"code": "start-failed"})).await.json();
    assert_eq!(r["error"].as_str(), Some("sandbox_error"), "the failing step stays in the logs");
}

#[tokio::test]
async fn a_stream_has_ordered_lines_and_a_final_result() {
    let g = gateway().await;
    let mut req = execute_request(GOOD, r#"{"code":"exit:0"}"#);
    req.headers_mut().insert("accept", "application/x-ndjson".parse().unwrap());
    let a = g.send(req).await;
    assert_eq!(a.headers["content-type"], "application/x-ndjson");
    let lines = a.lines();
    let kinds: Vec<&str> = lines.iter().map(|l| l["type"].as_str().unwrap()).collect();
    assert_eq!(kinds, ["status", "output", "output", "result"]);
    let seqs: Vec<u64> = lines.iter().map(|l| l["seq"].as_u64().unwrap()).collect();
    assert_eq!(seqs, [1, 2, 3, 4]);
    assert_eq!((lines[1]["stream"].as_str(), lines[2]["stream"].as_str()), (Some("stdout"), Some("stderr")));
    let last = &lines[3];
    assert_eq!((last["status"].as_str(), last["result"]["stdout"].as_str()), (Some("success"), Some("ran exit:0\n")));
}

#[tokio::test]
async fn a_stream_keeps_characters_whole() {
    let g = gateway().await;
    let mut req = execute_request(GOOD, r#"{"code":"utf8-split"}"#);
    req.headers_mut().insert("accept", "application/x-ndjson".parse().unwrap());
    let lines = g.send(req).await.lines();
    let out: Vec<&str> = lines.iter().filter(|l| l["type"] == "output").map(|l| l["data"].as_str().unwrap()).collect();
    assert_eq!(out, ["€"], "the split character arrives once, whole");
}

#[tokio::test]
async fn a_broken_stream_ends_with_a_node_lost_result() {
    let g = gateway().await;
    let mut req = execute_request(GOOD, r#"{"code":"lost"}"#);
    req.headers_mut().insert("accept", "application/x-ndjson".parse().unwrap());
    let a = g.send(req).await;
    assert_eq!(a.status, StatusCode::OK, "headers were sent before the node died");
    let lines = a.lines();
    let last = lines.last().unwrap();
    assert_eq!((last["type"].as_str(), last["status"].as_str(), last["result"]["error"].as_str()), (Some("result"), Some("node_lost"), Some("node_lost")));
}

#[tokio::test]
async fn slots_are_returned_after_every_ending() {
    let g = gateway().await;
    for script in ["exit:0", "timeout", "lost", "refuse:busy", "refuse:field"] {
        g.execute(SOLO, json!({"code": script})).await;
    }
    // SOLO may run one at a time: a leaked slot would make this 429.
    g.state.service.nodes.check_all().await;
    assert_eq!(g.execute(SOLO, json!({"code": "x"})).await.status, StatusCode::OK);
}

#[tokio::test]
async fn metrics_count_requests_by_route_and_status() {
    let g = gateway().await;
    g.execute(GOOD, json!({"code": "x"})).await;
    g.execute(OFF, json!({"code": "x"})).await;
    let a = g.send(axum::http::Request::get("/metrics").body(axum::body::Body::empty()).unwrap()).await;
    let text = String::from_utf8(a.body).unwrap();
    assert!(text.contains(r#"route="/v1/sandbox/execute",status="200""#), "{text}");
    assert!(text.contains(r#"route="/v1/sandbox/execute",status="403""#), "{text}");
}

#[tokio::test]
async fn readiness_follows_the_nodes() {
    let g = gateway().await;
    let ready = || axum::http::Request::get("/readyz").body(axum::body::Body::empty()).unwrap();
    assert_eq!(g.send(ready()).await.status, StatusCode::OK);
    let down = gateway_with(FakeAgent { down: true, capacity: 1, ..Default::default() }).await;
    let a = down.send(ready()).await;
    assert_eq!((a.status, a.json()["status"].as_str()), (StatusCode::SERVICE_UNAVAILABLE, Some("not_ready")));
}
