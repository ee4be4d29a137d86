//! Real database servers for connector tests, on loopback ports, from the
//! Debian packages `scripts/deps.sh` installs: PostgreSQL (password logins:
//! SCRAM-SHA-256 and md5), MariaDB, Redis. Each is killed and its data
//! removed on drop.

use std::net::{TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{bail, Context};

fn free_port() -> anyhow::Result<u16> {
    Ok(TcpListener::bind("127.0.0.1:0")?.local_addr()?.port())
}

fn wait_listening(port: u16, what: &str, child: &mut Child) -> anyhow::Result<()> {
    let deadline = Instant::now() + Duration::from_secs(60);
    while TcpStream::connect(("127.0.0.1", port)).is_err() {
        if let Ok(Some(status)) = child.try_wait() {
            bail!("{what} exited before listening ({status})");
        }
        if Instant::now() > deadline {
            bail!("{what} did not listen on 127.0.0.1:{port}");
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    Ok(())
}

fn run(cmd: &mut Command, what: &str) -> anyhow::Result<String> {
    let out = cmd.stdin(Stdio::null()).output().with_context(|| format!("running {what}"))?;
    if !out.status.success() {
        bail!("{what}: {}", String::from_utf8_lossy(&out.stderr).trim());
    }
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

struct Server {
    child: Child,
    _dir: tempfile::TempDir,
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// A PostgreSQL cluster: role `agent` (SCRAM-SHA-256) owning database
/// `app`, role `legacy` (an md5 password). It serves TLS with a certificate
/// for `localhost`, `pg.localhost`, `legacy.localhost` and `127.0.0.1` from
/// its own test CA (plain connections are accepted too).
pub struct Postgres {
    _server: Server,
    /// Its port.
    pub port: u16,
    /// The CA of its certificate, PEM.
    pub ca_pem: String,
}

/// The `agent` role's password.
pub const PG_PASSWORD: &str = "pg-Secret-7f3a9c";
/// The `legacy` role's (md5) password.
pub const PG_LEGACY_PASSWORD: &str = "pg-Legacy-51b2e8";

fn pg_bin(name: &str) -> anyhow::Result<PathBuf> {
    let mut found: Vec<PathBuf> = std::fs::read_dir("/usr/lib/postgresql").context("PostgreSQL is not installed (scripts/deps.sh installs it)")?.flatten().map(|e| e.path().join("bin").join(name)).filter(|p| p.is_file()).collect();
    found.sort();
    found.pop().with_context(|| format!("no PostgreSQL {name}"))
}

impl Postgres {
    /// Creates and starts a cluster (as the `postgres` user: it refuses root).
    pub fn start() -> anyhow::Result<Postgres> {
        let dir = tempfile::Builder::new().prefix("warren-pg-").tempdir()?;
        let data = dir.path().join("data");
        std::fs::write(dir.path().join("pw"), "admin-pw\n")?;
        run(Command::new("chown").args(["-R", "postgres:postgres"]).arg(dir.path()), "chown")?;
        let as_pg = |bin: &Path| {
            let mut c = Command::new("runuser");
            c.args(["-u", "postgres", "--"]).arg(bin);
            c
        };
        run(
            as_pg(&pg_bin("initdb")?).arg("-D").arg(&data).args(["-U", "admin", "--auth-local=trust", "--auth-host=md5"]).arg(format!("--pwfile={}", dir.path().join("pw").display())),
            "initdb",
        )?;
        let (ca_file, leaf) = crate::pki::server_for(dir.path(), &["localhost", "pg.localhost", "legacy.localhost", "127.0.0.1"]);
        let ca_pem = std::fs::read_to_string(&ca_file)?;
        run(Command::new("chown").args(["postgres:postgres"]).arg(&leaf.cert).arg(&leaf.key), "chown (tls)")?;
        std::fs::set_permissions(&leaf.key, std::os::unix::fs::PermissionsExt::from_mode(0o600))?;
        let port = free_port()?;
        let mut child = as_pg(&pg_bin("postgres")?)
            .arg("-D")
            .arg(&data)
            .args(["-p", &port.to_string(), "-c", "listen_addresses=127.0.0.1", "-c", "ssl=on", "-c"])
            .arg(format!("ssl_cert_file={}", leaf.cert.display()))
            .arg("-c")
            .arg(format!("ssl_key_file={}", leaf.key.display()))
            .arg("-c")
            .arg(format!("unix_socket_directories={}", dir.path().display()))
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .context("starting postgres")?;
        wait_listening(port, "postgres", &mut child)?;
        let server = Server { child, _dir: dir };
        let sql = format!(
            "SET password_encryption = 'scram-sha-256'; CREATE ROLE agent LOGIN PASSWORD '{PG_PASSWORD}'; CREATE DATABASE app OWNER agent; \
             SET password_encryption = 'md5'; CREATE ROLE legacy LOGIN PASSWORD '{PG_LEGACY_PASSWORD}';"
        );
        let url = format!("postgresql://admin:admin-pw@127.0.0.1:{port}/postgres");
        // One session (each -c on its own, outside a transaction, as CREATE
        // DATABASE needs): the SETs decide how the next password is stored.
        let mut psql = Command::new("psql");
        psql.args([url.as_str(), "-v", "ON_ERROR_STOP=1", "-q"]);
        for statement in sql.split("; ").map(|s| s.trim().trim_end_matches(';')) {
            psql.args(["-c", statement]);
        }
        run(&mut psql, "psql (setup)")?;
        let stored = run(Command::new("psql").args([url.as_str(), "-tAc", "select rolname || ':' || left(rolpassword, 6) from pg_authid where rolname in ('agent', 'legacy') order by 1"]), "psql (check)")?;
        if !stored.contains("agent:SCRAM-") || !stored.contains("legacy:md5") {
            bail!("PostgreSQL stored the test passwords unexpectedly: {stored}");
        }
        run(Command::new("psql").args([format!("postgresql://agent:{PG_PASSWORD}@127.0.0.1:{port}/app").as_str(), "-qc", "CREATE TABLE notes (body text); INSERT INTO notes VALUES ('from-postgres');"]), "psql (data)")?;
        Ok(Postgres { _server: server, port, ca_pem })
    }

    /// Runs `sql` in database `app` as `agent`; the rows, one per line,
    /// columns separated by `|`.
    pub fn query(&self, sql: &str) -> String {
        let url = format!("postgresql://agent:{PG_PASSWORD}@127.0.0.1:{}/app", self.port);
        run(Command::new("psql").args([url.as_str(), "-tAc", sql]), "psql").unwrap_or_else(|e| panic!("{sql}: {e}"))
    }
}

/// A MariaDB server: user `agent` with database `app`.
pub struct MariaDb {
    _server: Server,
    /// Its port.
    pub port: u16,
}

/// The `agent` user's password.
pub const MYSQL_PASSWORD: &str = "my-Secret#4c1d";

impl MariaDb {
    /// Initialises and starts a server.
    pub fn start() -> anyhow::Result<MariaDb> {
        let dir = tempfile::Builder::new().prefix("warren-mariadb-").tempdir()?;
        let data = dir.path().join("data");
        let socket = dir.path().join("sock");
        run(
            Command::new("mariadb-install-db").arg("--no-defaults").arg(format!("--datadir={}", data.display())).args(["--user=root", "--auth-root-authentication-method=socket", "--skip-test-db"]),
            "mariadb-install-db",
        )?;
        let port = free_port()?;
        let mut child = Command::new("mariadbd")
            .arg("--no-defaults")
            .arg(format!("--datadir={}", data.display()))
            .arg(format!("--socket={}", socket.display()))
            .arg(format!("--pid-file={}", dir.path().join("pid").display()))
            .args(["--user=root", "--bind-address=127.0.0.1", &format!("--port={port}"), "--skip-log-bin", "--innodb-buffer-pool-size=16M"])
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .context("starting mariadbd")?;
        wait_listening(port, "mariadbd", &mut child)?;
        let server = Server { child, _dir: dir };
        let sql = format!(
            "CREATE DATABASE app; CREATE USER 'agent'@'%' IDENTIFIED BY '{}'; GRANT ALL ON app.* TO 'agent'@'%'; CREATE TABLE app.notes (body text); INSERT INTO app.notes VALUES ('from-mariadb');",
            MYSQL_PASSWORD.replace('\'', "''")
        );
        run(Command::new("mariadb").arg("--no-defaults").arg(format!("--socket={}", socket.display())).args(["-u", "root", "-e", &sql]), "mariadb (setup)")?;
        Ok(MariaDb { _server: server, port })
    }
}

/// A Redis server with a password and one key (`greeting`).
pub struct Redis {
    _server: Server,
    /// Its port.
    pub port: u16,
}

/// Redis's password.
pub const REDIS_PASSWORD: &str = "rd-Secret-9e4f";

impl Redis {
    /// Starts a server (no persistence).
    pub fn start() -> anyhow::Result<Redis> {
        let dir = tempfile::Builder::new().prefix("warren-redis-").tempdir()?;
        let port = free_port()?;
        let mut child = Command::new("redis-server")
            .args(["--port", &port.to_string(), "--bind", "127.0.0.1", "--requirepass", REDIS_PASSWORD, "--save", "", "--appendonly", "no", "--dir"])
            .arg(dir.path())
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .context("starting redis-server (scripts/deps.sh installs it)")?;
        wait_listening(port, "redis-server", &mut child)?;
        let server = Server { child, _dir: dir };
        run(Command::new("redis-cli").args(["-p", &port.to_string(), "--no-auth-warning", "-a", REDIS_PASSWORD, "SET", "greeting", "from-redis"]), "redis-cli (setup)")?;
        Ok(Redis { _server: server, port })
    }
}
