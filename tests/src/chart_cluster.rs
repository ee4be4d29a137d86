//! The chart on kube-envtest's real nodes: what the single-node and the
//! multi-node tests share (helm, kubectl queries, the way pods reach the
//! API server, and what Warren may leave on a machine).

use std::net::{IpAddr, SocketAddr};
use std::path::{Path, PathBuf};
use std::process::Command;

use crate::forward::Forward;
use crate::kube::EnvTest;

/// The images `scripts/build-images.sh` builds: `warren` and `warren-runtime`.
pub fn images() -> (PathBuf, PathBuf) {
    let (warren, runtime) = (repo("target/images/warren.oci.tar"), repo("target/images/warren-runtime.oci.tar"));
    assert!(warren.exists() && runtime.exists(), "build the images first: scripts/build-images.sh (scripts/test.sh does)");
    (warren, runtime)
}

/// A registry on the bridge's address `bridge` (where pods reach it) holding
/// the runtime image `runtime`: the registry (stopped on drop), its address
/// and the image's reference.
pub fn runtime_in_registry(bridge: IpAddr, runtime: &Path) -> (crate::registry::Registry, SocketAddr, String) {
    let port = std::net::TcpListener::bind((bridge, 0)).unwrap().local_addr().unwrap().port();
    let addr = SocketAddr::new(bridge, port);
    let registry = crate::registry::Registry::start_at(addr).unwrap();
    let image = format!("{addr}/warren/warren-runtime:0.1.0");
    crate::registry::push_oci_archive(runtime, &image).unwrap();
    (registry, addr, image)
}

/// The release's namespace.
pub const NS: &str = "warren-system";

/// A path of the repository.
pub fn repo(rel: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..").join(rel)
}

/// Runs helm against `k`, failing with its output unless it succeeds.
pub fn helm(k: &EnvTest, args: &[&str]) -> String {
    let out = Command::new(crate::helm::helm().unwrap()).arg("--kubeconfig").arg(k.kubeconfig()).args(args).output().unwrap();
    assert!(out.status.success(), "helm {args:?}:\n{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// `kubectl ARGS -o jsonpath=PATH`, trimmed.
pub fn jsonpath(k: &EnvTest, args: &[&str], path: &str) -> String {
    let mut all: Vec<&str> = args.to_vec();
    let p = format!("jsonpath={path}");
    all.extend(["-o", &p]);
    String::from_utf8_lossy(&k.kubectl(&all).stdout).trim().to_string()
}

/// Waits until `what` (e.g. `daemonset/warren-node-agent`) has rolled out.
pub fn rollout(k: &EnvTest, what: &str) {
    let out = k.kubectl(&["rollout", "status", what, "-n", NS, "--timeout=240s"]);
    assert!(out.status.success(), "{what} did not roll out: {}\n{}", String::from_utf8_lossy(&out.stderr), pod_logs());
}

/// The last lines every Warren container logged (the API server cannot
/// fetch logs here: the nodes' names do not resolve), for failure messages.
pub fn pod_logs() -> String {
    let out = Command::new("sh").args(["-c", &format!("for f in /var/log/pods/{NS}_*/*/*.log; do echo \"== $f\"; tail -n 8 \"$f\" | cut -c1-400; done")]).output().unwrap();
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// kube-envtest's API server listens on loopback and presents a
/// self-signed CA as its serving certificate (rustls refuses that), and
/// there is no kube-proxy, so pods cannot use the `kubernetes` Service: the
/// operator and the gateways get a kubeconfig naming `api` (a forwarder on
/// the bridge to the API server), skipping verification of that one
/// certificate, and authenticating with the pod's own service-account token
/// (the chart's RBAC is what they get). They stay on the pod network: no
/// host port is taken, so Warren's own `scripts/run` may run beside.
pub fn pods_reach_the_api_server(k: &EnvTest, api: &Forward) {
    let kubeconfig = format!(
        "apiVersion: v1\nkind: Config\nclusters: [{{name: envtest, cluster: {{server: \"https://{}\", insecure-skip-tls-verify: true}}}}]\n\
         users: [{{name: sa, user: {{tokenFile: /var/run/secrets/kubernetes.io/serviceaccount/token}}}}]\n\
         contexts: [{{name: envtest, context: {{cluster: envtest, user: sa, namespace: {NS}}}}}]\ncurrent-context: envtest\n",
        api.addr
    );
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("kubeconfig"), kubeconfig).unwrap();
    k.kubectl_ok(&["create", "configmap", "envtest-kubeconfig", "-n", NS, &format!("--from-file={}", dir.path().join("kubeconfig").display())]);
    let patch = |container: &str| {
        format!(
            r#"{{"spec":{{"template":{{"spec":{{"volumes":[{{"name":"envtest-kubeconfig","configMap":{{"name":"envtest-kubeconfig"}}}}],
            "containers":[{{"name":"{container}","env":[{{"name":"KUBECONFIG","value":"/etc/envtest/kubeconfig"}}],
            "volumeMounts":[{{"name":"envtest-kubeconfig","mountPath":"/etc/envtest","readOnly":true}}]}}]}}}}}}}}"#
        )
    };
    k.kubectl_ok(&["patch", "deployment", "warren-operator", "-n", NS, "-p", &patch("operator")]);
    k.kubectl_ok(&["patch", "deployment", "warren-gateway", "-n", NS, "-p", &patch("gateway")]);
}

