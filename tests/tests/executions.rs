//! Execution records shared by gateways, end to end with real node-agents:
//! a second gateway answers for (and cancels) the first one's executions,
//! records survive a restart, a gateway that dies has its executions ended
//! truthfully, a graceful stop waits for async executions, and the cluster
//! store is a real PostgreSQL.

use std::time::Duration;

use serde_json::json;
use warren_e2e::gateway::{ended, key, wait_agent_running, Gateway};
use warren_e2e::services::{Postgres, PG_PASSWORD};
use warren_e2e::{http, skip_unless_root, Agent};

/// Submits `code` (bash) asynchronously with `key("main")`; the trace id.
fn submit(gw: &Gateway, code: &str, timeout: u32) -> String {
    let body = json!({"code": code, "language": "bash", "timeout": timeout, "metadata": {"suite": "executions"}}).to_string();
    let main = key("main");
    let r = http::post(gw.addr, "/v1/sandbox/execute", &[("Authorization", &format!("Bearer {main}")), ("Content-Type", "application/json"), ("Prefer", "respond-async")], body.as_bytes());
    assert_eq!(r.status, 202, "{}", r.text());
    r.json()["trace_id"].as_str().unwrap().to_string()
}

/// Until the sandbox prints its first line.
fn started(gw: &Gateway, trace: &str) {
    gw.record_when("main", trace, |_| true);
    let main = key("main");
    let req = format!("GET /v1/executions/{trace}/output HTTP/1.1\r\nHost: {}\r\nAuthorization: Bearer {main}\r\n\r\n", gw.addr);
    http::open_until(gw.addr, req.as_bytes(), "\"output\"").expect("the program never printed");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn gateways_sharing_records_answer_cancel_and_end_each_others_executions() {
    if skip_unless_root("gateways_sharing_records_answer_cancel_and_end_each_others_executions") {
        return;
    }
    let agent = Agent::start(&["--pool-size", "0"]).await.unwrap();
    let dir = tempfile::tempdir().unwrap();
    let url = format!("sqlite://{}/records.db", dir.path().display());
    let args = ["--records", url.as_str(), "--record-lease-secs", "2"];
    let mut first = Gateway::start(&[agent.address()], &args, true).await.unwrap();
    let second = Gateway::start(&[agent.address()], &args, true).await.unwrap();

    // An ended execution of the first gateway, read through the second.
    let done = submit(&first, "echo from-first", 30);
    let v = second.record_when("main", &done, ended);
    assert_eq!((v["status"].as_str(), v["stdout"].as_str(), v["metadata"]["suite"].as_str()), (Some("success"), Some("from-first\n"), Some("executions")), "{v}");

    // A running one, cancelled through the second: the node kills it.
    let running = submit(&first, "echo up; sleep 50", 60);
    started(&second, &running);
    let c = second.post(&key("main"), &format!("/v1/executions/{running}/cancel"));
    assert_eq!((c.status, c.json()["status"].as_str()), (200, Some("cancelled")), "{}", c.text());
    assert!(wait_agent_running(&agent, 0).await, "the cancelled sandbox still runs");
    let v = second.record_when("main", &running, ended);
    assert_eq!((v["status"].as_str(), v["stdout"].as_str()), (Some("cancelled"), Some("up\n")), "{v}");

    // The first gateway dies mid-execution: its stream goes, the node kills
    // the sandbox, and the second gateway ends the record once the lease lapses.
    let orphan = submit(&first, "echo up; sleep 50", 60);
    started(&second, &orphan);
    first.kill();
    assert!(wait_agent_running(&agent, 0).await, "the sandbox outlived its gateway");
    let v = second.record_when("main", &orphan, ended);
    assert_eq!((v["status"].as_str(), v["error"].as_str()), (Some("failed"), Some("gateway_lost")), "{v}");

    // A restarted gateway on the same database still has every record.
    drop(second);
    let again = Gateway::start(&[agent.address()], &args, true).await.unwrap();
    for (trace, status) in [(&done, "success"), (&running, "cancelled"), (&orphan, "failed")] {
        assert_eq!(again.get(&key("main"), &format!("/v1/executions/{trace}")).json()["status"], status);
    }
    let list = again.get(&key("main"), "/v1/executions?metadata.suite=executions").json();
    assert_eq!(list["executions"].as_array().map(Vec::len), Some(3), "{list}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_graceful_stop_waits_for_async_executions() {
    if skip_unless_root("a_graceful_stop_waits_for_async_executions") {
        return;
    }
    let agent = Agent::start(&[]).await.unwrap();
    let dir = tempfile::tempdir().unwrap();
    let url = format!("sqlite://{}/records.db", dir.path().display());
    let mut gw = Gateway::start(&[agent.address()], &["--records", url.as_str()], true).await.unwrap();
    let trace = submit(&gw, "echo up; sleep 2; echo done", 30);
    started(&gw, &trace);
    gw.terminate();
    assert!(gw.wait_exit(Duration::from_secs(30)).is_some_and(|s| s.success()), "the gateway did not stop cleanly");
    let after = Gateway::start(&[agent.address()], &["--records", url.as_str()], true).await.unwrap();
    let v = after.get(&key("main"), &format!("/v1/executions/{trace}")).json();
    assert_eq!((v["status"].as_str(), v["stdout"].as_str()), (Some("success"), Some("up\ndone\n")), "{v}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgresql_holds_the_records_of_every_replica() {
    if skip_unless_root("postgresql_holds_the_records_of_every_replica") {
        return;
    }
    let pg = Postgres::start().unwrap();
    let url = format!("postgres://agent:{PG_PASSWORD}@127.0.0.1:{}/app", pg.port);
    let agent = Agent::start(&[]).await.unwrap();
    // Two replicas migrate the same empty database at once.
    let (agents, args) = ([agent.address()], ["--records", url.as_str()]);
    let (a, b) = tokio::join!(Gateway::start(&agents, &args, true), Gateway::start(&agents, &args, true));
    let (a, b) = (a.unwrap(), b.unwrap());
    let sync = a.execute(&key("main"), &json!({"code": "echo inline", "language": "bash", "metadata": {"suite": "pg"}}));
    assert_eq!(sync.status, 200, "{}", sync.text());
    let inline = sync.json()["trace_id"].as_str().unwrap().to_string();
    let trace = submit(&b, "echo async", 30);
    let v = a.record_when("main", &trace, ended);
    assert_eq!((v["status"].as_str(), v["stdout"].as_str(), v["delivery_mode"].as_str()), (Some("success"), Some("async\n"), Some("async")), "{v}");
    let v = b.record_when("main", &inline, ended);
    assert_eq!((v["stdout"].as_str(), v["delivery_mode"].as_str()), (Some("inline\n"), Some("inline")), "{v}");
    let lines = http::ndjson(&a.get(&key("main"), &format!("/v1/executions/{trace}/output?after_seq=1")));
    assert_eq!(lines.last().unwrap()["result"]["stdout"], "async\n", "{lines:?}");
    let list = b.get(&key("main"), "/v1/executions?metadata.suite=pg&status=success").json();
    let ids: Vec<&str> = list["executions"].as_array().unwrap().iter().map(|e| e["trace_id"].as_str().unwrap()).collect();
    assert_eq!(ids, [inline.as_str()], "{list}");
    // An Idempotency-Key sent to both replicas at once: one call runs, both
    // answer it; another request with the key is refused (422).
    let once = |gw: &Gateway, code: &str| {
        let (auth, body) = (format!("Bearer {}", key("main")), json!({"code": code, "language": "bash"}).to_string());
        http::request(gw.addr, "POST", "/v1/sandbox/execute", &[("authorization", &auth), ("content-type", "application/json"), ("idempotency-key", "pg-once")], body.as_bytes())
    };
    let (x, y) = std::thread::scope(|s| {
        let x = s.spawn(|| once(&a, "date +%s%N"));
        let y = s.spawn(|| once(&b, "date +%s%N"));
        (x.join().unwrap(), y.join().unwrap())
    });
    let answered: Vec<_> = [&x, &y].iter().filter(|r| r.status == 200).map(|r| r.json()).collect();
    assert!([&x, &y].iter().all(|r| r.status == 200 || (r.status == 409 && r.header("retry-after") == Some("1"))), "{} / {}", x.text(), y.text());
    assert!(answered.windows(2).all(|w| w[0] == w[1]), "one run, one answer: {answered:?}");
    let replay = once(&b, "date +%s%N");
    assert_eq!((replay.status, replay.header("idempotent-replayed")), (200, Some("true")), "{}", replay.text());
    assert_eq!(once(&a, "echo other").status, 422);
}
