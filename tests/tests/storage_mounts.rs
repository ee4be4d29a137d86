//! Storage mounts through the real node-agent: a bucket prefix on a real S3
//! server (s3s-fs) appears at /data/<name> in the sandbox, read lazily with
//! plain file I/O, written back before the answer, scoped, read-only when
//! asked, with no credentials inside and nothing left mounted.

use std::time::Duration;

use warren_e2e::s3::{S3Server, BUCKET};
use warren_e2e::{request, skip_unless_root, Agent, Run};
use warren_proto::agent::{self as pb, Failure};

fn mount(s3: &S3Server, name: &str, prefix: &str, mode: pb::MountMode) -> pb::StorageMount {
    pb::StorageMount {
        mount_path: format!("/data/{name}"),
        // The provider as enum; the name goes along for older agents.
        provider: "s3".into(),
        provider_kind: pb::StorageProvider::S3 as i32,
        bucket: BUCKET.into(),
        prefix: prefix.into(),
        mode: mode as i32,
        endpoint: s3.endpoint(),
        region: "us-east-1".into(),
        credentials: Some(pb::Credentials { values: s3.credentials().into_iter().collect() }),
        max_write_bytes: 0,
        ambient_identity: false,
    }
}

async fn run_with(agent: &Agent, code: &str, mounts: Vec<pb::StorageMount>) -> Run {
    let mut req = request(pb::Language::Python, code, Duration::from_secs(30));
    req.mounts = mounts;
    agent.run_request(req).await.unwrap()
}

fn seeded() -> S3Server {
    let s3 = S3Server::start().unwrap();
    s3.put("tenants/a/in/customers.csv", b"id,name\n1,ada\n2,bob\n");
    s3.put("tenants/ab/secret", b"sibling");
    s3.put("tenants/top", b"above");
    s3
}

fn host_mounts_below(dir: &std::path::Path) -> Vec<String> {
    let info = std::fs::read_to_string("/proc/self/mountinfo").unwrap();
    info.lines().filter_map(|l| l.split(' ').nth(4)).filter(|p| p.starts_with(dir.to_str().unwrap())).map(str::to_string).collect()
}

