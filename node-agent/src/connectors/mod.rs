//! Connectors of one call: the files and variables the standard tools
//! read, and the endpoints the sandbox reaches through forwarders (pure,
//! here), and the per-execution resource that mounts and serves them
//! ([`resource`]).
//!
//! Files live under [`DIR`], a per-call RAM-backed mount outside the home
//! (never thread state), readable by the sandbox user only. Where a tool
//! reads one configuration (`PGHOST`, `AWS_PROFILE`, …), the first connector
//! of that kind sets it; the others are in the same files under their names.

pub mod resource;

use std::collections::BTreeMap;
use std::net::Ipv4Addr;

use warren_core::contract::Connector;
use warren_core::endpoint::url_host_port;
use warren_network::custody::{PgTls, WeakMethods};

/// Where the connectors' files appear inside the sandbox.
pub const DIR: &str = "/run/warren/connectors";
/// Connectors per call, at most.
pub const MAX_CONNECTORS: usize = 16;

/// The kinds of service (the execution contract's set).
pub use warren_core::kinds::ConnectorKind as Kind;

/// What each kind needs, on the node.
trait KindNeeds {
    fn default_port(self) -> u16;
    fn entries(self) -> &'static [&'static str];
}

impl KindNeeds for Kind {
    fn default_port(self) -> u16 {
        match self {
            Kind::Postgres => 5432,
            Kind::Mysql => 3306,
            Kind::Redis => 6379,
            Kind::Mongo => 27017,
            _ => 0,
        }
    }

    /// The Secret entries the kind needs.
    fn entries(self) -> &'static [&'static str] {
        match self {
            Kind::Postgres | Kind::Mysql | Kind::Mongo | Kind::Redis => &["password"],
            Kind::BigQuery | Kind::Gcs => &["serviceAccountJson"],
            Kind::S3 => &["accessKeyId", "secretAccessKey"],
            Kind::Azure => &["connectionString"],
            Kind::GitHub => &["token"],
        }
    }
}

/// One connector, checked.
#[derive(Clone, PartialEq, Eq)]
pub struct Grant {
    /// Name (files and profiles are named after it).
    pub name: String,
    /// Service.
    pub kind: Kind,
    /// Host (databases, Redis; GitHub Enterprise).
    pub host: Option<String>,
    /// Port.
    pub port: u16,
    /// Database.
    pub database: Option<String>,
    /// User.
    pub username: Option<String>,
    /// Google Cloud project.
    pub project: Option<String>,
    /// S3 endpoint URL.
    pub endpoint: Option<String>,
    /// S3 region.
    pub region: Option<String>,
    /// PostgreSQL custody.
    pub custody: bool,
    /// Custody: TLS toward the server (`None`: plain TCP, as the connector chose).
    pub tls: Option<PgTls>,
    /// Custody: password methods weaker than SCRAM-SHA-256 it may answer.
    pub weak: WeakMethods,
    /// Secret entries.
    pub credentials: BTreeMap<String, String>,
}

impl std::fmt::Debug for Grant {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Grant").field("name", &self.name).field("kind", &self.kind).field("host", &self.host).field("port", &self.port).finish_non_exhaustive()
    }
}

