//! Reconcilers against a mocked API server (the controller-rs way): the
//! client's HTTP service is a `tower_test` pair, and each scenario answers
//! the requests it expects, in order, asserting method, path and body. No
//! cluster, no root; the same behaviour on a real API server is in
//! `tests/tests/cluster.rs`.

use std::collections::BTreeSet;
use std::sync::Arc;

use http::{Request, Response};
use kube::client::Body;
use kube::Client;
use serde_json::{json, Value};
use warren_config::consumable::SecretScope;
use warren_config::types::Connector;
use warren_operator::context::Context;

type Handle = tower_test::mock::Handle<Request<Body>, Response<Body>>;

/// A Context whose client talks to the returned handle.
fn context(tenants: &[&str]) -> (Arc<Context>, Handle) {
    let (service, handle) = tower_test::mock::pair::<Request<Body>, Response<Body>>();
    let client = Client::new(service, "default");
    let scope = SecretScope::Namespaces(tenants.iter().map(|s| s.to_string()).collect::<BTreeSet<_>>());
    let ctx = Context::new(client, "warren-keys".into(), "warren-system".into(), "app=agent".into(), None).with_secret_scope(scope);
    (Arc::new(ctx), handle)
}

fn connector(ns: &str, status: Option<Value>) -> Arc<Connector> {
    let mut v = json!({
        "apiVersion": "warren.dev/v1alpha1", "kind": "Connector",
        "metadata": {"name": "gh", "namespace": ns, "generation": 3, "uid": "u-1"},
        "spec": {"type": "GitHub", "credentialsSecretRef": {"name": "gh-creds"}},
    });
    if let Some(s) = status {
        v["status"] = s;
    }
    Arc::new(serde_json::from_value(v).unwrap())
}

/// The next request: its method, path (query dropped) and JSON body.
async fn next(handle: &mut Handle) -> (String, String, Value, tower_test::mock::SendResponse<Response<Body>>) {
    let (req, send) = tokio::time::timeout(std::time::Duration::from_secs(10), handle.next_request()).await.expect("the reconciler made no further request").expect("the client is gone");
    let (parts, body) = req.into_parts();
    let bytes = http_body_util::BodyExt::collect(body).await.unwrap().to_bytes();
    let body = if bytes.is_empty() { Value::Null } else { serde_json::from_slice(&bytes).unwrap() };
    (parts.method.to_string(), parts.uri.path().to_string(), body, send)
}

fn answer(send: tower_test::mock::SendResponse<Response<Body>>, status: u16, body: Value) {
    send.send_response(Response::builder().status(status).header("content-type", "application/json").body(Body::from(serde_json::to_vec(&body).unwrap())).unwrap());
}

/// The next request, which must be `method` on `path`: its body and the
/// way to answer it.
async fn expect(handle: &mut Handle, method: &str, path: &str) -> (Value, tower_test::mock::SendResponse<Response<Body>>) {
    let (m, p, body, send) = next(handle).await;
    assert_eq!((m.as_str(), p.as_str()), (method, path), "unexpected request");
    (body, send)
}

/// Answers an event POST (best effort in the reconciler) with 201.
async fn event(handle: &mut Handle, reason: &str) {
    let (method, path, body, send) = next(handle).await;
    assert_eq!(method, "POST", "{path}");
    assert!(path.ends_with("/events"), "{path}");
    assert_eq!(body["reason"], reason, "{body}");
    answer(send, 201, body);
}

/// Answers a status patch as the API server does: the whole object, with
/// the status written.
fn answer_status<K: serde::Serialize>(send: tower_test::mock::SendResponse<Response<Body>>, obj: &K, body: &Value) {
    let mut whole = serde_json::to_value(obj).unwrap();
    whole["status"] = body["status"].clone();
    answer(send, 200, whole);
}

/// A status patch: server-side apply of the Ready condition only.
fn ready_of(body: &Value) -> (String, String, String, i64) {
    let c = &body["status"]["conditions"][0];
    (c["status"].as_str().unwrap().into(), c["reason"].as_str().unwrap().into(), c["message"].as_str().unwrap().into(), body["status"]["observedGeneration"].as_i64().unwrap())
}

