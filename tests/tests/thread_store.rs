//! The thread store under the node-agent, over gRPC: a save is atomic when
//! the agent is SIGKILLed at either step of publishing it, so is a fork at
//! each of its steps, and the S3 store (a real S3 server, s3s-fs) lets
//! another node restore a thread.

use warren_proto::agent::Failure;
use std::path::Path;
use std::time::{Duration, Instant};

use warren_e2e::disk::SmallDisk;
use warren_e2e::s3::S3Server;
use warren_e2e::{request, skip_unless_root, Agent, Run};
use warren_proto::agent as pb;

fn thread_ref(id: &str) -> pb::ThreadRef {
    pb::ThreadRef { namespace: "team".into(), key_name: "agent-key".into(), thread_id: id.into() }
}

fn on_thread(code: &str, id: &str) -> pb::ExecuteRequest {
    let mut req = request(pb::Language::Bash, code, Duration::from_secs(30));
    req.thread = Some(pb::ThreadOptions { r#ref: Some(thread_ref(id)), retention_seconds: 0, max_bytes: 1 << 30, max_threads: 0, history_versions: 0 });
    req
}

fn ok(run: &Run) -> &str {
    assert_eq!((run.exited.exit_code, run.exited.failure()), (0, Failure::Unspecified), "{run:?}");
    &run.stdout
}

async fn wait_for_file(path: &Path, limit: Duration) -> bool {
    let deadline = Instant::now() + limit;
    while Instant::now() < deadline {
        if path.exists() {
            return true;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    false
}

/// SIGKILL after the layer is uploaded but before the manifest names it: the
/// old state. After the manifest is published but before the node's warm
/// copy is re-tagged: the new state. Either way the thread is not stuck.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kill_9_during_a_save_leaves_the_old_or_the_new_state_whole() {
    if skip_unless_root("kill_9_during_a_save_leaves_the_old_or_the_new_state_whole") {
        return;
    }
    for (point, expected) in [("layer-uploaded", "v1"), ("manifest-published", "v2")] {
        let base = tempfile::tempdir().unwrap();
        let (state, store) = (base.path().join("state"), format!("dir:{}", base.path().join("store").display()));
        let args = ["--thread-store", store.as_str()];
        let first = Agent::start_with(&args, &[], Some(&state)).await.unwrap();
        let v1 = "mkdir -p ~/d && for i in 1 2 3; do echo v1 > ~/d/$i; done; echo v1 > ~/f; echo ok";
        assert_eq!(ok(&first.run_request(on_thread(v1, "crash")).await.unwrap()), "ok\n");
        drop(first);

        let marker = base.path().join("paused");
        let marker_s = marker.display().to_string();
        let env = [("WARREN_TEST_PAUSE_AT", point), ("WARREN_TEST_PAUSE_MARKER", marker_s.as_str())];
        let mut crashing = Agent::start_with(&args, &env, Some(&state)).await.unwrap();
        let v2 = "for i in 1 2 3; do echo v2 > ~/d/$i; done; rm ~/f; echo v2 > ~/g; echo ok";
        let client = crashing.client().await.unwrap();
        let call = tokio::spawn(async move {
            let mut client = client;
            let mut stream = client.execute(on_thread(v2, "crash")).await?.into_inner();
            while let Some(ev) = stream.message().await? {
                if let Some(pb::execute_event::Event::Exited(x)) = ev.event {
                    return Ok::<_, tonic::Status>(Some(x));
                }
            }
            Ok(None)
        });
        assert!(wait_for_file(&marker, Duration::from_secs(30)).await, "{point}: the save never reached its pause point");
        crashing.kill_hard();
        let outcome = call.await.unwrap();
        assert!(!matches!(outcome, Ok(Some(_))), "{point}: the killed agent must not have answered: {outcome:?}");
        drop(crashing);

        let after = Agent::start_with(&args, &[], Some(&state)).await.unwrap();
        let seen = after.run_request(on_thread("cat ~/d/1 ~/d/2 ~/d/3; ls ~ | tr '\\n' ' '", "crash")).await.unwrap();
        let files = if expected == "v1" { "d f " } else { "d g " };
        assert_eq!(ok(&seen), format!("{expected}\n{expected}\n{expected}\n{files}"), "{point}");
        // Not stuck: the next save works and is seen.
        assert_eq!(ok(&after.run_request(on_thread("echo v3 > ~/d/1; echo ok", "crash")).await.unwrap()), "ok\n");
        assert_eq!(ok(&after.run_request(on_thread("cat ~/d/1", "crash")).await.unwrap()), "v3\n");
    }
}

fn options(id: &str) -> pb::ThreadOptions {
    pb::ThreadOptions { r#ref: Some(thread_ref(id)), retention_seconds: 0, max_bytes: 1 << 30, max_threads: 0, history_versions: 0 }
}

/// SIGKILL at each step of a fork (its lease written; the source read; the
/// first of two forks published): the source stays whole, a fork is there
/// whole or not at all, and forking again works.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kill_9_during_a_fork_leaves_the_source_and_each_fork_whole() {
    if skip_unless_root("kill_9_during_a_fork_leaves_the_source_and_each_fork_whole") {
        return;
    }
    for (point, first_made) in [("fork-lease-written", false), ("fork-source-read", false), ("fork-first-published", true)] {
        let base = tempfile::tempdir().unwrap();
        let (state, store) = (base.path().join("state"), format!("dir:{}", base.path().join("store").display()));
        let args = ["--thread-store", store.as_str()];
        let marker = base.path().join("paused");
        let marker_s = marker.display().to_string();
        let env = [("WARREN_TEST_PAUSE_AT", point), ("WARREN_TEST_PAUSE_MARKER", marker_s.as_str())];
        let mut crashing = Agent::start_with(&args, &env, Some(&state)).await.unwrap();
        assert_eq!(ok(&crashing.run_request(on_thread("echo one > ~/a; echo ok", "src")).await.unwrap()), "ok\n");
        assert_eq!(ok(&crashing.run_request(on_thread("echo two > ~/b; echo ok", "src")).await.unwrap()), "ok\n");
        let mut client = crashing.client().await.unwrap();
        let call = tokio::spawn(async move { client.fork_thread(pb::ForkThreadRequest { source: Some(options("src")), targets: vec!["f1".into(), "f2".into()], at: String::new() }).await });
        assert!(wait_for_file(&marker, Duration::from_secs(30)).await, "{point}: the fork never reached its pause point");
        crashing.kill_hard();
        assert!(call.await.unwrap().is_err(), "{point}: the killed agent must not have answered");
        drop(crashing);

        let after = Agent::start_with(&args, &[], Some(&state)).await.unwrap();
        assert_eq!(ok(&after.run_request(on_thread("cat ~/a ~/b", "src")).await.unwrap()), "one\ntwo\n", "{point}: the source");
        let mut client = after.client().await.unwrap();
        let history = |id: &str| pb::ThreadHistoryRequest { thread: Some(thread_ref(id)) };
        let f1 = client.thread_history(history("f1")).await;
        assert_eq!(f1.is_ok(), first_made, "{point}: f1 {f1:?}");
        if first_made {
            assert_eq!(ok(&after.run_request(on_thread("cat ~/a ~/b", "f1")).await.unwrap()), "one\ntwo\n", "{point}: a published fork is whole");
        }
        assert_eq!(client.thread_history(history("f2")).await.unwrap_err().code(), tonic::Code::NotFound, "{point}: f2 was never published");
        client.fork_thread(pb::ForkThreadRequest { source: Some(options("src")), targets: vec!["f2".into()], at: String::new() }).await.unwrap();
        assert_eq!(ok(&after.run_request(on_thread("cat ~/a ~/b", "f2")).await.unwrap()), "one\ntwo\n", "{point}: forking again works");
    }
}

/// A real S3 server and two agents whose thread store it is (the server
/// outlives the agents: it is dropped last).
async fn two_nodes_on_s3() -> (S3Server, Agent, Agent) {
    let s3 = S3Server::start().unwrap();
    let url = s3.store_url();
    let env_owned = s3.env();
    let env: Vec<(&str, &str)> = env_owned.iter().map(|(k, v)| (*k, v.as_str())).collect();
    let args = ["--thread-store", url.as_str()];
    let node_a = Agent::start_with(&args, &env, None).await.unwrap();
    let node_b = Agent::start_with(&args, &env, None).await.unwrap();
    (s3, node_a, node_b)
}

/// A thread saved by one node restores on another from the S3 store; the
/// first node's warm copy notices the thread moved on; delete removes every
/// object.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_s3_store_lets_another_node_restore_a_thread() {
    if skip_unless_root("the_s3_store_lets_another_node_restore_a_thread") {
        return;
    }
    let (s3, node_a, node_b) = two_nodes_on_s3().await;

    let write = "python3 -m venv --without-pip ~/venv && head -c 3000000 /dev/urandom > ~/blob && sha256sum ~/blob | cut -c1-64";
    let sum = ok(&node_a.run_request(on_thread(write, "roaming")).await.unwrap()).to_string();
    assert!(s3.objects("threads/team/agent-key/roaming").iter().any(|o| o.ends_with("manifest.json")), "{:?}", s3.objects(""));

    let read = "sha256sum ~/blob | cut -c1-64; ~/venv/bin/python -c 'import sys; print(sys.prefix)'; echo b > ~/from-b";
    assert_eq!(ok(&node_b.run_request(on_thread(read, "roaming")).await.unwrap()), format!("{sum}/home/sandbox/venv\n"));
    // Back on node A: its warm copy is stale and is rebuilt from the store.
    assert_eq!(ok(&node_a.run_request(on_thread("cat ~/from-b", "roaming")).await.unwrap()), "b\n");

    let mut client = node_b.client().await.unwrap();
    client.delete_thread(pb::DeleteThreadRequest { thread: Some(thread_ref("roaming")) }).await.unwrap();
    let again = client.delete_thread(pb::DeleteThreadRequest { thread: Some(thread_ref("roaming")) }).await.unwrap_err();
    assert_eq!(again.code(), tonic::Code::NotFound);
    assert!(s3.objects("threads/team/agent-key/roaming").iter().all(|o| !o.ends_with(".tar")), "every layer is deleted: {:?}", s3.objects(""));
    assert_eq!(ok(&node_a.run_request(on_thread("ls -A ~ | wc -l", "roaming")).await.unwrap()), "0\n");
}

/// A key's thread limit counts the live threads in the shared store, made
/// by any node: a new thread over it ends before anything runs, existing
/// threads go on, and a deleted thread frees its place at once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_thread_limit_counts_the_keys_live_threads_across_nodes() {
    if skip_unless_root("the_thread_limit_counts_the_keys_live_threads_across_nodes") {
        return;
    }
    let (s3, node_a, node_b) = two_nodes_on_s3().await;
    let limited = |code: &str, id: &str| {
        let mut req = on_thread(code, id);
        if let Some(t) = req.thread.as_mut() {
            t.max_threads = 2;
        }
        req
    };
    assert_eq!(ok(&node_a.run_request(limited("echo 1 > ~/f; echo ok", "one")).await.unwrap()), "ok\n");
    assert_eq!(ok(&node_b.run_request(limited("echo 2 > ~/f; echo ok", "two")).await.unwrap()), "ok\n");

    let over = node_a.run_request(limited("echo ran", "three")).await.unwrap();
    assert_eq!((over.exited.failure(), over.exited.exit_code, over.stdout.as_str()), (Failure::ThreadLimit, -1, ""), "{over:?}");
    assert!(s3.objects("threads/team/agent-key/three").is_empty(), "nothing was stored for the refused thread");
    assert_eq!(ok(&node_a.run_request(limited("cat ~/f", "two")).await.unwrap()), "2\n", "existing threads go on");

    let mut client = node_b.client().await.unwrap();
    client.delete_thread(pb::DeleteThreadRequest { thread: Some(thread_ref("one")) }).await.unwrap();
    assert_eq!(ok(&node_a.run_request(limited("echo 3 > ~/f; echo ok", "three")).await.unwrap()), "ok\n", "the deleted thread's place is free");
    let again = node_b.run_request(limited("echo ran", "four")).await.unwrap();
    assert_eq!(again.exited.failure(), Failure::ThreadLimit, "two and three are live: {again:?}");
}

/// The state disk's reserve holds: idle warm copies are dropped to make
/// room (their threads restore from the store), and a save that would still
/// go below the reserve fails cleanly, keeping the previous state.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn thread_data_never_fills_the_state_disk_below_its_reserve() {
    if skip_unless_root("thread_data_never_fills_the_state_disk_below_its_reserve") {
        return;
    }
    const MIB: u64 = 1 << 20;
    let disk = SmallDisk::mount(160 * MIB).unwrap();
    let state = disk.path().join("state");
    let agent = Agent::start_with(&["--state-reserve", "48Mi"], &[], Some(&state)).await.unwrap();
    let call = |code: String, id: &str| {
        let mut req = on_thread(&code, id);
        req.limits = Some(pb::Limits { home_bytes: 64 * MIB, ..Default::default() });
        req
    };
    let write = |mib: u64| format!("head -c {mib}M /dev/urandom > ~/blob && sha256sum ~/blob | cut -c1-64");
    let warm = |id: &str| state.join("threads/team/agent-key").join(id).exists();
    let above_reserve = |when: &str| assert!(disk.free() >= 48 * MIB, "{when}: {} bytes free, under the reserve", disk.free());

    let sum1 = ok(&agent.run_request(call(write(24), "t1")).await.unwrap()).to_string();
    ok(&agent.run_request(call(write(24), "t2")).await.unwrap());
    assert!(warm("t1") && warm("t2"));
    above_reserve("two threads saved");
    // A third does not fit beside the two warm copies: they go, it is saved.
    ok(&agent.run_request(call(write(24), "t3")).await.unwrap());
    assert!(!warm("t1") && !warm("t2"), "idle warm copies were dropped to keep the reserve");
    above_reserve("the third thread saved");
    // t1 comes back from the store, whole.
    assert_eq!(ok(&agent.run_request(call("sha256sum ~/blob | cut -c1-64".into(), "t1")).await.unwrap()), sum1);
    above_reserve("t1 restored");

    let big = agent.run_request(call(write(40), "t4")).await.unwrap();
    assert_eq!((big.exited.failure(), big.stdout.len()), (Failure::ThreadSave, 65), "the program ran, its save was refused: {big:?}");
    above_reserve("a save over the reserve was refused");
    assert_eq!(ok(&agent.run_request(call("ls -A ~ | wc -l".into(), "t4")).await.unwrap()), "0\n", "nothing of the refused save was kept");
    assert_eq!(ok(&agent.run_request(request(pb::Language::Bash, "echo fine", Duration::from_secs(10))).await.unwrap()), "fine\n", "calls without a thread are unaffected");
}