/// The shared start, then what this test checks.
fn program() -> String {
    let end = r#"
print(json.dumps({
    'listing': sorted(os.listdir(f'{lake}/in')),
    'size': os.stat(f'{lake}/in/customers.csv').st_size,
    'escapes': escapes,
    'env': dict(os.environ),
    'mountinfo': open('/proc/self/mountinfo').read(),
}))
"#;
    format!("{}{end}", warren_e2e::storage::LAKE_PROGRAM_START)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_bucket_prefix_is_read_and_written_with_plain_file_io() {
    if skip_unless_root("a_bucket_prefix_is_read_and_written_with_plain_file_io") {
        return;
    }
    let s3 = seeded();
    let agent = Agent::start(&[]).await.unwrap();
    let run = run_with(&agent, &program(), vec![mount(&s3, "lake", "tenants/a", pb::MountMode::ReadWrite)]).await;
    assert_eq!((run.exited.exit_code, run.exited.failure()), (0, Failure::Unspecified), "{run:?}");
    let out: serde_json::Value = serde_json::from_str(run.stdout.trim()).unwrap();
    assert_eq!(out["listing"], serde_json::json!(["customers.csv"]));
    assert_eq!(out["size"], 20);
    assert_eq!(out["escapes"], serde_json::json!([]), "read outside the mount's prefix");
    // Stored before the answer: the object is there as soon as Exited arrived.
    assert_eq!(s3.get("tenants/a/out/report.txt").as_deref(), Some(&b"2 customers\n"[..]));
    assert!(!run.stdout.contains(s3.secret_key()), "a credential reached the sandbox");
    assert!(!out["mountinfo"].as_str().unwrap().contains(&s3.endpoint()), "the endpoint shows in the sandbox's mountinfo");
    // Released after the answer: gone once the agent has finished the call.
    let gone = warren_e2e::gateway::wait_for(Duration::from_secs(10), || host_mounts_below(&agent.state_dir()).iter().all(|m| !m.contains(".data")));
    assert!(gone, "a storage mount outlived its call: {:?}", host_mounts_below(&agent.state_dir()));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_read_only_mount_refuses_writes_and_the_bucket_is_untouched() {
    if skip_unless_root("a_read_only_mount_refuses_writes_and_the_bucket_is_untouched") {
        return;
    }
    let s3 = seeded();
    let agent = Agent::start(&[]).await.unwrap();
    let code = format!("{}print(open('/data/ref/in/customers.csv').read().count('\\n'))\n", warren_e2e::storage::READ_ONLY_PROBE);
    let run = run_with(&agent, &code, vec![mount(&s3, "ref", "tenants/a", pb::MountMode::ReadOnly)]).await;
    assert_eq!(run.exited.exit_code, 0, "{run:?}");
    assert_eq!(run.stdout, "EROFS EROFS EROFS EROFS\n3\n");
    assert_eq!(s3.objects("tenants/a"), ["tenants/a/in/customers.csv"], "nothing reached the bucket");
}

/// The store goes away while the program has a file open: its close fails
/// (EIO), it goes on, and the answer names the file with the output intact.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_write_the_store_refuses_is_reported_with_its_path_and_the_output_kept() {
    if skip_unless_root("a_write_the_store_refuses_is_reported_with_its_path_and_the_output_kept") {
        return;
    }
    let mut s3 = seeded();
    let agent = Agent::start(&[]).await.unwrap();
    // Waits (bounded) until a lookup fails: the store is gone.
    let code = r#"
import os, sys
f = open('/data/lake/new.txt', 'w'); f.write('x')
print('written', flush=True)
for i in range(2000):
    try:
        os.stat(f'/data/lake/probe-{i}')
    except FileNotFoundError:
        continue
    except OSError:
        break
try:
    f.close(); print('closed')
except OSError as e:
    print('close failed', e.errno)
print('after')
"#;
    let mut req = request(pb::Language::Python, code, Duration::from_secs(60));
    req.mounts = vec![mount(&s3, "lake", "tenants/a", pb::MountMode::ReadWrite)];
    let mut stream = agent.client().await.unwrap().execute(req).await.unwrap().into_inner();
    let (mut stdout, mut exited) = (String::new(), None);
    while let Some(ev) = stream.message().await.unwrap() {
        match ev.event {
            Some(pb::execute_event::Event::Stdout(c)) => {
                stdout.push_str(&String::from_utf8_lossy(&c.data));
                if stdout == "written\n" {
                    s3.stop();
                }
            }
            Some(pb::execute_event::Event::Exited(x)) => exited = Some(x),
            _ => {}
        }
    }
    let x = exited.expect("an Exited event");
    assert_eq!(stdout, "written\nclose failed 5\nafter\n", "the program saw EIO at close and went on");
    assert_eq!((x.exit_code, x.failure()), (0, Failure::StorageSync), "{x:?}");
    assert_eq!(x.unsynced_paths, ["/data/lake/new.txt"]);
    assert!(s3.get("tenants/a/new.txt").is_none());
}

/// The store hangs on uploads (a proxy in front of s3s-fs holds every PUT
/// unanswered): the program's close and the final sync are cut off at the
/// call's timeout plus a few seconds' grace, and the answer names the file —
/// not a call held for the store's minute of retries.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_store_that_hangs_ends_the_call_at_its_timeout_with_the_sync_error() {
    if skip_unless_root("a_store_that_hangs_ends_the_call_at_its_timeout_with_the_sync_error") {
        return;
    }
    let s3 = seeded();
    let proxy = warren_e2e::s3::HangingProxy::start(s3.addr, b"PUT ").unwrap();
    // One request per connection, so the proxy sees each request's verb.
    let agent = Agent::start(&["--s3-pool-max-idle", "0"]).await.unwrap();
    let code = "with open('/data/lake/late.txt', 'w') as f:\n    f.write('x')\nprint('closed')";
    let mut req = request(pb::Language::Python, code, Duration::from_secs(3));
    req.mounts = vec![pb::StorageMount { endpoint: proxy.endpoint(), ..mount(&s3, "lake", "tenants/a", pb::MountMode::ReadWrite) }];
    let started = std::time::Instant::now();
    let run = agent.run_request(req).await.unwrap();
    let took = started.elapsed();
    assert_eq!((run.exited.timed_out, run.exited.failure()), (true, Failure::StorageSync), "{run:?}");
    assert_eq!(run.exited.unsynced_paths, ["/data/lake/late.txt"]);
    assert!(s3.get("tenants/a/late.txt").is_none());
    // 3 s timeout + 5 s grace; the store's own retries would take a minute.
    assert!(took < Duration::from_secs(30), "the call was held {took:?} by a hung store");
}

