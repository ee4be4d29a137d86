//! How the operator reaches node-agents: their port, the agent token and
//! client TLS (read once at start; shared by the reconcilers' context).

use std::path::PathBuf;
use std::sync::Arc;

use warren_proto::client::TcpTls;

/// How the operator reaches node-agents.
#[derive(Clone)]
pub struct AgentAccess {
    /// gRPC port of the agent pods.
    pub port: u16,
    /// Bearer token.
    pub token: Option<Arc<str>>,
    /// Client TLS (the gateway CA's certificate).
    pub tls: TcpTls,
}

impl AgentAccess {
    /// From the command line's files; `None` when none are given.
    pub fn from_files(port: u16, token: Option<PathBuf>, cert: Option<PathBuf>, key: Option<PathBuf>, ca: Option<PathBuf>) -> anyhow::Result<Option<AgentAccess>> {
        let tls = warren_proto::tls::TlsFiles::from_flags(cert, key, ca).map_err(anyhow::Error::msg)?;
        let Some(tls) = tls else { return Ok(None) };
        let token = match token {
            Some(path) => Some(Arc::from(std::fs::read_to_string(&path).map_err(|e| anyhow::anyhow!("reading {}: {e}", path.display()))?.trim())),
            None => None,
        };
        Ok(Some(AgentAccess { port, token, tls: Some(tls.client_config()?) }))
    }
}
