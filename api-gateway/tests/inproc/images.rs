//! Sandboxes on OCI images at the gateway: placement prefers a node where
//! the image is warm, any node otherwise; a node still pulling answers 503
//! with Retry-After.

use axum::http::StatusCode;
use serde_json::json;

use crate::{gateway_of, FakeAgent, IMAGE, IMG};

#[tokio::test]
async fn calls_go_to_a_node_where_the_image_is_warm_else_to_any() {
    let cold = FakeAgent { capacity: 8, name: Some("cold"), ..Default::default() };
    let warm = FakeAgent { capacity: 8, name: Some("warm"), images: vec![IMAGE], ..Default::default() };
    let g = gateway_of(vec![cold, warm]).await;
    for _ in 0..6 {
        let a = g.execute(IMG, json!({"code": "print(1)"})).await;
        assert_eq!(a.status, StatusCode::OK, "{}", a.error());
    }
    assert_eq!(g.agent.seen.lock().unwrap().executes.len(), 0, "the cold node gets nothing while the warm one has room");
    let sent = g.others[0].seen.lock().unwrap().executes.clone();
    assert_eq!(sent.len(), 6);
    assert!(sent.iter().all(|r| r.image == IMAGE && r.image_digest.is_empty()), "single-machine mode: the agent resolves the tag");

    // No node has it warm (or the warm one is full): any node takes it and pulls.
    let full = FakeAgent { capacity: 0, name: Some("full"), images: vec![IMAGE], ..Default::default() };
    let other = FakeAgent { capacity: 8, name: Some("other"), ..Default::default() };
    let g = gateway_of(vec![full, other]).await;
    assert_eq!(g.execute(IMG, json!({"code": "print(1)"})).await.status, StatusCode::OK);
    assert_eq!(g.others[0].seen.lock().unwrap().executes.len(), 1);
}

#[tokio::test]
async fn an_image_still_pulling_is_503_with_retry_after_and_a_broken_one_says_why() {
    let g = gateway_of(vec![FakeAgent { capacity: 8, ..Default::default() }]).await;
    let a = g.execute(IMG, json!({"code": "refuse:pulling"})).await;
    assert_eq!(a.status, StatusCode::SERVICE_UNAVAILABLE);
    assert_eq!(a.headers.get("retry-after").and_then(|v| v.to_str().ok()), Some("5"));
    assert!(a.json()["message"].as_str().unwrap().contains("being pulled"), "{:?}", a.json());
    let a = g.execute(IMG, json!({"code": "refuse:image"})).await;
    assert_eq!(a.status, StatusCode::SERVICE_UNAVAILABLE);
    assert!(a.json()["message"].as_str().unwrap().contains("registry: manifest unknown"), "{:?}", a.json());
}