/// Declared once as manifests (StorageConnection + its Secret, a Sandbox
/// mounting it, an ApiKey), used over HTTP with `sub_paths` narrowing the
/// mount for one call.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn manifests_declare_the_mount_and_sub_paths_narrow_it_per_call() {
    use warren_e2e::gateway::{key, wait_for, Gateway};
    if skip_unless_root("manifests_declare_the_mount_and_sub_paths_narrow_it_per_call") {
        return;
    }
    let s3 = seeded();
    let agent = Agent::start(&[]).await.unwrap();
    let gw = Gateway::start(&[agent.address()], &[], true).await.unwrap();
    let creds: String = s3.credentials().iter().map(|(k, v)| format!("{k}: {v}, ")).collect();
    let manifests = format!(
        "apiVersion: warren.dev/v1alpha1\nkind: StorageConnection\nmetadata: {{name: lake}}\nspec: {{provider: S3, bucket: {BUCKET}, prefix: tenants, endpoint: '{}', region: us-east-1, credentialsSecretRef: {{name: lake-creds}}}}\n---\n\
         apiVersion: v1\nkind: Secret\nmetadata: {{name: lake-creds}}\nstringData: {{{creds}}}\n---\n\
         apiVersion: warren.dev/v1alpha1\nkind: Sandbox\nmetadata: {{name: with-data}}\nspec: {{image: host, storage: [{{name: lake, connectionRef: {{name: lake}}, mode: ReadWrite, prefix: a}}]}}\n---\n\
         apiVersion: warren.dev/v1alpha1\nkind: ApiKey\nmetadata: {{name: data}}\nspec: {{sandboxRef: {{name: with-data}}}}\n---\n\
         apiVersion: v1\nkind: Secret\nmetadata: {{name: data-key}}\nstringData: {{key: {}}}\n",
        s3.endpoint(),
        key("data")
    );
    std::fs::write(gw.manifest_dir().join("storage.yaml"), manifests).unwrap();
    assert!(wait_for(Duration::from_secs(20), || gw.execute(&key("data"), &serde_json::json!({"code": "print(1)"})).status == 200), "{:?}", gw.logs());

    let code = "print(open('/data/lake/customers.csv').read(), end='')\nopen('/data/lake/summary.txt', 'w').write('2 rows')";
    let r = gw.execute(&key("data"), &serde_json::json!({"code": code, "language": "python", "sub_paths": ["/data/lake/in"]}));
    assert_eq!(r.status, 200, "{}", r.text());
    assert_eq!((r.json()["success"].as_bool(), r.json()["stdout"].as_str()), (Some(true), Some("id,name\n1,ada\n2,bob\n")), "{}", r.text());
    assert_eq!(s3.get("tenants/a/in/summary.txt").as_deref(), Some(&b"2 rows"[..]), "written under the narrowed prefix before the answer");

    let whole = gw.execute(&key("data"), &serde_json::json!({"code": "import os; print(sorted(os.listdir('/data/lake')))", "language": "python"}));
    assert_eq!(whole.json()["stdout"], "['in']\n", "without sub_paths the mount shows the key's whole prefix");
    let bad = gw.execute(&key("data"), &serde_json::json!({"code": "print(1)", "sub_paths": ["/data/nope/x"]}));
    assert_eq!((bad.status, bad.json()["field"].as_str()), (400, Some("sub_paths[0]")));
    assert!(!gw.logs().iter().any(|l| l.contains(s3.secret_key())), "a credential reached the gateway's log");
}

/// A Local connection: a directory on the node, through the same FUSE path.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_local_directory_mounts_like_a_bucket() {
    if skip_unless_root("a_local_directory_mounts_like_a_bucket") {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    std::fs::create_dir_all(dir.path().join("team/in")).unwrap();
    std::fs::write(dir.path().join("team/in/a.txt"), "alpha").unwrap();
    std::fs::write(dir.path().join("outside.txt"), "not yours").unwrap();
    let root = dir.path().canonicalize().unwrap().display().to_string();
    let agent = Agent::start(&["--local-storage-root", &root]).await.unwrap();
    let local = pb::StorageMount {
        mount_path: "/data/files".into(),
        provider: "local".into(),
        bucket: dir.path().display().to_string(),
        prefix: "team".into(),
        mode: pb::MountMode::ReadWrite as i32,
        ..Default::default()
    };
    let code = "import os\nprint(open('/data/files/in/a.txt').read(), sorted(os.listdir('/data/files')))\nopen('/data/files/out.txt', 'w').write('beta')";
    let run = run_with(&agent, code, vec![local]).await;
    assert_eq!((run.exited.exit_code, run.stdout.as_str()), (0, "alpha ['in']\n"), "{run:?}");
    assert_eq!(std::fs::read_to_string(dir.path().join("team/out.txt")).unwrap(), "beta");
}

