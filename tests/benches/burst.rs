//! A burst, as peers are measured daily (#45): 100 concurrent E2B
//! `Sandbox.create()` → first `commands.run()` (→ `kill()`) through the
//! unmodified JS SDK (tests/sdk/burst_e2b.mjs), then 100 concurrent Baponi
//! `execute` calls (tests/sdk/burst_baponi.py, the SDK's retries off), on one
//! key shaped as the demo key (`thr`: maxOutputBytes 1 MiB, maxConcurrency
//! 64), through one gateway and node-agent with default flags. Prints, for
//! each: calls that succeeded, median and p99 of one call, the wall clock,
//! and E2B's figures as ratios to Baponi's in the same run.
//!
//! Needs root, node and the JS `e2b` (scripts/test.sh installs it), and
//! release binaries: `cargo build --release --workspace --bins`, then
//! `WARREN_BIN_DIR=target/release cargo bench -p warren-e2e --bench burst`
//! (WARREN_BURST: calls per burst, default 100).

use std::path::{Path, PathBuf};
use std::process::Command;

use warren_e2e::gateway::{key, Gateway};
use warren_e2e::{is_root, Agent};

/// The burst script's summary line, and the script's whole output.
fn run(mut cmd: Command) -> (serde_json::Value, String) {
    let out = cmd.output().expect("the burst script runs");
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    let summary = stdout.lines().next().and_then(|l| serde_json::from_str(l).ok()).unwrap_or_else(|| panic!("no summary:\n{stdout}\n{}", String::from_utf8_lossy(&out.stderr)));
    (summary, stdout)
}

fn row(name: &str, v: &serde_json::Value) {
    let ms = |f: &str| v[f].as_f64().map_or("-".to_string(), |x| format!("{x:.0} ms"));
    println!("| {name} | {}/{} | {} | {} | {} |", v["ok"], v["calls"], ms("median_ms"), ms("p99_ms"), ms("wall_ms"));
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() {
    if !is_root() {
        eprintln!("SKIPPED burst: needs root");
        return;
    }
    let n = std::env::var("WARREN_BURST").unwrap_or_else(|_| "100".into());
    let home = PathBuf::from(std::env::var_os("HOME").expect("HOME"));
    let sdk = home.join(".cache/warren-tools/e2b/node_modules/e2b");
    let venv = warren_e2e::python::venv("e2b-bench-venv", "e2b==2.63.0 baponi==0.5.1");
    let agent = Agent::start(&[]).await.expect("agent starts");
    let gw = Gateway::start(&[agent.address()], &[], true).await.expect("gateway starts");
    let url = format!("http://{}", gw.addr);
    let here = Path::new(env!("CARGO_MANIFEST_DIR"));

    let mut e2b = Command::new("node");
    e2b.arg(here.join("sdk/burst_e2b.mjs")).env("E2B_JS_SDK", &sdk).env("WARREN_BURST", &n);
    e2b.env("E2B_API_URL", &url).env("E2B_SANDBOX_URL", &url).env("E2B_API_KEY", warren_config::key::e2b_alias(&key("thr"))).env_remove("E2B_DOMAIN").env_remove("E2B_DEBUG");
    let (e, e_out) = tokio::task::spawn_blocking(move || run(e2b)).await.unwrap();

    let mut baponi = Command::new(venv.join("bin/python"));
    baponi.arg(here.join("sdk/burst_baponi.py")).env("WARREN_BURST", &n).env("WARREN_BENCH_URL", &url).env("WARREN_BENCH_KEY", key("thr"));
    let (b, b_out) = tokio::task::spawn_blocking(move || run(baponi)).await.unwrap();

    println!("| burst of {n} on one key | OK | median | p99 | wall clock |\n|---|---|---|---|---|");
    row("E2B JS SDK: create → first command (→ kill)", &e);
    row("Baponi SDK: execute", &b);
    let ratio = |f: &str| match (e[f].as_f64(), b[f].as_f64()) {
        (Some(x), Some(y)) if y > 0.0 => format!("{:.2}×", x / y),
        _ => "-".into(),
    };
    println!("E2B ÷ Baponi: median {}, p99 {}, wall clock {}", ratio("median_ms"), ratio("p99_ms"), ratio("wall_ms"));
    for line in e_out.lines().chain(b_out.lines()).filter(|l| l.starts_with("failed: ")) {
        println!("{line}");
    }
}
