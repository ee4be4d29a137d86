//! Connectors against real servers on this machine (PostgreSQL, MariaDB,
//! Redis from Debian, S3 via s3s-fs, Azure Blob via Azurite), with the real
//! client tools inside the sandbox: credentials appear as the files and
//! variables the tools read, endpoints are reached through the agent's
//! forwarders from a `Blocked` sandbox, and PostgreSQL custody keeps every
//! secret out of the sandbox.

use std::time::Duration;

use warren_e2e::services::{self, MariaDb, Postgres, Redis};
use warren_e2e::{request, skip_unless_root, Agent};
use warren_proto::agent::{ConnectorGrant, Credentials, ExecuteRequest, Language};

fn creds(kv: &[(&str, &str)]) -> Option<Credentials> {
    Some(Credentials { values: kv.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect() })
}

fn grant(name: &str, kind: &str, host: &str, port: u16, kv: &[(&str, &str)]) -> ConnectorGrant {
    ConnectorGrant { name: name.into(), kind: kind.into(), host: host.into(), port: port.into(), credentials: creds(kv), ..Default::default() }
}

fn python(code: &str, connectors: Vec<ConnectorGrant>) -> ExecuteRequest {
    ExecuteRequest { connectors, ..request(Language::Python, code, Duration::from_secs(60)) }
}

/// Mounts of the agent's connector dirs present on the host now.
fn connector_mounts() -> usize {
    std::fs::read_to_string("/proc/self/mountinfo").unwrap_or_default().lines().filter(|l| l.contains(".conn ")).count()
}

const TOOLS: &str = r#"
import json, os, socket, subprocess, sys, urllib.parse, urllib.request
def sh(label, cmd):
    p = subprocess.run(cmd, shell=True, capture_output=True, text=True, timeout=30)
    print(label, (p.stdout.strip() or "ERR " + p.stderr.strip().replace("\n", " | ")))
"#;

