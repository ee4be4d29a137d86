//! The E2B SDKs, unmodified, against Warren (issue #31): the Python `e2b`
//! and `e2b-code-interpreter` from PyPI (tests/sdk/check_e2b.py: create,
//! commands, files, connect from a second client, list, pause/resume,
//! timeouts, the limits that answer errors, isolation between keys, kill,
//! run_code), also as of the release before 2.51.0, and the JS `e2b` from
//! npm for the core calls (tests/sdk/check_e2b.mjs). The versions are pinned; with
//! `WARREN_E2B_SDK=newest` the Python and JS checks run against the newest
//! releases instead (`.ci/run` does that as a separate, non-blocking step).

use std::path::{Path, PathBuf};
use std::process::Command;

use warren_e2e::gateway::{key, Gateway};
use warren_e2e::http::request;
use warren_e2e::{skip_unless_root, Agent};

/// The pinned Python SDKs.
const PINNED: &str = "e2b==2.63.0 e2b-code-interpreter==2.11.5";
/// The Python SDKs of the last release before 2.51.0.
const BEFORE_V2: &str = "e2b==2.50.0 e2b-code-interpreter==2.10.0";
/// The pinned JS SDK (installed by scripts/test.sh).
pub const JS_VERSION: &str = "2.51.0";

fn alias(name: &str) -> String {
    warren_config::key::e2b_alias(&key(name))
}

fn newest() -> bool {
    std::env::var("WARREN_E2B_SDK").as_deref() == Ok("newest")
}

/// The JS SDK package: the pinned one scripts/test.sh installed, or the
/// newest on npm installed anew.
fn js_sdk() -> PathBuf {
    let sdk = if newest() {
        let dir = warren_e2e::bin_dir().parent().unwrap().join("e2b-js-newest");
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        warren_e2e::python::run(Command::new("npm").args(["install", "--silent", "--no-audit", "--no-fund", "--prefix"]).arg(&dir).arg("e2b@latest"));
        dir.join("node_modules/e2b")
    } else {
        let home = PathBuf::from(std::env::var_os("HOME").expect("HOME"));
        let sdk = home.join(".cache/warren-tools/e2b/node_modules/e2b");
        let installed = std::fs::read_to_string(sdk.join("package.json")).unwrap_or_default();
        assert!(installed.contains(&format!("\"version\": \"{JS_VERSION}\"")), "the JS e2b {JS_VERSION} is not installed in {} (scripts/test.sh installs it)", sdk.display());
        sdk
    };
    let package: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(sdk.join("package.json")).unwrap()).unwrap();
    println!("E2B JS SDK: {}", package["version"].as_str().unwrap_or("?"));
    sdk
}

/// The Python SDKs' virtualenv: pinned, or the newest releases made anew.
fn python_sdks() -> PathBuf {
    if newest() {
        let spec = "--upgrade e2b e2b-code-interpreter";
        let dir = warren_e2e::bin_dir().parent().unwrap().join("e2b-newest-venv");
        let _ = std::fs::remove_dir_all(&dir);
        return warren_e2e::python::venv("e2b-newest-venv", spec);
    }
    warren_e2e::python::venv("e2b-venv", PINNED)
}

fn sdk_env(cmd: &mut Command, gw: &Gateway) {
    let url = format!("http://{}", gw.addr);
    cmd.env("E2B_API_URL", &url).env("E2B_SANDBOX_URL", &url).env("E2B_API_KEY", alias("thr")).env("WARREN_E2B_OTHER_KEY", alias("thr2")).env_remove("E2B_DOMAIN").env_remove("E2B_DEBUG");
}

async fn output(mut cmd: Command) -> std::process::Output {
    tokio::task::spawn_blocking(move || cmd.output()).await.unwrap().unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_e2b_python_sdks_work_against_warren() {
    if skip_unless_root("the_e2b_python_sdks_work_against_warren") {
        return;
    }
    python_check(&python_sdks()).await;
}

/// The last release before `create` moved to `POST /v2/sandboxes` (2.51.0,
/// the change that broke other servers within days), with the code
/// interpreter pip pairs with it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_e2b_python_sdks_before_2_51_work_against_warren() {
    if skip_unless_root("the_e2b_python_sdks_before_2_51_work_against_warren") {
        return;
    }
    python_check(&warren_e2e::python::venv("e2b-2.50-venv", BEFORE_V2)).await;
}

