//! Sandbase's REST shape (issue #46): its quick start, unchanged but for
//! its base URL and key, with `requests` from PyPI against a real gateway
//! and node agent (tests/sdk/check_sandbase.py): create, processes run to
//! completion, a multipart upload to `/workspace`, download and listing,
//! state shared between processes, pause/resume keeping the home, and
//! another key seeing nothing.

use std::path::Path;
use std::process::Command;

use warren_e2e::gateway::{key, Gateway};
use warren_e2e::{skip_unless_root, Agent};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sandbase_clients_run_unchanged() {
    if skip_unless_root("sandbase_clients_run_unchanged") {
        return;
    }
    let venv = warren_e2e::python::venv("sandbase-venv", "requests==2.32.3");
    let agent = Agent::start(&[]).await.unwrap();
    let gw = Gateway::start(&[agent.address()], &[], true).await.unwrap();
    let work = tempfile::tempdir().unwrap();
    let mut cmd = Command::new(venv.join("bin/python"));
    cmd.arg(Path::new(env!("CARGO_MANIFEST_DIR")).join("sdk/check_sandbase.py")).current_dir(work.path());
    cmd.env("WARREN_URL", format!("http://{}", gw.addr)).env("WARREN_KEY", key("thr")).env("WARREN_OTHER_KEY", key("thr2"));
    let out = tokio::task::spawn_blocking(move || cmd.output()).await.unwrap().unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success() && stdout.contains("ok sandbase\n"), "{stdout}\n{}\n{:#?}", String::from_utf8_lossy(&out.stderr), gw.logs());
}
