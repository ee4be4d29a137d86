//! The public Baponi Python SDK, unmodified, against Warren: `execute`,
//! `execute_stream`, the async client and the exceptions it maps
//! and its Anthropic tool integration (tests/sdk/check_sdk.py). The
//! virtualenv is made by this test with `pip install baponi[anthropic]==0.5.1`.

use std::path::Path;
use std::process::Command;

use warren_e2e::gateway::{key, Gateway};
use warren_e2e::{skip_unless_root, Agent};

/// The SDK with its Anthropic integration (`anthropic` is a real dependency
/// of that module; no model is called: the test drives its tool handler).
const SDK: &str = "baponi[anthropic]==0.5.1";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_baponi_sdk_works_against_warren() {
    if skip_unless_root("the_baponi_sdk_works_against_warren") {
        return;
    }
    let venv = warren_e2e::python::venv("sdk-venv", SDK);
    let agent = Agent::start(&[]).await.unwrap();
    let gw = Gateway::start(&[agent.address()], &[], true).await.unwrap();
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("sdk/check_sdk.py");
    let mut cmd = Command::new(venv.join("bin/python"));
    cmd.arg(&script).env("WARREN_URL", format!("http://{}", gw.addr));
    for k in ["main", "single", "off", "bashonly"] {
        cmd.env(format!("WARREN_KEY_{}", k.to_uppercase()), key(k));
    }
    let out = tokio::task::spawn_blocking(move || cmd.output()).await.unwrap().unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "SDK checks failed:\n{stdout}\n{}", String::from_utf8_lossy(&out.stderr));
    for check in ["check_execute", "check_stream", "check_async", "check_errors", "check_rate_limit_and_thread_busy", "check_anthropic_tool"] {
        assert!(stdout.contains(&format!("ok {check}")), "{check} did not run:\n{stdout}");
    }
}
