//! A real Kubernetes API server for tests: `kube-envtest` (etcd +
//! kube-apiserver 1.20.2 on loopback, from ../shared/tools), on ports of its
//! own so parallel tests never meet; stopped on drop.

use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use anyhow::{bail, Context};

/// Where the tool is: `$WARREN_KUBE_ENVTEST`, or `shared/tools/` beside the
/// repository (as on the development and CI machines).
pub fn tool() -> anyhow::Result<PathBuf> {
    if let Ok(p) = std::env::var("WARREN_KUBE_ENVTEST") {
        return Ok(PathBuf::from(p));
    }
    let repo = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    for candidate in [repo.join("../shared/tools/kube-envtest"), PathBuf::from("/work/shared/tools/kube-envtest")] {
        if candidate.exists() {
            return Ok(candidate);
        }
    }
    bail!("kube-envtest not found: set WARREN_KUBE_ENVTEST to its path")
}

/// A port `p` with `p + 1` also free (etcd uses both).
fn free_port_pair() -> anyhow::Result<u16> {
    for _ in 0..200 {
        let p = TcpListener::bind("127.0.0.1:0")?.local_addr()?.port();
        if p < 65000 && TcpListener::bind(("127.0.0.1", p)).is_ok() && TcpListener::bind(("127.0.0.1", p + 1)).is_ok() {
            return Ok(p);
        }
    }
    bail!("no free port pair on loopback")
}

/// A running API server.
pub struct EnvTest {
    tool: PathBuf,
    dir: tempfile::TempDir,
    /// Held while this server has nodes: one set of nodes per machine (they
    /// share the CNI bridge, its subnet and the kubelet ports).
    node_lock: std::sync::Mutex<Option<std::fs::File>>,
}

impl EnvTest {
    /// Starts etcd and the API server (building the server first if this
    /// machine has none cached, ~5 min once).
    pub fn start() -> anyhow::Result<EnvTest> {
        let tool = tool()?;
        let dir = tempfile::tempdir()?;
        let etcd = free_port_pair()?;
        let api = free_port_pair()?;
        let out = Command::new(&tool)
            .arg("start")
            .arg(dir.path())
            .env("ETCD_PORT", etcd.to_string())
            .env("APISERVER_PORT", api.to_string())
            .output()
            .context("running kube-envtest")?;
        let env = EnvTest { tool, dir, node_lock: Default::default() };
        if !out.status.success() {
            bail!("kube-envtest start failed:\n{}", String::from_utf8_lossy(&out.stderr));
        }
        Ok(env)
    }

