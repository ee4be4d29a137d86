//! A sandbox's veth pair, addresses, default route and shaping over
//! rtnetlink: what `ip link add … type veth`, `ip addr add`, `ip route add
//! default` and `tc qdisc replace … tbf` do, without running them.

use std::io;
use std::net::Ipv4Addr;
use std::os::fd::RawFd;

use crate::netlink::{Msgs, Socket, NLM_F_ACK, NLM_F_CREATE, NLM_F_EXCL, NLM_F_REPLACE};

const RTM_NEWLINK: u16 = 16;
const RTM_DELLINK: u16 = 17;
const RTM_NEWADDR: u16 = 20;
const RTM_NEWROUTE: u16 = 24;
const RTM_NEWQDISC: u16 = 36;
const IFLA_IFNAME: u16 = 3;
const IFLA_LINKINFO: u16 = 18;
const IFLA_INFO_KIND: u16 = 1;
const IFLA_INFO_DATA: u16 = 2;
const IFLA_NET_NS_FD: u16 = 28;
const VETH_INFO_PEER: u16 = 1;
const IFA_ADDRESS: u16 = 1;
const IFA_LOCAL: u16 = 2;
const RTA_OIF: u16 = 4;
const RTA_GATEWAY: u16 = 5;
const TCA_KIND: u16 = 1;
const TCA_OPTIONS: u16 = 2;
const TCA_TBF_PARMS: u16 = 1;
const TCA_TBF_RATE64: u16 = 4;
const TCA_TBF_BURST: u16 = 6;
const AF_INET: u8 = 2;
const IFF_UP: u32 = 1;
const TC_H_ROOT: u32 = 0xffff_ffff;
const RT_TABLE_MAIN: u8 = 254;
const RTPROT_BOOT: u8 = 3;
const RTN_UNICAST: u8 = 1;
const TC_LINKLAYER_ETHERNET: u8 = 1;
/// How long a packet may wait in the token bucket (as `latency 50ms`).
const TBF_LATENCY_US: u64 = 50_000;
/// The kernel's packet-scheduler clock: 64 ns per tick.
const PSCHED_NS_PER_TICK: u64 = 64;

fn ifinfomsg(index: i32, flags: u32, change: u32) -> [u8; 16] {
    let mut h = [0u8; 16];
    h[4..8].copy_from_slice(&index.to_ne_bytes());
    h[8..12].copy_from_slice(&flags.to_ne_bytes());
    h[12..16].copy_from_slice(&change.to_ne_bytes());
    h
}

/// A veth pair: `name` here, up; `peer` down in the network namespace
/// `peer_ns` (it comes up once configured there: [`configure_inside`]).
pub fn add_veth(m: &mut Msgs, name: &str, peer: &str, peer_ns: RawFd) {
    let at = m.begin(RTM_NEWLINK, NLM_F_CREATE | NLM_F_EXCL | NLM_F_ACK, &ifinfomsg(0, IFF_UP, IFF_UP), "creating the veth pair");
    m.str(IFLA_IFNAME, name);
    m.nest(IFLA_LINKINFO, |m| {
        m.str(IFLA_INFO_KIND, "veth");
        m.nest(IFLA_INFO_DATA, |m| {
            // The peer's attribute is an ifinfomsg followed by its own attributes.
            let peer_at = m.open(VETH_INFO_PEER);
            m.raw(&ifinfomsg(0, 0, 0));
            m.str(IFLA_IFNAME, peer);
            m.ne32(IFLA_NET_NS_FD, peer_ns as u32);
            m.close(peer_at);
        });
    });
    m.end(at);
}

/// Removes the link `name` (and with a veth, its peer).
pub fn del_link(m: &mut Msgs, name: &str) {
    let at = m.begin(RTM_DELLINK, NLM_F_ACK, &ifinfomsg(0, 0, 0), "removing a link");
    m.str(IFLA_IFNAME, name);
    m.end(at);
}

/// `addr/prefix` on the link `index`.
pub fn add_address(m: &mut Msgs, index: u32, addr: Ipv4Addr, prefix: u8) {
    let mut h = [0u8; 8];
    h[0] = AF_INET;
    h[1] = prefix;
    h[4..8].copy_from_slice(&index.to_ne_bytes());
    let at = m.begin(RTM_NEWADDR, NLM_F_CREATE | NLM_F_EXCL | NLM_F_ACK, &h, "adding an address");
    m.attr(IFA_LOCAL, &addr.octets());
    m.attr(IFA_ADDRESS, &addr.octets());
    m.end(at);
}

/// Brings the link `index` up.
pub fn set_up(m: &mut Msgs, index: u32) {
    m.bare(RTM_NEWLINK, NLM_F_ACK, &ifinfomsg(index as i32, IFF_UP, IFF_UP), "bringing a link up");
}