#[tokio::test]
async fn the_standard_tools_work_with_no_flags_through_forwarders_from_a_blocked_sandbox() -> anyhow::Result<()> {
    if skip_unless_root("the_standard_tools_work_with_no_flags_through_forwarders_from_a_blocked_sandbox") {
        return Ok(());
    }
    let (pg, my, redis) = (Postgres::start()?, MariaDb::start()?, Redis::start()?);
    let s3 = warren_e2e::s3::S3Server::start()?;
    s3.put("reports/q3.csv", b"from-s3");
    let azurite = warren_e2e::azurite::Azurite::start()?;
    let agent = Agent::start(&[]).await?;
    let s3_creds: Vec<(String, String)> = s3.credentials();
    let az_key = azurite.secret_key();
    let az = format!("DefaultEndpointsProtocol=http;AccountName={};AccountKey={az_key};BlobEndpoint={};", warren_e2e::azurite::ACCOUNT, azurite.endpoint());
    let connectors = vec![
        ConnectorGrant { database: "app".into(), username: "agent".into(), ..grant("pg", "postgresql", "pg.localhost", pg.port, &[("password", services::PG_PASSWORD)]) },
        ConnectorGrant { database: "app".into(), username: "agent".into(), ..grant("my", "mysql", "127.0.0.1", my.port, &[("password", services::MYSQL_PASSWORD)]) },
        grant("cache", "redis", "localhost", redis.port, &[("password", services::REDIS_PASSWORD)]),
        ConnectorGrant {
            endpoint: s3.endpoint(),
            region: "us-east-1".into(),
            ..grant("lake", "s3", "", 0, &[("accessKeyId", &s3_creds[0].1), ("secretAccessKey", &s3_creds[1].1)])
        },
        grant("blob", "azure", "", 0, &[("connectionString", &az)]),
        grant("gh", "github", "", 0, &[("token", "ghp_test_token")]),
    ];
    let code = format!(
        r#"{TOOLS}
sh("psql", "psql -tAc 'select body from notes'")
sh("mysql", "mysql -N -e 'select body from notes'")
sh("redis", 'redis-cli -h "$REDIS_HOST" -p "$REDIS_PORT" --no-auth-warning GET greeting')
import boto3
s3 = boto3.session.Session().client("s3", endpoint_url=os.environ["AWS_ENDPOINT_URL"])
print("s3", s3.get_object(Bucket="{bucket}", Key="reports/q3.csv")["Body"].read().decode())
cs = dict(kv.split("=", 1) for kv in os.environ["AZURE_STORAGE_CONNECTION_STRING"].split(";") if kv)
import base64, hashlib, hmac, email.utils
now = email.utils.formatdate(usegmt=True)
# Path-style endpoints (the emulator's) sign the account name twice: /account/<url path>.
path = "/" + cs["AccountName"] + urllib.parse.urlparse(cs["BlobEndpoint"]).path + "/{container}"
canon = "GET\n\n\n\n\n\n\n\n\n\n\n\nx-ms-date:%s\nx-ms-version:2021-08-06\n%s\ncomp:list\nrestype:container" % (now, path)
sig = base64.b64encode(hmac.new(base64.b64decode(cs["AccountKey"]), canon.encode(), hashlib.sha256).digest()).decode()
req = urllib.request.Request(cs["BlobEndpoint"] + "/{container}?restype=container&comp=list", headers={{"x-ms-date": now, "x-ms-version": "2021-08-06", "Authorization": "SharedKey %s:%s" % (cs["AccountName"], sig)}})
print("azure", urllib.request.urlopen(req, timeout=10).status)
print("gh", os.environ.get("GH_TOKEN"))
st = os.stat("/run/warren/connectors/pgpass")
print("pgpass", oct(st.st_mode & 0o777), st.st_uid)
print("home-clean", not any("pgpass" in f or "my.cnf" in f for _, _, fs in os.walk(os.environ["HOME"]) for f in fs))
def reach(port):
    try:
        socket.create_connection(("127.0.0.1", port), timeout=3).close(); return "OPEN"
    except OSError as e: return type(e).__name__
print("other-port", reach({other}))
try:
    socket.create_connection(("198.51.100.10", 80), timeout=3).close(); print("internet OPEN")
except OSError as e: print("internet", e.errno)
"#,
        bucket = warren_e2e::s3::BUCKET,
        container = warren_e2e::azurite::CONTAINER,
        other = my.port + 1,
    );
    let mounts_before = connector_mounts();
    let run = agent.run_request(python(&code, connectors)).await?;
    assert_eq!(run.exited.exit_code, 0, "{}\n{}", run.stdout, run.stderr);
    assert_eq!(run.line("psql"), "from-postgres", "PostgreSQL by name (the sandbox's resolver answers the forwarder)");
    assert_eq!(run.line("mysql"), "from-mariadb");
    assert_eq!(run.line("redis"), "from-redis");
    assert_eq!(run.line("s3"), "from-s3");
    assert_eq!(run.line("azure"), "200");
    assert_eq!(run.line("gh"), "ghp_test_token");
    assert_eq!(run.line("pgpass"), "0o400 1000", "readable by the sandbox user only");
    assert_eq!(run.line("home-clean"), "True");
    assert_eq!(run.line("other-port"), "ConnectionRefusedError", "only the connectors' endpoints are forwarded");
    assert_eq!(run.line("internet"), "101", "the sandbox stays Blocked (ENETUNREACH)");
    // Gone when the call ends: the RAM mount is unmounted.
    let gone = warren_e2e::gateway::wait_for(Duration::from_secs(10), || connector_mounts() <= mounts_before);
    assert!(gone, "connector mounts left behind");
    Ok(())
}

