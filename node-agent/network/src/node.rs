//! The node's side: the table every sandbox chain hangs off, and the
//! per-sandbox setup and teardown.

use std::io;
use std::net::{Ipv4Addr, SocketAddr};
use std::os::fd::OwnedFd;
use std::sync::Arc;

use tracing::warn;

use crate::dns::DnsProxy;
use crate::nflog::Refusals;
use crate::link;
use crate::nft::{self, SandboxNames};
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
    /// Adds resolved addresses to the sandboxes' allow sets.
    sets: Arc<crate::setelem::SetWriter>,
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
    /// Checks the tools, removes what an earlier agent left, installs the
    /// node table and turns on forwarding.
    pub async fn start(cfg: NodeNetConfig) -> Result<NodeNet, NetError> {
        for tool in ["nft", "ip", "tc"] {
            which(tool).map_err(at("looking for the networking tools"))?;
        }
        for ifname in link::leftover_links(&cfg.scope.prefix) {
            let _ = link::command("ip", &["link".into(), "del".into(), ifname], None);
        }
        let refusals = Refusals::start(cfg.scope.group).map_err(at("receiving refused packets (NFLOG)"))?;
        nft::run(&nft::node_table(&cfg.scope, cfg.sandbox_net), &["-f", "-"]).await.map_err(at("installing the node table"))?;
        std::fs::write(cfg.proc_dir.join("sys/net/ipv4/ip_forward"), "1").map_err(at("enabling IPv4 forwarding"))?;
        let sets = Arc::new(crate::setelem::SetWriter::open().map_err(at("opening the nftables netlink socket"))?);
        Ok(NodeNet { cfg, refusals, sets, next_mark: rand::random::<u32>().into() })
    }

    /// Removes the node table (sandboxes are gone by then).
    pub async fn stop(&self) {
        if let Err(e) = nft::run(&nft::drop_node_table(&self.cfg.scope), &["-f", "-"]).await {
            warn!(error = %e, "removing the node's nftables table");
        }
    }

    /// Gives the sandbox in slot `slot`, whose init is `pid`, its network.
    /// Nothing is left behind when this fails.
    pub async fn setup(&self, slot: usize, pid: i32, policy: Arc<NetPolicy>) -> Result<SandboxNet, NetError> {
        // 0 is the mark of connections nobody marked.
        let mark = loop {
            let m = self.next_mark.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            if m != 0 {
                break m;
            }
        };
        let names = SandboxNames::new(&self.cfg.scope, slot, mark);
        let (node, sandbox) = link::addresses(self.cfg.sandbox_net, slot)
            .ok_or_else(|| at("addressing")(io::Error::other("the sandbox range has no address left for this slot")))?;
        let netns = link::open_netns(pid).map_err(at("opening the network namespace"))?;
        self.refusals.watch(sandbox);
        let mut net = SandboxNet { names, netns, dns: None, address: sandbox, refusals: self.refusals.clone() };
        match net.build(&self.cfg, pid, node, sandbox, policy, self.sets.clone()).await {
            Ok(()) => Ok(net),
            Err(e) => {
                net.teardown().await;
                Err(e)
            }
        }
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
}

impl SandboxNet {
    async fn build(&mut self, cfg: &NodeNetConfig, pid: i32, node: Ipv4Addr, sandbox: Ipv4Addr, policy: Arc<NetPolicy>, sets: Arc<crate::setelem::SetWriter>) -> Result<(), NetError> {
        let t0 = std::time::Instant::now();
        // The chain first: until it exists the interface matches nothing and
        // its traffic is dropped.
        nft::run(&nft::sandbox_rules(&self.names, &policy), &["-f", "-"]).await.map_err(at("installing the sandbox chain"))?;
        let ifname = self.names.ifname.clone();
        let rate = policy.rate_bits;
        blocking(move || {
            // A pair an interrupted teardown left under this slot's name.
            if std::path::Path::new("/sys/class/net").join(&ifname).exists() {
                let _ = link::command("ip", &["link".into(), "del".into(), ifname.clone()], None);
            }
            link::command("ip", &["-batch".into(), "-".into()], Some(&link::node_side(&ifname, pid, node)))?;
            link::command("tc", &link::tbf_args(&ifname, rate), None)
        })
        .await
        .map_err(at("creating the veth pair"))?;
        let t_veth = t0.elapsed();
        let proc_dir = cfg.proc_dir.clone();
        let socket = link::in_netns(&self.netns, move || {
            link::configure_inside(&proc_dir, node, sandbox, rate)?;
            std::net::UdpSocket::bind(SANDBOX_RESOLVER)
        })
        .await
        .map_err(at("configuring inside the sandbox"))?;
        let forwarding = crate::dns::Forwarding { upstream: cfg.upstream_dns, policy, names: self.names.clone(), sets };
        self.dns = Some(DnsProxy::spawn(socket, Some(forwarding)).map_err(at("starting the DNS proxy"))?);
        let us = |d: std::time::Duration| d.as_micros() as u64;
        tracing::debug!(veth_us = us(t_veth), total_us = us(t0.elapsed()), "sandbox network set up");
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

    /// Stops the proxy and removes the veth, chain and sets; call once the
    /// sandbox's processes are gone.
    pub async fn teardown(mut self) {
        self.dns = None;
        // Deleted now, not whenever the kernel gets to the dead namespace:
        // the slot (its interface name and addresses) is reused as soon as
        // this returns.
        let ifname = self.names.ifname.clone();
        let _ = blocking(move || link::command("ip", &["link".into(), "del".into(), ifname], None)).await;
        // One batch normally; piece by piece when something was never made.
        let steps = nft::sandbox_teardown(&self.names);
        if nft::run(&steps.concat(), &["-f", "-"]).await.is_err() {
            for step in steps {
                let _ = nft::run(&step, &["-f", "-"]).await;
            }
        }
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
