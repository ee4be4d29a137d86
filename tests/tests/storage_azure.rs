//! Azure Blob mounts through the real node-agent against Azurite (the
//! official emulator): the same tree as S3 over another provider — reads,
//! listings, every kind of write stored before the answer, a 100 MB file
//! both ways, read-only refusals, sibling prefixes kept apart, no key
//! inside, and the reachability probe's verdicts.

use std::time::Duration;

use bytes::Bytes;
use object_store::path::Path;
use object_store::{ObjectStore, PutPayload};
use warren_e2e::azurite::{Azurite, CONTAINER};
use warren_e2e::{request, skip_unless_root, Agent, Run};
use warren_proto::agent::{self as pb, Failure};

fn mount(az: &Azurite, name: &str, prefix: &str, mode: pb::MountMode) -> pb::StorageMount {
    pb::StorageMount {
        mount_path: format!("/data/{name}"),
        // By name only, as a gateway before the provider enum sends it.
        provider: "azure".into(),
        provider_kind: pb::StorageProvider::Unspecified as i32,
        bucket: CONTAINER.into(),
        prefix: prefix.into(),
        mode: mode as i32,
        endpoint: az.endpoint(),
        region: String::new(),
        credentials: Some(pb::Credentials { values: az.credentials().into_iter().collect() }),
        max_write_bytes: 256 << 20,
        ambient_identity: false,
    }
}

/// Azurite is on loopback: what an admin would allow with --allow-endpoint.
fn loopback() -> std::sync::Arc<warren_core::reach::EndpointPolicy> {
    std::sync::Arc::new(warren_core::reach::EndpointPolicy::new(&["127.0.0.0/8".into()], vec![]).unwrap())
}

async fn run_with(agent: &Agent, code: &str, mounts: Vec<pb::StorageMount>) -> Run {
    let mut req = request(pb::Language::Python, code, Duration::from_secs(120));
    req.mounts = mounts;
    agent.run_request(req).await.unwrap()
}

async fn put(store: &dyn ObjectStore, key: &str, body: &'static [u8]) {
    store.put(&Path::from(key), PutPayload::from_static(body)).await.unwrap();
}

async fn get(store: &dyn ObjectStore, key: &str) -> Option<Bytes> {
    Some(store.get(&Path::from(key)).await.ok()?.bytes().await.unwrap())
}

async fn keys(store: &dyn ObjectStore, prefix: &str) -> Vec<String> {
    use futures_util::TryStreamExt;
    let mut out: Vec<String> = store.list(Some(&Path::from(prefix))).map_ok(|m| m.location.to_string()).try_collect().await.unwrap();
    out.sort();
    out
}

