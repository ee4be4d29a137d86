//! Test certificates for mutual TLS between gateways and agents, shaped like
//! the chart's: a gateway CA for callers, an agent CA for agents, leaves
//! naming `warren-node-agent` / `warren-gateway`.

use std::path::{Path, PathBuf};

use rcgen::{BasicConstraints, Certificate, CertificateParams, DnType, ExtendedKeyUsagePurpose, IsCa, KeyPair};
use tonic::transport::{Certificate as TonicCert, ClientTlsConfig, Identity};
use warren_proto::tls::AGENT_SERVER_NAME;

/// A certificate and its key, as PEM files.
#[derive(Debug, Clone)]
pub struct Leaf {
    /// Certificate file.
    pub cert: PathBuf,
    /// Private key file.
    pub key: PathBuf,
}

/// Two CAs and a leaf from each, written to a temporary directory.
pub struct Pki {
    _dir: tempfile::TempDir,
    /// CA of gateway (client) certificates.
    pub gateway_ca: PathBuf,
    /// CA of agent (server) certificates.
    pub agent_ca: PathBuf,
    /// A gateway's client certificate.
    pub gateway: Leaf,
    /// An agent's server certificate.
    pub agent: Leaf,
}

struct Ca {
    cert: Certificate,
    key: KeyPair,
}

fn ca(name: &str) -> Ca {
    let mut p = CertificateParams::new(Vec::<String>::new()).expect("ca params");
    p.distinguished_name.push(DnType::CommonName, name);
    p.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    let key = KeyPair::generate().expect("ca key");
    Ca { cert: p.self_signed(&key).expect("ca cert"), key }
}

/// Both usages on every leaf, as Helm's `genSignedCert` makes them: what
/// keeps the roles apart must be the CAs, and the tests prove it is.
fn leaf(dir: &Path, name: &str, ca: &Ca) -> Leaf {
    let mut p = CertificateParams::new(vec![name.to_string()]).expect("leaf params");
    p.distinguished_name.push(DnType::CommonName, name);
    p.extended_key_usages = vec![ExtendedKeyUsagePurpose::ServerAuth, ExtendedKeyUsagePurpose::ClientAuth];
    let key = KeyPair::generate().expect("leaf key");
    let cert = p.signed_by(&key, &ca.cert, &ca.key).expect("leaf cert");
    let out = Leaf { cert: dir.join(format!("{name}.crt")), key: dir.join(format!("{name}.key")) };
    std::fs::write(&out.cert, cert.pem()).expect("write cert");
    std::fs::write(&out.key, key.serialize_pem()).expect("write key");
    out
}

/// A CA and a server certificate from it for `127.0.0.1` and `localhost`
/// (a test's HTTPS server), written to `dir`: (the CA file, the leaf).
pub fn loopback_server(dir: &Path) -> (PathBuf, Leaf) {
    server_for(dir, &["127.0.0.1", "localhost"])
}

/// A fresh CA and a server certificate from it for `names`, written to
/// `dir`: (the CA file, the leaf).
pub fn server_for(dir: &Path, names: &[&str]) -> (PathBuf, Leaf) {
    let ca = ca("warren-test-server-ca");
    let ca_file = dir.join("server-ca.crt");
    std::fs::write(&ca_file, ca.cert.pem()).expect("write ca");
    let mut p = CertificateParams::new(names.iter().map(|n| n.to_string()).collect::<Vec<_>>()).expect("leaf params");
    p.distinguished_name.push(DnType::CommonName, names[0]);
    p.extended_key_usages = vec![ExtendedKeyUsagePurpose::ServerAuth];
    let key = KeyPair::generate().expect("leaf key");
    let cert = p.signed_by(&key, &ca.cert, &ca.key).expect("leaf cert");
    let out = Leaf { cert: dir.join("server.crt"), key: dir.join("server.key") };
    std::fs::write(&out.cert, cert.pem()).expect("write cert");
    std::fs::write(&out.key, key.serialize_pem()).expect("write key");
    (ca_file, out)
}

impl Pki {
    /// Fresh CAs and leaves.
    pub fn new() -> Pki {
        let dir = tempfile::tempdir().expect("tempdir");
        let (gw_ca, agent_ca) = (ca("warren-gateway-ca"), ca("warren-agent-ca"));
        let write_ca = |name: &str, ca: &Ca| {
            let path = dir.path().join(name);
            std::fs::write(&path, ca.cert.pem()).expect("write ca");
            path
        };
        Pki {
            gateway_ca: write_ca("gateway-ca.crt", &gw_ca),
            agent_ca: write_ca("agent-ca.crt", &agent_ca),
            gateway: leaf(dir.path(), "warren-gateway", &gw_ca),
            agent: leaf(dir.path(), AGENT_SERVER_NAME, &agent_ca),
            _dir: dir,
        }
    }

    /// Flags that make an agent serve TCP with its certificate, accepting gateway clients.
    pub fn agent_args(&self) -> Vec<String> {
        tls_args("--tls-cert-file", "--tls-key-file", "--tls-client-ca-file", &self.agent, &self.gateway_ca)
    }

    /// Flags for an agent serving `listen` over TCP with `token` and its
    /// certificate, and no warm pool (any sandbox would be a call's).
    pub fn tcp_agent_args(&self, listen: &str, token: &Path) -> Vec<String> {
        let mut args: Vec<String> = ["--listen-tcp", listen, "--pool-size", "0", "--token-file"].map(String::from).into();
        args.push(token.display().to_string());
        args.extend(self.agent_args());
        args
    }

    /// Flags that make a gateway reach TCP agents with its client certificate.
    pub fn gateway_args(&self) -> Vec<String> {
        tls_args("--agent-tls-cert-file", "--agent-tls-key-file", "--agent-tls-ca-file", &self.gateway, &self.agent_ca)
    }

    /// A client config presenting `who` (or nothing) and trusting the agent CA.
    pub fn client(&self, who: Option<&Leaf>) -> ClientTlsConfig {
        let ca = std::fs::read(&self.agent_ca).expect("agent ca");
        let mut cfg = ClientTlsConfig::new().ca_certificate(TonicCert::from_pem(ca)).domain_name(AGENT_SERVER_NAME);
        if let Some(l) = who {
            cfg = cfg.identity(Identity::from_pem(std::fs::read(&l.cert).expect("cert"), std::fs::read(&l.key).expect("key")));
        }
        cfg
    }
}

impl Default for Pki {
    fn default() -> Self {
        Pki::new()
    }
}

fn tls_args(cert: &str, key: &str, ca: &str, leaf: &Leaf, peer_ca: &Path) -> Vec<String> {
    let p = |p: &Path| p.display().to_string();
    vec![cert.into(), p(&leaf.cert), key.into(), p(&leaf.key), ca.into(), p(peer_ca)]
}
