//! Netlink messages built in memory and one request/acknowledge socket:
//! the shared ground of [`crate::rtnl`] (links, addresses, routes, qdiscs)
//! and [`crate::nftnl`] (the sandbox's chain, sets and elements). Setting up
//! a sandbox's network this way costs a few syscalls instead of five
//! fork/execs of `ip`, `tc` and `nft`.

use std::io;
use std::os::fd::{AsRawFd, OwnedFd};

use nix::sys::socket::{self, AddressFamily, NetlinkAddr, SockFlag, SockProtocol, SockType};

pub const NLM_F_REQUEST: u16 = 0x1;
pub const NLM_F_ACK: u16 = 0x4;
pub const NLM_F_REPLACE: u16 = 0x100;
pub const NLM_F_EXCL: u16 = 0x200;
pub const NLM_F_CREATE: u16 = 0x400;
pub const NLM_F_APPEND: u16 = 0x800;
const NLA_F_NESTED: u16 = 0x8000;
const NLMSG_ERROR: u16 = 2;
/// The biggest reply read: an error echoes the message it refuses, and a
/// sandbox batch with a long allowlist is tens of KiB.
const RECV_BUFFER: usize = 256 * 1024;

/// Messages appended one after the other (an nf_tables batch, or several
/// rtnetlink requests sent at once), each attribute 4-byte aligned. Every
/// message asks for an acknowledgement; [`Socket::transact`] waits for all.
#[derive(Debug, Default)]
pub struct Msgs {
    buf: Vec<u8>,
    /// (sequence, what the message does) of every message.
    sent: Vec<(u32, &'static str)>,
    next_seq: u32,
}

impl Msgs {
    /// An empty set of messages numbered from `first_seq`.
    pub fn new(first_seq: u32) -> Msgs {
        Msgs { buf: Vec::with_capacity(1024), sent: Vec::new(), next_seq: first_seq }
    }

    /// The bytes to send.
    pub fn bytes(&self) -> &[u8] {
        &self.buf
    }

    /// Starts a message of `kind` with its fixed header (`header`, e.g. an
    /// `ifinfomsg`); `what` names it in errors. Returns where it starts,
    /// for [`Msgs::end`].
    pub fn begin(&mut self, kind: u16, flags: u16, header: &[u8], what: &'static str) -> usize {
        let start = self.buf.len();
        let seq = self.next_seq;
        self.next_seq = self.next_seq.wrapping_add(1);
        let ack = flags & NLM_F_ACK != 0;
        if ack {
            self.sent.push((seq, what));
        }
        self.buf.extend_from_slice(&0u32.to_ne_bytes());
        self.buf.extend_from_slice(&kind.to_ne_bytes());
        self.buf.extend_from_slice(&(flags | NLM_F_REQUEST).to_ne_bytes());
        self.buf.extend_from_slice(&seq.to_ne_bytes());
        self.buf.extend_from_slice(&0u32.to_ne_bytes());
        self.buf.extend_from_slice(header);
        self.pad();
        start
    }

    /// Ends the message begun at `start` (writes its length).
    pub fn end(&mut self, start: usize) {
        let len = (self.buf.len() - start) as u32;
        self.buf[start..start + 4].copy_from_slice(&len.to_ne_bytes());
    }

    /// A message with only its fixed header.
    pub fn bare(&mut self, kind: u16, flags: u16, header: &[u8], what: &'static str) {
        let start = self.begin(kind, flags, header, what);
        self.end(start);
    }

    /// One attribute.
    pub fn attr(&mut self, kind: u16, payload: &[u8]) {
        self.buf.extend_from_slice(&((4 + payload.len()) as u16).to_ne_bytes());
        self.buf.extend_from_slice(&kind.to_ne_bytes());
        self.buf.extend_from_slice(payload);
        self.pad();
    }

    /// Bytes as they are (a fixed header inside an attribute).
    pub fn raw(&mut self, bytes: &[u8]) {
        self.buf.extend_from_slice(bytes);
        self.pad();
    }

    /// A NUL-terminated string attribute.
    pub fn str(&mut self, kind: u16, s: &str) {
        let mut v = Vec::with_capacity(s.len() + 1);
        v.extend_from_slice(s.as_bytes());
        v.push(0);
        self.attr(kind, &v);
    }

    /// A big-endian u32 attribute (nf_tables' integers).
    pub fn be32(&mut self, kind: u16, v: u32) {
        self.attr(kind, &v.to_be_bytes());
    }

    /// A native-endian u32 attribute (rtnetlink's integers).
    pub fn ne32(&mut self, kind: u16, v: u32) {
        self.attr(kind, &v.to_ne_bytes());
    }

    /// Starts a nested attribute; close it with [`Msgs::close`].
    pub fn open(&mut self, kind: u16) -> usize {
        let start = self.buf.len();
        self.buf.extend_from_slice(&[0, 0]);
        self.buf.extend_from_slice(&(kind | NLA_F_NESTED).to_ne_bytes());
        start
    }

    /// Ends the nested attribute opened at `start`.
    pub fn close(&mut self, start: usize) {
        let len = (self.buf.len() - start) as u16;
        self.buf[start..start + 2].copy_from_slice(&len.to_ne_bytes());
    }

    /// A nested attribute filled by `fill`.
    pub fn nest(&mut self, kind: u16, fill: impl FnOnce(&mut Msgs)) {
        let at = self.open(kind);
        fill(self);
        self.close(at);
    }

    fn pad(&mut self) {
        self.buf.resize((self.buf.len() + 3) & !3, 0);
    }