    /// Adds the real node (`node1`: controllers, scheduler, containerd,
    /// runc, CNI bridge `wrn-cni0` with gateway 10.244.0.1, a kubelet); one
    /// per machine at a time. Stopped with the API server on drop.
    pub fn start_node(&self) -> anyhow::Result<()> {
        self.lock_nodes()?;
        let out = Command::new(&self.tool).arg("start-node").arg(self.dir.path()).output().context("running kube-envtest start-node")?;
        if !out.status.success() {
            bail!("kube-envtest start-node failed:\n{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
        }
        Ok(())
    }

    /// Waits (flock) until no other test on this machine runs nodes, then
    /// holds that until drop; leftovers of a test that died without its
    /// drop (pod network namespaces, address leases) are removed first.
    fn lock_nodes(&self) -> anyhow::Result<()> {
        use std::os::fd::AsRawFd as _;
        let file = std::fs::OpenOptions::new().create(true).truncate(false).write(true).open("/run/lock/warren-e2e-kube-nodes.lock")?;
        // SAFETY: flock(2) on a descriptor this function owns.
        #[allow(unsafe_code)]
        let rc = unsafe { libc::flock(file.as_raw_fd(), libc::LOCK_EX) };
        if rc != 0 {
            bail!("locking the machine's kube nodes: {}", std::io::Error::last_os_error());
        }
        remove_pod_networks();
        *self.node_lock.lock().unwrap_or_else(|p| p.into_inner()) = Some(file);
        Ok(())
    }

    /// Makes the nodes' CNI bridge (`wrn-cni0`, 10.244.0.1/24) now rather
    /// than with the first pod, so servers for the pods can listen on its
    /// address before anything is installed (the bridge plugin reuses it;
    /// `stop` removes it).
    pub fn bridge_up(&self) -> anyhow::Result<std::net::IpAddr> {
        let has = |args: &[&str]| Command::new("ip").args(args).output().map(|o| o.status.success() && !o.stdout.is_empty()).unwrap_or(false);
        if !has(&["link", "show", "wrn-cni0"]) {
            run_ip(&["link", "add", "wrn-cni0", "type", "bridge"])?;
        }
        let shown = Command::new("ip").args(["-4", "addr", "show", "dev", "wrn-cni0"]).output()?;
        if !String::from_utf8_lossy(&shown.stdout).contains("10.244.0.1/") {
            run_ip(&["addr", "add", "10.244.0.1/24", "dev", "wrn-cni0"])?;
        }
        run_ip(&["link", "set", "wrn-cni0", "up"])?;
        Ok("10.244.0.1".parse()?)
    }

    /// One more node, `name` (after [`EnvTest::start_node`]): its own
    /// containerd and kubelet, pods on node1's bridge. Images loaded before
    /// are not on it: load them again.
    pub fn add_node(&self, name: &str) -> anyhow::Result<()> {
        let out = Command::new(&self.tool).arg("add-node").arg(self.dir.path()).arg(name).output().context("running kube-envtest add-node")?;
        if !out.status.success() {
            bail!("kube-envtest add-node {name} failed:\n{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
        }
        Ok(())
    }

    /// Kills node `name`'s kubelet and containers, as if its machine died.
    pub fn stop_node(&self, name: &str) -> anyhow::Result<()> {
        let out = Command::new(&self.tool).arg("stop-node").arg(self.dir.path()).arg(name).output().context("running kube-envtest stop-node")?;
        if !out.status.success() {
            bail!("kube-envtest stop-node {name} failed:\n{}", String::from_utf8_lossy(&out.stderr));
        }
        Ok(())
    }

    /// Imports an OCI image layout tar into the node's containerd.
    pub fn load_image(&self, tar: &Path) -> anyhow::Result<()> {
        let out = Command::new(&self.tool).arg("load-image").arg(self.dir.path()).arg(tar).output().context("running kube-envtest load-image")?;
        if !out.status.success() {
            bail!("kube-envtest load-image {} failed:\n{}", tar.display(), String::from_utf8_lossy(&out.stderr));
        }
        Ok(())
    }

    /// The admin kubeconfig.
    pub fn kubeconfig(&self) -> PathBuf {
        self.dir.path().join("kubeconfig")
    }

    /// The admin kubeconfig for Warren's own processes. kube-envtest's
    /// serving certificate is a self-signed CA used as the leaf, which
    /// rustls (rightly) refuses; this copy skips verification of that one
    /// loopback certificate. Real clusters present a CA-issued leaf.
    pub fn kubeconfig_for_rustls(&self) -> PathBuf {
        let path = self.dir.path().join("kubeconfig-rustls");
        if !path.exists() {
            let text = std::fs::read_to_string(self.kubeconfig()).unwrap_or_default();
            let (before, rest) = text.split_once("certificate-authority: ").unwrap_or((&text, ""));
            let after = rest.split_once('}').map(|(_, a)| a).unwrap_or("");
            let _ = std::fs::write(&path, format!("{before}insecure-skip-tls-verify: true}}{after}"));
        }
        path
    }

    /// Installs Warren's generated CRDs and waits until they are served.
    pub fn install_crds(&self) {
        let crds = Path::new(env!("CARGO_MANIFEST_DIR")).join("../crds");
        self.kubectl_ok(&["apply", "-f", crds.to_str().unwrap_or_default()]);
        for crd in ["sandboxes", "apikeys", "storageconnections", "connectors"] {
            let name = format!("crd/{crd}.warren.dev");
            let args = ["wait", "--for", "condition=established", "--timeout=60s", name.as_str()];
            // kubectl 1.20 fails at once, instead of waiting, while a fresh
            // CRD has no status conditions yet: ask again until it has.
            let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
            loop {
                let out = self.kubectl(&args);
                if out.status.success() {
                    break;
                }
                let early = String::from_utf8_lossy(&out.stderr).contains(".status.conditions accessor error");
                assert!(early && std::time::Instant::now() < deadline, "kubectl {args:?} failed:\n{}", String::from_utf8_lossy(&out.stderr));
                std::thread::sleep(std::time::Duration::from_millis(200));
            }
        }
    }

    /// Runs kubectl against this server.
    pub fn kubectl(&self, args: &[&str]) -> Output {
        Command::new("kubectl").arg("--kubeconfig").arg(self.kubeconfig()).args(args).output().expect("kubectl runs")
    }

    /// Stops the API server (SIGKILL; etcd keeps running) and returns its
    /// command line for [`EnvTest::start_api_server`].
    pub fn stop_api_server(&self) -> Vec<std::ffi::OsString> {
        use std::os::unix::ffi::OsStrExt as _;
        let pid: i32 = std::fs::read_to_string(self.dir.path().join("apiserver.pid")).expect("apiserver.pid").trim().parse().expect("a pid");
        let cmdline = std::fs::read(format!("/proc/{pid}/cmdline")).expect("the API server runs");
        let args = cmdline.split(|b| *b == 0).filter(|a| !a.is_empty()).map(|a| std::ffi::OsStr::from_bytes(a).to_os_string()).collect();
        let _ = Command::new("kill").args(["-KILL", &pid.to_string()]).status();
        let gone = (0..200).any(|_| {
            std::thread::sleep(std::time::Duration::from_millis(50));
            !std::path::Path::new(&format!("/proc/{pid}")).exists() || std::fs::read_to_string(format!("/proc/{pid}/stat")).is_ok_and(|s| s.contains(") Z "))
        });
        assert!(gone, "the API server did not stop");
        args
    }

    /// Starts the API server again with the command line `args` (state in
    /// etcd is kept) and waits until it answers.
    pub fn start_api_server(&self, args: &[std::ffi::OsString]) {
        let log = std::fs::OpenOptions::new().append(true).create(true).open(self.dir.path().join("apiserver.log")).expect("log");
        let child = Command::new(&args[0]).args(&args[1..]).stdin(std::process::Stdio::null()).stdout(log.try_clone().unwrap()).stderr(log).spawn().expect("starting the API server");
        std::fs::write(self.dir.path().join("apiserver.pid"), child.id().to_string()).unwrap();
        let up = (0..600).any(|_| {
            std::thread::sleep(std::time::Duration::from_millis(100));
            self.kubectl(&["get", "--raw", "/readyz"]).status.success()
        });
        assert!(up, "the API server did not come back");
    }

    /// Runs kubectl, failing with its output unless it succeeds; returns stdout.
    pub fn kubectl_ok(&self, args: &[&str]) -> String {
        let out = self.kubectl(args);
        assert!(out.status.success(), "kubectl {args:?} failed:\n{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
        String::from_utf8_lossy(&out.stdout).into_owned()
    }
}

impl Drop for EnvTest {
    /// `kube-envtest stop` only signals; wait (bounded) until etcd and the
    /// API server are gone, and SIGKILL whatever is left, so nothing outlives
    /// the test.
    fn drop(&mut self) {
        let nodes = std::fs::read_dir(self.dir.path().join("nodes")).into_iter().flatten().flatten().map(|e| e.path());
        let node_pids = nodes.flat_map(|d| [d.join("kubelet.pid"), d.join("containerd.pid")]);
        let pids: Vec<i32> = ["apiserver.pid", "etcd.pid", "kubelet.pid", "containerd.pid", "scheduler.pid", "controller-manager.pid"]
            .iter()
            .map(|f| self.dir.path().join(f))
            .chain(node_pids)
            .filter_map(|f| std::fs::read_to_string(f).ok())
            .filter_map(|p| p.trim().parse().ok())
            .collect();
        let _ = Command::new(&self.tool).arg("stop").arg(self.dir.path()).output();
        // SAFETY: kill(2) with signal 0 or SIGKILL on pids this test started.
        #[allow(unsafe_code)]
        let alive = |p: i32| unsafe { libc::kill(p, 0) == 0 };
        let gone = crate::gateway::wait_for(std::time::Duration::from_secs(15), || !pids.iter().any(|&p| alive(p)));
        if !gone {
            for &p in &pids {
                #[allow(unsafe_code)]
                // SAFETY: as above.
                unsafe {
                    libc::kill(p, libc::SIGKILL);
                }
            }
        }
        if self.node_lock.lock().map(|l| l.is_some()).unwrap_or(false) {
            remove_pod_networks();
        }
    }
}

fn run_ip(args: &[&str]) -> anyhow::Result<()> {
    let out = Command::new("ip").args(args).output()?;
    if !out.status.success() {
        bail!("ip {args:?}: {}", String::from_utf8_lossy(&out.stderr));
    }
    Ok(())
}

/// Removes what killed kubelets leave of their pods' networks: the CNI
/// network namespaces (`cni-…`, which keep their veths and addresses) and
/// the address leases of the nodes' shared subnet. Only under the node lock:
/// nothing else on these machines names namespaces `cni-…`.
fn remove_pod_networks() {
    for ns in std::fs::read_dir("/var/run/netns").into_iter().flatten().flatten() {
        let name = ns.file_name().to_string_lossy().into_owned();
        if name.starts_with("cni-") {
            let _ = Command::new("ip").args(["netns", "delete", &name]).output();
        }
    }
    for lease in std::fs::read_dir("/var/lib/cni/networks/envtest").into_iter().flatten().flatten() {
        if lease.file_name().to_string_lossy().starts_with("10.") {
            let _ = std::fs::remove_file(lease.path());
        }
    }
}

/// A running `warren-operator` against an [`EnvTest`]; killed on drop.
pub struct Operator {
    child: std::process::Child,
    logs: std::sync::Arc<std::sync::Mutex<Vec<String>>>,
}

impl Operator {
    /// Starts the operator for Warren's `namespace`, publishing keys into `keys`.
    pub fn start(k: &EnvTest, namespace: &str, keys: &str) -> anyhow::Result<Operator> {
        Operator::start_with(k, namespace, keys, &[])
    }

    /// Like [`Operator::start`], with further flags (e.g. node-agent credentials).
    pub fn start_with(k: &EnvTest, namespace: &str, keys: &str, extra: &[String]) -> anyhow::Result<Operator> {
        use std::io::BufRead;
        let mut child = Command::new(crate::bin("warren-operator"))
            .args(["--namespace", namespace, "--publish-namespace", keys, "--log-format", "json", "--ops-listen", "127.0.0.1:0"])
            // The tests' stores listen on loopback: allowed, as an admin would.
            .args(["--allow-endpoint", "127.0.0.0/8"])
            // The tests' tenants live in `default`, as the chart's
            // tenantNamespaces would list them.
            .args(["--tenant-namespace", "default"])
            .args(extra)
            .env("KUBECONFIG", k.kubeconfig_for_rustls())
            .env("RUST_LOG", "info")
            .stdin(std::process::Stdio::null())
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::piped())
            .spawn()
            .context("spawning warren-operator")?;
        let stderr = child.stderr.take().context("stderr")?;
        let logs = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
        let sink = logs.clone();
        std::thread::spawn(move || {
            for line in std::io::BufReader::new(stderr).lines().map_while(Result::ok) {
                sink.lock().unwrap().push(line);
            }
        });
        Ok(Operator { child, logs })
    }

    /// Every log line so far.
    pub fn logs(&self) -> Vec<String> {
        self.logs.lock().unwrap().clone()
    }

    /// The address its health and metrics endpoint listens on (from its log).
    pub fn ops_addr(&self) -> anyhow::Result<std::net::SocketAddr> {
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
        loop {
            let found = self.logs().iter().find(|l| l.contains("health and metrics endpoint listening")).and_then(|l| {
                let v: serde_json::Value = serde_json::from_str(l).ok()?;
                v["addr"].as_str()?.parse().ok()
            });
            if let Some(addr) = found {
                return Ok(addr);
            }
            anyhow::ensure!(std::time::Instant::now() < deadline, "the operator never logged its ops address");
            std::thread::sleep(std::time::Duration::from_millis(50));
        }
    }
}

impl Drop for Operator {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// A copy of `examples/quickstart/` whose Sandbox runs `image` instead of
/// the example's (a registry the test made, or `host` for tests of the
/// control plane alone).
pub fn quickstart_with_image(image: &str) -> tempfile::TempDir {
    let dir = tempfile::tempdir().expect("tempdir");
    let example = Path::new(env!("CARGO_MANIFEST_DIR")).join("../examples/quickstart");
    for entry in std::fs::read_dir(&example).expect("examples/quickstart") {
        let path = entry.expect("entry").path();
        if path.extension().is_none_or(|e| e != "yaml") {
            continue;
        }
        let text = std::fs::read_to_string(&path).expect("read example");
        let text: Vec<String> = text.lines().map(|l| if l.trim_start().starts_with("image:") { format!("  image: {image}") } else { l.to_string() }).collect();
        std::fs::write(dir.path().join(path.file_name().expect("name")), text.join("\n") + "\n").expect("write copy");
    }
    dir
}

/// Namespaces `team-a` and `team-b` and the console's RBAC for two groups:
/// `team-a` may view Warren's kinds in its namespace and `use` its
/// Sandboxes (the console's playground) (RoleBindings);
/// `platform-admins` may view them everywhere and patch ApiKeys
/// (ClusterRoleBindings).
pub const CONSOLE_RBAC: &str = r#"
apiVersion: v1
kind: Namespace
metadata: {name: team-a}
---
apiVersion: v1
kind: Namespace
metadata: {name: team-b}
---
apiVersion: rbac.authorization.k8s.io/v1
kind: ClusterRole
metadata: {name: warren-viewer}
rules:
- apiGroups: [warren.dev]
  resources: [sandboxes, apikeys, storageconnections, connectors]
  verbs: [get, list, watch]
---
apiVersion: rbac.authorization.k8s.io/v1
kind: ClusterRole
metadata: {name: warren-key-operator}
rules:
- apiGroups: [warren.dev]
  resources: [apikeys]
  verbs: [patch]
---
apiVersion: rbac.authorization.k8s.io/v1
kind: ClusterRole
metadata: {name: warren-runner}
rules:
- apiGroups: [warren.dev]
  resources: [sandboxes]
  verbs: [use]
---
apiVersion: rbac.authorization.k8s.io/v1
kind: RoleBinding
metadata: {name: team-a-runners, namespace: team-a}
subjects: [{kind: Group, name: team-a, apiGroup: rbac.authorization.k8s.io}]
roleRef: {kind: ClusterRole, name: warren-runner, apiGroup: rbac.authorization.k8s.io}
---
apiVersion: rbac.authorization.k8s.io/v1
kind: RoleBinding
metadata: {name: team-a-viewers, namespace: team-a}
subjects: [{kind: Group, name: team-a, apiGroup: rbac.authorization.k8s.io}]
roleRef: {kind: ClusterRole, name: warren-viewer, apiGroup: rbac.authorization.k8s.io}
---
apiVersion: rbac.authorization.k8s.io/v1
kind: ClusterRoleBinding
metadata: {name: platform-viewers}
subjects: [{kind: Group, name: platform-admins, apiGroup: rbac.authorization.k8s.io}]
roleRef: {kind: ClusterRole, name: warren-viewer, apiGroup: rbac.authorization.k8s.io}
---
apiVersion: rbac.authorization.k8s.io/v1
kind: ClusterRoleBinding
metadata: {name: platform-key-operators}
subjects: [{kind: Group, name: platform-admins, apiGroup: rbac.authorization.k8s.io}]
roleRef: {kind: ClusterRole, name: warren-key-operator, apiGroup: rbac.authorization.k8s.io}
"#;