/// Runs tests/sdk/check_e2b.py with the SDKs of `venv` against a fresh
/// gateway and agent; every check must pass.
async fn python_check(venv: &Path) {
    let agent = Agent::start(&[]).await.unwrap();
    // Ports by name: `<port>-<id>.sandbox.test`, sent as a Host header.
    let gw = Gateway::start(&[agent.address()], &["--sandbox-domain", "sandbox.test"], true).await.unwrap();
    let versions = Command::new(venv.join("bin/python")).args(["-c", "import importlib.metadata as m; print(m.version('e2b'), m.version('e2b-code-interpreter'))"]).output().unwrap();
    println!("E2B Python SDKs: {}", String::from_utf8_lossy(&versions.stdout).trim());
    let mut cmd = Command::new(venv.join("bin/python"));
    cmd.arg(Path::new(env!("CARGO_MANIFEST_DIR")).join("sdk/check_e2b.py"));
    sdk_env(&mut cmd, &gw);
    let out = output(cmd).await;
    let stdout = String::from_utf8_lossy(&out.stdout);
    println!("{stdout}");
    let warnings: Vec<String> = gw.logs().into_iter().filter(|l| l.contains("WARN") || l.contains("ERROR")).collect();
    assert!(out.status.success(), "E2B SDK checks failed:\n{stdout}\n{}\ngateway warnings: {warnings:#?}", String::from_utf8_lossy(&out.stderr));
    for check in [
        "check_create_run", "check_files", "check_connect_from_a_second_client", "check_info_list_timeout", "check_pause_resume",
        "check_timeouts_and_limits", "check_live", "check_isolation", "check_errors", "check_kill", "check_async", "check_code_interpreter",
    ] {
        assert!(stdout.contains(&format!("ok {check}\n")), "{check} did not run:\n{stdout}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_e2b_js_sdk_works_against_warren() {
    if skip_unless_root("the_e2b_js_sdk_works_against_warren") {
        return;
    }
    let sdk = js_sdk();
    let agent = Agent::start(&[]).await.unwrap();
    let gw = Gateway::start(&[agent.address()], &[], true).await.unwrap();
    let mut cmd = Command::new("node");
    cmd.arg(Path::new(env!("CARGO_MANIFEST_DIR")).join("sdk/check_e2b.mjs")).env("E2B_JS_SDK", &sdk);
    sdk_env(&mut cmd, &gw);
    let out = output(cmd).await;
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "E2B JS SDK checks failed:\n{stdout}\n{}\ngateway logs: {:#?}", String::from_utf8_lossy(&out.stderr), gw.logs());
    assert!(stdout.contains("ok js core calls\n"), "{stdout}");
}

/// Bursts queue, never fail (#45): 100 concurrent `Sandbox.create()` +
/// `commands.run()` + `kill()` through the unmodified JS SDK on one key
/// (`thr`: maxOutputBytes 1 MiB, maxConcurrency 64, as the demo key) with
/// the default output budget, through an agent of 32 slots: 100 of 100.
/// Before, each command reserved 6 MiB up front of the key's 512 MiB half,
/// and 6–15 failed as `SandboxNotFoundError` (the SDK's reading of the 503
/// the gateway answered). The SDK's timeouts and the queue wait are set far
/// beyond what the burst takes, so the outcome never depends on this
/// machine's speed; the run is bounded by them.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_burst_of_100_e2b_sandboxes_through_the_js_sdk_all_run() {
    if skip_unless_root("a_burst_of_100_e2b_sandboxes_through_the_js_sdk_all_run") {
        return;
    }
    let sdk = js_sdk();
    let agent = Agent::start(&[]).await.unwrap();
    let gw = Gateway::start(&[agent.address()], &["--queue-wait-ms", "150000"], true).await.unwrap();
    let mut cmd = Command::new("node");
    cmd.arg(Path::new(env!("CARGO_MANIFEST_DIR")).join("sdk/burst_e2b.mjs")).env("E2B_JS_SDK", &sdk).env("WARREN_BURST", "100").env("WARREN_BURST_TIMEOUT_MS", "240000");
    sdk_env(&mut cmd, &gw);
    let out = output(cmd).await;
    let stdout = String::from_utf8_lossy(&out.stdout);
    println!("{stdout}");
    let warnings: Vec<String> = gw.logs().into_iter().filter(|l| l.contains("WARN") || l.contains("ERROR")).take(20).collect();
    assert!(out.status.success(), "the burst failed:\n{stdout}\n{}\ngateway warnings: {warnings:#?}", String::from_utf8_lossy(&out.stderr));
    let summary: serde_json::Value = serde_json::from_str(stdout.lines().next().unwrap_or_default()).unwrap();
    assert_eq!((summary["calls"].as_u64(), summary["ok"].as_u64()), (Some(100), Some(100)), "{stdout}");
    // Every sandbox was killed: none is listed any more.
    let listed = request(gw.addr, "GET", "/v2/sandboxes", &[("X-API-KEY", &alias("thr"))], b"").json();
    assert_eq!(listed.as_array().map(Vec::len), Some(0), "{listed}");
}

