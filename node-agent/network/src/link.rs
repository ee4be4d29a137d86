//! Addressing sandboxes, and running code inside a sandbox's network
//! namespace.
//!
//! Work inside the namespace runs on a fresh thread that entered it
//! (`setns` is per thread, and a socket belongs to the namespace of the
//! thread that opened it); the thread ends with its work, so no runtime
//! thread ever changes namespace.

use std::fs::File;
use std::io;
use std::net::Ipv4Addr;
use std::os::fd::OwnedFd;

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

/// How many range addresses a node gives out: one /31 per sandbox network
/// (not per execution slot: a finished sandbox's veth leaves with its
/// namespace, whenever the kernel gets to it, and its number is taken again
/// only once that link is gone).
#[derive(Debug)]
pub struct Indices {
    used: Vec<bool>,
    capacity: usize,
}

/// Numbers whose link still exists are skipped at most this often per
/// take; past that the lowest free number is taken and its link removed.
const MAX_SKIPPED: usize = 64;

impl Indices {
    /// Numbers `0..capacity`.
    pub fn new(capacity: usize) -> Indices {
        Indices { used: Vec::new(), capacity }
    }

    /// The lowest free number whose link is gone (`present(n)` says whether
    /// it still exists), and whether its link must be removed first: true
    /// only when every free number probed still had one.
    pub fn take(&mut self, present: impl Fn(usize) -> bool) -> Option<(usize, bool)> {
        let mut first_free = None;
        let mut skipped = 0;
        for n in 0..self.capacity {
            if self.used.get(n).copied().unwrap_or(false) {
                continue;
            }
            first_free.get_or_insert(n);
            if !present(n) {
                self.mark(n);
                return Some((n, false));
            }
            skipped += 1;
            if skipped == MAX_SKIPPED {
                break;
            }
        }
        let n = first_free?;
        self.mark(n);
        Some((n, true))
    }

    fn mark(&mut self, n: usize) {
        if self.used.len() <= n {
            self.used.resize(n + 1, false);
        }
        self.used[n] = true;
    }

    /// Gives `n` back.
    pub fn put(&mut self, n: usize) {
        if let Some(u) = self.used.get_mut(n) {
            *u = false;
        }
    }

    /// How many a range `(net, prefix)` holds (a /31 each), at most 65536.
    pub fn capacity_of(net: (Ipv4Addr, u8)) -> usize {
        ((1u64 << (32 - u32::from(net.1))) / 2).min(65_536) as usize
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
    fn a_number_is_taken_again_only_once_its_link_is_gone() {
        let mut ix = Indices::new(4);
        assert_eq!(ix.take(|_| false), Some((0, false)));
        assert_eq!(ix.take(|_| false), Some((1, false)));
        ix.put(0);
        // 0's veth still leaves with its namespace: 2 is taken meanwhile.
        assert_eq!(ix.take(|n| n == 0), Some((2, false)));
        assert_eq!(ix.take(|_| false), Some((0, false)), "the lowest free once gone");
        assert_eq!(ix.take(|_| true), Some((3, true)), "every free one still linked: the lowest, whose link goes first");
        assert_eq!(ix.take(|_| false), None, "all taken");
        assert_eq!(Indices::capacity_of((Ipv4Addr::new(100, 127, 0, 0), 16)), 32_768);
        assert_eq!(Indices::capacity_of((Ipv4Addr::new(10, 0, 0, 0), 8)), 65_536);
        assert_eq!(Indices::capacity_of((Ipv4Addr::new(10, 0, 0, 0), 31)), 1);
    }
}
