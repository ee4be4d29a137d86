//! OCI Sandboxes on a real API server (kube-envtest): the operator warms the
//! image on the node-agent (a real agent over mutual TLS, behind an agent
//! pod whose status is set by hand: no kubelet here), records digest,
//! interpreters, languages and warm nodes, refuses a language the image
//! lacks, re-resolves a tag that moved, and the gateway runs code in the
//! image through the published key. The registry is Debian's
//! docker-registry on loopback.

use std::path::Path;
use std::time::Duration;

use serde_json::json;
use warren_e2e::gateway::{wait_for, Gateway};
use warren_e2e::kube::{EnvTest, Operator};
use warren_e2e::registry::{bash_python_image, tar_of, Registry, TestImage};
use warren_e2e::{skip_unless_root, TcpAgent};

const NS: &str = "warren-system";
const KEYS: &str = "warren-system-keys";

fn get(k: &EnvTest, kind: &str, name: &str, path: &str) -> String {
    let out = k.kubectl(&["get", kind, name, "-o", &format!("jsonpath={path}")]);
    String::from_utf8_lossy(&out.stdout).trim().to_string()
}

fn ready(k: &EnvTest, kind: &str, name: &str) -> String {
    get(k, kind, name, r#"{.status.conditions[?(@.type=="Ready")].status}/{.status.conditions[?(@.type=="Ready")].reason}"#)
}

fn apply(k: &EnvTest, dir: &Path, name: &str, yaml: &str) {
    let path = dir.join(format!("{name}.yaml"));
    std::fs::write(&path, yaml).unwrap();
    k.kubectl_ok(&["apply", "-f", path.to_str().unwrap()]);
}

fn sandbox(name: &str, image: &str, extra: &str) -> String {
    format!("apiVersion: warren.dev/v1alpha1\nkind: Sandbox\nmetadata: {{name: {name}, namespace: default}}\nspec:\n  image: {image}\n{extra}")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_operator_warms_sandbox_images_and_keys_run_in_them() {
    if skip_unless_root("the_operator_warms_sandbox_images_and_keys_run_in_them") {
        return;
    }
    let registry = Registry::start().unwrap();
    let reference = registry.reference("warren/lite:1");
    let first = bash_python_image().push(&reference).await.unwrap();

    let k = EnvTest::start().unwrap();
    k.install_crds();
    k.kubectl_ok(&["create", "namespace", NS]);
    k.kubectl_ok(&["create", "namespace", KEYS]);
    let dir = tempfile::tempdir().unwrap();
    let agent = TcpAgent::start("node-a").unwrap();
    let (port, token, pki) = (agent.port, &agent.token, &agent.pki);
    // The agent's pod (no kubelet: its status is set by hand).
    k.kubectl_ok(&["create", "serviceaccount", "default", "-n", NS]);
    apply(
        &k,
        dir.path(),
        "pod",
        &format!("apiVersion: v1\nkind: Pod\nmetadata: {{name: agent-a, namespace: {NS}, labels: {{app.kubernetes.io/component: node-agent}}}}\nspec: {{nodeName: node-a, automountServiceAccountToken: false, containers: [{{name: a, image: warren}}]}}\n"),
    );
    k.kubectl_ok(&["patch", "pod", "agent-a", "-n", NS, "--subresource=status", "--type=merge", "-p", r#"{"status":{"phase":"Running","podIP":"127.0.0.1"}}"#]);

    let mut operator_args = vec!["--agent-port".to_string(), port.to_string(), "--agent-token-file".to_string(), token.display().to_string()];
    operator_args.extend(pki.gateway_args());
    let operator = Operator::start_with(&k, NS, KEYS, &operator_args).unwrap();

    apply(&k, dir.path(), "lite", &sandbox("lite", &reference, ""));
    apply(&k, dir.path(), "key", "apiVersion: warren.dev/v1alpha1\nkind: ApiKey\nmetadata: {name: lite-key, namespace: default}\nspec: {sandboxRef: {name: lite}}\n");
    let warmed = wait_for(Duration::from_secs(120), || ready(&k, "sandbox", "lite") == "True/Valid");
    assert!(warmed, "Sandbox never Ready: {} {:?}", get(&k, "sandbox", "lite", "{.status}"), operator.logs().iter().rev().take(5).collect::<Vec<_>>());
    assert_eq!(get(&k, "sandbox", "lite", "{.status.imageDigest}"), first);
    assert_eq!(get(&k, "sandbox", "lite", "{.status.languages}"), r#"["python","bash"]"#);
    assert!(get(&k, "sandbox", "lite", "{.status.interpreters[0].version}").starts_with("3.11."));
    assert_eq!(get(&k, "sandbox", "lite", "{.status.warmNodes}"), r#"["node-a"]"#);
    assert!(wait_for(Duration::from_secs(30), || ready(&k, "apikey", "lite-key") == "True/Published"), "{}", ready(&k, "apikey", "lite-key"));

    // The gateway runs code in the image through the published key.
    let key = {
        use base64::Engine as _;
        let b64 = get(&k, "secret", "lite-key-key", "{.data.key}");
        String::from_utf8(base64::engine::general_purpose::STANDARD.decode(b64).unwrap()).unwrap()
    };
    let kubeconfig = k.kubeconfig_for_rustls().display().to_string();
    let port_s = port.to_string();
    let mut args = vec!["--cluster", "--namespace", NS, "--keys-namespace", KEYS, "--agent-selector", "app.kubernetes.io/component=node-agent", "--agent-port", &port_s, "--agent-token-file", token.to_str().unwrap()];
    let gateway_tls = pki.gateway_args();
    args.extend(gateway_tls.iter().map(String::as_str));
    let gw = Gateway::start_with_env(&[], &args, &[("KUBECONFIG", kubeconfig.as_str())], false).await.unwrap();
    let code = "import os; print(os.path.exists('/usr/bin/node'), os.environ['IMAGE_FLAVOUR'])";
    let mut ran = None;
    assert!(wait_for(Duration::from_secs(30), || {
        let r = gw.execute(&key, &json!({"code": code}));
        let ok = r.status == 200;
        ran = Some(r);
        ok
    }));
    let body = ran.unwrap().json();
    assert_eq!(body["stdout"], "False lite\n", "{body}");
    let node = gw.execute(&key, &json!({"code": "console.log(1)", "language": "node"}));
    assert_eq!(node.status, 400, "a language the image lacks");
    assert_eq!(node.json()["field"], "language");

    // A language the image lacks, and an image that does not exist.
    apply(&k, dir.path(), "wants-node", &sandbox("wants-node", &reference, "  languages: [python, node]\n"));
    apply(&k, dir.path(), "missing", &sandbox("missing", &registry.reference("warren/nothing:1"), ""));
    assert!(wait_for(Duration::from_secs(60), || ready(&k, "sandbox", "wants-node") == "False/LanguageUnavailable"), "{}", ready(&k, "sandbox", "wants-node"));
    assert!(wait_for(Duration::from_secs(60), || ready(&k, "sandbox", "missing") == "False/ImagePullFailed"), "{}", ready(&k, "sandbox", "missing"));

    // Warm imports are tried in the image: what does not load is on the status.
    apply(&k, dir.path(), "warm", &sandbox("warm", &reference, "  warm: {python: {imports: [json, no_such_module_xyz]}}\n"));
    let failures = || get(&k, "sandbox", "warm", "{.status.warmFailures}");
    assert!(wait_for(Duration::from_secs(60), || failures().contains("no_such_module_xyz")), "{}", get(&k, "sandbox", "warm", "{.status}"));
    let listed: serde_json::Value = serde_json::from_str(&failures()).unwrap();
    assert_eq!(listed.as_array().map(Vec::len), Some(1), "only the missing module: {listed}");
    assert_eq!((listed[0]["language"].as_str(), listed[0]["module"].as_str()), (Some("python"), Some("no_such_module_xyz")));
    assert!(listed[0]["message"].as_str().unwrap().starts_with("ModuleNotFoundError"), "{listed}");
    assert_eq!(ready(&k, "sandbox", "warm"), "True/Valid", "a module that does not load never makes a Sandbox unusable");

    // The tag moves: the next reconcile resolves and warms the new digest.
    let mut moved = bash_python_image();
    moved.layers.push(tar_of(&[("opt/release", b"2\n")]));
    let second = TestImage { ..moved }.push(&reference).await.unwrap();
    assert_ne!(first, second);
    k.kubectl_ok(&["annotate", "sandbox", "lite", "-n", "default", "test/poke=1"]);
    assert!(
        wait_for(Duration::from_secs(60), || get(&k, "sandbox", "lite", "{.status.imageDigest}") == second),
        "digest stayed {}",
        get(&k, "sandbox", "lite", "{.status.imageDigest}")
    );
}