#[tokio::test]
async fn postgres_custody_logs_in_for_the_sandbox_and_no_secret_is_inside() -> anyhow::Result<()> {
    if skip_unless_root("postgres_custody_logs_in_for_the_sandbox_and_no_secret_is_inside") {
        return Ok(());
    }
    let pg = Postgres::start()?;
    let agent = Agent::start(&[]).await?;
    let custody = |name: &str, host: &str, user: &str, password: &str, database: &str| ConnectorGrant {
        custody: true,
        username: user.into(),
        database: database.into(),
        ..grant(name, "postgresql", host, pg.port, &[("password", password)])
    };
    let code = format!(
        r#"{TOOLS}
sh("scram", "psql -tAc 'select current_user || (select body from notes)'")
sh("tls", "psql -tAc 'select ssl from pg_stat_ssl where pid = pg_backend_pid()'")
sh("md5", "psql -h legacy.localhost -U legacy -d postgres -tAc 'select current_user'")
# The secrets, masked (XOR 0x55) so that this program never holds them:
# every byte scanned is unmasked the same way and searched for the mask.
X = bytes(b ^ 0x55 for b in range(256))
masks = [bytes.fromhex("{pw_mask}"), bytes.fromhex("{legacy_mask}")]
def leak(data):
    t = data.translate(X)
    return any(m in t for m in masks)
found = []
for k, v in os.environ.items():
    if leak(v.encode()): found.append("env " + k)
for root in ["/run", "/home", "/tmp", "/etc", "/data"]:
    for d, _, fs in os.walk(root):
        for f in fs:
            p = os.path.join(d, f)
            try:
                data = open(p, "rb").read(1 << 20)
            except OSError:
                continue
            if leak(data): found.append("file " + p)
for pid in os.listdir("/proc"):
    if not pid.isdigit(): continue
    for what in ["environ", "cmdline"]:
        try:
            data = open("/proc/%s/%s" % (pid, what), "rb").read()
        except OSError:
            continue
        if leak(data): found.append("proc %s %s" % (pid, what))
mem = open("/proc/self/mem", "rb")
for l in open("/proc/self/maps").read().splitlines():
    a, b = (int(x, 16) for x in l.split()[0].split("-"))
    if "r" not in l.split()[1] or b - a > (256 << 20): continue
    try:
        mem.seek(a); data = mem.read(b - a)
    except (OSError, ValueError, OverflowError):
        continue
    if leak(data): found.append("memory " + l.split()[-1])
print("found", found)
print("files", sorted(os.listdir("/run/warren/connectors")))
"#,
        pw_mask = mask(services::PG_PASSWORD),
        legacy_mask = mask(services::PG_LEGACY_PASSWORD),
    );
    // The default: TLS verified against the connector's CA, SCRAM only.
    // The legacy role's connector opts out of both, as it must to work.
    let pg_grant = ConnectorGrant { tls_ca_pem: pg.ca_pem.clone(), ..custody("pg", "pg.localhost", "agent", services::PG_PASSWORD, "app") };
    let legacy = ConnectorGrant { tls_disabled: true, weak_auth: vec!["md5".into()], ..custody("old", "legacy.localhost", "legacy", services::PG_LEGACY_PASSWORD, "postgres") };
    let run = agent.run_request(python(&code, vec![pg_grant, legacy])).await?;
    assert_eq!(run.exited.exit_code, 0, "{}\n{}", run.stdout, run.stderr);
    // PostgreSQL offers SCRAM-SHA-256-PLUS over TLS and the forwarder takes
    // it: a wrong tls-server-end-point hash would have failed this login.
    assert_eq!(run.line("scram"), "agentfrom-postgres", "SCRAM-SHA-256(-PLUS) login by the forwarder");
    assert_eq!(run.line("tls"), "t", "the forwarder's session to the server is TLS");
    assert_eq!(run.line("md5"), "legacy", "md5 login by the forwarder, where the connector allows it");
    assert_eq!(run.line("found"), "[]", "no secret anywhere in the sandbox");
    assert_eq!(run.line("files"), "[]", "custody writes no pgpass");
    Ok(())
}

/// What an impostor answering as a connector's PostgreSQL server received
/// on each connection, and whether that connection has ended.
struct Impostor {
    port: u16,
    received: std::sync::Arc<std::sync::Mutex<Vec<(Vec<u8>, bool)>>>,
    task: tokio::task::JoinHandle<()>,
}

impl Drop for Impostor {
    fn drop(&mut self) {
        self.task.abort();
    }
}

