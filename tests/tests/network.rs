//! Sandbox networking against hosts of our own (see `warren_e2e::netlab`):
//! `Unrestricted` reaches public test hosts and nothing private, local or
//! of the node; `Blocked` reaches nothing; allowlists by name and CIDR;
//! refused destinations are reported; bandwidth is shaped; nothing is left
//! behind after a call or after the agent stops.

use std::time::Duration;

use warren_e2e::netlab::{NetLab, BIG_BYTES};
use warren_e2e::{request, skip_unless_root, Agent, Run};
use warren_proto::agent::{self as pb, EgressRule, ExecuteRequest, Language, NetworkPolicy};

/// Python prelude: `tcp(host, port)` prints OPEN or the errno name.
const PY: &str = r#"
import errno, socket, sys, time, urllib.request
def tcp(label, host, port=80, family=socket.AF_INET):
    try:
        addr = socket.getaddrinfo(host, port, family, socket.SOCK_STREAM)[0][4]
        s = socket.socket(family, socket.SOCK_STREAM); s.settimeout(5); s.connect(addr); s.close()
        print(label, "OPEN")
    except socket.gaierror as e:
        print(label, "NORESOLVE")
    except OSError as e:
        print(label, errno.errorcode.get(e.errno, type(e).__name__))
def get(label, url):
    try:
        print(label, urllib.request.urlopen(url, timeout=5).read().decode().strip())
    except Exception as e:
        print(label, "FAILED", type(e).__name__)
"#;

async fn start(lab: &NetLab, pool: &str) -> anyhow::Result<Agent> {
    let mut args: Vec<String> = lab.agent_args();
    args.extend(["--pool-size".to_string(), pool.to_string()]);
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    Agent::start(&args).await
}

fn python(code: &str, network: NetworkPolicy, egress: Vec<EgressRule>) -> ExecuteRequest {
    ExecuteRequest { network: network as i32, egress, ..request(Language::Python, &format!("{PY}\n{code}"), Duration::from_secs(60)) }
}

fn refused<'a>(run: &'a Run, ip: &str, port: u32) -> Option<&'a pb::BlockedEgress> {
    run.exited.blocked_egress.iter().find(|b| b.ip == ip && b.port == port)
}