/// The JSON messages of a Connect stream (flags, length, JSON).
fn envelopes(mut body: &[u8]) -> Vec<(u8, serde_json::Value)> {
    let mut out = Vec::new();
    while body.len() >= 5 {
        let len = u32::from_be_bytes([body[1], body[2], body[3], body[4]]) as usize;
        out.push((body[0], serde_json::from_slice(&body[5..5 + len]).unwrap()));
        body = &body[5 + len..];
    }
    out
}

/// Two gateways sharing a PostgreSQL record database and a signing key
/// (a file of their own user's only, as the chart's Secret is), and an agent.
struct Replicas {
    a: Gateway,
    b: Gateway,
    pg_url: String,
    _agent: Agent,
    _pg: warren_e2e::services::Postgres,
    _dir: tempfile::TempDir,
}

impl Replicas {
    async fn start() -> Replicas {
        use std::os::unix::fs::PermissionsExt as _;
        use warren_e2e::services::{Postgres, PG_PASSWORD};
        let pg = Postgres::start().unwrap();
        let url = format!("postgres://agent:{PG_PASSWORD}@127.0.0.1:{}/app", pg.port);
        let dir = tempfile::tempdir().unwrap();
        let signing = dir.path().join("signing.key");
        std::fs::write(&signing, "k".repeat(64)).unwrap();
        std::fs::set_permissions(&signing, std::fs::Permissions::from_mode(0o600)).unwrap();
        let agent = Agent::start(&[]).await.unwrap();
        let (agents, args) = ([agent.address()], ["--records", url.as_str(), "--files-signing-key-file", signing.to_str().unwrap()]);
        let (a, b) = tokio::join!(Gateway::start(&agents, &args, true), Gateway::start(&agents, &args, true));
        Replicas { a: a.unwrap(), b: b.unwrap(), pg_url: url, _agent: agent, _pg: pg, _dir: dir }
    }
}

/// A sandbox of key `name` created through `gw` with `body`: (id, access token).
fn create(gw: &Gateway, name: &str, body: &serde_json::Value) -> (String, String) {
    let created = request(gw.addr, "POST", "/v2/sandboxes", &[("X-API-KEY", &alias(name)), ("Content-Type", "application/json")], body.to_string().as_bytes());
    assert_eq!(created.status, 201, "{}", created.text());
    let v = created.json();
    (v["sandboxID"].as_str().unwrap().to_string(), v["envdAccessToken"].as_str().unwrap().to_string())
}

/// Runs `script` with bash in sandbox `id` through `gw`'s data plane (envd's
/// `Process/Start`, raw): the events of its stream.
fn run_in(gw: &Gateway, id: &str, token: &str, script: &str) -> Vec<(u8, serde_json::Value)> {
    let start = serde_json::to_vec(&serde_json::json!({"process": {"cmd": "/bin/bash", "args": ["-l", "-c", script]}, "stdin": false})).unwrap();
    let mut framed = vec![0, 0, 0, 0, 0];
    framed[1..5].copy_from_slice(&(start.len() as u32).to_be_bytes());
    framed.extend_from_slice(&start);
    let data_plane = [("Content-Type", "application/connect+json"), ("E2b-Sandbox-Id", id), ("X-Access-Token", token)];
    envelopes(&request(gw.addr, "POST", "/process.Process/Start", &data_plane, &framed).body)
}

