//! The whole product on a real kubelet (kube-envtest `start-node`): the
//! images `scripts/build-images.sh` builds (`warren` loaded into the node's
//! containerd, `warren-runtime` pushed to Debian's docker-registry on the
//! node bridge's gateway address, where pods reach it), `helm install`,
//! `examples/quickstart/` (its image pointed at that registry), and calls to
//! the gateway pod: python, node and bash inside the runtime image on the
//! DaemonSet's agent; a thread that survives the agent pod being deleted and
//! recreated; `helm upgrade` from the previous chart version
//! (`tests/fixtures/charts/`) to this one, keeping the key, the thread and
//! the generated tokens; and `helm uninstall` leaving no cgroups, mounts or
//! processes on the node.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use serde_json::json;
use warren_e2e::gateway::wait_for;
use warren_e2e::kube::EnvTest;
use warren_e2e::registry::{push_oci_archive, Registry};
use warren_e2e::{http, skip_unless_root};

const NS: &str = "warren-system";
/// The CNI bridge's gateway: this machine, as pods see it.
const BRIDGE_IP: &str = "10.244.0.1";
/// The chart as last released (`helm package` of `charts/warren` at that
/// release; its default image tag is this build's appVersion).
const PREVIOUS_CHART: &str = "tests/fixtures/charts/warren-0.1.0.tgz";

fn repo(rel: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..").join(rel)
}

fn helm(k: &EnvTest, args: &[&str]) -> String {
    let out = Command::new(warren_e2e::helm::helm().unwrap()).arg("--kubeconfig").arg(k.kubeconfig()).args(args).output().unwrap();
    assert!(out.status.success(), "helm {args:?}:\n{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    String::from_utf8_lossy(&out.stdout).into_owned()
}

fn jsonpath(k: &EnvTest, args: &[&str], path: &str) -> String {
    let mut all: Vec<&str> = args.to_vec();
    let p = format!("jsonpath={path}");
    all.extend(["-o", &p]);
    String::from_utf8_lossy(&k.kubectl(&all).stdout).trim().to_string()
}

fn rollout(k: &EnvTest, what: &str) {
    let out = k.kubectl(&["rollout", "status", what, "-n", NS, "--timeout=180s"]);
    assert!(out.status.success(), "{what} did not roll out: {}\n{}", String::from_utf8_lossy(&out.stderr), pod_logs());
}

/// The last lines every Warren container logged (the API server cannot
/// fetch logs here: the node's name does not resolve), for failure messages.
fn pod_logs() -> String {
    let out = Command::new("sh").args(["-c", &format!("for f in /var/log/pods/{NS}_*/*/*.log; do echo \"== $f\"; tail -n 8 \"$f\" | cut -c1-400; done")]).output().unwrap();
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// kube-envtest's API server listens on loopback, presents a self-signed
/// CA as its serving certificate (rustls refuses that) and has no
/// kube-proxy, so pods cannot use the `kubernetes` Service: the operator and
/// the gateway run on the host network here, with a kubeconfig naming the
/// real address, skipping verification of that one loopback certificate,
/// and authenticating with the pod's own service-account token (the chart's
/// RBAC is what they get). The agents do not talk to the API server and
/// stay on the pod network. (Host ports allow one pod at a time: they are
/// replaced, not rolled.)
fn reach_the_api_server_from_the_host_network(k: &EnvTest) {
    let server = jsonpath(k, &["config", "view", "--minify"], "{.clusters[0].cluster.server}");
    let kubeconfig = format!(
        "apiVersion: v1\nkind: Config\nclusters: [{{name: envtest, cluster: {{server: \"{server}\", insecure-skip-tls-verify: true}}}}]\n\
         users: [{{name: sa, user: {{tokenFile: /var/run/secrets/kubernetes.io/serviceaccount/token}}}}]\n\
         contexts: [{{name: envtest, context: {{cluster: envtest, user: sa, namespace: {NS}}}}}]\ncurrent-context: envtest\n"
    );
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("kubeconfig"), kubeconfig).unwrap();
    k.kubectl_ok(&["create", "configmap", "envtest-kubeconfig", "-n", NS, &format!("--from-file={}", dir.path().join("kubeconfig").display())]);
    let patch = |container: &str| {
        format!(
            r#"{{"spec":{{"strategy":{{"type":"Recreate","rollingUpdate":null}},"template":{{"spec":{{"hostNetwork":true,"dnsPolicy":"ClusterFirstWithHostNet",
            "volumes":[{{"name":"envtest-kubeconfig","configMap":{{"name":"envtest-kubeconfig"}}}}],
            "containers":[{{"name":"{container}","env":[{{"name":"KUBECONFIG","value":"/etc/envtest/kubeconfig"}}],
            "volumeMounts":[{{"name":"envtest-kubeconfig","mountPath":"/etc/envtest","readOnly":true}}]}}]}}}}}}}}"#
        )
    };
    k.kubectl_ok(&["patch", "deployment", "warren-operator", "-n", NS, "-p", &patch("operator")]);
    k.kubectl_ok(&["patch", "deployment", "warren-gateway", "-n", NS, "-p", &patch("gateway")]);
}

