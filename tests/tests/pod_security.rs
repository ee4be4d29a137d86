//! The node-agent without `privileged`: the chart's DaemonSet drops every
//! capability but a listed few, and the agent runs sandboxes with exactly
//! those, inside a mount namespace whose /proc is masked the way container
//! runtimes mask it (`tests/support/unprivileged-container.sh`).

use std::path::Path;
use std::process::Command;

use serde_json::json;
use warren_e2e::gateway::{key, Gateway};
use warren_e2e::{skip_unless_root, Agent};

fn repo(rel: &str) -> String {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..").join(rel).display().to_string()
}

/// The node-agent container's securityContext as the chart renders it.
fn rendered_security_context() -> serde_yaml::Value {
    let helm = warren_e2e::helm::helm().expect("helm available");
    let out = Command::new(helm).args(["template", "warren", &repo("charts/warren"), "--namespace", "warren-system"]).output().unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let text = String::from_utf8(out.stdout).unwrap();
    for doc in text.split("\n---") {
        let Ok(v) = serde_yaml::from_str::<serde_yaml::Value>(doc) else { continue };
        if v["kind"] == "DaemonSet" {
            return v["spec"]["template"]["spec"]["containers"][0]["securityContext"].clone();
        }
    }
    panic!("no DaemonSet rendered");
}

/// `SYS_ADMIN` → `sys_admin`, as setpriv names them.
fn cap_names(ctx: &serde_yaml::Value) -> Vec<String> {
    ctx["capabilities"]["add"].as_sequence().unwrap().iter().map(|c| c.as_str().unwrap().to_lowercase()).collect()
}

async fn agent_with(caps: &[String]) -> Agent {
    let wrapper = repo("tests/support/unprivileged-container.sh");
    let caps = caps.join(",");
    Agent::start_with(&["--pool-size", "1"], &[("WARREN_E2E_AGENT_WRAPPER", &wrapper), ("WARREN_CAPS", &caps)], None).await.unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_agent_runs_everything_with_only_the_charts_capabilities() {
    if skip_unless_root("the_agent_runs_everything_with_only_the_charts_capabilities") {
        return;
    }
    let ctx = rendered_security_context();
    assert_eq!(ctx["privileged"], serde_yaml::Value::Bool(false), "{ctx:?}");
    assert_eq!(ctx["capabilities"]["drop"][0], "ALL");
    let caps = cap_names(&ctx);
    assert!(!caps.iter().any(|c| c == "sys_module" || c == "sys_rawio" || c == "net_raw"), "{caps:?}");

    let agent = agent_with(&caps).await;
    let gw = Gateway::start(&[agent.address()], &[], true).await.unwrap();
    let run = |body: serde_json::Value| gw.execute(&key("main"), &body).json();
    for (lang, code, want) in [
        ("python", "import socket; print(len(socket.if_nameindex()) > 0)", "True\n"),
        ("node", "console.log(Object.keys(require('os').networkInterfaces()).join())", "lo\n"),
        ("bash", "id -u; wc -c < /proc/timer_list", "1000\n0\n"),
    ] {
        let r = run(json!({"language": lang, "code": code}));
        assert_eq!((r["exit_code"].as_i64(), r["stdout"].as_str()), (Some(0), Some(want)), "{lang}: {r}");
    }
    // A thread's home is saved and restored (chown/fowner on the saved files).
    let r = run(json!({"language": "bash", "code": "echo kept > ~/f; mkdir -p ~/d && chmod 700 ~/d", "thread_id": "caps"}));
    assert_eq!(r["exit_code"], 0, "{r}");
    let r = run(json!({"language": "bash", "code": "cat ~/f; stat -c %a ~/d", "thread_id": "caps"}));
    assert_eq!(r["stdout"], "kept\n700\n", "{r}");
    // The deadline still kills.
    let r = run(json!({"language": "bash", "code": "sleep 30", "timeout": 1}));
    assert_eq!(r["timed_out"], true, "{r}");
    drop(gw);
    drop(agent);

    // The wrapper really takes capabilities away: without SETUID nothing runs.
    let fewer: Vec<String> = caps.iter().filter(|c| *c != "setuid").cloned().collect();
    let agent = agent_with(&fewer).await;
    let gw = Gateway::start(&[agent.address()], &[], true).await.unwrap();
    let r = gw.execute(&key("main"), &json!({"language": "bash", "code": "echo ran"}));
    assert!(!r.text().contains("\"stdout\":\"ran\\n\""), "ran without SETUID: {}", r.text());
}