    /// The sequence number after the last message.
    pub fn next_seq(&self) -> u32 {
        self.next_seq
    }
}

/// Every acknowledgement in `buf`: (sequence, error code; 0 is success).
pub fn acks(buf: &[u8]) -> Vec<(u32, i32)> {
    let mut out = Vec::new();
    let mut rest = buf;
    while rest.len() >= 16 {
        let len = u32::from_ne_bytes([rest[0], rest[1], rest[2], rest[3]]) as usize;
        if len < 16 || len > rest.len() {
            break;
        }
        let kind = u16::from_ne_bytes([rest[4], rest[5]]);
        let seq = u32::from_ne_bytes([rest[8], rest[9], rest[10], rest[11]]);
        if kind == NLMSG_ERROR && len >= 20 {
            out.push((seq, i32::from_ne_bytes([rest[16], rest[17], rest[18], rest[19]])));
        }
        rest = &rest[((len + 3) & !3).min(rest.len())..];
    }
    out
}

/// A netlink socket of one protocol, in the network namespace of the
/// thread that opened it (wherever it is used from afterwards).
pub struct Socket {
    fd: OwnedFd,
    seq: u32,
    buf: Vec<u8>,
}

/// The two families Warren speaks.
#[derive(Debug, Clone, Copy)]
pub enum Family {
    /// rtnetlink: links, addresses, routes, qdiscs.
    Route,
    /// nfnetlink: nf_tables.
    Netfilter,
}

impl Socket {
    /// Opens and binds a socket; a lost reply fails a request after 2 s.
    pub fn open(family: Family) -> io::Result<Socket> {
        let proto = match family {
            Family::Route => SockProtocol::NetlinkRoute,
            Family::Netfilter => SockProtocol::NetlinkNetFilter,
        };
        let fd = socket::socket(AddressFamily::Netlink, SockType::Raw, SockFlag::SOCK_CLOEXEC, proto)?;
        socket::bind(fd.as_raw_fd(), &NetlinkAddr::new(0, 0))?;
        socket::setsockopt(&fd, socket::sockopt::ReceiveTimeout, &nix::sys::time::TimeVal::new(2, 0))?;
        Ok(Socket { fd, seq: rand::random::<u32>() >> 1, buf: Vec::new() })
    }

    /// Fresh messages numbered after everything this socket sent.
    pub fn msgs(&mut self) -> Msgs {
        Msgs::new(self.seq)
    }

    /// Sends `msgs` and waits for every acknowledgement (the kernel answers
    /// each message that asked, refused batch or not, before `send`
    /// returns); the first refusal is the error, named by what its message
    /// did. Replies to earlier requests that timed out are skipped.
    pub fn transact(&mut self, msgs: &Msgs) -> io::Result<()> {
        self.seq = msgs.next_seq();
        if msgs.sent.is_empty() {
            return Ok(());
        }
        socket::send(self.fd.as_raw_fd(), msgs.bytes(), socket::MsgFlags::empty())?;
        self.buf.resize(RECV_BUFFER, 0);
        let mut pending: Vec<(u32, &'static str)> = msgs.sent.clone();
        let mut first_error: Option<io::Error> = None;
        while !pending.is_empty() {
            let n = socket::recv(self.fd.as_raw_fd(), &mut self.buf, socket::MsgFlags::empty())?;
            for (seq, code) in acks(&self.buf[..n]) {
                let Some(i) = pending.iter().position(|(s, _)| *s == seq) else { continue };
                let (_, what) = pending.swap_remove(i);
                if code != 0 && first_error.is_none() {
                    let e = io::Error::from_raw_os_error(-code);
                    first_error = Some(io::Error::new(e.kind(), format!("{what}: {e}")));
                }
            }
        }
        first_error.map_or(Ok(()), Err)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn messages_and_attributes_stay_aligned_and_sized() {
        let mut m = Msgs::new(7);
        let at = m.begin(0x0a03, NLM_F_CREATE | NLM_F_ACK, &[1, 0, 0, 0], "add chain");
        m.str(1, "warren_wrn");
        m.nest(4, |m| m.be32(1, 0x2a));
        m.end(at);
        m.bare(0x11, 0, &[0, 0, 0, 10], "batch end");
        let b = m.bytes();
        let first = u32::from_ne_bytes(b[0..4].try_into().unwrap()) as usize;
        assert_eq!(first, 16 + 4 + 16 + 12, "header, nfgenmsg, name (11 bytes padded), nested u32");
        assert_eq!(u16::from_ne_bytes([b[6], b[7]]), NLM_F_CREATE | NLM_F_ACK | NLM_F_REQUEST);
        assert_eq!(u16::from_ne_bytes([b[38], b[39]]), 4 | NLA_F_NESTED, "nested flag set");
        assert_eq!(&b[44..48], &[0, 0, 0, 0x2a], "nf_tables integers are big-endian");
        assert_eq!(b.len(), first + 20);
        assert_eq!(m.sent, vec![(7, "add chain")], "only messages asking for an ack are awaited");
        assert_eq!(m.next_seq(), 9);
    }

    #[test]
    fn acknowledgements_are_read_with_their_codes() {
        let mut buf = Vec::new();
        for (seq, code) in [(8u32, 0i32), (9, -17)] {
            buf.extend_from_slice(&36u32.to_ne_bytes());
            buf.extend_from_slice(&NLMSG_ERROR.to_ne_bytes());
            buf.extend_from_slice(&[0, 0]);
            buf.extend_from_slice(&seq.to_ne_bytes());
            buf.extend_from_slice(&[0; 4]);
            buf.extend_from_slice(&code.to_ne_bytes());
            buf.extend_from_slice(&[0; 16]);
        }
        assert_eq!(acks(&buf), vec![(8, 0), (9, -17)]);
        assert_eq!(acks(&buf[..40]), vec![(8, 0)], "a cut message ends the reading");
    }
}