impl Impostor {
    /// A server on loopback that answers an SSLRequest with "N" and asks
    /// every login for `auth` (3: cleartext, 5: md5 with a salt), keeping
    /// whatever it is sent.
    async fn start(auth: u8) -> anyhow::Result<Impostor> {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
        let port = listener.local_addr()?.port();
        let received = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
        let log = received.clone();
        let task = tokio::spawn(async move {
            while let Ok((mut s, _)) = listener.accept().await {
                let log = log.clone();
                let i = {
                    let mut l = log.lock().unwrap();
                    l.push((Vec::new(), false));
                    l.len() - 1
                };
                tokio::spawn(async move {
                    let mut buf = [0u8; 4096];
                    let mut asked = false;
                    while let Ok(n @ 1..) = s.read(&mut buf).await {
                        let got = {
                            let mut l = log.lock().unwrap();
                            l[i].0.extend_from_slice(&buf[..n]);
                            l[i].0.clone()
                        };
                        if got.len() == 8 && got[4..8] == 80_877_103u32.to_be_bytes() {
                            let _ = s.write_all(b"N").await;
                        } else if !asked && got.len() > 8 {
                            asked = true;
                            let _ = s.write_all(&[b'R', 0, 0, 0, 12, 0, 0, 0, auth, 0x0b, 0xad, 0xf0, 0x0d]).await;
                        }
                    }
                    log.lock().unwrap()[i].1 = true;
                });
            }
        });
        Ok(Impostor { port, received, task })
    }

