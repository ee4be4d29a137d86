//! OCI images on a node, measured in one run against the `host` image:
//!
//! 1. cold pull + unpack of an image from a local registry (Debian's
//!    docker-registry on loopback), through `WarmImage` on a fresh agent;
//! 2. warm starts: N `Execute` round trips on the image interleaved with N
//!    on `host`, same program — the per-call cost of an image root;
//! 3. disk use of two images sharing their base layers.
//!
//! The image is `WARREN_BENCH_IMAGE` (an OCI layout dir `oci:DIR:TAG`, e.g.
//! the built `warren-runtime`), else a bash + Python image made from this
//! machine's files. Needs root.
//!
//! `cargo bench -p warren-e2e --bench image_start` (N from WARREN_BENCH_RUNS, default 200).

use std::time::{Duration, Instant};

use warren_e2e::bench::{ms, percentile};
use warren_e2e::registry::{bash_python_image, tar_of, Registry, TestImage};
use warren_e2e::{is_root, request, Agent};
use warren_proto::agent::{self as pb, Language};

async fn round_trip(client: &mut pb::node_agent_client::NodeAgentClient<tonic::transport::Channel>, req: pb::ExecuteRequest) -> Duration {
    let t = Instant::now();
    let mut stream = client.execute(req).await.unwrap().into_inner();
    let mut out = Vec::new();
    while let Some(ev) = stream.message().await.unwrap() {
        match ev.event {
            Some(pb::execute_event::Event::Stdout(c)) => out.extend(c.data),
            Some(pb::execute_event::Event::Exited(e)) => assert_eq!(e.exit_code, 0),
            _ => {}
        }
    }
    let d = t.elapsed();
    assert_eq!(out, b"1\n");
    d
}

fn du(dir: &std::path::Path) -> u64 {
    let out = std::process::Command::new("du").args(["-sb"]).arg(dir).output().expect("du");
    String::from_utf8_lossy(&out.stdout).split_whitespace().next().and_then(|n| n.parse().ok()).unwrap_or(0)
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() {
    if !is_root() {
        eprintln!("SKIPPED image_start: needs root");
        return;
    }
    let runs: usize = std::env::var("WARREN_BENCH_RUNS").ok().and_then(|v| v.parse().ok()).unwrap_or(200);
    let registry = Registry::start().expect("registry");
    let image = bash_python_image();
    let (reference, pushed_bytes, what) = match std::env::var_os("WARREN_BENCH_IMAGE") {
        Some(archive) => {
            let reference = registry.reference("warren/runtime:bench");
            warren_e2e::registry::push_oci_archive(std::path::Path::new(&archive), &reference).expect("push the archive");
            let bytes = std::fs::metadata(&archive).map(|m| m.len() as usize).unwrap_or(0);
            (reference, bytes, std::path::PathBuf::from(archive).display().to_string())
        }
        None => {
            let reference = registry.reference("bench/lite:1");
            image.push(&reference).await.expect("push");
            (reference, image.layers.iter().map(|l| warren_e2e::registry::gzip(l).len()).sum(), "bash + python from this machine".into())
        }
    };
    println!("image: {what}");

    // 1. Cold pull + unpack.
    let agent = Agent::start(&[]).await.expect("agent");
    let mut client = agent.client().await.expect("client");
    let t = Instant::now();
    let warm = client.warm_image(pb::WarmImageRequest { image: reference.clone(), image_pull: None, warm: vec![] }).await.expect("warm").into_inner();
    let cold = t.elapsed();
    println!(
        "cold pull + unpack + interpreter discovery: {:.0} ms for {:.1} MB compressed / {:.1} MB unpacked ({:.0} MB/s unpacked)",
        ms(cold),
        pushed_bytes as f64 / 1e6,
        warm.bytes as f64 / 1e6,
        warm.bytes as f64 / 1e6 / cold.as_secs_f64()
    );
    let found: Vec<String> = warm.languages.iter().map(|l| format!("{} {}", l.language().as_str_name().trim_start_matches("LANGUAGE_").to_lowercase(), l.version)).collect();
    println!("interpreters found: {}", found.join(", "));

    // 2. Warm starts, interleaved with host.
    let mut in_image = request(Language::Python, "print(1)", Duration::from_secs(30));
    in_image.image = reference.clone();
    in_image.image_digest = warm.digest.clone();
    let on_host = request(Language::Python, "print(1)", Duration::from_secs(30));
    for _ in 0..5 {
        round_trip(&mut client, in_image.clone()).await;
        round_trip(&mut client, on_host.clone()).await;
    }
    let (mut h, mut i) = (Vec::new(), Vec::new());
    for _ in 0..runs {
        h.push(round_trip(&mut client, on_host.clone()).await);
        tokio::time::sleep(Duration::from_millis(5)).await;
        i.push(round_trip(&mut client, in_image.clone()).await);
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    h.sort();
    i.sort();
    println!("warm python start, {runs} runs each: host p50 {:.2} ms p99 {:.2} ms | image p50 {:.2} ms p99 {:.2} ms | Δ p50 {:+.2} ms, Δ p99 {:+.2} ms",
        ms(percentile(&h, 0.5)), ms(percentile(&h, 0.99)), ms(percentile(&i, 0.5)), ms(percentile(&i, 0.99)),
        ms(percentile(&i, 0.5)) - ms(percentile(&h, 0.5)), ms(percentile(&i, 0.99)) - ms(percentile(&h, 0.99)));

    // 3. Two images sharing their base layers: the second adds only its own.
    let layers_dir = agent.state_dir().join("images/layers");
    let before = du(&layers_dir);
    let (a_ref, b_ref) = (registry.reference("bench/base:1"), registry.reference("bench/app:1"));
    image.push(&a_ref).await.expect("push");
    let app = TestImage { layers: vec![image.layers[0].clone(), image.layers[1].clone(), tar_of(&[("opt/app/main.py", b"print(1)\n")])], ..TestImage::default() };
    app.push(&b_ref).await.expect("push");
    let mut total = 0;
    for r in [a_ref, b_ref] {
        total += client.warm_image(pb::WarmImageRequest { image: r, image_pull: None, warm: vec![] }).await.expect("warm").into_inner().bytes;
    }
    let used = du(&layers_dir) - before;
    println!(
        "two images sharing a base: {:.1} MB of layers in all, {:.1} MB on disk ({:.0}% of the sum)",
        total as f64 / 1e6,
        used as f64 / 1e6,
        100.0 * used as f64 / total as f64
    );
}