fn local(dir: &str, prefix: &str) -> pb::StorageMount {
    pb::StorageMount { mount_path: "/data/files".into(), provider: "local".into(), bucket: dir.into(), prefix: prefix.into(), mode: pb::MountMode::ReadWrite as i32, ..Default::default() }
}

/// The attacks of a tenant holding StorageConnection rights: `bucket: /`
/// to read the host's /etc/shadow, the agent's own prepared /etc (where a
/// planted `sitecustomize.py` ran in every other tenant's call), a symlink
/// inside an ordinary directory leading out of it. Local directories are
/// an admin's grant: refused unless beneath an allowed root, never
/// overlapping the agent's state, never followed through a symlink.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn local_directories_are_an_admins_grant_and_never_lead_out() {
    if skip_unless_root("local_directories_are_an_admins_grant_and_never_lead_out") {
        return;
    }
    let refusal = |e: anyhow::Error| {
        let s = e.downcast_ref::<tonic::Status>().unwrap_or_else(|| panic!("not a refusal: {e:#}"));
        (s.code(), warren_proto::refusal::refusal_of(s).1, s.message().to_string())
    };
    let granted = tempfile::tempdir().unwrap();
    let root = granted.path().canonicalize().unwrap();
    let outside = tempfile::tempdir().unwrap();
    std::fs::write(outside.path().join("secret"), "hunter2").unwrap();
    std::fs::create_dir_all(root.join("team")).unwrap();
    std::fs::write(root.join("team/ok.txt"), "fine").unwrap();
    std::os::unix::fs::symlink(outside.path(), root.join("team/out")).unwrap();
    std::os::unix::fs::symlink(outside.path().join("secret"), root.join("team/secret")).unwrap();

    // By default (no grant) even an ordinary directory is refused.
    let plain = Agent::start(&[]).await.unwrap();
    let mut req = request(pb::Language::Python, "print(1)", Duration::from_secs(30));
    req.mounts = vec![local(&root.display().to_string(), "team")];
    let (code, field, message) = refusal(plain.run_request(req).await.unwrap_err());
    assert_eq!((code, field.as_str()), (tonic::Code::PermissionDenied, "mounts[0].bucket"), "{message}");
    assert!(message.contains("--local-storage-root"), "the refusal says how an admin grants one: {message}");
    drop(plain);

    let root_s = root.display().to_string();
    let agent = Agent::start(&["--local-storage-root", &root_s]).await.unwrap();
    // The prepared /etc lives in the agent's prepared host root.
    let state_etc = agent.state_dir().join("hostroot/etc");
    assert!(state_etc.join("passwd").is_file(), "the agent's prepared /etc is at {}", state_etc.display());
    let state_etc = state_etc.display().to_string();
    for (bucket, prefix) in [("/", "etc"), ("/etc", ""), (state_etc.as_str(), ""), (outside.path().to_str().unwrap(), "")] {
        let mut req = request(pb::Language::Python, "print(open('/data/files/shadow').read())", Duration::from_secs(30));
        req.mounts = vec![local(bucket, prefix)];
        let (code, field, message) = refusal(agent.run_request(req).await.unwrap_err());
        assert_eq!((code, field.as_str()), (tonic::Code::PermissionDenied, "mounts[0].bucket"), "{bucket}: {message}");
    }
    let code = r#"
import os
print(open('/data/files/ok.txt').read(), sorted(os.listdir('/data/files')))
for p in ['/data/files/secret', '/data/files/out/secret']:
    try:
        print(p, open(p).read())
    except OSError as e:
        print(p, 'refused')
try:
    open('/data/files/out/planted', 'w').write('x'); print('planted')
except OSError:
    print('not planted')