/// After a call: no veth, chain or set beyond those of the pool's ready
/// sandboxes (a chain and up to five sets each).
async fn assert_clean(lab: &NetLab, pooled: usize) {
    let clean = || {
        let rules = lab.sandbox_rules();
        let chains = rules.iter().filter(|r| r.starts_with("chain ")).count();
        lab.sandbox_links().len() <= pooled && chains <= pooled && rules.len() - chains <= 5 * chains
    };
    // Teardown runs right after the answer; a veth leaves with its
    // sandbox's namespace when the kernel's cleanup gets to it, which takes
    // longer on a loaded machine. Bounded only so a leak fails the test.
    for _ in 0..1200 {
        if clean() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
    assert!(clean(), "left behind: {:?} {:?}", lab.sandbox_links(), lab.sandbox_rules());
}

#[tokio::test]
async fn unrestricted_reaches_public_hosts_and_nothing_private_local_or_of_the_node() -> anyhow::Result<()> {
    if skip_unless_root("unrestricted_reaches_public_hosts_and_nothing_private_local_or_of_the_node") {
        return Ok(());
    }
    let lab = NetLab::start()?;
    let mut agent = start(&lab, "0").await?;
    // A listener on every address of the node: none may be reachable.
    let node_listener = std::net::TcpListener::bind("0.0.0.0:0")?;
    let node_port = node_listener.local_addr()?.port();
    let code = format!(
        r#"
get("public-ip", "http://198.51.100.10/")
get("public-name", "http://public.test/")
tcp("private-ip", "10.200.0.10")
tcp("private-name", "private.test")
tcp("metadata-ip", "169.254.169.254")
tcp("metadata-name", "metadata.test")
tcp("rebind-1", "rebind.test")
tcp("rebind-2", "rebind.test")
tcp("node-lab", "{node}", {node_port})
gw = [l.split() for l in open("/proc/net/route").read().splitlines()[1:]]
gw = [socket.inet_ntoa(bytes.fromhex(f[2])[::-1]) for f in gw if f[1] == "00000000"][0]
tcp("node-gateway", gw, {node_port})
tcp("v6-loopback", "::1", 80, socket.AF_INET6)
tcp("v6-metadata", "fd00:ec2::254", 80, socket.AF_INET6)
tcp("v4-mapped", "::ffff:10.200.0.10", 80, socket.AF_INET6)
"#,
        node = lab.node_addr
    );
    let run = agent.run_request(python(&code, NetworkPolicy::Unrestricted, vec![])).await?;
    assert_eq!(run.exited.exit_code, 0, "{}\n{}", run.stdout, run.stderr);
    assert_eq!(run.line("public-ip"), "warren-lab");
    assert_eq!(run.line("public-name"), "warren-lab");
    for label in ["private-ip", "private-name", "metadata-ip", "metadata-name", "node-lab", "node-gateway"] {
        assert_ne!(run.line(label), "OPEN", "{label} must be unreachable:\n{}", run.stdout);
    }
    // The name rebinding to a private address: the public answer works, the private one does not.
    assert_eq!(run.line("rebind-1"), "OPEN");
    assert_ne!(run.line("rebind-2"), "OPEN");
    for label in ["v6-loopback", "v6-metadata", "v4-mapped"] {
        assert_ne!(run.line(label), "OPEN", "{label}:\n{}", run.stdout);
    }
    // Refused destinations are reported, named by what the program resolved.
    let private = refused(&run, "10.200.0.10", 80).unwrap_or_else(|| panic!("{:?}", run.exited.blocked_egress));
    assert_eq!(private.protocol, "tcp");
    assert!(private.count >= 3, "ip, name and rebind attempts: {private:?}");
    assert!(["private.test", "rebind.test"].contains(&private.host.as_str()), "{private:?}");
    assert_eq!(refused(&run, "169.254.169.254", 80).map(|b| b.host.as_str()), Some("metadata.test"));
    assert!(refused(&run, "198.51.100.10", 80).is_none());
    drop(node_listener);
    assert_clean(&lab, 0).await;
    agent.stop();
    assert!(!lab.table_exists(), "the agent removes its table when it stops");
    Ok(())
}

#[tokio::test]
async fn blocked_reaches_nothing_and_allowlists_hold_by_name_cidr_and_port() -> anyhow::Result<()> {
    if skip_unless_root("blocked_reaches_nothing_and_allowlists_hold_by_name_cidr_and_port") {
        return Ok(());
    }
    let lab = NetLab::start()?;
    let mut agent = start(&lab, "1").await?;
    let code = r#"
tcp("public-ip", "198.51.100.10")
tcp("public-name", "public.test")
"#;
    let blocked = agent.run_request(python(code, NetworkPolicy::Blocked, vec![])).await?;
    assert_eq!(blocked.line("public-ip"), "ENETUNREACH");
    assert_eq!(blocked.line("public-name"), "NORESOLVE");
    assert!(blocked.exited.blocked_egress.is_empty());

    let allow = vec![
        EgressRule { host: "public.test".into(), ports: vec![80] },
        EgressRule { host: "198.51.100.11/32".into(), ports: vec![] },
    ];
    let code = r#"
get("name-allowed", "http://public.test/")
tcp("name-other-port", "public.test", 8080)
tcp("name-not-listed", "other.test")
tcp("cidr-allowed", "198.51.100.11")
tcp("private", "10.200.0.10")
"#;
    let run = agent.run_request(python(code, NetworkPolicy::Unrestricted, allow.clone())).await?;
    assert_eq!(run.line("name-allowed"), "warren-lab", "{}", run.stderr);
    assert_ne!(run.line("name-other-port"), "OPEN");
    assert_eq!(run.line("name-not-listed"), "NORESOLVE", "names outside the allowlist are not even looked up");
    assert_eq!(run.line("cidr-allowed"), "OPEN");
    assert_ne!(run.line("private"), "OPEN");
    let dns = run.exited.blocked_egress.iter().find(|b| b.protocol == "dns").unwrap_or_else(|| panic!("{:?}", run.exited.blocked_egress));
    assert_eq!((dns.host.as_str(), dns.ip.as_str(), dns.port), ("other.test", "", 53));
    assert_eq!(refused(&run, "198.51.100.10", 8080).map(|b| b.host.as_str()), Some("public.test"));

    // The allowlist binds addresses, not names: a program connecting by the
    // address of an allowed name (without asking the resolver) gets nothing
    // it was not given.
    let run = agent.run_request(python(r#"tcp("raw-ip-before-dns", "198.51.100.10")"#, NetworkPolicy::Unrestricted, allow)).await?;
    assert_ne!(run.line("raw-ip-before-dns"), "OPEN");
    assert!(refused(&run, "198.51.100.10", 80).is_some());
    assert_clean(&lab, 1).await;
    agent.stop();
    assert!(lab.sandbox_links().is_empty() && !lab.table_exists());
    Ok(())
}

#[tokio::test]
async fn bandwidth_is_shaped_per_cpu() -> anyhow::Result<()> {
    if skip_unless_root("bandwidth_is_shaped_per_cpu") {
        return Ok(());
    }
    let lab = NetLab::start()?;
    let mut agent = start(&lab, "0").await?;
    // Half a CPU: 100 Mbit/s each way.
    let code = r#"
t = time.monotonic()
n = len(urllib.request.urlopen("http://198.51.100.10/big", timeout=60).read())
print("bytes", n)
print("mbits", n * 8 / (time.monotonic() - t) / 1e6)
"#;
    let mut req = python(code, NetworkPolicy::Unrestricted, vec![]);
    req.limits = Some(pb::Limits { cpu_millis: 500, ..Default::default() });
    let run = agent.run_request(req).await?;
    assert_eq!(run.line("bytes"), BIG_BYTES.to_string(), "{}", run.stderr);
    let mbits: f64 = run.line("mbits").parse()?;
    eprintln!("download at 500m CPU: {mbits:.1} Mbit/s (cap 100)");
    // The token bucket lets a burst through at line rate; over 24 MiB that
    // is a few percent. Unshaped, a veth moves several Gbit/s.
    assert!(mbits <= 110.0, "{mbits:.1} Mbit/s exceeds the 100 Mbit/s cap");
    assert_clean(&lab, 0).await;
    agent.stop();
    Ok(())
}

#[tokio::test]
async fn the_http_result_says_blocked_and_keys_narrow_the_sandboxs_allowlist() -> anyhow::Result<()> {
    if skip_unless_root("the_http_result_says_blocked_and_keys_narrow_the_sandboxs_allowlist") {
        return Ok(());
    }
    let lab = NetLab::start()?;
    let mut agent = start(&lab, "0").await?;
    let gw = warren_e2e::gateway::Gateway::start(&[agent.address()], &[], true).await?;
    let key = warren_e2e::gateway::key;
    let body = |code: &str| serde_json::json!({"language": "python", "code": format!("{PY}\n{code}")});
    // The program fails because the policy refused it: `blocked`, and where.
    let r = gw.execute(&key("net"), &body("tcp('private', '10.200.0.10'); sys.exit(1)")).json();
    assert_eq!((r["success"].as_bool(), r["error"].as_str()), (Some(false), Some("blocked")), "{r}");
    let refused = &r["blocked_egress"][0];
    assert_eq!((refused["ip"].as_str(), refused["port"].as_u64(), refused["protocol"].as_str()), (Some("10.200.0.10"), Some(80), Some("tcp")), "{r}");
    // The record keeps it, for the async result and the console's page.
    let trace = r["trace_id"].as_str().unwrap_or_default();
    let record = gw.record_when("net", trace, |v| v["status"] == "blocked");
    assert_eq!(record["blocked_egress"], r["blocked_egress"], "{record}");
    // The Sandbox's allowlist, whole; then as the narrowing key has it.
    let both = "get('public', 'http://public.test/'); tcp('other', 'other.test')";
    let r = gw.execute(&key("net"), &body(both)).json();
    assert_eq!((r["success"].as_bool(), r["stdout"].as_str()), (Some(true), Some("public warren-lab\nother OPEN\n")), "{r}");
    assert!(r.get("blocked_egress").is_none(), "{r}");
    let r = gw.execute(&key("netnarrow"), &body(both)).json();
    assert_eq!(r["stdout"].as_str(), Some("public warren-lab\nother NORESOLVE\n"), "{r}");
    assert_eq!((r["blocked_egress"][0]["host"].as_str(), r["blocked_egress"][0]["protocol"].as_str()), (Some("other.test"), Some("dns")), "{r}");
    // A key that downgrades to Blocked: nothing reachable, nothing to report.
    let r = gw.execute(&key("netoff"), &body("tcp('public', '198.51.100.10')")).json();
    assert_eq!(r["stdout"].as_str(), Some("public ENETUNREACH\n"), "{r}");
    assert!(r.get("blocked_egress").is_none(), "{r}");
    drop(gw);
    assert_clean(&lab, 0).await;
    agent.stop();
    Ok(())
}

#[tokio::test]
async fn an_agent_crash_leaves_no_veth_and_the_next_start_no_rules() -> anyhow::Result<()> {
    if skip_unless_root("an_agent_crash_leaves_no_veth_and_the_next_start_no_rules") {
        return Ok(());
    }
    let lab = NetLab::start()?;
    let mut agent = start(&lab, "2").await?;
    let run = agent.run_request(python(r#"get("public", "http://198.51.100.10/")"#, NetworkPolicy::Unrestricted, vec![])).await?;
    assert_eq!(run.line("public"), "warren-lab");
    // The pool refills the shape: two ready sandboxes with their veths and chains.
    let chains = || lab.sandbox_rules().iter().filter(|r| r.starts_with("chain ")).count();
    let filled = warren_e2e::gateway::wait_for(Duration::from_secs(30), || lab.sandbox_links().len() == 2 && chains() == 2);
    assert!(filled, "pool did not fill (or the call's sandbox was not torn down): {:?} {:?}", lab.sandbox_links(), lab.sandbox_rules());
    agent.kill_hard();
    // Each sandbox's supervisor kills it when the agent goes; its network
    // namespace, and with it the veth pair, goes too.
    let gone = warren_e2e::gateway::wait_for(Duration::from_secs(30), || lab.sandbox_links().is_empty());
    assert!(gone, "veths outlived the agent: {:?}", lab.sandbox_links());
    // The chains outlive a crash only until the next start replaces the table.
    let mut again = start(&lab, "0").await?;
    assert!(lab.table_exists());
    assert!(lab.sandbox_rules().is_empty(), "{:?}", lab.sandbox_rules());
    again.stop();
    assert!(!lab.table_exists());
    Ok(())
}

#[tokio::test]
async fn a_connector_is_the_only_way_from_unrestricted_to_a_private_address() -> anyhow::Result<()> {
    if skip_unless_root("a_connector_is_the_only_way_from_unrestricted_to_a_private_address") {
        return Ok(());
    }
    let lab = NetLab::start()?;
    let mut agent = start(&lab, "0").await?;
    // A service on the node's loopback, reached by a name below `localhost`.
    let dir = tempfile::tempdir()?;
    std::fs::write(dir.path().join("index.html"), "node-local\n")?;
    let port = std::net::TcpListener::bind("127.0.0.1:0")?.local_addr()?.port();
    let mut local = std::process::Command::new("python3")
        .args(["-m", "http.server", &port.to_string(), "--bind", "127.0.0.1", "--directory"])
        .arg(dir.path())
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()?;
    let serving = warren_e2e::gateway::wait_for(Duration::from_secs(20), || std::net::TcpStream::connect(("127.0.0.1", port)).is_ok());
    assert!(serving, "local HTTP server did not start");
    let private = lab.private_service.to_string();
    assert!(std::net::TcpStream::connect((lab.private_service, 80)).is_ok(), "the node reaches the lab's private service");
    let grant = |name: &str, host: &str, port: u16| pb::ConnectorGrant {
        name: name.into(),
        kind: "redis".into(),
        host: host.into(),
        port: port.into(),
        credentials: Some(pb::Credentials { values: [("password".to_string(), "unused".to_string())].into() }),
        ..Default::default()
    };
    let code = format!(
        r#"
get("private-connector", "http://{private}/")
tcp("private-other", "10.200.0.10")
get("named-connector", "http://web.localhost:{port}/")
get("public", "http://198.51.100.10/")
"#
    );
    let mut req = python(&code, NetworkPolicy::Unrestricted, vec![]);
    req.connectors = vec![grant("lab", &private, 80), grant("web", "web.localhost", port)];
    let run = agent.run_request(req).await;
    let _ = local.kill();
    let _ = local.wait();
    let run = run?;
    assert_eq!(run.line("private-connector"), "warren-lab", "through the forwarder: {}", run.stderr);
    assert_ne!(run.line("private-other"), "OPEN", "other private addresses stay refused");
    assert_eq!(run.line("named-connector"), "node-local", "the sandbox's resolver answers the connector's name");
    assert_eq!(run.line("public"), "warren-lab", "the rest of the network is as Unrestricted as ever");
    assert_clean(&lab, 0).await;
    agent.stop();
    Ok(())
}

/// The attack: a sandbox in a reused slot (same address, same interface
/// name) sends from the source port its predecessor used, to a host its own
/// allowlist refuses. The predecessor's connection is still in conntrack;
/// before connections were marked per sandbox, "established" let the packet
/// out around the allowlist.
#[tokio::test]
async fn a_reused_slot_inherits_none_of_its_predecessors_connections() -> anyhow::Result<()> {
    if skip_unless_root("a_reused_slot_inherits_none_of_its_predecessors_connections") {
        return Ok(());
    }
    let lab = NetLab::start()?;
    let log = lab.udp_echo(5300)?;
    let mut agent = start(&lab, "0").await?;
    let send = |payload: &str| {
        format!(
            r#"
s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
s.bind(("0.0.0.0", 40404)); s.settimeout(2)
s.connect(("198.51.100.11", 5300))
print("address", s.getsockname()[0])
try:
    s.send(b"{payload}"); print("echo", s.recv(64).decode())
except OSError as e:
    print("echo", errno.errorcode.get(e.errno, type(e).__name__))
"#
        )
    };
    let first = agent.run_request(python(&send("first"), NetworkPolicy::Unrestricted, vec![])).await?;
    assert_eq!(first.line("echo"), "first", "the open sandbox reaches the host: {}", first.stderr);
    // The slot is free once the first sandbox is gone (veth and cgroup);
    // every attempt is an attack, and at least one must land in that slot.
    let mut same_slot = 0;
    for attempt in 0..5 {
        assert_clean(&lab, 0).await;
        for _ in 0..200 {
            if agent.leftover_cgroups().is_empty() {
                break;
            }
            tokio::time::sleep(Duration::from_millis(25)).await;
        }
        let allow = vec![EgressRule { host: "198.51.100.10/32".into(), ports: vec![80] }];
        let second = agent.run_request(python(&send(&format!("second{attempt}")), NetworkPolicy::Unrestricted, allow)).await?;
        assert_ne!(second.line("echo"), format!("second{attempt}"), "the allowlist holds on a flow the slot's previous sandbox opened");
        assert!(refused(&second, "198.51.100.11", 5300).is_some(), "and it is reported: {:?}", second.exited.blocked_egress);
        if second.line("address") == first.line("address") {
            same_slot += 1;
            break;
        }
    }
    assert!(same_slot > 0, "no attempt took the first sandbox's slot: the test proved nothing");
    let received = std::fs::read_to_string(&log)?;
    assert!(!received.contains("second"), "a refused datagram reached the host: {received:?}");
    assert_clean(&lab, 0).await;
    agent.stop();
    Ok(())
}

/// The attacks on the sandbox's resolver: a query for an allowed name that
/// carries extra records or EDNS options full of data, and UPDATE, NOTIFY,
/// IQUERY, STATUS and DSO messages naming that name (with a resolver that
/// accepts updates, an UPDATE re-pointed the allowed name). The lab's
/// resolver logs every message it receives: none of the program's bytes
/// may reach it, only plain questions the proxy built.
#[tokio::test]
async fn the_dns_proxy_relays_nothing_it_did_not_build() -> anyhow::Result<()> {
    if skip_unless_root("the_dns_proxy_relays_nothing_it_did_not_build") {
        return Ok(());
    }
    let lab = NetLab::start()?;
    let mut agent = start(&lab, "0").await?;
    let code = r#"
import struct
def qname(n): return b''.join(bytes([len(l)]) + l.encode() for l in n.split('.')) + b'\0'
def msg(opcode, name, qtype=1, an=b'', ancount=0, ar=b'', arcount=0):
    hdr = struct.pack('>HHHHHH', 0x1234, (opcode << 11) | 0x100, 1, ancount, 0, arcount)
    return hdr + qname(name) + struct.pack('>HH', qtype, 1) + an + ar
def ask(label, m):
    s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM); s.settimeout(3)
    s.sendto(m, ('127.0.0.1', 53))
    try:
        r = s.recv(4096)
        print(label, r[3] & 0xf, struct.unpack('>H', r[6:8])[0], b'SMUGGLED' in r)
    except socket.timeout:
        print(label, 'TIMEOUT')
extra = qname('x.public.test') + struct.pack('>HHIH', 16, 1, 0, 15) + bytes([14]) + b'SMUGGLED-EXTRA'
opt = b'\0' + struct.pack('>HHIH', 41, 1232, 0, 4 + 13) + struct.pack('>HH', 65001, 13) + b'SMUGGLED-EDNS'
update = qname('public.test') + struct.pack('>HHIH', 1, 1, 60, 4) + bytes([198, 51, 100, 11])
ask('plain', msg(0, 'PuBlIc.TeSt'))
ask('extra', msg(0, 'public.test', ar=extra, arcount=1))
ask('edns', msg(0, 'public.test', ar=opt, arcount=1))
ask('answer-section', msg(0, 'public.test', an=update, ancount=1))
for label, op in [('iquery', 1), ('status', 2), ('notify', 4), ('update', 5), ('dso', 6)]:
    ask(label, msg(op, 'public.test', qtype=6, an=update, ancount=1))
ask('axfr', msg(0, 'public.test', qtype=252))
ask('smuggled-name', msg(0, 'SMUGGLED.public.test'))
"#;
    let allow = vec![EgressRule { host: "public.test".into(), ports: vec![80] }];
    let run = agent.run_request(python(code, NetworkPolicy::Unrestricted, allow)).await?;
    assert_eq!(run.exited.exit_code, 0, "{}\n{}", run.stdout, run.stderr);
    // rcode, answers, whether the reply echoed smuggled bytes.
    assert_eq!(run.line("plain"), "0 1 False");
    assert_eq!(run.line("edns"), "0 1 False", "an EDNS option is dropped, not relayed");
    assert_eq!(run.line("extra"), "1 0 False", "extra records: FORMERR");
    assert_eq!(run.line("answer-section"), "1 0 False");
    for label in ["iquery", "status", "notify", "update", "dso"] {
        assert_eq!(run.line(label), "4 0 False", "{label}: NOTIMP");
    }
    assert_eq!(run.line("axfr"), "5 0 False", "zone transfers: REFUSED");
    assert!(run.line("smuggled-name").starts_with("5 0 "), "a name outside the allowlist: REFUSED: {}", run.line("smuggled-name"));
    let received = lab.dns_log();
    assert!(!received.is_empty(), "the allowed lookups reached the resolver");
    for m in &received {
        assert!(!m.windows(8).any(|w| w.eq_ignore_ascii_case(b"SMUGGLED")), "the program's bytes reached the resolver: {m:?}");
        let header = |i: usize| u16::from_be_bytes([m[i], m[i + 1]]);
        assert_eq!((m[2] >> 3) & 0xf, 0, "opcode QUERY only: {m:?}");
        assert_eq!((header(4), header(6), header(8)), (1, 0, 0), "one question, no answer or authority records: {m:?}");
        assert!(header(10) <= 1, "at most the proxy's own OPT: {m:?}");
        let parsed = hickory_proto::op::Message::from_vec(m)?;
        assert!(parsed.extensions().as_ref().is_none_or(|e| e.options().as_ref().is_empty()), "no EDNS option: {m:?}");
        assert_eq!(parsed.queries()[0].name().to_ascii(), "public.test.", "the decided name, lower-cased");
    }
    agent.stop();
    Ok(())
}
