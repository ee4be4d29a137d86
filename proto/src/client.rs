//! Client-side transport to a node-agent: gRPC over its Unix socket or TCP.

use std::path::PathBuf;

use hyper_util::rt::TokioIo;
use tonic::transport::{Channel, Endpoint, Uri};

/// Where a node-agent listens.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum AgentAddress {
    /// A Unix socket path (`unix:/run/warren/agent.sock`).
    Unix(PathBuf),
    /// A TCP endpoint (`http://10.0.0.5:7443`); needs a bearer token.
    Tcp(String),
}

impl std::str::FromStr for AgentAddress {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, String> {
        if let Some(path) = s.strip_prefix("unix://").or_else(|| s.strip_prefix("unix:")) {
            if path.starts_with('/') {
                return Ok(AgentAddress::Unix(PathBuf::from(path)));
            }
        } else if s.starts_with("http://") || s.starts_with("https://") {
            return Ok(AgentAddress::Tcp(s.to_string()));
        } else if s.starts_with('/') {
            return Ok(AgentAddress::Unix(PathBuf::from(s)));
        }
        Err(format!("{s:?}: expected unix:/absolute/path or http://host:port"))
    }
}

impl std::fmt::Display for AgentAddress {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            AgentAddress::Unix(p) => write!(f, "unix:{}", p.display()),
            AgentAddress::Tcp(u) => f.write_str(u),
        }
    }
}

type UnixConnector = tower::util::ServiceFn<
    Box<dyn Fn(Uri) -> std::pin::Pin<Box<dyn std::future::Future<Output = std::io::Result<TokioIo<tokio::net::UnixStream>>> + Send>> + Send + Sync>,
>;

fn unix_connector(path: PathBuf) -> UnixConnector {
    tower::service_fn(Box::new(move |_: Uri| {
        let path = path.clone();
        Box::pin(async move { Ok(TokioIo::new(tokio::net::UnixStream::connect(path).await?)) })
    }))
}

/// A channel that connects on first use and reconnects after failures.
pub fn lazy_channel(addr: &AgentAddress) -> Result<Channel, tonic::transport::Error> {
    match addr {
        AgentAddress::Unix(path) => {
            Ok(Endpoint::from_static("http://agent.local").connect_with_connector_lazy(unix_connector(path.clone())))
        }
        AgentAddress::Tcp(uri) => Ok(Endpoint::from_shared(uri.clone())?.tcp_nodelay(true).connect_lazy()),
    }
}

/// Connects now (fails fast when the agent is not there).
pub async fn connect(addr: &AgentAddress) -> Result<Channel, tonic::transport::Error> {
    match addr {
        AgentAddress::Unix(path) => {
            Endpoint::from_static("http://agent.local").connect_with_connector(unix_connector(path.clone())).await
        }
        AgentAddress::Tcp(uri) => Endpoint::from_shared(uri.clone())?.tcp_nodelay(true).connect().await,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn addresses() {
        assert_eq!("unix:/run/a.sock".parse(), Ok(AgentAddress::Unix("/run/a.sock".into())));
        assert_eq!("unix:///run/a.sock".parse(), Ok(AgentAddress::Unix("/run/a.sock".into())));
        assert_eq!("/run/a.sock".parse(), Ok(AgentAddress::Unix("/run/a.sock".into())));
        assert_eq!("http://127.0.0.1:1".parse(), Ok(AgentAddress::Tcp("http://127.0.0.1:1".into())));
        assert!("unix:relative".parse::<AgentAddress>().is_err());
        assert!("ftp://x".parse::<AgentAddress>().is_err());
    }
}