/// The attack from #26, below the API server: a Connector in a namespace
/// that is not a tenant namespace names a Secret. The operator does not
/// even read it: the only requests are the status patch and the event.
#[tokio::test]
async fn a_secret_outside_the_tenant_namespaces_is_never_read() {
    let (ctx, mut handle) = context(&["team-a"]);
    let cn = connector("other-team", None);
    let run = tokio::spawn(warren_operator::credentials::connector(cn.clone(), ctx));
    let (body, send) = expect(&mut handle, "PATCH", "/apis/warren.dev/v1alpha1/namespaces/other-team/connectors/gh/status").await; // the first request must be the status, not a Secret read
    let (status, reason, message, generation) = ready_of(&body);
    assert_eq!((status.as_str(), reason.as_str(), generation), ("False", "SecretNotConsumable", 3));
    assert!(message.contains("not a tenant namespace"), "{message}");
    answer_status(send, cn.as_ref(), &body);
    event(&mut handle, "SecretNotConsumable").await;
    run.await.unwrap().expect("reconciled");
}

/// A labelled Secret holding the entries: read once, Ready=True written,
/// and the entry's value never appears in what the operator writes.
#[tokio::test]
async fn a_complete_consumable_secret_makes_the_connector_ready() {
    let (ctx, mut handle) = context(&["team-a"]);
    let cn = connector("team-a", None);
    let run = tokio::spawn(warren_operator::credentials::connector(cn.clone(), ctx));
    let (_, send) = expect(&mut handle, "GET", "/api/v1/namespaces/team-a/secrets/gh-creds").await;
    answer(
        send,
        200,
        json!({"apiVersion": "v1", "kind": "Secret", "metadata": {"name": "gh-creds", "namespace": "team-a", "labels": {"warren.dev/consumable": "true"}}, "data": {"token": "Z2hwLXNlY3JldC12YWx1ZQ=="}}),
    );
    let (body, send) = expect(&mut handle, "PATCH", "/apis/warren.dev/v1alpha1/namespaces/team-a/connectors/gh/status").await;
    let (status, reason, message, _) = ready_of(&body);
    assert_eq!((status.as_str(), reason.as_str()), ("True", "Valid"), "{message}");
    assert!(!body.to_string().contains("ghp-secret-value") && !body.to_string().contains("Z2hwLXNlY3JldC12YWx1ZQ"), "the Secret's value leaked into the status: {body}");
    answer_status(send, cn.as_ref(), &body);
    event(&mut handle, "Valid").await;
    run.await.unwrap().expect("reconciled");
}

/// Re-applying the same manifests writes nothing: with the same Ready
/// condition already in status, the reconcile reads the Secret and stops.
#[tokio::test]
async fn an_unchanged_verdict_writes_nothing() {
    let (ctx, mut handle) = context(&["team-a"]);
    let status = json!({"observedGeneration": 3, "conditions": [{
        "type": "Ready", "status": "False", "reason": "SecretNotFound", "message": "Secret gh-creds not found in namespace team-a",
        "observedGeneration": 3, "lastTransitionTime": "2026-01-01T00:00:00Z"}]});
    let run = tokio::spawn(warren_operator::credentials::connector(connector("team-a", Some(status)), ctx));
    let (_, send) = expect(&mut handle, "GET", "/api/v1/namespaces/team-a/secrets/gh-creds").await;
    answer(send, 404, json!({"kind": "Status", "apiVersion": "v1", "status": "Failure", "reason": "NotFound", "code": 404, "message": "secrets \"gh-creds\" not found"}));
    run.await.unwrap().expect("reconciled");
    // The reconcile is over; it made no other request.
    assert!(tokio::time::timeout(std::time::Duration::from_millis(50), handle.next_request()).await.map_or(true, |r| r.is_none()), "an unchanged status was written again");
}

/// An API server error fails the reconcile (it is retried with backoff)
/// and writes no verdict built on a guess.
#[tokio::test]
async fn an_api_server_error_fails_the_reconcile_without_a_verdict() {
    let (ctx, mut handle) = context(&["team-a"]);
    let run = tokio::spawn(warren_operator::credentials::connector(connector("team-a", None), ctx));
    let (_, path, _, send) = next(&mut handle).await;
    assert_eq!(path, "/api/v1/namespaces/team-a/secrets/gh-creds");
    answer(send, 500, json!({"kind": "Status", "apiVersion": "v1", "status": "Failure", "reason": "InternalError", "code": 500, "message": "etcd is down"}));
    assert!(run.await.unwrap().is_err(), "a failed read must fail the reconcile");
    assert!(tokio::time::timeout(std::time::Duration::from_millis(50), handle.next_request()).await.map_or(true, |r| r.is_none()), "a status was written after a failed read");
}

