//! Harness for the gateway: starts the real `warren-gateway` binary against
//! real node-agents, with manifests written to a temporary directory.

use std::io::BufRead;
use std::net::SocketAddr;
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::{bail, Context};

use crate::http::{self, Response};

/// The test keys of [`MANIFESTS`], by ApiKey name.
pub fn key(name: &str) -> String {
    let mut k = format!("sk-wrn-{name}");
    while k.len() < 7 + 40 {
        k.push('X');
    }
    k
}

fn secret(name: &str) -> String {
    format!("apiVersion: v1\nkind: Secret\nmetadata: {{name: {name}-key}}\nstringData: {{key: {}, webhook-secret: {}}}\n---\n", key(name), webhook_secret(name))
}

/// The webhook signing secret of test key `name` (in its Secret).
pub fn webhook_secret(name: &str) -> String {
    format!("whsec_test_{name}_{}", "0".repeat(32))
}

/// Manifests every gateway test starts from.
pub fn manifests() -> String {
    let mut s = String::from(
        "apiVersion: warren.dev/v1alpha1
kind: Sandbox
metadata: {name: sb}
spec:
  image: host
  maxTimeoutSeconds: 60
  maxOutputBytes: 64Ki
  resources: {cpu: '1', memory: 256Mi, pids: 64, tmpSize: 16Mi, homeSize: 16Mi}
  env: [{name: SB_ONLY, value: sandbox}, {name: SHARED, value: sandbox}]
---
apiVersion: warren.dev/v1alpha1
kind: Sandbox
metadata: {name: bash-only}
spec: {image: host, languages: [bash]}
---
apiVersion: warren.dev/v1alpha1
kind: ApiKey
metadata: {name: main}
spec:
  sandboxRef: {name: sb}
  maxConcurrency: 128
  env: [{name: SHARED, value: key}, {name: KEY_ONLY, value: key}]
---
apiVersion: warren.dev/v1alpha1
kind: ApiKey
metadata: {name: single}
spec: {sandboxRef: {name: sb}, maxConcurrency: 1}
---
apiVersion: warren.dev/v1alpha1
kind: ApiKey
metadata: {name: off}
spec: {sandboxRef: {name: sb}, disabled: true}
---
apiVersion: warren.dev/v1alpha1
kind: ApiKey
metadata: {name: short}
spec: {sandboxRef: {name: sb}, maxTimeoutSeconds: 5}
---
apiVersion: warren.dev/v1alpha1
kind: ApiKey
metadata: {name: bashonly}
spec: {sandboxRef: {name: bash-only}}
---
apiVersion: warren.dev/v1alpha1
kind: Sandbox
metadata: {name: threads}
spec:
  image: host
  threadRetention: 24h
  threadMaxSize: 200Mi
  resources: {homeSize: 128Mi}
---
apiVersion: warren.dev/v1alpha1
kind: Sandbox
metadata: {name: tiny-threads}
spec: {image: host, threadMaxSize: 1Mi}
---
apiVersion: warren.dev/v1alpha1
kind: ApiKey
metadata: {name: thr}
spec: {sandboxRef: {name: threads}, maxConcurrency: 64}
---
apiVersion: warren.dev/v1alpha1
kind: ApiKey
metadata: {name: thr2}
spec: {sandboxRef: {name: threads}}
---
apiVersion: warren.dev/v1alpha1
kind: ApiKey
metadata: {name: tiny}
spec: {sandboxRef: {name: tiny-threads}}
---
apiVersion: warren.dev/v1alpha1
kind: ApiKey
metadata: {name: few}
spec: {sandboxRef: {name: threads}, maxThreads: 2}
---
apiVersion: warren.dev/v1alpha1
kind: Sandbox
metadata: {name: loud}
spec: {image: host, languages: [python], maxTimeoutSeconds: 120, maxOutputBytes: 64Mi}
---
apiVersion: warren.dev/v1alpha1
kind: ApiKey
metadata: {name: loud}
spec: {sandboxRef: {name: loud}}
---
apiVersion: warren.dev/v1alpha1
kind: ApiKey
metadata: {name: loud2}
spec: {sandboxRef: {name: loud}}
---
apiVersion: warren.dev/v1alpha1
kind: Sandbox
metadata: {name: net}
spec:
  image: host
  languages: [python]
  network: Unrestricted
  egress:
    allow: [{host: public.test}, {host: other.test}]
---
apiVersion: warren.dev/v1alpha1
kind: ApiKey
metadata: {name: net}
spec: {sandboxRef: {name: net}}
---
apiVersion: warren.dev/v1alpha1
kind: ApiKey
metadata: {name: netnarrow}
spec:
  sandboxRef: {name: net}
  egress: {allow: [{host: public.test, ports: [80]}]}
---
apiVersion: warren.dev/v1alpha1
kind: ApiKey
metadata: {name: netoff}
spec: {sandboxRef: {name: net}, network: Blocked}
---
",
    );
    for k in ["main", "single", "off", "short", "bashonly", "thr", "thr2", "tiny", "few", "loud", "loud2", "net", "netnarrow", "netoff"] {
        s.push_str(&secret(k));
    }
    s
}

