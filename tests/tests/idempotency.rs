//! `Idempotency-Key` on `POST /v1/sandbox/execute` (issue #47), against a
//! real gateway and node agent: a retried call runs once and answers what
//! the first answered (collected, streamed, async), through another
//! gateway replica sharing the record database too, and a collected call
//! whose client left runs to its end for its retry; another request with
//! the key is 422, the key while its call runs is 409 with Retry-After, a
//! key of the wrong shape is 400, and keys belong to their ApiKey.

use std::time::Duration;

use serde_json::{json, Value};
use warren_e2e::gateway::{key, wait_for, Gateway};
use warren_e2e::http::{request, Response};
use warren_e2e::{skip_unless_root, Agent};

fn call(gw: &Gateway, api_key: &str, idem: &str, extra: &[(&str, &str)], body: &Value) -> Response {
    let auth = format!("Bearer {}", key(api_key));
    let mut h = vec![("authorization", auth.as_str()), ("content-type", "application/json"), ("idempotency-key", idem)];
    h.extend_from_slice(extra);
    request(gw.addr, "POST", "/v1/sandbox/execute", &h, body.to_string().as_bytes())
}

/// How many executions the key `main` has on record.
fn recorded(gw: &Gateway) -> usize {
    gw.get(&key("main"), "/v1/executions?limit=100").json()["executions"].as_array().map_or(0, Vec::len)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_retried_execute_runs_once_and_answers_what_the_first_call_did() {
    if skip_unless_root("a_retried_execute_runs_once_and_answers_what_the_first_call_did") {
        return;
    }
    let agent = Agent::start(&[]).await.unwrap();
    let db = tempfile::tempdir().unwrap();
    let records = format!("sqlite://{}/records.db", db.path().display());
    let gw = Gateway::start(&[agent.address()], &["--records", &records], true).await.unwrap();
    // Different output every run: a replay is told by equal output.
    let body = json!({"code": "import time, os; print(time.time_ns(), os.getpid())", "language": "python"});

    let first = call(&gw, "main", "retry-1", &[], &body);
    assert_eq!(first.status, 200, "{}", first.text());
    assert_eq!(first.header("idempotent-replayed"), None);
    let again = call(&gw, "main", "retry-1", &[], &body);
    assert_eq!((again.status, again.header("idempotent-replayed")), (200, Some("true")), "{}", again.text());
    assert_eq!(again.json(), first.json(), "the same answer: trace id, output, accounting");
    assert_eq!(again.header("x-trace-id"), first.json()["trace_id"].as_str());
    assert!(wait_for(Duration::from_secs(10), || recorded(&gw) == 1), "it ran once: {}", recorded(&gw));

    // Another gateway replica sharing the record database answers the same.
    let replica = Gateway::start(&[agent.address()], &["--records", &records], true).await.unwrap();
    let there = call(&replica, "main", "retry-1", &[], &body);
    assert_eq!((there.status, there.json()), (200, first.json()));

    // The key with another request: 422, nothing runs. Another key, or
    // another ApiKey with the same key: runs of their own.
    let other = call(&gw, "main", "retry-1", &[], &json!({"code": "print(2)", "language": "python"}));
    assert_eq!((other.status, other.json()["error"].as_str()), (422, Some("idempotency_key_reused")), "{}", other.text());
    let fresh = call(&gw, "main", "retry-2", &[], &body);
    assert_ne!(fresh.json()["trace_id"], first.json()["trace_id"]);
    let theirs = call(&gw, "thr", "retry-1", &[], &body);
    assert_eq!(theirs.status, 200, "{}", theirs.text());
    assert_ne!(theirs.json()["trace_id"], first.json()["trace_id"]);
    // The same body streamed is another request.
    let streamed = call(&gw, "main", "retry-1", &[("accept", "application/x-ndjson")], &body);
    assert_eq!(streamed.status, 422, "{}", streamed.text());

    // Wrong shapes: 400 naming the header, nothing claimed.
    for bad in [" ", "a b", &"k".repeat(256), "caf\u{e9}"] {
        let r = call(&gw, "main", bad, &[], &body);
        assert_eq!((r.status, r.json()["field"].as_str()), (400, Some("Idempotency-Key")), "{bad:?}: {}", r.text());
    }
    // A request refused before it runs claims nothing: its retry runs.
    assert_eq!(call(&gw, "main", "fix-1", &[], &json!({"code": 5})).status, 400);
    assert_eq!(call(&gw, "main", "fix-1", &[], &body).status, 200);

    // Streamed: the retry replays the recorded lines.
    let ndjson = [("accept", "application/x-ndjson")];
    let s1 = call(&gw, "main", "stream-1", &ndjson, &body);
    let s2 = call(&gw, "main", "stream-1", &ndjson, &body);
    assert_eq!(s1.status, 200);
    let lines = |r: &Response| r.text().lines().filter(|l| !l.contains("keepalive")).map(str::to_string).collect::<Vec<_>>();
    assert_eq!((s2.status, lines(&s2)), (200, lines(&s1)), "{}", s2.text());

    // Async: the retry answers the same 202.
    let prefer = [("prefer", "respond-async")];
    let a1 = call(&gw, "main", "async-1", &prefer, &body);
    let a2 = call(&gw, "main", "async-1", &prefer, &body);
    assert_eq!((a1.status, a2.status), (202, 202));
    assert_eq!(a2.json()["trace_id"], a1.json()["trace_id"]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_key_of_a_call_still_running_answers_409_with_retry_after() {
    if skip_unless_root("the_key_of_a_call_still_running_answers_409_with_retry_after") {
        return;
    }
    let agent = Agent::start(&[]).await.unwrap();
    let gw = Gateway::start(&[agent.address()], &[], true).await.unwrap();
    let body = json!({"code": "sleep 50; echo done", "language": "bash"});
    let addr = gw.addr;
    let slow = std::thread::spawn(move || {
        let auth = format!("Bearer {}", key("main"));
        let h = [("authorization", auth.as_str()), ("content-type", "application/json"), ("idempotency-key", "slow-1")];
        request(addr, "POST", "/v1/sandbox/execute", &h, body.to_string().as_bytes())
    });
    // Once it runs (its record says so), the retry is refused.
    let running = || gw.get(&key("main"), "/v1/executions?status=running").json()["executions"].as_array().and_then(|a| a.first().cloned());
    let running_other = |not: &str| {
        let all = gw.get(&key("main"), "/v1/executions?status=running").json()["executions"].as_array().cloned().unwrap_or_default();
        all.iter().filter_map(|e| e["trace_id"].as_str()).find(|t| *t != not).map(str::to_string)
    };
    assert!(wait_for(Duration::from_secs(30), || running().is_some()), "{}", gw.get(&key("main"), "/v1/executions?status=running").text());
    let id = running().unwrap()["trace_id"].as_str().unwrap().to_string();
    let retry = call(&gw, "main", "slow-1", &[], &json!({"code": "sleep 50; echo done", "language": "bash"}));
    assert_eq!((retry.status, retry.header("retry-after")), (409, Some("1")), "{}", retry.text());
    assert!(retry.text().contains(&id), "{}", retry.text());
    // Cancelled, the first call ends; its retry answers its end.
    assert_eq!(gw.post(&key("main"), &format!("/v1/executions/{id}/cancel")).status, 200);
    let first = slow.join().unwrap();
    let after = call(&gw, "main", "slow-1", &[], &json!({"code": "sleep 50; echo done", "language": "bash"}));
    assert_eq!((after.status, after.text()), (first.status, first.text()), "the retry answers the first call's end");
    assert_eq!(after.header("x-trace-id"), Some(id.as_str()));

    // A client that leaves mid-call (a network error): with a key, the call
    // runs to its end and the retry gets its answer, not a cancelled run.
    let leave = json!({"code": "sleep 2; echo done", "language": "bash"});
    {
        use std::io::Write;
        let mut s = std::net::TcpStream::connect(gw.addr).unwrap();
        let b = leave.to_string();
        write!(s, "POST /v1/sandbox/execute HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {}\r\nContent-Type: application/json\r\nIdempotency-Key: leave-1\r\nContent-Length: {}\r\n\r\n{b}", key("main"), b.len()).unwrap();
        // The cancelled call may still count as running (its teardown ends after its answer):
        // this call is the running one that is not it.
        assert!(wait_for(Duration::from_secs(30), || running_other(&id).is_some()), "it never ran");
    }
    let left = running_other(&id).unwrap();
    let status = |id: &str| gw.get(&key("main"), &format!("/v1/executions/{id}")).json()["status"].as_str().unwrap_or_default().to_string();
    assert!(wait_for(Duration::from_secs(60), || status(&left) != "running"));
    assert_eq!(status(&left), "success", "it ran to its end although its client left");
    let retry = call(&gw, "main", "leave-1", &[], &leave);
    assert_eq!((retry.status, retry.json()["stdout"].as_str(), retry.json()["trace_id"].as_str()), (200, Some("done\n"), Some(left.as_str())), "{}", retry.text());
}