    /// Every connection's bytes, once the forwarder has closed them all.
    async fn connections(&self) -> Vec<Vec<u8>> {
        let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
        while !self.received.lock().unwrap().iter().all(|(_, closed)| *closed) {
            assert!(tokio::time::Instant::now() < deadline, "the forwarder left a connection to the impostor open");
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        self.received.lock().unwrap().iter().map(|(b, _)| b.clone()).collect()
    }
}

/// The attack: whatever answers at a custody connector's address asks for
/// the password in cleartext (or md5). Before #26 the forwarder sent it.
/// Now, by default, a server that does not prove itself with TLS the
/// connector's CA signed gets nothing past SSLRequest, and a connector that
/// turned TLS off still answers no weak method it did not allow. The real
/// server, shown with another CA, gets no login either.
#[tokio::test]
async fn custody_hands_nothing_to_an_impostor() -> anyhow::Result<()> {
    if skip_unless_root("custody_hands_nothing_to_an_impostor") {
        return Ok(());
    }
    let pg = Postgres::start()?;
    let other_ca = {
        let dir = tempfile::tempdir()?;
        std::fs::read_to_string(warren_e2e::pki::server_for(dir.path(), &["pg.localhost"]).0)?
    };
    let (cleartext, md5) = (Impostor::start(3).await?, Impostor::start(5).await?);
    let agent = Agent::start(&[]).await?;
    let custody = |name: &str, port: u16| ConnectorGrant { custody: true, username: "agent".into(), database: "app".into(), ..grant(name, "postgresql", &format!("{name}.localhost"), port, &[("password", services::PG_PASSWORD)]) };
    let connectors = vec![
        custody("tls", cleartext.port),
        ConnectorGrant { tls_disabled: true, ..custody("plain", md5.port) },
        ConnectorGrant { tls_disabled: true, ..custody("clear", cleartext.port) },
        ConnectorGrant { tls_ca_pem: other_ca, ..custody("pg", pg.port) },
    ];
    let code = format!(
        r#"{TOOLS}
for name, port in [("tls", {tls}), ("plain", {plain}), ("clear", {tls}), ("pg", {pg})]:
    sh(name, "psql -h %s.localhost -p %d -U agent -d app -tAc 'select 1'" % (name, port))
"#,
        tls = cleartext.port,
        plain = md5.port,
        pg = pg.port,
    );
    let run = agent.run_request(python(&code, connectors)).await?;
    assert_eq!(run.exited.exit_code, 0, "{}\n{}", run.stdout, run.stderr);
    assert!(run.line("tls").contains("does not offer TLS"), "tls: {}", run.stdout);
    assert!(run.line("plain").contains("md5 password, which the connector does not allow"), "plain: {}", run.stdout);
    assert!(run.line("clear").contains("cleartext, which the connector does not allow"), "clear: {}", run.stdout);
    assert!(run.line("pg").contains("TLS with the server failed"), "pg: {}", run.stdout);
    for (what, impostor) in [("cleartext", &cleartext), ("md5", &md5)] {
        let connections = impostor.connections().await;
        assert!(!connections.is_empty(), "{what}: the impostor was reached");
        for got in connections {
            assert!(!String::from_utf8_lossy(&got).contains(services::PG_PASSWORD), "{what}: the impostor received the password");
            // An SSLRequest, a startup packet: nothing after them (no
            // password message of any kind).
            let rest = got.strip_prefix(&[0, 0, 0, 8, 0x04, 0xd2, 0x16, 0x2f][..]).unwrap_or(&got);
            let startup = rest.get(0..4).map_or(0, |l| u32::from_be_bytes([l[0], l[1], l[2], l[3]]) as usize);
            assert_eq!(startup, rest.len(), "{what}: the impostor received more than a startup: {got:?}");
        }
    }
    Ok(())
}

/// `s` XOR 0x55, hex: what the sandbox program searches for.
fn mask(s: &str) -> String {
    s.bytes().map(|b| format!("{:02x}", b ^ 0x55)).collect()
}

/// The attack: a tenant's Connector and StorageConnection naming the node
/// itself — its loopback (here a listener standing in for the agent's or
/// the kubelet's port, by address and by a name resolving to it) and the
/// metadata address. Without an admin's `--allow-endpoint` nothing of the
/// node is reached: the forwarder refuses every connection, the mount is
/// refused before anything runs (a literal) or reaches nothing (a name).
#[tokio::test]
async fn connector_and_storage_endpoints_never_reach_the_node_itself() -> anyhow::Result<()> {
    if skip_unless_root("connector_and_storage_endpoints_never_reach_the_node_itself") {
        return Ok(());
    }
    let listener = std::net::TcpListener::bind("127.0.0.1:0")?;
    let port = listener.local_addr()?.port();
    listener.set_nonblocking(true)?;
    // An admin allowed something else: loopback stays refused.
    let agent = Agent::start(&["--allow-endpoint", "192.0.2.255/32"]).await?;
    let connectors = vec![
        grant("byip", "redis", "127.0.0.1", port, &[("password", "x")]),
        grant("byname", "redis", "node.localhost", port, &[("password", "x")]),
        grant("metadata", "redis", "169.254.169.254", 80, &[("password", "x")]),
    ];
    let code = format!(
        r#"
import socket
for label, host, port in [("byip", "127.0.0.1", {port}), ("byname", "node.localhost", {port}), ("metadata", "169.254.169.254", 80)]:
    try:
        s = socket.create_connection((host, port), timeout=5); s.settimeout(5)
        print(label, "CLOSED" if s.recv(1) == b"" else "DATA")
    except OSError as e:
        print(label, type(e).__name__)
"#
    );
    let run = agent.run_request(python(&code, connectors)).await?;
    assert_eq!(run.exited.exit_code, 0, "{}\n{}", run.stdout, run.stderr);
    for label in ["byip", "byname", "metadata"] {
        assert_ne!(run.line(label), "DATA", "{label}: {}", run.stdout);
    }
    assert!(listener.accept().is_err(), "the node's loopback listener was reached through a connector");

    let s3 = warren_e2e::s3::S3Server::start()?;
    let mount = |endpoint: String| warren_proto::agent::StorageMount {
        mount_path: "/data/lake".into(),
        provider: "s3".into(),
        bucket: warren_e2e::s3::BUCKET.into(),
        endpoint,
        region: "us-east-1".into(),
        credentials: creds(&s3.credentials().iter().map(|(k, v)| (k.as_str(), v.as_str())).collect::<Vec<_>>()),
        mode: warren_proto::agent::MountMode::ReadOnly as i32,
        ..Default::default()
    };
    for endpoint in [s3.endpoint(), "http://169.254.169.254".to_string(), "http://[::ffff:127.0.0.1]:9".to_string()] {
        let mut req = request(Language::Python, "print(1)", Duration::from_secs(30));
        req.mounts = vec![mount(endpoint.clone())];
        let e = agent.run_request(req).await.expect_err("a literal address of the node is refused before anything runs");
        let status = e.downcast_ref::<tonic::Status>().unwrap_or_else(|| panic!("{e:#}"));
        assert_eq!((status.code(), warren_proto::refusal::refusal_of(status).1.as_str()), (tonic::Code::PermissionDenied, "mounts[0].endpoint"), "{endpoint}: {status:?}");
    }
    // A name resolving to the node's loopback: the resolver of the mount's
    // client keeps no address, so the store is never asked.
    let by_name = s3.endpoint().replace("127.0.0.1", "localhost");
    let mut req = request(Language::Python, "import os; print(os.listdir('/data/lake'))", Duration::from_secs(30));
    req.mounts = vec![mount(by_name)];
    let run = agent.run_request(req).await?;
    assert_ne!(run.exited.exit_code, 0, "listed the node's own store by a name: {}", run.stdout);
    Ok(())
}

/// A PostgreSQL "server" that answers every login with SCRAM-SHA-256 asking
/// for `iterations` PBKDF2 rounds, and counts the client-final messages it
/// receives: each one is a hash the forwarder computed.
struct ScramCost {
    port: u16,
    hashed: std::sync::Arc<std::sync::atomic::AtomicUsize>,
    task: tokio::task::JoinHandle<()>,
}

impl Drop for ScramCost {
    fn drop(&mut self) {
        self.task.abort();
    }
}

impl ScramCost {
    async fn start(iterations: u32) -> anyhow::Result<ScramCost> {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
        let port = listener.local_addr()?.port();
        let hashed = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
        let count = hashed.clone();
        let task = tokio::spawn(async move {
            while let Ok((s, _)) = listener.accept().await {
                tokio::spawn(ScramCost::login(s, iterations, count.clone()));
            }
        });
        Ok(ScramCost { port, hashed, task })
    }