"#;
    let run = run_with(&agent, code, vec![local(&root_s, "team")]).await;
    assert_eq!(run.exited.exit_code, 0, "{run:?}");
    assert!(!run.stdout.contains("hunter2"), "read through a symlink: {}", run.stdout);
    assert!(run.stdout.starts_with("fine ['ok.txt']\n"), "symlinks are not listed: {}", run.stdout);
    assert!(!outside.path().join("planted").exists(), "written through a symlinked directory");

    // An admin's mistake is refused at start (the overlap with the agent's
    // own state is a unit test of warren-storage's `local`).
    let alias = root.join("alias");
    std::os::unix::fs::symlink(outside.path(), &alias).unwrap();
    for bad in ["/etc", "/", "/usr/lib", alias.to_str().unwrap()] {
        let mut started = Agent::start_no_wait(&["--local-storage-root", bad]).unwrap();
        let status = started.wait_exit(Duration::from_secs(30)).expect("the agent must refuse to start");
        assert!(!status.success(), "{bad}");
        assert!(host_mounts_below(&started.state_dir()).is_empty(), "{bad}: a refused start left mounts behind");
    }
}

/// A managed volume: kept in the agent's own platform store (here its
/// default directory store), one namespace's volume invisible to another's,
/// and no mount of that store can reach thread state.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_managed_volume_keeps_files_across_calls_in_the_platform_store() {
    if skip_unless_root("a_managed_volume_keeps_files_across_calls_in_the_platform_store") {
        return;
    }
    let agent = Agent::start(&[]).await.unwrap();
    let volume = |prefix: &str| pb::StorageMount {
        mount_path: "/data/scratch".into(),
        provider: "volume".into(),
        prefix: prefix.into(),
        mode: pb::MountMode::ReadWrite as i32,
        ..Default::default()
    };
    let write = "import os\nos.makedirs('/data/scratch/notes', exist_ok=True)\nopen('/data/scratch/notes/a.txt', 'w').write('kept')";
    let run = run_with(&agent, write, vec![volume("volumes/team-a/scratch")]).await;
    assert_eq!((run.exited.exit_code, run.exited.failure()), (0, Failure::Unspecified), "{run:?}");
    let stored = agent.state_dir().join("thread-store/volumes/team-a/scratch/notes/a.txt");
    assert_eq!(std::fs::read_to_string(&stored).unwrap(), "kept", "stored in the platform store before the answer");
    let read = "import os\nprint(open('/data/scratch/notes/a.txt').read() if os.path.exists('/data/scratch/notes') else 'absent')";
    let run = run_with(&agent, read, vec![volume("volumes/team-a/scratch")]).await;
    assert_eq!((run.exited.exit_code, run.stdout.as_str()), (0, "kept\n"), "{run:?}");
    let run = run_with(&agent, read, vec![volume("volumes/team-b/scratch")]).await;
    assert_eq!((run.exited.exit_code, run.stdout.as_str()), (0, "absent\n"), "another namespace's volume of the same name");
    for beside in ["threads/team-a/k", "volumes/team-a", ""] {
        let mut req = request(pb::Language::Python, "print('ran')", Duration::from_secs(30));
        req.mounts = vec![volume(beside)];
        let refused = agent.run_request(req).await;
        assert!(refused.as_ref().is_err_and(|e| e.to_string().contains("mounts[0].prefix")), "{beside:?}: {refused:?}");
    }
}

/// The agent killed mid-call leaves a dead FUSE mount behind; the next
/// agent on the same state unmounts it before serving.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_killed_agents_mounts_are_collected_when_it_starts_again() {
    if skip_unless_root("a_killed_agents_mounts_are_collected_when_it_starts_again") {
        return;
    }
    let s3 = seeded();
    let base = tempfile::tempdir().unwrap();
    let state = base.path().join("state");
    let mut agent = Agent::start_with(&[], &[], Some(&state)).await.unwrap();
    let mut req = request(pb::Language::Bash, "ls /data/lake >/dev/null && echo ready && sleep 60", Duration::from_secs(60));
    req.mounts = vec![mount(&s3, "lake", "tenants/a", pb::MountMode::ReadWrite)];
    let mut stream = agent.client().await.unwrap().execute(req).await.unwrap().into_inner();
    while let Some(ev) = stream.message().await.unwrap() {
        if matches!(ev.event, Some(pb::execute_event::Event::Stdout(ref c)) if c.data == b"ready\n") {
            break;
        }
    }
    assert!(host_mounts_below(&state).iter().any(|m| m.ends_with(".data/lake")), "the mount is up: {:?}", host_mounts_below(&state));
    // Sessions the agent mounted ahead of calls (and the one the call took).
    let sessions: Vec<String> = host_mounts_below(&state.join("fuse-pool")).into_iter().filter(|m| !m.ends_with("fuse-pool")).collect();
    assert!(!sessions.is_empty(), "the agent keeps FUSE sessions mounted ahead of calls");
    agent.kill_hard();
    drop(stream);
    let again = Agent::start_with(&[], &[], Some(&state)).await.unwrap();
    let now = host_mounts_below(&state);
    assert!(now.iter().all(|m| !m.contains(".data")), "left mounted: {now:?}");
    assert!(sessions.iter().all(|s| !now.contains(s)), "a killed agent's pooled session is still mounted: {now:?}");
    drop(again);
}

