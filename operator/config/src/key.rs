//! API keys: format, hashing and constant-time comparison.
//!
//! A key is `sk-wrn-` followed by at least 32 base62 characters (≥ 190 bits of
//! randomness), so secret scanners can spot it. Only its SHA-256 is kept
//! outside the key's own Secret; a fast hash is enough because the input is
//! high-entropy, not a password.

use sha2::{Digest, Sha256};
use subtle::ConstantTimeEq;

/// Every key starts with this.
pub const PREFIX: &str = "sk-wrn-";
/// Fewest random characters after the prefix.
pub const MIN_RANDOM_CHARS: usize = 32;
/// Most random characters after the prefix (bounds the work per request).
pub const MAX_RANDOM_CHARS: usize = 128;
/// Characters of the key shown in status and logs (prefix + 4).
const DISPLAY_CHARS: usize = PREFIX.len() + 4;

/// SHA-256 of a key.
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
pub struct KeyHash(pub [u8; 32]);

impl std::fmt::Debug for KeyHash {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("KeyHash(..)")
    }
}

impl serde::Serialize for KeyHash {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(&self.0.iter().map(|b| format!("{b:02x}")).collect::<String>())
    }
}

impl<'de> serde::Deserialize<'de> for KeyHash {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let hex = String::deserialize(d)?;
        let bad = || serde::de::Error::custom("a key hash is 64 hex digits");
        if hex.len() != 64 {
            return Err(bad());
        }
        let mut out = [0u8; 32];
        for (i, b) in out.iter_mut().enumerate() {
            *b = u8::from_str_radix(hex.get(2 * i..2 * i + 2).ok_or_else(bad)?, 16).map_err(|_| bad())?;
        }
        Ok(KeyHash(out))
    }
}

impl KeyHash {
    /// Hashes `key` (any bytes; the format is checked separately).
    pub fn of(key: &str) -> Self {
        KeyHash(Sha256::digest(key.as_bytes()).into())
    }

    /// Compares in constant time.
    pub fn ct_eq(&self, other: &KeyHash) -> bool {
        self.0.ct_eq(&other.0).into()
    }
}

/// True when `key` has the shape of a Warren key.
pub fn is_well_formed(key: &str) -> bool {
    key.strip_prefix(PREFIX).is_some_and(|rest| {
        (MIN_RANDOM_CHARS..=MAX_RANDOM_CHARS).contains(&rest.len()) && rest.bytes().all(|b| b.is_ascii_alphanumeric())
    })
}

/// The non-secret part of a key shown in status and logs (`sk-wrn-AbCd…`).
pub fn display_prefix(key: &str) -> String {
    let visible: String = key.chars().take(DISPLAY_CHARS).collect();
    format!("{visible}…")
}

/// Every E2B alias starts with this (the E2B SDKs expect `e2b_<hex>`).
pub const E2B_PREFIX: &str = "e2b_";

/// The key's E2B alias: `e2b_` + 40 hex digits of HMAC-SHA256 keyed by the
/// key. Derived, not stored: whoever holds the key can make its alias, the
/// alias does not give the key back, and only the alias's SHA-256 is kept
/// outside the key's Secret, like the key's own.
pub fn e2b_alias(key: &str) -> String {
    use hmac::{Hmac, Mac};
    let mut mac = <Hmac<Sha256> as Mac>::new_from_slice(key.as_bytes()).expect("HMAC takes keys of any length");
    mac.update(b"warren e2b alias v1");
    let tag = mac.finalize().into_bytes();
    let hex: String = tag.iter().take(20).map(|b| format!("{b:02x}")).collect();
    format!("{E2B_PREFIX}{hex}")
}

/// True when `alias` has the shape of an E2B alias.
pub fn is_e2b_alias(alias: &str) -> bool {
    alias.strip_prefix(E2B_PREFIX).is_some_and(|h| h.len() == 40 && h.bytes().all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b)))
}

/// Builds a key from caller-supplied random bytes (one base62 char per byte,
/// rejection-sampled so every character is uniform). `None` when `random`
/// did not hold enough usable bytes.
pub fn from_random_bytes(random: &[u8]) -> Option<String> {
    warren_core::ids::base62(random, 40).map(|chars| format!("{PREFIX}{chars}"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn format() {
        let good = format!("{PREFIX}{}", "a".repeat(32));
        assert!(is_well_formed(&good));
        assert!(!is_well_formed(&format!("{PREFIX}{}", "a".repeat(31))));
        assert!(!is_well_formed(&format!("{PREFIX}{}", "a".repeat(129))));
        assert!(!is_well_formed(&format!("{PREFIX}{}-", "a".repeat(32))));
        assert!(!is_well_formed(&format!("sk-xyz-{}", "a".repeat(32))));
        assert!(!is_well_formed(""));
    }

    #[test]
    fn generated_keys_are_well_formed_and_distinct() {
        let a = from_random_bytes(&(0..=255u8).collect::<Vec<_>>()).unwrap();
        let b = from_random_bytes(&(0..=255u8).rev().collect::<Vec<_>>()).unwrap();
        assert!(is_well_formed(&a) && is_well_formed(&b));
        assert_ne!(a, b);
        assert_eq!(from_random_bytes(&[250; 64]), None);
    }

    #[test]
    fn e2b_aliases_are_derived_and_well_formed() {
        let a = e2b_alias("sk-wrn-AAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA");
        assert!(is_e2b_alias(&a), "{a}");
        assert_eq!(a, e2b_alias("sk-wrn-AAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA"));
        assert_ne!(a, e2b_alias("sk-wrn-BBBBBBBBBBBBBBBBBBBBBBBBBBBBBBBBBBBB"));
        assert!(!is_e2b_alias("e2b_XYZ") && !is_e2b_alias(&format!("{a}0")) && !is_e2b_alias("sk-wrn-AAAA"));
    }

    #[test]
    fn hashes_compare() {
        assert!(KeyHash::of("x").ct_eq(&KeyHash::of("x")));
        assert!(!KeyHash::of("x").ct_eq(&KeyHash::of("y")));
        assert_eq!(format!("{:?}", KeyHash::of("x")), "KeyHash(..)");
        assert_eq!(display_prefix("sk-wrn-abcdefgh"), "sk-wrn-abcd…");
    }
}
