//! Shared harness for the end-to-end tests: starts the real `warren-node-agent`
//! (and through it real sandboxes) and talks gRPC to it.
//!
//! Binaries come from the workspace's target directory; the README's test
//! command builds them first (`cargo build --workspace --bins`).

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{bail, Context};
use tonic::transport::Channel;
use warren_proto::client::AgentAddress;
pub mod bench;
pub mod chart_cluster;
pub mod browser;
pub mod disk;
pub mod forward;
pub mod docs;
pub mod gateway;
pub mod guest;
pub mod helm;
pub mod http;
pub mod idp;
pub mod kube;
pub mod netlab;
pub mod otlp;
pub mod pki;
pub mod python;
pub mod registry;
pub mod s3;
pub mod services;
pub mod storage;
pub mod azurite;

use warren_proto::agent::{self as pb, execute_event::Event, node_agent_client::NodeAgentClient};

/// Directory holding the workspace's built binaries.
pub fn bin_dir() -> PathBuf {
    if let Ok(dir) = std::env::var("WARREN_BIN_DIR") {
        return PathBuf::from(dir);
    }
    // target/<profile>/deps/<test-binary> → target/<profile>
    let exe = std::env::current_exe().expect("current_exe");
    exe.parent().and_then(Path::parent).expect("target dir").to_path_buf()
}

/// Path of a workspace binary, or a panic telling how to build it.
pub fn bin(name: &str) -> PathBuf {
    let path = bin_dir().join(name);
    assert!(path.exists(), "{} not found: run `cargo build --workspace --bins` first", path.display());
    path
}

/// True when running as root. Root-only tests print why they skip otherwise.
pub fn is_root() -> bool {
    // SAFETY: geteuid has no preconditions.
    #[allow(unsafe_code)]
    unsafe {
        libc::geteuid() == 0
    }
}

/// Prints a skip reason and returns true when not root. With
/// `WARREN_REQUIRE_ROOT=1` (set by CI, which runs as root) skipping is a
/// failure: a root-only test can never pass there by not running.
pub fn skip_unless_root(test: &str) -> bool {
    if is_root() {
        return false;
    }
    assert!(std::env::var("WARREN_REQUIRE_ROOT").as_deref() != Ok("1"), "{test} needs root and WARREN_REQUIRE_ROOT=1 forbids skipping it");
    eprintln!("SKIPPED {test}: needs root (creates namespaces and cgroups); CI runs as root");
    true
}

/// A node-agent serving TCP with mutual TLS and a bearer token, as the
/// DaemonSet's pods do; with what a caller needs to reach it.
pub struct TcpAgent {
    /// The agent.
    pub agent: Agent,
    /// Its port on 127.0.0.1.
    pub port: u16,
    /// File holding its token.
    pub token: PathBuf,
    /// Certificates of both sides.
    pub pki: pki::Pki,
    _dir: tempfile::TempDir,
}

impl TcpAgent {
    /// Starts one reporting node name `node` and waits until it listens
    /// (its Unix socket requires the token too, so the harness cannot probe it).
    pub fn start(node: &str) -> anyhow::Result<TcpAgent> {
        let dir = tempfile::tempdir()?;
        let token = dir.path().join("token");
        std::fs::write(&token, "test-token-0123456789abcdef")?;
        let port = std::net::TcpListener::bind("127.0.0.1:0")?.local_addr()?.port();
        let listen = format!("127.0.0.1:{port}");
        let pki = pki::Pki::new();
        let mut args = pki.tcp_agent_args(&listen, &token);
        args.extend(["--node-name".to_string(), node.to_string()]);
        let agent = Agent::start_no_wait(&args.iter().map(String::as_str).collect::<Vec<_>>())?;
        if !gateway::wait_for(Duration::from_secs(20), || std::net::TcpStream::connect(&listen).is_ok()) {
            bail!("the agent does not listen on {listen}");
        }
        Ok(TcpAgent { agent, port, token, pki, _dir: dir })
    }
}

