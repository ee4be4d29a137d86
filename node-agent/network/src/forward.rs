//! Connector forwarders: a listener on the sandbox's own loopback for each
//! connector endpoint, splicing every connection to that endpoint (and no
//! other) from the node. A `Blocked` sandbox reaches its databases this way;
//! so does an `Unrestricted` one whose database has a private address.
//!
//! Listeners are created inside the sandbox's network namespace (by a
//! thread that entered it); the agent's runtime serves them from outside.

use std::io;
use std::net::Ipv4Addr;
use std::os::fd::OwnedFd;
use std::sync::Arc;
use std::time::Duration;

use tokio::net::TcpStream;
use tokio::sync::Semaphore;
use tracing::debug;

use warren_core::reach::EndpointPolicy;

use crate::custody::{self, PgLogin};
use crate::link;

/// Connections open at once per endpoint.
const MAX_CONNECTIONS: usize = 64;
/// How long reaching the endpoint may take.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(10);

/// One endpoint to serve inside a sandbox.
#[derive(Debug, Clone)]
pub struct Endpoint {
    /// Where the sandbox connects (a loopback address, or the endpoint's own
    /// IPv4 address, added to the sandbox's loopback).
    pub listen: Ipv4Addr,
    /// Port, the endpoint's own.
    pub port: u16,
    /// The endpoint, as the node reaches it.
    pub target_host: String,
    /// Its port.
    pub target_port: u16,
    /// PostgreSQL custody: log in on the sandbox's behalf.
    pub custody: Option<Arc<PgLogin>>,
    /// What the endpoint may reach from the node (never the node itself
    /// unless an admin allowed it), checked on every connection.
    pub policy: Arc<EndpointPolicy>,
}

/// Running forwarders; dropping stops them (open connections included).
pub struct Forwarders {
    tasks: Vec<tokio::task::JoinHandle<()>>,
}

impl Drop for Forwarders {
    fn drop(&mut self) {
        for t in &self.tasks {
            t.abort();
        }
    }
}

impl Forwarders {
    /// Listens for each endpoint inside `netns` and starts serving.
    pub async fn start(netns: &OwnedFd, endpoints: Vec<Endpoint>) -> io::Result<Forwarders> {
        let binds: Vec<(Ipv4Addr, u16)> = endpoints.iter().map(|e| (e.listen, e.port)).collect();
        let listeners = link::in_netns(netns, move || bind_all(&binds)).await?;
        let mut tasks = Vec::with_capacity(endpoints.len());
        for (listener, endpoint) in listeners.into_iter().zip(endpoints) {
            listener.set_nonblocking(true)?;
            let listener = tokio::net::TcpListener::from_std(listener)?;
            tasks.push(tokio::spawn(serve(listener, Arc::new(endpoint))));
        }
        Ok(Forwarders { tasks })
    }
}

/// Inside the namespace: loopback addresses for non-127 endpoints, then the
/// listeners.
fn bind_all(binds: &[(Ipv4Addr, u16)]) -> io::Result<Vec<std::net::TcpListener>> {
    let mut added = Vec::new();
    for (ip, _) in binds {
        if !ip.is_loopback() && !added.contains(ip) {
            added.push(*ip);
        }
    }
    if !added.is_empty() {
        let mut sock = crate::netlink::Socket::open(crate::netlink::Family::Route)?;
        let lo = crate::rtnl::index_of("lo")?;
        let mut m = sock.msgs();
        for ip in &added {
            crate::rtnl::add_address(&mut m, lo, *ip, 32);
        }
        sock.transact(&m)?;
    }
    binds.iter().map(|(ip, port)| std::net::TcpListener::bind((*ip, *port))).collect()
}