    async fn login(mut s: tokio::net::TcpStream, iterations: u32, hashed: std::sync::Arc<std::sync::atomic::AtomicUsize>) -> std::io::Result<()> {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let len = s.read_u32().await? as usize;
        s.read_exact(&mut vec![0; len.saturating_sub(4)]).await?;
        let sasl = [&[b'R', 0, 0, 0, 23, 0, 0, 0, 10][..], b"SCRAM-SHA-256\0\0"].concat();
        s.write_all(&sasl).await?;
        let first = read_message(&mut s).await?;
        let text = String::from_utf8_lossy(&first);
        let nonce = text.split("r=").nth(1).unwrap_or_default().split(',').next().unwrap_or_default().to_string();
        let server_first = format!("r={nonce}server,s=c2FsdHNhbHQ=,i={iterations}");
        let mut cont = vec![b'R'];
        cont.extend_from_slice(&(8 + server_first.len() as u32).to_be_bytes());
        cont.extend_from_slice(&11u32.to_be_bytes());
        cont.extend_from_slice(server_first.as_bytes());
        s.write_all(&cont).await?;
        read_message(&mut s).await?;
        hashed.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        Ok(())
    }
}

/// One frontend message's body (type byte and length read).
async fn read_message(s: &mut tokio::net::TcpStream) -> std::io::Result<Vec<u8>> {
    use tokio::io::AsyncReadExt;
    let _kind = s.read_u8().await?;
    let len = s.read_u32().await? as usize;
    let mut body = vec![0; len.saturating_sub(4).min(1 << 16)];
    s.read_exact(&mut body).await?;
    Ok(body)
}

/// CPU seconds process `pid` has used (user + system).
fn cpu_seconds(pid: u32) -> f64 {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap();
    let fields: Vec<&str> = stat.rsplit_once(") ").unwrap().1.split(' ').collect();
    let ticks: u64 = fields[11].parse::<u64>().unwrap() + fields[12].parse::<u64>().unwrap();
    ticks as f64 / 100.0
}

/// The sandbox program: one login through the forwarder at `port`, then
/// logins `parallel` at a time for `seconds`, printing how many it made and
/// whether an answer named the iteration ceiling.
fn login_storm(port: u16, parallel: usize, seconds: u32) -> String {
    format!(
        r#"
import socket, struct, threading, time
body = struct.pack("!I", 196608) + b"user\0sandbox\0\0"
packet = struct.pack("!I", len(body) + 4) + body
made, answers = [0], []
def one():
    s = socket.create_connection(("hostile.localhost", {port}), timeout=30)
    s.sendall(packet)
    got = b""
    try:
        while True:
            d = s.recv(4096)
            if not d: break
            got += d
    except OSError:
        pass
    s.close()
    made[0] += 1
    answers.append(got)
def loop():
    while time.time() < end:
        one()
one()
end = time.time() + {seconds}
threads = [threading.Thread(target=loop) for _ in range({parallel})]
for t in threads: t.start()
for t in threads: t.join()
print("made", made[0])
print("ceiling", any(b"computes at most" in a for a in answers))
"#
    )
}

/// The attack: a custody connector's "server" asks for an absurd PBKDF2
/// iteration count, and the sandbox opens login after login. The agent
/// used to compute each hash on its async runtime: ~40 ms of the sandbox's
/// CPU made it burn ~12 s in 10 s and another tenant's `echo` took seconds.
/// Now a count above the ceiling is refused unhashed, a sandbox's logins
/// cost the agent at most its own rate, and hashing never runs on the
/// runtime serving other calls.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_hostile_scram_server_cannot_starve_the_agent() -> anyhow::Result<()> {
    if skip_unless_root("a_hostile_scram_server_cannot_starve_the_agent") {
        return Ok(());
    }
    use warren_network::hashing::{ITERATIONS_PER_SECOND, MAX_ITERATIONS};
    let (absurd, costly) = (ScramCost::start(1_000_000).await?, ScramCost::start(MAX_ITERATIONS).await?);
    let agent = Agent::start(&[]).await?;
    let custody = |port: u16| vec![ConnectorGrant { custody: true, tls_disabled: true, username: "agent".into(), ..grant("hostile", "postgresql", "hostile.localhost", port, &[("password", "pw")]) }];
    // Above the ceiling: refused, nothing hashed.
    let run = agent.run_request(python(&login_storm(absurd.port, 1, 0), custody(absurd.port))).await?;
    assert_eq!((run.line("made"), run.line("ceiling")), ("1", "True"), "{}\n{}", run.stdout, run.stderr);
    assert_eq!(absurd.hashed.load(std::sync::atomic::Ordering::SeqCst), 0, "a hash was computed for a million iterations");

