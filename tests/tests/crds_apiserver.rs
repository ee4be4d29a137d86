//! The generated CRDs on a real API server (kube-envtest, Kubernetes 1.20):
//! they install, the example manifests pass server-side validation, bad
//! values are refused with field-level messages, and `kubectl` shows the
//! printer columns and the field documentation.

use std::path::Path;

use warren_e2e::kube::EnvTest;
use warren_e2e::skip_unless_root;

fn repo(rel: &str) -> String {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..").join(rel).display().to_string()
}

#[test]
fn crds_install_and_validate_on_a_real_api_server() {
    if skip_unless_root("crds_install_and_validate_on_a_real_api_server") {
        return;
    }
    let k = EnvTest::start().unwrap();
    k.install_crds();
    // The single-machine examples are valid cluster manifests too.
    let applied = k.kubectl_ok(&["apply", "-f", &repo("examples/local")]);
    assert!(applied.contains("sandbox.warren.dev/default created") && applied.contains("apikey.warren.dev/demo created"), "{applied}");
    for dir in ["examples/quickstart", "examples/team-keys"] {
        k.kubectl_ok(&["apply", "--dry-run=server", "-f", &repo(dir)]);
    }
    let table = k.kubectl_ok(&["get", "sandboxes"]);
    for column in ["READY", "IMAGE", "NETWORK", "AGE"] {
        assert!(table.contains(column), "{table}");
    }
    assert!(k.kubectl_ok(&["get", "apikeys"]).contains("SANDBOX"));
    // The server publishes CRD schemas to its OpenAPI document a moment after
    // they are established: poll (bounded) until `explain` sees it.
    let explained = warren_e2e::gateway::wait_for(std::time::Duration::from_secs(60), || {
        let out = k.kubectl(&["explain", "sandbox.spec.resources.pids"]);
        String::from_utf8_lossy(&out.stdout).contains("Most processes and threads")
    });
    assert!(explained, "{:?}", k.kubectl(&["explain", "sandbox.spec.resources.pids"]));

    // Quantities may be numbers or strings.
    let dir = tempfile::tempdir().unwrap();
    let good = dir.path().join("good.yaml");
    std::fs::write(&good, "apiVersion: warren.dev/v1alpha1\nkind: Sandbox\nmetadata: {name: numbers}\nspec: {image: host, resources: {cpu: 2, memory: 512Mi, tmpSize: 1048576}}\n").unwrap();
    k.kubectl_ok(&["apply", "-f", good.to_str().unwrap()]);

    // Bad values are refused by the server's schema, naming the field.
    let cases = [
        ("pids", "spec: {image: host, resources: {pids: 1}}", "spec.resources.pids"),
        ("network", "spec: {image: host, network: Open}", "spec.network"),
        ("env", "spec: {image: host, env: [{name: lower, value: x}]}", "spec.env"),
        ("timeout", "spec: {image: host, maxTimeoutSeconds: 99999}", "spec.maxTimeoutSeconds"),
        ("image", "spec: {network: Blocked}", "required field \"image\""),
        ("cpu", "spec: {image: host, resources: {cpu: lots}}", "spec.resources.cpu"),
    ];
    for (name, spec, field) in cases {
        let path = dir.path().join(format!("{name}.yaml"));
        std::fs::write(&path, format!("apiVersion: warren.dev/v1alpha1\nkind: Sandbox\nmetadata: {{name: bad-{name}}}\n{spec}\n")).unwrap();
        let out = k.kubectl(&["apply", "-f", path.to_str().unwrap()]);
        let text = format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
        assert!(!out.status.success(), "{name} was accepted: {text}");
        assert!(text.contains(field), "{name}: the error does not name {field}: {text}");
    }
    let key = "apiVersion: warren.dev/v1alpha1\nkind: ApiKey\nmetadata: {name: bad}\nspec: {sandboxRef: {name: default}, maxConcurrency: 0}\n";
    let path = dir.path().join("key.yaml");
    std::fs::write(&path, key).unwrap();
    let out = k.kubectl(&["apply", "-f", path.to_str().unwrap()]);
    assert!(!out.status.success() && String::from_utf8_lossy(&out.stderr).contains("spec.maxConcurrency"));
}
