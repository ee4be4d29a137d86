//! The workspace's layers, read from Cargo's own dependency graph
//! (`cargo tree`, offline, from the lockfile): what each role links.

use std::collections::BTreeSet;
use std::path::Path;
use std::process::Command;

/// Every package in `package`'s normal (non-dev, non-build) dependency
/// closure, by name.
fn closure(package: &str) -> BTreeSet<String> {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    let out = Command::new(std::env::var("CARGO").unwrap_or_else(|_| "cargo".into()))
        .current_dir(&root)
        .args(["tree", "--offline", "--locked", "-e", "normal", "--prefix", "none", "--format", "{p}", "-p", package])
        .output()
        .expect("running cargo tree");
    assert!(out.status.success(), "cargo tree -p {package}: {}", String::from_utf8_lossy(&out.stderr));
    String::from_utf8_lossy(&out.stdout).lines().filter_map(|l| l.split_whitespace().next()).map(String::from).collect()
}

/// The operator reconciles objects and probes buckets; it never mounts a
/// filesystem or touches a sandbox, so none of that code is in its binary.
#[test]
fn the_operator_links_no_fuse_server_and_no_isolation_code() {
    let deps = closure("warren-operator");
    assert!(deps.contains("warren-objects"), "the operator's probe comes from warren-objects: {deps:?}");
    for absent in ["fuser", "warren-storage", "warren-isolation", "warren-network", "warren-image", "libseccomp"] {
        assert!(!deps.contains(absent), "warren-operator depends on {absent}");
    }
}

/// The crates that touch the kernel know nothing of Kubernetes.
#[test]
fn kernel_crates_are_free_of_kubernetes() {
    for krate in ["warren-isolation", "warren-storage", "warren-objects", "warren-network", "warren-image"] {
        let deps = closure(krate);
        for absent in ["kube", "kube-client", "kube-runtime", "k8s-openapi"] {
            assert!(!deps.contains(absent), "{krate} depends on {absent}");
        }
    }
}