async fn serve(listener: tokio::net::TcpListener, endpoint: Arc<Endpoint>) {
    let permits = Arc::new(Semaphore::new(MAX_CONNECTIONS));
    // Connections belong to this task: stopping the forwarder closes them.
    let mut open = tokio::task::JoinSet::new();
    loop {
        let Ok(permit) = permits.clone().acquire_owned().await else { return };
        let Ok((client, _)) = listener.accept().await else { return };
        while open.try_join_next().is_some() {}
        let endpoint = endpoint.clone();
        open.spawn(async move {
            if let Err(e) = relay(client, &endpoint).await {
                debug!(error = %e, host = %endpoint.target_host, "connector connection ended");
            }
            drop(permit);
        });
    }
}

/// Resolves `host` now (a name that rebinds gains nothing) and connects to
/// the first address the policy permits that answers.
async fn connect(host: &str, port: u16, policy: &EndpointPolicy) -> io::Result<TcpStream> {
    let found: Vec<std::net::SocketAddr> = tokio::net::lookup_host((host, port)).await?.collect();
    let permitted = policy.permitted(host, found).map_err(|why| io::Error::new(io::ErrorKind::PermissionDenied, why))?;
    let mut last = io::Error::from(io::ErrorKind::NotFound);
    for addr in permitted {
        match TcpStream::connect(addr).await {
            Ok(s) => return Ok(s),
            Err(e) => last = e,
        }
    }
    Err(last)
}

async fn relay(mut client: TcpStream, endpoint: &Endpoint) -> io::Result<()> {
    let _ = client.set_nodelay(true);
    // Custody reads what the client wants before reaching out, so that
    // whatever fails on the way to the server is told to the client.
    let startup = match &endpoint.custody {
        Some(_) => Some(in_time(custody::client_startup(&mut client)).await?),
        None => None,
    };
    // RFC 6761: `localhost` and names below it are this node's loopback,
    // whatever a resolver would say.
    let host = endpoint.target_host.as_str();
    let host = if host == "localhost" || host.ends_with(".localhost") { "127.0.0.1" } else { host };
    let server = match tokio::time::timeout(CONNECT_TIMEOUT, connect(host, endpoint.target_port, &endpoint.policy)).await {
        Ok(Ok(server)) => server,
        Ok(Err(e)) => return Err(told(&mut client, endpoint, e).await),
        Err(_) => return Err(told(&mut client, endpoint, io::Error::from(io::ErrorKind::TimedOut)).await),
    };
    let _ = server.set_nodelay(true);
    let (Some(login), Some(startup)) = (&endpoint.custody, startup) else {
        let mut server = server;
        return tokio::io::copy_bidirectional(&mut client, &mut server).await.map(|_| ());
    };
    match &login.tls {
        None => {
            let mut server = server;
            in_time(custody::pg_login(&mut client, &mut server, login, startup, None)).await?;
            tokio::io::copy_bidirectional(&mut client, &mut server).await.map(|_| ())
        }
        Some(tls) => {
            let (mut server, binding) = match in_time(custody::start_tls(server, tls)).await {
                Ok(s) => s,
                Err(e) => return Err(told(&mut client, endpoint, e).await),
            };
            in_time(custody::pg_login(&mut client, &mut server, login, startup, Some(&binding))).await?;
            tokio::io::copy_bidirectional(&mut client, &mut server).await.map(|_| ())
        }
    }
}

/// For custody, the client learns why the server was not reached (its
/// psql shows the reason); other protocols just see the connection close.
async fn told(client: &mut TcpStream, endpoint: &Endpoint, e: io::Error) -> io::Error {
    if endpoint.custody.is_some() {
        custody::tell_client(client, &format!("warren connector: {} ({e})", endpoint.target_host)).await;
    }
    e
}

/// `f` within the custody handshake's time.
async fn in_time<T>(f: impl std::future::Future<Output = io::Result<T>>) -> io::Result<T> {
    tokio::time::timeout(custody::HANDSHAKE_TIMEOUT, f).await.map_err(|_| io::Error::from(io::ErrorKind::TimedOut))?
}