/// The gateway, on this machine's network (see above).
fn gateway_addr(_k: &EnvTest) -> SocketAddr {
    "127.0.0.1:8080".parse().unwrap()
}

fn execute(addr: SocketAddr, key: &str, body: serde_json::Value) -> http::Response {
    http::raw(addr, &http::execute_request(addr, key, &body, false)).expect("HTTP to the gateway pod")
}

/// Lines of this machine's mount table below `dir`.
fn mounts_below(dir: &Path) -> Vec<String> {
    let dir = dir.to_string_lossy().into_owned();
    std::fs::read_to_string("/proc/self/mountinfo").unwrap().lines().filter(|l| l.split(' ').nth(4).is_some_and(|m| m.starts_with(&dir))).map(String::from).collect()
}

/// Warren's cgroups on the node, leaving out those of the test harness's
/// own agents (`warren-e2e-*`): other tests run beside this one, each
/// cleaning up its own.
fn warren_cgroups() -> Vec<String> {
    let out = Command::new("find").args(["/sys/fs/cgroup", "-type", "d", "-name", "warren*"]).output().unwrap();
    String::from_utf8_lossy(&out.stdout).lines().filter(|p| !p.contains("/warren-e2e-")).map(String::from).collect()
}

/// Warren's processes from the chart's image, leaving out the workspace's
/// own binaries (`target/…`) that tests running beside this one start.
fn warren_processes() -> Vec<String> {
    let out = Command::new("pgrep").args(["-a", "-f", "warren-(node-agent|sandbox|gateway|operator)"]).output().unwrap();
    String::from_utf8_lossy(&out.stdout).lines().filter(|l| !l.contains("/target/")).map(String::from).collect()
}

/// The chart version in `charts/warren/Chart.yaml`.
fn chart_version() -> String {
    let text = std::fs::read_to_string(repo("charts/warren/Chart.yaml")).unwrap();
    text.lines().find_map(|l| l.strip_prefix("version:")).expect("a version").trim().to_string()
}

