//! A network laboratory on this machine: test hosts in a network namespace
//! of our own, reachable only by traffic *from one agent's sandbox range*
//! (policy routing), plus a DNS server on loopback the agent's proxies ask.
//!
//! Nothing here is routed beyond this machine: the lab namespace has no
//! default route, and the lab's routing table ends in `unreachable default`,
//! so sandbox traffic to any address the lab does not hold fails locally.
//!
//! Hosts (all in one namespace, one HTTP server on port 80 answering
//! `warren-lab`; `/big` is [`BIG_BYTES`] of zeros):
//! - "public" 198.51.100.10 and 198.51.100.11,
//! - "private" 10.200.0.10,
//! - a fake metadata server at 169.254.169.254,
//! - a "private service" at 10.200.<n>.20 that the node itself reaches (as a
//!   connector's forwarder must), unique per lab.
//!
//! DNS names: `public.test` → .10, `other.test` → .11, `private.test` →
//! 10.200.0.10, `metadata.test` → 169.254.169.254, `rebind.test` →
//! alternately .10 and 10.200.0.10 (TTL 0); anything else NXDOMAIN.

use std::net::{Ipv4Addr, SocketAddr, UdpSocket};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{bail, Context};
use hickory_proto::op::{Message, MessageType, ResponseCode};
use hickory_proto::rr::{RData, Record, RecordType};

/// Size of `/big`.
pub const BIG_BYTES: u64 = 24 << 20;

/// A running lab; everything is removed on drop.
pub struct NetLab {
    ns: String,
    host_if: String,
    table: u32,
    rules: Vec<String>,
    routes: Vec<String>,
    server: Option<Child>,
    dns_stop: Arc<AtomicBool>,
    dns_thread: Option<std::thread::JoinHandle<()>>,
    dns_log: Arc<std::sync::Mutex<Vec<Vec<u8>>>>,
    /// The DNS server's address (pass as `--dns-upstream`).
    pub dns: SocketAddr,
    /// The node's own address facing the lab (sandboxes must not reach it).
    pub node_addr: Ipv4Addr,
    /// The sandbox range this lab serves (pass as `--sandbox-network`).
    pub sandbox_net: String,
    /// An agent network prefix unique to this lab (`--network-prefix`).
    pub prefix: String,
    /// A "private" address of this lab (10.200.<n>.20) the *node* reaches
    /// (a host route, so a connector's forwarder can), serving HTTP on 80.
    pub private_service: Ipv4Addr,
    _dir: tempfile::TempDir,
}

fn ip(args: &[&str]) -> anyhow::Result<()> {
    run("ip", args)
}

fn run(program: &str, args: &[&str]) -> anyhow::Result<()> {
    let out = Command::new(program).args(args).stdin(Stdio::null()).output().with_context(|| format!("running {program}"))?;
    if !out.status.success() {
        bail!("{program} {}: {}", args.join(" "), String::from_utf8_lossy(&out.stderr).trim());
    }
    Ok(())
}

impl NetLab {
    /// Builds the lab for a new agent (root only).
    pub fn start() -> anyhow::Result<NetLab> {
        let dir = tempfile::tempdir()?;
        std::fs::write(dir.path().join("index.html"), "warren-lab\n")?;
        std::fs::File::create(dir.path().join("big"))?.set_len(BIG_BYTES)?;
        let (dns, dns_stop, dns_thread, dns_log) = dns_server()?;
        // Last before the lab exists: from here on its Drop cleans up.
        let u = claim_namespace()?;
        let mut lab = NetLab {
            ns: format!("wlab{u}"),
            host_if: format!("wlab{u}h"),
            table: 41000 + u,
            rules: Vec::new(),
            routes: Vec::new(),
            server: None,
            dns_stop,
            dns_thread: Some(dns_thread),
            dns_log,
            dns,
            node_addr: Ipv4Addr::new(192, 0, 2, 1 + u as u8),
            sandbox_net: format!("100.127.{u}.0/24"),
            prefix: format!("tl{u}"),
            private_service: Ipv4Addr::new(10, 200, u as u8, 20),
            _dir: dir,
        };
        lab.build().context("building the network lab")?;
        Ok(lab)
    }

