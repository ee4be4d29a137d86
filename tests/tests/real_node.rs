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
use std::time::Duration;

use serde_json::json;
use warren_e2e::chart_cluster::{
    api_server, gateways, helm, jsonpath, key_in_secret, mounts_below, pods_reach_the_api_server, ready, repo, rollout, warren_cgroups, warren_processes, NS,
};
use warren_e2e::forward::Forward;
use warren_e2e::gateway::wait_for;
use warren_e2e::kube::EnvTest;
use warren_e2e::{http, skip_unless_root};

/// The chart as last released (`helm package` of `charts/warren` at that
/// release; its default image tag is this build's appVersion).
const PREVIOUS_CHART: &str = "tests/fixtures/charts/warren-0.1.0.tgz";

/// The gateway pod (its port on the pod network).
fn gateway_addr(k: &EnvTest) -> SocketAddr {
    let mut all = Vec::new();
    assert!(wait_for(Duration::from_secs(60), || {
        all = gateways(k);
        all.len() == 1
    }), "one gateway pod: {all:?}");
    all[0]
}

fn execute(addr: SocketAddr, key: &str, body: serde_json::Value) -> http::Response {
    http::raw(addr, &http::execute_request(addr, key, &body, false)).expect("HTTP to the gateway pod")
}

/// The chart version in `charts/warren/Chart.yaml`.
fn chart_version() -> String {
    let text = std::fs::read_to_string(repo("charts/warren/Chart.yaml")).unwrap();
    text.lines().find_map(|l| l.strip_prefix("version:")).expect("a version").trim().to_string()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn warren_runs_on_a_real_node_from_helm_install_to_uninstall() {
    if skip_unless_root("warren_runs_on_a_real_node_from_helm_install_to_uninstall") {
        return;
    }
    let (warren, runtime) = warren_e2e::chart_cluster::images();
    let k = EnvTest::start().unwrap();
    k.start_node().unwrap();
    k.load_image(&warren).unwrap();
    // Pods reach this machine's servers on the bridge's address: the
    // registry, and the API server through a forwarder.
    let bridge = k.bridge_up().unwrap();
    let api = Forward::start(bridge, api_server(&k)).await.unwrap();
    let (_registry, registry_addr, image) = warren_e2e::chart_cluster::runtime_in_registry(bridge, &runtime);

    let state = tempfile::Builder::new().prefix("warren-node-state-").tempdir().unwrap();
    let state_dir = state.path().display().to_string();
    let base = [
        "--namespace", NS, "--create-namespace",
        "--set", "image.pullPolicy=Never",
        "--set", &format!("nodeAgent.stateDir={state_dir}"),
        "--set", "threads.store=node",
        "--set", "gateway.replicas=1",
        "--set", &format!("nodeAgent.images.insecureRegistries={{{registry_addr}}}"),
        // The registry is on the node itself (the bridge's address): an
        // admin's grant, as registries are tenant endpoints.
        "--set", &format!("nodeAgent.allowEndpoints={{{bridge}/32}}"),
        // The quickstart's namespace: the operator may read its Secrets.
        "--set", "tenantNamespaces={default}",
    ];
    let chart = repo("charts/warren").display().to_string();
    // Installed from the previous chart version, upgraded to this one below.
    let previous = repo(PREVIOUS_CHART).display().to_string();
    let mut install = vec!["install", "warren", previous.as_str()];
    install.extend(base);
    helm(&k, &install);
    pods_reach_the_api_server(&k, &api);
    rollout(&k, "daemonset/warren-node-agent");
    rollout(&k, "deployment/warren-gateway");
    rollout(&k, "deployment/warren-operator");

    // The quickstart, its Sandbox on the runtime image in this registry.
    let quickstart = warren_e2e::kube::quickstart_with_image(&image);
    k.kubectl_ok(&["apply", "-n", "default", "-f", quickstart.path().to_str().unwrap()]);
    assert!(wait_for(Duration::from_secs(300), || ready(&k, "sandbox", "default")), "Sandbox not Ready: {}", jsonpath(&k, &["get", "sandbox", "default"], "{.status}"));
    assert_eq!(jsonpath(&k, &["get", "sandbox", "default"], "{.status.warmNodes}"), r#"["node1"]"#);
    assert!(wait_for(Duration::from_secs(60), || ready(&k, "apikey", "agent")), "ApiKey not Ready: {}; operator: {}", jsonpath(&k, &["get", "apikey", "agent", "-n", "default"], "{.status}"), String::from_utf8_lossy(&k.kubectl(&["logs", "-n", NS, "deployment/warren-operator", "--tail", "30"]).stdout));
    let key = key_in_secret(&k, "agent-key");

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
    let tokens = || ["warren-agent-token", "warren-warm-token"].map(|s| jsonpath(&k, &["get", "secret", s, "-n", NS], "{.data.token}"));
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
