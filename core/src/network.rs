//! Outbound network policy of a sandbox, and how an ApiKey may narrow it.

use serde::{Deserialize, Serialize};

/// Outbound network policy.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
pub enum Network {
    /// Only loopback inside the sandbox: no DNS, no outbound connections.
    #[default]
    Blocked,
    /// Outbound access through the node; private, link-local, metadata and
    /// loopback ranges of the host stay unreachable. Not offered by this
    /// release's node-agent yet: a Sandbox asking for it is not Ready.
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