fn sandbox(image: &str) -> Arc<warren_api::Sandbox> {
    let v = json!({
        "apiVersion": "warren.dev/v1alpha1", "kind": "Sandbox",
        "metadata": {"name": "default", "namespace": "team-a", "generation": 2, "uid": "u-2"},
        "spec": {"image": image, "languages": ["python", "bash"]},
    });
    Arc::new(serde_json::from_value(v).unwrap())
}

fn pod(name: &str, node: &str, phase: &str) -> Value {
    json!({"metadata": {"name": name, "namespace": "warren-system"}, "spec": {"nodeName": node, "containers": []}, "status": {"phase": phase, "podIP": "10.0.0.1"}})
}

/// A `host` Sandbox is warm wherever an agent runs: the operator lists the
/// agent pods by the chart's selector and records the running ones' nodes.
#[tokio::test]
async fn a_host_sandbox_is_ready_on_the_nodes_running_an_agent() {
    let (ctx, mut handle) = context(&["team-a"]);
    let sb = sandbox("host");
    let run = tokio::spawn(warren_operator::sandbox::sandbox(sb.clone(), ctx));
    let (_, send) = expect(&mut handle, "GET", "/api/v1/namespaces/warren-system/pods").await;
    answer(send, 200, json!({"apiVersion": "v1", "kind": "PodList", "metadata": {}, "items": [pod("a", "node-b", "Running"), pod("b", "node-a", "Running"), pod("c", "node-c", "Pending")]}));
    let (body, send) = expect(&mut handle, "PATCH", "/apis/warren.dev/v1alpha1/namespaces/team-a/sandboxes/default/status").await;
    let (status, reason, _, generation) = ready_of(&body);
    assert_eq!((status.as_str(), reason.as_str(), generation), ("True", "Valid", 2));
    assert_eq!(body["status"]["warmNodes"], json!(["node-a", "node-b"]), "running agents only, sorted: {body}");
    assert_eq!(body["status"]["languages"], json!(["python", "bash"]), "{body}");
    answer_status(send, sb.as_ref(), &body);
    event(&mut handle, "Valid").await;
    run.await.unwrap().expect("reconciled");
}

/// An OCI Sandbox when the operator holds no node-agent credentials: it
/// says so (ImagePullFailed) and asks nothing of the agents.
#[tokio::test]
async fn an_oci_sandbox_without_agent_credentials_says_why_it_cannot_warm() {
    let (ctx, mut handle) = context(&["team-a"]);
    let sb = sandbox("registry.example.com/team/runtime:1");
    let run = tokio::spawn(warren_operator::sandbox::sandbox(sb.clone(), ctx));
    let (body, send) = expect(&mut handle, "PATCH", "/apis/warren.dev/v1alpha1/namespaces/team-a/sandboxes/default/status").await; // no pod listing, no pull secret read
    let (status, reason, message, _) = ready_of(&body);
    assert_eq!((status.as_str(), reason.as_str()), ("False", "ImagePullFailed"));
    assert!(message.contains("no node-agent credentials"), "{message}");
    answer_status(send, sb.as_ref(), &body);
    event(&mut handle, "ImagePullFailed").await;
    run.await.unwrap().expect("reconciled");
}

fn apikey(ns: &str) -> Arc<warren_config::types::ApiKey> {
    let v = json!({
        "apiVersion": "warren.dev/v1alpha1", "kind": "ApiKey",
        // The finalizer is already there: the reconcile goes straight to apply.
        "metadata": {"name": "agent", "namespace": ns, "generation": 1, "uid": "u-3", "finalizers": ["warren.dev/withdraw-key"]},
        "spec": {"sandboxRef": {"name": "default"}},
    });
    Arc::new(serde_json::from_value(v).unwrap())
}

fn not_found(what: &str) -> Value {
    json!({"kind": "Status", "apiVersion": "v1", "status": "Failure", "reason": "NotFound", "code": 404, "message": format!("{what} not found")})
}

/// Answers the list of the namespace's ApiKeys (for the shared-Secret
/// check) with just `key`.
async fn list_keys(handle: &mut Handle, key: &warren_config::types::ApiKey) {
    let (method, path, _, send) = next(handle).await;
    assert_eq!((method.as_str(), path.as_str()), ("GET", format!("/apis/warren.dev/v1alpha1/namespaces/{}/apikeys", key.metadata.namespace.as_deref().unwrap()).as_str()));
    answer(send, 200, json!({"apiVersion": "warren.dev/v1alpha1", "kind": "ApiKeyList", "metadata": {}, "items": [serde_json::to_value(key).unwrap()]}));
}