/// Two gateways sharing a PostgreSQL record database and a signing key:
/// a sandbox created through one is seen, used and killed through the
/// other (the records are the registry; the access token verifies on both),
/// and another key gets "not found" for it on either.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn e2b_sandboxes_live_in_postgresql_for_every_replica() {
    if skip_unless_root("e2b_sandboxes_live_in_postgresql_for_every_replica") {
        return;
    }
    let r = Replicas::start().await;
    let (a, b) = (&r.a, &r.b);
    let (mine, theirs) = (alias("thr"), alias("thr2"));
    let created = request(a.addr, "POST", "/v2/sandboxes", &[("X-API-KEY", &mine), ("Content-Type", "application/json")], br#"{"templateID": "threads", "metadata": {"suite": "pg"}}"#);
    assert_eq!(created.status, 201, "{}", created.text());
    let v = created.json();
    let (id, token) = (v["sandboxID"].as_str().unwrap().to_string(), v["envdAccessToken"].as_str().unwrap().to_string());
    let info = request(b.addr, "GET", &format!("/sandboxes/{id}"), &[("X-API-KEY", &mine)], b"");
    assert_eq!((info.status, info.json()["metadata"]["suite"].as_str()), (200, Some("pg")), "{}", info.text());
    let listed = request(b.addr, "GET", "/v2/sandboxes?metadata=suite%3Dpg", &[("X-API-KEY", &mine)], b"").json();
    assert_eq!(listed.as_array().map(|l| l.iter().map(|s| s["sandboxID"].as_str().unwrap()).collect::<Vec<_>>()), Some(vec![id.as_str()]), "{listed}");
    let start = serde_json::to_vec(&serde_json::json!({"process": {"cmd": "/bin/bash", "args": ["-l", "-c", "echo from-b; exit 2"]}, "stdin": false})).unwrap();
    let mut framed = vec![0, 0, 0, 0, 0];
    framed[1..5].copy_from_slice(&(start.len() as u32).to_be_bytes());
    framed.extend_from_slice(&start);
    let data_plane = [("Content-Type", "application/connect+json"), ("E2b-Sandbox-Id", id.as_str()), ("X-Access-Token", token.as_str())];
    let run = request(b.addr, "POST", "/process.Process/Start", &data_plane, &framed);
    let events = envelopes(&run.body);
    assert_eq!(events.first().map(|e| e.1["event"]["start"]["pid"].is_u64()), Some(true), "{events:?}");
    assert!(events.iter().any(|(_, e)| e["event"]["data"]["stdout"] == "ZnJvbS1iCg=="), "{events:?}"); // "from-b\n"
    assert!(events.iter().any(|(_, e)| e["event"]["end"]["exitCode"] == 2), "{events:?}");
    assert_eq!(events.last().map(|e| (e.0, e.1.clone())), Some((2, serde_json::json!({}))), "{events:?}");
    for gw in [a, b] {
        assert_eq!(request(gw.addr, "GET", &format!("/sandboxes/{id}"), &[("X-API-KEY", &theirs)], b"").status, 404);
        assert_eq!(request(gw.addr, "DELETE", &format!("/sandboxes/{id}"), &[("X-API-KEY", &theirs)], b"").status, 404);
    }
    assert_eq!(request(b.addr, "DELETE", &format!("/sandboxes/{id}"), &[("X-API-KEY", &mine)], b"").status, 204);
    // SDKs before 2.51 create with `POST /sandboxes` and list with `GET /sandboxes`.
    let old = request(b.addr, "POST", "/sandboxes", &[("X-API-KEY", &mine), ("Content-Type", "application/json")], br#"{"templateID": "base", "metadata": {"suite": "pg-v1"}}"#);
    assert_eq!(old.status, 201, "{}", old.text());
    let old_id = old.json()["sandboxID"].as_str().unwrap().to_string();
    let listed = request(a.addr, "GET", "/sandboxes?metadata=suite%3Dpg-v1", &[("X-API-KEY", &mine)], b"").json();
    assert_eq!(listed[0]["sandboxID"].as_str(), Some(old_id.as_str()), "{listed}");
    assert_eq!(request(a.addr, "GET", &format!("/sandboxes/{id}"), &[("X-API-KEY", &mine)], b"").status, 404);
    assert_eq!(request(a.addr, "GET", "/health", &[("E2b-Sandbox-Id", id.as_str()), ("X-Access-Token", token.as_str())], b"").status, 502);
}

/// A sandbox past its timeout that nobody touches again is ended by the
/// gateway's sweep: its thread (home) is deleted and its record forgotten.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_sandbox_past_its_timeout_is_swept_with_its_home() {
    if skip_unless_root("a_sandbox_past_its_timeout_is_swept_with_its_home") {
        return;
    }
    let agent = Agent::start(&[]).await.unwrap();
    let gw = Gateway::start(&[agent.address()], &[], true).await.unwrap();
    let mine = alias("thr");
    let created = request(gw.addr, "POST", "/v2/sandboxes", &[("X-API-KEY", &mine), ("Content-Type", "application/json")], br#"{"templateID": "threads", "timeout": 2}"#);
    assert_eq!(created.status, 201, "{}", created.text());
    let v = created.json();
    let (id, token) = (v["sandboxID"].as_str().unwrap().to_string(), v["envdAccessToken"].as_str().unwrap().to_string());
    let data_plane = [("Content-Type", "application/octet-stream"), ("E2b-Sandbox-Id", id.as_str()), ("X-Access-Token", token.as_str())];
    let up = request(gw.addr, "POST", "/files?path=/home/user/kept.txt", &data_plane, b"home");
    assert_eq!(up.status, 200, "{}", up.text());
    // The thread exists, held by the live sandbox (Warren's own Files API
    // says it is busy)...
    let list = serde_json::json!({"source": "thread", "id": id}).to_string();
    let bearer = format!("Bearer {}", key("thr"));
    let listed = || warren_e2e::http::post(gw.addr, "/v1/files/list", &[("Authorization", bearer.as_str()), ("Content-Type", "application/json")], list.as_bytes());
    assert_eq!(listed().status, 409, "{}", listed().text());
    // ...until the sweep ends the sandbox, with no E2B call to trigger it.
    let swept = warren_e2e::gateway::wait_for(std::time::Duration::from_secs(60), || listed().status == 404);
    assert!(swept, "the thread outlived its sandbox: {}\n{:#?}", listed().text(), gw.logs());
    assert_eq!(request(gw.addr, "GET", &format!("/sandboxes/{id}"), &[("X-API-KEY", &mine)], b"").status, 404);
}

/// A sandbox created with `autoPause` is paused at its timeout, not
/// deleted: its home stays, and connecting resumes it with the home intact.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_sandbox_with_auto_pause_is_paused_at_its_timeout_and_keeps_its_home() {
    if skip_unless_root("a_sandbox_with_auto_pause_is_paused_at_its_timeout_and_keeps_its_home") {
        return;
    }
    let agent = Agent::start(&[]).await.unwrap();
    let gw = Gateway::start(&[agent.address()], &[], true).await.unwrap();
    let mine = alias("thr");
    let created = request(gw.addr, "POST", "/v2/sandboxes", &[("X-API-KEY", &mine), ("Content-Type", "application/json")], br#"{"templateID": "threads", "timeout": 2, "autoPause": true}"#);
    assert_eq!(created.status, 201, "{}", created.text());
    let v = created.json();
    let (id, token) = (v["sandboxID"].as_str().unwrap().to_string(), v["envdAccessToken"].as_str().unwrap().to_string());
    let data_plane = [("E2b-Sandbox-Id", id.as_str()), ("X-Access-Token", token.as_str())];
    let up = request(gw.addr, "POST", "/files?path=kept.txt", &[data_plane[0], data_plane[1], ("Content-Type", "application/octet-stream")], b"home");
    assert_eq!(up.status, 200, "{}", up.text());
    let info = || request(gw.addr, "GET", &format!("/sandboxes/{id}"), &[("X-API-KEY", &mine)], b"");
    let paused = warren_e2e::gateway::wait_for(std::time::Duration::from_secs(60), || info().json()["state"] == "paused");
    assert!(paused, "never paused: {}", info().text());
    // Paused: the data plane refuses until it is resumed.
    assert_eq!(request(gw.addr, "GET", "/files?path=kept.txt", &data_plane, b"").status, 502);
    let resumed = request(gw.addr, "POST", &format!("/v2/sandboxes/{id}/connect"), &[("X-API-KEY", &mine), ("Content-Type", "application/json")], br#"{"timeout": 60}"#);
    assert_eq!((resumed.status, info().json()["state"].as_str().map(str::to_string)), (200, Some("running".into())), "{}", resumed.text());
    let back = request(gw.addr, "GET", "/files?path=kept.txt", &data_plane, b"");
    assert_eq!((back.status, back.text()), (200, "home".to_string()));
}

/// The attack: a PostgreSQL dump (or a reader of the records) looking for a
/// sandbox's variables, often credentials. They are stored sealed; a command
/// run through the other replica still gets them.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn environment_variables_are_sealed_in_postgresql_and_reach_commands_through_every_replica() {
    if skip_unless_root("environment_variables_are_sealed_in_postgresql_and_reach_commands_through_every_replica") {
        return;
    }
    const CANARY: &str = "pg-canary-5b7e0c91d2";
    let r = Replicas::start().await;
    let (id, token) = create(&r.a, "thr", &serde_json::json!({"templateID": "threads", "envVars": {"API_TOKEN": CANARY}}));
    // The command proves it has the value without printing it (its output is recorded too).
    let events = run_in(&r.b, &id, &token, "printf %s \"$API_TOKEN\" | sha256sum | cut -c1-64");
    use base64::Engine as _;
    use sha2::Digest as _;
    let digest: String = sha2::Sha256::digest(CANARY.as_bytes()).iter().map(|b| format!("{b:02x}")).collect();
    let out = base64::engine::general_purpose::STANDARD.encode(format!("{digest}\n"));
    assert!(events.iter().any(|(_, e)| e["event"]["data"]["stdout"] == out.as_str()), "{events:?}");
    let dump = Command::new("pg_dump").args(["--data-only", r.pg_url.as_str()]).output().unwrap();
    let dump = String::from_utf8_lossy(&dump.stdout);
    assert!(dump.contains(&id), "the dump holds the sandbox's row: {dump}");
    assert!(!dump.contains(CANARY), "the records hold the variable in plaintext");
}

/// The attack: creates fired at once through two replicas against a key
/// allowed 2 sandboxes (`few`), each replica counting before either
/// stores. The count and the insert are one step under a lock PostgreSQL
/// holds for both: exactly 2 are made, the rest told the limit.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn creates_racing_through_two_replicas_never_pass_max_threads() {
    if skip_unless_root("creates_racing_through_two_replicas_never_pass_max_threads") {
        return;
    }
    let r = Replicas::start().await;
    let go = std::sync::Arc::new(std::sync::Barrier::new(12));
    let calls: Vec<_> = (0..12)
        .map(|i| {
            let (addr, go, key) = (if i % 2 == 0 { r.a.addr } else { r.b.addr }, go.clone(), alias("few"));
            std::thread::spawn(move || {
                go.wait();
                request(addr, "POST", "/v2/sandboxes", &[("X-API-KEY", &key), ("Content-Type", "application/json")], br#"{"templateID": "threads"}"#)
            })
        })
        .collect();
    let answers: Vec<_> = calls.into_iter().map(|t| t.join().unwrap()).collect();
    let created = answers.iter().filter(|a| a.status == 201).count();
    assert_eq!(created, 2, "{:?}", answers.iter().map(|a| (a.status, a.text())).collect::<Vec<_>>());
    assert!(answers.iter().filter(|a| a.status != 201).all(|a| a.status == 429 && a.text().contains("maxThreads")));
    let listed = request(r.b.addr, "GET", "/v2/sandboxes", &[("X-API-KEY", &alias("few"))], b"").json();
    assert_eq!(listed.as_array().map(Vec::len), Some(2), "{listed}");
}

const MIB: usize = 1 << 20;

/// An upload the gateway holds whole (chunked: no Content-Length) of `mib`
/// MiB to sandbox `id`: ended when `finish`, else left stalled, the
/// connection open. The gateway's answer.
fn held_upload(addr: std::net::SocketAddr, id: &str, token: &str, mib: usize, finish: bool) -> warren_e2e::http::Response {
    use std::io::Write as _;
    let s = std::net::TcpStream::connect(addr).unwrap();
    s.set_read_timeout(Some(std::time::Duration::from_secs(120))).unwrap();
    let head = format!(
        "POST /files?path=held.bin HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\nE2b-Sandbox-Id: {id}\r\nX-Access-Token: {token}\r\n\
         Content-Type: application/octet-stream\r\nTransfer-Encoding: chunked\r\n\r\n"
    );
    let mut w = s.try_clone().unwrap();
    // Written on its own thread: a refusal comes while it still sends.
    let writer = std::thread::spawn(move || {
        let chunk = [format!("{MIB:x}\r\n").into_bytes(), vec![b'u'; MIB], b"\r\n".to_vec()].concat();
        let sent = w.write_all(head.as_bytes()).is_ok() && (0..mib).all(|_| w.write_all(&chunk).is_ok());
        if sent && finish {
            let _ = w.write_all(b"0\r\n\r\n");
        }
    });
    let answer = warren_e2e::http::read_response(s).expect("the gateway answers");
    let _ = writer.join();
    answer
}

/// The attack: many uploads the gateway must hold whole (here 32 of 12 MiB,
/// through two keys), each stalling once sent — 384 MiB held before. The
/// gateway holds them within its upload budget (64 MiB, each byte counted
/// twice, a key at most half): the excess are refused with 429 and a retry,
/// the stalled ones are cut (408) once silent for the body timeout, their
/// memory returned — a full upload goes through after.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stalled_held_uploads_stay_within_the_gateways_budget_and_are_cut() {
    if skip_unless_root("stalled_held_uploads_stay_within_the_gateways_budget_and_are_cut") {
        return;
    }
    let agent = Agent::start(&[]).await.unwrap();
    let gw = Gateway::start(&[agent.address()], &["--upload-budget-mib", "64", "--body-timeout-ms", "2000"], true).await.unwrap();
    let sandboxes = [create(&gw, "thr", &serde_json::json!({"templateID": "threads"})), create(&gw, "thr2", &serde_json::json!({"templateID": "threads"}))];
    let addr = gw.addr;
    let uploads: Vec<_> = (0..32)
        .map(|i| {
            let (id, token) = sandboxes[i % 2].clone();
            std::thread::spawn(move || held_upload(addr, &id, &token, 12, false))
        })
        .collect();
    let answers: Vec<_> = uploads.into_iter().map(|t| t.join().unwrap()).collect();
    let peak = gw.peak_rss();
    eprintln!("gateway peak RSS with 32 stalled 12 MiB uploads and a 64 MiB budget: {} MiB", peak >> 20);
    let (refused, cut): (Vec<_>, Vec<_>) = answers.iter().partition(|a| a.status == 429);
    for a in &refused {
        assert_eq!(a.header("retry-after"), Some("1"), "{}", a.text());
        assert!(a.text().contains("upload memory"), "{}", a.text());
    }
    assert!(!refused.is_empty() && !cut.is_empty(), "some held, the excess refused: {:?}", answers.iter().map(|a| a.status).collect::<Vec<_>>());
    for a in &cut {
        assert_eq!(a.status, 408, "{}", a.text());
        assert!(a.text().contains("stopped arriving"), "{}", a.text());
    }
    assert!(peak < 200 * MIB as u64, "the gateway's memory stayed near its budget: peak {} MiB", peak >> 20);
    let (id, token) = &sandboxes[0];
    let whole = held_upload(addr, id, token, 8, true);
    assert_eq!(whole.status, 200, "the memory came back: {}", whole.text());
}
