//! `DELETE /v1/threads/{id}` through the service to the node.

use axum::body::Body;
use axum::http::Request;

use super::*;

fn delete(key: &str, id: &str) -> Request<Body> {
    Request::delete(format!("/v1/threads/{id}")).header("authorization", format!("Bearer {key}")).body(Body::empty()).unwrap()
}

#[tokio::test]
async fn deleting_a_thread_reaches_its_node_with_the_tenants_reference() {
    let g = gateway().await;
    let a = g.send(delete(GOOD, "t-1")).await;
    assert_eq!(a.status.as_u16(), 204);
    let seen = g.agent.seen.lock().unwrap();
    let r = seen.deletes[0].thread.clone().unwrap();
    assert_eq!((r.namespace.as_str(), r.key_name.as_str(), r.thread_id.as_str()), ("default", "good", "t-1"));
}

#[tokio::test]
async fn the_request_id_is_echoed_and_reaches_the_node() {
    let g = gateway().await;
    let with = |id: &str| {
        let mut r = delete(GOOD, "t-1");
        r.headers_mut().insert("x-request-id", id.parse().unwrap());
        r
    };
    let mine = g.send(with("client-42")).await;
    assert_eq!(mine.headers["x-request-id"], "client-42", "a caller's token is kept");
    let none = g.send(delete(GOOD, "t-1")).await;
    let made = none.headers["x-request-id"].to_str().unwrap().to_string();
    assert!(made.starts_with("req_") && made.len() == 24, "{made}");
    let hostile = g.send(with("a\"b} x=1")).await;
    let replaced = hostile.headers["x-request-id"].to_str().unwrap().to_string();
    assert!(replaced.starts_with("req_") && replaced != made, "a header that could forge log fields is replaced: {replaced}");
    assert_eq!(g.agent.seen.lock().unwrap().delete_traces, ["client-42".to_string(), made, replaced]);
    // Errors carry it too (the id ties a complaint to the log).
    let refused = g.send(Request::delete("/v1/threads/t").body(Body::empty()).unwrap()).await;
    assert_eq!(refused.status.as_u16(), 401);
    assert!(refused.headers["x-request-id"].to_str().unwrap().starts_with("req_"));
}

#[tokio::test]
async fn a_deletion_reaches_every_node() {
    let node = || FakeAgent { capacity: 8, ..Default::default() };
    let g = gateway_of(vec![node(), node(), node()]).await;
    assert_eq!(g.send(delete(GOOD, "t-1")).await.status.as_u16(), 204);
    for (i, a) in std::iter::once(&g.agent).chain(&g.others).enumerate() {
        let seen = a.seen.lock().unwrap();
        assert_eq!(seen.deletes.len(), 1, "node {i} dropped its copy");
        assert_eq!(seen.deletes[0].thread.as_ref().unwrap().thread_id, "t-1");
    }
}

#[tokio::test]
async fn a_thread_its_home_does_not_know_is_deleted_where_it_lives() {
    // Whichever node is a thread's home, the other one holds it: every id
    // must be deleted (204), in both arrangements.
    for forgetful_first in [true, false] {
        let a = FakeAgent { capacity: 8, forgetful: forgetful_first, ..Default::default() };
        let b = FakeAgent { capacity: 8, forgetful: !forgetful_first, ..Default::default() };
        let g = gateway_of(vec![a, b]).await;
        for i in 0..8 {
            let id = format!("t-{i}");
            assert_eq!(g.send(delete(GOOD, &id)).await.status.as_u16(), 204, "{id}");
        }
    }
    // Nobody has it: 404, as before.
    let gone = || FakeAgent { capacity: 8, forgetful: true, ..Default::default() };
    let g = gateway_of(vec![gone(), gone()]).await;
    assert_eq!(g.send(delete(GOOD, "t-1")).await.error(), "not_found");
}

#[tokio::test]
async fn delete_answers_follow_the_agent() {
    let g = gateway().await;
    for (id, status, error) in [("missing", 404, "not_found"), ("running", 409, "thread_busy"), ("store-down", 503, "unavailable")] {
        let a = g.send(delete(GOOD, id)).await;
        assert_eq!((a.status.as_u16(), a.error().as_str()), (status, error), "{id}");
    }
}

#[tokio::test]
async fn a_malformed_thread_id_never_reaches_the_node() {
    let g = gateway().await;
    let a = g.send(delete(GOOD, "-bad")).await;
    assert_eq!((a.status.as_u16(), a.json()["field"].as_str()), (400, Some("thread_id")));
    assert!(g.agent.seen.lock().unwrap().deletes.is_empty());
}

#[tokio::test]
async fn delete_needs_a_key() {
    let g = gateway().await;
    let req = Request::delete("/v1/threads/t").body(Body::empty()).unwrap();
    assert_eq!(g.send(req).await.status.as_u16(), 401);
    assert_eq!(g.send(delete(OFF, "t")).await.status.as_u16(), 403);
}

#[tokio::test]
async fn deleting_a_running_thread_through_this_gateway_is_409() {
    let g = gateway().await;
    let app = g.app.clone();
    let hold = tokio::spawn(async move { app.oneshot(execute_request(GOOD, r#"{"code":"hang","thread_id":"t9"}"#)).await });
    eventually("the execution reaches the node", || g.agent_calls() == 1).await;
    let a = g.send(delete(GOOD, "t9")).await;
    assert_eq!((a.status.as_u16(), a.error().as_str()), (409, "thread_busy"));
    assert!(g.agent.seen.lock().unwrap().deletes.is_empty());
    hold.abort();
}

#[tokio::test]
async fn deleting_with_no_healthy_node_is_503() {
    let g = gateway_with(FakeAgent { down: true, capacity: 1, ..Default::default() }).await;
    let a = g.send(delete(GOOD, "t")).await;
    assert_eq!((a.status.as_u16(), a.error().as_str()), (503, "unavailable"));
}

#[tokio::test]
async fn the_same_thread_id_of_two_keys_is_two_threads() {
    let g = gateway().await;
    assert_eq!(g.send(delete(GOOD, "shared")).await.status.as_u16(), 204);
    assert_eq!(g.send(delete(SOLO, "shared")).await.status.as_u16(), 204);
    let seen = g.agent.seen.lock().unwrap();
    let owners: Vec<String> = seen.deletes.iter().map(|d| d.thread.as_ref().unwrap().key_name.clone()).collect();
    assert_eq!(owners, ["good", "solo"]);
}
