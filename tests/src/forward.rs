//! A TCP forwarder: pods on kube-envtest's bridge reach servers that tests
//! start on loopback (the API server, PostgreSQL, the S3 server) through a
//! port on the bridge's address. Stopped, with its connections, on drop.

use std::net::SocketAddr;

use tokio::net::{TcpListener, TcpStream};
use tokio::task::JoinSet;

/// Forwards connections to `listen` (a free port on the bridge) to a target.
pub struct Forward {
    /// Where pods connect.
    pub addr: SocketAddr,
    task: tokio::task::JoinHandle<()>,
}

impl Forward {
    /// Listens on a free port of `ip`, relaying each connection to `target`.
    pub async fn start(ip: std::net::IpAddr, target: SocketAddr) -> anyhow::Result<Forward> {
        let listener = TcpListener::bind((ip, 0)).await?;
        let addr = listener.local_addr()?;
        let task = tokio::spawn(async move {
            // Dropped with the task: every relay ends with the forwarder.
            let mut relays = JoinSet::new();
            while let Ok((mut inbound, _)) = listener.accept().await {
                relays.spawn(async move {
                    if let Ok(mut outbound) = TcpStream::connect(target).await {
                        let _ = tokio::io::copy_bidirectional(&mut inbound, &mut outbound).await;
                    }
                });
                while relays.try_join_next().is_some() {}
            }
        });
        Ok(Forward { addr, task })
    }
}

impl Drop for Forward {
    fn drop(&mut self) {
        self.task.abort();
    }
}
