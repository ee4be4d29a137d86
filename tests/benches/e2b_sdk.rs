//! The unmodified E2B SDK's `Sandbox.create()` + `commands.run("echo 1")` +
//! `kill()`, and `commands.run` alone, next to the Baponi SDK's `execute` of
//! the same command, through one gateway and node-agent in the same run
//! (tests/sdk/bench_e2b.py prints p50/p99 and the ratios).
//!
//! Needs root and release binaries (`cargo build --release --workspace --bins`):
//! `WARREN_BIN_DIR=target/release cargo bench -p warren-e2e --bench e2b_sdk`
//! (WARREN_BENCH_RUNS default 100).

use std::path::Path;
use std::process::Command;

use warren_e2e::gateway::{key, Gateway};
use warren_e2e::{is_root, Agent};

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() {
    if !is_root() {
        eprintln!("SKIPPED e2b_sdk: needs root");
        return;
    }
    let venv = warren_e2e::python::venv("e2b-bench-venv", "e2b==2.63.0 baponi==0.5.1");
    let agent = Agent::start(&[]).await.expect("agent starts");
    let gw = Gateway::start(&[agent.address()], &[], true).await.expect("gateway starts");
    let url = format!("http://{}", gw.addr);
    let mut cmd = Command::new(venv.join("bin/python"));
    cmd.arg(Path::new(env!("CARGO_MANIFEST_DIR")).join("sdk/bench_e2b.py"))
        .env("E2B_API_URL", &url)
        .env("E2B_SANDBOX_URL", &url)
        .env("E2B_API_KEY", warren_config::key::e2b_alias(&key("thr")))
        .env("WARREN_BENCH_KEY", key("thr"));
    let out = tokio::task::spawn_blocking(move || cmd.output()).await.unwrap().unwrap();
    print!("{}", String::from_utf8_lossy(&out.stdout));
    assert!(out.status.success(), "the benchmark failed:\n{}", String::from_utf8_lossy(&out.stderr));
}