/// The shared start (read, report, escapes), then every other kind of change.
fn program() -> String {
    let end = r#"
with open(f'{lake}/log.txt', 'a') as f:
    f.write('two\n')
with open(f'{lake}/trim.txt', 'r+') as f:
    f.truncate(4)
os.rename(f'{lake}/old.txt', f'{lake}/new.txt')
os.remove(f'{lake}/gone.txt')
walked = sorted(os.path.join(d, f)[len(lake):] for d, _, fs in os.walk(lake) for f in fs)
print(json.dumps({'walk': walked, 'size': os.stat(f'{lake}/in/customers.csv').st_size, 'escapes': escapes,
                  'env': dict(os.environ), 'mountinfo': open('/proc/self/mountinfo').read()}))
"#;
    format!("{}{end}", warren_e2e::storage::LAKE_PROGRAM_START)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_azure_container_prefix_is_read_and_written_with_plain_file_io() {
    if skip_unless_root("an_azure_container_prefix_is_read_and_written_with_plain_file_io") {
        return;
    }
    let az = Azurite::start().unwrap();
    let store = az.store();
    for (k, v) in [
        ("tenants/a/in/customers.csv", &b"id,name\n1,ada\n2,bob\n"[..]),
        ("tenants/a/log.txt", b"one\n"),
        ("tenants/a/trim.txt", b"keep-this-not"),
        ("tenants/a/old.txt", b"moved"),
        ("tenants/a/gone.txt", b"x"),
        ("tenants/ab/secret", b"sibling"),
        ("tenants/top", b"above"),
    ] {
        put(store.as_ref(), k, v).await;
    }
    let agent = Agent::start(&[]).await.unwrap();
    let run = run_with(&agent, &program(), vec![mount(&az, "lake", "tenants/a", pb::MountMode::ReadWrite)]).await;
    assert_eq!((run.exited.exit_code, run.exited.failure()), (0, Failure::Unspecified), "{run:?}");
    let out: serde_json::Value = serde_json::from_str(run.stdout.trim()).unwrap();
    assert_eq!(out["walk"], serde_json::json!(["/in/customers.csv", "/log.txt", "/new.txt", "/out/report.txt", "/trim.txt"]));
    assert_eq!(out["size"], 20);
    assert_eq!(out["escapes"], serde_json::json!([]), "read outside the mount's prefix");
    // Every change is in the container as soon as the answer arrived.
    let s = store.as_ref();
    assert_eq!(get(s, "tenants/a/out/report.txt").await.as_deref(), Some(&b"2 customers\n"[..]));
    assert_eq!(get(s, "tenants/a/log.txt").await.as_deref(), Some(&b"one\ntwo\n"[..]));
    assert_eq!(get(s, "tenants/a/trim.txt").await.as_deref(), Some(&b"keep"[..]));
    assert_eq!(get(s, "tenants/a/new.txt").await.as_deref(), Some(&b"moved"[..]));
    assert_eq!(keys(s, "tenants/a").await, ["tenants/a/in/customers.csv", "tenants/a/log.txt", "tenants/a/new.txt", "tenants/a/out/report.txt", "tenants/a/trim.txt"]);
    assert_eq!(get(s, "tenants/ab/secret").await.as_deref(), Some(&b"sibling"[..]), "the sibling prefix is untouched");
    assert!(!run.stdout.contains(az.secret_key()), "the account key reached the sandbox");
    assert!(!out["mountinfo"].as_str().unwrap().contains(&az.endpoint()), "the endpoint shows in the sandbox's mountinfo");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_azure_read_only_mount_refuses_writes_and_a_large_file_goes_both_ways() {
    if skip_unless_root("an_azure_read_only_mount_refuses_writes_and_a_large_file_goes_both_ways") {
        return;
    }
    let az = Azurite::start().unwrap();
    let store = az.store();
    put(store.as_ref(), "ref/in/customers.csv", b"id\n1\n").await;
    let agent = Agent::start(&[]).await.unwrap();
    let code = warren_e2e::storage::READ_ONLY_PROBE;
    let run = run_with(&agent, code, vec![mount(&az, "ref", "ref", pb::MountMode::ReadOnly)]).await;
    assert_eq!((run.exited.exit_code, run.stdout.as_str()), (0, "EROFS EROFS EROFS EROFS\n"), "{run:?}");
    assert_eq!(keys(store.as_ref(), "ref").await, ["ref/in/customers.csv"], "nothing reached the container");

    // 100 MB written through the mount (block upload), then read back
    // through a new call and compared with a digest.
    let code = r#"
import hashlib, sys
block = bytes(range(256)) * 4096
if sys.argv[-1] != 'read':
    with open('/data/big/blob.bin', 'wb') as f:
        for _ in range(100): f.write(block)
h = hashlib.sha256()
with open('/data/big/blob.bin', 'rb') as f:
    while b := f.read(1 << 20): h.update(b)
print(h.hexdigest())
"#;
    let expected = {
        use sha2::Digest;
        let block: Vec<u8> = (0..=255u8).cycle().take(1 << 20).collect();
        let mut h = sha2::Sha256::new();
        for _ in 0..100 {
            h.update(&block);
        }
        format!("{:x}\n", h.finalize())
    };
    let run = run_with(&agent, code, vec![mount(&az, "big", "big", pb::MountMode::ReadWrite)]).await;
    assert_eq!((run.exited.exit_code, run.exited.failure(), run.stdout.as_str()), (0, Failure::Unspecified, expected.as_str()), "{run:?}");
    let stored = store.head(&Path::from("big/blob.bin")).await.unwrap();
    assert_eq!(stored.size, 100 << 20, "stored before the answer");
    let read_back = code.replace("if sys.argv[-1] != 'read':", "if False:");
    let run = run_with(&agent, &read_back, vec![mount(&az, "big", "big", pb::MountMode::ReadOnly)]).await;
    assert_eq!((run.exited.exit_code, run.stdout.as_str()), (0, expected.as_str()), "{run:?}");
}

#[tokio::test]
async fn the_azure_reachability_probe_tells_the_failures_apart() {
    use warren_storage::probe::{probe, ProbeError};
    let az = Azurite::start().unwrap();
    let spec = |container: &str, key: &str| {
        let raw = warren_core::contract::Mount {
            endpoint: Some(az.endpoint()),
            credentials: warren_storage::spec::Credentials([("accountName".to_string(), warren_e2e::azurite::ACCOUNT.to_string()), ("accountKey".to_string(), key.to_string())].into()),
            ..warren_core::contract::Mount::new("p", warren_storage::spec::Provider::Azure, container)
        };
        warren_storage::spec::validate(vec![raw]).unwrap().remove(0)
    };
    let key = az.credentials()[1].1.clone();
    let ok = spec(CONTAINER, &key);
    assert_eq!(probe(ok.store(&loopback()).unwrap(), &ok.root()).await, Ok(()));
    let missing = spec("no-such-container", &key);
    assert_eq!(probe(missing.store(&loopback()).unwrap(), &missing.root()).await, Err(ProbeError::BucketNotFound));
    let wrong = spec(CONTAINER, "d3Jvbmcta2V5LXdyb25nLWtleS13cm9uZy1rZXk=");
    assert_eq!(probe(wrong.store(&loopback()).unwrap(), &wrong.root()).await, Err(ProbeError::CredentialsRefused));
}