/// The published key is withdrawn (already absent: 404 is fine).
async fn withdrawn(handle: &mut Handle, ns: &str) {
    let (method, path, _, send) = next(handle).await;
    assert_eq!((method.as_str(), path.as_str()), ("DELETE", format!("/api/v1/namespaces/warren-keys/secrets/{}", warren_config::published::secret_name(ns, "agent")).as_str()));
    answer(send, 404, not_found("secret"));
}

/// An ApiKey outside the tenant namespaces: its Secret is neither read nor
/// generated, anything published for it is withdrawn, and it says why.
#[tokio::test]
async fn an_apikey_outside_the_tenant_namespaces_gets_no_key() {
    let (ctx, mut handle) = context(&["team-a"]);
    let key = apikey("other-team");
    let run = tokio::spawn(warren_operator::apikey::reconcile(key.clone(), ctx));
    list_keys(&mut handle, &key).await;
    withdrawn(&mut handle, "other-team").await;
    let (body, send) = expect(&mut handle, "PATCH", "/apis/warren.dev/v1alpha1/namespaces/other-team/apikeys/agent/status").await; // no Secret read or created first
    let (status, reason, message, _) = ready_of(&body);
    assert_eq!((status.as_str(), reason.as_str()), ("False", "SecretNotConsumable"), "{message}");
    answer_status(send, key.as_ref(), &body);
    event(&mut handle, "SecretNotConsumable").await;
    run.await.unwrap().expect("reconciled");
}

/// A key without a Secret gets one generated: owned by the ApiKey, marked
/// consumable, holding a well-formed key and a webhook secret. Its Sandbox
/// missing, nothing is published and the status names the Sandbox, and
/// never the key.
#[tokio::test]
async fn a_missing_key_is_generated_into_an_owned_secret() {
    let (ctx, mut handle) = context(&["team-a"]);
    let key = apikey("team-a");
    let run = tokio::spawn(warren_operator::apikey::reconcile(key.clone(), ctx));
    list_keys(&mut handle, &key).await;
    let (_, send) = expect(&mut handle, "GET", "/api/v1/namespaces/team-a/secrets/agent-key").await;
    answer(send, 404, not_found("secret"));
    let (created, send) = expect(&mut handle, "POST", "/api/v1/namespaces/team-a/secrets").await;
    assert_eq!(created["metadata"]["name"], "agent-key");
    assert_eq!(created["metadata"]["labels"]["warren.dev/consumable"], "true");
    let owner = &created["metadata"]["ownerReferences"][0];
    assert_eq!((owner["uid"].as_str(), owner["controller"].as_bool(), owner["kind"].as_str()), (Some("u-3"), Some(true), Some("ApiKey")));
    let value = {
        use base64::Engine as _;
        String::from_utf8(base64::engine::general_purpose::STANDARD.decode(created["data"]["key"].as_str().unwrap()).unwrap()).unwrap()
    };
    assert!(value.starts_with("sk-wrn-") && value.len() >= 7 + 32 && value[7..].chars().all(|c| c.is_ascii_alphanumeric()), "{value}");
    assert!(created["data"][warren_config::WEBHOOK_SECRET_ENTRY].is_string(), "{created}");
    answer(send, 201, created.clone());
    let (_, send) = expect(&mut handle, "GET", "/apis/warren.dev/v1alpha1/namespaces/team-a/sandboxes/default").await;
    answer(send, 404, not_found("sandbox"));
    let (_, send) = expect(&mut handle, "GET", "/api/v1/namespaces/team-a").await;
    answer(send, 200, json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "team-a"}}));
    withdrawn(&mut handle, "team-a").await;
    let (body, send) = expect(&mut handle, "PATCH", "/apis/warren.dev/v1alpha1/namespaces/team-a/apikeys/agent/status").await;
    let (status, reason, message, _) = ready_of(&body);
    assert_eq!((status.as_str(), reason.as_str()), ("False", "SandboxNotFound"), "{message}");
    assert!(!body.to_string().contains(&value[7..]), "the key leaked into the status: {body}");
    answer_status(send, key.as_ref(), &body);
    event(&mut handle, "SandboxNotFound").await;
    run.await.unwrap().expect("reconciled");
}

fn storage_connection(ns: &str, spec: Value) -> Arc<warren_api::StorageConnection> {
    let v = json!({
        "apiVersion": "warren.dev/v1alpha1", "kind": "StorageConnection",
        "metadata": {"name": "lake", "namespace": ns, "generation": 2, "uid": "u-5"},
        "spec": spec,
    });
    Arc::new(serde_json::from_value(v).unwrap())
}

