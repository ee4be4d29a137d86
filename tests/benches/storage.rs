//! Storage mounts against a real S3 server (s3s-fs on loopback), in one run:
//!
//! 1. The cost of a mount a call does not touch: a call with one mount vs
//!    the same call with none (interleaved; bash `true` and python `pass`),
//!    with the agent's FUSE session pool and, on a second agent, without it
//!    (each call mounting its own).
//! 2. Reading one 1 KB file from a prefix of 10,000 objects: that call vs
//!    `pass` with the same mount, cold (a file never read on this node) and
//!    warm (the same file again: its body comes from the node's cache).
//! 3. Sequential throughput of a 100 MB file through the mount (read, and
//!    write stored before the answer) vs a direct `object_store` GET/PUT of
//!    the same object from this process.
//!
//! Needs root and release binaries: `cargo build --release --workspace --bins`,
//! then `cargo bench -p warren-e2e --bench storage` (WARREN_BENCH_RUNS, default 40).

use std::sync::Arc;
use std::time::{Duration, Instant};

use object_store::path::Path;
use object_store::{ObjectStore, PutPayload, WriteMultipart};
use warren_e2e::bench::{ms, percentile};
use warren_e2e::s3::{S3Server, BUCKET};
use warren_e2e::{is_root, request, Agent};
use warren_proto::agent as pb;

const MB: usize = 1 << 20;

fn mount(s3: &S3Server) -> pb::StorageMount {
    pb::StorageMount {
        mount_path: "/data/lake".into(),
        provider: "s3".into(),
        provider_kind: pb::StorageProvider::S3 as i32,
        bucket: BUCKET.into(),
        prefix: "tenants/a".into(),
        mode: pb::MountMode::ReadWrite as i32,
        endpoint: s3.endpoint(),
        region: "us-east-1".into(),
        credentials: Some(pb::Credentials { values: s3.credentials().into_iter().collect() }),
        max_write_bytes: 512 << 20,
        ambient_identity: false,
    }
}

async fn timed(agent: &Agent, code: &str, mounts: Vec<pb::StorageMount>) -> (Duration, String) {
    timed_in(agent, pb::Language::Python, code, mounts).await
}

async fn timed_in(agent: &Agent, lang: pb::Language, code: &str, mounts: Vec<pb::StorageMount>) -> (Duration, String) {
    let mut req = request(lang, code, Duration::from_secs(120));
    req.mounts = mounts;
    let t = Instant::now();
    let run = agent.run_request(req).await.unwrap();
    let took = t.elapsed();
    assert_eq!((run.exited.exit_code, run.exited.failure()), (0, pb::Failure::Unspecified), "{run:?}");
    (took, run.stdout)
}

fn direct_store(s3: &S3Server) -> Arc<dyn ObjectStore> {
    Arc::new(direct_s3(s3))
}

