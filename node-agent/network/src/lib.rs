//! Sandbox networking for `Unrestricted` sandboxes.
//!
//! A `Blocked` sandbox keeps its network namespace with only loopback and
//! none of this runs. An `Unrestricted` one gets, while it is prepared (off
//! the request path):
//!
//! - a veth pair: `wrn<slot>` on the node, `eth0` inside, a /31 from the
//!   sandbox range, default route via the node end, IPv6 off ([`link`]);
//! - its own nftables chain, jumped to from the node's `inet warren` table by
//!   interface name: forbidden ranges (private, shared, link-local/metadata,
//!   loopback, the node's own addresses) are refused and counted in a
//!   per-sandbox set, everything else accepted — or, with an allowlist, only
//!   the allowed CIDRs and the addresses the DNS proxy resolved for allowed
//!   names ([`nft`]);
//! - token-bucket shaping on both ends of the veth (download and upload);
//! - a DNS proxy listening *inside* the sandbox on 127.0.0.1:53 (the
//!   sandbox's `resolv.conf`), which forwards only allowed names and feeds
//!   the allow sets before answering ([`dns`]).
//!
//! The node's `inet warren` table is rebuilt at agent start, which also
//! removes whatever a crashed agent left; a sandbox's veth dies with its
//! network namespace, and its chain and sets are removed at teardown.

pub mod custody;
pub mod dns;
pub mod forward;
pub mod hashing;
pub mod link;
pub mod nflog;
pub mod nft;
pub mod node;
pub mod policy;
pub mod netlink;
pub mod nftnl;
pub mod rtnl;

pub use node::{NodeNet, NodeNetConfig, SandboxNet};
pub use policy::{Blocked, NetPolicy};
