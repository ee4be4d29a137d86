//! NDJSON delivery: a client that stops reading cannot hold an execution,
//! silence gets keepalives, and streams carry the trace id.

use axum::http::StatusCode;
use tower::ServiceExt;

use super::*;

fn streaming(key: &str, code: &str) -> axum::http::Request<axum::body::Body> {
    let mut req = execute_request(key, &serde_json::json!({"code": code}).to_string());
    req.headers_mut().insert("accept", "application/x-ndjson".parse().unwrap());
    req
}

// Time is paused once the gateway (and its record database) is open.
#[tokio::test]
async fn a_client_that_stops_reading_detaches_and_the_execution_keeps_its_slot() {
    let g = gateway().await.with_settings(|s| s.stream_stall = Duration::from_secs(2));
    tokio::time::pause();
    // Headers are answered; the body is never read.
    let resp = g.app.clone().oneshot(streaming(SOLO, "flood")).await.unwrap();
    assert_eq!(resp.status(), StatusCode::OK);
    tokio::time::sleep(Duration::from_secs(60)).await;
    // Detached, not cancelled: the agent stream is held, and so is the key's one slot.
    assert_eq!(g.agent.seen.lock().unwrap().dropped, 0);
    assert!(g.agent.seen.lock().unwrap().cancels.is_empty());
    assert_eq!(g.execute(SOLO, serde_json::json!({"code": "x"})).await.status, StatusCode::TOO_MANY_REQUESTS);
    drop(resp);
}

#[tokio::test]
async fn silence_gets_keepalive_lines_and_the_result_still_arrives() {
    let g = gateway().await.with_settings(|s| s.keepalive = Duration::from_secs(10));
    tokio::time::pause();
    let lines = g.send(streaming(GOOD, "silent")).await.lines();
    let kinds: Vec<&str> = lines.iter().map(|l| l["type"].as_str().unwrap()).collect();
    assert_eq!(kinds, ["status", "keepalive", "keepalive", "result"], "25 s of silence, a keepalive every 10 s");
    let seqs: Vec<u64> = lines.iter().map(|l| l["seq"].as_u64().unwrap()).collect();
    assert_eq!(seqs, [1, 2, 3, 4]);
}

#[tokio::test]
async fn a_client_that_disconnects_resumes_the_stream_from_the_record() {
    let g = gateway().await;
    let resp = g.app.clone().oneshot(streaming(GOOD, "slow")).await.unwrap();
    let id = resp.headers()["x-trace-id"].to_str().unwrap().to_string();
    drop(resp);
    // The execution runs on; its lines after the first are there to resume.
    let path = format!("/v1/executions/{id}/output?after_seq=1");
    let lines = g.get(GOOD, &path).await.lines();
    let got: Vec<(&str, &str)> = lines.iter().map(|l| (l["type"].as_str().unwrap(), l["data"].as_str().unwrap_or(""))).collect();
    assert_eq!(got, [("output", "one\n"), ("output", "two\n"), ("result", "")]);
    assert_eq!(lines[2]["result"]["stdout"], "one\ntwo\n");
    assert!(g.agent.seen.lock().unwrap().cancels.is_empty(), "a disconnect is not a cancel");
}

#[tokio::test]
async fn streams_carry_the_trace_id_header() {
    let g = gateway().await;
    let a = g.send(streaming(GOOD, "exit:0")).await;
    let trace = a.headers["x-trace-id"].to_str().unwrap().to_string();
    assert_eq!(a.lines().last().unwrap()["trace_id"], trace.as_str());
}

#[tokio::test]
async fn invalid_utf8_output_is_replaced_not_refused() {
    let g = gateway().await;
    let r = g.execute(GOOD, serde_json::json!({"code": "bad-utf8"})).await.json();
    assert_eq!(r["stdout"], "a\u{fffd}b");
}

#[tokio::test]
async fn accept_json_gets_one_result() {
    let g = gateway().await;
    let mut req = execute_request(GOOD, r#"{"code":"x"}"#);
    req.headers_mut().insert("accept", "application/json".parse().unwrap());
    let a = g.send(req).await;
    assert_eq!(a.headers["content-type"], "application/json");
    assert_eq!(a.json()["exit_code"], 0);
}