fn direct_s3(s3: &S3Server) -> object_store::aws::AmazonS3 {
    let c: std::collections::HashMap<String, String> = s3.credentials().into_iter().collect();
    {
        object_store::aws::AmazonS3Builder::new()
            .with_client_options(object_store::ClientOptions::new().with_pool_max_idle_per_host(0))
            .with_bucket_name(BUCKET)
            .with_region("us-east-1")
            .with_endpoint(s3.endpoint())
            .with_allow_http(true)
            .with_access_key_id(&c["accessKeyId"])
            .with_secret_access_key(&c["secretAccessKey"])
            .build()
            .unwrap()
    }
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() {
    if !is_root() {
        eprintln!("SKIPPED storage: needs root");
        return;
    }
    let runs: usize = std::env::var("WARREN_BENCH_RUNS").ok().and_then(|v| v.parse().ok()).unwrap_or(40);
    let s3 = S3Server::start().expect("s3s-fs (scripts/test.sh installs it)");
    for i in 0..10_000 {
        s3.put(&format!("tenants/a/many/r{i:05}.csv"), &[b'x'; 1024]);
    }
    s3.put("tenants/a/many/target.csv", &[b'y'; 1024]);
    let big: Vec<u8> = (0..100 * MB).map(|i| (i % 251) as u8).collect();
    s3.put("tenants/a/big.bin", &big);
    // s3s-fs does not set TCP_NODELAY: reused connections stall ~40 ms per
    // request there (not on real S3), so each request gets its own.
    let agent = Agent::start(&["--s3-pool-max-idle", "0"]).await.expect("agent starts");
    let unpooled = Agent::start(&["--s3-pool-max-idle", "0", "--storage-fuse-pool", "0"]).await.expect("agent starts");
    let m = mount(&s3);
    for _ in 0..3 {
        timed(&agent, "pass", vec![m.clone()]).await;
        timed(&unpooled, "pass", vec![m.clone()]).await;
    }

    // 1. Untouched mounts, one agent at a time (bash `true` shows the cost
    //    with the least noise around it; python `pass` is the usual call).
    println!("storage mounts: {runs} calls each, interleaved with and without a mount (gRPC to the agent)");
    println!("{:<52} {:>10} {:>10} {:>10}", "untouched mount", "no mount", "mount", "added p50");
    let mut idle = Vec::new();
    for (name, a) in [("pooled FUSE sessions", &agent), ("each call mounts (--storage-fuse-pool 0)", &unpooled)] {
        for (lang, code) in [(pb::Language::Bash, "true"), (pb::Language::Python, "pass")] {
            let (mut without, mut with) = (Vec::new(), Vec::new());
            for _ in 0..runs {
                without.push(timed_in(a, lang, code, vec![]).await.0);
                with.push(timed_in(a, lang, code, vec![m.clone()]).await.0);
            }
            without.sort();
            with.sort();
            let (n, w) = (ms(percentile(&without, 0.5)), ms(percentile(&with, 0.5)));
            println!("{:<52} {n:>8.2}ms {w:>8.2}ms {:>+8.2}ms", format!("{name}, {lang:?}"), w - n);
            if lang == pb::Language::Python && idle.is_empty() {
                idle = with;
            }
        }
    }

    // 2. Reading 1 KB of a 10,000-object directory (pooled agent).
    let (mut cold, mut read) = (Vec::new(), Vec::new());
    for i in 0..runs {
        cold.push(timed(&agent, &format!("open('/data/lake/many/r{i:05}.csv').read()"), vec![m.clone()]).await.0);
        read.push(timed(&agent, "open('/data/lake/many/target.csv').read()", vec![m.clone()]).await.0);
    }
    cold.sort();
    read.sort();
    let p = |v: &[Duration]| (ms(percentile(v, 0.5)), ms(percentile(v, 0.99)));
    for (name, v) in [("read 1 KB of a 10,000-object dir, cold", &cold), ("read 1 KB of a 10,000-object dir, warm", &read)] {
        let (a, b) = p(v);
        println!("{name:<52} p50 {a:>8.2}ms p99 {b:>8.2}ms");
    }
    println!("  reading the file adds {:+.2} ms cold, {:+.2} ms warm (p50 over the untouched python call)", p(&cold).0 - p(&idle).0, p(&read).0 - p(&idle).0);

    // Throughput: the program times its own reading; the write is timed as
    // the whole call minus an untouched call (it includes the upload).
    let (_, out) = timed(&agent, "import time\nt = time.perf_counter(); n = 0\nwith open('/data/lake/big.bin', 'rb') as f:\n    while b := f.read(1 << 20): n += len(b)\nprint(n, time.perf_counter() - t)", vec![m.clone()]).await;
    let mut parts = out.split_whitespace();
    let (n, secs): (usize, f64) = (parts.next().unwrap().parse().unwrap(), parts.next().unwrap().parse().unwrap());
    assert_eq!(n, 100 * MB);
    let mount_read = n as f64 / MB as f64 / secs;
    let (write_call, _) = timed(&agent, "with open('/data/lake/out.bin', 'wb') as f:\n    block = bytes(1 << 20)\n    for _ in range(100): f.write(block)", vec![m.clone()]).await;
    let mount_write = 100.0 / (write_call.as_secs_f64() - percentile(&idle, 0.5).as_secs_f64());

    let store = direct_store(&s3);
    let t = Instant::now();
    let body = store.get(&Path::from("tenants/a/big.bin")).await.unwrap().bytes().await.unwrap();
    let direct_read = body.len() as f64 / MB as f64 / t.elapsed().as_secs_f64();
    let t = Instant::now();
    let mut up = WriteMultipart::new_with_chunk_size(store.put_multipart(&Path::from("tenants/a/direct.bin")).await.unwrap(), 8 * MB);
    for chunk in big.chunks(8 * MB) {
        up.wait_for_capacity(4).await.unwrap();
        up.put(bytes::Bytes::copy_from_slice(chunk));
    }
    up.finish().await.unwrap();
    let direct_write = 100.0 / t.elapsed().as_secs_f64();
    let _ = store.put(&Path::from("tenants/a/none"), PutPayload::from_static(b"")).await;
    // The same requests the mount makes, straight from this process: 8 MiB
    // ranged GETs in order (s3s-fs hashes the whole object on every GET and
    // HEAD, so per-request cost grows with the object, unlike S3).
    let t = Instant::now();
    let chunk = 8 * MB as u64;
    for start in (0..big.len() as u64).step_by(chunk as usize) {
        store.get_range(&Path::from("tenants/a/big.bin"), start..(start + chunk).min(big.len() as u64)).await.unwrap();
    }
    let direct_ranged = 100.0 / t.elapsed().as_secs_f64();
    println!(
        "100 MB sequential read: {mount_read:.0} MB/s through the mount; direct {direct_read:.0} MB/s in one GET ({:.0}%), {direct_ranged:.0} MB/s in the mount's 8 MiB ranged GETs ({:.0}%)",
        100.0 * mount_read / direct_read,
        100.0 * mount_read / direct_ranged
    );
    println!("100 MB sequential write: {mount_write:.0} MB/s through the mount, stored before the answer; {direct_write:.0} MB/s direct multipart ({:.0}%)", 100.0 * mount_write / direct_write);
    // What the 1 KB read costs as plain requests: the lookups' probes (one
    // key under `many/`, one under `many/target.csv/`), the HEAD and the GET.
    use object_store::list::{PaginatedListOptions, PaginatedListStore};
    let pager = direct_s3(&s3);
    let one = || PaginatedListOptions { delimiter: Some("/".into()), max_keys: Some(1), ..Default::default() };
    let mut steps = Vec::new();
    for (name, prefix) in [("probe many/ (10,000 objects)", "tenants/a/many/"), ("probe many/target.csv/", "tenants/a/many/target.csv/")] {
        let t = Instant::now();
        pager.list_paginated(Some(prefix), one()).await.unwrap();
        steps.push(format!("{name} {:.1} ms", ms(t.elapsed())));
    }
    let t = Instant::now();
    pager.head(&Path::from("tenants/a/many/target.csv")).await.unwrap();
    steps.push(format!("HEAD {:.1} ms", ms(t.elapsed())));
    let t = Instant::now();
    pager.get_range(&Path::from("tenants/a/many/target.csv"), 0..1024).await.unwrap();
    steps.push(format!("GET {:.1} ms", ms(t.elapsed())));
    println!("the same requests direct: {}", steps.join(", "));
}