    // At the ceiling, as fast as 16 threads can: the sandbox's own rate.
    let echo = || async {
        let t0 = std::time::Instant::now();
        let r = agent.run(Language::Bash, "echo 1", Duration::from_secs(30)).await.unwrap();
        assert_eq!(r.stdout, "1\n");
        t0.elapsed()
    };
    let mut quiet = Vec::new();
    for _ in 0..9 {
        quiet.push(echo().await);
    }
    let (seconds, cpu_before) = (6u32, cpu_seconds(agent.pid()));
    let storm = agent.run_request(python(&login_storm(costly.port, 16, seconds), custody(costly.port)));
    let during = async {
        tokio::time::sleep(Duration::from_secs(1)).await;
        let mut during = Vec::new();
        for _ in 0..9 {
            during.push(echo().await);
        }
        during
    };
    let (storm, mut during) = tokio::join!(storm, during);
    let storm = storm?;
    let cpu = cpu_seconds(agent.pid()) - cpu_before;
    let hashed = costly.hashed.load(std::sync::atomic::Ordering::SeqCst);
    let allowed = 1 + (seconds as usize + 2) * ITERATIONS_PER_SECOND as usize / MAX_ITERATIONS as usize;
    assert!(storm.line("made").parse::<usize>()? >= hashed, "{}", storm.stdout);
    assert!((1..=allowed).contains(&hashed), "{hashed} hashes in {seconds} s: more than the sandbox's rate allows ({allowed})");
    assert!(cpu < 0.5 * f64::from(seconds), "the agent burned {cpu:.2} CPU seconds in {seconds} s");
    quiet.sort();
    during.sort();
    let (before, after) = (quiet[4], during[4]);
    assert!(after < before * 4 + Duration::from_millis(150), "another tenant's echo: p50 {before:?} before, {after:?} during the storm");
    eprintln!("custody storm: {hashed} hashes, agent CPU {cpu:.2} s in {seconds} s, echo p50 {before:?} → {after:?}");
    Ok(())
}