/// Requests the agent refuses before anything runs.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn malformed_thread_references_are_refused() {
    if skip_unless_root("malformed_thread_references_are_refused") {
        return;
    }
    let agent = Agent::start(&[]).await.unwrap();
    for (ns, id, max) in [("team", "../etc", 1u64), ("Team", "t", 1), ("team", "t", 0)] {
        let mut req = on_thread("echo x", id);
        req.thread = Some(pb::ThreadOptions { r#ref: Some(pb::ThreadRef { namespace: ns.into(), key_name: "k".into(), thread_id: id.into() }), retention_seconds: 0, max_bytes: max, max_threads: 0, history_versions: 0 });
        let err = agent.run_request(req).await.unwrap_err();
        let status = err.downcast_ref::<tonic::Status>().expect("a gRPC status");
        assert_eq!(status.code(), tonic::Code::InvalidArgument, "{ns}/{id}/{max}");
    }
    assert!(!agent.state_dir().join("threads/team").exists(), "nothing was created for refused requests");
}

/// A thread running on two nodes at once (gateways briefly disagreeing about
/// node health could cause it): the later save must not silently drop the
/// earlier one's changes. Node A holds the thread (a running call), node B
/// saves it meanwhile; when A's call ends its save conflicts and B's state
/// stands — for the directory store and for S3.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_save_over_a_newer_state_is_refused_not_lost() {
    if skip_unless_root("a_save_over_a_newer_state_is_refused_not_lost") {
        return;
    }
    let s3 = S3Server::start().unwrap();
    let store_dir = tempfile::tempdir().unwrap();
    let dir_store = format!("dir:{}", store_dir.path().display());
    let s3_url = s3.store_url();
    let s3_env_owned = s3.env();
    let s3_env: Vec<(&str, &str)> = s3_env_owned.iter().map(|(k, v)| (*k, v.as_str())).collect();
    for (store, env) in [(dir_store.as_str(), Vec::new()), (s3_url.as_str(), s3_env)] {
        let args = ["--thread-store", store];
        let node_a = Agent::start_with(&args, &env, None).await.unwrap();
        let node_b = Agent::start_with(&args, &env, None).await.unwrap();
        assert_eq!(ok(&node_a.run_request(on_thread("echo base > ~/base; echo ok", "split")).await.unwrap()), "ok\n", "{store}");

        let mut client = node_a.client().await.unwrap();
        let mut held = on_thread("echo a > ~/a; echo started; sleep 600", "split");
        held.timeout_ms = 600_000;
        let mut stream = client.execute(held).await.unwrap().into_inner();
        loop {
            match stream.message().await.unwrap().and_then(|e| e.event) {
                Some(pb::execute_event::Event::Stdout(c)) if String::from_utf8_lossy(&c.data).contains("started") => break,
                Some(_) => continue,
                None => panic!("{store}: the holding call ended early"),
            }
        }
        assert_eq!(ok(&node_b.run_request(on_thread("echo b > ~/b; echo ok", "split")).await.unwrap()), "ok\n", "{store}");
        // Cancelling ends A's call; it still saves (a program's files stay), and that save conflicts.
        drop(stream);
        drop(client);
        let mut c = node_a.client().await.unwrap();
        let deadline = Instant::now() + Duration::from_secs(30);
        while c.status(pb::StatusRequest {}).await.unwrap().into_inner().running_executions > 0 {
            assert!(Instant::now() < deadline, "{store}: node A never finished the cancelled call");
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        assert_eq!(ok(&node_b.run_request(on_thread("ls ~ | tr '\\n' ' '", "split")).await.unwrap()), "b base ", "{store}: B's save stands, A's was refused");
        assert_eq!(ok(&node_a.run_request(on_thread("ls ~ | tr '\\n' ' '", "split")).await.unwrap()), "b base ", "{store}: A rebuilt its copy");
    }
}

/// The store is down (nothing listens at its endpoint): a thread call fails
/// fast with `thread_mount_error` and runs nothing; calls without a thread
/// are unaffected.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unreachable_store_fails_thread_calls_fast_and_nothing_else() {
    if skip_unless_root("an_unreachable_store_fails_thread_calls_fast_and_nothing_else") {
        return;
    }
    // A loopback port nothing listens on.
    let port = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
    let endpoint = format!("http://127.0.0.1:{port}");
    let env = [("AWS_ENDPOINT", endpoint.as_str()), ("AWS_ALLOW_HTTP", "true"), ("AWS_REGION", "us-east-1"), ("AWS_ACCESS_KEY_ID", "x"), ("AWS_SECRET_ACCESS_KEY", "y")];
    let agent = Agent::start_with(&["--thread-store", "s3://warren-threads"], &env, None).await.unwrap();
    let t = Instant::now();
    let run = agent.run_request(on_thread("echo ran > /tmp/x; echo ran", "down")).await.unwrap();
    assert_eq!((run.exited.exit_code, run.exited.failure(), run.stdout.as_str()), (-1, Failure::ThreadMount, ""), "{run:?}");
    assert!(run.started.is_none(), "nothing started");
    assert!(t.elapsed() < Duration::from_secs(30), "bounded retries, took {:?}", t.elapsed());
    let plain = agent.run(pb::Language::Bash, "echo fine", Duration::from_secs(10)).await.unwrap();
    assert_eq!(ok(&plain), "fine\n");
    let err = agent.client().await.unwrap().delete_thread(pb::DeleteThreadRequest { thread: Some(thread_ref("down")) }).await.unwrap_err();
    assert_eq!(err.code(), tonic::Code::Unavailable);
}