/// Checks one connector: names become file and profile names, values end
/// up in files whose syntax they must not break.
pub fn check(c: Connector) -> Result<Grant, String> {
    let name = c.name.clone();
    let label_ok = !name.is_empty() && name.len() <= 63 && name.bytes().all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-') && !name.starts_with('-');
    if !label_ok {
        return Err(format!("name {name:?}: a lower-case DNS label"));
    }
    let kind = c.kind;
    let nonempty = |v: Option<String>| v.filter(|s| !s.is_empty());
    let plain = |what: &str, v: &Option<String>| match v {
        Some(v) if v.len() > 253 || v.chars().any(|c| c.is_control() || c.is_whitespace()) => Err(format!("{name}: {what} must be plain text")),
        _ => Ok(()),
    };
    let host = nonempty(c.host.clone());
    let (tls, weak) = custody_settings(&name, &c, host.as_deref())?;
    let (database, username, project, endpoint, region) = (nonempty(c.database), nonempty(c.username), nonempty(c.project), nonempty(c.endpoint), nonempty(c.region));
    for (what, v) in [("host", &host), ("database", &database), ("username", &username), ("project", &project), ("endpoint", &endpoint), ("region", &region)] {
        plain(what, v)?;
    }
    if let Some(h) = &host {
        if h.contains(':') || h.contains('/') {
            return Err(format!("{name}: host {h:?} must be a name or an IPv4 address"));
        }
    }
    let needs_host = kind.default_port() != 0;
    if needs_host && host.is_none() {
        return Err(format!("{name}: a host is required"));
    }
    let port = c.port.filter(|p| *p != 0).unwrap_or(kind.default_port());
    if c.custody && kind != Kind::Postgres {
        return Err(format!("{name}: custody is offered for PostgreSQL only"));
    }
    let credentials = c.credentials.0;
    for entry in kind.entries() {
        if !credentials.contains_key(*entry) {
            return Err(format!("{name}: credentials lack {entry:?}"));
        }
    }
    if credentials.iter().any(|(k, v)| k != "serviceAccountJson" && v.chars().any(|c| c == '\n' || c == '\r' || c == '\0')) {
        return Err(format!("{name}: a credential holds a line break"));
    }
    if credentials.values().any(|v| v.len() > 64 * 1024) {
        return Err(format!("{name}: a credential is over 64 KiB"));
    }
    Ok(Grant { name, kind, host, port, database, username, project, endpoint, region, custody: c.custody, tls, weak, credentials })
}

/// Custody's TLS and password methods: verified TLS and SCRAM-SHA-256 only
/// unless the connector says otherwise, and no such setting without custody.
fn custody_settings(name: &str, c: &Connector, host: Option<&str>) -> Result<(Option<PgTls>, WeakMethods), String> {
    let ca = c.tls_ca_pem.as_deref().filter(|s| !s.is_empty());
    let server_name = c.tls_server_name.as_deref().filter(|s| !s.is_empty());
    let any_tls = c.tls_disabled || ca.is_some() || server_name.is_some();
    if !c.custody {
        return match any_tls || !c.weak_auth.is_empty() {
            true => Err(format!("{name}: TLS and password-method settings apply to custody only")),
            false => Ok((None, WeakMethods::default())),
        };
    }
    let mut weak = WeakMethods::default();
    for m in &c.weak_auth {
        match m.as_str() {
            "md5" => weak.md5 = true,
            "cleartext" => weak.cleartext = true,
            other => return Err(format!("{name}: unknown password method {other:?} (md5, cleartext)")),
        }
    }
    if c.tls_disabled {
        if ca.is_some() || server_name.is_some() {
            return Err(format!("{name}: a CA or server name with TLS disabled"));
        }
        return Ok((None, weak));
    }
    if ca.is_some_and(|pem| pem.len() > 256 * 1024) {
        return Err(format!("{name}: the CA bundle is over 256 KiB"));
    }
    let tls = PgTls::new(ca, server_name.or(host).unwrap_or_default()).map_err(|e| format!("{name}: tls: {e}"))?;
    Ok((Some(tls), weak))
}

/// A forwarder to set up: where the sandbox connects, and to what.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Forward {
    /// Address inside the sandbox.
    pub listen: Ipv4Addr,
    /// Port inside (the endpoint's).
    pub port: u16,
    /// The endpoint's host, as the node reaches it.
    pub host: String,
    /// Index of the grant (custody logins come from it).
    pub grant: usize,
}

/// Everything a call's connectors put in place.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct Rendered {
    /// Files under [`DIR`] (relative path, content).
    pub files: Vec<(String, String)>,
    /// Variables for the program.
    pub env: Vec<(String, String)>,
    /// Forwarders.
    pub forwards: Vec<Forward>,
    /// Names the sandbox's resolver answers with a forwarder's address.
    pub names: BTreeMap<String, Ipv4Addr>,
}

