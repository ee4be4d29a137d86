//! A sandbox's environment (`create(envs=…)`), sealed in the records. The
//! variables are often credentials, and a records file or a database dump
//! must not hand them out: they are stored as AES-256-GCM ciphertext under a
//! key derived (HKDF-SHA256, a label of its own) from the gateways' signing
//! key, which lives outside the records and which every replica holds — so
//! any replica opens what another sealed. The sandbox (namespace, key, id)
//! is bound in as associated data: a sealed environment copied onto another
//! sandbox's row does not open. Rotating the signing key leaves existing
//! sealed environments unopenable: those sandboxes' commands are refused
//! with that reason (sandboxes created without variables are unaffected).
//! Pure; unit-tested.

use std::collections::BTreeMap;

use base64::Engine;
use ring::{aead, hkdf};

/// What a sealed environment starts with (version 1 of this format).
const PREFIX: &str = "wse1.";
/// HKDF salt: this key is for nothing else the signing key does.
const LABEL: &[u8] = b"warren e2b sandbox environment v1";
const B64: base64::engine::GeneralPurpose = base64::engine::general_purpose::URL_SAFE_NO_PAD;

/// Which sandbox an environment belongs to.
#[derive(Debug, Clone, Copy)]
pub struct Owner<'a> {
    /// The ApiKey's namespace.
    pub namespace: &'a str,
    /// The ApiKey's name.
    pub key: &'a str,
    /// The sandbox id.
    pub id: &'a str,
}

impl Owner<'_> {
    fn aad(&self) -> Vec<u8> {
        [self.namespace, self.key, self.id].join("\0").into_bytes()
    }
}

/// Why a stored environment does not open.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum Unopenable {
    /// Sealed under another signing key (rotated since), for another sandbox, or altered.
    #[error("this sandbox's environment variables were sealed under a signing key the gateways no longer hold (it was rotated); create a new sandbox")]
    OtherKey,
    /// Not something this gateway stores.
    #[error("this sandbox's stored environment is malformed")]
    Malformed,
}

fn sealing_key(signing_key: &[u8]) -> Option<aead::LessSafeKey> {
    let prk = hkdf::Salt::new(hkdf::HKDF_SHA256, LABEL).extract(signing_key);
    let okm = prk.expand(&[b"aes-256-gcm"], &aead::AES_256_GCM).ok()?;
    Some(aead::LessSafeKey::new(aead::UnboundKey::from(okm)))
}

/// `env` sealed for `owner`; an empty environment is stored empty (there is
/// nothing to hide, and it then survives a rotation of the signing key).
pub fn seal(signing_key: &[u8], owner: Owner<'_>, env: &BTreeMap<String, String>) -> Option<String> {
    if env.is_empty() {
        return Some(String::new());
    }
    let key = sealing_key(signing_key)?;
    let mut nonce = [0u8; aead::NONCE_LEN];
    rand::fill(&mut nonce);
    let mut data = serde_json::to_vec(env).ok()?;
    key.seal_in_place_append_tag(aead::Nonce::assume_unique_for_key(nonce), aead::Aad::from(owner.aad()), &mut data).ok()?;
    Some(format!("{PREFIX}{}", B64.encode([&nonce[..], &data].concat())))
}

/// The environment `stored` for `owner`: empty, sealed, or — from an
/// earlier release, until the sweep seals it — plain JSON.
pub fn open(signing_key: &[u8], owner: Owner<'_>, stored: &str) -> Result<BTreeMap<String, String>, Unopenable> {
    if stored.is_empty() {
        return Ok(BTreeMap::new());
    }
    if stored.starts_with('{') {
        return serde_json::from_str(stored).map_err(|_| Unopenable::Malformed);
    }
    let raw = stored.strip_prefix(PREFIX).and_then(|b| B64.decode(b).ok()).ok_or(Unopenable::Malformed)?;
    if raw.len() < aead::NONCE_LEN + aead::AES_256_GCM.tag_len() {
        return Err(Unopenable::Malformed);
    }
    let (nonce, sealed) = raw.split_at(aead::NONCE_LEN);
    let nonce = aead::Nonce::try_assume_unique_for_key(nonce).map_err(|_| Unopenable::Malformed)?;
    let key = sealing_key(signing_key).ok_or(Unopenable::Malformed)?;
    let mut data = sealed.to_vec();
    let plain = key.open_in_place(nonce, aead::Aad::from(owner.aad()), &mut data).map_err(|_| Unopenable::OtherKey)?;
    serde_json::from_slice(plain).map_err(|_| Unopenable::Malformed)
}

#[cfg(test)]
mod tests {
    use super::*;

    const KEY: &[u8] = b"0123456789abcdef0123456789abcdef";
    const OWNER: Owner<'static> = Owner { namespace: "ns", key: "k", id: "sbx1" };

    fn env() -> BTreeMap<String, String> {
        BTreeMap::from([("API_TOKEN".to_string(), "s3cr3t-value".to_string())])
    }

    /// The attack: a records file or database dump read for the variables.
    /// What is stored holds neither names' values nor anything that opens
    /// without the signing key; each seal differs (fresh nonce).
    #[test]
    fn a_sealed_environment_shows_nothing_and_opens_only_for_its_sandbox_under_its_key() {
        let sealed = seal(KEY, OWNER, &env()).unwrap();
        assert!(sealed.starts_with(PREFIX) && !sealed.contains("s3cr3t") && !sealed.contains("API_TOKEN"), "{sealed}");
        assert_ne!(sealed, seal(KEY, OWNER, &env()).unwrap(), "a fresh nonce each time");
        assert_eq!(open(KEY, OWNER, &sealed), Ok(env()));
        for other in [Owner { id: "sbx2", ..OWNER }, Owner { key: "k2", ..OWNER }, Owner { namespace: "ns2", ..OWNER }] {
            assert_eq!(open(KEY, other, &sealed), Err(Unopenable::OtherKey), "moved onto another sandbox's row");
        }
        assert_eq!(open(b"another signing key, after rotation", OWNER, &sealed), Err(Unopenable::OtherKey));
        // One bit of the ciphertext (its tag's last byte) flipped, re-encoded:
        // altering the text's last character instead may break only the
        // encoding's unused bits (then Malformed), depending on the nonce.
        let mut raw = B64.decode(sealed.strip_prefix(PREFIX).unwrap()).unwrap();
        *raw.last_mut().unwrap() ^= 1;
        let altered = format!("{PREFIX}{}", B64.encode(&raw));
        assert_eq!(open(KEY, OWNER, &altered), Err(Unopenable::OtherKey));
    }

    #[test]
    fn empty_legacy_and_malformed_environments() {
        assert_eq!(seal(KEY, OWNER, &BTreeMap::new()).as_deref(), Some(""));
        assert_eq!(open(b"any key", OWNER, ""), Ok(BTreeMap::new()), "no variables: survives a rotation");
        assert_eq!(open(KEY, OWNER, r#"{"API_TOKEN":"s3cr3t-value"}"#), Ok(env()), "an earlier release's row");
        for bad in ["wse1.", "wse1.!!", "wse2.AAAA", "{not json", "wse1.AAAAAAAAAAAAAAAA"] {
            assert!(open(KEY, OWNER, bad).is_err(), "{bad}");
        }
    }
}