/// A running node-agent, killed and cleaned up on drop.
pub struct Agent {
    child: Option<Child>,
    _dir: tempfile::TempDir,
    socket: PathBuf,
    state: PathBuf,
    /// This agent's cgroup parent name (unique, so parallel tests never meet).
    pub cgroup_name: String,
    /// First host uid of this agent's sandboxes (unique range per agent).
    pub uid_base: u32,
}

/// Collected result of one execution.
#[derive(Debug, Default, Clone)]
pub struct Run {
    /// Everything printed on stdout.
    pub stdout: String,
    /// Everything printed on stderr.
    pub stderr: String,
    /// The final event.
    pub exited: pb::Exited,
    /// The `Started` event.
    pub started: Option<pb::Started>,
    /// Order in which chunks arrived: ('o' | 'e', text).
    pub chunks: Vec<(char, String)>,
}

impl Run {
    /// What the program printed after `label ` on a line of stdout (tests
    /// print one `label value` line per check); panics, showing the output,
    /// when there is none.
    pub fn line(&self, label: &str) -> &str {
        self.stdout
            .lines()
            .find_map(|l| l.strip_prefix(label).and_then(|r| r.strip_prefix(' ')))
            .unwrap_or_else(|| panic!("no {label:?} line in:\n{}\n{}", self.stdout, self.stderr))
    }
}

impl Agent {
    /// Starts an agent with its own state dir and socket; waits until it answers.
    pub async fn start(extra: &[&str]) -> anyhow::Result<Agent> {
        let agent = Agent::start_no_wait(extra)?;
        agent.wait_ready().await?;
        Ok(agent)
    }

    /// Starts an agent without waiting for it to serve.
    pub fn start_no_wait(extra: &[&str]) -> anyhow::Result<Agent> {
        let unique = unique_number();
        Agent::spawn(extra, format!("warren-e2e-{unique}"), 1_500_000_000 + (unique % 20_000) * 100_000)
    }

    /// Starts a second agent that shares this one's cgroup parent and uid range
    /// (as a restarted agent on the same node would).
    pub async fn restart(&self, extra: &[&str]) -> anyhow::Result<Agent> {
        let agent = Agent::spawn(extra, self.cgroup_name.clone(), self.uid_base)?;
        agent.wait_ready().await?;
        Ok(agent)
    }

    /// Starts an agent with extra environment variables and, optionally, an
    /// existing state directory (as the same node's agent after a crash).
    pub async fn start_with(extra: &[&str], env: &[(&str, &str)], state_dir: Option<&Path>) -> anyhow::Result<Agent> {
        let unique = unique_number();
        let agent = Agent::spawn_full(extra, env, state_dir, format!("warren-e2e-{unique}"), 1_500_000_000 + (unique % 20_000) * 100_000)?;
        agent.wait_ready().await?;
        Ok(agent)
    }

    fn spawn(extra: &[&str], cgroup_name: String, uid_base: u32) -> anyhow::Result<Agent> {
        Agent::spawn_full(extra, &[], None, cgroup_name, uid_base)
    }

