//! The gateway's HTTP API in process: the real router, admission, budget,
//! conversion and error mapping, in front of a scripted node-agent
//! (`fake.rs`). Needs no root, no sockets and no sandbox; the end-to-end
//! suites in `tests/` prove the same paths against real node-agents.

mod fake;
mod e2b;
mod burst;
mod errors;
mod executions;
mod execute;
mod images;
mod stream;
mod threads;

use std::sync::Arc;
use std::time::Duration;

use axum::body::Body;
use axum::http::{Request, StatusCode};
use http_body_util::BodyExt;
use tower::ServiceExt;
use warren_api_gateway::{auth::KeyStore, budget::OutputBudget, exec::ExecutionService, nodes::Nodes, records, http, state};
use warren_api_gateway::exec::keyslot::counted_as;
use warren_proto::client::AgentAddress;

pub use fake::{eventually, FakeAgent};

/// Keys of the test configuration.
pub const GOOD: &str = "sk-wrn-AAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA";
pub const SOLO: &str = "sk-wrn-SSSSSSSSSSSSSSSSSSSSSSSSSSSSSSSSSSSS";
pub const OFF: &str = "sk-wrn-DDDDDDDDDDDDDDDDDDDDDDDDDDDDDDDDDDDD";
pub const BIG: &str = "sk-wrn-BBBBBBBBBBBBBBBBBBBBBBBBBBBBBBBBBBBB";
pub const IMG: &str = "sk-wrn-IIIIIIIIIIIIIIIIIIIIIIIIIIIIIIIIIIII";
pub const FEW: &str = "sk-wrn-FFFFFFFFFFFFFFFFFFFFFFFFFFFFFFFFFFFF";
/// The OCI image of Sandbox `img`.
pub const IMAGE: &str = "127.0.0.1:5000/warren/runtime:1";

const MANIFESTS: &str = r#"
apiVersion: warren.dev/v1alpha1
kind: Sandbox
metadata: {name: sb}
spec:
  image: host
  languages: [python, bash]
  resources: {cpu: "1", pids: 64}
  maxTimeoutSeconds: 60
  threadMaxSize: 1Gi
  env: [{name: A, value: sandbox}, {name: B, value: sandbox}]
---
apiVersion: warren.dev/v1alpha1
kind: Sandbox
metadata: {name: big}
spec: {image: host, maxOutputBytes: 64Mi}
---
apiVersion: warren.dev/v1alpha1
kind: ApiKey
metadata: {name: good}
spec:
  sandboxRef: {name: sb}
  secretRef: {name: good}
  maxTimeoutSeconds: 30
  env: [{name: B, value: key}]
---
apiVersion: warren.dev/v1alpha1
kind: ApiKey
metadata: {name: solo}
spec: {sandboxRef: {name: sb}, secretRef: {name: solo}, maxConcurrency: 1}
---
apiVersion: warren.dev/v1alpha1
kind: ApiKey
metadata: {name: off}
spec: {sandboxRef: {name: sb}, secretRef: {name: off}, disabled: true}
---
apiVersion: warren.dev/v1alpha1
kind: ApiKey
metadata: {name: big}
spec: {sandboxRef: {name: big}, secretRef: {name: big}, auditScope: Namespace}
---
apiVersion: warren.dev/v1alpha1
kind: Sandbox
metadata: {name: img}
spec: {image: "127.0.0.1:5000/warren/runtime:1"}
---
apiVersion: warren.dev/v1alpha1
kind: ApiKey
metadata: {name: img}
spec: {sandboxRef: {name: img}, secretRef: {name: img}}
---
apiVersion: warren.dev/v1alpha1
kind: ApiKey
metadata: {name: few}
spec: {sandboxRef: {name: sb}, secretRef: {name: few}, maxThreads: 2, maxLiveSandboxes: 1, maxLiveSeconds: 600}
"#;

fn secrets() -> String {
    [("good", GOOD), ("solo", SOLO), ("off", OFF), ("big", BIG), ("img", IMG), ("few", FEW)]
        .iter()
        .map(|(n, k)| format!("---\napiVersion: v1\nkind: Secret\nmetadata: {{name: {n}}}\nstringData: {{key: {k}}}\n"))
        .collect()
}

/// One gateway in process and the fake behind it.
pub struct Gateway {
    pub app: axum::Router,
    pub agent: FakeAgent,
    /// Further nodes, when the gateway has more than one.
    pub others: Vec<FakeAgent>,
    pub state: state::AppState,
    /// Holds the record database.
    pub _records: tempfile::TempDir,
}

/// A gateway whose single node is `agent`.
pub async fn gateway_with(agent: FakeAgent) -> Gateway {
    gateway_of(vec![agent]).await
}

