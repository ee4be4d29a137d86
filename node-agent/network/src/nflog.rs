//! Refused packets, pushed by the kernel: every sandbox chain logs what it
//! refuses to one NFLOG group of this agent; one netlink socket receives the
//! packet headers and counts them per sandbox address. Reading a call's
//! refusals is then a memory lookup (after draining what the kernel already
//! queued), not a command on the response path.
//!
//! The log rule is rate-limited per sandbox, and counts per sandbox are
//! bounded: a program flooding refused packets cannot flood the agent.

use std::collections::{BTreeMap, HashMap};
use std::io;
use std::net::{IpAddr, Ipv4Addr};
use std::os::fd::{AsRawFd, OwnedFd};
use std::sync::{Arc, Mutex};

use nix::sys::socket::{self, AddressFamily, NetlinkAddr, SockFlag, SockProtocol, SockType};
use tracing::warn;

use crate::policy::Blocked;

/// Distinct destinations counted per sandbox.
const MAX_PER_SANDBOX: usize = 256;
/// Bytes of each refused packet copied to us: IPv4 and TCP/UDP headers.
pub const SNAPLEN: u32 = 64;

const NFNL_SUBSYS_ULOG: u16 = 4;
const NFULNL_MSG_PACKET: u16 = 0;
const NFULNL_MSG_CONFIG: u16 = 1;
const NFULA_CFG_CMD: u16 = 1;
const NFULA_CFG_MODE: u16 = 2;
const NFULA_CFG_TIMEOUT: u16 = 3;
const NFULA_CFG_QTHRESH: u16 = 4;
const NFULA_PAYLOAD: u16 = 9;
const NFULNL_CFG_CMD_BIND: u8 = 1;
const NFULNL_COPY_PACKET: u8 = 2;
const NLMSG_ERROR: u16 = 2;
const NLM_F_REQUEST: u16 = 1;
const NLM_F_ACK: u16 = 4;

/// The NFLOG group of an agent's prefix (distinct agents on one node need
/// distinct groups; the test prefixes `tl0`–`tl199` and `wrn` are).
pub fn group_of(prefix: &str) -> u16 {
    let h = prefix.bytes().fold(7u32, |h, b| h.wrapping_mul(31).wrapping_add(u32::from(b)));
    0x4000 + (h % 0x3000) as u16
}

/// One config request for `group` (pure).
fn config_message(group: u16, seq: u32, attr_type: u16, payload: &[u8]) -> Vec<u8> {
    let attr_len = 4 + payload.len();
    let padded = (attr_len + 3) & !3;
    let total = 16 + 4 + padded;
    let mut m = Vec::with_capacity(total);
    m.extend_from_slice(&(total as u32).to_ne_bytes());
    m.extend_from_slice(&((NFNL_SUBSYS_ULOG << 8) | NFULNL_MSG_CONFIG).to_ne_bytes());
    m.extend_from_slice(&(NLM_F_REQUEST | NLM_F_ACK).to_ne_bytes());
    m.extend_from_slice(&seq.to_ne_bytes());
    m.extend_from_slice(&0u32.to_ne_bytes());
    // nfgenmsg: AF_UNSPEC, version 0, the group (big endian).
    m.extend_from_slice(&[0, 0]);
    m.extend_from_slice(&group.to_be_bytes());
    m.extend_from_slice(&(attr_len as u16).to_ne_bytes());
    m.extend_from_slice(&attr_type.to_ne_bytes());
    m.extend_from_slice(payload);
    m.resize(total, 0);
    m
}

/// Netlink messages in one datagram: (type, body after the header).
fn messages(buf: &[u8]) -> impl Iterator<Item = (u16, &[u8])> {
    let mut rest = buf;
    std::iter::from_fn(move || {
        if rest.len() < 16 {
            return None;
        }
        let len = u32::from_ne_bytes(rest[0..4].try_into().ok()?) as usize;
        if len < 16 || len > rest.len() {
            return None;
        }
        let kind = u16::from_ne_bytes(rest[4..6].try_into().ok()?);
        let body = &rest[16..len];
        rest = &rest[((len + 3) & !3).min(rest.len())..];
        Some((kind, body))
    })
}

/// The payload attribute of an NFLOG packet message body.
fn payload(body: &[u8]) -> Option<&[u8]> {
    let mut rest = body.get(4..)?; // nfgenmsg
    while rest.len() >= 4 {
        let len = u16::from_ne_bytes([rest[0], rest[1]]) as usize;
        let kind = u16::from_ne_bytes([rest[2], rest[3]]) & 0x7fff;
        if len < 4 || len > rest.len() {
            return None;
        }
        if kind == NFULA_PAYLOAD {
            return Some(&rest[4..len]);
        }
        rest = &rest[((len + 3) & !3).min(rest.len())..];
    }
    None
}