/// A consumable S3 credentials Secret (`accessKeyId` only when `complete` is false).
fn s3_secret(complete: bool) -> Value {
    let mut data = json!({"accessKeyId": "QUtJQQ=="});
    if complete {
        data["secretAccessKey"] = json!("czNjcjN0LXZhbHVl");
    }
    json!({"apiVersion": "v1", "kind": "Secret", "metadata": {"name": "lake-creds", "namespace": "team-a", "labels": {"warren.dev/consumable": "true"}}, "data": data})
}

/// The StorageConnection's verdict after its Secret was read: the Ready
/// condition patched, then its event.
async fn storage_verdict(handle: &mut Handle, sc: &warren_api::StorageConnection, secret: Value) -> (String, String, String) {
    let (_, send) = expect(handle, "GET", "/api/v1/namespaces/team-a/secrets/lake-creds").await;
    answer(send, 200, secret);
    let (body, send) = expect(handle, "PATCH", "/apis/warren.dev/v1alpha1/namespaces/team-a/storageconnections/lake/status").await;
    let (status, reason, message, generation) = ready_of(&body);
    assert_eq!(generation, 2);
    assert!(!body.to_string().contains("czNjcjN0") && !body.to_string().contains("s3cr3t-value"), "the Secret's value leaked into the status: {body}");
    answer_status(send, sc, &body);
    event(handle, &reason).await;
    (status, reason, message)
}

/// The operator's probe is a request from inside the cluster: a tenant
/// aiming it at the operator's own loopback learns nothing and reaches
/// nothing. The endpoint is refused before any connection (the listener
/// on that port sees none).
#[tokio::test]
async fn a_storage_connection_aimed_at_the_operators_loopback_is_refused_unprobed() {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    listener.set_nonblocking(true).unwrap();
    let endpoint = format!("http://127.0.0.1:{}", listener.local_addr().unwrap().port());
    let (ctx, mut handle) = context(&["team-a"]);
    let sc = storage_connection("team-a", json!({"provider": "S3", "bucket": "b", "endpoint": endpoint, "credentialsSecretRef": {"name": "lake-creds"}}));
    let run = tokio::spawn(warren_operator::credentials::storage(sc.clone(), ctx));
    let (status, reason, message) = storage_verdict(&mut handle, &sc, s3_secret(true)).await;
    assert_eq!((status.as_str(), reason.as_str()), ("False", "InvalidSpec"), "{message}");
    assert!(message.contains("loopback"), "{message}");
    run.await.unwrap().expect("reconciled");
    assert!(matches!(listener.accept(), Err(e) if e.kind() == std::io::ErrorKind::WouldBlock), "the probe connected to the refused endpoint");
}

/// A Secret without every entry its provider needs: not Ready, the
/// missing entry named, no probe.
#[tokio::test]
async fn a_storage_secret_missing_an_entry_names_it() {
    let (ctx, mut handle) = context(&["team-a"]);
    let sc = storage_connection("team-a", json!({"provider": "S3", "bucket": "b", "credentialsSecretRef": {"name": "lake-creds"}}));
    let run = tokio::spawn(warren_operator::credentials::storage(sc.clone(), ctx));
    let (status, reason, message) = storage_verdict(&mut handle, &sc, s3_secret(false)).await;
    assert_eq!((status.as_str(), reason.as_str()), ("False", "SecretIncomplete"));
    assert!(message.contains("secretAccessKey"), "{message}");
    run.await.unwrap().expect("reconciled");
}

/// With an admin's grant for loopback, a store nobody answers for is
/// probed and reported unreachable (a real store's answers are in
/// `tests/tests/storage_mounts.rs`).
#[tokio::test]
async fn an_allowed_store_that_does_not_answer_is_unreachable() {
    let closed = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
    let (service, mut handle) = tower_test::mock::pair::<Request<Body>, Response<Body>>();
    let scope = SecretScope::Namespaces(["team-a".to_string()].into());
    let loopback = Arc::new(warren_core::reach::EndpointPolicy::new(&["127.0.0.0/8".into()], vec![]).unwrap());
    let ctx = Context::new(Client::new(service, "default"), "warren-keys".into(), "warren-system".into(), "app=agent".into(), None).with_secret_scope(scope).with_endpoints(loopback);
    let sc = storage_connection("team-a", json!({"provider": "S3", "bucket": "b", "endpoint": format!("http://127.0.0.1:{closed}"), "credentialsSecretRef": {"name": "lake-creds"}}));
    let run = tokio::spawn(warren_operator::credentials::storage(sc.clone(), Arc::new(ctx)));
    let (status, reason, message) = storage_verdict(&mut handle, &sc, s3_secret(true)).await;
    assert_eq!((status.as_str(), reason.as_str()), ("False", "StoreUnreachable"), "{message}");
    run.await.unwrap().expect("reconciled");
}