/// A gateway with these nodes (the first is `Gateway::agent`).
pub async fn gateway_of(mut agents: Vec<FakeAgent>) -> Gateway {
    let text = format!("{MANIFESTS}{}", secrets());
    let compiled = warren_config::compile(&[warren_config::Source { file: "test.yaml", text: &text }]);
    assert!(compiled.errors.is_empty(), "{:?}", compiled.errors);
    let (_tx, keys) = tokio::sync::watch::channel(Arc::new(KeyStore::new(compiled.keys)));
    // The sender is dropped: the receiver keeps the last value.
    let nodes = Nodes::from_agents(
        agents.iter().enumerate().map(|(i, a)| (AgentAddress::Unix(format!("/fake/agent-{i}.sock").into()), Arc::new(a.clone()) as _)).collect(),
    );
    nodes.check_all().await;
    let dir = tempfile::tempdir().unwrap();
    let store = records::Store::open(&format!("sqlite://{}/records.db", dir.path().display())).await.unwrap();
    store.heartbeat("gw_test", records::now_ms()).await.unwrap();
    let state = state::AppState {
        keys,
        service: ExecutionService {
            nodes,
            admission: Default::default(),
            budget: OutputBudget::new(64 << 20),
            metrics: Default::default(),
            queue_wait: Duration::from_millis(50),
            records: records::Recorder::start(store, "gw_test", 1 << 20),
        },
        settings: state::Settings {
            keepalive: Duration::from_secs(3600),
            stream_stall: Duration::from_secs(3600),
            body_timeout: Duration::from_secs(5),
            upload_min_rate: 64 << 10,
            record_lease: Duration::from_secs(30),
            sandbox_domain: None,
        },
        webhooks: warren_api_gateway::webhook::Webhooks::new(&warren_api_gateway::webhook::Settings {
            allowed: Vec::new(),
            ca_file: None,
            attempts: 1,
            retry_base: Duration::from_millis(10),
            timeout: Duration::from_secs(1),
        })
        .unwrap(),
        files: Arc::new(warren_api_gateway::file_urls::Settings { signing_key: Arc::new(warren_api_gateway::file_urls::key::SigningKey::fixed(b"test")), public_url: None, ttl: Duration::from_secs(60), max_upload: 1 << 20 }),
        uploads: warren_api_gateway::uploads::UploadBudget::new(64 << 20),
        tasks: Default::default(),
    };
    let agent = agents.remove(0);
    Gateway { app: http::app(state.clone()), agent, others: agents, state, _records: dir }
}

/// A gateway with one healthy fake node of capacity 8.
pub async fn gateway() -> Gateway {
    gateway_with(FakeAgent { capacity: 8, ..Default::default() }).await
}

/// A response, read whole.
#[derive(Debug)]
pub struct Answer {
    pub status: StatusCode,
    pub headers: axum::http::HeaderMap,
    pub body: Vec<u8>,
}

impl Answer {
    pub fn json(&self) -> serde_json::Value {
        serde_json::from_slice(&self.body).unwrap_or_else(|e| panic!("not JSON ({e}): {}", String::from_utf8_lossy(&self.body)))
    }

    /// The error code of an error body.
    pub fn error(&self) -> String {
        self.json()["error"].as_str().unwrap_or_default().to_string()
    }

    /// NDJSON lines.
    pub fn lines(&self) -> Vec<serde_json::Value> {
        self.body.split(|b| *b == b'\n').filter(|l| !l.is_empty()).map(|l| serde_json::from_slice(l).unwrap()).collect()
    }
}

impl Gateway {
    /// The same gateway (same state) with other request-path settings.
    pub fn with_settings(mut self, f: impl FnOnce(&mut state::Settings)) -> Gateway {
        f(&mut self.state.settings);
        self.app = http::app(self.state.clone());
        self
    }

    pub async fn send(&self, req: Request<Body>) -> Answer {
        let resp = self.app.clone().oneshot(req).await.expect("the router is infallible");
        let (parts, body) = resp.into_parts();
        let body = body.collect().await.expect("body").to_bytes().to_vec();
        Answer { status: parts.status, headers: parts.headers, body }
    }

    /// The same gateway with a queue wait of `wait` (50 ms otherwise).
    pub fn with_queue_wait(mut self, wait: Duration) -> Gateway {
        self.state.service.queue_wait = wait;
        self.app = http::app(self.state.clone());
        self
    }

    /// The same gateway with an upload budget of `bytes`.
    pub fn with_upload_budget(mut self, bytes: u64) -> Gateway {
        self.state.uploads = warren_api_gateway::uploads::UploadBudget::new(bytes);
        self.app = http::app(self.state.clone());
        self
    }

    /// `GET path` with `key`.
    pub async fn get(&self, key: &str, path: &str) -> Answer {
        self.send(Request::get(path).header("authorization", format!("Bearer {key}")).body(Body::empty()).unwrap()).await
    }

    /// `POST path` with `key` and no body.
    pub async fn post(&self, key: &str, path: &str) -> Answer {
        self.send(Request::post(path).header("authorization", format!("Bearer {key}")).body(Body::empty()).unwrap()).await
    }

    /// `POST /v1/sandbox/execute` with `key` and a JSON body.
    pub async fn execute(&self, key: &str, body: serde_json::Value) -> Answer {
        self.send(execute_request(key, &body.to_string())).await
    }

    /// The last execute request the agent received.
    pub fn last_live_create(&self) -> warren_proto::agent::LiveCreateRequest {
        self.agent.seen.lock().unwrap().live_creates.last().cloned().expect("a live sandbox was made")
    }

    pub fn last_execute(&self) -> warren_proto::agent::ExecuteRequest {
        self.agent.seen.lock().unwrap().executes.last().cloned().expect("the agent was called")
    }

    /// Execute calls that reached the agent.
    pub fn agent_calls(&self) -> usize {
        self.agent.seen.lock().unwrap().executes.len()
    }
}

/// An execute request with a JSON body.
pub fn execute_request(key: &str, body: &str) -> Request<Body> {
    Request::post("/v1/sandbox/execute")
        .header("authorization", format!("Bearer {key}"))
        .header("content-type", "application/json")
        .body(Body::from(body.to_string()))
        .unwrap()
}
