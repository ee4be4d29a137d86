//! Outbound network policy of a sandbox, and how an ApiKey may narrow it.

use serde::{Deserialize, Serialize};

/// The sandbox's `/etc/hosts`.
pub const SANDBOX_HOSTS: &str = "127.0.0.1\tlocalhost sandbox\n::1\tlocalhost ip6-localhost ip6-loopback\n";
/// The sandbox's `/etc/resolv.conf`: the node-agent's DNS proxy listens on
/// the sandbox's own loopback (`Unrestricted` sandboxes only; elsewhere a
/// lookup fails at once). Also the resolver libcs assume without one.
pub const SANDBOX_RESOLV_CONF: &str = "nameserver 127.0.0.1\noptions timeout:2 attempts:2\n";

/// Outbound network policy.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
pub enum Network {
    /// Only loopback inside the sandbox: no DNS, no outbound connections.
    #[default]
    Blocked,
    /// Outbound access through the node (optionally narrowed to an egress
    /// allowlist); private, shared, link-local, metadata and loopback ranges
    /// and the node's own addresses stay unreachable.
    Unrestricted,
}

impl Network {
    /// The policy after a narrower scope (an ApiKey) applied `narrower`;
    /// `None` when that would widen it.
    pub fn narrowed(self, narrower: Option<Network>) -> Option<Network> {
        match (self, narrower) {
            (n, None) => Some(n),
            (Network::Unrestricted, Some(n)) | (Network::Blocked, Some(n @ Network::Blocked)) => Some(n),
            (Network::Blocked, Some(Network::Unrestricted)) => None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::Network::*;

    #[test]
    fn a_key_may_only_narrow() {
        assert_eq!(Unrestricted.narrowed(Some(Blocked)), Some(Blocked));
        assert_eq!(Unrestricted.narrowed(None), Some(Unrestricted));
        assert_eq!(Blocked.narrowed(Some(Blocked)), Some(Blocked));
        assert_eq!(Blocked.narrowed(Some(Unrestricted)), None);
    }
}
