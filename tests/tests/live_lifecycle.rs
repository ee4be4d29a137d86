//! A live sandbox's life beyond its caller's calls (issue #46): paused when
//! idle past its key's `liveIdleSeconds` (tests/sdk/check_lifecycle.py,
//! the unmodified E2B SDK), `failed` with the reason when its node is lost
//! and resumed on another node from its last save, Banata's statuses in its
//! info, and every step in the activity log with the key.

use std::process::Command;
use std::time::Duration;

use serde_json::{json, Value};
use warren_e2e::gateway::{key, Gateway};
use warren_e2e::http::{request, Response};
use warren_e2e::{skip_unless_root, Agent};

/// The pinned Python SDK (as tests/tests/e2b_sdk.rs pins it).
const PINNED: &str = "e2b==2.63.0 e2b-code-interpreter==2.11.5";

/// An ApiKey of the `threads` Sandbox whose live sandboxes pause after 30 s
/// idle and may have public ports.
fn idle_key_manifest() -> String {
    format!(
        "apiVersion: warren.dev/v1alpha1\nkind: ApiKey\nmetadata: {{name: idle}}\nspec: {{sandboxRef: {{name: threads}}, liveIdleSeconds: 30, publicPorts: true}}\n---\n\
         apiVersion: v1\nkind: Secret\nmetadata: {{name: idle-key}}\nstringData: {{key: {}}}\n",
        key("idle")
    )
}

/// The activity log's entries of sandbox `id` (user, action, object), oldest first.
fn activity(gw: &Gateway, id: &str) -> Vec<(String, String, String)> {
    let db = gw.manifest_dir().join("records.db");
    let script = "import sqlite3, sys, json\n\
                  c = sqlite3.connect(sys.argv[1])\n\
                  rows = c.execute(\"SELECT user_name, action, object FROM warren_console_actions WHERE object LIKE ? ORDER BY at_ms\", ('%' + sys.argv[2] + '%',)).fetchall()\n\
                  print(json.dumps(rows))";
    let out = Command::new("python3").arg("-c").arg(script).arg(&db).arg(id).output().unwrap();
    let rows: Vec<(String, String, String)> = serde_json::from_slice(&out.stdout).unwrap_or_else(|_| panic!("{}", String::from_utf8_lossy(&out.stderr)));
    rows
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_idle_live_sandbox_is_paused_calls_keep_one_running_and_public_ports_need_the_key() {
    if skip_unless_root("an_idle_live_sandbox_is_paused_calls_keep_one_running_and_public_ports_need_the_key") {
        return;
    }
    let venv = warren_e2e::python::venv("e2b-venv", PINNED);
    let agent = Agent::start(&[]).await.unwrap();
    let gw = Gateway::start(&[agent.address()], &[], true).await.unwrap();
    std::fs::write(gw.manifest_dir().join("idle.yaml"), idle_key_manifest()).unwrap();
    let alias = warren_config::key::e2b_alias(&key("idle"));
    assert!(warren_e2e::gateway::wait_for(Duration::from_secs(10), || request(gw.addr, "GET", "/v2/sandboxes", &[("x-api-key", &alias)], b"").status == 200), "the idle key never loaded");
    let url = format!("http://{}", gw.addr);
    let mut cmd = Command::new(venv.join("bin/python"));
    cmd.arg(std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("sdk/check_lifecycle.py"));
    cmd.env("E2B_API_URL", &url).env("E2B_SANDBOX_URL", &url).env("E2B_API_KEY", &alias).env("WARREN_E2B_OTHER_KEY", warren_config::key::e2b_alias(&key("thr"))).env_remove("E2B_DOMAIN").env_remove("E2B_DEBUG");
    let out = tokio::task::spawn_blocking(move || cmd.output()).await.unwrap().unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success() && stdout.contains("ok lifecycle\n"), "{stdout}\n{}\n{:#?}", String::from_utf8_lossy(&out.stderr), gw.logs());
    // The idle pause is in the activity log, by Warren, with the key's sandbox.
    let log = gw.logs().join("\n");
    let id = log.lines().filter(|l| l.contains("idle sandbox paused")).find_map(|l| serde_json::from_str::<Value>(l).ok()).and_then(|v| v["sandbox"].as_str().map(str::to_string)).expect("no idle pause logged");
    let logged = || {
        let rows = activity(&gw, &id);
        let did = |who: &str, action: &str| rows.iter().any(|(u, a, _)| u == who && a == action);
        did("key idle", "sandbox.create") && did("key idle", "sandbox.process") && did("warren", "sandbox.idle-pause") && did("key idle", "sandbox.resume")
    };
    assert!(warren_e2e::gateway::wait_for(Duration::from_secs(10), logged), "{:#?}", activity(&gw, &id));
}

fn bearer(k: &str) -> String {
    format!("Bearer {}", key(k))
}

fn call(gw: &Gateway, method: &str, path: &str, body: &Value) -> Response {
    let auth = bearer("thr");
    request(gw.addr, method, path, &[("authorization", &auth), ("content-type", "application/json")], body.to_string().as_bytes())
}