/// What a StorageConnection's Ready condition is built on, against a real
/// S3 server: usable, wrong credentials, no such bucket, nobody listening.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_reachability_probe_tells_the_failures_apart() {
    use warren_storage::probe::{probe, ProbeError};
    use warren_core::contract::Mount;
    use warren_storage::spec::{validate, Credentials};
    let s3 = seeded();
    let spec = |bucket: &str, endpoint: String, creds: Vec<(String, String)>| {
        let raw = Mount {
            prefix: "tenants".into(),
            endpoint: Some(endpoint),
            region: Some("us-east-1".into()),
            credentials: Credentials(creds.into_iter().collect()),
            ..Mount::new("p", warren_storage::spec::Provider::S3, bucket)
        };
        validate(vec![raw]).unwrap().remove(0)
    };
    // The S3 server is on loopback: what an admin would allow with --allow-endpoint.
    let loopback = std::sync::Arc::new(warren_core::reach::EndpointPolicy::new(&["127.0.0.0/8".into()], vec![]).unwrap());
    let check = |m: warren_storage::MountSpec| {
        let loopback = loopback.clone();
        async move { probe(m.store(&loopback).unwrap(), &m.root()).await }
    };
    assert_eq!(check(spec(BUCKET, s3.endpoint(), s3.credentials())).await, Ok(()));
    let wrong = vec![("accessKeyId".to_string(), "nobody".to_string()), ("secretAccessKey".to_string(), "wrong".to_string())];
    assert_eq!(check(spec(BUCKET, s3.endpoint(), wrong)).await, Err(ProbeError::CredentialsRefused));
    assert_eq!(check(spec("no-such-bucket", s3.endpoint(), s3.credentials())).await, Err(ProbeError::BucketNotFound));
    let closed = format!("http://127.0.0.1:{}", std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port());
    assert_eq!(check(spec(BUCKET, closed, s3.credentials())).await, Err(ProbeError::Unreachable));
}

/// 100 MB both ways: written through the mount (multipart, stored before
/// the answer), read back through it in another call, byte for byte.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_hundred_megabyte_file_goes_both_ways() {
    if skip_unless_root("a_hundred_megabyte_file_goes_both_ways") {
        return;
    }
    let s3 = seeded();
    let agent = Agent::start(&[]).await.unwrap();
    let m = || vec![mount(&s3, "lake", "tenants/a", pb::MountMode::ReadWrite)];
    let write = "import hashlib\nh = hashlib.sha256()\nwith open('/data/lake/big.bin', 'wb') as f:\n    for i in range(100):\n        block = bytes([i % 251]) * (1 << 20)\n        h.update(block); f.write(block)\nprint(h.hexdigest())";
    let wrote = run_with(&agent, write, m()).await;
    assert_eq!((wrote.exited.exit_code, wrote.exited.failure()), (0, Failure::Unspecified), "{wrote:?}");
    let stored = s3.get("tenants/a/big.bin").expect("stored before the answer");
    assert_eq!(stored.len(), 100 << 20);
    let read = "import hashlib\nh = hashlib.sha256()\nwith open('/data/lake/big.bin', 'rb') as f:\n    while b := f.read(1 << 20): h.update(b)\nprint(h.hexdigest())";
    let back = run_with(&agent, read, m()).await;
    assert_eq!(back.exited.exit_code, 0, "{back:?}");
    assert_eq!(back.stdout, wrote.stdout, "the same bytes came back");
}