/// A running gateway; killed on drop.
pub struct Gateway {
    child: Option<Child>,
    dir: tempfile::TempDir,
    /// Where it serves HTTP.
    pub addr: SocketAddr,
    logs: Arc<Mutex<Vec<String>>>,
}

impl Gateway {
    /// Starts a gateway for `agents` with [`manifests`]; waits until ready
    /// when `wait_ready`.
    pub async fn start(agents: &[String], extra_args: &[&str], wait_ready: bool) -> anyhow::Result<Gateway> {
        Gateway::start_with_env(agents, extra_args, &[], wait_ready).await
    }

    /// [`Gateway::start`] with extra environment (e.g. `KUBECONFIG` for cluster mode).
    pub async fn start_with_env(agents: &[String], extra_args: &[&str], env: &[(&str, &str)], wait_ready: bool) -> anyhow::Result<Gateway> {
        Gateway::start_binary(&crate::bin("warren-gateway"), true, agents, extra_args, env, wait_ready).await
    }

    /// [`Gateway::start_with_env`] with another `warren-gateway` build
    /// (benchmarks compare against a baseline); `records`: it takes
    /// `--records` (builds before execution records do not).
    pub async fn start_binary(bin: &Path, records: bool, agents: &[String], extra_args: &[&str], env: &[(&str, &str)], wait_ready: bool) -> anyhow::Result<Gateway> {
        let dir = tempfile::tempdir()?;
        std::fs::write(dir.path().join("warren.yaml"), manifests())?;
        let mut cmd = Command::new(bin);
        cmd.args(["--listen", "127.0.0.1:0", "--log-format", "json", "--reload-interval-ms", "100", "--health-interval-ms", "200"])
            .arg("--manifests")
            .arg(dir.path())
            .args(extra_args)
            .env("RUST_LOG", "info")
            .envs(env.iter().copied())
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped());
        for a in agents {
            cmd.arg("--agent").arg(a);
        }
        // Its own record database unless the test shares one between gateways.
        if records && !extra_args.contains(&"--records") {
            cmd.arg("--records").arg(format!("sqlite://{}/records.db", dir.path().display()));
        }
        let mut child = cmd.spawn().context("spawning warren-gateway")?;
        let stderr = child.stderr.take().context("stderr")?;
        let logs = Arc::new(Mutex::new(Vec::new()));
        let (tx, rx) = std::sync::mpsc::channel();
        let sink = logs.clone();
        std::thread::spawn(move || {
            for line in std::io::BufReader::new(stderr).lines().map_while(Result::ok) {
                if let Ok(v) = serde_json::from_str::<serde_json::Value>(&line) {
                    if v["message"] == "gateway listening" {
                        let _ = tx.send(v["addr"].as_str().unwrap_or_default().to_string());
                    }
                }
                sink.lock().unwrap().push(line);
            }
        });
        let mut gw = Gateway { child: Some(child), dir, addr: "127.0.0.1:1".parse()?, logs };
        let addr = rx.recv_timeout(Duration::from_secs(20)).context("gateway did not report its address")?;
        gw.addr = addr.parse()?;
        if wait_ready {
            gw.wait_ready(Duration::from_secs(20))?;
        }
        Ok(gw)
    }

    /// Polls `/readyz` until 200.
    pub fn wait_ready(&self, limit: Duration) -> anyhow::Result<()> {
        let t = Instant::now();
        while t.elapsed() < limit {
            if http::get(self.addr, "/readyz").status == 200 {
                return Ok(());
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        bail!("gateway not ready after {limit:?}: {}", http::get(self.addr, "/readyz").text())
    }

    /// The gateway's process id (0 once it was killed).
    pub fn pid(&self) -> u32 {
        self.child.as_ref().map_or(0, std::process::Child::id)
    }

    /// Peak resident memory of the gateway process so far, bytes.
    pub fn peak_rss(&self) -> u64 {
        let pid = self.child.as_ref().map_or(0, std::process::Child::id);
        let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
        status.lines().find_map(|l| l.strip_prefix("VmHWM:")).and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<u64>().ok()).map_or(0, |kb| kb * 1024)
    }

    /// The manifest directory (tests add or change files to exercise reload).
    pub fn manifest_dir(&self) -> &Path {
        self.dir.path()
    }

    /// `POST /v1/sandbox/execute` with `key` and a JSON `body`.
    pub fn execute(&self, key: &str, body: &serde_json::Value) -> Response {
        http::raw(self.addr, &http::execute_request(self.addr, key, body, false)).expect("HTTP request")
    }

    /// `GET path` with the key.
    pub fn get(&self, key: &str, path: &str) -> Response {
        let req = format!("GET {path} HTTP/1.1\r\nHost: {}\r\nConnection: close\r\nAuthorization: Bearer {key}\r\n\r\n", self.addr);
        http::raw(self.addr, req.as_bytes()).expect("HTTP request")
    }

    /// `POST path` with the key and no body.
    pub fn post(&self, key: &str, path: &str) -> Response {
        let req = format!("POST {path} HTTP/1.1\r\nHost: {}\r\nConnection: close\r\nAuthorization: Bearer {key}\r\nContent-Length: 0\r\n\r\n", self.addr);
        http::raw(self.addr, req.as_bytes()).expect("HTTP request")
    }

    /// `POST path` with the key and a JSON `body`.
    pub fn post_json(&self, key: &str, path: &str, body: &serde_json::Value) -> Response {
        let body = body.to_string();
        let req = format!(
            "POST {path} HTTP/1.1\r\nHost: {}\r\nConnection: close\r\nAuthorization: Bearer {key}\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n{body}",
            self.addr,
            body.len()
        );
        http::raw(self.addr, req.as_bytes()).expect("HTTP request")
    }

    /// The execution record `trace` (read with `key_name`'s key) once `done`
    /// holds for it; panics after 30 s. Records of plain calls are written
    /// in the background, so a 404 only means "not yet".
    pub fn record_when(&self, key_name: &str, trace: &str, done: impl Fn(&serde_json::Value) -> bool) -> serde_json::Value {
        self.record_when_with(&key(key_name), trace, done)
    }

    /// [`Gateway::record_when`] read with the API key `api_key` itself.
    pub fn record_when_with(&self, api_key: &str, trace: &str, done: impl Fn(&serde_json::Value) -> bool) -> serde_json::Value {
        let mut last = serde_json::Value::Null;
        let held = wait_for(Duration::from_secs(30), || {
            last = self.get(api_key, &format!("/v1/executions/{trace}")).json();
            done(&last)
        });
        assert!(held, "record {trace} never reached the expected state: {last}");
        last
    }

    /// Kills the gateway (SIGKILL): no drain, no goodbye.
    pub fn kill(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }

    /// `DELETE path` with the key.
    pub fn delete(&self, key: &str, path: &str) -> Response {
        let req = format!("DELETE {path} HTTP/1.1\r\nHost: {}\r\nConnection: close\r\nAuthorization: Bearer {key}\r\n\r\n", self.addr);
        http::raw(self.addr, req.as_bytes()).expect("HTTP request")
    }

    /// The same, streamed: the NDJSON lines.
    pub fn execute_stream(&self, key: &str, body: &serde_json::Value) -> (Response, Vec<serde_json::Value>) {
        let r = http::raw(self.addr, &http::execute_request(self.addr, key, body, true)).expect("HTTP request");
        let lines = if r.status == 200 { http::ndjson(&r) } else { Vec::new() };
        (r, lines)
    }

    /// Every log line so far.
    pub fn logs(&self) -> Vec<String> {
        self.logs.lock().unwrap().clone()
    }

    /// Audit records so far (parsed).
    pub fn audit_records(&self) -> Vec<serde_json::Value> {
        self.logs()
            .iter()
            .filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok())
            .filter(|v| v["target"] == "warren::audit")
            .collect()
    }

    /// Sends SIGTERM.
    pub fn terminate(&self) {
        if let Some(c) = &self.child {
            // SAFETY: signalling our own child by pid.
            #[allow(unsafe_code)]
            unsafe {
                libc::kill(c.id() as i32, libc::SIGTERM);
            }
        }
    }

    /// Waits for exit after [`Gateway::terminate`]; `None` on timeout.
    pub fn wait_exit(&mut self, limit: Duration) -> Option<std::process::ExitStatus> {
        let t = Instant::now();
        while t.elapsed() < limit {
            if let Some(c) = self.child.as_mut() {
                if let Ok(Some(s)) = c.try_wait() {
                    self.child = None;
                    return Some(s);
                }
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        None
    }
}

impl Drop for Gateway {
    fn drop(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

/// Whether an execution record has ended.
pub fn ended(record: &serde_json::Value) -> bool {
    record["status"].as_str().is_some_and(|s| s != "running")
}

/// Polls `cond` every 20 ms until it holds or `limit` passes; returns whether
/// it held. For conditions that become true eventually (a process gone, a
/// file reloaded), never for asserting speed.
pub fn wait_for(limit: Duration, mut cond: impl FnMut() -> bool) -> bool {
    let t = Instant::now();
    loop {
        if cond() {
            return true;
        }
        if t.elapsed() > limit {
            return false;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// Executions the agent is running now.
pub async fn agent_running(agent: &crate::Agent) -> u32 {
    let mut c = agent.client().await.expect("agent client");
    c.status(warren_proto::agent::StatusRequest {}).await.map(|r| r.into_inner().running_executions).unwrap_or(u32::MAX)
}

/// Waits (bounded, 10 s) until the agent runs exactly `n` executions;
/// returns whether it did.
pub async fn wait_agent_running(agent: &crate::Agent, n: u32) -> bool {
    for _ in 0..500 {
        if agent_running(agent).await == n {
            return true;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    false
}

/// Two node-agents, `node-a` and `node-b`, sharing a thread store (a
/// directory, removed with the returned guard), behind one gateway that
/// sees both healthy. Bound in this order, they drop gateway first, store last.
pub async fn two_nodes_sharing_a_store() -> (tempfile::TempDir, [crate::Agent; 2], Gateway) {
    let store_dir = tempfile::tempdir().unwrap();
    let store = format!("dir:{}", store_dir.path().display());
    let agents = [
        crate::Agent::start(&["--node-name", "node-a", "--thread-store", &store]).await.unwrap(),
        crate::Agent::start(&["--node-name", "node-b", "--thread-store", &store]).await.unwrap(),
    ];
    let gw = Gateway::start(&[agents[0].address(), agents[1].address()], &[], true).await.unwrap();
    assert!(wait_for(Duration::from_secs(10), || http::get(gw.addr, "/metrics").text().contains("warren_gateway_healthy_nodes 2")));
    (store_dir, agents, gw)
}
