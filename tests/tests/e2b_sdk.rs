//! The E2B SDKs, unmodified, against Warren (issue #31): the Python `e2b`
//! and `e2b-code-interpreter` from PyPI (tests/sdk/check_e2b.py: create,
//! commands, files, connect from a second client, list, pause/resume,
//! timeouts, the limits that answer errors, isolation between keys, kill,
//! run_code) and the JS `e2b` from npm for the core calls
//! (tests/sdk/check_e2b.mjs). The versions are pinned; with
//! `WARREN_E2B_SDK=newest` the Python check runs against the newest releases
//! instead (`.ci/run` does that as a separate, non-blocking step).

use std::path::{Path, PathBuf};
use std::process::Command;

use warren_e2e::gateway::{key, Gateway};
use warren_e2e::{skip_unless_root, Agent};

/// The pinned Python SDKs.
const PINNED: &str = "e2b==2.63.0 e2b-code-interpreter==2.11.5";
/// The pinned JS SDK (installed by scripts/test.sh).
pub const JS_VERSION: &str = "2.51.0";

fn alias(name: &str) -> String {
    warren_config::key::e2b_alias(&key(name))
}

/// The Python SDKs' virtualenv: pinned, or the newest releases made anew.
fn python_sdks() -> PathBuf {
    if std::env::var("WARREN_E2B_SDK").as_deref() == Ok("newest") {
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
    let venv = python_sdks();
    let agent = Agent::start(&[]).await.unwrap();
    let gw = Gateway::start(&[agent.address()], &[], true).await.unwrap();
    let versions = Command::new(venv.join("bin/python")).args(["-c", "import importlib.metadata as m; print(m.version('e2b'), m.version('e2b-code-interpreter'))"]).output().unwrap();
    println!("E2B Python SDKs: {}", String::from_utf8_lossy(&versions.stdout).trim());
    let mut cmd = Command::new(venv.join("bin/python"));
    cmd.arg(Path::new(env!("CARGO_MANIFEST_DIR")).join("sdk/check_e2b.py"));
    sdk_env(&mut cmd, &gw);
    let out = output(cmd).await;
    let stdout = String::from_utf8_lossy(&out.stdout);
    let warnings: Vec<String> = gw.logs().into_iter().filter(|l| l.contains("WARN") || l.contains("ERROR")).collect();
    assert!(out.status.success(), "E2B SDK checks failed:\n{stdout}\n{}\ngateway warnings: {warnings:#?}", String::from_utf8_lossy(&out.stderr));
    for check in [
        "check_create_run", "check_files", "check_connect_from_a_second_client", "check_info_list_timeout", "check_pause_resume",
        "check_timeouts_and_limits", "check_isolation", "check_errors", "check_kill", "check_code_interpreter",
    ] {
        assert!(stdout.contains(&format!("ok {check}\n")), "{check} did not run:\n{stdout}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_e2b_js_sdk_works_against_warren() {
    if skip_unless_root("the_e2b_js_sdk_works_against_warren") {
        return;
    }
    let home = PathBuf::from(std::env::var_os("HOME").expect("HOME"));
    let sdk = home.join(".cache/warren-tools/e2b/node_modules/e2b");
    let installed = std::fs::read_to_string(sdk.join("package.json")).unwrap_or_default();
    assert!(installed.contains(&format!("\"version\": \"{JS_VERSION}\"")), "the JS e2b {JS_VERSION} is not installed in {} (scripts/test.sh installs it)", sdk.display());
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
