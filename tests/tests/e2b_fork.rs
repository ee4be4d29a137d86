//! E2B's fork end to end (issue #47) with the unmodified E2B SDK
//! (tests/sdk/check_fork.py): a running or paused sandbox forks into new
//! sandboxes starting from its home, processes stay with the source.

use std::process::Command;

use warren_e2e::gateway::{key, Gateway};
use warren_e2e::{skip_unless_root, Agent};

/// The pinned Python SDK (as tests/tests/e2b_sdk.rs pins it).
const PINNED: &str = "e2b==2.63.0 e2b-code-interpreter==2.11.5";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn e2b_fork_makes_sandboxes_from_the_source_s_home_and_leaves_its_processes() {
    if skip_unless_root("e2b_fork_makes_sandboxes_from_the_source_s_home_and_leaves_its_processes") {
        return;
    }
    let venv = warren_e2e::python::venv("e2b-venv", PINNED);
    let agent = Agent::start(&[]).await.unwrap();
    let gw = Gateway::start(&[agent.address()], &[], true).await.unwrap();
    let url = format!("http://{}", gw.addr);
    let mut cmd = Command::new(venv.join("bin/python"));
    cmd.arg(std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("sdk/check_fork.py"));
    cmd.env("E2B_API_URL", &url).env("E2B_SANDBOX_URL", &url).env("E2B_API_KEY", warren_config::key::e2b_alias(&key("thr"))).env("WARREN_E2B_OTHER_KEY", warren_config::key::e2b_alias(&key("thr2")));
    cmd.env_remove("E2B_DOMAIN").env_remove("E2B_DEBUG");
    let out = tokio::task::spawn_blocking(move || cmd.output()).await.unwrap().unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success() && stdout.contains("ok fork\n"), "{stdout}\n{}\n{:#?}", String::from_utf8_lossy(&out.stderr), gw.logs());
}
