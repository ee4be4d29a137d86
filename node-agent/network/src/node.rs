//! The node's side: the table every sandbox chain hangs off, and the
//! per-sandbox setup and teardown.

use std::io;
use std::net::{Ipv4Addr, SocketAddr};
use std::os::fd::{AsRawFd, OwnedFd};
use std::sync::{Arc, Mutex};

use tracing::warn;

use crate::dns::DnsProxy;
use crate::link::{self, Indices};
use crate::netlink::{Family, Socket};
use crate::nflog::Refusals;
use crate::nft::{self, SandboxNames};
use crate::nftnl::{self, Nft};
use crate::rtnl;
use crate::policy::{self, Blocked, NetPolicy};

/// Where the DNS proxy listens inside every sandbox (see
/// `warren_core::network::SANDBOX_RESOLV_CONF`).
pub const SANDBOX_RESOLVER: SocketAddr = SocketAddr::new(std::net::IpAddr::V4(Ipv4Addr::LOCALHOST), 53);

/// Node settings.
#[derive(Debug, Clone)]
pub struct NodeNetConfig {
    /// Range sandbox veth addresses come from (a /31 per sandbox slot).
    pub sandbox_net: (Ipv4Addr, u8),
    /// The resolver the DNS proxies ask.
    pub upstream_dns: SocketAddr,
    /// This agent's table and interface names.
    pub scope: nft::Scope,
    /// A writable procfs (`/proc`, or in a container the agent's own clean
    /// mount: the runtime's `/proc/sys` is read-only there).
    pub proc_dir: std::path::PathBuf,
}

/// The node's sandbox networking, once set up.
pub struct NodeNet {
    cfg: NodeNetConfig,
    refusals: Arc<Refusals>,
    /// Sandbox chains and sets, and the addresses the DNS proxies resolve.
    nft: Arc<Nft>,
    /// Links, addresses and shaping on the node's side.
    rtnl: Arc<Mutex<Socket>>,
    /// Which sandbox network numbers (address, interface, chain) are taken.
    indices: Arc<Mutex<Indices>>,
    /// The next sandbox's conntrack mark. Seeded at random: connections an
    /// earlier agent's sandboxes left in conntrack carry other marks.
    next_mark: std::sync::atomic::AtomicU32,
}

/// Why a sandbox's network could not be set up.
#[derive(Debug, thiserror::Error)]
#[error("sandbox network: {step}: {source}")]
pub struct NetError {
    step: &'static str,
    #[source]
    source: io::Error,
}

fn at(step: &'static str) -> impl FnOnce(io::Error) -> NetError {
    move |source| NetError { step, source }
}

impl NodeNet {
    /// Checks for `nft`, removes what an earlier agent left, installs the
    /// node table and turns on forwarding.
    pub async fn start(cfg: NodeNetConfig) -> Result<NodeNet, NetError> {
        which("nft").map_err(at("looking for the networking tools"))?;
        let mut rtnl = Socket::open(Family::Route).map_err(at("opening the rtnetlink socket"))?;
        remove_links(&mut rtnl, &cfg.scope.prefix);
        let refusals = Refusals::start(cfg.scope.group).map_err(at("receiving refused packets (NFLOG)"))?;
        nft::run(&nft::node_table(&cfg.scope, cfg.sandbox_net), &["-f", "-"]).await.map_err(at("installing the node table"))?;
        std::fs::write(cfg.proc_dir.join("sys/net/ipv4/ip_forward"), "1").map_err(at("enabling IPv4 forwarding"))?;
        let nft = Arc::new(Nft::open().map_err(at("opening the nftables netlink socket"))?);
        let indices = Arc::new(Mutex::new(Indices::new(Indices::capacity_of(cfg.sandbox_net))));
        Ok(NodeNet { cfg, refusals, nft, rtnl: Arc::new(Mutex::new(rtnl)), indices, next_mark: rand::random::<u32>().into() })
    }

