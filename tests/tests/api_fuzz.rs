//! Property-based run of the served OpenAPI document against the
//! single-machine gateway and a real node-agent: schemathesis (from PyPI,
//! in a virtualenv this test makes) generates valid and invalid requests
//! for every operation and checks each response against the document.
//! Bounded in examples per operation and in time.
//!
//! One check is left out: `positive_data_acceptance` (every schema-valid
//! request must succeed). Some rules depend on the key and cannot be put in
//! a schema — reserved environment names, the key's languages and timeout
//! cap, storage mounts the key has, the `Prefer` header a webhook needs —
//! and such requests get the documented 400 naming the field instead.

use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use warren_e2e::gateway::{key, Gateway};
use warren_e2e::{skip_unless_root, Agent};

const SCHEMATHESIS: &str = "schemathesis==4.32.5";
/// Generated cases per operation and phase.
const EXAMPLES: &str = "100";
/// Longest the run may take.
const LIMIT: Duration = Duration::from_secs(600);

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_api_honours_its_openapi_document_under_fuzzing() {
    if skip_unless_root("the_api_honours_its_openapi_document_under_fuzzing") {
        return;
    }
    let venv = tokio::task::spawn_blocking(|| warren_e2e::python::venv("schemathesis-venv", SCHEMATHESIS)).await.unwrap();
    let agent = Agent::start(&[]).await.unwrap();
    let gw = Gateway::start(&[agent.address()], &[], true).await.unwrap();
    let report = tempfile::tempdir().unwrap();
    // `bin/python -m`: the venv was built elsewhere and moved, so its
    // scripts' shebangs are stale; its interpreter is not.
    let mut cmd = Command::new(venv.join("bin/python"));
    cmd.args(["-m", "schemathesis.cli", "run"])
        .arg(format!("http://{}/openapi.json", gw.addr))
        .args(["--header", &format!("Authorization: Bearer {}", key("main"))])
        .args(["--checks", "all", "--exclude-checks", "positive_data_acceptance"])
        // One worker: Hypothesis parses the source of schemathesis's filters
        // as it builds them, and CPython 3.11's `ast` is not safe from two
        // threads at once ("AST constructor recursion depth mismatch", a
        // crash of the tool that says nothing about the API).
        .args(["--max-examples", EXAMPLES, "--workers", "1", "--request-timeout", "60", "--max-failures", "20"])
        .args(["--seed", "20261124", "--no-color"])
        .current_dir(report.path())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    let out = tokio::task::spawn_blocking(move || run_bounded(cmd, LIMIT)).await.unwrap();
    let (ok, stdout, stderr) = out;
    let summary: Vec<&str> = stdout.lines().filter(|l| l.contains("generated") || l.contains("passed") || l.contains("failed")).collect();
    eprintln!("schemathesis: {}", summary.join(" | "));
    assert!(ok, "responses contradict the document or are server errors:\n{stdout}\n{stderr}");
    assert!(stdout.contains("generated") && !stdout.contains(" 0 generated"), "cases were generated:\n{stdout}");
    // And nothing crashed or was left running.
    assert_eq!(warren_e2e::http::get(gw.addr, "/healthz").status, 200);
    assert!(warren_e2e::gateway::wait_agent_running(&agent, 0).await);
}

/// Runs `cmd` for at most `limit` (killed after it); returns success and output.
fn run_bounded(mut cmd: Command, limit: Duration) -> (bool, String, String) {
    let mut child = cmd.spawn().expect("schemathesis starts");
    let (mut out, mut err) = (child.stdout.take().unwrap(), child.stderr.take().unwrap());
    let o = std::thread::spawn(move || std::io::read_to_string(&mut out).unwrap_or_default());
    let e = std::thread::spawn(move || std::io::read_to_string(&mut err).unwrap_or_default());
    let t = Instant::now();
    let status = loop {
        if let Some(s) = child.try_wait().unwrap() {
            break Some(s);
        }
        if t.elapsed() > limit {
            let _ = child.kill();
            let _ = child.wait();
            break None;
        }
        std::thread::sleep(Duration::from_millis(100));
    };
    let (stdout, stderr) = (o.join().unwrap(), e.join().unwrap());
    assert!(status.is_some(), "schemathesis ran longer than {limit:?}:\n{stdout}");
    (status.is_some_and(|s| s.success()), stdout, stderr)
}
