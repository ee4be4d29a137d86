//! Where the time of one execution goes: a per-phase profile of inline HTTP
//! calls, from the gateway's and the agent's own phase logs (debug level),
//! beside the bare process and the client's round trip in the same run.
//!
//! `cargo bench -p warren-e2e --bench phases`. Knobs: WARREN_BENCH_RUNS
//! (default 100), WARREN_BENCH_PAUSE_MS between calls (default 5),
//! WARREN_BIN_DIR for the binaries (e.g. target/release: what users run),
//! WARREN_BENCH_RECORDS for the gateway's `--records`, and
//! WARREN_BENCH_KEEP_LOGS=<dir> to keep both logs (timestamps line the two
//! processes up). Needs root. docs/src/benchmarks.md quotes it.

use std::collections::BTreeMap;
use std::io::Write;
use std::time::{Duration, Instant};

use warren_e2e::bench::{bare, ms, percentile};
use warren_e2e::gateway::{key, Gateway};
use warren_e2e::{is_root, Agent};

/// The `name_us=N` fields of every log line carrying `message`.
fn phase_fields(log: &str, message: &str) -> BTreeMap<String, Vec<Duration>> {
    let mut out: BTreeMap<String, Vec<Duration>> = BTreeMap::new();
    for line in log.lines().filter(|l| l.contains(message)) {
        let plain: String = strip_ansi(line);
        let words = plain.split(|c: char| c.is_whitespace() || c == ',' || c == '{' || c == '}');
        for w in words {
            let w = w.replace('"', "");
            let Some((k, v)) = w.split_once([':', '=']) else { continue };
            if let (true, Ok(n)) = (k.ends_with("_us"), v.parse::<u64>()) {
                out.entry(k.to_string()).or_default().push(Duration::from_micros(n));
            }
        }
    }
    out
}

fn strip_ansi(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    let mut chars = s.chars();
    while let Some(c) = chars.next() {
        if c == '\u{1b}' {
            for d in chars.by_ref() {
                if d.is_ascii_alphabetic() {
                    break;
                }
            }
        } else {
            out.push(c);
        }
    }
    out
}

fn row(name: &str, mut v: Vec<Duration>) {
    v.sort();
    if !v.is_empty() {
        println!("  {name:<34} {:>9.3} ms {:>9.3} ms", ms(percentile(&v, 0.5)), ms(percentile(&v, 0.99)));
    }
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() {
    if !is_root() {
        eprintln!("SKIPPED phases: needs root");
        return;
    }
    let runs: usize = std::env::var("WARREN_BENCH_RUNS").ok().and_then(|v| v.parse().ok()).unwrap_or(100);
    let pause = Duration::from_millis(std::env::var("WARREN_BENCH_PAUSE_MS").ok().and_then(|v| v.parse().ok()).unwrap_or(5));
    let dir = tempfile::tempdir().unwrap();
    let agent_log = dir.path().join("agent.log");
    let agent_filter = "warn,warren_node_agent::executor=debug,warren_node_agent::sandbox=debug,warren_node_agent::service=debug";
    let env = [("RUST_LOG", agent_filter), ("WARREN_E2E_AGENT_LOG", agent_log.to_str().unwrap())];
    let agent = Agent::start_with(&[], &env, None).await.expect("agent starts");
    let gw_bin = warren_e2e::bin("warren-gateway");
    let records = std::env::var("WARREN_BENCH_RECORDS").ok();
    let extra: Vec<&str> = records.as_deref().map(|r| vec!["--records", r]).unwrap_or_default();
    let gw = Gateway::start_binary(&gw_bin, true, &[agent.address()], &extra, &[("RUST_LOG", "info,warren_api_gateway::execute=debug")], true).await.expect("gateway starts");
    println!("per-phase profile: {runs} inline HTTP calls per language (binaries from {})", warren_e2e::bin_dir().display());
    for (lang, interp, code) in [("bash", "/bin/bash", "echo 1"), ("python", "/usr/bin/python3", "print(1)")] {
        let script = dir.path().join(format!("bench-{lang}"));
        std::fs::File::create(&script).unwrap().write_all(code.as_bytes()).unwrap();
        let body = serde_json::json!({"language": lang, "code": code});
        for _ in 0..5 {
            assert_eq!(gw.execute(&key("main"), &body).status, 200);
        }
        let (gw_before, agent_before) = (gw.logs().len(), std::fs::read_to_string(&agent_log).unwrap_or_default().len());
        let (mut bare_t, mut total) = (Vec::new(), Vec::new());
        for _ in 0..runs {
            bare_t.push(bare(interp, &script));
            let t = Instant::now();
            let r = gw.execute(&key("main"), &body);
            total.push(t.elapsed());
            assert_eq!((r.status, r.json()["stdout"].as_str()), (200, Some("1\n")), "{}", r.text());
            // Let the pool refill between calls, as between an agent's tool calls.
            std::thread::sleep(pause);
        }
        let gw_log = gw.logs()[gw_before..].join("\n");
        let agent_text = std::fs::read_to_string(&agent_log).unwrap_or_default()[agent_before..].to_string();
        if let Ok(keep) = std::env::var("WARREN_BENCH_KEEP_LOGS") {
            std::fs::write(format!("{keep}/gateway-{lang}.log"), &gw_log).unwrap();
            std::fs::write(format!("{keep}/agent-{lang}.log"), &agent_text).unwrap();
        }
        println!("{lang} (p50, p99)");
        row("bare process", bare_t);
        row("client round trip (HTTP)", total);
        for (message, prefix) in [("admission phases", "gateway "), ("execution phases\"", "gateway "), ("admission phases", "agent "), ("execution phases", "agent "), ("phases", "agent sandbox "), ("execution finished", "agent program ")] {
            let log = if prefix.starts_with("gateway") { &gw_log } else { &agent_text };
            // The agent's own lines: a plain message, not the gateway's JSON.
            let fields = phase_fields(log, message);
            for (k, v) in fields {
                if (prefix == "agent sandbox " && !["exit_us", "drained_us"].contains(&k.as_str())) || (prefix == "agent program " && k != "wall_us") {
                    continue;
                }
                row(&format!("{prefix}{}", k.trim_end_matches("_us")), v);
            }
        }
    }
}
