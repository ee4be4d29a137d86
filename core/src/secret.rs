//! Secret values carried between Warren's parts (storage credentials from
//! a Secret to the node that mounts with them).

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

/// Named secret values: serialized where they must travel, never printed.
#[derive(Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(transparent)]
pub struct Credentials(pub BTreeMap<String, String>);

impl std::fmt::Debug for Credentials {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Credentials(<{} redacted values>)", self.0.len())
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn values_never_print() {
        let c = super::Credentials([("secretAccessKey".to_string(), "hunter2".to_string())].into());
        assert_eq!(format!("{c:?}"), "Credentials(<1 redacted values>)");
    }
}
