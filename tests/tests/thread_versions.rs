//! Thread forks, history and restore end to end through the real gateway
//! and node-agent (#47): a fork starts as its source's saved state and goes
//! its own way, forks fan out from one prepared home, every execution that
//! changed the home is a version to return to, and bad input is refused
//! without changing anything.

use serde_json::{json, Value};
use warren_e2e::gateway::{key, Gateway};
use warren_e2e::{skip_unless_root, Agent};

async fn setup(test: &str) -> Option<(Agent, Gateway)> {
    if skip_unless_root(test) {
        return None;
    }
    let agent = Agent::start(&[]).await.unwrap();
    let gw = Gateway::start(&[agent.address()], &[], true).await.unwrap();
    Some((agent, gw))
}

/// Runs bash `code` on `thread`; (stdout, trace id).
fn run(gw: &Gateway, k: &str, code: &str, thread: &str) -> (String, String) {
    let r = gw.execute(&key(k), &json!({"code": code, "language": "bash", "timeout": 60, "thread_id": thread}));
    assert_eq!(r.status, 200, "{}", r.text());
    let v = r.json();
    assert_eq!(v["exit_code"].as_i64(), Some(0), "{v}");
    (v["stdout"].as_str().unwrap().to_string(), v["trace_id"].as_str().unwrap().to_string())
}