/// Renders `grants`.
// Long: one match arm per connector type, each what that type's clients read; the arms share the files and env they accumulate.
pub fn render(grants: &[Grant]) -> Rendered {
    let mut r = Rendered::default();
    let mut first = std::collections::HashSet::new();
    let mut is_first = |k: Kind| first.insert(format!("{k:?}"));
    let mut pgpass = String::new();
    let (mut aws_credentials, mut aws_config) = (String::new(), String::new());
    let mut google_set = false;
    for (i, g) in grants.iter().enumerate() {
        let secret = |k: &str| g.credentials.get(k).cloned().unwrap_or_default();
        let host = g.host.clone().unwrap_or_default();
        let lead = is_first(g.kind);
        match g.kind {
            Kind::Postgres => {
                if !g.custody {
                    let e = |s: &str| s.replace('\\', "\\\\").replace(':', "\\:");
                    pgpass.push_str(&format!("{}:{}:{}:{}:{}\n", e(&host), g.port, g.database.as_deref().map_or("*".into(), e), e(g.username.as_deref().unwrap_or("*")), e(&secret("password"))));
                }
                if lead {
                    r.env.extend(pairs(&[("PGHOST", &host), ("PGPORT", &g.port.to_string())]));
                    r.env.extend(g.username.iter().map(|u| ("PGUSER".to_string(), u.clone())));
                    r.env.extend(g.database.iter().map(|d| ("PGDATABASE".to_string(), d.clone())));
                }
                forward(&mut r, i, &host, g.port);
            }
            Kind::Mysql => {
                if lead {
                    let q = |s: &str| format!("\"{}\"", s.replace('\\', "\\\\").replace('"', "\\\""));
                    let mut cnf = format!("[client]\nhost={}\nport={}\nprotocol=tcp\npassword={}\n", q(&host), g.port, q(&secret("password")));
                    if let Some(u) = &g.username {
                        cnf.push_str(&format!("user={}\n", q(u)));
                    }
                    if let Some(d) = &g.database {
                        cnf.push_str(&format!("[mysql]\ndatabase={}\n", q(d)));
                    }
                    r.files.push(("mysql/my.cnf".into(), cnf));
                    let home = format!("{DIR}/mysql");
                    r.env.extend(pairs(&[("MYSQL_HOME", &home), ("MARIADB_HOME", &home)]));
                }
                forward(&mut r, i, &host, g.port);
            }
            Kind::Redis => {
                if lead {
                    let user = g.username.as_deref().map(|u| format!("{}:", pct(u))).unwrap_or_else(|| ":".into());
                    let url = format!("redis://{user}{}@{host}:{}/0", pct(&secret("password")), g.port);
                    r.env.extend(pairs(&[("REDISCLI_AUTH", &secret("password")), ("REDIS_HOST", &host), ("REDIS_PORT", &g.port.to_string()), ("REDIS_URL", &url)]));
                }
                forward(&mut r, i, &host, g.port);
            }
            Kind::Mongo => {
                let user = g.username.as_deref().map(|u| format!("{}:{}@", pct(u), pct(&secret("password")))).unwrap_or_default();
                let db = g.database.clone().unwrap_or_default();
                let file = format!("{}.mongodb-uri", g.name);
                r.files.push((file.clone(), format!("mongodb://{user}{host}:{}/{db}\n", g.port)));
                if lead {
                    r.env.push(("MONGODB_URI_FILE".into(), format!("{DIR}/{file}")));
                }
                forward(&mut r, i, &host, g.port);
            }
            Kind::BigQuery | Kind::Gcs => {
                let file = format!("{}.adc.json", g.name);
                r.files.push((file.clone(), secret("serviceAccountJson")));
                // One ADC file is the default for both kinds: the first wins.
                if !google_set {
                    google_set = true;
                    r.env.push(("GOOGLE_APPLICATION_CREDENTIALS".into(), format!("{DIR}/{file}")));
                    if let Some(p) = &g.project {
                        r.env.extend(pairs(&[("GOOGLE_CLOUD_PROJECT", p), ("CLOUDSDK_CORE_PROJECT", p)]));
                    }
                }
            }
            Kind::S3 => {
                aws_credentials.push_str(&format!("[{}]\naws_access_key_id = {}\naws_secret_access_key = {}\n", g.name, secret("accessKeyId"), secret("secretAccessKey")));
                let mut profile = format!("[profile {}]\n", g.name);
                if let Some(region) = &g.region {
                    profile.push_str(&format!("region = {region}\n"));
                }
                if let Some(url) = &g.endpoint {
                    profile.push_str(&format!("endpoint_url = {url}\n"));
                }
                aws_config.push_str(&profile);
                if lead {
                    r.env.extend(pairs(&[
                        ("AWS_SHARED_CREDENTIALS_FILE", &format!("{DIR}/aws/credentials")),
                        ("AWS_CONFIG_FILE", &format!("{DIR}/aws/config")),
                        ("AWS_PROFILE", &g.name),
                    ]));
                    if let Some(region) = &g.region {
                        r.env.extend(pairs(&[("AWS_REGION", region), ("AWS_DEFAULT_REGION", region)]));
                    }
                    if let Some(url) = &g.endpoint {
                        r.env.push(("AWS_ENDPOINT_URL".into(), url.clone()));
                    }
                }
                if let Some((h, p)) = g.endpoint.as_deref().and_then(url_host_port) {
                    forward(&mut r, i, &h, p);
                }
            }
            Kind::Azure => {
                let cs = secret("connectionString");
                let file = format!("{}.azure-connection-string", g.name);
                r.files.push((file, format!("{cs}\n")));
                if lead {
                    r.env.push(("AZURE_STORAGE_CONNECTION_STRING".into(), cs.clone()));
                }
                let blob = cs.split(';').find_map(|kv| kv.trim().strip_prefix("BlobEndpoint=")).and_then(url_host_port);
                if let Some((h, p)) = blob {
                    forward(&mut r, i, &h, p);
                }
            }
            Kind::GitHub => {
                if lead {
                    r.env.extend(pairs(&[("GH_TOKEN", &secret("token")), ("GITHUB_TOKEN", &secret("token"))]));
                    if let Some(h) = &g.host {
                        r.env.push(("GH_HOST".into(), h.clone()));
                    }
                }
            }
        }
    }
    if !pgpass.is_empty() {
        r.files.push(("pgpass".into(), pgpass));
        r.env.push(("PGPASSFILE".into(), format!("{DIR}/pgpass")));
    }
    if !aws_credentials.is_empty() {
        r.files.push(("aws/credentials".into(), aws_credentials));
        r.files.push(("aws/config".into(), aws_config));
    }
    r
}

