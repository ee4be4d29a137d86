//! Execution records through the HTTP API: async submit, status, resumed
//! output, cancel and the audit query, against a real SQLite database.

use axum::http::StatusCode;

use super::{execute_request, gateway, Answer, Gateway, BIG, GOOD, SOLO};

/// Submits `code` asynchronously; the trace id.
async fn submit(g: &Gateway, key: &str, body: serde_json::Value) -> String {
    let mut req = execute_request(key, &body.to_string());
    req.headers_mut().insert("prefer", "respond-async".parse().unwrap());
    let a = g.send(req).await;
    assert_eq!(a.status, StatusCode::ACCEPTED, "{}", String::from_utf8_lossy(&a.body));
    let v = a.json();
    assert_eq!(v["status"], "running");
    let id = v["trace_id"].as_str().unwrap().to_string();
    assert_eq!(a.headers["location"], format!("/v1/executions/{id}").as_str());
    id
}

/// Polls the record until `done` holds for it. The record of a synchronous
/// execution is written in the background: it may not exist yet.
async fn until(g: &Gateway, key: &str, id: &str, done: impl Fn(&serde_json::Value) -> bool) -> serde_json::Value {
    for _ in 0..2000 {
        let a = g.get(key, &format!("/v1/executions/{id}")).await;
        if a.status == StatusCode::NOT_FOUND {
            tokio::time::sleep(std::time::Duration::from_millis(5)).await;
            continue;
        }
        assert_eq!(a.status, StatusCode::OK, "{}", String::from_utf8_lossy(&a.body));
        let v = a.json();
        if done(&v) {
            return v;
        }
        tokio::time::sleep(std::time::Duration::from_millis(5)).await;
    }
    panic!("record {id} never reached the expected state");
}

fn ended(v: &serde_json::Value) -> bool {
    v["status"] != "running"
}

#[tokio::test]
async fn an_async_execution_is_accepted_and_its_record_ends_with_the_result() {
    let g = gateway().await;
    let id = submit(&g, GOOD, serde_json::json!({"code": "exit:3", "metadata": {"job": "j1"}})).await;
    let v = until(&g, GOOD, &id, ended).await;
    assert_eq!((v["status"].as_str(), v["exit_code"].as_i64(), v["stdout"].as_str(), v["stderr"].as_str()), (Some("failed"), Some(3), Some("ran exit:3\n"), Some("err\n")));
    assert_eq!((v["delivery_mode"].as_str(), v["metadata"]["job"].as_str(), v["key"].as_str()), (Some("async"), Some("j1"), Some("good")));
    assert!(v["created_at"].as_str().unwrap().ends_with('Z') && v["completed_at"].is_string(), "{v}");
}

#[tokio::test]
async fn a_key_sees_only_its_own_executions() {
    let g = gateway().await;
    let id = submit(&g, GOOD, serde_json::json!({"code": "x"})).await;
    until(&g, GOOD, &id, ended).await;
    for path in [format!("/v1/executions/{id}"), format!("/v1/executions/{id}/output")] {
        let a = g.get(SOLO, &path).await;
        assert_eq!((a.status, a.error()), (StatusCode::NOT_FOUND, "not_found".into()), "{path}");
    }
    assert_eq!(g.post(SOLO, &format!("/v1/executions/{id}/cancel")).await.status, StatusCode::NOT_FOUND);
    assert_eq!(g.get(GOOD, "/v1/executions/trc_doesnotexist").await.status, StatusCode::NOT_FOUND);
    assert_eq!(g.get(GOOD, "/v1/executions/..%2f").await.status, StatusCode::NOT_FOUND);
    assert_eq!(g.get("sk-wrn-ZZZZZZZZZZZZZZZZZZZZZZZZZZZZZZZZZZZZ", &format!("/v1/executions/{id}")).await.status, StatusCode::UNAUTHORIZED);
}

#[tokio::test]
async fn the_output_of_an_async_execution_resumes_after_any_line() {
    let g = gateway().await;
    let id = submit(&g, GOOD, serde_json::json!({"code": "x"})).await;
    until(&g, GOOD, &id, ended).await;
    let all = g.get(GOOD, &format!("/v1/executions/{id}/output")).await.lines();
    let kinds: Vec<&str> = all.iter().map(|l| l["type"].as_str().unwrap()).collect();
    assert_eq!(kinds, ["status", "output", "output", "result"]);
    assert_eq!(all[3]["result"]["stdout"], "ran x\n");
    let rest = g.get(GOOD, &format!("/v1/executions/{id}/output?after_seq=2")).await.lines();
    let seqs: Vec<u64> = rest.iter().map(|l| l["seq"].as_u64().unwrap()).collect();
    assert_eq!(seqs, [3, 4]);
    assert_eq!(g.get(GOOD, &format!("/v1/executions/{id}/output?after_seq=-1")).await.status, StatusCode::BAD_REQUEST);
}