    fn spawn_full(extra: &[&str], env: &[(&str, &str)], state_dir: Option<&Path>, cgroup_name: String, uid_base: u32) -> anyhow::Result<Agent> {
        let dir = tempfile::Builder::new().prefix("warren-e2e-").tempdir()?;
        let socket = dir.path().join("agent.sock");
        let state = state_dir.map_or_else(|| dir.path().join("state"), Path::to_path_buf);
        // WARREN_E2E_AGENT_WRAPPER runs the agent through a wrapper, e.g.
        // tests/support/unprivileged-container.sh to run a suite as the
        // chart's non-privileged pod would.
        let wrapper = env.iter().find(|(k, _)| *k == "WARREN_E2E_AGENT_WRAPPER").map(|(_, v)| std::ffi::OsString::from(v));
        let mut cmd = match wrapper.or_else(|| std::env::var_os("WARREN_E2E_AGENT_WRAPPER")) {
            Some(w) => {
                let mut c = Command::new(w);
                c.arg(bin("warren-node-agent"));
                c
            }
            None => Command::new(bin("warren-node-agent")),
        };
        cmd.envs(env.iter().copied());
        cmd.arg("--listen-unix").arg(&socket).arg("--state-dir").arg(&state);
        cmd.arg("--cgroup-name").arg(&cgroup_name).arg("--uid-base").arg(uid_base.to_string());
        cmd.arg("--log-format").arg("plain").args(extra);
        // Sandbox networking is node-wide state (an nftables table, veths):
        // only tests that bring their own lab (`netlab`) turn it on.
        if !extra.contains(&"--sandbox-network") {
            cmd.args(["--sandbox-network", "off"]);
        }
        // The tests' stores and databases listen on loopback: their agents
        // allow it, as an admin would for services on the node. A test of
        // the refusal passes its own --allow-endpoint.
        if !extra.iter().any(|a| a.starts_with("--allow-endpoint")) {
            cmd.args(["--allow-endpoint", "127.0.0.0/8"]);
        }
        cmd.env("RUST_LOG", std::env::var("WARREN_TEST_LOG").unwrap_or_else(|_| "warn".into()));
        // A caller's own RUST_LOG wins; WARREN_E2E_AGENT_LOG names a file for its log.
        cmd.envs(env.iter().copied().filter(|(k, _)| *k == "RUST_LOG"));
        if let Some((_, file)) = env.iter().find(|(k, _)| *k == "WARREN_E2E_AGENT_LOG") {
            cmd.stderr(std::fs::File::create(file).context("creating the agent's log file")?);
        }
        cmd.stdin(Stdio::null());
        let child = cmd.spawn().context("spawning warren-node-agent")?;
        Ok(Agent { child: Some(child), _dir: dir, socket, state, cgroup_name, uid_base })
    }

