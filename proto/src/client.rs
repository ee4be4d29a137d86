//! Client-side transport to a node-agent: gRPC over its Unix socket or TCP.

use std::path::PathBuf;

use hyper_util::rt::TokioIo;
use tonic::transport::{Channel, Endpoint, Uri};

/// Where a node-agent listens.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum AgentAddress {
    /// A Unix socket path (`unix:/run/warren/agent.sock`).
    Unix(PathBuf),
    /// A TCP endpoint (`https://10.0.0.5:7443`): mutual TLS and a bearer token.
    Tcp(String),
}

impl std::str::FromStr for AgentAddress {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, String> {
        if let Some(path) = s.strip_prefix("unix://").or_else(|| s.strip_prefix("unix:")) {
            if path.starts_with('/') {
                return Ok(AgentAddress::Unix(PathBuf::from(path)));
            }
        } else if s.starts_with("https://") {
            return Ok(AgentAddress::Tcp(s.to_string()));
        } else if s.starts_with("http://") {
            return Err(format!("{s:?}: node-agents are reached over TCP only with mutual TLS: use https://host:port"));
        } else if s.starts_with('/') {
            return Ok(AgentAddress::Unix(PathBuf::from(s)));
        }
        Err(format!("{s:?}: expected unix:/absolute/path or https://host:port"))
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

/// How to reach TCP agents: mutual TLS (see [`crate::tls`]). Unix sockets
/// need none (the socket's file mode is the access control).
pub type TcpTls = Option<tonic::transport::ClientTlsConfig>;

/// Longest wait for a TCP connection to an agent.
pub const CONNECT_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(3);
/// How often an open connection to a TCP agent is pinged.
pub const PING_INTERVAL: std::time::Duration = std::time::Duration::from_secs(5);
/// How long a ping may go unanswered before the connection is dropped.
pub const PING_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(10);

fn endpoint(addr: &AgentAddress, tls: &TcpTls) -> Result<Endpoint, ChannelError> {
    match addr {
        AgentAddress::Unix(_) => Ok(Endpoint::from_static("http://agent.local")),
        AgentAddress::Tcp(uri) => {
            let tls = tls.clone().ok_or(ChannelError::NoTls)?;
            // A node whose machine dies sends no reset: HTTP/2 pings find it
            // (a running call ends `node_lost` within interval + timeout, never
            // hangs until TCP gives up), and a connect to it is bounded.
            Ok(Endpoint::from_shared(uri.clone())?
                .tcp_nodelay(true)
                .connect_timeout(CONNECT_TIMEOUT)
                .http2_keep_alive_interval(PING_INTERVAL)
                .keep_alive_timeout(PING_TIMEOUT)
                .keep_alive_while_idle(true)
                .tls_config(tls)?)
        }
    }
}

/// Why a channel could not be made.
#[derive(Debug)]
pub enum ChannelError {
    /// A TCP agent without TLS configured.
    NoTls,
    /// The transport refused the endpoint or the connection failed.
    Transport(tonic::transport::Error),
}

impl std::fmt::Display for ChannelError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            ChannelError::NoTls => f.write_str("a TCP node-agent needs mutual TLS: configure the agent TLS certificate, key and CA"),
            ChannelError::Transport(e) => write!(f, "{e}"),
        }
    }
}

impl std::error::Error for ChannelError {}

impl From<tonic::transport::Error> for ChannelError {
    fn from(e: tonic::transport::Error) -> Self {
        ChannelError::Transport(e)
    }
}

/// A channel that connects on first use and reconnects after failures.
pub fn lazy_channel(addr: &AgentAddress, tls: &TcpTls) -> Result<Channel, ChannelError> {
    let ep = endpoint(addr, tls)?;
    Ok(match addr {
        AgentAddress::Unix(path) => ep.connect_with_connector_lazy(unix_connector(path.clone())),
        AgentAddress::Tcp(_) => ep.connect_lazy(),
    })
}

/// Connects now (fails fast when the agent is not there).
pub async fn connect(addr: &AgentAddress, tls: &TcpTls) -> Result<Channel, ChannelError> {
    let ep = endpoint(addr, tls)?;
    Ok(match addr {
        AgentAddress::Unix(path) => ep.connect_with_connector(unix_connector(path.clone())).await?,
        AgentAddress::Tcp(_) => ep.connect().await?,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn addresses() {
        assert_eq!("unix:/run/a.sock".parse(), Ok(AgentAddress::Unix("/run/a.sock".into())));
        assert_eq!("unix:///run/a.sock".parse(), Ok(AgentAddress::Unix("/run/a.sock".into())));
        assert_eq!("/run/a.sock".parse(), Ok(AgentAddress::Unix("/run/a.sock".into())));
        assert_eq!("https://127.0.0.1:1".parse(), Ok(AgentAddress::Tcp("https://127.0.0.1:1".into())));
        let plain = "http://127.0.0.1:1".parse::<AgentAddress>().unwrap_err();
        assert!(plain.contains("mutual TLS"), "{plain}");
        assert!("unix:relative".parse::<AgentAddress>().is_err());
        assert!("ftp://x".parse::<AgentAddress>().is_err());
    }

    #[test]
    fn tcp_without_tls_is_refused_before_any_connection() {
        let addr: AgentAddress = "https://127.0.0.1:1".parse().unwrap();
        assert!(matches!(lazy_channel(&addr, &None), Err(ChannelError::NoTls)));
    }
}