#[tokio::test]
async fn an_inline_execution_is_recorded_and_its_output_is_one_result_line() {
    let g = gateway().await;
    let a = g.execute(GOOD, serde_json::json!({"code": "x"})).await;
    let id = a.json()["trace_id"].as_str().unwrap().to_string();
    let v = until(&g, GOOD, &id, ended).await;
    assert_eq!((v["status"].as_str(), v["delivery_mode"].as_str(), v["stdout"].as_str()), (Some("success"), Some("inline"), Some("ran x\n")));
    let lines = g.get(GOOD, &format!("/v1/executions/{id}/output")).await.lines();
    assert_eq!(lines.len(), 1);
    assert_eq!((lines[0]["type"].as_str(), lines[0]["result"]["stdout"].as_str()), (Some("result"), Some("ran x\n")));
}

#[tokio::test]
async fn cancel_asks_the_node_and_answers_for_an_ended_one_with_its_status() {
    let g = gateway().await;
    let id = submit(&g, GOOD, serde_json::json!({"code": "hang"})).await;
    let a = g.post(GOOD, &format!("/v1/executions/{id}/cancel")).await;
    assert_eq!((a.status, a.json()["status"].as_str()), (StatusCode::OK, Some("cancelled")));
    assert_eq!(g.agent.seen.lock().unwrap().cancels, [id.clone()]);
    let done = submit(&g, GOOD, serde_json::json!({"code": "x"})).await;
    until(&g, GOOD, &done, ended).await;
    let a = g.post(GOOD, &format!("/v1/executions/{done}/cancel")).await;
    assert_eq!(a.json()["status"], "success", "an ended execution keeps its status");
}

fn ids(a: &Answer) -> Vec<String> {
    assert_eq!(a.status, StatusCode::OK, "{}", String::from_utf8_lossy(&a.body));
    a.json()["executions"].as_array().unwrap().iter().map(|e| e["trace_id"].as_str().unwrap().to_string()).collect()
}

#[tokio::test]
async fn the_audit_query_filters_pages_and_is_scoped_to_the_key() {
    let g = gateway().await;
    let mut mine = Vec::new();
    for (code, job) in [("x", "a"), ("exit:1", "b"), ("x", "b")] {
        let a = g.execute(GOOD, serde_json::json!({"code": code, "metadata": {"job": job}})).await;
        mine.push(a.json()["trace_id"].as_str().unwrap().to_string());
        // Records are ordered by their millisecond of admission.
        tokio::time::sleep(std::time::Duration::from_millis(2)).await;
    }
    let theirs = g.execute(SOLO, serde_json::json!({"code": "x", "metadata": {"job": "b"}})).await.json()["trace_id"].as_str().unwrap().to_string();
    for id in mine.iter().chain([&theirs]) {
        until(&g, if id == &theirs { SOLO } else { GOOD }, id, ended).await;
    }
    let all = ids(&g.get(GOOD, "/v1/executions").await);
    assert_eq!(all, mine.iter().rev().cloned().collect::<Vec<_>>(), "its own, newest first");
    assert_eq!(ids(&g.get(GOOD, "/v1/executions?metadata.job=b").await), [mine[2].clone(), mine[1].clone()]);
    assert_eq!(ids(&g.get(GOOD, "/v1/executions?metadata.job=b&status=failed").await), [mine[1].clone()]);
    // Pages of one, following next_cursor.
    let (mut seen, mut path) = (Vec::new(), "/v1/executions?limit=1".to_string());
    loop {
        let a = g.get(GOOD, &path).await;
        seen.extend(ids(&a));
        match a.json()["next_cursor"].as_str() {
            Some(c) => path = format!("/v1/executions?limit=1&cursor={c}"),
            None => break,
        }
    }
    assert_eq!(seen, all);
    // A key of auditScope Own may not look at another key; a Namespace one may.
    assert_eq!(g.get(GOOD, "/v1/executions?key=solo").await.status, StatusCode::FORBIDDEN);
    assert_eq!(ids(&g.get(BIG, "/v1/executions?key=solo").await), [theirs.clone()]);
    assert_eq!(ids(&g.get(BIG, "/v1/executions?key=*&metadata.job=b").await).len(), 3);
    let future = g.get(GOOD, "/v1/executions?since=2999-01-01T00:00:00Z").await;
    assert!(ids(&future).is_empty());
    for bad in ["since=yesterday", "status=done", "limit=0", "cursor=zzz", "metadata.bad%20key=1", "colour=red"] {
        let a = g.get(GOOD, &format!("/v1/executions?{bad}")).await;
        assert_eq!(a.status, StatusCode::BAD_REQUEST, "{bad}: {}", String::from_utf8_lossy(&a.body));
    }
}
