//! Signed, expiring, single-purpose file URLs: what one token allows (read
//! or write one path of one thread or volume of one key, until a time) is
//! in the token itself, with an HMAC-SHA256 over it under a key all gateway
//! replicas share (kept in the record database). Pure; unit-tested.

use base64::Engine;
use hmac::{Hmac, Mac};
use serde::{Deserialize, Serialize};
use sha2::Sha256;

const B64: base64::engine::GeneralPurpose = base64::engine::general_purpose::URL_SAFE_NO_PAD;

/// What a token allows.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Grant {
    /// `put` or `get`.
    pub op: Op,
    /// The ApiKey's namespace.
    pub ns: String,
    /// The ApiKey's name.
    pub key: String,
    /// `thread` or `volume`.
    pub source: Source,
    /// Thread id or volume name.
    pub id: String,
    /// Path relative to the home or volume.
    pub path: String,
    /// Exact size of an upload.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub len: Option<u64>,
    /// Content type of an upload, echoed on download.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ct: Option<String>,
    /// Valid until (Unix seconds).
    pub exp: i64,
}

/// The operation a token allows.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Op {
    /// Upload.
    Put,
    /// Download.
    Get,
}

/// Where the file lives.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Source {
    /// A thread's saved home.
    Thread,
    /// A managed volume.
    Volume,
}

/// Why a token is refused (all look the same to the caller).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Invalid {
    /// Not a token, or not signed by this deployment.
    Forged,
    /// Past its expiry.
    Expired,
}

/// Longest token accepted.
pub const MAX_TOKEN: usize = 4096;

/// `base64(grant).base64(hmac)`.
pub fn sign(key: &[u8], g: &Grant) -> String {
    let body = B64.encode(serde_json::to_vec(g).unwrap_or_default());
    let tag = mac(key, body.as_bytes()).finalize().into_bytes();
    format!("{body}.{}", B64.encode(tag))
}

/// The grant of a token signed with `key`, valid at `now`.
pub fn verify(key: &[u8], token: &str, now: i64) -> Result<Grant, Invalid> {
    if token.len() > MAX_TOKEN {
        return Err(Invalid::Forged);
    }
    let (body, tag) = token.split_once('.').ok_or(Invalid::Forged)?;
    let tag = B64.decode(tag).map_err(|_| Invalid::Forged)?;
    // Constant-time comparison.
    mac(key, body.as_bytes()).verify_slice(&tag).map_err(|_| Invalid::Forged)?;
    let g: Grant = serde_json::from_slice(&B64.decode(body).map_err(|_| Invalid::Forged)?).map_err(|_| Invalid::Forged)?;
    if now > g.exp {
        return Err(Invalid::Expired);
    }
    Ok(g)
}

fn mac(key: &[u8], body: &[u8]) -> Hmac<Sha256> {
    let mut m = Hmac::<Sha256>::new_from_slice(key).unwrap_or_else(|_| unreachable!("HMAC accepts any key length"));
    m.update(b"warren-files-v1\0");
    m.update(body);
    m
}

#[cfg(test)]
mod tests {
    use super::*;

    fn grant() -> Grant {
        Grant { op: Op::Put, ns: "default".into(), key: "main".into(), source: Source::Thread, id: "t1".into(), path: "in/a.csv".into(), len: Some(3), ct: None, exp: 100 }
    }

    #[test]
    fn tokens_round_trip_until_they_expire() {
        let t = sign(b"k", &grant());
        assert_eq!(verify(b"k", &t, 100), Ok(grant()));
        assert_eq!(verify(b"k", &t, 101), Err(Invalid::Expired));
    }

    #[test]
    fn a_changed_grant_or_another_key_is_refused() {
        let t = sign(b"k", &grant());
        assert_eq!(verify(b"other", &t, 0), Err(Invalid::Forged));
        // Same signature over a grant for another path.
        let (_, tag) = t.split_once('.').unwrap();
        let other = B64.encode(serde_json::to_vec(&Grant { path: "../../etc/passwd".into(), ..grant() }).unwrap());
        assert_eq!(verify(b"k", &format!("{other}.{tag}"), 0), Err(Invalid::Forged));
        for junk in ["", ".", "a.b", "x".repeat(5000).as_str()] {
            assert_eq!(verify(b"k", junk, 0), Err(Invalid::Forged), "{junk}");
        }
    }
}
