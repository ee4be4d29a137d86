//! The veth pair of one sandbox, and running code inside its network
//! namespace.
//!
//! Commands inside the namespace run from a fresh thread that entered it
//! (`setns` is per thread and a child inherits it); the thread ends with its
//! work, so no runtime thread ever changes namespace.

use std::fs::File;
use std::io;
use std::net::Ipv4Addr;
use std::os::fd::OwnedFd;
use std::process::{Command, Stdio};

/// The /31 of sandbox `n` in `net`: (node end, sandbox end).
pub fn addresses(net: (Ipv4Addr, u8), n: usize) -> Option<(Ipv4Addr, Ipv4Addr)> {
    let size = 1u64 << (32 - u32::from(net.1));
    let offset = 2 * n as u64;
    if offset + 1 >= size {
        return None;
    }
    let base = u64::from(u32::from(net.0));
    let node = u32::try_from(base + offset).ok()?;
    Some((Ipv4Addr::from(node), Ipv4Addr::from(node + 1)))
}

/// Token-bucket shaping at `rate_bits` (the burst is ~20 ms of traffic).
pub fn tbf_args(dev: &str, rate_bits: u64) -> Vec<String> {
    let burst = (rate_bits / 8 / 50).max(64 * 1024);
    ["qdisc", "replace", "dev", dev, "root", "tbf", "rate", &format!("{rate_bits}bit"), "burst", &burst.to_string(), "latency", "50ms"]
        .iter()
        .map(|s| s.to_string())
        .collect()
}

/// `ip -batch` lines creating the pair with its node end configured; the
/// other end appears as `eth0` in the namespace of `pid`.
pub fn node_side(ifname: &str, pid: i32, node: Ipv4Addr) -> String {
    format!("link add {ifname} type veth peer name eth0 netns {pid}\naddr add {node}/31 dev {ifname}\nlink set {ifname} up\n")
}

/// `ip -batch` lines configuring `eth0` inside the sandbox.
pub fn sandbox_side(node: Ipv4Addr, sandbox: Ipv4Addr) -> String {
    format!("addr add {sandbox}/31 dev eth0\nlink set eth0 up\nroute add default via {node} dev eth0\n")
}

/// Runs `program args` with `stdin`, failing with its stderr.
pub fn command(program: &str, args: &[String], stdin: Option<&str>) -> io::Result<()> {
    let mut child = Command::new(program)
        .args(args)
        .stdin(if stdin.is_some() { Stdio::piped() } else { Stdio::null() })
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()?;
    if let (Some(text), Some(mut pipe)) = (stdin, child.stdin.take()) {
        io::Write::write_all(&mut pipe, text.as_bytes())?;
    }
    let out = child.wait_with_output()?;
    if out.status.success() {
        Ok(())
    } else {
        Err(io::Error::other(format!("{program} {}: {}", args.join(" "), String::from_utf8_lossy(&out.stderr).trim())))
    }
}

/// Opens the network namespace of `pid`.
pub fn open_netns(pid: i32) -> io::Result<OwnedFd> {
    Ok(File::open(format!("/proc/{pid}/ns/net"))?.into())
}

/// Runs `f` on a new thread inside the network namespace `ns` (which
/// ends with it) and waits for its result without blocking the runtime.
pub async fn in_netns<T: Send + 'static>(ns: &OwnedFd, f: impl FnOnce() -> io::Result<T> + Send + 'static) -> io::Result<T> {
    let ns = ns.try_clone()?;
    let (tx, rx) = tokio::sync::oneshot::channel();
    std::thread::Builder::new().name("warren-netns".into()).spawn(move || {
        let result = nix::sched::setns(&ns, nix::sched::CloneFlags::CLONE_NEWNET).map_err(io::Error::from).and_then(|()| f());
        let _ = tx.send(result);
    })?;
    rx.await.map_err(|_| io::Error::other("a thread inside a sandbox's network namespace panicked"))?
}

/// Inside the namespace: turns IPv6 off (the sandbox has no IPv6 route
/// anyway; this also drops its link-local address) and configures `eth0`
/// and its shaping.
pub fn configure_inside(proc_dir: &std::path::Path, node: Ipv4Addr, sandbox: Ipv4Addr, rate_bits: u64) -> io::Result<()> {
    for knob in ["all", "default"] {
        // /proc/sys/net shows the namespace of the thread opening it. Best
        // effort: the node drops IPv6 from sandboxes anyway.
        let _ = std::fs::write(proc_dir.join(format!("sys/net/ipv6/conf/{knob}/disable_ipv6")), "1");
    }
    command("ip", &["-batch".into(), "-".into()], Some(&sandbox_side(node, sandbox)))?;
    command("tc", &tbf_args("eth0", rate_bits), None)
}

/// Names of the node's sandbox veths (to remove leftovers at start).
pub fn leftover_links(prefix: &str) -> Vec<String> {
    let Ok(dir) = std::fs::read_dir("/sys/class/net") else { return Vec::new() };
    dir.filter_map(|e| e.ok()?.file_name().into_string().ok()).filter(|n| n.starts_with(prefix) && n[prefix.len()..].bytes().all(|b| b.is_ascii_digit())).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_slot_gets_its_own_slash_31_inside_the_range() {
        let net = (Ipv4Addr::new(100, 127, 0, 0), 16);
        assert_eq!(addresses(net, 0), Some((Ipv4Addr::new(100, 127, 0, 0), Ipv4Addr::new(100, 127, 0, 1))));
        assert_eq!(addresses(net, 130), Some((Ipv4Addr::new(100, 127, 1, 4), Ipv4Addr::new(100, 127, 1, 5))));
        assert_eq!(addresses(net, 32767), Some((Ipv4Addr::new(100, 127, 255, 254), Ipv4Addr::new(100, 127, 255, 255))));
        assert_eq!(addresses(net, 32768), None);
        assert_eq!(addresses((Ipv4Addr::new(10, 9, 0, 0), 30), 1), Some((Ipv4Addr::new(10, 9, 0, 2), Ipv4Addr::new(10, 9, 0, 3))));
    }

    #[test]
    fn shaping_and_link_commands() {
        let a = tbf_args("wrn1", 200_000_000);
        assert_eq!(a.join(" "), "qdisc replace dev wrn1 root tbf rate 200000000bit burst 500000 latency 50ms");
        assert!(tbf_args("eth0", 1_000_000).contains(&"65536".to_string()), "burst never below 64 KiB");
        let node = Ipv4Addr::new(100, 127, 0, 0);
        assert!(node_side("wrn0", 42, node).starts_with("link add wrn0 type veth peer name eth0 netns 42\n"));
        assert!(sandbox_side(node, Ipv4Addr::new(100, 127, 0, 1)).contains("route add default via 100.127.0.0 dev eth0"));
    }
}
