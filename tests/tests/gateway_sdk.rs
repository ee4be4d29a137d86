//! The public Baponi Python SDK, unmodified, against Warren: `execute`,
//! `execute_stream`, the async client and the exceptions it maps
//! and its Anthropic tool integration (tests/sdk/check_sdk.py). The
//! virtualenv is made by this test with `pip install baponi[anthropic]==0.5.1`.

use std::path::{Path, PathBuf};
use std::process::Command;

use warren_e2e::gateway::{key, Gateway};
use warren_e2e::{skip_unless_root, Agent};

/// The SDK with its Anthropic integration (`anthropic` is a real dependency
/// of that module; no model is called: the test drives its tool handler).
const SDK: &str = "baponi[anthropic]==0.5.1";

/// `target/sdk-venv`, made once (atomically, so parallel runs never see a
/// half-built one).
fn venv() -> PathBuf {
    let target = warren_e2e::bin_dir().parent().expect("target dir").to_path_buf();
    let dir = target.join("sdk-venv");
    if std::fs::read_to_string(dir.join("ok")).is_ok_and(|v| v == SDK) {
        return dir;
    }
    let _ = std::fs::remove_dir_all(&dir); // made for another SDK spec
    let tmp = target.join(format!("sdk-venv.tmp-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&tmp);
    run(Command::new("python3").args(["-m", "venv"]).arg(&tmp));
    run(Command::new(tmp.join("bin/pip")).args(["install", "--quiet", "--disable-pip-version-check", SDK]));
    std::fs::write(tmp.join("ok"), SDK).unwrap();
    if std::fs::rename(&tmp, &dir).is_err() {
        let _ = std::fs::remove_dir_all(&tmp); // another run finished first
    }
    dir
}

fn run(cmd: &mut Command) {
    let out = cmd.output().unwrap_or_else(|e| panic!("{cmd:?}: {e}"));
    assert!(out.status.success(), "{cmd:?} failed:\n{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_baponi_sdk_works_against_warren() {
    if skip_unless_root("the_baponi_sdk_works_against_warren") {
        return;
    }
    let venv = venv();
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
