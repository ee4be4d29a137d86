//! The unmodified E2B SDK's `Sandbox.create()` + `commands.run("echo 1")` +
//! `kill()`, and `commands.run` alone, next to the Baponi SDK's `execute` of
//! the same command, through one gateway and node-agent in the same run
//! (tests/sdk/bench_e2b.py prints p50/p99 and the ratios).
//!
//! Then the memory an idle live sandbox holds, and an idle code context:
//! sandboxes made on an agent without a pool, their cgroups' charge read.
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
    let venv = warren_e2e::python::venv("e2b-bench-venv", "e2b==2.63.0 e2b-code-interpreter==2.11.5 baponi==0.5.1");
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
    drop((gw, agent));
    idle_memory().await;
}

/// The memory charged to live sandboxes' cgroups (v1 `memory.usage_in_bytes`, v2 `memory.current`).
fn charged(agent: &Agent) -> u64 {
    agent
        .leftover_cgroups()
        .iter()
        .filter_map(|d| {
            let file = if d.join("memory.current").exists() { d.join("memory.current") } else { d.join("memory.usage_in_bytes") };
            std::fs::read_to_string(file).ok()?.trim().parse::<u64>().ok()
        })
        .sum()
}

/// N idle live sandboxes, then a code context in each: what each holds.
async fn idle_memory() {
    const N: u64 = 10;
    let agent = Agent::start(&["--pool-size", "0"]).await.expect("agent starts");
    let gw = Gateway::start(&[agent.address()], &[], true).await.expect("gateway starts");
    let alias = warren_config::key::e2b_alias(&key("thr"));
    let before = charged(&agent);
    let mut made = Vec::new();
    for _ in 0..N {
        let r = warren_e2e::http::request(gw.addr, "POST", "/v2/sandboxes", &[("X-API-KEY", &alias), ("Content-Type", "application/json")], br#"{"templateID": "threads", "timeout": 600}"#);
        assert_eq!(r.status, 201, "{}", r.text());
        let v = r.json();
        made.push((v["sandboxID"].as_str().unwrap().to_string(), v["envdAccessToken"].as_str().unwrap().to_string()));
    }
    tokio::time::sleep(std::time::Duration::from_secs(2)).await;
    let live = charged(&agent).saturating_sub(before);
    for (id, token) in &made {
        let h = [("E2b-Sandbox-Id", id.as_str()), ("X-Access-Token", token.as_str()), ("Content-Type", "application/json")];
        let r = warren_e2e::http::request(gw.addr, "POST", "/execute", &h, br#"{"code": "x = 1"}"#);
        assert_eq!(r.status, 200, "{}", r.text());
    }
    tokio::time::sleep(std::time::Duration::from_secs(2)).await;
    let with_contexts = charged(&agent).saturating_sub(before);
    let mib = |b: u64| b as f64 / (1 << 20) as f64;
    let total: u64 = std::fs::read_to_string("/proc/meminfo").ok().and_then(|m| m.lines().find(|l| l.starts_with("MemTotal:"))?.split_whitespace().nth(1)?.parse::<u64>().ok()).unwrap_or(0) << 10;
    println!(
        "idle memory: {:.2} MiB per live sandbox, {:.2} MiB per code context ({N} sandboxes); this node's {:.0} MiB hold {} idle live sandboxes by memory",
        mib(live / N),
        mib(with_contexts.saturating_sub(live) / N),
        mib(total),
        total / (live / N).max(1)
    );
}