    /// SIGKILLs the agent, as a crash would.
    pub fn kill_hard(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    async fn wait_ready(&self) -> anyhow::Result<()> {
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            if let Ok(mut c) = self.client().await {
                if c.status(pb::StatusRequest {}).await.is_ok() {
                    return Ok(());
                }
            }
            if Instant::now() > deadline {
                bail!("agent did not become ready");
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    /// State directory of this agent.
    pub fn state_dir(&self) -> PathBuf {
        self.state.clone()
    }

    /// pid of the agent process.
    pub fn pid(&self) -> u32 {
        self.child.as_ref().map(|c| c.id()).unwrap_or(0)
    }

    /// The agent's address, as the gateway takes it.
    pub fn address(&self) -> String {
        format!("unix:{}", self.socket.display())
    }

    /// A gRPC client over the agent's Unix socket.
    pub async fn client(&self) -> anyhow::Result<NodeAgentClient<Channel>> {
        let channel = warren_proto::client::connect(&AgentAddress::Unix(self.socket.clone()), &None).await?;
        Ok(NodeAgentClient::new(channel).max_decoding_message_size(64 << 20))
    }

    /// Runs `code` and collects the whole stream.
    pub async fn run(&self, language: pb::Language, code: &str, timeout: Duration) -> anyhow::Result<Run> {
        let req = request(language, code, timeout);
        self.run_request(req).await
    }

    /// Runs a full request and collects the whole stream.
    pub async fn run_request(&self, req: pb::ExecuteRequest) -> anyhow::Result<Run> {
        let mut client = self.client().await?;
        let mut stream = client.execute(req).await?.into_inner();
        let mut run = Run::default();
        let mut exited = None;
        while let Some(ev) = stream.message().await? {
            match ev.event {
                Some(Event::Started(s)) => run.started = Some(s),
                Some(Event::Stdout(c)) => {
                    let t = String::from_utf8_lossy(&c.data).into_owned();
                    run.stdout.push_str(&t);
                    run.chunks.push(('o', t));
                }
                Some(Event::Stderr(c)) => {
                    let t = String::from_utf8_lossy(&c.data).into_owned();
                    run.stderr.push_str(&t);
                    run.chunks.push(('e', t));
                }
                Some(Event::Exited(e)) => exited = Some(e),
                None => {}
            }
        }
        run.exited = exited.context("stream ended without an Exited event")?;
        Ok(run)
    }

    /// Sandbox cgroups of this agent currently present on the host.
    pub fn leftover_cgroups(&self) -> Vec<PathBuf> {
        sandbox_cgroups(&self.cgroup_name)
    }

    /// Emptied sandbox cgroups this agent keeps for its next sandboxes
    /// (`idle-*`, cgroup v1), one path per hierarchy.
    pub fn idle_cgroups(&self) -> Vec<PathBuf> {
        child_groups(&self.cgroup_name, "idle-")
    }

    /// Processes running under this agent's sandbox host uids.
    pub fn sandbox_processes(&self) -> Vec<(u32, u32)> {
        sandbox_processes(self.uid_base)
    }

    /// Pids of this agent's warm interpreters waiting in pooled sandboxes
    /// (an interpreter started on `/run/warren/main.py` or `main.js`).
    pub fn waiting_interpreters(&self) -> Vec<u32> {
        let held = |pid: u32| std::fs::read(format!("/proc/{pid}/cmdline")).is_ok_and(|c| c.ends_with(b"/run/warren/main.py\0") || c.ends_with(b"/run/warren/main.js\0"));
        self.sandbox_processes().into_iter().map(|(pid, _)| pid).filter(|pid| held(*pid)).collect()
    }

    /// Pids of the cold-start stubs waiting in pooled sandboxes: the
    /// sandbox binary, already under the program's uid (a slot's odd id),
    /// not yet exec'd.
    pub fn waiting_stubs(&self) -> Vec<u32> {
        let stub = |pid: u32, uid: u32| {
            let exe = std::fs::read_link(format!("/proc/{pid}/exe")).unwrap_or_default();
            (uid - self.uid_base) % 2 == 1 && exe.file_name().is_some_and(|n| n == "warren-sandbox")
        };
        self.sandbox_processes().into_iter().filter(|(pid, uid)| stub(*pid, *uid)).map(|(pid, _)| pid).collect()
    }

    /// True while the agent process runs.
    pub fn is_running(&mut self) -> bool {
        self.child.as_mut().is_some_and(|c| matches!(c.try_wait(), Ok(None)))
    }

    /// Waits up to `limit` for the agent to exit by itself (an agent that
    /// refuses its configuration); `None` if it still runs.
    pub fn wait_exit(&mut self, limit: Duration) -> Option<std::process::ExitStatus> {
        let child = self.child.as_mut()?;
        let deadline = Instant::now() + limit;
        while Instant::now() < deadline {
            if let Ok(Some(status)) = child.try_wait() {
                return Some(status);
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        None
    }

    /// Stops the agent (SIGTERM, then wait).
    pub fn stop(&mut self) {
        if let Some(mut child) = self.child.take() {
            // SAFETY: signalling our own child by pid.
            #[allow(unsafe_code)]
            unsafe {
                libc::kill(child.id() as i32, libc::SIGTERM);
            }
            let deadline = Instant::now() + Duration::from_secs(15);
            while Instant::now() < deadline {
                if let Ok(Some(_)) = child.try_wait() {
                    return;
                }
                std::thread::sleep(Duration::from_millis(20));
            }
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

impl Drop for Agent {
    fn drop(&mut self) {
        self.stop();
        // A crashed agent leaves its mounts (thread homes, the shared homes
        // dir) and its groups; never leave them on the machine.
        let _ = warren_isolation::home::unmount_below(&self.state);
        for dir in sandbox_cgroups(&self.cgroup_name).into_iter().chain(self.idle_cgroups()) {
            kill_cgroup(&dir);
            let _ = std::fs::remove_dir(&dir);
        }
        for parent in cgroup_parents(&self.cgroup_name) {
            let _ = std::fs::remove_dir(parent);
        }
    }
}

fn kill_cgroup(dir: &Path) {
    for _ in 0..100 {
        let procs = std::fs::read_to_string(dir.join("cgroup.procs")).unwrap_or_default();
        if procs.trim().is_empty() {
            return;
        }
        for pid in procs.lines().filter_map(|l| l.trim().parse::<i32>().ok()) {
            // SAFETY: kill(2) with a pid read from the test agent's own sandbox cgroup.
            #[allow(unsafe_code)]
            unsafe {
                libc::kill(pid, libc::SIGKILL);
            }
        }
        std::thread::sleep(Duration::from_millis(10));
    }
}

/// The agent's parent directories in every hierarchy.
pub fn cgroup_parents(parent: &str) -> Vec<PathBuf> {
    let mut out = Vec::new();
    let mut stack = vec![PathBuf::from("/sys/fs/cgroup")];
    while let Some(dir) = stack.pop() {
        let Ok(entries) = std::fs::read_dir(&dir) else { continue };
        for e in entries.flatten() {
            if !e.file_type().is_ok_and(|t| t.is_dir()) {
                continue;
            }
            if e.file_name() == parent {
                out.push(e.path());
            } else if !e.file_name().to_string_lossy().starts_with("sbx-") && stack.len() < 10_000 {
                stack.push(e.path());
            }
        }
    }
    out
}

/// A request with default limits.
pub fn request(language: pb::Language, code: &str, timeout: Duration) -> pb::ExecuteRequest {
    pb::ExecuteRequest {
        language: language as i32,
        code: code.to_string(),
        timeout_ms: timeout.as_millis() as u32,
        ..Default::default()
    }
}

/// A number unique to this process and call (pid and a counter).
pub fn unique_number() -> u32 {
    static NEXT: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);
    std::process::id().wrapping_mul(31).wrapping_add(NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed))
}

/// Every `sbx-*` cgroup directory under any hierarchy's `parent` directory.
pub fn sandbox_cgroups(parent: &str) -> Vec<PathBuf> {
    child_groups(parent, "sbx-")
}

/// The directories named `prefix…` under any hierarchy's `parent` directory.
fn child_groups(parent: &str, prefix: &str) -> Vec<PathBuf> {
    cgroup_parents(parent)
        .into_iter()
        .filter_map(|p| std::fs::read_dir(p).ok())
        .flat_map(|entries| entries.flatten())
        .filter(|e| e.file_name().to_string_lossy().starts_with(prefix) && e.file_type().is_ok_and(|t| t.is_dir()))
        .map(|e| e.path())
        .collect()
}

/// Processes whose real uid is in the sandbox id range starting at `uid_base`.
pub fn sandbox_processes(uid_base: u32) -> Vec<(u32, u32)> {
    let mut out = Vec::new();
    let Ok(entries) = std::fs::read_dir("/proc") else { return out };
    for e in entries.flatten() {
        let Ok(pid) = e.file_name().to_string_lossy().parse::<u32>() else { continue };
        let Ok(status) = std::fs::read_to_string(format!("/proc/{pid}/status")) else { continue };
        let uid = status
            .lines()
            .find(|l| l.starts_with("Uid:"))
            .and_then(|l| l.split_whitespace().nth(1))
            .and_then(|u| u.parse::<u32>().ok());
        if let Some(uid) = uid {
            if uid >= uid_base && uid < uid_base.saturating_add(100_000) {
                out.push((pid, uid));
            }
        }
    }
    out
}

/// `a/b/../c` → `a/c` (exact when the path holds no symlinks).
pub(crate) fn lexical(path: &std::path::Path) -> std::path::PathBuf {
    let mut out = std::path::PathBuf::new();
    for c in path.components() {
        match c {
            std::path::Component::ParentDir => {
                out.pop();
            }
            std::path::Component::CurDir => {}
            other => out.push(other),
        }
    }
    out
}
