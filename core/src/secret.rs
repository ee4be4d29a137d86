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

/// A signing secret (an ApiKey's webhook secret): serialized where it
/// must travel, never printed.
#[derive(Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(transparent)]
pub struct SigningSecret(String);

impl SigningSecret {
    /// Shortest secret accepted.
    pub const MIN_LEN: usize = 32;

    /// `value`, when at least [`SigningSecret::MIN_LEN`] characters.
    pub fn new(value: &str) -> Option<SigningSecret> {
        let v = value.trim();
        (v.len() >= Self::MIN_LEN && v.len() <= 256 && v.bytes().all(|b| b.is_ascii_graphic())).then(|| SigningSecret(v.to_string()))
    }

    /// The value, for signing.
    pub fn expose(&self) -> &str {
        &self.0
    }
}

impl std::fmt::Debug for SigningSecret {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("SigningSecret(<redacted>)")
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn values_never_print() {
        let c = super::Credentials([("secretAccessKey".to_string(), "hunter2".to_string())].into());
        assert_eq!(format!("{c:?}"), "Credentials(<1 redacted values>)");
        let s = super::SigningSecret::new("whsec_0123456789abcdefghijklmnopqrstuv").unwrap();
        assert_eq!(format!("{s:?}"), "SigningSecret(<redacted>)");
        assert!(super::SigningSecret::new("short").is_none());
    }
}
