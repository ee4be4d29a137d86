//! Bursts queue, never fail, within a key's limits (#45): capacity that
//! runs out for a moment (the key's slots, node slots, the gateway's output
//! memory) makes a call wait its turn, in order, up to the queue wait; only
//! then 429 with Retry-After. Output memory is reserved as output arrives.

use axum::http::StatusCode;
use serde_json::json;
use tower::ServiceExt;

use super::*;

/// `n` executions of `code` with `key` sent at once; their answers.
async fn burst(g: &Gateway, key: &str, code: &str, n: usize) -> Vec<Answer> {
    let sends = (0..n).map(|_| g.execute(key, json!({"code": code})));
    futures_util::future::join_all(sends).await
}

/// 100 and 200 executions at once on one key (limit 10) through a node of
/// 8 slots: every one waits its turn and runs; never more than the key's
/// limit at the agent. Before #45 each reserved 6 MiB of a 64 MiB budget up
/// front (a key may hold half: five at once) and the rest got 503.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_burst_on_one_key_queues_and_every_call_runs() {
    let g = gateway().await.with_queue_wait(Duration::from_secs(60));
    for n in [100, 200] {
        let answers = burst(&g, GOOD, "nap", n).await;
        let failed: Vec<_> = answers.iter().filter(|a| a.status != StatusCode::OK).map(|a| (a.status, String::from_utf8_lossy(&a.body).into_owned())).collect();
        assert!(failed.is_empty(), "{n} at once: {} failed: {:?}", failed.len(), &failed[..failed.len().min(3)]);
        assert!(answers.iter().all(|a| a.json()["stdout"] == "napped\n"));
    }
    let seen = g.agent.seen.lock().unwrap();
    assert!(seen.peak_key_slots["default/good"] <= 10, "the key's limit held: {:?}", seen.peak_key_slots);
    drop(seen);
    eventually("everything is given back", || g.state.service.budget.reserved_bytes() == 0).await;
}

/// A node full for a while: the calls waiting for it are served in the
/// order they came, not in whatever order they retry.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn calls_waiting_for_a_node_are_served_in_order() {
    let g = gateway_with(FakeAgent { capacity: 1, ..Default::default() }).await.with_queue_wait(Duration::from_secs(60));
    let app = g.app.clone();
    let hold = tokio::spawn(async move { app.oneshot(execute_request(GOOD, r#"{"code":"hang"}"#)).await });
    eventually("the first execution reaches the node", || g.agent_calls() == 1).await;
    let mut waiting = Vec::new();
    for i in 0..5 {
        let app = g.app.clone();
        waiting.push(tokio::spawn(async move { app.oneshot(execute_request(GOOD, &json!({"code": format!("exit:{i}")}).to_string())).await }));
        eventually("the call queues", || g.state.service.nodes.waiting() == i + 1).await;
    }
    hold.abort();
    for w in waiting {
        assert_eq!(w.await.unwrap().unwrap().status(), StatusCode::OK);
    }
    let order: Vec<String> = g.agent.seen.lock().unwrap().executes.iter().map(|e| e.code.clone()).collect();
    assert_eq!(order, ["hang", "exit:0", "exit:1", "exit:2", "exit:3", "exit:4"]);
}

/// Two replicas of the gateway over one agent that counts the key: the
/// second replica's call waits at the agent for the slot the first one's
/// holds (its own turns are free), and runs once it returns. An agent from
/// before the wait refuses at once, which stays a 429.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_key_at_its_limit_waits_at_the_counting_agent_across_replicas() {
    for old in [false, true] {
        let agent = FakeAgent { capacity: 8, old_key_slots: old, ..Default::default() };
        let one = gateway_with(agent.clone()).await;
        let two = gateway_with(agent.clone()).await.with_queue_wait(Duration::from_secs(60));
        let app = one.app.clone();
        let hold = tokio::spawn(async move { app.oneshot(execute_request(SOLO, r#"{"code":"hang"}"#)).await });
        eventually("the first execution holds the key's slot", || agent.seen.lock().unwrap().key_slots.get("default/solo") == Some(&1)).await;
        let app = two.app.clone();
        let second = tokio::spawn(async move { app.oneshot(execute_request(SOLO, r#"{"code":"x"}"#)).await.unwrap() });
        if old {
            let refused = second.await.unwrap();
            assert_eq!(refused.status(), StatusCode::TOO_MANY_REQUESTS, "an older agent refuses at once");
            hold.abort();
            continue;
        }
        eventually("the second call waits at the agent", || agent.seen.lock().unwrap().executes.len() == 1 && !second.is_finished()).await;
        tokio::time::sleep(Duration::from_millis(100)).await;
        assert!(!second.is_finished(), "it waits for the slot rather than failing");
        hold.abort();
        assert_eq!(second.await.unwrap().status(), StatusCode::OK);
        assert_eq!(agent.seen.lock().unwrap().peak_key_slots["default/solo"], 1, "never two at once");
    }
}

/// Output memory is reserved as output arrives: a running execution holds
/// one step (64 KiB), not six times its key's output cap (6 MiB here).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_running_execution_holds_one_step_of_output_memory_not_its_worst_case() {
    let g = gateway().await;
    let app = g.app.clone();
    let hold = tokio::spawn(async move { app.oneshot(execute_request(GOOD, r#"{"code":"hang"}"#)).await });
    eventually("the execution runs", || g.agent_calls() == 1).await;
    assert_eq!(g.state.service.budget.reserved_bytes(), warren_api_gateway::budget::STEP);
    hold.abort();
    eventually("it is given back", || g.state.service.budget.reserved_bytes() == 0).await;
    // 1 MiB of output grows it as it comes, and what the result holds stays within it.
    let a = g.execute(GOOD, json!({"code": "mib"})).await;
    assert_eq!((a.status, a.json()["stdout"].as_str().map(str::len), a.json()["stdout_truncated"].as_bool()), (StatusCode::OK, Some(1 << 20), Some(false)));
}

/// The gateway's output memory taken by other keys' executions: output
/// that cannot get memory within the wait is cut there and flagged
/// truncated — in plain and streamed results alike — and what the result
/// holds stays within what was reserved. The call still answers 200.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn output_that_cannot_get_memory_is_cut_and_flagged_truncated() {
    let g = gateway().await;
    let budget = g.state.service.budget.clone();
    let step = warren_api_gateway::budget::STEP;
    let _a = budget.reserve("other/a", 32 << 20, Duration::ZERO).await.unwrap();
    let _b = budget.reserve("other/b", (32 << 20) - step, Duration::ZERO).await.unwrap();
    for stream in [false, true] {
        let mut req = execute_request(GOOD, r#"{"code":"mib"}"#);
        if stream {
            req.headers_mut().insert("accept", "application/x-ndjson".parse().unwrap());
        }
        let a = g.send(req).await;
        assert_eq!(a.status, StatusCode::OK, "{stream}");
        let result = if stream { a.lines().last().unwrap()["result"].clone() } else { a.json() };
        let out = result["stdout"].as_str().unwrap();
        assert_eq!(result["stdout_truncated"], true, "{stream}");
        assert!(out.len() as u64 * 2 + 2 <= step, "{stream}: held {} bytes of a {step}-byte reservation", out.len());
    }
    eventually("only the others' reservations are left", || budget.reserved_bytes() == (64 << 20) - step).await;
}