fn pairs(kv: &[(&str, &str)]) -> Vec<(String, String)> {
    kv.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect()
}

/// Percent-encodes everything but unreserved characters (URI userinfo).
fn pct(s: &str) -> String {
    s.bytes().map(|b| if b.is_ascii_alphanumeric() || b"-._~".contains(&b) { (b as char).to_string() } else { format!("%{b:02X}") }).collect()
}

/// Adds a forwarder for `host:port` (once), choosing where it listens: the
/// host's own address when it is an IPv4 literal, 127.0.0.1 for localhost,
/// else a fresh 127.0.1.x that the sandbox's resolver gives for the name.
fn forward(r: &mut Rendered, grant: usize, host: &str, port: u16) {
    if host.is_empty() || r.forwards.iter().any(|f| f.host == host && f.port == port) {
        return;
    }
    let listen = match host.parse::<Ipv4Addr>() {
        Ok(ip) => ip,
        Err(_) if host == "localhost" => Ipv4Addr::LOCALHOST,
        Err(_) => {
            let next = Ipv4Addr::new(127, 0, 1, 1 + r.names.len() as u8);
            *r.names.entry(host.to_ascii_lowercase()).or_insert(next)
        }
    };
    r.forwards.push(Forward { listen, port, host: host.to_string(), grant });
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A connector as the wire edge reads it (`""`: none).
    fn grant(name: &str, kind: &str, host: &str, creds: &[(&str, &str)]) -> Connector {
        Connector {
            host: Some(host.to_string()).filter(|h| !h.is_empty()),
            database: Some("app".into()),
            username: Some("agent".into()),
            credentials: warren_core::secret::Credentials(creds.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect()),
            ..Connector::new(name, Kind::parse(kind).unwrap())
        }
    }

    #[test]
    fn grants_are_checked() {
        assert!(check(grant("pg", "postgresql", "db.internal", &[("password", "x")])).is_ok());
        assert!(check(grant("Pg", "postgresql", "db", &[("password", "x")])).is_err(), "names are labels");
        assert!(check(grant("../x", "postgresql", "db", &[("password", "x")])).is_err());
        assert!(check(grant("pg", "postgresql", "", &[("password", "x")])).is_err(), "databases need a host");
        assert!(check(grant("pg", "postgresql", "db:5432", &[("password", "x")])).is_err());
        assert!(check(grant("pg", "postgresql", "db", &[])).is_err(), "the password is required");
        assert!(check(grant("pg", "postgresql", "db", &[("password", "x\n[evil]")])).is_err());
        assert!(check(Connector { custody: true, ..grant("r", "redis", "cache", &[("password", "x")]) }).is_err());
    }

    #[test]
    fn custody_means_verified_tls_and_scram_unless_the_grant_says_otherwise() {
        let pg = || Connector { custody: true, ..grant("pg", "postgresql", "db.internal", &[("password", "x")]) };
        let g = check(pg()).unwrap();
        assert!(g.tls.is_some(), "TLS by default");
        assert_eq!(g.weak, WeakMethods::default(), "SCRAM-SHA-256 only by default");
        let old = check(Connector { tls_disabled: true, weak_auth: vec!["md5".into()], ..pg() }).unwrap();
        assert_eq!((old.tls.is_none(), old.weak), (true, WeakMethods { md5: true, cleartext: false }));
        assert!(check(Connector { weak_auth: vec!["plain".into()], ..pg() }).unwrap_err().contains("unknown password method"));
        assert!(check(Connector { tls_ca_pem: Some("nothing".into()), ..pg() }).unwrap_err().contains("tls:"));
        assert!(check(Connector { tls_disabled: true, tls_server_name: Some("db".into()), ..pg() }).is_err());
        let plain = grant("pg", "postgresql", "db.internal", &[("password", "x")]);
        assert!(check(Connector { weak_auth: vec!["md5".into()], ..plain }).unwrap_err().contains("custody only"));
    }

    #[test]
    fn postgres_gets_pgpass_and_variables_or_nothing_secret_with_custody() {
        let g = check(grant("pg", "postgresql", "db.internal", &[("password", "p:w\\d")])).unwrap();
        let r = render(std::slice::from_ref(&g));
        assert_eq!(r.files, [("pgpass".to_string(), "db.internal:5432:app:agent:p\\:w\\\\d\n".to_string())]);
        assert!(r.env.contains(&("PGPASSFILE".into(), "/run/warren/connectors/pgpass".into())));
        assert!(r.env.contains(&("PGHOST".into(), "db.internal".into())) && r.env.contains(&("PGUSER".into(), "agent".into())));
        assert_eq!(r.forwards, [Forward { listen: Ipv4Addr::new(127, 0, 1, 1), port: 5432, host: "db.internal".into(), grant: 0 }]);
        assert_eq!(r.names.get("db.internal"), Some(&Ipv4Addr::new(127, 0, 1, 1)));
        let custody = render(&[Grant { custody: true, ..g }]);
        assert!(custody.files.is_empty(), "no pgpass at all");
        assert!(!format!("{:?}", custody.env).contains("p:w"), "no password anywhere");
        assert!(custody.env.contains(&("PGHOST".into(), "db.internal".into())));
    }

    #[test]
    fn each_kind_gets_what_its_tools_read() {
        let grants: Vec<Grant> = vec![
            grant("my", "mysql", "10.200.0.20", &[("password", "a\"b#c")]),
            grant("cache", "redis", "localhost", &[("password", "r p")]),
            Connector { endpoint: Some("http://127.0.0.1:9000".into()), region: Some("us-east-1".into()), ..grant("lake", "s3", "", &[("accessKeyId", "AK"), ("secretAccessKey", "SK")]) },
            grant("blob", "azure", "", &[("connectionString", "DefaultEndpointsProtocol=http;AccountName=devstoreaccount1;AccountKey=K;BlobEndpoint=http://127.0.0.1:10000/devstoreaccount1;")]),
            Connector { project: Some("proj".into()), ..grant("bq", "bigquery", "", &[("serviceAccountJson", "{\"type\": \"service_account\"}")]) },
            grant("gh", "github", "", &[("token", "ghp_T")]),
            grant("mongo", "mongodb", "mongo.internal", &[("password", "p@ss")]),
        ]
        .into_iter()
        .map(|g| check(g).unwrap())
        .collect();
        let r = render(&grants);
        let file = |n: &str| r.files.iter().find(|(f, _)| f == n).map(|(_, c)| c.as_str()).unwrap_or_else(|| panic!("no {n}"));
        let env = |k: &str| r.env.iter().find(|(e, _)| e == k).map(|(_, v)| v.as_str());
        assert!(file("mysql/my.cnf").contains("password=\"a\\\"b#c\"") && file("mysql/my.cnf").contains("protocol=tcp"));
        assert_eq!(env("MYSQL_HOME"), Some("/run/warren/connectors/mysql"));
        assert_eq!((env("REDISCLI_AUTH"), env("REDIS_HOST"), env("REDIS_URL")), (Some("r p"), Some("localhost"), Some("redis://agent:r%20p@localhost:6379/0")));
        assert_eq!(file("aws/credentials"), "[lake]\naws_access_key_id = AK\naws_secret_access_key = SK\n");
        assert!(file("aws/config").contains("[profile lake]\nregion = us-east-1\nendpoint_url = http://127.0.0.1:9000\n"));
        assert_eq!((env("AWS_PROFILE"), env("AWS_ENDPOINT_URL")), (Some("lake"), Some("http://127.0.0.1:9000")));
        assert!(env("AZURE_STORAGE_CONNECTION_STRING").unwrap().contains("AccountKey=K"));
        assert_eq!(env("GOOGLE_APPLICATION_CREDENTIALS"), Some("/run/warren/connectors/bq.adc.json"));
        assert_eq!((env("GH_TOKEN"), env("GOOGLE_CLOUD_PROJECT")), (Some("ghp_T"), Some("proj")));
        assert_eq!(file("mongo.mongodb-uri"), "mongodb://agent:p%40ss@mongo.internal:27017/app\n");
        let fwd: Vec<(Ipv4Addr, u16, &str)> = r.forwards.iter().map(|f| (f.listen, f.port, f.host.as_str())).collect();
        assert_eq!(fwd, [
            (Ipv4Addr::new(10, 200, 0, 20), 3306, "10.200.0.20"),
            (Ipv4Addr::LOCALHOST, 6379, "localhost"),
            (Ipv4Addr::new(127, 0, 0, 1), 9000, "127.0.0.1"),
            (Ipv4Addr::new(127, 0, 0, 1), 10000, "127.0.0.1"),
            (Ipv4Addr::new(127, 0, 1, 1), 27017, "mongo.internal"),
        ]);
    }
}
