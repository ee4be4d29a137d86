//! The environment conformance suite (#45): everyday operations that
//! agent-written code performs — temporary files in `/tmp` and `/var/tmp`,
//! who it runs as, the machine's size, pools sized by `os.cpu_count()`,
//! subprocesses and signals, packages from local wheels and tarballs, git,
//! sqlite, large output, loopback servers — each checked to behave as on an
//! ordinary Linux machine of the sandbox's own size, and what a sandbox
//! does not offer (raw sockets, mounts, sudo) failing with the ordinary
//! Linux error. Run in the `host` image and in the `warren-runtime` image
//! (`tests/support/environment_check.sh`, one line per check).

use std::path::{Path, PathBuf};
use std::time::Duration;

use warren_e2e::registry::{push_oci_archive, Registry};
use warren_e2e::{request, skip_unless_root, Agent};
use warren_proto::agent::{Language, Limits};

const CHECK: &str = include_str!("../support/environment_check.sh");
/// Checks the suite must count (each a line of its own).
const AT_LEAST: usize = 40;
const MIB: u64 = 1 << 20;

fn repo(rel: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..").join(rel)
}

/// The node's CPUs this process may use.
fn node_cpus() -> u32 {
    std::thread::available_parallelism().map_or(1, |n| n.get() as u32)
}

/// Runs the suite in `image` ("" = host) under `cpu_millis` and
/// `memory_bytes`; returns the failed checks' lines.
async fn failures(agent: &Agent, image: &str, cpu_millis: u32, memory_bytes: u64) -> Vec<String> {
    let mut req = request(Language::Bash, CHECK, Duration::from_secs(180));
    req.image = image.to_string();
    req.limits = Some(Limits { cpu_millis, memory_bytes, max_output_bytes: 4 * MIB, ..Default::default() });
    let cpus = cpu_millis.div_ceil(1000).clamp(1, node_cpus());
    req.env.insert("CPUS".into(), cpus.to_string());
    req.env.insert("MEM_KB".into(), (memory_bytes / 1024).to_string());
    let run = agent.run_request(req).await.unwrap();
    let lines: Vec<&str> = run.stdout.lines().collect();
    assert_eq!(lines.last(), Some(&"done"), "the suite did not finish ({image:?}):\n{}\n{}", run.stdout, run.stderr);
    let checks = lines.iter().filter(|l| l.starts_with("ok ") || l.starts_with("FAIL ")).count();
    assert!(checks >= AT_LEAST, "only {checks} checks ran:\n{}", run.stdout);
    lines.iter().filter(|l| !l.starts_with("ok ") && **l != "done").map(|l| l.to_string()).collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_host_sandbox_behaves_like_a_linux_machine_of_its_own_size() {
    if skip_unless_root("a_host_sandbox_behaves_like_a_linux_machine_of_its_own_size") {
        return;
    }
    let agent = Agent::start(&[]).await.unwrap();
    for (cpu_millis, memory) in [(1000, 1024 * MIB), (500, 768 * MIB), (2000, 2048 * MIB)] {
        let failed = failures(&agent, "", cpu_millis, memory).await;
        assert!(failed.is_empty(), "host image, {cpu_millis}m CPU, {} MiB:\n{}", memory / MIB, failed.join("\n"));
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_runtime_image_behaves_like_a_linux_machine_of_its_own_size() {
    if skip_unless_root("the_runtime_image_behaves_like_a_linux_machine_of_its_own_size") {
        return;
    }
    let runtime = repo("target/images/warren-runtime.oci.tar");
    assert!(runtime.exists(), "build the images first: scripts/build-images.sh (scripts/test.sh does)");
    let registry = Registry::start().unwrap();
    let image = registry.reference("warren/warren-runtime:check");
    push_oci_archive(&runtime, &image).unwrap();
    let agent = Agent::start(&[]).await.unwrap();
    let failed = failures(&agent, &image, 1000, 1024 * MIB).await;
    assert!(failed.is_empty(), "warren-runtime, 1 CPU, 1 GiB:\n{}", failed.join("\n"));
}