/// A Local directory is each node's to check: Ready without a Secret read
/// or a probe.
#[tokio::test]
async fn a_local_directory_is_valid_without_a_probe() {
    let (ctx, mut handle) = context(&["team-a"]);
    let sc = storage_connection("team-a", json!({"provider": "Local", "bucket": "/srv/data"}));
    let run = tokio::spawn(warren_operator::credentials::storage(sc.clone(), ctx));
    let (body, send) = expect(&mut handle, "PATCH", "/apis/warren.dev/v1alpha1/namespaces/team-a/storageconnections/lake/status").await;
    let (status, reason, message, _) = ready_of(&body);
    assert_eq!((status.as_str(), reason.as_str()), ("True", "Valid"), "{message}");
    answer_status(send, sc.as_ref(), &body);
    event(&mut handle, "Valid").await;
    run.await.unwrap().expect("reconciled");
}

/// The publish path: a key whose Secret and `host` Sandbox exist is
/// compiled and published to the gateways' namespace by server-side apply,
/// and only a hash of the key travels there; the status says Published.
#[tokio::test]
async fn a_complete_key_is_published_as_a_hash() {
    use base64::Engine as _;
    let b64 = |s: &str| base64::engine::general_purpose::STANDARD.encode(s);
    let secret_value = format!("sk-wrn-{}", "Q".repeat(40));
    let (ctx, mut handle) = context(&["team-a"]);
    let key = apikey("team-a");
    let run = tokio::spawn(warren_operator::apikey::reconcile(key.clone(), ctx));
    list_keys(&mut handle, &key).await;
    let (_, send) = expect(&mut handle, "GET", "/api/v1/namespaces/team-a/secrets/agent-key").await;
    let owner = json!([{"apiVersion": "warren.dev/v1alpha1", "kind": "ApiKey", "name": "agent", "uid": "u-3", "controller": true}]);
    answer(send, 200, json!({"apiVersion": "v1", "kind": "Secret",
        "metadata": {"name": "agent-key", "namespace": "team-a", "labels": {"warren.dev/consumable": "true"}, "ownerReferences": owner},
        "data": {"key": b64(&secret_value), warren_config::WEBHOOK_SECRET_ENTRY: b64(&"w".repeat(40))}}));
    let (_, send) = expect(&mut handle, "GET", "/apis/warren.dev/v1alpha1/namespaces/team-a/sandboxes/default").await;
    answer(send, 200, serde_json::to_value(sandbox("host").as_ref()).unwrap());
    let (_, send) = expect(&mut handle, "GET", "/api/v1/namespaces/team-a").await;
    answer(send, 200, json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "team-a"}}));
    let published = format!("/api/v1/namespaces/warren-keys/secrets/{}", warren_config::published::secret_name("team-a", "agent"));
    let (body, send) = expect(&mut handle, "PATCH", &published).await;
    let config = base64::engine::general_purpose::STANDARD.decode(body["data"][warren_config::published::DATA_KEY].as_str().unwrap()).unwrap();
    let config = String::from_utf8(config).unwrap();
    assert!(!config.contains(&secret_value[7..]) && !body.to_string().contains(&b64(&secret_value)), "the key itself was published: {config}");
    assert!(config.contains("\"sandbox\":\"default\""), "{config}");
    assert_eq!(body["metadata"]["labels"][warren_config::published::LABEL], "true");
    answer(send, 200, body.clone());
    let (status, send) = expect(&mut handle, "PATCH", "/apis/warren.dev/v1alpha1/namespaces/team-a/apikeys/agent/status").await;
    let (ready, reason, message, _) = ready_of(&status);
    assert_eq!((ready.as_str(), reason.as_str()), ("True", "Published"), "{message}");
    assert!(!status.to_string().contains(&secret_value[7..]), "the key leaked into the status: {status}");
    answer_status(send, key.as_ref(), &status);
    event(&mut handle, "Published").await;
    run.await.unwrap().expect("reconciled");
}