/// The default route via `gateway` on the link `index`.
pub fn add_default_route(m: &mut Msgs, gateway: Ipv4Addr, index: u32) {
    let mut h = [0u8; 12];
    h[0] = AF_INET;
    h[4] = RT_TABLE_MAIN;
    h[5] = RTPROT_BOOT;
    h[7] = RTN_UNICAST;
    let at = m.begin(RTM_NEWROUTE, NLM_F_CREATE | NLM_F_EXCL | NLM_F_ACK, &h, "adding the default route");
    m.attr(RTA_GATEWAY, &gateway.octets());
    m.ne32(RTA_OIF, index);
    m.end(at);
}

/// Token-bucket shaping at `rate_bits` on the link `index`, as the root
/// qdisc (replacing whatever was there). The burst is ~20 ms of traffic,
/// at least 64 KiB; packets wait at most 50 ms.
pub fn shape(m: &mut Msgs, index: u32, rate_bits: u64) {
    let rate = (rate_bits / 8).max(1);
    let burst = burst_bytes(rate_bits);
    let mut h = [0u8; 20];
    h[4..8].copy_from_slice(&(index as i32).to_ne_bytes());
    h[12..16].copy_from_slice(&TC_H_ROOT.to_ne_bytes());
    let at = m.begin(RTM_NEWQDISC, NLM_F_CREATE | NLM_F_REPLACE | NLM_F_ACK, &h, "shaping the link");
    m.str(TCA_KIND, "tbf");
    m.nest(TCA_OPTIONS, |m| {
        m.attr(TCA_TBF_PARMS, &tbf_qopt(rate, burst));
        m.ne32(TCA_TBF_BURST, burst);
        if rate > u64::from(u32::MAX) {
            m.attr(TCA_TBF_RATE64, &rate.to_ne_bytes());
        }
    });
    m.end(at);
}

/// The token bucket's size for `rate_bits`.
pub fn burst_bytes(rate_bits: u64) -> u32 {
    u32::try_from((rate_bits / 8 / 50).max(64 * 1024)).unwrap_or(u32::MAX)
}

/// `struct tc_tbf_qopt`: the rate (bytes/s; the link layer named, so the
/// kernel needs no rate table), no peak rate, the queue limit and the
/// bucket in scheduler ticks.
fn tbf_qopt(rate: u64, burst: u32) -> [u8; 36] {
    let mut q = [0u8; 36];
    q[0] = 3; // cell_log, as tc computes for a 2047-byte MTU
    q[1] = TC_LINKLAYER_ETHERNET;
    q[4..6].copy_from_slice(&(-1i16).to_ne_bytes()); // cell_align
    q[8..12].copy_from_slice(&u32::try_from(rate).unwrap_or(u32::MAX).to_ne_bytes());
    let limit = rate.saturating_mul(TBF_LATENCY_US) / 1_000_000 + u64::from(burst);
    q[24..28].copy_from_slice(&u32::try_from(limit).unwrap_or(u32::MAX).to_ne_bytes());
    let buffer_ticks = u64::from(burst).saturating_mul(1_000_000_000) / rate / PSCHED_NS_PER_TICK;
    q[28..32].copy_from_slice(&u32::try_from(buffer_ticks).unwrap_or(u32::MAX).to_ne_bytes());
    q
}

/// The index of the link `name` in the calling thread's namespace.
pub fn index_of(name: &str) -> io::Result<u32> {
    nix::net::if_::if_nametoindex(name).map_err(|e| io::Error::new(io::Error::from(e).kind(), format!("finding link {name}: {e}")))
}

/// Whether a link `name` exists in the calling thread's namespace.
pub fn exists(name: &str) -> bool {
    nix::net::if_::if_nametoindex(name).is_ok()
}