    /// Removes the node table, and the veths of sandboxes whose namespaces
    /// the kernel has not yet removed (sandboxes are gone by then): a
    /// stopped agent leaves nothing behind.
    pub async fn stop(&self) {
        if let Err(e) = nft::run(&nft::drop_node_table(&self.cfg.scope), &["-f", "-"]).await {
            warn!(error = %e, "removing the node's nftables table");
        }
        let (rtnl, prefix) = (self.rtnl.clone(), self.cfg.scope.prefix.clone());
        let _ = blocking(move || {
            remove_links(&mut lock(&rtnl), &prefix);
            Ok(())
        })
        .await;
    }

    /// Gives the sandbox whose init is `pid` its network. Nothing is left
    /// behind when this fails.
    pub async fn setup(&self, pid: i32, policy: Arc<NetPolicy>) -> Result<SandboxNet, NetError> {
        // 0 is the mark of connections nobody marked.
        let mark = loop {
            let m = self.next_mark.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            if m != 0 {
                break m;
            }
        };
        let prefix = self.cfg.scope.prefix.clone();
        let taken = lock(&self.indices).take(|n| rtnl::exists(&format!("{prefix}{n}")));
        let (n, stale) = taken.ok_or_else(|| at("addressing")(io::Error::other("the sandbox range has no address left")))?;
        let lease = Lease { n, indices: self.indices.clone() };
        let names = SandboxNames::new(&self.cfg.scope, n, mark);
        let (node, sandbox) = link::addresses(self.cfg.sandbox_net, n).ok_or_else(|| at("addressing")(io::Error::other("the sandbox range has no address for this number")))?;
        let netns = link::open_netns(pid).map_err(at("opening the network namespace"))?;
        self.refusals.watch(sandbox);
        let allowlist = policy.allow.is_some();
        let mut net = SandboxNet { names, netns, dns: None, address: sandbox, refusals: self.refusals.clone(), nft: self.nft.clone(), allowlist, _lease: lease };
        match net.build(&self.cfg, self.rtnl.clone(), stale, node, sandbox, policy).await {
            Ok(()) => Ok(net),
            Err(e) => {
                net.teardown().await;
                Err(e)
            }
        }
    }
}