/// Runs `script` in sandbox `id` (Sandbase's synchronous processes): its stdout.
fn sh(gw: &Gateway, id: &str, script: &str) -> String {
    let r = call(gw, "POST", &format!("/sandboxes/{id}/processes"), &json!({"cmd": "bash", "args": ["-c", script]}));
    assert_eq!(r.status, 200, "{}", r.text());
    assert_eq!(r.json()["exitCode"], 0, "{}", r.text());
    r.json()["stdout"].as_str().unwrap().to_string()
}

/// Which of `agents` runs live sandbox `id` (their own status says).
async fn holder(agents: &[Agent], id: &str) -> Option<usize> {
    for (i, a) in agents.iter().enumerate() {
        let Ok(mut c) = a.client().await else { continue };
        let Ok(s) = c.status(warren_proto::agent::StatusRequest {}).await else { continue };
        if s.into_inner().live.iter().any(|l| l.live.as_ref().and_then(|r| r.r#ref.as_ref()).is_some_and(|t| t.thread_id == id)) {
            return Some(i);
        }
    }
    None
}

/// Two nodes sharing a thread store. A live sandbox whose node dies is
/// `failed` with the reason once the node has been silent for 30 s (not
/// before: a late answer is not a lost node), holds no running slot, and
/// resumes on the other node with its home as last saved (its last pause):
/// what it wrote since is lost with the node, as documented.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_live_sandbox_on_a_lost_node_fails_and_resumes_elsewhere_from_its_last_save() {
    if skip_unless_root("a_live_sandbox_on_a_lost_node_fails_and_resumes_elsewhere_from_its_last_save") {
        return;
    }
    let (_store, mut agents, gw) = warren_e2e::gateway::two_nodes_sharing_a_store().await;
    let created = call(&gw, "POST", "/sandboxes", &json!({"templateID": "base", "timeout": 900}));
    assert_eq!(created.status, 201, "{}", created.text());
    let id = created.json()["sandboxID"].as_str().unwrap().to_string();
    let info = || call(&gw, "GET", &format!("/sandboxes/{id}"), &json!({})).json();
    sh(&gw, &id, "echo saved > ~/a");
    // Paused and resumed: its home is saved with `a`.
    assert_eq!(call(&gw, "POST", &format!("/sandboxes/{id}/pause"), &json!({})).status, 204);
    assert_eq!(info()["status"], "paused");
    assert_eq!(call(&gw, "POST", &format!("/sandboxes/{id}/resume"), &json!({"timeout": 900})).status, 201);
    sh(&gw, &id, "echo unsaved > ~/b");
    assert!(warren_e2e::gateway::wait_for(Duration::from_secs(10), || info()["status"] == "ready"), "{}", info());
    let home = holder(&agents, &id).await.expect("no node runs the sandbox");
    agents[home].kill_hard();
    let lost_at = std::time::Instant::now();
    let mut failed = Value::Null;
    for _ in 0..240 {
        let v = info();
        if v["status"] == "failed" {
            failed = v;
            break;
        }
        assert_eq!(v["state"], "running", "{v}");
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    // Silence counts from the node's last answer, a health check (200 ms here) before the kill.
    assert!(lost_at.elapsed() >= Duration::from_secs(25), "failed long before its node was silent for 30 s: {failed}");
    assert_eq!(failed["state"], "paused", "E2B's SDKs see a failed sandbox as paused (resumable): {failed}");
    assert!(failed["statusReason"].as_str().unwrap_or_default().contains("stopped answering"), "{failed}");
    // The data plane refuses it until it is resumed; resumed, it runs on the
    // surviving node from its last save.
    assert_eq!(call(&gw, "POST", &format!("/sandboxes/{id}/processes"), &json!({"cmd": "true"})).status, 409);
    let resumed = call(&gw, "POST", &format!("/sandboxes/{id}/resume"), &json!({"timeout": 900}));
    assert_eq!(resumed.status, 201, "{}", resumed.text());
    assert_eq!(sh(&gw, &id, "cat ~/a; ls ~/b 2>/dev/null || echo no-b"), "saved\nno-b\n");
    assert_eq!(holder(&agents, &id).await, Some(1 - home));
    assert!(warren_e2e::gateway::wait_for(Duration::from_secs(10), || info()["status"] == "ready"), "{}", info());
    // In the activity log: Warren's verdict with its reason, the key's processes.
    let logged = || {
        let rows = activity(&gw, &id);
        rows.iter().any(|(u, a, o)| u == "warren" && a == "sandbox.failed" && o.contains("stopped answering"))
            && rows.iter().any(|(u, a, o)| u == "key thr" && a == "sandbox.process" && o.contains("echo saved"))
    };
    assert!(warren_e2e::gateway::wait_for(Duration::from_secs(10), logged), "{:#?}", activity(&gw, &id));
    assert_eq!(call(&gw, "DELETE", &format!("/sandboxes/{id}"), &json!({})).status, 204);
}