    fn build(&mut self) -> anyhow::Result<()> {
        let (ns, hif, table) = (self.ns.clone(), self.host_if.clone(), self.table.to_string());
        let node = self.node_addr.to_string();
        ip(&["link", "add", &hif, "type", "veth", "peer", "name", "lab0", "netns", &ns])?;
        ip(&["addr", "add", &format!("{node}/32"), "dev", &hif])?;
        ip(&["link", "set", &hif, "up"])?;
        let inside = |args: &[&str]| -> anyhow::Result<()> {
            let mut full = vec!["netns", "exec", &ns, "ip"];
            full.extend_from_slice(args);
            ip(&full)
        };
        inside(&["link", "set", "lo", "up"])?;
        let service = format!("{}/32", self.private_service);
        for addr in ["198.51.100.10/24", "198.51.100.11/24", "10.200.0.10/24", "169.254.169.254/32", &service] {
            inside(&["addr", "add", addr, "dev", "lab0"])?;
        }
        inside(&["link", "set", "lab0", "up"])?;
        inside(&["route", "add", &format!("{node}/32"), "dev", "lab0"])?;
        for dst in ["198.51.100.0/24", "10.200.0.0/24", "169.254.169.254/32"] {
            ip(&["route", "add", dst, "dev", &hif, "table", &table])?;
        }
        ip(&["route", "add", "unreachable", "default", "table", &table])?;
        // The one lab address the node itself reaches (unique per lab, so
        // parallel labs never share the route).
        ip(&["route", "add", &service, "dev", &hif])?;
        self.routes.push(service.clone());
        // The node's lab address takes the lab's table (below): it needs the route too.
        ip(&["route", "add", &service, "dev", &hif, "table", &table])?;
        // Sandbox traffic takes the lab's table; so does the reverse-path
        // check of the replies (addressed to the node's lab address).
        for (from, prio) in [(self.sandbox_net.clone(), 20000 + self.table % 1000), (format!("{node}/32"), 21000 + self.table % 1000)] {
            ip(&["rule", "add", "from", &from, "lookup", &table, "priority", &prio.to_string()])?;
            self.rules.push(format!("from {from} lookup {table} priority {prio}"));
        }
        let dir = self._dir.path().to_string_lossy().into_owned();
        let server = Command::new("ip")
            .args(["netns", "exec", &ns, "python3", "-m", "http.server", "80", "--bind", "0.0.0.0", "--directory", &dir])
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .context("starting the lab's HTTP server")?;
        self.server = Some(server);
        self.wait_serving()
    }