/// Inside the sandbox's namespace (on a thread that entered it): turns
/// IPv6 off (the sandbox has no IPv6 route anyway; this also drops its
/// link-local address), then addresses `eth0`, brings it up, routes via
/// the node end and shapes it — one send, four acknowledgements.
pub fn configure_inside(proc_dir: &std::path::Path, node: Ipv4Addr, sandbox: Ipv4Addr, rate_bits: u64) -> io::Result<()> {
    for knob in ["all", "default"] {
        // /proc/sys/net shows the namespace of the thread opening it. Best
        // effort: the node drops IPv6 from sandboxes anyway.
        let _ = std::fs::write(proc_dir.join(format!("sys/net/ipv6/conf/{knob}/disable_ipv6")), "1");
    }
    let mut sock = Socket::open(crate::netlink::Family::Route)?;
    let eth0 = index_of("eth0")?;
    let mut m = sock.msgs();
    add_address(&mut m, eth0, sandbox, 31);
    set_up(&mut m, eth0);
    add_default_route(&mut m, node, eth0);
    shape(&mut m, eth0, rate_bits);
    sock.transact(&m)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_bucket_holds_twenty_milliseconds_and_never_less_than_64_kib() {
        assert_eq!(burst_bytes(200_000_000), 500_000);
        assert_eq!(burst_bytes(1_000_000), 65_536);
        let q = tbf_qopt(25_000_000, 500_000);
        assert_eq!(u32::from_ne_bytes(q[8..12].try_into().unwrap()), 25_000_000, "bytes per second");
        assert_eq!(u32::from_ne_bytes(q[24..28].try_into().unwrap()), 1_250_000 + 500_000, "50 ms of traffic plus the bucket");
        assert_eq!(u32::from_ne_bytes(q[28..32].try_into().unwrap()), 312_500, "20 ms in 64 ns ticks");
        assert_eq!(q[1], TC_LINKLAYER_ETHERNET, "no rate table needed");
    }

    #[test]
    fn a_veth_peer_is_an_ifinfomsg_then_its_attributes() {
        let mut m = Msgs::new(1);
        add_veth(&mut m, "wrn3", "eth0", 9);
        let b = m.bytes();
        let at = |s: &[u8]| b.windows(s.len()).position(|w| w == s).unwrap();
        assert!(at(b"wrn3\0") < at(b"veth\0") && at(b"veth\0") < at(b"eth0\0"), "name, kind, then the peer's name");
        assert_eq!(at(b"eth0\0") - 4 - 16, at(&[(4 + 16 + 12 + 8) as u8, 0, VETH_INFO_PEER as u8, 0x80]) + 4, "the peer's ifinfomsg comes first in its attribute");
        assert_eq!(u32::from_ne_bytes(b[b.len() - 4..].try_into().unwrap()), 9, "the peer goes to the namespace of fd 9");
    }

    /// Against the kernel: a pair into a namespace of our own, configured
    /// on both ends, reads back as `ip` and `tc` would have made it.
    #[test]
    fn the_kernel_holds_the_pair_addresses_route_and_shaping() {
        use std::process::Command;
        if !nix::unistd::geteuid().is_root() || Command::new("ip").arg("-V").output().is_err() {
            eprintln!("SKIPPED the_kernel_holds_the_pair_addresses_route_and_shaping: needs root and ip");
            return;
        }
        struct Ns(String);
        impl Drop for Ns {
            fn drop(&mut self) {
                let _ = Command::new("ip").args(["netns", "del", &self.0]).status();
            }
        }
        let id = std::process::id() % 100_000;
        let ns = Ns(format!("wrnt{id}"));
        assert!(Command::new("ip").args(["netns", "add", &ns.0]).status().unwrap().success());
        let fd: std::os::fd::OwnedFd = std::fs::File::open(format!("/run/netns/{}", ns.0)).unwrap().into();
        let name = format!("zv{id}");
        let (node, sandbox) = (Ipv4Addr::new(100, 127, 250, 0), Ipv4Addr::new(100, 127, 250, 1));
        let mut sock = Socket::open(crate::netlink::Family::Route).unwrap();
        let mut m = sock.msgs();
        add_veth(&mut m, &name, "eth0", std::os::fd::AsRawFd::as_raw_fd(&fd));
        sock.transact(&m).unwrap();
        let index = index_of(&name).unwrap();
        let mut m = sock.msgs();
        add_address(&mut m, index, node, 31);
        shape(&mut m, index, 200_000_000);
        sock.transact(&m).unwrap();
        let inside = std::thread::spawn(move || {
            nix::sched::setns(&fd, nix::sched::CloneFlags::CLONE_NEWNET).unwrap();
            configure_inside(std::path::Path::new("/proc"), node, sandbox, 1_000_000)
        });
        inside.join().unwrap().unwrap();
        let out = |args: &[&str]| String::from_utf8_lossy(&Command::new(args[0]).args(&args[1..]).output().unwrap().stdout).into_owned();
        let addr = out(&["ip", "-o", "-4", "addr", "show", "dev", &name]);
        assert!(addr.contains("inet 100.127.250.0/31"), "{addr}");
        assert!(out(&["ip", "-o", "link", "show", "dev", &name]).contains(",UP"), "the node end is up");
        let shaped = out(&["tc", "qdisc", "show", "dev", &name]);
        assert!(shaped.contains("root") && shaped.contains("rate 200Mbit burst 500000b lat 50ms"), "{shaped}");
        let inner = out(&["ip", "-n", &ns.0, "-o", "-4", "addr", "show", "dev", "eth0"]);
        assert!(inner.contains("inet 100.127.250.1/31"), "{inner}");
        assert!(out(&["ip", "-n", &ns.0, "-o", "link", "show", "dev", "eth0"]).contains(",UP"));
        assert!(out(&["ip", "-n", &ns.0, "-6", "addr"]).trim().is_empty(), "no IPv6 address inside");
        assert!(out(&["ip", "-n", &ns.0, "route"]).contains("default via 100.127.250.0 dev eth0"));
        let inner_shaped = out(&["tc", "-n", &ns.0, "qdisc", "show", "dev", "eth0"]);
        assert!(inner_shaped.contains("rate 1Mbit burst 64Kb lat 50ms"), "{inner_shaped}");
        // Removing one end removes the pair.
        let mut m = sock.msgs();
        del_link(&mut m, &name);
        sock.transact(&m).unwrap();
        assert!(!exists(&name));
        let mut m = sock.msgs();
        del_link(&mut m, &name);
        assert!(sock.transact(&m).is_err(), "a missing link is an error");
    }
}
