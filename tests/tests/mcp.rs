//! The MCP endpoint with the official MCP Python client (PyPI `mcp`, in a
//! virtualenv this test makes), against a real gateway and node-agent:
//! initialize, the tool list and schemas, `sandbox_execute` in Python, Node
//! and Bash, tool errors, files through a thread, a bad key refused, and a
//! caller's `traceparent` reaching the program (tests/sdk/check_mcp.py). The calls are recorded with delivery mode `mcp`.

use std::path::Path;
use std::process::Command;

use warren_e2e::gateway::{key, Gateway};
use warren_e2e::{skip_unless_root, Agent};

const MCP: &str = "mcp==2.3.0";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_official_mcp_client_uses_warren_tools() {
    if skip_unless_root("the_official_mcp_client_uses_warren_tools") {
        return;
    }
    let venv = tokio::task::spawn_blocking(|| warren_e2e::python::venv("mcp-venv", MCP)).await.unwrap();
    let agent = Agent::start(&[]).await.unwrap();
    let gw = Gateway::start(&[agent.address()], &[], true).await.unwrap();
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("sdk/check_mcp.py");
    let mut cmd = Command::new(venv.join("bin/python"));
    cmd.arg(&script).env("WARREN_URL", format!("http://{}", gw.addr)).env("WARREN_KEY", key("main"));
    let out = tokio::task::spawn_blocking(move || cmd.output()).await.unwrap().unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "MCP checks failed:\n{stdout}\n{}", String::from_utf8_lossy(&out.stderr));
    for check in ["initialize_and_list_tools", "sandbox_execute_python_node_bash", "failures_are_tool_errors", "files_round_trip", "bad_key", "traced_call"] {
        assert!(stdout.contains(&format!("ok {check}")), "{check} did not run:\n{stdout}");
    }
    let list = gw.get(&key("main"), "/v1/executions?limit=200").json();
    let modes: Vec<&str> = list["executions"].as_array().unwrap().iter().filter_map(|e| e["delivery_mode"].as_str()).collect();
    assert!(modes.iter().filter(|m| **m == "mcp").count() >= 5, "MCP calls are recorded: {modes:?}");
}
