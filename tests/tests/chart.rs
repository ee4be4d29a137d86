//! The Helm chart: `helm lint` is clean and what `helm template` renders is
//! accepted by a real API server (`kubectl apply --dry-run=server`, Kubernetes
//! 1.20 from kube-envtest), with the default values and with every toggle on.

use std::path::Path;
use std::process::Command;

use warren_e2e::kube::EnvTest;
use warren_e2e::skip_unless_root;

fn chart() -> String {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../charts/warren").display().to_string()
}

fn helm(args: &[&str]) -> String {
    let helm = warren_e2e::helm::helm().expect("helm available");
    let out = Command::new(helm).args(args).output().expect("helm runs");
    assert!(out.status.success(), "helm {args:?}:\n{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    String::from_utf8_lossy(&out.stdout).into_owned()
}

#[test]
fn chart_lints_and_renders_objects_the_api_server_accepts() {
    if skip_unless_root("chart_lints_and_renders_objects_the_api_server_accepts") {
        return;
    }
    let lint = helm(&["lint", "--strict", &chart()]);
    assert!(lint.contains("0 chart(s) failed"), "{lint}");

    let k = EnvTest::start().unwrap();
    // The keys namespace is part of the chart; server dry-run cannot create
    // a namespace and objects in it in one apply, so it exists beforehand.
    for ns in ["warren-system", "warren-system-keys"] {
        k.kubectl_ok(&["create", "namespace", ns]);
    }
    let dir = tempfile::tempdir().unwrap();
    let chart = chart();
    for (name, extra) in [("default", vec![]), ("toggles", vec!["--set", "networkPolicy.enabled=false,serviceMonitor.enabled=true,nodeAgent.token=abcdefghijklmnopqrstuvwx,threads.store=s3,threads.s3.bucket=warren-threads,threads.s3.endpoint=http://minio.storage:9000,threads.s3.allowHttp=true,threads.s3.credentialsSecret=s3-creds"])] {
        let mut args = vec!["template", "warren", &chart[..], "--namespace", "warren-system", "--include-crds"];
        args.extend(extra);
        let rendered = helm(&args);
        for kind in ["CustomResourceDefinition", "Deployment", "DaemonSet", "Service", "ClusterRole", "Role", "ServiceAccount", "Secret", "Namespace"] {
            assert!(rendered.contains(&format!("kind: {kind}\n")), "{name}: no {kind}");
        }
        assert!(!rendered.contains("kind: ServiceMonitor"), "{name}: ServiceMonitor rendered without its CRD");
        assert_eq!(rendered.contains("kind: NetworkPolicy"), name == "default", "{name}: NetworkPolicy is on by default, off when disabled");
        if name == "toggles" {
            assert!(rendered.contains("--thread-store=s3://warren-threads") && rendered.contains("http://minio.storage:9000"), "{rendered}");
            assert!(rendered.contains("secretRef: {name: s3-creds}"), "credentials come from the named Secret");
        } else {
            assert!(rendered.contains("--thread-store=dir:/var/lib/warren/thread-store"), "the default keeps threads on the node");
        }
        assert!(rendered.contains("--keys-namespace=warren-system-keys") && rendered.contains("--publish-namespace=warren-system-keys"), "{name}");
        assert_gateway_reads_secrets_only_in_the_keys_namespace(&rendered);
        let file = dir.path().join(format!("{name}.yaml"));
        std::fs::write(&file, &rendered).unwrap();
        // CRDs first (dry-run cannot create them for the custom objects).
        let applied = k.kubectl_ok(&["apply", "--dry-run=server", "-f", file.to_str().unwrap()]);
        assert!(applied.contains("daemonset.apps/warren-node-agent created (server dry run)"), "{applied}");
        assert!(applied.contains("deployment.apps/warren-gateway created (server dry run)"), "{applied}");
    }
    // An s3 store without a bucket is refused at render time, with the reason.
    let missing = Command::new(warren_e2e::helm::helm().unwrap()).args(["template", "warren", &chart[..], "--set", "threads.store=s3"]).output().unwrap();
    assert!(!missing.status.success() && String::from_utf8_lossy(&missing.stderr).contains("threads.s3.bucket is required"));
}

/// The gateway's Roles: Secrets only in the keys namespace.
fn assert_gateway_reads_secrets_only_in_the_keys_namespace(rendered: &str) {
    let mut seen = 0;
    for doc in rendered.split("\n---") {
        let Ok(v) = serde_yaml::from_str::<serde_yaml::Value>(doc) else { continue };
        if v["kind"] != "Role" || !v["metadata"]["name"].as_str().unwrap_or("").contains("-gateway") {
            continue;
        }
        seen += 1;
        let ns = v["metadata"]["namespace"].as_str().unwrap();
        let grants_secrets = v["rules"].as_sequence().unwrap().iter().any(|r| r["resources"].as_sequence().unwrap().iter().any(|x| x == "secrets"));
        assert_eq!(grants_secrets, ns == "warren-system-keys", "gateway Role in {ns}: {doc}");
    }
    assert_eq!(seen, 2, "the gateway has a Role for pods and one for the published keys");
}