/// The tokens the chart generates on install (gateway→agent, operator→agent
/// warming), which an upgrade must keep: a new one would cut running gateways
/// off their agents mid-rollout.
fn generated_tokens(k: &EnvTest) -> Vec<String> {
    ["warren-agent-token", "warren-warm-token"].iter().map(|s| jsonpath(k, &["get", "secret", s, "-n", NS], "{.data.token}")).collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn warren_runs_on_a_real_node_from_helm_install_to_uninstall() {
    if skip_unless_root("warren_runs_on_a_real_node_from_helm_install_to_uninstall") {
        return;
    }
    let (warren, runtime) = (repo("target/images/warren.oci.tar"), repo("target/images/warren-runtime.oci.tar"));
    assert!(warren.exists() && runtime.exists(), "build the images first: scripts/build-images.sh (scripts/test.sh does)");
    let k = EnvTest::start().unwrap();
    k.start_node().unwrap();
    k.load_image(&warren).unwrap();
    // The bridge gets its address with the first pod: the registry starts
    // after the install, on a port chosen now (the agents are told it).
    let port = std::net::TcpListener::bind("0.0.0.0:0").unwrap().local_addr().unwrap().port();
    let registry_addr: SocketAddr = format!("{BRIDGE_IP}:{port}").parse().unwrap();
    let image = format!("{registry_addr}/warren/warren-runtime:0.1.0");

    let state = tempfile::Builder::new().prefix("warren-node-state-").tempdir().unwrap();
    let state_dir = state.path().display().to_string();
    let base = [
        "--namespace", NS, "--create-namespace",
        "--set", "image.pullPolicy=Never",
        "--set", &format!("nodeAgent.stateDir={state_dir}"),
        "--set", "threads.store=node",
        // One gateway: it serves on the host network here (below), one port.
        "--set", "gateway.replicas=1",
        "--set", &format!("nodeAgent.images.insecureRegistries={{{registry_addr}}}"),
        // The registry is on the node itself (the bridge's address): an
        // admin's grant, as registries are tenant endpoints.
        "--set", &format!("nodeAgent.allowEndpoints={{{BRIDGE_IP}/32}}"),
        // The quickstart's namespace: the operator may read its Secrets.
        "--set", "tenantNamespaces={default}",
    ];
    let chart = repo("charts/warren").display().to_string();
    // Installed from the previous chart version, upgraded to this one below.
    let previous = repo(PREVIOUS_CHART).display().to_string();
    let mut install = vec!["install", "warren", previous.as_str()];
    install.extend(base);
    helm(&k, &install);
    reach_the_api_server_from_the_host_network(&k);
    rollout(&k, "daemonset/warren-node-agent");
    rollout(&k, "deployment/warren-gateway");
    rollout(&k, "deployment/warren-operator");
    let _registry = Registry::start_at(registry_addr).unwrap();
    push_oci_archive(&runtime, &image).unwrap();

    // The quickstart, its Sandbox on the runtime image in this registry.
    let quickstart = warren_e2e::kube::quickstart_with_image(&image);
    k.kubectl_ok(&["apply", "-n", "default", "-f", quickstart.path().to_str().unwrap()]);
    let ready = |kind: &str, name: &str| jsonpath(&k, &["get", kind, name, "-n", "default"], r#"{.status.conditions[?(@.type=="Ready")].status}"#) == "True";
    assert!(wait_for(Duration::from_secs(300), || ready("sandbox", "default")), "Sandbox not Ready: {}", jsonpath(&k, &["get", "sandbox", "default"], "{.status}"));
    assert_eq!(jsonpath(&k, &["get", "sandbox", "default"], "{.status.warmNodes}"), r#"["node1"]"#);
    assert!(wait_for(Duration::from_secs(60), || ready("apikey", "agent")), "ApiKey not Ready: {}; operator: {}", jsonpath(&k, &["get", "apikey", "agent", "-n", "default"], "{.status}"), String::from_utf8_lossy(&k.kubectl(&["logs", "-n", NS, "deployment/warren-operator", "--tail", "30"]).stdout));
    let key = {
        use base64::Engine as _;
        let b64 = jsonpath(&k, &["get", "secret", "agent-key", "-n", "default"], "{.data.key}");
        String::from_utf8(base64::engine::general_purpose::STANDARD.decode(b64).unwrap()).unwrap()
    };

    let gw = gateway_addr(&k);
    let first = |addr| {
        let mut last = None;
        let ok = wait_for(Duration::from_secs(60), || {
            let r = execute(addr, &key, json!({"code": "print(6 * 7)"}));
            let ok = r.status == 200;
            last = Some(r.text());
            ok
        });
        assert!(ok, "the gateway never ran code: {last:?}");
    };
    first(gw);
    for (language, code, want) in [
        ("python", "import sys, os; print(sys.version_info[0], os.path.exists('/usr/bin/npm'))", "3 True\n"),
        ("node", "console.log(process.versions.node.split('.')[0] >= 18, require('os').userInfo().uid)", "true 1000\n"),
        ("bash", "jq --version >/dev/null && git --version >/dev/null && sqlite3 --version >/dev/null && echo tools", "tools\n"),
    ] {
        let r = execute(gw, &key, json!({"code": code, "language": language}));
        assert_eq!(r.status, 200, "{language}: {}", r.text());
        assert_eq!(r.json()["stdout"], want, "{language}: {}", r.text());
    }

    // A thread survives its agent pod being deleted and recreated.
    let r = execute(gw, &key, json!({"code": "echo kept > ~/note", "language": "bash", "thread_id": "t1"}));
    assert_eq!(r.status, 200, "{}", r.text());
    let old = jsonpath(&k, &["get", "pods", "-n", NS, "-l", "app.kubernetes.io/component=node-agent"], "{.items[0].metadata.name}");
    k.kubectl_ok(&["delete", "pod", &old, "-n", NS, "--wait=true", "--timeout=120s"]);
    rollout(&k, "daemonset/warren-node-agent");
    let mut last = None;
    let kept = wait_for(Duration::from_secs(120), || {
        let r = execute(gw, &key, json!({"code": "cat ~/note", "language": "bash", "thread_id": "t1"}));
        let ok = r.status == 200 && r.json()["stdout"] == "kept\n";
        last = Some(r.text());
        ok
    });
    assert!(kept, "thread lost with the agent pod: {last:?}");

    // Upgrade to this chart, as its README says (CRDs first), with a changed
    // setting that rolls the agents: the same key still runs code, the
    // thread keeps its home, the generated tokens are kept.
    let tokens = || generated_tokens(&k);
    let before = tokens();
    assert_eq!(jsonpath(&k, &["get", "deployment", "warren-gateway", "-n", NS], "{.metadata.labels.helm\\.sh/chart}"), "warren-0.1.0");
    k.kubectl_ok(&["apply", "-f", repo("charts/warren/crds").to_str().unwrap()]);
    let mut upgrade = vec!["upgrade", "warren", chart.as_str()];
    upgrade.extend(base);
    upgrade.extend(["--set", "nodeAgent.poolSize=1"]);
    helm(&k, &upgrade);
    rollout(&k, "daemonset/warren-node-agent");
    rollout(&k, "deployment/warren-gateway");
    rollout(&k, "deployment/warren-operator");
    assert_eq!(jsonpath(&k, &["get", "deployment", "warren-gateway", "-n", NS], "{.metadata.labels.helm\\.sh/chart}"), format!("warren-{}", chart_version()));
    assert_ne!(chart_version(), "0.1.0", "the chart under test must be newer than {PREVIOUS_CHART}");
    assert_eq!(tokens(), before, "the upgrade changed a generated token");
    let gw = gateway_addr(&k);
    first(gw);
    let r = execute(gw, &key, json!({"code": "cat ~/note", "language": "bash", "thread_id": "t1"}));
    assert_eq!((r.status, r.json()["stdout"].clone()), (200, json!("kept\n")), "thread lost in the upgrade: {}", r.text());

    // Uninstall: nothing of Warren stays on the node.
    helm(&k, &["uninstall", "warren", "--namespace", NS, "--wait", "--timeout", "180s"]);
    let gone = wait_for(Duration::from_secs(120), || {
        jsonpath(&k, &["get", "pods", "-n", NS], "{.items[*].metadata.name}").is_empty() && warren_processes().is_empty()
    });
    assert!(gone, "pods or processes remain: {:?}", warren_processes());
    assert!(wait_for(Duration::from_secs(60), || warren_cgroups().is_empty()), "cgroups remain: {:?}", warren_cgroups());
    assert_eq!(mounts_below(state.path()), Vec::<String>::new(), "mounts remain under the state dir");
}