fn fork(gw: &Gateway, k: &str, thread: &str, body: Value) -> (u16, Value) {
    let r = gw.post_json(&key(k), &format!("/v1/threads/{thread}/fork"), &body);
    (r.status, r.json())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_fork_starts_as_its_source_and_goes_its_own_way() {
    let Some((_agent, gw)) = setup("a_fork_starts_as_its_source_and_goes_its_own_way").await else { return };
    run(&gw, "thr", "mkdir -p ~/proj && echo prepared > ~/proj/state && echo 1 > ~/counter", "base");
    let (status, body) = fork(&gw, "thr", "base", json!({"thread_id": "attempt-a"}));
    assert_eq!(status, 201, "{body}");
    assert_eq!(body["threads"], json!(["attempt-a"]));
    // Fan out: three more with ids Warren picks.
    let (status, body) = fork(&gw, "thr", "base", json!({"count": 3}));
    assert_eq!(status, 201, "{body}");
    let ids: Vec<String> = body["threads"].as_array().unwrap().iter().map(|v| v.as_str().unwrap().to_string()).collect();
    assert_eq!(ids.len(), 3);
    for (i, id) in ids.iter().chain(["attempt-a".to_string()].iter()).enumerate() {
        let (out, _) = run(&gw, "thr", &format!("cat ~/proj/state; echo attempt-{i} > ~/proj/state"), id);
        assert_eq!(out, "prepared\n", "{id} starts as the source's saved state");
    }
    for (i, id) in ids.iter().enumerate() {
        assert_eq!(run(&gw, "thr", "cat ~/proj/state", id).0, format!("attempt-{i}\n"), "each fork keeps its own changes");
    }
    assert_eq!(run(&gw, "thr", "cat ~/proj/state", "base").0, "prepared\n", "the source is untouched");
    // Deleting the source leaves its forks whole.
    assert_eq!(gw.delete(&key("thr"), "/v1/threads/base").status, 204);
    assert_eq!(run(&gw, "thr", "cat ~/counter ~/proj/state", "attempt-a").0, "1\nattempt-3\n");
    // Another key sees neither the forks nor the source.
    let (status, body) = fork(&gw, "thr2", "attempt-a", json!({"thread_id": "mine"}));
    assert_eq!((status, body["error"].as_str()), (404, Some("not_found")), "{body}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_change_is_a_version_to_restore_or_fork_from() {
    let Some((_agent, gw)) = setup("every_change_is_a_version_to_restore_or_fork_from").await else { return };
    let (_, t1) = run(&gw, "thr", "echo one > ~/f", "hist");
    let (_, t2) = run(&gw, "thr", "echo two > ~/f && echo extra > ~/g", "hist");
    run(&gw, "thr", "cat ~/f", "hist"); // changes nothing: no version
    let (_, t3) = run(&gw, "thr", "rm ~/g && echo three > ~/f", "hist");
    let h = gw.get(&key("thr"), "/v1/threads/hist/history").json();
    let traces: Vec<&str> = h["versions"].as_array().unwrap().iter().map(|v| v["trace_id"].as_str().unwrap()).collect();
    assert_eq!(traces, [t3.as_str(), t2.as_str(), t1.as_str()], "{h}");
    assert_eq!(h["versions"][0]["current"], json!(true));
    assert_eq!((h["versions"][2]["kind"].as_str(), h["versions"][2]["exit_code"].as_i64()), (Some("execution"), Some(0)));
    assert_eq!(h["next_offset"], Value::Null);
    let page = gw.get(&key("thr"), "/v1/threads/hist/history?limit=2").json();
    assert_eq!((page["versions"].as_array().unwrap().len(), page["next_offset"].as_u64()), (2, Some(2)));
    let rest = gw.get(&key("thr"), "/v1/threads/hist/history?limit=2&offset=2").json();
    assert_eq!(rest["versions"][0]["trace_id"].as_str(), Some(t1.as_str()));
    // Roll back what the last call did.
    let r = gw.post_json(&key("thr"), "/v1/threads/hist/restore", &json!({"at": t2}));
    assert_eq!(r.status, 200, "{}", r.text());
    assert_eq!((r.json()["kind"].as_str(), r.json()["current"].as_bool()), (Some("restore"), Some(true)));
    assert_eq!(run(&gw, "thr", "cat ~/f ~/g", "hist").0, "two\nextra\n");
    // A fork at the first version.
    let (status, body) = fork(&gw, "thr", "hist", json!({"thread_id": "from-one", "at": t1}));
    assert_eq!(status, 201, "{body}");
    assert_eq!(run(&gw, "thr", "cat ~/f; ls ~", "from-one").0, "one\nf\n");
    // The restore is a version too: undo it.
    let r = gw.post_json(&key("thr"), "/v1/threads/hist/restore", &json!({"at": t3}));
    assert_eq!(r.status, 200, "{}", r.text());
    assert_eq!(run(&gw, "thr", "cat ~/f; ls ~", "hist").0, "three\nf\n");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_fork_and_restore_requests_change_nothing() {
    let Some((_agent, gw)) = setup("bad_fork_and_restore_requests_change_nothing").await else { return };
    let (_, t1) = run(&gw, "thr", "echo one > ~/f", "src");
    run(&gw, "thr", "echo x > ~/f", "taken");
    let cases = [
        ("src", json!({}), 400, "invalid_request"),
        ("src", json!({"thread_id": "a", "count": 2}), 400, "invalid_request"),
        ("src", json!({"count": 0}), 400, "invalid_request"),
        ("src", json!({"count": 33}), 400, "invalid_request"),
        ("src", json!({"thread_id": "../x"}), 400, "invalid_request"),
        ("src", json!({"thread_id": "src"}), 400, "invalid_request"),
        ("src", json!({"thread_id": "a", "bogus": 1}), 400, "invalid_request"),
        ("nope", json!({"thread_id": "a"}), 404, "not_found"),
        ("src", json!({"thread_id": "a", "at": "trc_unknown"}), 404, "version_not_found"),
        ("src", json!({"thread_id": "taken"}), 409, "thread_exists"),
    ];
    for (thread, body, status, code) in cases {
        let (got, answer) = fork(&gw, "thr", thread, body.clone());
        assert_eq!((got, answer["error"].as_str()), (status, Some(code)), "{body}: {answer}");
    }
    assert_eq!(run(&gw, "thr", "cat ~/f", "taken").0, "x\n", "a refused fork leaves the target alone");
    let absent = gw.get(&key("thr"), "/v1/threads/a/history");
    assert_eq!(absent.status, 404, "no refused fork made a thread: {}", absent.text());
    for (thread, body, status) in [("src", json!({"at": "trc_unknown"}), 404), ("nope", json!({"at": t1}), 404), ("src", json!({}), 400)] {
        let r = gw.post_json(&key("thr"), &format!("/v1/threads/{thread}/restore"), &body);
        assert_eq!(r.status, status, "{body}: {}", r.text());
    }
    assert_eq!(gw.get(&key("thr"), "/v1/threads/src/history?limit=0").status, 400);
    let bad = gw.get(&key("thr"), "/v1/threads/src/history?offset=-1");
    assert_eq!((bad.status, bad.json()["error"].as_str()), (400, Some("invalid_request")), "the API's JSON error: {}", bad.text());
    assert_eq!(gw.post(&key("thr"), "/v1/threads/src/fork").status, 415, "no JSON body");
    assert_eq!(gw.get(&key("thr2"), "/v1/threads/src/history").status, 404, "another key's thread is not there");
    assert_eq!(run(&gw, "thr", "cat ~/f", "src").0, "one\n");
}