/// The API server's loopback address (from the admin kubeconfig).
pub fn api_server(k: &EnvTest) -> SocketAddr {
    let server = jsonpath(k, &["config", "view", "--minify"], "{.clusters[0].cluster.server}");
    server.trim_start_matches("https://").parse().expect("the API server's address")
}

/// The running pods of `component` (`gateway`, `node-agent`): name, node, IP.
pub fn pods(k: &EnvTest, component: &str) -> Vec<(String, String, IpAddr)> {
    let out = jsonpath(
        k,
        &["get", "pods", "-n", NS, "-l", &format!("app.kubernetes.io/component={component}"), "--field-selector=status.phase=Running"],
        r#"{range .items[?(@.status.podIP)]}{.metadata.name} {.spec.nodeName} {.status.podIP} {.metadata.deletionTimestamp}{"\n"}{end}"#,
    );
    out.lines()
        .filter_map(|l| {
            let f: Vec<&str> = l.split_whitespace().collect();
            // A pod being deleted is on its way out.
            (f.len() == 3).then(|| (f[0].to_string(), f[1].to_string(), f[2].parse().ok())).and_then(|(a, b, ip)| Some((a, b, ip?)))
        })
        .collect()
}

/// The gateways' addresses (their pods' IPs, port 8080).
pub fn gateways(k: &EnvTest) -> Vec<SocketAddr> {
    pods(k, "gateway").into_iter().map(|(_, _, ip)| SocketAddr::new(ip, 8080)).collect()
}

/// The key in Secret `name` of namespace `default`.
pub fn key_in_secret(k: &EnvTest, name: &str) -> String {
    use base64::Engine as _;
    let b64 = jsonpath(k, &["get", "secret", name, "-n", "default"], "{.data.key}");
    String::from_utf8(base64::engine::general_purpose::STANDARD.decode(b64).unwrap()).unwrap()
}

/// Whether the `Ready` condition of `kind/name` in `default` is True.
pub fn ready(k: &EnvTest, kind: &str, name: &str) -> bool {
    jsonpath(k, &["get", kind, name, "-n", "default"], r#"{.status.conditions[?(@.type=="Ready")].status}"#) == "True"
}

/// Lines of this machine's mount table below `dir`.
pub fn mounts_below(dir: &Path) -> Vec<String> {
    let dir = dir.to_string_lossy().into_owned();
    std::fs::read_to_string("/proc/self/mountinfo").unwrap().lines().filter(|l| l.split(' ').nth(4).is_some_and(|m| m.starts_with(&dir))).map(String::from).collect()
}

/// Warren's cgroups on the machine, leaving out those of the test
/// harness's own agents (`warren-e2e-*`): other tests run beside, each
/// cleaning up its own.
pub fn warren_cgroups() -> Vec<String> {
    let out = Command::new("find").args(["/sys/fs/cgroup", "-type", "d", "-name", "warren*"]).output().unwrap();
    String::from_utf8_lossy(&out.stdout).lines().filter(|p| !p.contains("/warren-e2e-")).map(String::from).collect()
}

/// Warren's processes from the chart's image (its binaries are in
/// `/usr/local/bin`, run by name), not the workspace's own binaries that
/// tests and benchmarks running beside start, nor a command line naming
/// them (`cargo build -p warren-node-agent`).
pub fn warren_processes() -> Vec<String> {
    let out = Command::new("pgrep").args(["-a", "-f", "^(/usr/local/bin/)?warren-(node-agent|sandbox|gateway|operator)( |$)"]).output().unwrap();
    String::from_utf8_lossy(&out.stdout).lines().map(String::from).collect()
}

/// The chart's agent process on node `node` (its `NODE_NAME`), if running.
pub fn agent_pid(node: &str) -> Option<u32> {
    let out = Command::new("pgrep").args(["-f", "^(/usr/local/bin/)?warren-node-agent( |$)"]).output().ok()?;
    let want = format!("NODE_NAME={node}");
    String::from_utf8_lossy(&out.stdout).lines().filter_map(|p| p.trim().parse().ok()).find(|pid: &u32| {
        std::fs::read(format!("/proc/{pid}/environ")).map(|e| e.split(|b| *b == 0).any(|v| v == want.as_bytes())).unwrap_or(false)
    })
}

/// Warren's cgroups below the cgroups of process `pid` (its sandboxes and
/// pools, in every controller's hierarchy).
pub fn cgroups_of(pid: u32) -> Vec<String> {
    let own = std::fs::read_to_string(format!("/proc/{pid}/cgroup")).unwrap_or_default();
    let paths: Vec<String> = own.lines().filter_map(|l| l.splitn(3, ':').nth(2)).filter(|p| p.len() > 1).map(|p| format!("{p}/")).collect();
    warren_cgroups().into_iter().filter(|c| paths.iter().any(|p| c.contains(p.as_str()))).collect()
}
