//! How the operator publishes an effective key for the gateways: one Secret
//! per ApiKey in Warren's namespace, labelled, holding the compiled
//! configuration as JSON (the key's hash, never the key itself).

use sha2::{Digest, Sha256};

use crate::EffectiveKey;

/// Label selecting published keys.
pub const LABEL: &str = "warren.dev/published-key";
/// Annotation naming the ApiKey (`namespace/name`).
pub const SOURCE_ANNOTATION: &str = "warren.dev/apikey";
/// Data entry holding the JSON.
pub const DATA_KEY: &str = "config.json";

/// Name of the published Secret for ApiKey `namespace/name`: stable, short,
/// and a valid object name whatever the lengths of the parts.
pub fn secret_name(namespace: &str, name: &str) -> String {
    let digest = Sha256::digest(format!("{namespace}/{name}").as_bytes());
    let hex: String = digest.iter().take(10).map(|b| format!("{b:02x}")).collect();
    format!("warren-key-{hex}")
}

/// Serializes a key for publishing.
pub fn encode(key: &EffectiveKey) -> String {
    // Plain data: serializing cannot fail.
    serde_json::to_string(key).unwrap_or_default()
}

/// Parses a published key.
pub fn decode(json: &[u8]) -> Result<EffectiveKey, serde_json::Error> {
    serde_json::from_slice(json)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_are_stable_and_distinct() {
        assert_eq!(secret_name("a", "b"), secret_name("a", "b"));
        assert_ne!(secret_name("a", "bc"), secret_name("ab", "c"));
        assert!(secret_name(&"n".repeat(63), &"k".repeat(253)).len() < 64);
    }

    #[test]
    fn round_trip_without_the_key() {
        let src = "apiVersion: warren.dev/v1alpha1\nkind: Sandbox\nmetadata: {name: sb}\nspec: {image: host}\n---\napiVersion: warren.dev/v1alpha1\nkind: ApiKey\nmetadata: {name: k}\nspec: {sandboxRef: {name: sb}}\n---\napiVersion: v1\nkind: Secret\nmetadata: {name: k-key}\nstringData: {key: sk-wrn-AAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA}\n";
        let c = crate::compile(&[crate::Source { file: "x", text: src }]);
        let k = &c.keys[0];
        let json = encode(k);
        assert!(!json.contains("AAAAAAAAAAAAAAAAAAAA"), "{json}");
        assert_eq!(&decode(json.as_bytes()).unwrap(), k);
    }
}