    fn wait_serving(&self) -> anyhow::Result<()> {
        let deadline = Instant::now() + Duration::from_secs(20);
        let probe = "import socket; socket.create_connection(('198.51.100.10', 80), timeout=1).close()";
        while Instant::now() < deadline {
            if run("ip", &["netns", "exec", &self.ns, "python3", "-c", probe]).is_ok() {
                return Ok(());
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        bail!("the lab's HTTP server did not start")
    }

    /// Agent flags that point it at this lab.
    pub fn agent_args(&self) -> Vec<String> {
        vec![
            "--sandbox-network".into(),
            self.sandbox_net.clone(),
            "--network-prefix".into(),
            self.prefix.clone(),
            "--dns-upstream".into(),
            self.dns.to_string(),
        ]
    }

    /// Interfaces of this lab's agent present now (sandbox veths).
    pub fn sandbox_links(&self) -> Vec<String> {
        let Ok(dir) = std::fs::read_dir("/sys/class/net") else { return Vec::new() };
        dir.filter_map(|e| e.ok()?.file_name().into_string().ok())
            .filter(|n| n.strip_prefix(&self.prefix).is_some_and(|rest| !rest.is_empty() && rest.bytes().all(|b| b.is_ascii_digit())))
            .collect()
    }

    /// Per-sandbox chains and sets in the agent's table now.
    pub fn sandbox_rules(&self) -> Vec<String> {
        let out = Command::new("nft").args(["list", "table", "inet", &format!("warren_{}", self.prefix)]).output();
        let text = out.map(|o| String::from_utf8_lossy(&o.stdout).into_owned()).unwrap_or_default();
        text.lines()
            .map(str::trim)
            .filter(|l| ["chain sbx_", "set blk_", "set any_", "set port_", "set dany_", "set dport_"].iter().any(|p| l.starts_with(p)))
            .map(str::to_string)
            .collect()
    }

    /// Starts a UDP echo host at `198.51.100.11:port` inside the lab; every
    /// datagram it receives is appended (one line each) to the returned file.
    pub fn udp_echo(&self, port: u16) -> anyhow::Result<std::path::PathBuf> {
        let log = self._dir.path().join(format!("udp-{port}.log"));
        let code = format!(
            "import socket\ns = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)\ns.bind(('198.51.100.11', {port}))\n\
             while True:\n    d, peer = s.recvfrom(2048)\n    open({log:?}, 'ab').write(d + b'\\n')\n    s.sendto(d, peer)\n",
            log = log.to_string_lossy()
        );
        // Killed with everything else in the namespace on drop.
        Command::new("ip").args(["netns", "exec", &self.ns, "python3", "-c", &code]).stdin(Stdio::null()).stdout(Stdio::null()).stderr(Stdio::null()).spawn()?;
        let probe = format!("import socket; s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM); s.settimeout(1); s.sendto(b'probe', ('198.51.100.11', {port})); s.recv(16)");
        let deadline = Instant::now() + Duration::from_secs(20);
        while Instant::now() < deadline {
            if run("ip", &["netns", "exec", &self.ns, "python3", "-c", &probe]).is_ok() {
                return Ok(log);
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        bail!("the lab's UDP echo host did not start")
    }

    /// Every message the lab's DNS server received so far, as received.
    pub fn dns_log(&self) -> Vec<Vec<u8>> {
        self.dns_log.lock().unwrap_or_else(|p| p.into_inner()).clone()
    }

    /// Whether the agent's table exists.
    pub fn table_exists(&self) -> bool {
        Command::new("nft").args(["list", "table", "inet", &format!("warren_{}", self.prefix)]).output().is_ok_and(|o| o.status.success())
    }
}

impl Drop for NetLab {
    fn drop(&mut self) {
        if let Some(mut s) = self.server.take() {
            let _ = s.kill();
            let _ = s.wait();
        }
        // `ip netns exec` forks python: kill whatever still runs in the namespace.
        if let Ok(out) = Command::new("ip").args(["netns", "pids", &self.ns]).output() {
            for pid in String::from_utf8_lossy(&out.stdout).split_whitespace() {
                let _ = Command::new("kill").args(["-9", pid]).status();
            }
        }
        for rule in &self.rules {
            let mut args = vec!["rule", "del"];
            args.extend(rule.split(' '));
            let _ = ip(&args);
        }
        let _ = ip(&["route", "flush", "table", &self.table.to_string()]);
        for r in &self.routes {
            let _ = ip(&["route", "del", r]);
        }
        let _ = ip(&["link", "del", &self.host_if]);
        let _ = ip(&["netns", "del", &self.ns]);
        // A test that failed before its agent stopped leaves the agent's table.
        let _ = run("nft", &["delete", "table", "inet", &format!("warren_{}", self.prefix)]);
        self.dns_stop.store(true, Ordering::Relaxed);
        if let Some(t) = self.dns_thread.take() {
            let _ = t.join();
        }
    }
}

/// Claims a lab number by creating its namespace (atomic across the
/// parallel test processes: `ip netns add` fails when it exists).
fn claim_namespace() -> anyhow::Result<u32> {
    let start = crate::unique_number() % 200;
    for i in 0..200 {
        let u = (start + i) % 200;
        if ip(&["netns", "add", &format!("wlab{u}")]).is_ok() {
            return Ok(u);
        }
    }
    bail!("no free lab namespace (wlab0–wlab199 all exist; leftovers of killed test runs can be removed with `ip netns del`)")
}

/// The lab's names (see the module doc).
fn lab_answer(name: &str, rebinds: &AtomicU64) -> Option<Ipv4Addr> {
    match name {
        "public.test" => Some(Ipv4Addr::new(198, 51, 100, 10)),
        "other.test" => Some(Ipv4Addr::new(198, 51, 100, 11)),
        "private.test" => Some(Ipv4Addr::new(10, 200, 0, 10)),
        "metadata.test" => Some(Ipv4Addr::new(169, 254, 169, 254)),
        "rebind.test" => Some(if rebinds.fetch_add(1, Ordering::Relaxed) % 2 == 0 { Ipv4Addr::new(198, 51, 100, 10) } else { Ipv4Addr::new(10, 200, 0, 10) }),
        _ => None,
    }
}

type DnsServer = (SocketAddr, Arc<AtomicBool>, std::thread::JoinHandle<()>, Arc<std::sync::Mutex<Vec<Vec<u8>>>>);

fn dns_server() -> anyhow::Result<DnsServer> {
    let socket = UdpSocket::bind("127.0.0.1:0")?;
    socket.set_read_timeout(Some(Duration::from_millis(100)))?;
    let addr = socket.local_addr()?;
    let stop = Arc::new(AtomicBool::new(false));
    let stopped = stop.clone();
    let log = Arc::new(std::sync::Mutex::new(Vec::new()));
    let logged = log.clone();
    let thread = std::thread::spawn(move || {
        let rebinds = AtomicU64::new(0);
        let mut buf = [0u8; 1500];
        while !stopped.load(Ordering::Relaxed) {
            let Ok((n, peer)) = socket.recv_from(&mut buf) else { continue };
            if let Ok(mut l) = logged.lock() {
                if l.len() < 10_000 {
                    l.push(buf[..n].to_vec());
                }
            }
            let Ok(q) = Message::from_vec(&buf[..n]) else { continue };
            let Some(query) = q.queries().first().cloned() else { continue };
            let name = query.name().to_ascii().trim_end_matches('.').to_ascii_lowercase();
            let mut m = Message::new();
            m.set_id(q.id()).set_message_type(MessageType::Response).set_op_code(q.op_code()).set_recursion_desired(q.recursion_desired()).set_recursion_available(true);
            m.add_query(query.clone());
            match lab_answer(&name, &rebinds) {
                Some(addr) if query.query_type() == RecordType::A => {
                    m.add_answer(Record::from_rdata(query.name().clone(), 0, RData::A(addr.into())));
                }
                Some(_) => {}
                None => {
                    m.set_response_code(ResponseCode::NXDomain);
                }
            }
            if let Ok(bytes) = m.to_vec() {
                let _ = socket.send_to(&bytes, peer);
            }
        }
    });
    Ok((addr, stop, thread, log))
}
