//! End to end through the real gateway and the real node-agent: languages,
//! results, limits, streaming, admission, failures, audit, reload, shutdown.

use std::time::Duration;

use serde_json::json;
use warren_e2e::gateway::{key, wait_agent_running, wait_for, Gateway};
use warren_e2e::http;
use warren_e2e::{skip_unless_root, Agent};

async fn setup(test: &str, extra: &[&str]) -> Option<(Agent, Gateway)> {
    setup_with_agent(test, &[], extra).await
}

async fn setup_with_agent(test: &str, agent_args: &[&str], extra: &[&str]) -> Option<(Agent, Gateway)> {
    if skip_unless_root(test) {
        return None;
    }
    let agent = Agent::start(agent_args).await.unwrap();
    let gw = Gateway::start(&[agent.address()], extra, true).await.unwrap();
    Some((agent, gw))
}

/// Cancels the streamed execution whose response began with `head` (a
/// client that disconnects only detaches from it).
fn cancel(gw: &Gateway, key_name: &str, head: &str) {
    let trace = http::trace_id(head);
    let r = gw.post(&key(key_name), &format!("/v1/executions/{trace}/cancel"));
    assert_eq!((r.status, r.json()["status"].as_str()), (200, Some("cancelled")), "{}", r.text());
}

/// Waits (bounded) until the agent runs nothing; the sandbox is gone.
async fn assert_agent_idle(agent: &Agent) {
    assert!(wait_agent_running(agent, 0).await, "the agent still runs an execution after 10 s");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn python_node_and_bash_run_end_to_end() {
    let Some((_agent, gw)) = setup("python_node_and_bash_run_end_to_end", &[]).await else { return };
    let cases = [
        ("python", "import sys; print(sum(range(100))); print('err', file=sys.stderr)", "4950\n"),
        ("node", "console.log(6 * 7); console.error('err')", "42\n"),
        ("bash", "echo $((2 + 3)); echo err >&2", "5\n"),
    ];
    for (language, code, stdout) in cases {
        let r = gw.execute(&key("main"), &json!({"code": code, "language": language}));
        assert_eq!(r.status, 200, "{language}: {}", r.text());
        let v = r.json();
        assert_eq!(v["stdout"], stdout, "{language}");
        assert_eq!(v["stderr"], "err\n", "{language}");
        assert_eq!((v["success"].as_bool(), v["exit_code"].as_i64(), v["error"].is_null()), (Some(true), Some(0), true), "{language}");
        let trace = v["trace_id"].as_str().unwrap();
        assert!(trace.starts_with("trc_") && trace.len() == 24, "{trace}");
        assert_eq!(r.header("x-trace-id"), Some(trace));
        assert!(v["peak_memory_bytes"].as_u64().unwrap() > 0);
        for f in ["duration_ms", "cpu_ms"] {
            assert!(v[f].is_u64(), "{f}");
        }
        assert_eq!((v["timed_out"].as_bool(), v["oom_killed"].as_bool(), v["signal"].is_null()), (Some(false), Some(false), true));
    }
    let r = gw.execute(&key("main"), &json!({"code": "exit 3", "language": "bash"}));
    let v = r.json();
    assert_eq!((r.status, v["success"].as_bool(), v["exit_code"].as_i64(), v["error"].is_null()), (200, Some(false), Some(3), true));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn timeout_returns_the_output_produced_before_the_kill() {
    let Some((agent, gw)) = setup("timeout_returns_the_output_produced_before_the_kill", &[]).await else { return };
    let code = "import time\nprint('before', flush=True)\ntime.sleep(60)\nprint('after')";
    let r = gw.execute(&key("short"), &json!({"code": code, "timeout": 1}));
    assert_eq!(r.status, 200, "a timeout is a result, not an HTTP error: {}", r.text());
    let v = r.json();
    assert_eq!(v["stdout"], "before\n");
    assert_eq!((v["timed_out"].as_bool(), v["error"].as_str(), v["success"].as_bool()), (Some(true), Some("timeout"), Some(false)));
    assert_eq!((v["exit_code"].as_i64(), v["signal"].as_i64()), (Some(137), Some(9)));
    assert_agent_idle(&agent).await;
    // The key's maximum is 5 s: asking for more is refused before anything runs.
    let r = gw.execute(&key("short"), &json!({"code": "print(1)", "timeout": 6}));
    assert_eq!((r.status, r.json()["field"].as_str()), (400, Some("timeout")));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn output_beyond_the_sandbox_cap_is_truncated_and_flagged() {
    let Some((_agent, gw)) = setup("output_beyond_the_sandbox_cap_is_truncated_and_flagged", &[]).await else { return };
    // The Sandbox caps each stream at 64Ki.
    let r = gw.execute(&key("main"), &json!({"code": "import sys\nsys.stdout.write('x' * 200000)\nsys.stderr.write('e' * 10)"}));
    let v = r.json();
    assert_eq!(r.status, 200);
    assert_eq!(v["stdout"].as_str().unwrap().len(), 64 * 1024);
    assert_eq!((v["stdout_truncated"].as_bool(), v["stderr_truncated"].as_bool()), (Some(true), Some(false)));
    assert_eq!((v["stderr"].as_str(), v["success"].as_bool()), (Some("eeeeeeeeee"), Some(true)));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn env_scopes_merge_and_metadata_never_reaches_the_sandbox() {
    let Some((_agent, gw)) = setup("env_scopes_merge_and_metadata_never_reaches_the_sandbox", &[]).await else { return };
    let code = "for v in SB_ONLY KEY_ONLY SHARED REQ_ONLY; do echo \"$v=${!v}\"; done; \
                cat /proc/self/environ | tr '\\0' '\\n' > /tmp/env; grep -rs 'marker-5150' /tmp/env /home /etc /tmp && echo LEAK; \
                grep -s 'sk-wrn' /tmp/env && echo KEYLEAK; true";
    let body = json!({"code": code, "language": "bash", "env_vars": {"REQ_ONLY": "request"}, "metadata": {"user": "marker-5150"}});
    let v = gw.execute(&key("main"), &body).json();
    assert_eq!(v["stdout"], "SB_ONLY=sandbox\nKEY_ONLY=key\nSHARED=key\nREQ_ONLY=request\n", "{v}");
    let body = json!({"code": "echo $SHARED", "language": "bash", "env_vars": {"SHARED": "request"}});
    assert_eq!(gw.execute(&key("main"), &body).json()["stdout"], "request\n", "the request scope wins");
    let audited = || gw.audit_records().iter().any(|a| a["metadata"].as_str().is_some_and(|m| m.contains("marker-5150")));
    assert!(wait_for(Duration::from_secs(10), audited), "metadata is audited");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn streaming_delivers_events_in_order_with_increasing_seq() {
    let Some((_agent, gw)) = setup("streaming_delivers_events_in_order_with_increasing_seq", &["--keepalive-ms", "200"]).await else { return };
    let code = "echo one; sleep 0.2; echo two >&2; sleep 1.5; echo three; exit 4";
    let (r, lines) = gw.execute_stream(&key("main"), &json!({"code": code, "language": "bash"}));
    assert_eq!(r.status, 200, "{}", r.text());
    assert_eq!(r.header("content-type"), Some("application/x-ndjson"));
    let seqs: Vec<u64> = lines.iter().map(|l| l["seq"].as_u64().unwrap()).collect();
    assert_eq!(seqs, (1..=seqs.len() as u64).collect::<Vec<_>>(), "seq counts up from 1");
    assert_eq!((lines[0]["type"].as_str(), lines[0]["status"].as_str()), (Some("status"), Some("running")));
    let outputs: Vec<(String, String)> = lines
        .iter()
        .filter(|l| l["type"] == "output")
        .map(|l| (l["stream"].as_str().unwrap().to_string(), l["data"].as_str().unwrap().to_string()))
        .collect();
    let want = [("stdout", "one\n"), ("stderr", "two\n"), ("stdout", "three\n")].map(|(a, b)| (a.to_string(), b.to_string()));
    assert_eq!(outputs, want);
    // 1.5 s of silence with a 200 ms keepalive period: keepalives, between two and three.
    let two = lines.iter().position(|l| l["data"] == "two\n").unwrap();
    let three = lines.iter().position(|l| l["data"] == "three\n").unwrap();
    assert!(lines[two..three].iter().any(|l| l["type"] == "keepalive"), "{lines:?}");
    let last = lines.last().unwrap();
    assert_eq!((last["type"].as_str(), last["status"].as_str()), (Some("result"), Some("failed")));
    assert_eq!(last["result"]["exit_code"], 4);
    assert_eq!(last["result"]["stdout"], "one\nthree\n");
    assert_eq!(last["trace_id"], lines[0]["trace_id"]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_that_disconnects_mid_stream_detaches_and_resumes_the_output() {
    let test = "a_client_that_disconnects_mid_stream_detaches_and_resumes_the_output";
    let Some((agent, gw)) = setup_with_agent(test, &["--pool-size", "0"], &[]).await else { return };
    let code = "echo started; sleep 1; echo done";
    let req = http::execute_request(gw.addr, &key("main"), &json!({"code": code, "language": "bash"}), true);
    let (conn, head) = http::open_until(gw.addr, &req, "started").unwrap();
    let trace = http::trace_id(&head);
    drop(conn);
    // The execution runs on without its client; the output resumes after the
    // lines already seen (status = 1, "started" = 2) and ends with the result.
    let resumed = gw.get(&key("main"), &format!("/v1/executions/{trace}/output?after_seq=2"));
    assert_eq!(resumed.status, 200, "{}", resumed.text());
    let lines = http::ndjson(&resumed);
    let data: Vec<&str> = lines.iter().filter_map(|l| l["data"].as_str()).collect();
    assert_eq!(data, ["done\n"], "{lines:?}");
    let last = lines.last().unwrap();
    assert_eq!((last["type"].as_str(), last["result"]["stdout"].as_str(), last["result"]["exit_code"].as_i64()), (Some("result"), Some("started\ndone\n"), Some(0)));
    assert_agent_idle(&agent).await;
    assert!(gw.audit_records().iter().all(|a| a["outcome"] == "success"), "{:?}", gw.audit_records());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_that_disconnects_from_a_plain_request_kills_the_execution() {
    let test = "a_client_that_disconnects_from_a_plain_request_kills_the_execution";
    let Some((agent, gw)) = setup_with_agent(test, &["--pool-size", "0"], &[]).await else { return };
    let req = http::execute_request(gw.addr, &key("main"), &json!({"code": "sleep 50", "language": "bash"}), false);
    let mut conn = std::net::TcpStream::connect(gw.addr).unwrap();
    std::io::Write::write_all(&mut conn, &req).unwrap();
    assert!(wait_agent_running(&agent, 1).await, "the execution never started");
    drop(conn);
    assert_agent_idle(&agent).await;
    assert!(wait_for(Duration::from_secs(10), || gw.audit_records().iter().any(|a| a["outcome"] == "cancelled")));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_key_at_its_concurrency_limit_gets_429_with_retry_after() {
    let Some((agent, gw)) = setup("a_key_at_its_concurrency_limit_gets_429_with_retry_after", &[]).await else { return };
    let req = http::execute_request(gw.addr, &key("single"), &json!({"code": "echo started; sleep 50", "language": "bash"}), true);
    let (conn, head) = http::open_until(gw.addr, &req, "started").unwrap();
    let r = gw.execute(&key("single"), &json!({"code": "print(1)"}));
    assert_eq!((r.status, r.json()["error"].as_str(), r.header("retry-after")), (429, Some("concurrency_limit"), Some("1")));
    // Other keys are not affected.
    assert_eq!(gw.execute(&key("main"), &json!({"code": "print(1)"})).status, 200);
    drop(conn);
    cancel(&gw, "single", &head);
    assert_agent_idle(&agent).await;
    assert!(wait_for(Duration::from_secs(10), || gw.execute(&key("single"), &json!({"code": "print(1)"})).status == 200));
}

/// Two gateway replicas over two agents: the key's slots are counted on one
/// agent both replicas pick, so a limit of 1 holds across them.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_keys_concurrency_limit_holds_across_gateway_replicas() {
    if skip_unless_root("a_keys_concurrency_limit_holds_across_gateway_replicas") {
        return;
    }
    let a = Agent::start(&["--node-name", "node-a"]).await.unwrap();
    let b = Agent::start(&["--node-name", "node-b"]).await.unwrap();
    let agents = [a.address(), b.address()];
    let one = Gateway::start(&agents, &[], true).await.unwrap();
    let two = Gateway::start(&agents, &[], true).await.unwrap();
    assert!(wait_for(Duration::from_secs(10), || http::get(two.addr, "/readyz").status == 200));
    let req = http::execute_request(one.addr, &key("single"), &json!({"code": "echo started; sleep 50", "language": "bash"}), true);
    let (conn, head) = http::open_until(one.addr, &req, "started").unwrap();
    let r = two.execute(&key("single"), &json!({"code": "print(1)"}));
    assert_eq!((r.status, r.json()["error"].as_str()), (429, Some("concurrency_limit")), "the other replica admitted a second execution: {}", r.text());
    assert_eq!(two.execute(&key("main"), &json!({"code": "print(1)"})).status, 200, "other keys are not affected");
    drop(conn);
    cancel(&one, "single", &head);
    assert_agent_idle(&a).await;
    assert_agent_idle(&b).await;
    assert!(wait_for(Duration::from_secs(10), || two.execute(&key("single"), &json!({"code": "print(1)"})).status == 200), "the slot never came back");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_busy_thread_gets_409() {
    let Some((agent, gw)) = setup("a_busy_thread_gets_409", &[]).await else { return };
    let body = json!({"code": "echo started; sleep 50", "language": "bash", "thread_id": "t-1"});
    let (conn, head) = http::open_until(gw.addr, &http::execute_request(gw.addr, &key("main"), &body, true), "started").unwrap();
    let r = gw.execute(&key("main"), &json!({"code": "print(1)", "thread_id": "t-1"}));
    assert_eq!((r.status, r.json()["error"].as_str()), (409, Some("thread_busy")));
    assert_eq!(gw.execute(&key("main"), &json!({"code": "print(1)", "thread_id": "t-2"})).status, 200, "other threads run");
    assert_eq!(gw.execute(&key("short"), &json!({"code": "print(1)", "thread_id": "t-1"})).status, 200, "threads are per key");
    drop(conn);
    cancel(&gw, "main", &head);
    assert_agent_idle(&agent).await;
    assert!(wait_for(Duration::from_secs(10), || gw.execute(&key("main"), &json!({"code": "print(1)", "thread_id": "t-1"})).status == 200));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_agent_dying_mid_execution_is_reported_and_then_503() {
    let Some((mut agent, gw)) = setup("an_agent_dying_mid_execution_is_reported_and_then_503", &[]).await else { return };
    let addr = gw.addr;
    let req = http::execute_request(addr, &key("main"), &json!({"code": "echo started; sleep 50", "language": "bash"}), false);
    let call = std::thread::spawn(move || http::raw(addr, &req).unwrap());
    assert!(wait_agent_running(&agent, 1).await, "the execution never started");
    agent.kill_hard();
    let r = call.join().unwrap();
    assert_eq!((r.status, r.json()["error"].as_str()), (502, Some("node_lost")), "{}", r.text());
    assert!(wait_for(Duration::from_secs(10), || http::get(gw.addr, "/readyz").status == 503));
    let r = gw.execute(&key("main"), &json!({"code": "print(1)"}));
    assert_eq!((r.status, r.json()["error"].as_str(), r.header("retry-after")), (503, Some("unavailable"), Some("1")));
    assert!(wait_for(Duration::from_secs(10), || gw.audit_records().iter().any(|a| a["outcome"] == "node_lost")));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_a_reachable_agent_requests_get_503() {
    if skip_unless_root("without_a_reachable_agent_requests_get_503") {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let nowhere = format!("unix:{}", dir.path().join("none.sock").display());
    let gw = Gateway::start(&[nowhere], &[], false).await.unwrap();
    assert_eq!(http::get(gw.addr, "/healthz").status, 200);
    let r = http::get(gw.addr, "/readyz");
    assert_eq!((r.status, r.json()["status"].as_str()), (503, Some("not_ready")));
    let r = gw.execute(&key("main"), &json!({"code": "print(1)"}));
    assert_eq!((r.status, r.json()["error"].as_str(), r.header("retry-after")), (503, Some("unavailable"), Some("1")));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_gateway_with_the_wrong_agent_token_runs_nothing() {
    if skip_unless_root("a_gateway_with_the_wrong_agent_token_runs_nothing") {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let (right, wrong) = (dir.path().join("right"), dir.path().join("wrong"));
    std::fs::write(&right, "right-token-0123456789abcdef").unwrap();
    std::fs::write(&wrong, "wrong-token-0123456789abcdef").unwrap();
    let pki = warren_e2e::pki::Pki::new();
    let port = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
    let listen = format!("127.0.0.1:{port}");
    let args = pki.tcp_agent_args(&listen, &right);
    let agent = Agent::start_no_wait(&args.iter().map(String::as_str).collect::<Vec<_>>()).unwrap();
    assert!(wait_for(Duration::from_secs(20), || std::net::TcpStream::connect(&listen).is_ok()), "agent does not listen");
    let gateway_with = |token: &std::path::Path| {
        let mut a = vec!["--agent-token-file".to_string(), token.display().to_string()];
        a.extend(pki.gateway_args());
        a
    };
    let wrong_args = gateway_with(&wrong);
    let gw = Gateway::start(&[format!("https://{listen}")], &wrong_args.iter().map(String::as_str).collect::<Vec<_>>(), false).await.unwrap();
    let r = gw.execute(&key("main"), &json!({"code": "open('/tmp/ran', 'w')"}));
    assert_eq!((r.status, r.json()["error"].as_str()), (503, Some("unavailable")), "{}", r.text());
    assert_eq!(http::get(gw.addr, "/readyz").status, 503, "a node that refuses the gateway's token is not ready");
    assert!(agent.sandbox_processes().is_empty() && agent.leftover_cgroups().is_empty(), "nothing ran");
    // The same gateway setup with the right token works: the refusal was the token.
    let right_args = gateway_with(&right);
    let gw = Gateway::start(&[format!("https://{listen}")], &right_args.iter().map(String::as_str).collect::<Vec<_>>(), true).await.unwrap();
    assert_eq!(gw.execute(&key("main"), &json!({"code": "print(1)"})).status, 200);
}

/// A gateway sends code only to a server whose certificate comes from the
/// agent CA: a listener holding a gateway-CA certificate (anything but an
/// agent) gets no request, even with the right token.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_gateway_sends_nothing_to_a_server_without_an_agent_certificate() {
    if skip_unless_root("a_gateway_sends_nothing_to_a_server_without_an_agent_certificate") {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let token = dir.path().join("token");
    std::fs::write(&token, "right-token-0123456789abcdef").unwrap();
    let pki = warren_e2e::pki::Pki::new();
    let listen = format!("127.0.0.1:{}", std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port());
    let (cert, key_file, ca) = (pki.gateway.cert.display().to_string(), pki.gateway.key.display().to_string(), pki.gateway_ca.display().to_string());
    let impostor = Agent::start_no_wait(&[
        "--listen-tcp", &listen, "--token-file", token.to_str().unwrap(), "--pool-size", "0",
        "--tls-cert-file", &cert, "--tls-key-file", &key_file, "--tls-client-ca-file", &ca,
    ])
    .unwrap();
    assert!(wait_for(Duration::from_secs(20), || std::net::TcpStream::connect(&listen).is_ok()), "agent does not listen");
    let mut args = vec!["--agent-token-file".to_string(), token.display().to_string()];
    args.extend(pki.gateway_args());
    let gw = Gateway::start(&[format!("https://{listen}")], &args.iter().map(String::as_str).collect::<Vec<_>>(), false).await.unwrap();
    let r = gw.execute(&key("main"), &json!({"code": "print(1)"}));
    assert_eq!(r.status, 503, "{}", r.text());
    assert!(impostor.sandbox_processes().is_empty() && impostor.leftover_cgroups().is_empty(), "nothing ran");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_execution_has_exactly_one_audit_record_without_secrets() {
    let Some((_agent, gw)) = setup("every_execution_has_exactly_one_audit_record_without_secrets", &[]).await else { return };
    let mut ids = Vec::new();
    for (i, lang) in ["python", "bash", "node"].iter().enumerate() {
        let code = match *lang {
            "python" => "print('code-marker-python')",
            "bash" => "echo code-marker-bash; exit 2",
            _ => "console.log('code-marker-node')",
        };
        let body = json!({"code": code, "language": lang, "thread_id": format!("th-{i}"), "metadata": {"run": i.to_string()}});
        ids.push(gw.execute(&key("main"), &body).json()["trace_id"].as_str().unwrap().to_string());
    }
    let (_, lines) = gw.execute_stream(&key("main"), &json!({"code": "print('code-marker-stream')"}));
    ids.push(lines[0]["trace_id"].as_str().unwrap().to_string());
    assert!(wait_for(Duration::from_secs(10), || gw.audit_records().len() >= ids.len()));
    let audit = gw.audit_records();
    assert_eq!(audit.len(), ids.len(), "{audit:?}");
    for id in &ids {
        let recs: Vec<_> = audit.iter().filter(|a| a["execution_id"] == id.as_str()).collect();
        assert_eq!(recs.len(), 1, "{id}");
        for f in ["key", "namespace", "sandbox", "language", "thread_id", "metadata", "duration_ms", "exit_code", "outcome"] {
            assert!(!recs[0][f].is_null(), "{f} missing in {:?}", recs[0]);
        }
        assert_eq!((recs[0]["key"].as_str(), recs[0]["namespace"].as_str(), recs[0]["sandbox"].as_str()), (Some("main"), Some("default"), Some("sb")));
    }
    let bash = audit.iter().find(|a| a["language"] == "bash").unwrap();
    assert_eq!((bash["exit_code"].as_i64(), bash["outcome"].as_str(), bash["thread_id"].as_str()), (Some(2), Some("failed"), Some("th-1")));
    for line in gw.logs() {
        assert!(!line.contains("sk-wrn-"), "a log line holds a key: {line}");
        assert!(!line.contains("code-marker"), "a log line holds code: {line}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn manifests_reload_on_change_and_bad_yaml_keeps_the_old_config() {
    let Some((_agent, gw)) = setup("manifests_reload_on_change_and_bad_yaml_keeps_the_old_config", &[]).await else { return };
    let new_key = key("added");
    let file = gw.manifest_dir().join("added.yaml");
    let manifest = format!(
        "apiVersion: warren.dev/v1alpha1\nkind: ApiKey\nmetadata: {{name: added}}\nspec: {{sandboxRef: {{name: sb}}}}\n---\n\
         apiVersion: v1\nkind: Secret\nmetadata: {{name: added-key}}\nstringData: {{key: {new_key}}}\n"
    );
    assert_eq!(gw.execute(&new_key, &json!({"code": "print(1)"})).status, 401);
    std::fs::write(&file, manifest).unwrap();
    assert!(wait_for(Duration::from_secs(10), || gw.execute(&new_key, &json!({"code": "print(1)"})).status == 200));
    // A half-written file: the previous configuration stays in force.
    std::fs::write(gw.manifest_dir().join("broken.yaml"), "kind: [unclosed\n").unwrap();
    assert!(wait_for(Duration::from_secs(10), || gw.logs().iter().any(|l| l.contains("configuration not reloaded"))));
    assert_eq!(gw.execute(&new_key, &json!({"code": "print(1)"})).status, 200);
    assert_eq!(gw.execute(&key("main"), &json!({"code": "print(1)"})).status, 200);
    // Fixed and the key removed: it stops working, but an execution it
    // started before the reload finishes undisturbed.
    let req = http::execute_request(gw.addr, &new_key, &json!({"code": "echo started; sleep 3; echo done", "language": "bash"}), true);
    let (mut conn, seen) = http::open_until(gw.addr, &req, "started").unwrap();
    std::fs::remove_file(gw.manifest_dir().join("broken.yaml")).unwrap();
    std::fs::remove_file(&file).unwrap();
    assert!(wait_for(Duration::from_secs(10), || gw.execute(&new_key, &json!({"code": "print(1)"})).status == 401));
    let mut rest = String::new();
    std::io::Read::read_to_string(&mut conn, &mut rest).unwrap();
    let all = seen + &rest;
    assert!(all.contains(r#""data":"done\n""#) && all.contains(r#""status":"success""#), "{all}");
    assert_eq!(gw.execute(&key("main"), &json!({"code": "print(1)"})).status, 200);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shutdown_drains_in_flight_executions() {
    let Some((agent, mut gw)) = setup("shutdown_drains_in_flight_executions", &[]).await else { return };
    let addr = gw.addr;
    let req = http::execute_request(addr, &key("main"), &json!({"code": "sleep 1; echo done", "language": "bash"}), false);
    let call = std::thread::spawn(move || http::raw(addr, &req).unwrap());
    assert!(wait_agent_running(&agent, 1).await, "the execution never started");
    gw.terminate();
    let r = call.join().unwrap();
    assert_eq!((r.status, r.json()["stdout"].as_str()), (200, Some("done\n")));
    let status = gw.wait_exit(Duration::from_secs(20)).expect("gateway exits after draining");
    assert!(status.success(), "{status:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn operations_endpoints_and_the_openapi_document() {
    let Some((_agent, gw)) = setup("operations_endpoints_and_the_openapi_document", &[]).await else { return };
    assert_eq!(http::get(gw.addr, "/healthz").json()["status"], "ok");
    assert_eq!(http::get(gw.addr, "/readyz").json()["status"], "ok");
    gw.execute(&key("main"), &json!({"code": "print(1)"}));
    gw.execute(&key("main"), &json!({"code": "exit 1", "language": "bash"}));
    gw.execute(&key("nobody"), &json!({"code": "print(1)"}));
    let m = http::get(gw.addr, "/metrics").text();
    for want in [
        r#"warren_gateway_http_requests_total{route="/v1/sandbox/execute",status="200"} 2"#,
        r#"warren_gateway_http_requests_total{route="/v1/sandbox/execute",status="401"} 1"#,
        r#"warren_gateway_execution_duration_seconds_count{language="python",outcome="success"} 1"#,
        r#"warren_gateway_execution_duration_seconds_count{language="bash",outcome="failed"} 1"#,
        "warren_gateway_executions_in_flight 0",
        "warren_gateway_healthy_nodes 1",
    ] {
        assert!(m.contains(want), "{want} not in:\n{m}");
    }
    // The nodes' warm pools, as their status answers say: sandboxes, and the memory they hold.
    let gauge = |m: &str, name: &str| m.lines().find_map(|l| l.strip_prefix(name)?.strip_prefix(' ')?.trim().parse::<u64>().ok());
    let mut m = String::new();
    let warm = warren_e2e::gateway::wait_for(Duration::from_secs(20), || {
        m = http::get(gw.addr, "/metrics").text();
        gauge(&m, "warren_gateway_warm_sandboxes").is_some_and(|n| n >= 1) && gauge(&m, "warren_gateway_warm_sandbox_memory_bytes").is_some_and(|b| b > 0)
    });
    assert!(warm, "the warm pool is reported:\n{m}");
    // Raw paths never become labels.
    http::get(gw.addr, "/no/such/path/12345");
    assert!(!http::get(gw.addr, "/metrics").text().contains("12345"));
    let served = http::get(gw.addr, "/openapi.json");
    let committed = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/../api-gateway/openapi.json")).unwrap();
    assert_eq!(served.text(), committed, "the served document is the committed one");
}
