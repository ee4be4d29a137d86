//! Readers that hash and bound what passes through them.

use std::io::{self, Read};

use sha2::{Digest as _, Sha256};

use crate::layer::OverBudget;

/// Hashes (SHA-256) and counts the bytes read, failing once more than
/// `limit` pass: the decompression-bomb and oversized-blob guard.
pub struct Metered<R> {
    inner: R,
    hasher: Sha256,
    read: u64,
    limit: u64,
    what: &'static str,
}

impl<R: Read> Metered<R> {
    /// Meters `inner`, allowing at most `limit` bytes (`what` names the limit in errors).
    pub fn new(inner: R, limit: u64, what: &'static str) -> Metered<R> {
        Metered { inner, hasher: Sha256::new(), read: 0, limit, what }
    }

    /// Bytes read so far.
    pub fn read_bytes(&self) -> u64 {
        self.read
    }

    /// Reads the rest (bounded like the rest) and returns `sha256:<hex>` and the byte count.
    pub fn finish(mut self) -> io::Result<(String, u64)> {
        io::copy(&mut self, &mut io::sink())?;
        Ok((format!("sha256:{}", hex(&self.hasher.finalize())), self.read))
    }
}

impl<R: Read> Read for Metered<R> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        let n = self.inner.read(buf)?;
        self.read += n as u64;
        if self.read > self.limit {
            return Err(io::Error::other(OverBudget(self.what.to_string())));
        }
        self.hasher.update(&buf[..n]);
        Ok(n)
    }
}

/// Lowercase hex.
pub fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// `sha256:<64 hex>`: the only digest algorithm accepted.
pub fn is_sha256(digest: &str) -> bool {
    digest.strip_prefix("sha256:").is_some_and(|h| h.len() == 64 && h.bytes().all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b)))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hashes_counts_and_bounds() {
        let (digest, n) = Metered::new(&b"hello"[..], 5, "x").finish().unwrap();
        assert_eq!(n, 5);
        assert_eq!(digest, "sha256:2cf24dba5fb0a30e26e83b2ac5b9e29e1b161e5c1fa7425e73043362938b9824");
        let err = Metered::new(&b"hello!"[..], 5, "image size").finish().unwrap_err();
        assert_eq!(err.to_string(), "image size");
        assert!(is_sha256(&digest) && !is_sha256("sha256:ABC") && !is_sha256("md5:00"));
    }
}