/// A refused packet's (source, destination, protocol, port), from its IPv4
/// header and the start of its TCP/UDP header (pure).
pub fn refused_packet(ip: &[u8]) -> Option<(Ipv4Addr, Ipv4Addr, &'static str, u16)> {
    if ip.len() < 20 || ip[0] >> 4 != 4 {
        return None;
    }
    let ihl = usize::from(ip[0] & 0x0f) * 4;
    let protocol = match ip[9] {
        6 => "tcp",
        17 => "udp",
        _ => return None,
    };
    let port = ip.get(ihl + 2..ihl + 4).map(|p| u16::from_be_bytes([p[0], p[1]]))?;
    let src = Ipv4Addr::new(ip[12], ip[13], ip[14], ip[15]);
    let dst = Ipv4Addr::new(ip[16], ip[17], ip[18], ip[19]);
    Some((src, dst, protocol, port))
}

type Counts = HashMap<Ipv4Addr, BTreeMap<(Ipv4Addr, &'static str, u16), u64>>;

/// The agent's receiver. A thread waits for the socket to become readable
/// and drains it; a caller asking for a sandbox's refusals drains it too.
/// Both read only while holding the counts, so nothing read is ever missing
/// from them.
pub struct Refusals {
    fd: OwnedFd,
    counts: Mutex<Counts>,
}

impl Refusals {
    /// Binds `group` and starts receiving.
    pub fn start(group: u16) -> io::Result<Arc<Refusals>> {
        let fd = socket::socket(AddressFamily::Netlink, SockType::Raw, SockFlag::SOCK_CLOEXEC, SockProtocol::NetlinkNetFilter)?;
        socket::bind(fd.as_raw_fd(), &NetlinkAddr::new(0, 0))?;
        let _ = socket::setsockopt(&fd, socket::sockopt::RcvBufForce, &(4 << 20));
        let mut mode = SNAPLEN.to_be_bytes().to_vec();
        mode.extend_from_slice(&[NFULNL_COPY_PACKET, 0]);
        let requests: [(u16, Vec<u8>); 4] = [
            (NFULA_CFG_CMD, vec![NFULNL_CFG_CMD_BIND]),
            (NFULA_CFG_MODE, mode),
            // Deliver each packet at once: a call's refusals are queued
            // before its program sees the refusal.
            (NFULA_CFG_QTHRESH, 1u32.to_be_bytes().to_vec()),
            (NFULA_CFG_TIMEOUT, 0u32.to_be_bytes().to_vec()),
        ];
        for (seq, (kind, payload)) in requests.iter().enumerate() {
            socket::send(fd.as_raw_fd(), &config_message(group, seq as u32 + 1, *kind, payload), socket::MsgFlags::empty())?;
            acked(&fd)?;
        }
        let me = Arc::new(Refusals { fd, counts: Mutex::default() });
        let weak = Arc::downgrade(&me);
        std::thread::Builder::new().name("warren-nflog".into()).spawn(move || loop {
            let Some(me) = weak.upgrade() else { return };
            let mut fds = [nix::poll::PollFd::new(std::os::fd::AsFd::as_fd(&me.fd), nix::poll::PollFlags::POLLIN)];
            // Wakes now and then to notice the receiver is gone.
            match nix::poll::poll(&mut fds, nix::poll::PollTimeout::from(1000u16)) {
                Ok(n) if n > 0 => me.drain(),
                Ok(_) | Err(nix::errno::Errno::EINTR) => {}
                Err(e) => {
                    warn!(error = %e, "waiting for refused packets");
                    return;
                }
            }
        })?;
        Ok(me)
    }

    /// Reads everything queued (non-blocking) into the counts.
    fn drain(&self) {
        let mut buf = vec![0u8; 64 * 1024];
        let mut counts = self.counts.lock().unwrap_or_else(|p| p.into_inner());
        loop {
            match socket::recv(self.fd.as_raw_fd(), &mut buf, socket::MsgFlags::MSG_DONTWAIT) {
                Ok(0) => return,
                Ok(n) => {
                    for (kind, body) in messages(&buf[..n]) {
                        if kind != (NFNL_SUBSYS_ULOG << 8) | NFULNL_MSG_PACKET {
                            continue;
                        }
                        let Some((src, dst, protocol, port)) = payload(body).and_then(refused_packet) else { continue };
                        // Only sandboxes being watched are counted.
                        if let Some(per) = counts.get_mut(&src) {
                            if per.len() < MAX_PER_SANDBOX || per.contains_key(&(dst, protocol, port)) {
                                *per.entry((dst, protocol, port)).or_default() += 1;
                            }
                        }
                    }
                }
                Err(nix::errno::Errno::EAGAIN) => return,
                // The buffer overflowed under a flood: counts are a lower bound.
                Err(nix::errno::Errno::ENOBUFS) => continue,
                Err(e) => {
                    warn!(error = %e, "reading refused packets");
                    return;
                }
            }
        }
    }

    /// Starts counting for the sandbox at `src` (from zero).
    pub fn watch(&self, src: Ipv4Addr) {
        self.counts.lock().unwrap_or_else(|p| p.into_inner()).insert(src, BTreeMap::new());
    }

    /// What was refused to `src` so far.
    pub fn refused(&self, src: Ipv4Addr) -> Vec<Blocked> {
        self.drain();
        let counts = self.counts.lock().unwrap_or_else(|p| p.into_inner());
        let Some(per) = counts.get(&src) else { return Vec::new() };
        per.iter().map(|((ip, protocol, port), count)| Blocked { host: None, ip: Some(IpAddr::V4(*ip)), port: *port, protocol: protocol.to_string(), count: *count }).collect()
    }

    /// Stops counting for `src`.
    pub fn forget(&self, src: Ipv4Addr) {
        self.counts.lock().unwrap_or_else(|p| p.into_inner()).remove(&src);
    }
}

/// Waits for the kernel's acknowledgement of a config request.
fn acked(fd: &OwnedFd) -> io::Result<()> {
    let mut buf = [0u8; 1024];
    let n = socket::recv(fd.as_raw_fd(), &mut buf, socket::MsgFlags::empty())?;
    for (kind, body) in messages(&buf[..n]) {
        if kind == NLMSG_ERROR {
            let code = body.get(0..4).map(|b| i32::from_ne_bytes([b[0], b[1], b[2], b[3]])).unwrap_or(0);
            if code != 0 {
                return Err(io::Error::from_raw_os_error(-code));
            }
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn groups_of_the_default_and_test_prefixes_are_distinct() {
        let mut seen = std::collections::HashSet::new();
        assert!(seen.insert(group_of("wrn")));
        for u in 0..200 {
            assert!(seen.insert(group_of(&format!("tl{u}"))), "tl{u} collides");
        }
    }

    #[test]
    fn a_packet_message_yields_its_refused_destination() {
        // IPv4 (ihl 5) TCP from 100.127.0.1 to 10.200.0.10:80.
        let mut ip = vec![0x45, 0, 0, 60, 0, 0, 0, 0, 64, 6, 0, 0, 100, 127, 0, 1, 10, 200, 0, 10];
        ip.extend_from_slice(&[0xc3, 0x50, 0, 80]);
        assert_eq!(refused_packet(&ip), Some((Ipv4Addr::new(100, 127, 0, 1), Ipv4Addr::new(10, 200, 0, 10), "tcp", 80)));
        let mut body = vec![0, 0, 0, 0]; // nfgenmsg
        body.extend_from_slice(&8u16.to_ne_bytes()); // some other attribute first
        body.extend_from_slice(&1u16.to_ne_bytes());
        body.extend_from_slice(&[0, 8, 0, 0]);
        body.extend_from_slice(&((4 + ip.len()) as u16).to_ne_bytes());
        body.extend_from_slice(&NFULA_PAYLOAD.to_ne_bytes());
        body.extend_from_slice(&ip);
        assert_eq!(payload(&body), Some(&ip[..]));
        let mut msg = ((16 + body.len()) as u32).to_ne_bytes().to_vec();
        msg.extend_from_slice(&((NFNL_SUBSYS_ULOG << 8) | NFULNL_MSG_PACKET).to_ne_bytes());
        msg.extend_from_slice(&[0; 10]);
        msg.extend_from_slice(&body);
        let got: Vec<(u16, &[u8])> = messages(&msg).collect();
        assert_eq!(got.len(), 1);
        assert_eq!(got[0].1, &body[..]);
        // Truncated, not IPv4, not TCP/UDP: nothing.
        assert_eq!(refused_packet(&ip[..10]), None);
        assert_eq!(refused_packet(&[0x60; 40]), None);
        let mut icmp = ip.clone();
        icmp[9] = 1;
        assert_eq!(refused_packet(&icmp), None);
        assert!(messages(&[1, 0, 0]).next().is_none());
    }

    #[test]
    fn config_messages_are_padded_netlink_requests() {
        let m = config_message(0x4001, 7, NFULA_CFG_MODE, &[0, 0, 0, 64, 2, 0]);
        assert_eq!(m.len(), 16 + 4 + 12);
        assert_eq!(u32::from_ne_bytes(m[0..4].try_into().unwrap()) as usize, m.len());
        assert_eq!(&m[18..20], &0x4001u16.to_be_bytes());
        assert_eq!(u16::from_ne_bytes([m[20], m[21]]), 10, "attribute length excludes padding");
    }
}
