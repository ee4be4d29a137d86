//! Mutual TLS between gateways and node-agents over TCP.
//!
//! Two certificate authorities keep the roles apart: agents present
//! certificates from the *agent CA* and accept clients only with
//! certificates from the *gateway CA*; gateways do the reverse. An agent's
//! own key therefore opens no other agent, and the bearer token alone opens
//! none: a caller needs both the token and a gateway certificate.

use std::path::{Path, PathBuf};

use tonic::transport::{Certificate, ClientTlsConfig, Identity, ServerTlsConfig};

/// The name every agent certificate carries and gateways verify: agents are
/// reached by pod IP, which no certificate can list ahead of time.
pub const AGENT_SERVER_NAME: &str = "warren-node-agent";

/// One side's TLS files: its certificate chain and key, and the CA bundle
/// it trusts for the other side (PEM).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TlsFiles {
    /// This side's certificate (chain), PEM.
    pub cert: PathBuf,
    /// This side's private key, PEM.
    pub key: PathBuf,
    /// CA certificates the other side's certificate must chain to, PEM.
    pub peer_ca: PathBuf,
}

impl TlsFiles {
    /// All three files or none: a partial set is a configuration error.
    pub fn from_flags(cert: Option<PathBuf>, key: Option<PathBuf>, peer_ca: Option<PathBuf>) -> Result<Option<TlsFiles>, String> {
        match (cert, key, peer_ca) {
            (None, None, None) => Ok(None),
            (Some(cert), Some(key), Some(peer_ca)) => Ok(Some(TlsFiles { cert, key, peer_ca })),
            _ => Err("TLS needs a certificate, its key and the peer CA bundle together".into()),
        }
    }

    fn load(&self) -> std::io::Result<(Identity, Certificate)> {
        let cert = read_pem(&self.cert, "CERTIFICATE")?;
        let key = read_pem(&self.key, "PRIVATE KEY")?;
        let ca = read_pem(&self.peer_ca, "CERTIFICATE")?;
        Ok((Identity::from_pem(cert, key), Certificate::from_pem(ca)))
    }

    /// The agent's side: present our certificate, require a client
    /// certificate that chains to `peer_ca`.
    pub fn server_config(&self) -> std::io::Result<ServerTlsConfig> {
        let (identity, ca) = self.load()?;
        Ok(ServerTlsConfig::new().identity(identity).client_ca_root(ca))
    }

    /// The gateway's side: present our certificate, accept only servers
    /// whose certificate chains to `peer_ca` and names [`AGENT_SERVER_NAME`].
    pub fn client_config(&self) -> std::io::Result<ClientTlsConfig> {
        let (identity, ca) = self.load()?;
        Ok(ClientTlsConfig::new().identity(identity).ca_certificate(ca).domain_name(AGENT_SERVER_NAME))
    }
}

/// Reads a PEM file and checks it holds the expected block, so a swapped
/// key and certificate fail at start with the file's name, not at the first
/// handshake.
fn read_pem(path: &Path, label: &str) -> std::io::Result<Vec<u8>> {
    let pem = std::fs::read(path).map_err(|e| with_path(path, e))?;
    // "PRIVATE KEY" also matches "EC PRIVATE KEY" and "RSA PRIVATE KEY".
    if !String::from_utf8_lossy(&pem).contains(&format!("{label}-----")) {
        return Err(with_path(path, std::io::Error::new(std::io::ErrorKind::InvalidData, format!("no PEM {label} block"))));
    }
    Ok(pem)
}

fn with_path(path: &Path, e: std::io::Error) -> std::io::Error {
    std::io::Error::new(e.kind(), format!("{}: {e}", path.display()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn all_three_files_or_none() {
        assert_eq!(TlsFiles::from_flags(None, None, None), Ok(None));
        let p = || Some(PathBuf::from("/x"));
        assert!(TlsFiles::from_flags(p(), p(), p()).unwrap().is_some());
        assert!(TlsFiles::from_flags(p(), None, p()).is_err());
        assert!(TlsFiles::from_flags(None, None, p()).is_err());
    }

    #[test]
    fn files_are_checked_for_what_they_hold() {
        let dir = tempfile::tempdir().unwrap();
        let cert = dir.path().join("c.pem");
        std::fs::write(&cert, "-----BEGIN CERTIFICATE-----\nAAAA\n-----END CERTIFICATE-----\n").unwrap();
        let files = TlsFiles { cert: cert.clone(), key: cert.clone(), peer_ca: cert };
        let err = files.server_config().unwrap_err().to_string();
        assert!(err.contains("c.pem") && err.contains("PRIVATE KEY"), "{err}");
        let missing = TlsFiles { cert: dir.path().join("none"), ..files };
        assert!(missing.client_config().unwrap_err().to_string().contains("none"));
    }
}
