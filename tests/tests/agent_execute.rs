//! The node-agent's Execute/Status contract against the real agent binary:
//! languages, streaming, status codes, concurrency, auth, crash recovery.

use warren_proto::agent::Failure;
use std::time::Duration;

use tonic::Code;
use warren_e2e::{request, skip_unless_root, Agent};
use warren_proto::agent::{execute_event::Event, Language, Limits, StatusRequest};

const T: Duration = Duration::from_secs(30);

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn runs_python_node_and_bash_with_accounting() {
    if skip_unless_root("runs_python_node_and_bash_with_accounting") {
        return;
    }
    let agent = Agent::start(&[]).await.unwrap();
    let cases = [
        (Language::Python, "import sys; print(sum(range(100))); print('e', file=sys.stderr); sys.exit(3)", "4950\n", "e\n", 3),
        (Language::Node, "console.log([1,2,3].map(x => x * 2).join(',')); console.error('e'); process.exitCode = 4", "2,4,6\n", "e\n", 4),
        (Language::Bash, "echo $((6 * 7)); echo e >&2; exit 5", "42\n", "e\n", 5),
    ];
    for (lang, code, out, err, exit) in cases {
        let r = agent.run(lang, code, T).await.unwrap();
        assert_eq!((r.stdout.as_str(), r.stderr.as_str(), r.exited.exit_code), (out, err, exit), "{lang:?}");
        assert!(!r.exited.timed_out && !r.exited.oom_killed && r.exited.failure() == Failure::Unspecified);
        assert!(r.exited.wall_micros > 0 && r.exited.cpu_micros > 0 && r.exited.peak_memory_bytes.is_some_and(|p| p > 0), "{:?}", r.exited);
        let started = r.started.expect("Started event");
        assert!(started.execution_id.starts_with("exe_") && !started.node_name.is_empty());
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn output_streams_in_order_while_the_program_runs() {
    if skip_unless_root("output_streams_in_order_while_the_program_runs") {
        return;
    }
    let agent = Agent::start(&[]).await.unwrap();
    let mut client = agent.client().await.unwrap();
    let code = "echo one; echo two >&2; echo three; sleep 2; echo four";
    let mut stream = client.execute(request(Language::Bash, code, T)).await.unwrap().into_inner();
    let first = stream.message().await.unwrap().unwrap();
    assert!(matches!(first.event, Some(Event::Started(_))), "Started comes first");
    let mut seen = Vec::new();
    let mut before_exit = String::new();
    while let Some(ev) = stream.message().await.unwrap() {
        match ev.event {
            Some(Event::Stdout(c)) => {
                let t = String::from_utf8_lossy(&c.data).into_owned();
                seen.push(format!("o:{t}"));
                before_exit.push_str(&t);
            }
            Some(Event::Stderr(c)) => seen.push(format!("e:{}", String::from_utf8_lossy(&c.data))),
            Some(Event::Exited(e)) => {
                assert_eq!(e.exit_code, 0);
                break;
            }
            _ => {}
        }
    }
    let stdout: String = seen.iter().filter_map(|s| s.strip_prefix("o:")).collect();
    assert_eq!(stdout, "one\nthree\nfour\n");
    assert!(seen.iter().any(|s| s == "e:two\n"));
    assert!(seen.len() >= 3, "output arrived in several chunks as produced: {seen:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn malformed_requests_get_invalid_argument_and_nothing_runs() {
    if skip_unless_root("malformed_requests_get_invalid_argument_and_nothing_runs") {
        return;
    }
    let agent = Agent::start(&[]).await.unwrap();
    let mut client = agent.client().await.unwrap();
    let ok = request(Language::Bash, "echo hi", T);
    let cases = vec![
        ("language", { let mut r = ok.clone(); r.language = 0; r }),
        ("language", { let mut r = ok.clone(); r.language = 99; r }),
        ("code", { let mut r = ok.clone(); r.code = String::new(); r }),
        ("code", { let mut r = ok.clone(); r.code = "#".repeat((1 << 20) + 1); r }),
        ("timeout", { let mut r = ok.clone(); r.timeout_ms = 0; r }),
        ("timeout", { let mut r = ok.clone(); r.timeout_ms = 3_601_000; r }),
        ("limits.memory_bytes", { let mut r = ok.clone(); r.limits = Some(Limits { memory_bytes: 1 << 45, ..Default::default() }); r }),
        ("limits.cpu_millis", { let mut r = ok.clone(); r.limits = Some(Limits { cpu_millis: 64_000, ..Default::default() }); r }),
        ("env_vars.LD_PRELOAD", { let mut r = ok.clone(); r.env.insert("LD_PRELOAD".into(), "/tmp/x.so".into()); r }),
        ("env_vars.bad-name", { let mut r = ok.clone(); r.env.insert("bad-name".into(), "x".into()); r }),
        // Malformed (never a real registry: tests stay on this machine).
        ("image", { let mut r = ok.clone(); r.image = "not a reference".into(); r }),
        ("execution_id", { let mut r = ok.clone(); r.execution_id = "../../etc".into(); r }),
    ];
    for (field, req) in cases {
        let err = client.execute(req).await.expect_err(field);
        assert_eq!(err.code(), Code::InvalidArgument, "{field}: {err:?}");
        assert!(err.message().contains(field), "message names {field}: {}", err.message());
    }
    let status = client.status(StatusRequest {}).await.unwrap().into_inner();
    assert_eq!(status.running_executions, 0);
    // And the agent still runs code.
    assert_eq!(agent.run(Language::Bash, "echo hi", T).await.unwrap().stdout, "hi\n");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn status_reports_features_languages_and_load() {
    if skip_unless_root("status_reports_features_languages_and_load") {
        return;
    }
    let agent = Agent::start(&["--node-name", "node-a", "--max-executions", "7"]).await.unwrap();
    let mut client = agent.client().await.unwrap();
    let s = client.status(StatusRequest {}).await.unwrap().into_inner();
    assert_eq!(s.node_name, "node-a");
    assert_eq!(s.max_executions, 7);
    let f = s.features.unwrap();
    assert!(f.user_namespaces && f.seccomp && f.missing.is_empty(), "{f:?}");
    assert!(f.cgroup_version == 1 || f.cgroup_version == 2);
    for c in ["memory", "pids", "cpu"] {
        assert!(f.cgroup_controllers.iter().any(|x| x == c), "{c} in {:?}", f.cgroup_controllers);
    }
    for l in [Language::Python, Language::Node, Language::Bash] {
        assert!(s.languages.contains(&(l as i32)), "{l:?}");
    }
    // The warm pool fills the default shapes (a plain sandbox, and one with
    // a warm Python interpreter) to --pool-size (2) each and says so.
    let mut warm = (0, 0);
    for _ in 0..300 {
        let s = client.status(StatusRequest {}).await.unwrap().into_inner();
        warm = (s.warm_sandboxes, s.warm_memory_bytes);
        if warm.0 == 4 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert_eq!(warm.0, 4, "the pool reports its ready sandboxes");
    eprintln!("4 idle warm sandboxes (2 with a Python interpreter) hold {} KiB", warm.1 >> 10);
    // Their cgroups hold their supervisors', inits' and interpreters' memory:
    // more than nothing, less than 64 MiB each.
    assert!(warm.1 > 0 && warm.1 < 4 * (64 << 20), "idle sandboxes hold {} bytes", warm.1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrency_limit_gives_resource_exhausted() {
    if skip_unless_root("concurrency_limit_gives_resource_exhausted") {
        return;
    }
    let agent = Agent::start(&["--max-executions", "1"]).await.unwrap();
    let mut c1 = agent.client().await.unwrap();
    let mut busy = c1.execute(request(Language::Bash, "echo started; sleep 20", T)).await.unwrap().into_inner();
    // Wait until the first execution really runs.
    loop {
        let ev = busy.message().await.unwrap().unwrap();
        if matches!(ev.event, Some(Event::Stdout(_))) {
            break;
        }
    }
    let mut c2 = agent.client().await.unwrap();
    let err = c2.execute(request(Language::Bash, "echo second", T)).await.unwrap_err();
    assert_eq!(err.code(), Code::ResourceExhausted, "{err:?}");
    drop(busy); // cancelling frees the slot
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    loop {
        match agent.run(Language::Bash, "echo second", T).await {
            Ok(r) => {
                assert_eq!(r.stdout, "second\n");
                break;
            }
            Err(e) => assert!(std::time::Instant::now() < deadline, "slot never freed: {e:#}"),
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// Over TCP an agent takes calls only from a caller with a gateway-CA
/// certificate *and* the bearer token: neither alone, and not an agent's own
/// certificate (so one compromised node opens no other).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tcp_requires_mutual_tls_and_the_bearer_token() {
    if skip_unless_root("tcp_requires_mutual_tls_and_the_bearer_token") {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let token_file = dir.path().join("token");
    std::fs::write(&token_file, "test-token-0123456789abcdef\n").unwrap();
    let pki = warren_e2e::pki::Pki::new();
    let addr = format!("127.0.0.1:{}", free_port());
    let warm_token_file = dir.path().join("warm-token");
    std::fs::write(&warm_token_file, "warm-token-0123456789abcdef\n").unwrap();
    let mut args = pki.tcp_agent_args(&addr, &token_file);
    args.extend(["--warm-token-file".to_string(), warm_token_file.display().to_string()]);
    let agent = Agent::start_no_wait(&args.iter().map(String::as_str).collect::<Vec<_>>()).unwrap();
    assert!(wait_for_port(&addr).await, "agent listens on tcp");

    let endpoint = |tls: Option<tonic::transport::ClientTlsConfig>| {
        let ep = tonic::transport::Endpoint::try_from(format!("https://{addr}")).unwrap();
        match tls {
            Some(t) => ep.tls_config(t).unwrap(),
            None => tonic::transport::Endpoint::try_from(format!("http://{addr}")).unwrap(),
        }
    };
    // Plain text, TLS without a client certificate, and TLS with the agent's
    // own certificate (agent CA, not gateway CA) never get a channel.
    for (what, tls) in [("plain text", None), ("no client cert", Some(pki.client(None))), ("an agent's cert", Some(pki.client(Some(&pki.agent))))] {
        let refused = match endpoint(tls).connect().await {
            Err(_) => true,
            Ok(ch) => warren_proto::agent::node_agent_client::NodeAgentClient::new(ch).status(StatusRequest {}).await.is_err(),
        };
        assert!(refused, "{what} was served");
    }
    let ch = endpoint(Some(pki.client(Some(&pki.gateway)))).connect().await.expect("a gateway certificate gets a channel");
    let mut anon = warren_proto::agent::node_agent_client::NodeAgentClient::new(ch.clone());
    assert_eq!(anon.status(StatusRequest {}).await.unwrap_err().code(), Code::Unauthenticated, "the certificate alone is not enough");
    let with_token = |token: &str| {
        let value: tonic::metadata::MetadataValue<_> = format!("Bearer {token}").parse().unwrap();
        warren_proto::agent::node_agent_client::NodeAgentClient::with_interceptor(ch.clone(), move |mut r: tonic::Request<()>| {
            r.metadata_mut().insert("authorization", value.clone());
            Ok(r)
        })
    };
    assert!(with_token("test-token-0123456789abcdef").status(StatusRequest {}).await.is_ok());
    // A wrong token of the right length is refused the same way, for every call.
    let mut forged = with_token("test-token-0123456789abcdeX");
    assert_eq!(forged.status(StatusRequest {}).await.unwrap_err().code(), Code::Unauthenticated);
    let err = forged.execute(request(Language::Bash, "touch /tmp/ran", T)).await.unwrap_err();
    assert_eq!(err.code(), Code::Unauthenticated);
    // The operator's warming token (#26: it held the gateways' token, so a
    // compromised operator could run code on every node) warms images and
    // reads status, and nothing else.
    let mut warm = with_token("warm-token-0123456789abcdef");
    assert!(warm.status(StatusRequest {}).await.is_ok());
    let warmed = warm.warm_image(warren_proto::agent::WarmImageRequest { image: "127.0.0.1:1/none:1".into(), image_pull: None, warm: vec![] }).await;
    assert_ne!(warmed.map(|_| Code::Ok).unwrap_or_else(|e| e.code()), Code::PermissionDenied, "warming is the warm token's to do");
    let err = warm.execute(request(Language::Bash, "touch /tmp/ran", T)).await.unwrap_err();
    assert_eq!(err.code(), Code::PermissionDenied, "the warm token runs nothing");
    let files = warren_proto::agent::FilesRequest::default();
    assert_eq!(warm.list_files(files.clone()).await.unwrap_err().code(), Code::PermissionDenied);
    assert_eq!(warm.delete_file(files.clone()).await.unwrap_err().code(), Code::PermissionDenied);
    assert_eq!(warm.cancel(warren_proto::agent::CancelRequest { execution_id: "x".into() }).await.unwrap_err().code(), Code::PermissionDenied);
    // No pool: any sandbox on this agent would be this call's.
    assert!(agent.sandbox_processes().is_empty() && agent.leftover_cgroups().is_empty(), "nothing ran");
    drop(agent);
}

async fn wait_for_port(addr: &str) -> bool {
    for _ in 0..500 {
        if std::net::TcpStream::connect(addr).is_ok() {
            return true;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    false
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_agent_never_serves_tcp_without_a_token_and_tls_and_keeps_its_socket_private() {
    if skip_unless_root("the_agent_never_serves_tcp_without_a_token_and_tls_and_keeps_its_socket_private") {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let short = dir.path().join("short");
    std::fs::write(&short, "too-short\n").unwrap();
    let addr = format!("127.0.0.1:{}", free_port());
    let token = dir.path().join("token");
    std::fs::write(&token, "test-token-0123456789abcdef\n").unwrap();
    for (extra, why) in [
        (vec!["--listen-tcp", addr.as_str()], "token"),
        (vec!["--listen-tcp", addr.as_str(), "--token-file", short.to_str().unwrap()], "token"),
        (vec!["--listen-tcp", addr.as_str(), "--token-file", token.to_str().unwrap()], "mutual TLS"),
    ] {
        let out = std::process::Command::new(warren_e2e::bin("warren-node-agent"))
            .args(["--state-dir", dir.path().join("state").to_str().unwrap(), "--cgroup-name", "warren-e2e-refused"])
            .args(&extra)
            .output()
            .unwrap();
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success(), "{extra:?} was accepted");
        assert!(stderr.contains(why), "the refusal says why: {stderr}");
        assert!(std::net::TcpStream::connect(&addr).is_err(), "nothing listens on {addr}");
    }
    // #26: a state directory sandboxes cannot reach (a private parent, as
    // under /root) made every call fail as a lost node; the agent now says
    // so at start and changes nothing.
    let private = dir.path().join("private");
    std::fs::create_dir(&private).unwrap();
    std::fs::set_permissions(&private, std::os::unix::fs::PermissionsExt::from_mode(0o700)).unwrap();
    let out = std::process::Command::new(warren_e2e::bin("warren-node-agent"))
        .args(["--state-dir", private.join("state").to_str().unwrap(), "--cgroup-name", "warren-e2e-refused", "--listen-unix", private.join("a.sock").to_str().unwrap()])
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success() && stderr.contains("chmod o+x"), "the refusal says why: {stderr}");
    assert_eq!(std::fs::read_dir(&private).unwrap().count(), 0, "nothing was created");
    let agent = Agent::start(&[]).await.unwrap();
    let socket = agent.address().trim_start_matches("unix:").to_string();
    let mode = std::os::unix::fs::PermissionsExt::mode(&std::fs::metadata(&socket).unwrap().permissions());
    assert_eq!(mode & 0o777, 0o600, "only root may talk to the agent's socket");
}

/// The attack (two agents on one host, as two tests or two single-machine
/// installs given one name): the second agent used to take the first one's
/// live sandboxes for a crashed run's leftovers and kill them. Now it refuses
/// to start, saying why, and the first agent's sandbox runs on.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_second_agent_never_removes_the_first_ones_cgroups() {
    if skip_unless_root("a_second_agent_never_removes_the_first_ones_cgroups") {
        return;
    }
    let agent = Agent::start(&["--pool-size", "0"]).await.unwrap();
    let mut client = agent.client().await.unwrap();
    let mut stream = client.execute(request(Language::Bash, "while true; do echo tick; sleep 0.2; done", Duration::from_secs(120))).await.unwrap().into_inner();
    let mut next_tick = async || loop {
        match stream.message().await.unwrap().and_then(|m| m.event) {
            Some(Event::Stdout(_)) => return true,
            Some(Event::Exited(_)) | None => return false,
            Some(_) => {}
        }
    };
    assert!(next_tick().await, "the first agent's sandbox runs");
    let held = agent.leftover_cgroups();
    assert!(!held.is_empty());
    let dir = tempfile::tempdir().unwrap();
    let out = std::process::Command::new(warren_e2e::bin("warren-node-agent"))
        .args(["--state-dir", dir.path().join("state").to_str().unwrap(), "--listen-unix", dir.path().join("agent.sock").to_str().unwrap()])
        .args(["--cgroup-name", &agent.cgroup_name, "--sandbox-network", "off", "--log-format", "plain"])
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "a second agent started on the first one's cgroups");
    assert!(stderr.contains("in use by another running agent") && stderr.contains("--cgroup-name"), "the refusal says why: {stderr}");
    assert!(held.iter().all(|g| g.exists()), "the first agent's sandbox cgroups were removed");
    assert!(next_tick().await, "the first agent's sandbox was killed");
    assert!(next_tick().await);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn agent_crash_leaves_nothing_after_restart() {
    if skip_unless_root("agent_crash_leaves_nothing_after_restart") {
        return;
    }
    let mut agent = Agent::start(&["--pool-size", "2"]).await.unwrap();
    let mut client = agent.client().await.unwrap();
    let mut stream = client.execute(request(Language::Bash, "echo up; sleep 60", T)).await.unwrap().into_inner();
    while let Some(ev) = stream.message().await.unwrap() {
        if matches!(ev.event, Some(Event::Stdout(_))) {
            break;
        }
    }
    assert!(!agent.leftover_cgroups().is_empty());
    agent.kill_hard();
    // The stream ends without an Exited event: the caller learns the agent died.
    let mut saw_exited = false;
    while let Ok(Some(ev)) = stream.message().await {
        saw_exited |= matches!(ev.event, Some(Event::Exited(_)));
    }
    assert!(!saw_exited);
    // Supervisors notice the agent is gone and kill their sandboxes.
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    while !agent.sandbox_processes().is_empty() {
        assert!(std::time::Instant::now() < deadline, "sandbox processes survived the agent: {:?}", agent.sandbox_processes());
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    // A new agent with the same cgroup parent collects the leftovers.
    let restarted = agent.restart(&["--pool-size", "0"]).await.unwrap();
    assert!(restarted.leftover_cgroups().is_empty(), "{:?}", restarted.leftover_cgroups());
    assert_eq!(restarted.run(Language::Bash, "echo again", T).await.unwrap().stdout, "again\n");
}

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port()
}

/// Regression: the final report of init races with the supervisor's "init is
/// gone"; the exit status must never be lost or replaced.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn exit_status_is_reported_on_every_run() {
    if skip_unless_root("exit_status_is_reported_on_every_run") {
        return;
    }
    let agent = Agent::start(&[]).await.unwrap();
    for i in 0..40 {
        let r = agent.run(Language::Bash, "echo x; exit 7", T).await.unwrap();
        assert_eq!((r.exited.exit_code, r.exited.failure(), r.stdout.as_str()), (7, Failure::Unspecified, "x\n"), "run {i}");
    }
}

/// A graceful stop has a deadline: an execution that would run for an hour
/// is killed when it passes, the agent cleans up and exits by itself, and
/// nothing of the sandbox is left.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_graceful_stop_kills_what_outlives_its_deadline_and_exits_clean() {
    if skip_unless_root("a_graceful_stop_kills_what_outlives_its_deadline_and_exits_clean") {
        return;
    }
    let mut agent = Agent::start(&["--shutdown-timeout-secs", "2", "--pool-size", "0"]).await.unwrap();
    let mut client = agent.client().await.unwrap();
    let mut stream = client.execute(request(Language::Bash, "echo started; sleep 3600", Duration::from_secs(3600))).await.unwrap().into_inner();
    // Wait until the program runs.
    loop {
        match stream.message().await.unwrap().and_then(|e| e.event) {
            Some(Event::Stdout(c)) if String::from_utf8_lossy(&c.data).contains("started") => break,
            Some(_) => continue,
            None => panic!("the execution ended before it started"),
        }
    }
    // SAFETY: signalling our own child by pid.
    #[allow(unsafe_code)]
    unsafe {
        libc::kill(agent.pid() as i32, libc::SIGTERM);
    }
    let status = agent.wait_exit(Duration::from_secs(30)).expect("the agent is still draining past its deadline");
    assert!(status.success(), "{status:?}");
    assert!(agent.sandbox_processes().is_empty(), "the execution outlived the agent");
    assert!(agent.leftover_cgroups().is_empty(), "{:?}", agent.leftover_cgroups());
    assert!(agent.idle_cgroups().is_empty(), "kept empty groups outlived the agent: {:?}", agent.idle_cgroups());
}

/// Waits (bounded) until this agent has no sandbox group and returns its
/// kept empty groups' names (one per group, whatever the hierarchies).
async fn kept_groups(agent: &Agent) -> Vec<String> {
    for _ in 0..400 {
        if agent.leftover_cgroups().is_empty() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
    assert!(agent.leftover_cgroups().is_empty(), "a finished call's group is still a sandbox's: {:?}", agent.leftover_cgroups());
    let mut names: Vec<String> = agent.idle_cgroups().iter().filter_map(|g| g.file_name().map(|n| n.to_string_lossy().into_owned())).collect();
    names.sort();
    names.dedup();
    names
}

/// On cgroup v1 an emptied sandbox group is kept (`idle-*`) and the next
/// sandbox's group is that one: its limits are the new call's, and what the
/// earlier sandbox used (CPU, peak memory, an OOM kill) is not reported as
/// the new call's. On v2 nothing is kept.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_emptied_cgroup_is_reused_with_the_next_calls_limits_and_counters() {
    if skip_unless_root("an_emptied_cgroup_is_reused_with_the_next_calls_limits_and_counters") {
        return;
    }
    let v1 = std::path::Path::new("/sys/fs/cgroup/memory/memory.limit_in_bytes").exists();
    let agent = Agent::start(&["--pool-size", "0"]).await.unwrap();
    const MIB: u64 = 1 << 20;
    let mut bomb = request(Language::Bash, "for ((i = 0; i < 200000; i++)); do :; done; a=x; while :; do a=$a$a; done", T);
    bomb.limits = Some(Limits { memory_bytes: 128 * MIB, ..Default::default() });
    let first = agent.run_request(bomb).await.unwrap();
    assert!(first.exited.oom_killed && first.exited.cpu_micros > 100_000, "the first call burns CPU, then is OOM-killed: {:?}", first.exited);
    let kept = kept_groups(&agent).await;
    if !v1 {
        assert!(kept.is_empty(), "cgroup v2 keeps no group: {kept:?}");
        return;
    }
    assert_eq!(kept.len(), 1, "the emptied group is kept: {kept:?}");
    let mut quiet = request(Language::Bash, "echo ok", T);
    quiet.limits = Some(Limits { memory_bytes: 96 * MIB, pids: 48, ..Default::default() });
    let mut client = agent.client().await.unwrap();
    let mut stream = client.execute({ let mut r = quiet.clone(); r.code = "echo up; sleep 30".into(); r }).await.unwrap().into_inner();
    while let Some(ev) = stream.message().await.unwrap() {
        if matches!(ev.event, Some(Event::Stdout(_))) {
            break;
        }
    }
    assert!(agent.idle_cgroups().is_empty(), "the kept group is the running sandbox's: {:?}", agent.idle_cgroups());
    let groups = agent.leftover_cgroups();
    let read = |controller: &str, file: &str| -> String {
        let dir = groups.iter().find(|g| g.to_string_lossy().contains(&format!("/{controller}/"))).expect("the sandbox's group");
        std::fs::read_to_string(dir.join(file)).unwrap().trim().to_string()
    };
    assert_eq!((read("memory", "memory.limit_in_bytes"), read("pids", "pids.max")), ((96 * MIB).to_string(), "48".into()), "the new call's limits");
    drop(stream);
    assert_eq!(kept_groups(&agent).await.len(), 1, "given back again");
    let second = agent.run_request(quiet).await.unwrap();
    assert_eq!(second.stdout.lines().last(), Some("ok"));
    let e = &second.exited;
    assert!(!e.oom_killed, "the earlier sandbox's OOM kill is not this call's: {e:?}");
    assert!(e.cpu_micros < 100_000 && e.peak_memory_bytes.is_some_and(|p| p < 64 * MIB), "only this call's CPU and memory: {e:?}");
    assert_eq!(kept_groups(&agent).await.len(), 1, "one group served all three calls");
}

/// A program starts as it would from a shell: no signal ignored or blocked
/// (the agent's own binaries ignore SIGPIPE, which an exec would otherwise
/// pass on), so `yes | head -1` ends quietly with `yes` killed by SIGPIPE.
/// Both starts: a pooled stub, and a cold program without a pool.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn programs_start_with_no_signal_ignored_or_blocked() {
    if skip_unless_root("programs_start_with_no_signal_ignored_or_blocked") {
        return;
    }
    let code = "yes | head -1; echo \"${PIPESTATUS[*]}\"; grep -E '^Sig(Ign|Blk)' /proc/self/status";
    for pool in ["0", "1"] {
        let agent = Agent::start(&["--pool-size", pool, "--warm-interpreters", "false"]).await.unwrap();
        let r = agent.run(Language::Bash, code, T).await.unwrap();
        assert_eq!(r.stdout, "y\n141 0\nSigBlk:\t0000000000000000\nSigIgn:\t0000000000000000\n", "pool {pool}: {r:?}");
        assert_eq!(r.stderr, "", "pool {pool}");
    }
}

/// A pooled sandbox waits sized for its shape's last call (its cgroup's
/// limits), so a call of the same size claims it without writing its
/// limits; a call of another size still runs under its own.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pooled_sandbox_waits_sized_for_its_shapes_last_call() {
    if skip_unless_root("a_pooled_sandbox_waits_sized_for_its_shapes_last_call") {
        return;
    }
    let agent = Agent::start(&["--pool-size", "1", "--warm-interpreters", "false"]).await.unwrap();
    const MIB: u64 = 1 << 20;
    let sized = |memory_mib: u64, pids: u32| {
        let mut r = request(Language::Bash, "echo $(( $(sed -n 's/^MemTotal: *\\([0-9]*\\) kB/\\1/p' /proc/meminfo) / 1024 ))", T);
        r.limits = Some(Limits { memory_bytes: memory_mib * MIB, pids, ..Default::default() });
        r
    };
    // The waiting sandboxes' memory and pids limits (v1: one hierarchy each; v2: one group).
    let waiting = || {
        let groups = agent.leftover_cgroups();
        let read = |names: &[&str]| -> Vec<String> {
            groups.iter().flat_map(|g| names.iter().filter_map(move |n| std::fs::read_to_string(g.join(n)).ok())).map(|s| s.trim().to_string()).collect()
        };
        (read(&["memory.limit_in_bytes", "memory.max"]), read(&["pids.max"]))
    };
    // The sandbox warmed at start is ready: the first call claims it, and its refill is the one sized.
    warren_e2e::bench::pool_settled(&agent).await;
    let first = agent.run_request(sized(96, 48)).await.unwrap();
    assert_eq!(first.stdout.trim(), "96", "the call's own size: {first:?}");
    warren_e2e::bench::pool_settled(&agent).await;
    assert_eq!(waiting(), (vec![(96 * MIB).to_string()], vec!["48".to_string()]), "the refilled sandbox waits at the last call's size");
    let other = agent.run_request(sized(160, 64)).await.unwrap();
    assert_eq!(other.stdout.trim(), "160", "a call of another size gets its own: {other:?}");
    warren_e2e::bench::pool_settled(&agent).await;
    assert_eq!(waiting(), (vec![(160 * MIB).to_string()], vec!["64".to_string()]), "and the next waits at that size");
}