/// Removes every sandbox veth of this agent's prefix.
fn remove_links(rtnl: &mut Socket, prefix: &str) {
    for ifname in link::leftover_links(prefix) {
        let mut m = rtnl.msgs();
        rtnl::del_link(&mut m, &ifname);
        let _ = rtnl.transact(&m);
    }
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

/// A taken sandbox network number, given back on drop.
struct Lease {
    n: usize,
    indices: Arc<Mutex<Indices>>,
}

impl Drop for Lease {
    fn drop(&mut self) {
        lock(&self.indices).put(self.n);
    }
}

/// One sandbox's network; [`SandboxNet::teardown`] removes it.
pub struct SandboxNet {
    names: SandboxNames,
    netns: OwnedFd,
    dns: Option<DnsProxy>,
    /// The sandbox end's address (what refused packets come from).
    address: Ipv4Addr,
    refusals: Arc<Refusals>,
    nft: Arc<Nft>,
    /// Whether it has an allowlist's sets.
    allowlist: bool,
    _lease: Lease,
}

impl SandboxNet {
    async fn build(&mut self, cfg: &NodeNetConfig, rtnl: Arc<Mutex<Socket>>, stale: bool, node: Ipv4Addr, sandbox: Ipv4Addr, policy: Arc<NetPolicy>) -> Result<(), NetError> {
        let t0 = std::time::Instant::now();
        // The chain first: until it exists the interface matches nothing and
        // its traffic is dropped.
        let (nft, names, p) = (self.nft.clone(), self.names.clone(), policy.clone());
        blocking(move || nft.apply(|m| nftnl::sandbox_batch(m, &names, &p))).await.map_err(at("installing the sandbox chain"))?;
        let t_chain = t0.elapsed();
        let (ifname, rate, ns) = (self.names.ifname.clone(), policy.rate_bits, self.netns.try_clone().map_err(at("opening the network namespace"))?);
        blocking(move || {
            let mut sock = lock(&rtnl);
            if stale {
                // A pair whose namespace the kernel has not yet removed.
                let mut m = sock.msgs();
                rtnl::del_link(&mut m, &ifname);
                let _ = sock.transact(&m);
            }
            let mut m = sock.msgs();
            rtnl::add_veth(&mut m, &ifname, "eth0", ns.as_raw_fd());
            sock.transact(&m)?;
            let index = rtnl::index_of(&ifname)?;
            let mut m = sock.msgs();
            rtnl::add_address(&mut m, index, node, 31);
            rtnl::shape(&mut m, index, rate);
            sock.transact(&m)
        })
        .await
        .map_err(at("creating the veth pair"))?;
        let t_veth = t0.elapsed();
        let proc_dir = cfg.proc_dir.clone();
        let socket = link::in_netns(&self.netns, move || {
            rtnl::configure_inside(&proc_dir, node, sandbox, rate)?;
            std::net::UdpSocket::bind(SANDBOX_RESOLVER)
        })
        .await
        .map_err(at("configuring inside the sandbox"))?;
        let forwarding = crate::dns::Forwarding { upstream: cfg.upstream_dns, policy, names: self.names.clone(), sets: self.nft.clone() };
        self.dns = Some(DnsProxy::spawn(socket, Some(forwarding)).map_err(at("starting the DNS proxy"))?);
        let us = |d: std::time::Duration| d.as_micros() as u64;
        tracing::debug!(chain_us = us(t_chain), veth_us = us(t_veth - t_chain), total_us = us(t0.elapsed()), "sandbox network set up");
        Ok(())
    }

    /// Names the sandbox's resolver answers itself (connector hosts).
    pub fn dns_statics(&self) -> Option<&crate::dns::Statics> {
        self.dns.as_ref().map(DnsProxy::statics)
    }

    /// What was refused so far: the firewall's counts, named by the proxy.
    pub fn blocked(&self) -> Vec<Blocked> {
        let refused = self.refusals.refused(self.address);
        let (names, dns_refused) = self.dns.as_ref().map(DnsProxy::seen).unwrap_or_default();
        policy::report(refused, &names, &dns_refused)
    }

    /// Stops the proxy and removes the chain and sets; call once the
    /// sandbox's processes are gone. The veth pair leaves with the
    /// namespace (its last holder, this, lets go here): removing it now
    /// would wait for the kernel's network lock and an RCU grace period,
    /// and its number is taken again only once it is gone.
    pub async fn teardown(mut self) {
        self.dns = None;
        let (nft, names) = (self.nft.clone(), self.names.clone());
        let steps = nftnl::teardown_steps(&names, self.allowlist);
        // One batch normally; step by step when something was never made.
        let _ = blocking(move || {
            if nft.apply(|m| nftnl::teardown_batch(m, &names, &steps)).is_err() {
                for step in &steps {
                    let _ = nft.apply(|m| nftnl::teardown_batch(m, &names, std::slice::from_ref(step)));
                }
            }
            Ok(())
        })
        .await;
        self.refusals.forget(self.address);
    }
}

async fn blocking<T: Send + 'static>(f: impl FnOnce() -> io::Result<T> + Send + 'static) -> io::Result<T> {
    tokio::task::spawn_blocking(f).await.map_err(io::Error::other)?
}

fn which(tool: &str) -> io::Result<()> {
    let path = std::env::var_os("PATH").unwrap_or_default();
    std::env::split_paths(&path)
        .chain(["/usr/sbin", "/sbin"].iter().map(Into::into))
        .any(|d| d.join(tool).is_file())
        .then_some(())
        .ok_or_else(|| io::Error::new(io::ErrorKind::NotFound, format!("`{tool}` is not installed")))
}
/// The first nameserver of a `resolv.conf`.
pub fn first_nameserver(resolv_conf: &str) -> Option<SocketAddr> {
    resolv_conf.lines().find_map(|l| {
        let mut words = l.split_whitespace();
        (words.next() == Some("nameserver")).then(|| words.next()?.parse::<std::net::IpAddr>().ok().map(|ip| SocketAddr::new(ip, 53)))?
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_first_nameserver_is_the_upstream() {
        let conf = "# generated\nsearch example\nnameserver 10.96.0.10\nnameserver 1.1.1.1\n";
        assert_eq!(first_nameserver(conf), Some("10.96.0.10:53".parse().unwrap()));
        assert_eq!(first_nameserver("options ndots:5\n"), None);
        assert_eq!(first_nameserver("nameserver fe80::1%eth0\n"), None);
    }
}
